//! Scenario (c): 2^20 threads, one `malloc` each, sizes uniform over 16 – 4096 B (seeded), from a
//! fresh heap; toga against CUDA's device malloc and the bump ceiling.

mod common;

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use toga::workload::{Allocator, MallocBench};

fn sizes(n: u64) -> Vec<u32> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            16 + (x % (4096 - 16 + 1)) as u32
        })
        .collect()
}

fn mixed(c: &mut Criterion) {
    let Some(gpu) = common::gpu(common::THREADS, 4096) else {
        return;
    };
    let heap = (common::THREADS * 4096 * 2).min(gpu.free_memory().unwrap() / 3);
    let mut b = MallocBench::new(&gpu, common::THREADS, heap).expect("bench setup");
    let sizes = b
        .stream()
        .clone_htod(&sizes(common::THREADS))
        .expect("sizes");
    let mut csv = common::Csv::new("c_mixed", &gpu);
    let mut g = common::group(c, "c_mixed");
    g.throughput(Throughput::Elements(common::THREADS));
    for alloc in [Allocator::Toga, Allocator::Bump, Allocator::CudaMalloc] {
        let mut iteration = 0;
        g.bench_function(
            format!("{}/fresh/malloc/16-4096", alloc.name()),
            |bencher| {
                bencher.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let t = b.run_sizes(alloc, &sizes).expect("benchmark iteration");
                        csv.row(
                            "c_mixed",
                            alloc.name(),
                            "16-4096",
                            common::THREADS,
                            "fresh",
                            "malloc",
                            iteration,
                            t.malloc_ms,
                            t.failed,
                        );
                        iteration += 1;
                        total += Duration::from_secs_f64(t.malloc_ms as f64 / 1e3);
                    }
                    total
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, mixed);
criterion_main!(benches);
