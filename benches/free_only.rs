//! Scenario (b): free 2^20 live allocations (each made by one thread's `malloc`), at 16 B – 4 KiB;
//! toga against CUDA's device free. (The bump allocator never frees.)

mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use toga_harness::{Allocator, HeapState, MallocBench};

fn free_only(c: &mut Criterion) {
    let Some(gpu) = common::gpu(common::THREADS, 4096) else {
        return;
    };
    let heap = (common::THREADS * 4096 * 2).min(gpu.free_memory().unwrap() / 3);
    let mut b = MallocBench::new(&gpu, common::THREADS, heap).expect("bench setup");
    let mut csv = common::Csv::new("b_free", &gpu);
    let mut g = common::group(c, "b_free");
    for size in common::SIZES {
        common::bench_malloc(
            &mut g,
            &mut b,
            &mut csv,
            "b_free",
            Allocator::Toga,
            size,
            HeapState::Fresh,
            "free",
        );
        common::bench_malloc(
            &mut g,
            &mut b,
            &mut csv,
            "b_free",
            Allocator::CudaMalloc,
            size,
            HeapState::Fresh,
            "free",
        );
    }
    g.finish();
}

criterion_group!(benches, free_only);
criterion_main!(benches);
