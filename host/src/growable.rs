//! The growable-heap workload: start small, grow under load, trim after. The `growable` rows of
//! `host stress` and the whole of `host grow`.
//!
//! A growable heap starts with a few MiB mapped. Three rounds of increasing load (a sixteenth,
//! a quarter, then all of `--threads`; mixed 16–4096 B) each fill their blocks with a pattern,
//! read the statistics while the blocks are live (exact counts, and no failure: every round
//! asks at most three quarters of the maximum), then check every pattern and free. A round
//! that asks more than is mapped can only be served by growing inside the kernel. After the
//! last round everything is free: a trim and [`Heap::synchronize`] must bring the mapped
//! memory back to the release threshold (the initial size), and a round after that must
//! still work.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use toga::{Gpu, Heap, HeapStats};
use toga_harness::{Workloads, block_bytes, time_ms, uniform_sizes};

use crate::cli::GrowArgs;
use crate::report::{Row, print_rows};

/// The heap's first mapping (and so its release threshold): CUDA's default device-heap size.
pub const DEFAULT_INITIAL: u64 = toga::heap::DEFAULT_INITIAL_BYTES;
/// The heap's maximum when none is given: the smaller of this and half the free memory.
pub const DEFAULT_MAX: u64 = 4 << 30;
/// Request sizes, uniform over this range.
const SIZES: (u32, u32) = (16, 4096);
const MIB: f64 = (1u64 << 20) as f64;

/// One round: every thread allocates and fills one block, then the blocks are checked and freed.
pub struct Round {
    pub label: String,
    pub threads: u64,
    /// Bytes the round's blocks take (sizes as the allocator rounds them).
    pub asked: u64,
    /// Whether the thread count was lowered to fit the heap's maximum.
    pub capped: bool,
    pub mapped_before: u64,
    pub mapped_after: u64,
    /// In-kernel growths during the round, and growth requests that got nothing.
    pub grows: u64,
    pub grow_failures: u64,
    /// Null pointers (blocks the round did not get).
    pub nulls: u64,
    pub bad_words: u64,
    pub alloc_ms: f64,
    pub free_ms: f64,
    /// Everything that did not verify; empty when the round is good.
    pub problems: Vec<String>,
}

/// Free everything, trim, synchronize: back to the release threshold.
pub struct Trim {
    pub mapped_before: u64,
    /// Bytes UAlloc still held in empty bins and chunks before the trim.
    pub reserved_before: u64,
    pub mapped_after: u64,
    pub threshold: u64,
    pub wall_ms: f64,
    pub problems: Vec<String>,
}

/// Everything the workload did.
pub struct Outcome {
    /// False when toga fell back to a fixed heap (no CUDA virtual memory management).
    pub growable: bool,
    pub initial_mapped: u64,
    pub max_bytes: u64,
    /// The rounds of increasing load.
    pub rounds: Vec<Round>,
    /// The trim, and the round after it (a growable heap only).
    pub trim: Option<(Trim, Round)>,
    /// The heap's statistics at the end.
    pub stats: HeapStats,
}

impl Outcome {
    pub fn verified(&self) -> bool {
        self.rounds.iter().all(|r| r.problems.is_empty())
            && self
                .trim
                .as_ref()
                .is_none_or(|(t, r)| t.problems.is_empty() && r.problems.is_empty())
    }
}

/// The heap's maximum: `max` as given, or the smaller of [`DEFAULT_MAX`] and half the free
/// device memory.
pub fn default_max(gpu: &Gpu, max: Option<u64>) -> toga::Result<u64> {
    Ok(match max {
        Some(m) => m,
        None => DEFAULT_MAX.min(gpu.free_memory()? / 2),
    })
}

/// Make a growable heap of `initial` bytes growing up to `max`, and run the rounds
/// (`threads / 16`, `threads / 4`, `threads`), the trim and one more round.
pub fn run_workload(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    initial: u64,
    max: u64,
    threads: u64,
    seed: u32,
    host_growth: bool,
) -> toga::Result<Outcome> {
    let heap = Heap::growable()
        .initial_bytes(initial)
        .max_bytes(max)
        .grow_in_kernel(!host_growth)
        .create(gpu, stream)?;
    let w = Workloads::new(gpu)?;
    let start = heap.stats(stream)?;
    let growable = heap.is_growable();
    // The release threshold is the default one: what was mapped at creation.
    let threshold = start.mapped_bytes;
    // Every round fits in three quarters of the maximum, and of the device's memory: below
    // that, nothing may fail.
    let budget = start.max_bytes.min(gpu.free_memory()? / 2) / 4 * 3;
    let all = uniform_sizes(threads.max(1), SIZES.0, SIZES.1, seed as u64);
    let plan = plan(&all, threads, budget);
    let mut rounds = Vec::new();
    for (i, &(n, capped)) in plan[..3].iter().enumerate() {
        let label = format!("round {}", i + 1);
        let tag = 0x6000 + i as u32;
        let sizes = &all[..n as usize];
        if host_growth {
            grow_for(stream, &heap, sizes)?;
        }
        rounds.push(round(
            &w,
            stream,
            &heap,
            sizes,
            tag,
            label,
            capped,
            host_growth,
        )?);
        if i < 2 {
            // UAlloc's emptied bins and chunks go back to the buddy tree (they stay mapped),
            // so that the next round's other size classes can use them before the heap grows.
            heap.trim(stream)?;
        }
    }
    let mut trim = None;
    if growable {
        let t = trim_back(stream, &heap, threshold)?;
        let (n, capped) = plan[3];
        let label = "after trim".to_string();
        let sizes = &all[..n as usize];
        if host_growth {
            grow_for(stream, &heap, sizes)?;
        }
        let r = round(&w, stream, &heap, sizes, 0x6100, label, capped, host_growth)?;
        trim = Some((t, r));
    }
    let stats = heap.stats(stream)?;
    Ok(Outcome {
        growable,
        initial_mapped: start.mapped_bytes,
        max_bytes: start.max_bytes,
        rounds,
        trim,
        stats,
    })
}

/// Threads of the rounds: `threads / 16`, `threads / 4`, `threads`, and `threads / 4` again
/// after the trim; each halved until its blocks (the first of `sizes`) take at most `budget`
/// bytes. With whether it was lowered.
fn plan(sizes: &[u32], threads: u64, budget: u64) -> [(u64, bool); 4] {
    [threads / 16, threads / 4, threads, threads / 4].map(|want| {
        let want = want.clamp(1, sizes.len() as u64);
        let mut n = want;
        while n > 1 && asked(&sizes[..n as usize]) > budget {
            n /= 2;
        }
        (n, n < want)
    })
}

/// Host growth: map twice what the round asks (room for partly used bins), within the maximum.
fn grow_for(stream: &Arc<CudaStream>, heap: &Heap, sizes: &[u32]) -> toga::Result<()> {
    let s = heap.stats(stream)?;
    let want = (2 * asked(sizes)).min(s.max_bytes);
    if heap.is_growable() && want > s.mapped_bytes {
        heap.grow(stream, want - s.mapped_bytes)?;
    }
    Ok(())
}

fn asked(sizes: &[u32]) -> u64 {
    sizes.iter().map(|&s| block_bytes(s)).sum()
}

#[allow(clippy::too_many_arguments)]
fn round(
    w: &Workloads,
    stream: &Arc<CudaStream>,
    heap: &Heap,
    sizes: &[u32],
    tag: u32,
    label: String,
    capped: bool,
    host_growth: bool,
) -> toga::Result<Round> {
    let n = sizes.len() as u64;
    let asked = asked(sizes);
    let before = heap.stats(stream)?;
    let d_sizes = stream.clone_htod(sizes)?;
    let mut ptrs = stream.alloc_zeros::<u64>(sizes.len())?;
    let alloc_ms = time_ms(stream, || {
        w.alloc_fill(stream, heap, &mut ptrs, &d_sizes, tag)
    })? as f64;
    let got = stream
        .clone_dtoh(&ptrs)?
        .iter()
        .filter(|&&p| p != 0)
        .count() as u64;
    let live = heap.stats(stream)?;
    let mut err = stream.alloc_zeros::<u64>(2)?;
    let free_ms = time_ms(stream, || {
        w.check_free(stream, heap, &ptrs, &d_sizes, tag, true, &mut err)
    })? as f64;
    let bad_words = stream.clone_dtoh(&err)?[0];
    let after = heap.stats(stream)?;

    let grows = after.kernel_grows - before.kernel_grows;
    let grow_failures = after.kernel_grow_failures - before.kernel_grow_failures;
    let mut problems = Vec::new();
    let mut expect = |ok: bool, what: String| {
        if !ok {
            problems.push(what);
        }
    };
    expect(
        before.live_blocks() == 0 && before.used_bytes == 0,
        format!(
            "heap not empty before the round ({} live blocks)",
            before.live_blocks()
        ),
    );
    expect(
        got == n,
        format!("{} of {n} mallocs returned null", n - got),
    );
    expect(bad_words == 0, format!("{bad_words} bad words"));
    expect(
        live.mallocs - before.mallocs == n,
        format!("mallocs +{}, expected +{n}", live.mallocs - before.mallocs),
    );
    expect(
        live.failed_allocations == before.failed_allocations,
        format!(
            "{} failed allocations below the maximum",
            live.failed_allocations - before.failed_allocations
        ),
    );
    expect(
        live.live_blocks() == n,
        format!("{} live blocks, expected {n}", live.live_blocks()),
    );
    expect(
        live.used_bytes == asked,
        format!("used {} B, expected {asked} B", live.used_bytes),
    );
    expect(
        live.mapped_bytes >= live.used_bytes,
        format!(
            "mapped {} B is below the used {} B",
            live.mapped_bytes, live.used_bytes
        ),
    );
    expect(
        grow_failures == 0,
        format!("{grow_failures} in-kernel growth requests failed below the maximum"),
    );
    // More than was mapped can only have come from growth inside the kernel: nothing else
    // maps memory between the two statistics.
    if heap.is_growable() && !host_growth && asked > before.mapped_bytes {
        expect(
            grows > 0,
            format!(
                "asked {asked} B with {} B mapped, but no in-kernel growth",
                before.mapped_bytes
            ),
        );
    }
    expect(
        after.live_blocks() == 0 && after.used_bytes == 0,
        format!(
            "{} live blocks ({} B) after freeing everything",
            after.live_blocks(),
            after.used_bytes
        ),
    );
    expect(
        after.frees - live.frees == n,
        format!("frees +{}, expected +{n}", after.frees - live.frees),
    );
    expect(
        after.invalid_frees == before.invalid_frees && after.double_frees == before.double_frees,
        format!(
            "{} invalid and {} double frees",
            after.invalid_frees - before.invalid_frees,
            after.double_frees - before.double_frees
        ),
    );
    Ok(Round {
        label,
        threads: n,
        asked,
        capped,
        mapped_before: before.mapped_bytes,
        mapped_after: live.mapped_bytes,
        grows,
        grow_failures,
        nulls: n - got,
        bad_words,
        alloc_ms,
        free_ms,
        problems,
    })
}

/// Everything is free: give UAlloc's empty bins and chunks back to the buddy tree (so that
/// [`Heap::synchronize`] sees the memory unused and trims instead of growing ahead), then
/// synchronize, which trims to the release threshold.
fn trim_back(stream: &Arc<CudaStream>, heap: &Heap, threshold: u64) -> toga::Result<Trim> {
    let before = heap.stats(stream)?;
    let start = std::time::Instant::now();
    heap.trim(stream)?;
    heap.synchronize(stream)?;
    let wall_ms = start.elapsed().as_secs_f64() * 1e3;
    let after = heap.stats(stream)?;
    let mut problems = Vec::new();
    if after.mapped_bytes != threshold {
        problems.push(format!(
            "mapped {} B after synchronize, expected the release threshold {threshold} B",
            after.mapped_bytes
        ));
    }
    if after.live_blocks() != 0 || after.used_bytes != 0 || after.reserved_bytes != 0 {
        problems.push(format!(
            "{} live blocks, {} B used, {} B reserved after the trim",
            after.live_blocks(),
            after.used_bytes,
            after.reserved_bytes
        ));
    }
    Ok(Trim {
        mapped_before: before.mapped_bytes,
        reserved_before: before.reserved_bytes,
        mapped_after: after.mapped_bytes,
        threshold,
        wall_ms,
        problems,
    })
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB
}

/// The outcome as rows of the stress table.
pub fn rows(o: &Outcome) -> Vec<Row> {
    let mut rows: Vec<Row> = o.rounds.iter().map(|r| round_row(o, r)).collect();
    if let Some((t, r)) = &o.trim {
        rows.push(trim_row(t));
        rows.push(round_row(o, r));
    }
    rows
}

fn round_row(o: &Outcome, r: &Round) -> Row {
    let mut note = format!(
        "{}: asked {:.1} MiB; mapped {:.0} → {:.0} MiB of {:.0}, {} in-kernel growths ({} failed); {} bad words",
        r.label,
        mib(r.asked),
        mib(r.mapped_before),
        mib(r.mapped_after),
        mib(o.max_bytes),
        r.grows,
        r.grow_failures,
        r.bad_words
    );
    if r.capped {
        note.push_str(" (threads capped to fit the maximum)");
    }
    if !o.growable {
        note.push_str("; fixed heap (no CUDA VMM): growth not checked");
    }
    for p in &r.problems {
        note.push_str("; ");
        note.push_str(p);
    }
    Row::new(
        "growable",
        r.threads,
        format!("{}–{} B", SIZES.0, SIZES.1),
        2 * r.threads,
        r.alloc_ms + r.free_ms,
        r.nulls,
        r.problems.is_empty(),
        note,
    )
}

fn trim_row(t: &Trim) -> Row {
    let mut note = format!(
        "all freed, trim + synchronize: mapped {:.0} → {:.0} MiB (release threshold {:.0} MiB; {:.0} MiB were in empty bins); wall time",
        mib(t.mapped_before),
        mib(t.mapped_after),
        mib(t.threshold),
        mib(t.reserved_before)
    );
    for p in &t.problems {
        note.push_str("; ");
        note.push_str(p);
    }
    Row::new(
        "growable",
        0,
        "trim".into(),
        0,
        t.wall_ms,
        0,
        t.problems.is_empty(),
        note,
    )
}

/// `host grow`: the workload alone, with a table per round. `Ok(true)` when it verified.
pub fn run(gpu: &Gpu, args: &GrowArgs) -> toga::Result<bool> {
    let stream = gpu.default_stream();
    let max = default_max(gpu, args.max)?;
    let r = &args.run;
    let o = run_workload(
        gpu,
        &stream,
        args.initial,
        max,
        r.threads,
        r.seed,
        r.host_growth,
    )?;
    if r.json {
        print_rows(
            &rows(&o),
            &[("growable".to_string(), o.stats.clone())],
            true,
        );
        return Ok(o.verified());
    }
    let i = gpu.info();
    println!(
        "{} ({} SMs): growable heap, {:.0} MiB mapped at first, at most {:.0} MiB{}",
        i.name,
        i.sm_count,
        mib(o.initial_mapped),
        mib(o.max_bytes),
        if o.growable {
            ""
        } else {
            " (fixed: no CUDA virtual memory management)"
        }
    );
    println!(
        "{:<11} {:>9} {:>11} {:>11} {:>8} {:>11} {:>3}",
        "round", "threads", "asked MiB", "mapped MiB", "growths", "kernel ms", "ok"
    );
    o.rounds.iter().for_each(print_round);
    if let Some((t, after)) = &o.trim {
        print_trim(t);
        print_round(after);
    }
    let s = &o.stats;
    println!(
        "in-kernel growths {} ({} failed), host service grants {} (mean {:.1} µs to map), mapped high {:.0} MiB",
        s.kernel_grows,
        s.kernel_grow_failures,
        s.service_grants,
        s.service_map_ns as f64 / 1e3,
        mib(s.mapped_high)
    );
    Ok(o.verified())
}

fn tick(ok: bool) -> &'static str {
    if ok { "✓" } else { "✗" }
}

fn print_round(r: &Round) {
    println!(
        "{:<11} {:>9} {:>11.1} {:>11.0} {:>8} {:>11.3} {:>3}{}",
        r.label,
        r.threads,
        mib(r.asked),
        mib(r.mapped_after),
        r.grows,
        r.alloc_ms + r.free_ms,
        tick(r.problems.is_empty()),
        if r.capped {
            "  (threads capped to fit the maximum)"
        } else {
            ""
        }
    );
    for p in &r.problems {
        println!("  ✗ {p}");
    }
}

fn print_trim(t: &Trim) {
    println!(
        "{:<11} {:>9} {:>11} {:>11.0} {:>8} {:>11} {:>3}  all freed, trim + synchronize: mapped {:.0} → {:.0} MiB (release threshold {:.0} MiB) in {:.1} ms",
        "trim",
        "",
        "",
        mib(t.mapped_after),
        "",
        "",
        tick(t.problems.is_empty()),
        mib(t.mapped_before),
        mib(t.mapped_after),
        mib(t.threshold),
        t.wall_ms
    );
    for p in &t.problems {
        println!("  ✗ {p}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn sizes(threads: u64) -> Vec<u32> {
        uniform_sizes(threads, SIZES.0, SIZES.1, 0x7064)
    }

    #[test]
    fn the_default_run_fits_a_4_gib_maximum_uncapped_and_outgrows_8_mib() {
        let threads = 1 << 20;
        let all = sizes(threads);
        let budget = DEFAULT_MAX / 4 * 3;
        let p = plan(&all, threads, budget);
        assert_eq!(
            p,
            [
                (1 << 16, false),
                (1 << 18, false),
                (1 << 20, false),
                (1 << 18, false)
            ]
        );
        let a: Vec<u64> = p.iter().map(|&(n, _)| asked(&all[..n as usize])).collect();
        // Every round asks more than the one before has mapped at least, so each must grow.
        assert!(a[0] > 16 * DEFAULT_INITIAL, "{a:?}");
        assert!(a[1] > 2 * a[0] && a[2] > 2 * a[1], "{a:?}");
        assert!(a[2] > 2 * GIB && a[2] <= budget, "{a:?}");
    }

    #[test]
    fn rounds_are_capped_to_the_budget() {
        let threads = 1 << 20;
        let all = sizes(threads);
        let budget = 64 << 20;
        let p = plan(&all, threads, budget);
        for &(n, _) in &p {
            assert!(n >= 1 && asked(&all[..n as usize]) <= budget);
        }
        assert!(p[2].1 && p[2].0 < threads);
        // A budget below one block still runs one thread.
        assert_eq!(plan(&all, threads, 0), [(1, true); 4]);
    }

    #[test]
    fn few_threads_still_run_every_round() {
        let all = sizes(3);
        assert_eq!(
            plan(&all, 3, GIB),
            [(1, false), (1, false), (3, false), (1, false)]
        );
    }
}
