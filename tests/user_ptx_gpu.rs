//! `toga::Gpu::open` loads the PTX users get (`toga::KERNELS_PTX`: the allocator and the heap
//! kernels, no harness). Every host-side heap operation must find its kernels there.

use toga::{Gpu, Heap};

/// The GPU with toga's own PTX, or a loud failure (this test is ignored without a GPU).
fn gpu() -> Gpu {
    Gpu::open(0).unwrap_or_else(|e| panic!("GPU test without a GPU: {e}"))
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn every_heap_operation_runs_on_the_users_ptx() {
    let gpu = gpu();
    assert!(
        gpu.function("toga_malloc").is_err(),
        "a harness kernel in the user's PTX"
    );
    let stream = gpu.default_stream();

    let mut fixed = Heap::new(&gpu, &stream, 8 << 20).unwrap();
    fixed.trim(&stream).unwrap();
    fixed.reset(&stream).unwrap();
    let s = fixed.stats(&stream).unwrap();
    assert_eq!((s.capacity_bytes, s.used_bytes, s.mallocs), (8 << 20, 0, 0));

    let growable = Heap::growable()
        .initial_bytes(2 << 20)
        .max_bytes(64 << 20)
        .create(&gpu, &stream)
        .unwrap();
    assert!(growable.is_growable());
    // Granules are 2 MiB on the GPUs toga runs on; grow returns the mapped bytes after it.
    let mapped = growable.grow(&stream, 8 << 20).unwrap();
    assert_eq!(mapped, 10 << 20);
    growable.trim_to(&stream, 2 << 20).unwrap();
    growable.synchronize(&stream).unwrap();
    let s = growable.stats(&stream).unwrap();
    assert_eq!(s.mapped_bytes, 2 << 20, "{s:?}");
    assert_eq!(s.max_bytes, 64 << 20);
}
