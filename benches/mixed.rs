//! Scenario (c): 2^20 threads, one `malloc` each, sizes uniform over 16 – 4096 B (seeded), from a
//! fresh heap; toga against CUDA's device malloc and the bump ceiling.

mod common;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use toga::workload::{Allocator, MallocBench, uniform_sizes};

fn mixed(c: &mut Criterion) {
    let Some(gpu) = common::gpu(common::THREADS, 4096) else {
        return;
    };
    let heap = (common::THREADS * 4096 * 2).min(gpu.free_memory().unwrap() / 3);
    let mut b = MallocBench::new(&gpu, common::THREADS, heap).expect("bench setup");
    let sizes = b
        .stream()
        .clone_htod(&uniform_sizes(
            common::THREADS,
            16,
            4096,
            0x9E37_79B9_7F4A_7C15,
        ))
        .expect("sizes");
    let mut csv = common::Csv::new("c_mixed", &gpu);
    let mut g = common::group(c, "c_mixed");
    g.throughput(Throughput::Elements(common::THREADS));
    // No CUDA malloc: 2^20 blocks of up to 4 KiB is far above `common::CUDA_MAX_BYTES`.
    for alloc in [Allocator::Toga, Allocator::Bump] {
        common::gpu_timed(
            &mut g,
            format!("{}/fresh/malloc/16-4096", alloc.name()),
            |iteration| {
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
                t.malloc_ms
            },
        );
    }
    g.finish();
}

criterion_group!(benches, mixed);
criterion_main!(benches);
