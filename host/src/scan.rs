//! `host scan`: one `malloc` kernel and one `free` kernel per (size, thread count), smallest
//! first, each on a fresh heap and each with its own time limit, polling a CUDA event instead of
//! blocking. It shows where the allocator stops scaling (or stops finishing) without hanging the
//! session on the first stuck kernel.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaStream, sys};
use toga::workload::Workloads;
use toga::{Gpu, Heap};

use crate::Cli;

const SIZES: [u32; 6] = [16, 256, 2048, 4096, 65536, 1 << 20];
/// How long one kernel may take before the scan gives up.
const KERNEL_LIMIT: Duration = Duration::from_secs(10);

/// Wait for the work enqueued so far on `stream`; `Ok(None)` if it did not finish in time.
/// Returns the GPU time since `start` in milliseconds.
fn finish(
    stream: &Arc<CudaStream>,
    start: &cudarc::driver::CudaEvent,
) -> toga::Result<Option<f32>> {
    let end = stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
    let t0 = Instant::now();
    while !end.try_is_complete()? {
        if t0.elapsed() > KERNEL_LIMIT {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(Some(start.elapsed_ms(&end)?))
}

/// While a kernel is stuck: copy the heap header on a second stream (copies run beside a
/// kernel) and print each buddy order's semaphore, `C/E/R` (available, promised, reserved).
fn print_semaphores(gpu: &Gpu, heap: &Heap) -> toga::Result<()> {
    use toga_kernels::heap::HeapHeader;
    let side = gpu.new_stream()?;
    let mut bytes = vec![0u8; std::mem::size_of::<HeapHeader>()];
    // SAFETY: the header lies at the heap's base; `bytes` holds exactly one.
    unsafe {
        cudarc::driver::result::memcpy_dtoh_async(&mut bytes[..], heap.base(), side.cu_stream())?;
    }
    side.synchronize()?;
    // SAFETY: HeapHeader is plain words (atomics of integers); any bit pattern is valid.
    let header: HeapHeader = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    let orders = header.geometry.max_order as u32;
    let line: Vec<String> = (0..=orders)
        .map(|o| {
            let (c, e, r) = header.buddy.semaphore(o).counters();
            format!("{o}:{c}/{e}/{r}")
        })
        .collect();
    println!("  buddy semaphores (order:C/E/R): {}", line.join(" "));
    Ok(())
}

/// Print the scan; `Ok(false)` at the first kernel that does not finish (the process must end
/// then: the GPU is still running it).
pub fn run(gpu: &Gpu, heap_size: u64, cli: &Cli) -> toga::Result<bool> {
    let stream = gpu.default_stream();
    let w = Workloads::new(gpu)?;
    println!(
        "{} — fresh {} MiB heap per row; limit {} s per kernel",
        gpu.info().name,
        heap_size >> 20,
        KERNEL_LIMIT.as_secs()
    );
    println!(
        "{:>8} {:>9} {:>12} {:>12} {:>9} {:>12}",
        "size", "threads", "malloc ms", "free ms", "failed", "reserved MiB"
    );
    let max_log = 63 - cli.threads.leading_zeros();
    for size in SIZES {
        for log in (8..=max_log).step_by(2) {
            let n = 1u64 << log;
            let heap = Heap::new(gpu, &stream, heap_size)?;
            let mut ptrs = stream.alloc_zeros::<u64>(n as usize)?;
            stream.synchronize()?;
            let start = stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            w.malloc(&stream, &heap, &mut ptrs, size)?;
            let Some(malloc_ms) = finish(&stream, &start)? else {
                println!(
                    "{size:>8} {n:>9}  malloc kernel did not finish within {} s",
                    KERNEL_LIMIT.as_secs()
                );
                print_semaphores(gpu, &heap)?;
                return Ok(false);
            };
            let failed = stream
                .clone_dtoh(&ptrs)?
                .iter()
                .filter(|&&p| p == 0)
                .count();
            let reserved_mib = heap.stats(&stream)?.reserved_bytes as f64 / (1u64 << 20) as f64;
            let start = stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            w.free(&stream, &heap, &ptrs)?;
            let Some(free_ms) = finish(&stream, &start)? else {
                println!(
                    "{size:>8} {n:>9} {malloc_ms:>12.4}  free kernel did not finish within {} s",
                    KERNEL_LIMIT.as_secs()
                );
                print_semaphores(gpu, &heap)?;
                return Ok(false);
            };
            println!(
                "{size:>8} {n:>9} {malloc_ms:>12.4} {free_ms:>12.4} {failed:>9} {reserved_mib:>12.1}"
            );
        }
    }
    Ok(true)
}
