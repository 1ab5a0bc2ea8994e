//! Scenario (b'): every thread calls `malloc` then `free` in the same kernel (toga), 16 B – 4 KiB.

mod common;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use toga_harness::MallocBench;

fn malloc_free(c: &mut Criterion) {
    let Some(gpu) = common::gpu(common::THREADS, 16) else {
        return;
    };
    let heap = (common::THREADS * 4096 * 2).min(gpu.free_memory().unwrap() / 3);
    let mut b = MallocBench::new(&gpu, common::THREADS, heap).expect("bench setup");
    let mut csv = common::Csv::new("b_malloc_free", &gpu);
    let mut g = common::group(c, "b_malloc_free");
    g.throughput(Throughput::Elements(common::THREADS));
    for size in common::SIZES {
        common::gpu_timed(
            &mut g,
            format!("toga/fresh/malloc_free/{size}"),
            |iteration| {
                let t = b.run_malloc_free(size).expect("benchmark iteration");
                csv.row(
                    "b_malloc_free",
                    "toga",
                    &size.to_string(),
                    common::THREADS,
                    "fresh",
                    "malloc_free",
                    iteration,
                    t.malloc_ms,
                    t.failed,
                );
                t.malloc_ms
            },
        );
    }
    g.finish();
}

criterion_group!(benches, malloc_free);
criterion_main!(benches);
