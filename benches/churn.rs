//! Scenario (f): churn of malloc/free pairs on a warm heap. 2^18 threads, each doing 64 rounds of
//! (`malloc` a size uniform over 16 – 256 B and write its first and last words; check and `free`
//! the block of the round before, so each block stays live for one round) in one kernel; before
//! the timed kernel the heap has served and freed one such round. The rows
//! give the kernel time; the report divides `threads × rounds` by it for pairs per second. toga
//! against the bump ceiling (one `atom.add` per `malloc`, no `free`, the same writes).
//!
//! CUDA's device malloc is not run by default: at 2^18 threads one round of its malloc and free
//! takes tens of milliseconds (2^18 × 16 B malloc alone took 32 ms on an H100), so a kernel of 64
//! rounds takes seconds and criterion would run it a dozen times. `TOGA_BENCH_CUDA_CHURN=1` times
//! it once (after a warm-up round), outside criterion, as one CSV row.

mod common;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use toga_harness::{Allocator, ChurnBench};

const SCENARIO: &str = "f_churn";
/// Threads per kernel.
const THREADS: u64 = 1 << 18;
/// malloc/write/free rounds per thread in the timed kernel.
const ROUNDS: u32 = 64;
/// The sizes' range, in bytes (inclusive).
const MIN: u32 = 16;
const MAX: u32 = 256;
/// Seed of every thread's size sequence (the same for each allocator).
const SEED: u32 = 0x5EED;
/// toga's heap: room for every thread's largest block this many times over, so that blocks held
/// in per-SM bins and not yet given back cannot run it out.
const HEAP_HEADROOM: u64 = 8;
/// Set (to anything) to time CUDA's malloc once.
const CUDA_ENV: &str = "TOGA_BENCH_CUDA_CHURN";

fn churn(c: &mut Criterion) {
    let Some(gpu) = common::gpu(THREADS, MAX) else {
        return;
    };
    let mut b =
        ChurnBench::new(&gpu, THREADS, THREADS * MAX as u64 * HEAP_HEADROOM).expect("bench setup");
    let size_label = format!("{MIN}-{MAX}");
    let mut csv = common::Csv::new(SCENARIO, &gpu).with_rounds(ROUNDS);
    let mut g = common::group(c, SCENARIO);
    g.throughput(Throughput::Elements(THREADS * ROUNDS as u64));
    for (alloc, state) in [(Allocator::Toga, "warm"), (Allocator::Bump, "fresh")] {
        common::gpu_timed(
            &mut g,
            format!("{}/{state}/malloc_write_free/{size_label}", alloc.name()),
            |iteration| {
                let t = b
                    .run(alloc, ROUNDS, SEED, (MIN, MAX))
                    .expect("benchmark iteration");
                check(alloc, t.corrupted);
                csv.row(
                    SCENARIO,
                    alloc.name(),
                    &size_label,
                    THREADS,
                    state,
                    "malloc_write_free",
                    iteration,
                    t.ms,
                    t.failed,
                );
                t.ms
            },
        );
    }
    g.finish();
    if std::env::var_os(CUDA_ENV).is_none() {
        eprintln!(
            "{SCENARIO}: CUDA malloc skipped (seconds per kernel); {CUDA_ENV}=1 times it once"
        );
        return;
    }
    let t = b
        .run(Allocator::CudaMalloc, ROUNDS, SEED, (MIN, MAX))
        .expect("CUDA malloc churn");
    check(Allocator::CudaMalloc, t.corrupted);
    csv.row(
        SCENARIO,
        Allocator::CudaMalloc.name(),
        &size_label,
        THREADS,
        "warm",
        "malloc_write_free",
        0,
        t.ms,
        t.failed,
    );
    eprintln!(
        "{SCENARIO}: cuda-malloc {:.1} ms, {:.1} M pairs/s, {} failed",
        t.ms,
        (THREADS * ROUNDS as u64) as f64 / t.ms as f64 / 1e3,
        t.failed
    );
}

/// Words read back wrong: a bug in an allocator (blocks overlap), or in the bump baseline a thread
/// that fell a whole ring behind (its numbers still stand).
fn check(alloc: Allocator, corrupted: u64) {
    match alloc {
        Allocator::Bump if corrupted != 0 => {
            eprintln!("{SCENARIO}: bump: {corrupted} words overwritten (the ring wrapped)")
        }
        _ => assert_eq!(corrupted, 0, "{}: blocks overlap", alloc.name()),
    }
}

criterion_group!(benches, churn);
criterion_main!(benches);
