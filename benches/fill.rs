//! Scenario (e), the paper's fill benchmark: threads each call `malloc` once, with more threads
//! than the pool can serve, so the pool is exhausted. Pool: 2^20 × size bytes, at most 512 MiB
//! (the paper's sizing). Reports throughput and utilization (bytes handed out ÷ pool bytes, the
//! pool being toga's data region; its metadata is extra). toga only: CUDA's malloc heap cannot be
//! resized once a module is loaded.

mod common;

use std::io::Write;

use criterion::{Criterion, criterion_group, criterion_main};
use toga_harness::{Allocator, HeapState, MallocBench};

const POOL_MAX: u64 = 512 << 20;
const SIZES: [u32; 13] = [
    16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536,
];

fn fill(c: &mut Criterion) {
    let Some(gpu) = common::gpu(1 << 10, 16) else {
        return;
    };
    let mut csv = common::Csv::new("e_fill", &gpu);
    let mut util_csv = common::Csv::new("e_fill_utilization", &gpu);
    let mut g = common::group(c, "e_fill");
    for size in SIZES {
        let pool = ((1u64 << 20) * size as u64).clamp(1 << 20, POOL_MAX);
        // 25% more requests than fit.
        let threads = pool / size as u64 * 5 / 4;
        let mut b = MallocBench::new(&gpu, threads, pool).expect("bench setup");
        let t = b
            .run(Allocator::Toga, size, HeapState::Fresh)
            .expect("fill run");
        let handed_out = (threads - t.failed) * size as u64;
        let utilization = handed_out as f64 / pool as f64;
        util_csv.row(
            "e_fill_utilization",
            "toga",
            &size.to_string(),
            threads,
            "fresh",
            "utilization",
            0,
            utilization as f32,
            t.failed,
        );
        let _ = std::io::stderr().flush();
        eprintln!(
            "fill {size} B: {threads} threads, pool {} MiB, utilization {:.1}%",
            pool >> 20,
            utilization * 100.0
        );
        common::bench_malloc(
            &mut g,
            &mut b,
            &mut csv,
            "e_fill",
            Allocator::Toga,
            size,
            HeapState::Fresh,
            "malloc",
        );
    }
    g.finish();
}

criterion_group!(benches, fill);
criterion_main!(benches);
