//! Scenario (c): 2^20 threads, one `malloc` each, sizes uniform over 16 – 4096 B (one seeded
//! list, `toga_harness::mixed_sizes`, which `host bench`'s mixed row asks for too), then the
//! kernel that frees those blocks, each timed as its own row. toga runs on a fresh heap (just
//! reset, not timed) and on a warm one (reset, then one untimed malloc and free round of the same
//! list); the bump ceiling (which never frees) has no state. CUDA's device malloc is not run:
//! 2^20 blocks of up to 4 KiB is far above `common::CUDA_MAX_BYTES`.

mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use toga_harness::{Allocator, HeapState, MIXED_MAX, MallocBench, mixed_label, mixed_sizes};

fn mixed(c: &mut Criterion) {
    let Some(gpu) = common::gpu(common::THREADS, MIXED_MAX) else {
        return;
    };
    let heap = (common::THREADS * MIXED_MAX as u64 * 2).min(gpu.free_memory().unwrap() / 3);
    let mut b = MallocBench::new(&gpu, common::THREADS, heap).expect("bench setup");
    let sizes = b
        .stream()
        .clone_htod(&mixed_sizes(common::THREADS))
        .expect("sizes");
    let size_label = mixed_label();
    let mut csv = common::Csv::new("c_mixed", &gpu);
    let mut g = common::group(c, "c_mixed");
    // Each iteration runs both kernels (`run_sizes`); a cell counts one of them.
    let cells = [
        (Allocator::Toga, HeapState::Fresh, "malloc"),
        (Allocator::Toga, HeapState::Fresh, "free"),
        (Allocator::Toga, HeapState::Warm, "malloc"),
        (Allocator::Toga, HeapState::Warm, "free"),
        (Allocator::Bump, HeapState::Fresh, "malloc"),
    ];
    for (alloc, state, metric) in cells {
        common::bench_sizes(
            &mut g,
            &mut b,
            &mut csv,
            "c_mixed",
            alloc,
            &sizes,
            &size_label,
            state,
            metric,
        );
    }
    g.finish();
}

criterion_group!(benches, mixed);
criterion_main!(benches);
