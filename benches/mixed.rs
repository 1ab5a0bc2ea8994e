//! Scenario (c): 2^20 threads, one `malloc` each, sizes uniform over 16 – 4096 B (seeded), from a
//! fresh heap, then the kernel that frees those blocks, each timed as its own row; toga against
//! the bump ceiling (which never frees). CUDA's device malloc is not run: 2^20 blocks of up to
//! 4 KiB is far above `common::CUDA_MAX_BYTES`.

mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use toga_harness::{Allocator, MallocBench, uniform_sizes};

/// The sizes' range, in bytes (inclusive), and the seed of their list.
const MIN: u32 = 16;
const MAX: u32 = 4096;
const SEED: u64 = 0x9E37_79B9_7F4A_7C15;

fn mixed(c: &mut Criterion) {
    let Some(gpu) = common::gpu(common::THREADS, MAX) else {
        return;
    };
    let heap = (common::THREADS * MAX as u64 * 2).min(gpu.free_memory().unwrap() / 3);
    let mut b = MallocBench::new(&gpu, common::THREADS, heap).expect("bench setup");
    let sizes = b
        .stream()
        .clone_htod(&uniform_sizes(common::THREADS, MIN, MAX, SEED))
        .expect("sizes");
    let size_label = format!("{MIN}-{MAX}");
    let mut csv = common::Csv::new("c_mixed", &gpu);
    let mut g = common::group(c, "c_mixed");
    // Each iteration runs both kernels (`run_sizes`); a cell counts one of them.
    let cells = [
        (Allocator::Toga, "malloc"),
        (Allocator::Toga, "free"),
        (Allocator::Bump, "malloc"),
    ];
    for (alloc, metric) in cells {
        common::bench_sizes(
            &mut g,
            &mut b,
            &mut csv,
            "c_mixed",
            alloc,
            &sizes,
            &size_label,
            metric,
        );
    }
    g.finish();
}

criterion_group!(benches, mixed);
criterion_main!(benches);
