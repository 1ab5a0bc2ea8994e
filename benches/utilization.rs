//! Scenario (u), utilization (issue 13, item 4): fill a heap until `malloc` returns null, in
//! rounds, and read how much of it was handed out. Heaps of 8 MiB, 64 MiB and 1 GiB (data
//! region); single sizes 16 B, 256 B, 4 KiB, 64 KiB and 1 MiB, and sizes uniform over 16 –
//! 4096 B and 16 – 65536 B (one seeded list). Each (heap, sizes) cell gets a fresh heap and
//! [`ROUNDS`] rounds on it: one `toga_alloc_fill` kernel of requests totalling about twice the
//! heap (in blocks as the allocator rounds them), so many return null; then utilization = live
//! block bytes (`HeapStats::used_bytes`) ÷ capacity; then every block is checked and freed. No
//! trim between rounds: what a round frees must flow back by itself (one trim after the last).
//! A block still live after its round's frees (a leak) and bytes not free after the last trim
//! (lost pages) fail the bench, as a fill pattern read back wrong does.
//!
//! One row per round: size = the sizes' label, threads = requests, state = the heap's label,
//! metric `utilization`, ms = the utilization fraction (as in `e_fill_utilization`), failed =
//! null results. No criterion timing: `cargo bench --bench utilization` runs the cells once.
//! `TOGA_BENCH_UTIL_HEAPS=8MiB,64MiB` runs only the heaps named, `TOGA_BENCH_UTIL_SIZES=256,mixed
//! 16-4096` only the sizes named (the CSV's labels), and `TOGA_BENCH_UTIL_TRACE=1` prints a
//! line before each fill and after each check-and-free (to see where a slow cell spends it).

mod common;

use std::time::Instant;

use toga::Heap;
use toga_harness::{Workloads, block_bytes, uniform_sizes};

const SCENARIO: &str = "u_utilization";
/// Fill rounds per (heap, sizes) cell, on the same heap.
const ROUNDS: usize = 5;
/// Heaps: (label, data bytes), smallest first.
const HEAPS: [(&str, u64); 3] = [("8MiB", 8 << 20), ("64MiB", 64 << 20), ("1GiB", 1 << 30)];
/// Single sizes, in bytes.
const SINGLE: [u32; 5] = [16, 256, 4096, 65536, 1 << 20];
/// Mixed sizes: inclusive ranges, in bytes.
const MIXED: [(u32, u32); 2] = [(16, 4096), (16, 65536)];
/// Seed of the mixed sizes' list.
const SEED: u64 = 0x0D15_EA5E_5EED_1234;
/// Requests per fill: about this many times the heap's bytes, in rounded blocks.
const OVERSUBSCRIBE: u64 = 2;
/// Requests per fill, at least and at most.
const MIN_REQUESTS: u64 = 64;
const MAX_REQUESTS: u64 = 1 << 27;
/// Picks heaps by label (comma-separated).
const HEAPS_ENV: &str = "TOGA_BENCH_UTIL_HEAPS";
/// Picks sizes by label (comma-separated).
const SIZES_ENV: &str = "TOGA_BENCH_UTIL_SIZES";
/// Any value: a line per round and kernel.
const TRACE_ENV: &str = "TOGA_BENCH_UTIL_TRACE";

/// The comma-separated labels in `var`, if it is set.
fn picked(var: &str) -> Option<Vec<String>> {
    std::env::var(var)
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
}

/// Request sizes of one cell.
#[derive(Clone, Copy)]
enum Sizes {
    Single(u32),
    Mixed(u32, u32),
}

impl Sizes {
    /// The CSV's size column (no commas).
    fn label(self) -> String {
        match self {
            Sizes::Single(s) => s.to_string(),
            Sizes::Mixed(lo, hi) => format!("mixed {lo}-{hi}"),
        }
    }

    /// Mean block bytes of one request (exact over the uniform range).
    fn mean_block_bytes(self) -> f64 {
        match self {
            Sizes::Single(s) => block_bytes(s) as f64,
            Sizes::Mixed(lo, hi) => {
                (lo..=hi).map(block_bytes).sum::<u64>() as f64 / (hi - lo + 1) as f64
            }
        }
    }

    /// Requests whose blocks total about [`OVERSUBSCRIBE`] × `capacity`.
    fn requests(self, capacity: u64) -> u64 {
        ((OVERSUBSCRIBE * capacity) as f64 / self.mean_block_bytes()).round() as u64
    }

    fn list(self, n: u64) -> Vec<u32> {
        match self {
            Sizes::Single(s) => vec![s; n as usize],
            Sizes::Mixed(lo, hi) => uniform_sizes(n, lo, hi, SEED),
        }
    }
}

fn main() {
    let Some(gpu) = common::gpu(1 << 10, 16) else {
        return;
    };
    let picked_heaps = picked(HEAPS_ENV);
    let picked_sizes = picked(SIZES_ENV);
    let stream = gpu.default_stream();
    let w = Workloads::new(&gpu).expect("workload kernels");
    let mut csv = common::Csv::new(SCENARIO, &gpu);
    let all_sizes: Vec<Sizes> = SINGLE
        .map(Sizes::Single)
        .into_iter()
        .chain(MIXED.map(|(lo, hi)| Sizes::Mixed(lo, hi)))
        .collect();
    for (heap_label, heap_bytes) in HEAPS {
        if picked_heaps
            .as_ref()
            .is_some_and(|p| !p.iter().any(|l| l == heap_label))
        {
            eprintln!("{SCENARIO} {heap_label}: skipped ({HEAPS_ENV})");
            continue;
        }
        let free = gpu.free_memory().expect("free device memory");
        if heap_bytes > free / 4 {
            eprintln!(
                "{SCENARIO} {heap_label}: skipped, above a quarter of the {} MiB free",
                free >> 20
            );
            continue;
        }
        for sizes in &all_sizes {
            if picked_sizes
                .as_ref()
                .is_some_and(|p| !p.iter().any(|l| *l == sizes.label()))
            {
                continue;
            }
            cell(&gpu, &stream, &w, &mut csv, heap_label, heap_bytes, *sizes);
        }
    }
}

/// [`ROUNDS`] fill rounds of `sizes` on a fresh heap of `heap_bytes`: one CSV row per round and
/// one line on stderr.
fn cell(
    gpu: &toga::Gpu,
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    w: &Workloads,
    csv: &mut common::Csv,
    heap_label: &str,
    heap_bytes: u64,
    sizes: Sizes,
) {
    let start = Instant::now();
    let heap = Heap::new(gpu, stream, heap_bytes).expect("heap");
    let capacity = heap.capacity();
    let n = sizes.requests(capacity).clamp(MIN_REQUESTS, MAX_REQUESTS);
    let label = sizes.label();
    let host_sizes = sizes.list(n);
    let d_sizes = stream.clone_htod(&host_sizes).expect("sizes");
    let mut ptrs = stream.alloc_zeros::<u64>(n as usize).expect("pointers");
    let (mut percent, mut requested, mut fill_ms) = (Vec::new(), Vec::new(), 0f32);
    let trace = std::env::var_os(TRACE_ENV).is_some();
    for round in 0..ROUNDS {
        let tag = round as u32;
        if trace {
            eprintln!("{SCENARIO} {heap_label}, {label}, round {round}: fill starts");
        }
        let ms = toga_harness::time_ms(stream, || {
            w.alloc_fill(stream, &heap, &mut ptrs, &d_sizes, tag)
        })
        .expect("fill kernel");
        fill_ms = fill_ms.max(ms);
        let stats = heap.stats(stream).expect("stats");
        let host_ptrs = stream.clone_dtoh(&ptrs).expect("pointers back");
        let failed = host_ptrs.iter().filter(|&&p| p == 0).count() as u64;
        let asked: u64 = host_ptrs
            .iter()
            .zip(&host_sizes)
            .filter(|(p, _)| **p != 0)
            .map(|(_, &s)| s as u64)
            .sum();
        let utilization = stats.used_bytes as f64 / capacity as f64;
        csv.row(
            SCENARIO,
            "toga",
            &label,
            n,
            heap_label,
            "utilization",
            round,
            utilization as f32,
            failed,
        );
        percent.push(format!("{:.1}", utilization * 100.0));
        if round == 0 || round + 1 == ROUNDS {
            let c = toga_harness::census(stream, &heap).expect("census");
            eprintln!(
                "{SCENARIO} {heap_label}, {label}, round {round}: after the fill, {}",
                c.line()
            );
        }
        requested.push(format!("{:.1}", asked as f64 / capacity as f64 * 100.0));
        if trace {
            eprintln!(
                "{SCENARIO} {heap_label}, {label}, round {round}: fill {ms:.2} ms, {failed} \
                 nulls; check-and-free starts"
            );
        }
        let mut errors = stream.alloc_zeros::<u64>(2).expect("error words");
        let free_ms = toga_harness::time_ms(stream, || {
            w.check_free(stream, &heap, &ptrs, &d_sizes, tag, true, &mut errors)
        })
        .expect("check-and-free kernel");
        if trace {
            eprintln!(
                "{SCENARIO} {heap_label}, {label}, round {round}: check-and-free {free_ms:.2} ms"
            );
        }
        let bad = stream.clone_dtoh(&errors).expect("error words back")[0];
        assert_eq!(
            bad, 0,
            "{SCENARIO} {heap_label}, {label}, round {round}: {bad} words of the fill pattern \
             read back wrong (blocks overlap or were corrupted)"
        );
        // Every block of the fill was freed: one still live is a leak (or a lost free).
        let live = heap.stats(stream).expect("stats").live_blocks();
        assert_eq!(
            live, 0,
            "{SCENARIO} {heap_label}, {label}, round {round}: {live} blocks still live after \
             every block of the fill was freed"
        );
    }
    heap.trim(stream).expect("trim");
    let probe = w.probe(stream, &heap).expect("probe");
    // An empty heap, trimmed, has every byte free again: fewer are pages lost.
    assert_eq!(
        probe.free_bytes,
        capacity,
        "{SCENARIO} {heap_label}, {label}: after the last round and a trim, {} of {capacity} \
         bytes free ({} lost)",
        probe.free_bytes,
        capacity.saturating_sub(probe.free_bytes)
    );
    eprintln!(
        "{SCENARIO} {heap_label}, {label}: {n} requests, utilization per round {} % (requested \
         bytes {} %), slowest fill {fill_ms:.2} ms, {:.1} s",
        percent.join(" "),
        requested.join(" "),
        start.elapsed().as_secs_f64()
    );
}
