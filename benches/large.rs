//! Scenario (f): large blocks, which TBuddy serves (issue 13).
//! - `f_large`: one `malloc` per thread of 8 KiB – 1 MiB from a fresh 4 GiB heap, with
//!   `min(heap / 2 / size, 2^17)` threads, then the kernel that frees them; toga against the bump
//!   ceiling.
//! - `f_serial`: one thread makes 10,000 `malloc`s of 1 – 8192 B (seeded), one after another,
//!   on a fresh heap: the latency of a lone caller (throughput in criterion's report is calls/s).
//! - `f_divergent`: 2^20 threads whose lanes ask 1 – 8192 B (seeded), against 16 – 4096 B in the
//!   same heap and run.
//!
//! CUDA's device malloc is not run: every cell is far above `common::CUDA_MAX_BYTES`.

mod common;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use toga_harness::{Allocator, HeapState, MallocBench, uniform_sizes};

/// Request sizes of `f_large`.
const SIZES: [u32; 6] = [8192, 16384, 32768, 65536, 256 << 10, 1 << 20];
/// Most threads of an `f_large` cell.
const MAX_THREADS: u64 = 1 << 17;
/// The heap of `f_large` and `f_serial`.
const HEAP: u64 = 4 << 30;
/// Calls of `f_serial`.
const SERIAL_CALLS: u64 = 10_000;
const SEED: u64 = 0x9E37_79B9_7F4A_7C15;

fn large(c: &mut Criterion) {
    let Some(gpu) = common::gpu(1, 16) else {
        return;
    };
    let heap = HEAP.min(gpu.free_memory().unwrap() / 3);
    let mut csv = common::Csv::new("f_large", &gpu);
    let mut g = common::group(c, "f_large");
    for size in SIZES {
        let threads = (heap / 2 / size as u64).min(MAX_THREADS);
        let mut b = MallocBench::new(&gpu, threads, heap).expect("bench setup");
        for metric in ["malloc", "free"] {
            common::bench_malloc(
                &mut g,
                &mut b,
                &mut csv,
                "f_large",
                Allocator::Toga,
                size,
                HeapState::Fresh,
                metric,
            );
        }
        common::bench_malloc(
            &mut g,
            &mut b,
            &mut csv,
            "f_large",
            Allocator::Bump,
            size,
            HeapState::Fresh,
            "malloc",
        );
    }
    g.finish();
}

fn serial(c: &mut Criterion) {
    let Some(gpu) = common::gpu(1, 16) else {
        return;
    };
    let heap = HEAP.min(gpu.free_memory().unwrap() / 3);
    let mut b = MallocBench::new(&gpu, SERIAL_CALLS, heap).expect("bench setup");
    let sizes = b
        .stream()
        .clone_htod(&uniform_sizes(SERIAL_CALLS, 1, 8192, SEED))
        .expect("sizes");
    let mut csv = common::Csv::new("f_serial", &gpu);
    let mut g = common::group(c, "f_serial");
    g.throughput(Throughput::Elements(SERIAL_CALLS));
    common::gpu_timed(&mut g, "toga/fresh/malloc/1-8192".into(), |iteration| {
        let t = b.run_serial(&sizes).expect("benchmark iteration");
        csv.row(
            "f_serial",
            "toga",
            "1-8192",
            1,
            "fresh",
            "malloc",
            iteration,
            t.malloc_ms,
            t.failed,
        );
        t.malloc_ms
    });
    g.finish();
}

fn divergent(c: &mut Criterion) {
    let threads = common::THREADS;
    let Some(gpu) = common::gpu(1, 16) else {
        return;
    };
    let heap = (threads * 8192).min(gpu.free_memory().unwrap() / 3);
    let mut b = MallocBench::new(&gpu, threads, heap).expect("bench setup");
    let mut csv = common::Csv::new("f_divergent", &gpu);
    let mut g = common::group(c, "f_divergent");
    for (lo, hi) in [(1, 8192), (16, 4096)] {
        let sizes = b
            .stream()
            .clone_htod(&uniform_sizes(threads, lo, hi, SEED))
            .expect("sizes");
        let label = format!("{lo}-{hi}");
        for metric in ["malloc", "free"] {
            common::bench_sizes(
                &mut g,
                &mut b,
                &mut csv,
                "f_divergent",
                Allocator::Toga,
                &sizes,
                &label,
                HeapState::Fresh,
                metric,
            );
        }
    }
    g.finish();
}

criterion_group!(benches, large, serial, divergent);
criterion_main!(benches);
