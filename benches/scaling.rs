//! Scenario (d): thread scaling, 2^10 … 2^20 threads, one `malloc` each at 16 B and 1 KiB, fresh heap;
//! toga against the bump ceiling and CUDA's device malloc.

mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use toga_harness::{Allocator, HeapState, MallocBench};

fn scaling(c: &mut Criterion) {
    let Some(gpu) = common::gpu(common::THREADS, 1024) else {
        return;
    };
    let mut csv = common::Csv::new("d_scaling", &gpu);
    let mut g = common::group(c, "d_scaling");
    for log in (10..=20).step_by(2) {
        let threads = 1u64 << log;
        let heap = (threads * 1024 * 2).max(64 << 20);
        let mut b = MallocBench::new(&gpu, threads, heap).expect("bench setup");
        for size in [16, 1024] {
            for alloc in Allocator::ALL {
                common::bench_malloc(
                    &mut g,
                    &mut b,
                    &mut csv,
                    "d_scaling",
                    alloc,
                    size,
                    HeapState::Fresh,
                    "malloc",
                );
            }
        }
    }
    g.finish();
}

criterion_group!(benches, scaling);
criterion_main!(benches);
