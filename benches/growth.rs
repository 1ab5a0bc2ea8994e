//! Scenario (h), growable heaps: what a heap that maps its memory on demand costs, against a fixed
//! heap, in one run. Every row is toga; the `state` column names the heap:
//!
//! - `fixed-<bytes>`: [`Heap::new`] of that many bytes, reset before every iteration.
//! - `growable-mapped-<bytes>`: a growable heap whose maximum is all mapped at creation
//!   (`initial_bytes` = `max_bytes`), reset before every iteration: no growth ever happens.
//! - `growable-from-<keep>-to-<max>`: a growable heap (growth in kernels on) that is reset and
//!   trimmed back to `keep` mapped bytes ([`Heap::trim_to`]) before every iteration, untimed, so
//!   that the timed kernel has to grow it through the host service.
//!
//! Row families (`metric`; `ms` is what each row times):
//!
//! 1. `malloc`, 2^20 threads, one `malloc` each, 16 B and 4 KiB: the kernel's GPU time (CUDA
//!    events) on `fixed-…`, `growable-mapped-…` and `growable-from-8MiB-to-…`. The heap is 1 GiB,
//!    or for sizes whose 2^20 blocks do not fit twice in it the power of two that does (8 GiB at
//!    4 KiB, as `a_malloc_only` sizes its heap); at most a quarter of the free memory. The fixed
//!    and the mapped growable heap should be as fast as each other; the growing one shows the
//!    price of growing during a kernel.
//! 2. `host_grow`, on `growable-from-0B-to-1GiB`: wall time (`Instant`) of [`Heap::grow`] by
//!    `size` bytes (2 MiB, 64 MiB, 1 GiB) and the stream synchronization after it; `threads` is 1
//!    (one call). Before every iteration the heap is trimmed back to nothing, untimed.
//! 3. `malloc`, 1 thread (one `malloc` of 16 B or 4 KiB, `Workloads::malloc` with one pointer):
//!    the kernel's GPU time on `fixed-1GiB` and `growable-mapped-1GiB` (memory there) and on
//!    `growable-from-0B-to-1GiB` (nothing mapped: the `malloc` waits for the host to map a
//!    granule).
//!
//! Beside every row of a growing heap (1 and 3), a `service_map` row: `ms` = the host time the
//! growth service spent mapping for the grants of that iteration (their sum), `failed` = the
//! growth requests of that iteration that got nothing. A summary line per cell on stderr gives
//! growths and grants per iteration and the mean mapping time per grant
//! (`HeapStats::service_map_ns`).

mod common;

use std::sync::Arc;
use std::time::Instant;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use cudarc::driver::CudaStream;
use toga::{Gpu, Heap, HeapStats};
use toga_harness::{Allocator, HeapState, MallocBench, block_bytes};

const SCENARIO: &str = "h_growth";
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// Sizes of the malloc rows (families 1 and 3).
const SIZES: [u32; 2] = [16, 4096];
/// The heap of family 1 where twice its blocks fit, and of families 2 and 3.
const HEAP_BYTES: u64 = GIB;
/// What the growing heap of family 1 starts from (and is trimmed back to): CUDA's default
/// device-heap size.
const GROW_FROM: u64 = 8 * MIB;
/// Host-side growths of family 2.
const GROWTHS: [u64; 3] = [2 * MIB, 64 * MIB, GIB];

/// A heap of the comparison.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// [`Heap::new`].
    Fixed,
    /// Growable, with all of its maximum mapped at creation.
    Mapped,
    /// Growable, reset and trimmed back to `keep` mapped bytes before every iteration.
    Grows { keep: u64 },
}

impl Kind {
    /// The `state` column for a heap of `bytes` (its capacity or maximum).
    fn label(self, bytes: u64) -> String {
        match self {
            Kind::Fixed => format!("fixed-{}", bytes_label(bytes)),
            Kind::Mapped => format!("growable-mapped-{}", bytes_label(bytes)),
            Kind::Grows { keep } => {
                format!(
                    "growable-from-{}-to-{}",
                    bytes_label(keep),
                    bytes_label(bytes)
                )
            }
        }
    }

    /// The heap, made on `stream`; `None` (after saying so) where a growable heap fell back to
    /// a fixed one.
    fn heap(self, gpu: &Gpu, stream: &Arc<CudaStream>, bytes: u64) -> Option<Heap> {
        let heap = match self {
            Kind::Fixed => Heap::new(gpu, stream, bytes),
            Kind::Mapped => Heap::growable()
                .initial_bytes(bytes)
                .max_bytes(bytes)
                .create(gpu, stream),
            Kind::Grows { keep } => Heap::growable()
                .initial_bytes(keep)
                .max_bytes(bytes)
                .release_threshold(keep)
                .grow_in_kernel(true)
                .create(gpu, stream),
        }
        .expect("heap");
        if matches!(self, Kind::Fixed) || heap.is_growable() {
            Some(heap)
        } else {
            eprintln!(
                "{SCENARIO} {}: skipped, no growable heaps on this device",
                self.label(bytes)
            );
            None
        }
    }
}

/// `8MiB`, `1GiB`: whole units, else bytes (no spaces or commas: a CSV field and a criterion
/// id).
fn bytes_label(bytes: u64) -> String {
    [("GiB", 30), ("MiB", 20), ("KiB", 10)]
        .into_iter()
        .find(|&(_, shift)| bytes >= 1 << shift && bytes.is_multiple_of(1 << shift))
        .map(|(unit, shift)| format!("{}{unit}", bytes >> shift))
        .unwrap_or_else(|| format!("{bytes}B"))
}

/// The largest power of two at most `bytes`.
fn pow2_floor(bytes: u64) -> u64 {
    1 << (63 - bytes.max(1).leading_zeros())
}

/// Host time the growth service has spent mapping, in all (ns; from the mean it reports).
fn service_total_ns(s: &HeapStats) -> u64 {
    s.service_map_ns * s.service_grants
}

/// Growth counts of the iterations of one cell, for its summary line.
#[derive(Default)]
struct Growths {
    iterations: u64,
    kernel_grows: u64,
    grants: u64,
    map_ns: u64,
    failures: u64,
}

fn growth(c: &mut Criterion) {
    let Some(gpu) = common::gpu(1 << 10, 16) else {
        return;
    };
    let stream = gpu.default_stream();
    let mut csv = common::Csv::new(SCENARIO, &gpu);
    let mut g = common::group(c, SCENARIO);
    let cap = pow2_floor(gpu.free_memory().expect("free device memory") / 4);

    // 1. 2^20 threads, one malloc each: fixed against growable, mapped or growing.
    for size in SIZES {
        let wanted = (2 * common::THREADS * block_bytes(size)).next_power_of_two();
        let bytes = wanted.max(HEAP_BYTES).min(cap);
        if bytes < wanted {
            eprintln!(
                "{SCENARIO} {size} B: heaps of {} (a quarter of the free memory), some mallocs \
                 may fail",
                bytes_label(bytes)
            );
        }
        for kind in [Kind::Fixed, Kind::Mapped, Kind::Grows { keep: GROW_FROM }] {
            malloc_cell(
                &mut g,
                &gpu,
                &stream,
                &mut csv,
                kind,
                bytes,
                common::THREADS,
                size,
            );
        }
    }

    let bytes = HEAP_BYTES.min(cap);
    // 2. One growth on the host, from nothing mapped.
    if let Some(heap) = (Kind::Grows { keep: 0 }).heap(&gpu, &stream, bytes) {
        for grow in GROWTHS {
            if grow > bytes {
                eprintln!(
                    "{SCENARIO} host_grow {}: skipped, above the heap's maximum",
                    bytes_label(grow)
                );
                continue;
            }
            host_grow_cell(&mut g, &stream, &mut csv, &heap, bytes, grow);
        }
    }
    // 3. One thread, one malloc: memory there, or the malloc has to grow the heap.
    for size in SIZES {
        for kind in [Kind::Fixed, Kind::Mapped, Kind::Grows { keep: 0 }] {
            malloc_cell(&mut g, &gpu, &stream, &mut csv, kind, bytes, 1, size);
        }
    }
    g.finish();
}

/// `threads` threads, one `malloc` of `size` each, on a heap of `kind` and `bytes`: one `malloc`
/// row per iteration (kernel time), and for a growing heap a `service_map` row beside it.
#[allow(clippy::too_many_arguments)]
fn malloc_cell(
    g: &mut BenchmarkGroup<WallTime>,
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    csv: &mut common::Csv,
    kind: Kind,
    bytes: u64,
    threads: u64,
    size: u32,
) {
    let Some(heap) = kind.heap(gpu, stream, bytes) else {
        return;
    };
    let mut b = MallocBench::with_heap(gpu, threads, heap).expect("bench setup");
    let state = kind.label(bytes);
    let mut sum = Growths::default();
    let mut warned = false;
    g.throughput(Throughput::Elements(threads));
    let id = format!("{threads}-threads/{state}/malloc/{size}");
    common::gpu_timed(g, id, |iteration| {
        let t = match kind {
            Kind::Fixed | Kind::Mapped => b
                .run(Allocator::Toga, size, HeapState::Fresh)
                .expect("benchmark iteration"),
            Kind::Grows { keep } => {
                // Untimed: free everything, then unmap all but `keep`.
                b.heap_mut().reset(stream).expect("reset");
                b.heap().trim_to(stream, keep).expect("trim");
                let before = b.heap().stats(stream).expect("stats");
                if before.mapped_bytes > keep && !warned {
                    warned = true;
                    eprintln!(
                        "{SCENARIO} {state}: {} B still mapped after the trim",
                        before.mapped_bytes
                    );
                }
                let t = b.run_steady(Allocator::Toga, size).expect("iteration");
                let after = b.heap().stats(stream).expect("stats");
                let map_ns = service_total_ns(&after).saturating_sub(service_total_ns(&before));
                let failures = after.kernel_grow_failures - before.kernel_grow_failures;
                sum.iterations += 1;
                sum.kernel_grows += after.kernel_grows - before.kernel_grows;
                sum.grants += after.service_grants - before.service_grants;
                sum.map_ns += map_ns;
                sum.failures += failures;
                csv.row(
                    SCENARIO,
                    "toga",
                    &size.to_string(),
                    threads,
                    &state,
                    "service_map",
                    iteration,
                    (map_ns as f64 / 1e6) as f32,
                    failures,
                );
                t
            }
        };
        csv.row(
            SCENARIO,
            "toga",
            &size.to_string(),
            threads,
            &state,
            "malloc",
            iteration,
            t.malloc_ms,
            t.failed,
        );
        t.malloc_ms
    });
    if sum.iterations > 0 {
        let n = sum.iterations as f64;
        eprintln!(
            "{SCENARIO} {threads} threads, {state}, {size} B: per iteration {:.1} growths in the \
             kernel, {:.1} grants, {:.3} ms mapping on the host ({:.1} µs per grant), {:.1} \
             failed requests; {} iterations",
            sum.kernel_grows as f64 / n,
            sum.grants as f64 / n,
            sum.map_ns as f64 / n / 1e6,
            sum.map_ns as f64 / sum.grants.max(1) as f64 / 1e3,
            sum.failures as f64 / n,
            sum.iterations
        );
    }
}

/// Wall time of `heap.grow(stream, grow)` and the synchronization after it, from nothing mapped
/// (a trim to 0 before every iteration, untimed): one `host_grow` row per iteration.
fn host_grow_cell(
    g: &mut BenchmarkGroup<WallTime>,
    stream: &Arc<CudaStream>,
    csv: &mut common::Csv,
    heap: &Heap,
    bytes: u64,
    grow: u64,
) {
    let state = (Kind::Grows { keep: 0 }).label(bytes);
    let mut warned = false;
    g.throughput(Throughput::Bytes(grow));
    let id = format!("{state}/host_grow/{}", bytes_label(grow));
    common::gpu_timed(g, id, |iteration| {
        heap.trim_to(stream, 0).expect("trim");
        let mapped = heap.stats(stream).expect("stats").mapped_bytes;
        let start = Instant::now();
        let grown = heap.grow(stream, grow);
        stream.synchronize().expect("synchronize");
        let ms = (start.elapsed().as_secs_f64() * 1e3) as f32;
        if let Err(e) = &grown
            && !warned
        {
            warned = true;
            eprintln!(
                "{SCENARIO} host_grow {}: failed from {mapped} B mapped: {e}",
                bytes_label(grow)
            );
        }
        csv.row(
            SCENARIO,
            "toga",
            &grow.to_string(),
            1,
            &state,
            "host_grow",
            iteration,
            ms,
            grown.is_err() as u64,
        );
        ms
    });
}

criterion_group!(benches, growth);
criterion_main!(benches);
