//! Scenario (a): 2^20 threads, one `malloc` each, at 16 B – 4 KiB: on a new heap with its set-up
//! timed (`first-use`: `Heap::reset` and the stocking of the arenas in the timed span), from a
//! freshly initialized heap (`fresh`: the reset before it not timed) and from a warm one;
//! toga against CUDA's device malloc and the bump ceiling.

mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use toga_harness::{Allocator, HeapState, MallocBench};

fn malloc_only(c: &mut Criterion) {
    let Some(gpu) = common::gpu(common::THREADS, 4096) else {
        return;
    };
    let heap = (common::THREADS * 4096 * 2).min(gpu.free_memory().unwrap() / 3);
    let mut b = MallocBench::new(&gpu, common::THREADS, heap).expect("bench setup");
    let mut csv = common::Csv::new("a_malloc_only", &gpu);
    let mut g = common::group(c, "a_malloc_only");
    // toga on a new heap (its set-up timed), from a fresh and from a warm heap, then the two
    // baselines.
    let cells = [
        (Allocator::Toga, HeapState::FirstUse),
        (Allocator::Toga, HeapState::Fresh),
        (Allocator::Toga, HeapState::Warm),
        (Allocator::Bump, HeapState::Fresh),
        (Allocator::CudaMalloc, HeapState::Fresh),
    ];
    for size in common::SIZES {
        for (alloc, state) in cells {
            common::bench_malloc(
                &mut g,
                &mut b,
                &mut csv,
                "a_malloc_only",
                alloc,
                size,
                state,
                "malloc",
            );
        }
    }
    g.finish();
}

criterion_group!(benches, malloc_only);
criterion_main!(benches);
