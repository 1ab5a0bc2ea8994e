//! Runs the example kernel crate on GPU 0: `cargo run -p vec-kernel-example`.
//! Exits 3 without a GPU (as `host` does), 1 if a result is wrong.

use std::process::ExitCode;

use toga::cudarc::driver::PushKernelArg;
use toga::{Error, Gpu, Heap};

const PTX: &str = include_str!(env!("VEC_KERNEL_PTX"));

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e @ (Error::NoDriver | Error::NoDevice(_))) => {
            eprintln!("vec-kernel-example: {e}");
            ExitCode::from(3)
        }
        Err(e) => {
            eprintln!("vec-kernel-example: {e}");
            ExitCode::from(1)
        }
    }
}

fn run() -> toga::Result<bool> {
    // The user's module contains toga's allocator and its heap-init kernels.
    let gpu = Gpu::open_with(0, PTX)?;
    let stream = gpu.default_stream();
    // Creating the heap binds it to the module, so `malloc` and `Vec` in the kernel use it. No
    // size to guess: the heap maps memory as the kernel needs it (`docs/growable.md`).
    let heap = Heap::growable().create(&gpu, &stream)?;
    let (n, len) = (1usize << 16, 100usize);
    let mut out = stream.alloc_zeros::<u64>(n)?;
    let f = gpu.function("grow_vectors")?;
    // SAFETY: `out` has `n` elements; the heap is bound.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&mut out)
            .arg(&n)
            .arg(&len)
            .launch(toga::launch_config(n as u64))?;
    }
    let out = stream.clone_dtoh(&out)?;
    let wrong = (0..n)
        .filter(|&i| out[i] != (0..len as u64).map(|k| i as u64 + k).sum::<u64>())
        .count();
    let stats = heap.stats(&stream)?;
    println!(
        "{n} threads each grew a Vec to {len} elements: {wrong} wrong sums; heap: {} mallocs, {} frees, {} live blocks, {} MiB mapped at most ({} growths in the kernel)",
        stats.mallocs,
        stats.frees,
        stats.live_blocks(),
        stats.mapped_high >> 20,
        stats.kernel_grows
    );
    Ok(wrong == 0 && stats.live_blocks() == 0)
}
