//! Scenario (g): the latency of one small launch on a warm heap. 1,024 threads, one 16 B `malloc`
//! each, every iteration one launch (then the kernel that frees those blocks) on the heap as the
//! launches before it left it: a heap that has served and freed this size class and is not reset
//! in between. toga against the bump ceiling and CUDA's device malloc (warm the same way), with
//! toga's first launch on a fresh heap beside them; the free kernel of each warm launch is a row
//! of its own.

mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use toga_harness::{Allocator, HeapState, MallocBench};

const SCENARIO: &str = "g_warm_launch";
/// Threads per launch: four 256-thread blocks, far fewer than the SMs.
const THREADS: u64 = 1 << 10;
/// Bytes per `malloc`.
const SIZE: u32 = 16;
/// toga's heap: as in the scaling scenario at this thread count.
const HEAP_BYTES: u64 = 64 << 20;
/// The same launches on a heap with chunks to spare for every SM (a 64 MiB heap has fewer
/// chunks than SMs × 4, so its refills share bins between SMs, INV(UA16), `docs/ualloc.md`).
const SCENARIO_LARGE_HEAP: &str = "g_warm_launch_1gib";
const LARGE_HEAP_BYTES: u64 = 1 << 30;

fn warm_launch(c: &mut Criterion) {
    let Some(gpu) = common::gpu(THREADS, SIZE) else {
        return;
    };
    launches(
        c,
        &gpu,
        SCENARIO,
        HEAP_BYTES,
        &[Allocator::Toga, Allocator::Bump],
        &[Allocator::Toga, Allocator::CudaMalloc],
    );
    launches(
        c,
        &gpu,
        SCENARIO_LARGE_HEAP,
        LARGE_HEAP_BYTES,
        &[Allocator::Toga],
        &[Allocator::Toga],
    );
}

/// The rows of one heap size: the first launch on a fresh heap for `fresh`, then warm malloc and
/// free launches for `warm` (each warmed by one untimed malloc and free round of this size).
fn launches(
    c: &mut Criterion,
    gpu: &toga::Gpu,
    scenario: &str,
    heap_bytes: u64,
    fresh: &[Allocator],
    warm: &[Allocator],
) {
    let mut b = MallocBench::new(gpu, THREADS, heap_bytes).expect("bench setup");
    let mut csv = common::Csv::new(scenario, gpu);
    let mut g = common::group(c, scenario);
    for &alloc in fresh {
        common::bench_malloc(
            &mut g,
            &mut b,
            &mut csv,
            scenario,
            alloc,
            SIZE,
            HeapState::Fresh,
            "malloc",
        );
    }
    for &alloc in warm {
        b.run(alloc, SIZE, HeapState::Warm).expect("warm-up");
        for metric in ["malloc", "free"] {
            common::bench_steady(&mut g, &mut b, &mut csv, scenario, alloc, SIZE, metric);
        }
    }
    g.finish();
}

criterion_group!(benches, warm_launch);
criterion_main!(benches);
