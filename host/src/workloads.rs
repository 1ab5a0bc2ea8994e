//! The verified workloads of `host stress`. Every allocation carries a pattern derived from its
//! owner and is checked before it is freed; every workload ends with no live block in the heap.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use indicatif::{ProgressBar, ProgressStyle};
use toga::{Gpu, Heap, HeapStats};
use toga_harness::{Workloads, time_ms, uniform_sizes};

use crate::cli::StressArgs;
use crate::report::{Row, print_header, print_row, print_rows};

/// The workloads, in the order the suite runs them.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Per-size storms: every thread allocates and fills, a second kernel checks and frees.
    Storm,
    /// Random mixed sizes (16 B–2 KiB) with interleaved frees, in one kernel.
    Mixed,
    /// Producer/consumer across streams: allocate on A, check on B, free on C, ordered by events.
    Streams,
    /// Exhaust the heap, free everything, then allocate everything again.
    Oom,
    /// Long random alloc/free churn over 16 B–64 KiB; reports peak use against the heap size.
    Churn,
    /// Each thread grows an `alloc::vec::Vec` through toga's `GlobalAlloc`.
    Vec,
    /// A growable heap of its own: starts at 8 MiB, grows inside the kernels under rounds of
    /// increasing load (16–4096 B), trims back to 8 MiB once all is free (see `host grow`).
    Growable,
}

const ALL: [Kind; 7] = [
    Kind::Storm,
    Kind::Mixed,
    Kind::Streams,
    Kind::Oom,
    Kind::Churn,
    Kind::Vec,
    Kind::Growable,
];
const STORM_SIZES: [u32; 7] = [16, 64, 256, 1024, 4096, 16384, 65536];

struct Ctx<'a> {
    gpu: &'a Gpu,
    stream: Arc<CudaStream>,
    heap: Heap,
    w: Workloads,
    threads: u64,
    seed: u32,
    host_growth: bool,
}

/// Run the suite; `Ok(true)` when every row verified.
pub fn stress(gpu: &Gpu, heap_size: u64, args: &StressArgs) -> toga::Result<bool> {
    let json = args.run.json;
    let stream = gpu.default_stream();
    let heap = Heap::new(gpu, &stream, heap_size)?;
    let mut ctx = Ctx {
        gpu,
        stream,
        heap,
        w: Workloads::new(gpu)?,
        threads: args.run.threads,
        seed: args.run.seed,
        host_growth: args.run.host_growth,
    };
    let kinds: Vec<Kind> = match args.workload {
        Some(k) => vec![k],
        None => ALL.to_vec(),
    };
    let bar = if json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(kinds.len() as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{pos}/{len}] {msg} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(100));
    let i = gpu.info();
    if !json {
        println!(
            "{} ({} SMs), heap {} MiB, {} threads per kernel",
            i.name,
            i.sm_count,
            ctx.heap.capacity() >> 20,
            ctx.threads
        );
    }
    let mut rows = Vec::new();
    let mut stats = Vec::new();
    if !json {
        // Rows appear as workloads finish, so a slow or stuck one is visible at once.
        print_header();
    }
    for kind in kinds {
        bar.set_message(format!("{kind:?}"));
        // The statistics to show after the workload: those of the suite's heap, or of the
        // heap the workload made for itself.
        let mut own_stats = None;
        let mut new_rows = match kind {
            Kind::Storm => storm(&mut ctx)?,
            Kind::Mixed => vec![mixed(&mut ctx)?],
            Kind::Streams => vec![streams(&mut ctx)?],
            Kind::Oom => oom(&mut ctx)?,
            Kind::Churn => vec![churn(&mut ctx)?],
            Kind::Vec => vec![vec_growth(&mut ctx)?],
            Kind::Growable => {
                let (rows, s) = growable(&mut ctx)?;
                own_stats = Some(s);
                rows
            }
        };
        // Every workload leaves the heap empty and uncorrupted.
        let s = ctx.heap.stats(&ctx.stream)?;
        let clean = s.live_blocks() == 0
            && s.used_bytes == 0
            && s.invalid_frees == 0
            && s.double_frees == 0;
        if !clean {
            for r in &mut new_rows {
                r.verified = false;
                r.note.push_str(" heap not empty/clean afterwards");
            }
            // Start the next workload from a clean heap.
            ctx.heap.reset(&ctx.stream)?;
        }
        let s = own_stats.unwrap_or(s);
        if !json {
            bar.suspend(|| {
                new_rows.iter().for_each(print_row);
                print_stats(kind, &s)
            });
        }
        stats.push((format!("{kind:?}"), s));
        rows.extend(new_rows);
        bar.inc(1);
    }
    bar.finish_and_clear();
    if json {
        print_rows(&rows, &stats, true);
    }
    Ok(rows.iter().all(|r| r.verified))
}

fn print_stats(kind: Kind, s: &HeapStats) {
    println!(
        "  after {kind:?}: used {} B (high {}), reserved {} B (high {}), live blocks {}, mallocs {}, frees {}, failed {}, invalid frees {}, double frees {}",
        s.used_bytes,
        s.used_high,
        s.reserved_bytes,
        s.reserved_high,
        s.live_blocks(),
        s.mallocs,
        s.frees,
        s.failed_allocations,
        s.invalid_frees,
        s.double_frees
    );
    if kind == Kind::Growable {
        println!(
            "  growable heap: mapped {} MiB (high {} MiB) of {} MiB, in-kernel growths {} ({} failed), host service grants {} (mean {:.1} µs to map)",
            s.mapped_bytes >> 20,
            s.mapped_high >> 20,
            s.max_bytes >> 20,
            s.kernel_grows,
            s.kernel_grow_failures,
            s.service_grants,
            s.service_map_ns as f64 / 1e3
        );
    }
}

fn errors(stream: &Arc<CudaStream>) -> toga::Result<CudaSlice<u64>> {
    Ok(stream.alloc_zeros::<u64>(2)?)
}

fn count_nonnull(stream: &Arc<CudaStream>, ptrs: &CudaSlice<u64>) -> toga::Result<u64> {
    Ok(stream.clone_dtoh(ptrs)?.iter().filter(|&&p| p != 0).count() as u64)
}

fn storm(c: &mut Ctx) -> toga::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for size in STORM_SIZES {
        // At most half the heap, so that every allocation can succeed.
        let rounded = (size as u64).next_power_of_two().max(16);
        let n = c.threads.min(c.heap.capacity() / 2 / rounded).max(1);
        let sizes = c.stream.clone_htod(&vec![size; n as usize])?;
        let mut ptrs = c.stream.alloc_zeros::<u64>(n as usize)?;
        let mut err = errors(&c.stream)?;
        let t_alloc = time_ms(&c.stream, || {
            c.w.alloc_fill(&c.stream, &c.heap, &mut ptrs, &sizes, 1)
        })?;
        let got = count_nonnull(&c.stream, &ptrs)?;
        let t_free = time_ms(&c.stream, || {
            c.w.check_free(&c.stream, &c.heap, &ptrs, &sizes, 1, true, &mut err)
        })?;
        let e = c.stream.clone_dtoh(&err)?;
        let ms = (t_alloc + t_free) as f64;
        rows.push(Row::new(
            "storm",
            n,
            format!("{size} B"),
            2 * n,
            ms,
            n - got,
            e[0] == 0 && got == n,
            format!(
                "alloc+fill {t_alloc:.3} ms, check+free {t_free:.3} ms; {} bad words",
                e[0]
            ),
        ));
    }
    Ok(rows)
}

fn mixed(c: &mut Ctx) -> toga::Result<Row> {
    let (lo, hi, rounds) = (16, 2048, 64);
    // Each thread holds at most 4 blocks: keep the worst case inside the heap.
    let n = c.threads.min(c.heap.capacity() / (4 * hi as u64)).max(1);
    let mut err = errors(&c.stream)?;
    let ms = time_ms(&c.stream, || {
        c.w.churn(&c.stream, &c.heap, n, rounds, c.seed, (lo, hi), &mut err)
    })?;
    let e = c.stream.clone_dtoh(&err)?;
    Ok(Row::new(
        "mixed",
        n,
        format!("{lo}–{hi} B"),
        n * rounds as u64 + n,
        ms as f64,
        e[1],
        e[0] == 0 && e[1] == 0,
        format!(
            "{rounds} random alloc/free steps per thread; {} bad words",
            e[0]
        ),
    ))
}

fn streams(c: &mut Ctx) -> toga::Result<Row> {
    let (lo, hi) = (16, 4096);
    let n = c.threads.min(c.heap.capacity() / 2 / hi as u64).max(1);
    let a = c.gpu.new_stream()?;
    let b = c.gpu.new_stream()?;
    let cs = c.gpu.new_stream()?;
    // The heap was created on the default stream: order the three streams after it.
    let ready = c.stream.record_event(None)?;
    for s in [&a, &b, &cs] {
        s.wait(&ready)?;
    }
    let sizes = a.clone_htod(&uniform_sizes(n, lo, hi, c.seed as u64))?;
    let mut ptrs = a.alloc_zeros::<u64>(n as usize)?;
    let mut err_b = b.alloc_zeros::<u64>(2)?;
    let mut err_c = cs.alloc_zeros::<u64>(2)?;
    let start = std::time::Instant::now();
    c.w.alloc_fill(&a, &c.heap, &mut ptrs, &sizes, 7)?;
    b.wait(&a.record_event(None)?)?;
    c.w.check_free(&b, &c.heap, &ptrs, &sizes, 7, false, &mut err_b)?;
    cs.wait(&b.record_event(None)?)?;
    c.w.check_free(&cs, &c.heap, &ptrs, &sizes, 7, true, &mut err_c)?;
    cs.synchronize()?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let got = count_nonnull(&cs, &ptrs)?;
    let (eb, ec) = (b.clone_dtoh(&err_b)?, cs.clone_dtoh(&err_c)?);
    c.stream.wait(&cs.record_event(None)?)?;
    Ok(Row::new(
        "streams",
        n,
        format!("{lo}–{hi} B"),
        2 * n,
        ms,
        n - got,
        eb[0] == 0 && ec[0] == 0 && got == n,
        "alloc on A → check on B → free on C (events); wall time".to_string(),
    ))
}

fn oom(c: &mut Ctx) -> toga::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for size in [65536u32, 1024] {
        // Twice as many requests as fit.
        let fit = c.heap.capacity() / size as u64;
        let n = (2 * fit).min(1 << 24);
        let sizes = c.stream.clone_htod(&vec![size; n as usize])?;
        let mut counts = Vec::new();
        let mut ms = 0.0;
        let mut bad = 0;
        for round in 0..2u32 {
            let mut ptrs = c.stream.alloc_zeros::<u64>(n as usize)?;
            let mut err = errors(&c.stream)?;
            ms += time_ms(&c.stream, || {
                c.w.alloc_fill(&c.stream, &c.heap, &mut ptrs, &sizes, round)
            })? as f64;
            counts.push(count_nonnull(&c.stream, &ptrs)?);
            c.w.check_free(&c.stream, &c.heap, &ptrs, &sizes, round, true, &mut err)?;
            bad += c.stream.clone_dtoh(&err)?[0];
        }
        let util = counts[0] as f64 * size as f64 / c.heap.capacity() as f64;
        // TBuddy-sized requests must fill the heap exactly, both times. Small blocks fill it
        // up to the bins' overhead, and which arenas hold the last partly used bins differs
        // from round to round; recovery means everything went back (nothing reserved after
        // the free) and the second round got as much as the first, within those bins.
        // Empty bins stay with their arenas until a trim (or a malloc that runs out) takes
        // them back (docs/ualloc.md): trim, then everything must be back.
        c.heap.trim(&c.stream)?;
        let reserved = c.heap.stats(&c.stream)?.reserved_bytes;
        let recovered = if size as usize > toga_kernels::ualloc::MAX_SMALL_SIZE {
            counts[0] == fit && counts[1] == counts[0]
        } else {
            counts[1] as f64 >= 0.99 * counts[0] as f64
        };
        rows.push(Row::new(
            "oom",
            n,
            format!("{size} B"),
            2 * n,
            ms,
            2 * n - counts[0] - counts[1],
            bad == 0 && recovered && reserved == 0 && counts[0] > 0,
            format!(
                "round 1: {} ok, round 2: {} ok (of {fit} that fit; utilization {:.1}%); {reserved} B reserved after a trim",
                counts[0],
                counts[1],
                util * 100.0
            ),
        ));
    }
    Ok(rows)
}

fn churn(c: &mut Ctx) -> toga::Result<Row> {
    let (lo, hi, rounds) = (16, 65536, 256);
    let n = c.threads.min(c.heap.capacity() / (2 * hi as u64)).max(1);
    c.heap.reset_high_water(&c.stream)?;
    let mut err = errors(&c.stream)?;
    let ms = time_ms(&c.stream, || {
        c.w.churn(
            &c.stream,
            &c.heap,
            n,
            rounds,
            c.seed ^ 0xC0FFEE,
            (lo, hi),
            &mut err,
        )
    })?;
    let e = c.stream.clone_dtoh(&err)?;
    let s = c.heap.stats(&c.stream)?;
    Ok(Row::new(
        "churn",
        n,
        format!("{lo}–{hi} B"),
        n * rounds as u64 + n,
        ms as f64,
        e[1],
        e[0] == 0,
        format!(
            "peak used {:.1} MiB, peak reserved {:.1} MiB of {} MiB heap",
            s.used_high as f64 / (1 << 20) as f64,
            s.reserved_high as f64 / (1 << 20) as f64,
            c.heap.capacity() >> 20
        ),
    ))
}

/// A growable heap of its own, next to the suite's: [`crate::growable`]. The suite's heap is
/// left as it was (and bound to the module again, which the growable heap took over).
fn growable(c: &mut Ctx) -> toga::Result<(Vec<Row>, HeapStats)> {
    let max = crate::growable::default_max(c.gpu, None)?;
    let outcome = crate::growable::run_workload(
        c.gpu,
        &c.stream,
        crate::growable::DEFAULT_INITIAL,
        max,
        c.threads,
        c.seed,
        c.host_growth,
    )?;
    c.heap.bind(c.gpu.module(), &c.stream)?;
    Ok((crate::growable::rows(&outcome), outcome.stats))
}

fn vec_growth(c: &mut Ctx) -> toga::Result<Row> {
    let len = 64u32;
    let n = c.threads.min(c.heap.capacity() / 2 / 1024).max(1);
    c.heap.bind(c.gpu.module(), &c.stream)?;
    let mut out = c.stream.alloc_zeros::<u64>(n as usize)?;
    let ms = time_ms(&c.stream, || c.w.vec_push(&c.stream, &mut out, len))?;
    let out = c.stream.clone_dtoh(&out)?;
    let expect = |i: u64| (0..len as u64).map(|k| i * 1000 + k).sum::<u64>();
    let failed = out.iter().filter(|&&s| s == u64::MAX).count() as u64;
    let wrong = out
        .iter()
        .enumerate()
        .filter(|&(i, &s)| s != u64::MAX && s != expect(i as u64))
        .count();
    Ok(Row::new(
        "vec",
        n,
        format!("Vec<u64> to {len}"),
        n * len as u64,
        ms as f64,
        failed,
        wrong == 0 && failed == 0,
        format!("operations = pushes; {wrong} wrong sums"),
    ))
}
