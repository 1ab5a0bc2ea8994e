//! `host bench`: a quick throughput table of toga against CUDA's device malloc and a bump
//! allocator, measured in the same run. The criterion suite in `benches/` is the thorough one.
//!
//! Every cell is the median of [`RUNS`] timed runs after one untimed warm-up, for every
//! allocator, so each ratio compares medians of equally many runs. The main table has a row per
//! size and a last row of mixed sizes (the list of `benches/mixed.rs`,
//! [`toga_harness::mixed_sizes`]). CUDA's malloc is too slow to run at `--threads` that often
//! (2^20 × 16 B takes about 300 ms a kernel, larger sizes seconds): it runs at [`cuda_threads`]
//! threads, in a second table beside toga's fresh heap at the same thread count.
//!
//! With `--csv FILE` the main table's cell medians are appended to FILE as rows of scenario
//! [`VARIANCE_SCENARIO`], `--run-index` in the `iteration` column: ten processes appending to
//! one file give the spread between processes that `report` tabulates
//! (`scripts/gpu-variance.sh`).

use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use toga::Gpu;
use toga_harness::{
    Allocator, CSV_HEADER, HeapState, MallocBench, Timing, mixed_label, mixed_sizes,
};

use crate::Failure;

const SIZES: [u32; 5] = [16, 64, 256, 1024, 4096];
/// Timed runs per cell, after one untimed warm-up, for every allocator; the tables show their
/// median.
const RUNS: usize = 5;
/// The most threads CUDA's malloc runs with (`--threads` if fewer): at 2^16 threads a kernel
/// takes tens of milliseconds, so [`RUNS`] runs of every size take seconds, not minutes.
const CUDA_MAX_THREADS: u64 = 1 << 16;
/// A CUDA malloc warm-up kernel longer than this skips the cell and the larger sizes (the table
/// says so): CUDA's allocator gets slower with size, and the cell would take `RUNS` times as long.
const CUDA_BUDGET_MS: f32 = 3000.0;
/// Bytes of toga heap per thread: room for every thread's largest block twice over.
const HEAP_BYTES_PER_THREAD: u64 = 4096 * 2;
/// At most this fraction (1/N) of the device's free memory goes to one toga heap.
const HEAP_SHARE_OF_FREE: u64 = 3;
/// The `scenario` column of the `--csv` rows.
pub const VARIANCE_SCENARIO: &str = "v_variance";

/// Threads of the CUDA malloc cells (and of toga's cells they are compared with) when the bench
/// runs at `threads`.
pub fn cuda_threads(threads: u64) -> u64 {
    threads.min(CUDA_MAX_THREADS)
}

/// CUDA's device-malloc heap must hold every CUDA-cell thread's largest block, with room for its
/// own bookkeeping; it is sized before the module loads.
pub fn cuda_malloc_heap(threads: u64) -> usize {
    let largest = *SIZES.iter().max().unwrap_or(&4096) as u64;
    (cuda_threads(threads) * largest * 3 / 2) as usize
}

/// `--csv FILE`: the file, opened for appending (created if need be) when the command line is
/// read, so that one that cannot be written is a usage error before anything touches the GPU.
#[derive(Clone, Debug)]
pub struct CsvFile {
    path: PathBuf,
    /// Shared because clap clones parsed values; every write appends.
    file: Arc<File>,
}

impl CsvFile {
    /// The value parser of `--csv`.
    pub fn open(path: &str) -> Result<Self, String> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("cannot open {path} to append to it: {e}"))?;
        Ok(Self {
            path: path.into(),
            file: Arc::new(file),
        })
    }

    /// Append `rows` (whole lines), after [`CSV_HEADER`] when the file is empty, in one write;
    /// the error names the file.
    fn append(&self, rows: &str) -> Result<(), String> {
        let mut file = &*self.file;
        let why =
            |e: std::io::Error| format!("{}: cannot append the rows: {e}", self.path.display());
        let empty = file.metadata().map_err(why)?.len() == 0;
        let text = if empty {
            format!("{CSV_HEADER}\n{rows}")
        } else {
            rows.to_string()
        };
        file.write_all(text.as_bytes()).map_err(why)
    }
}

/// Where `--csv` rows go and what they say besides the medians.
pub struct CsvOut<'a> {
    pub file: &'a CsvFile,
    /// The `iteration` column: the process's index (`--run-index`).
    pub run_index: u64,
}

fn median(mut v: Vec<f32>) -> f32 {
    v.sort_by(f32::total_cmp);
    v[v.len() / 2]
}

/// Medians of one cell's [`RUNS`] timed runs.
#[derive(Clone, Copy)]
struct Cell {
    malloc_ms: f32,
    free_ms: f32,
    /// Nulls over the timed runs.
    failed: u64,
}

/// The timed runs of one cell, each one `run()`, after a warm-up that [`cell`] or the caller
/// ran.
fn timed_runs(mut run: impl FnMut() -> toga::Result<Timing>) -> toga::Result<Cell> {
    let (mut m, mut f, mut failed) = (Vec::new(), Vec::new(), 0);
    for _ in 0..RUNS {
        let t = run()?;
        m.push(t.malloc_ms);
        f.push(t.free_ms);
        failed += t.failed;
    }
    Ok(Cell {
        malloc_ms: median(m),
        free_ms: median(f),
        failed,
    })
}

/// One untimed warm-up `run()`, then [`RUNS`] timed ones.
fn cell(mut run: impl FnMut() -> toga::Result<Timing>) -> toga::Result<Cell> {
    run()?;
    timed_runs(run)
}

/// The cells of one row of the main table.
struct Row {
    /// toga on a fresh heap: its malloc and its free columns.
    fresh: Cell,
    /// toga on a warm heap: its malloc column.
    warm: Cell,
    /// The bump baseline.
    bump: Cell,
}

impl Row {
    /// The row's cells, each run by `run(allocator, state)`.
    fn measure(
        mut run: impl FnMut(Allocator, HeapState) -> toga::Result<Timing>,
    ) -> toga::Result<Self> {
        Ok(Self {
            fresh: cell(|| run(Allocator::Toga, HeapState::Fresh))?,
            warm: cell(|| run(Allocator::Toga, HeapState::Warm))?,
            bump: cell(|| run(Allocator::Bump, HeapState::Fresh))?,
        })
    }

    /// Print the row named `label`; whether toga failed no allocation.
    fn print(&self, label: &str) -> bool {
        let failed = self.fresh.failed + self.warm.failed;
        println!(
            "{:>8} {:>14.4} {:>14.4} {:>14.4} {:>12.4} {:>10.1}{}",
            label,
            self.fresh.malloc_ms,
            self.warm.malloc_ms,
            self.fresh.free_ms,
            self.bump.malloc_ms,
            self.fresh.malloc_ms / self.bump.malloc_ms,
            failed_note(failed)
        );
        failed == 0
    }

    /// The row's columns as `--csv` rows have them (the ratio is not one), its size named
    /// `size`.
    fn medians(&self, size: &str) -> [Median; 4] {
        let median = |alloc, state, metric, cell: &Cell| Median {
            alloc,
            size: size.to_string(),
            state,
            metric,
            ms: if metric == FREE {
                cell.free_ms
            } else {
                cell.malloc_ms
            },
            failed: cell.failed,
        };
        [
            median(Allocator::Toga, HeapState::Fresh, MALLOC, &self.fresh),
            median(Allocator::Toga, HeapState::Warm, MALLOC, &self.warm),
            median(Allocator::Toga, HeapState::Fresh, FREE, &self.fresh),
            median(Allocator::Bump, HeapState::Fresh, MALLOC, &self.bump),
        ]
    }
}

/// The `metric` column of a malloc kernel's rows, and of a free kernel's.
const MALLOC: &str = "malloc";
const FREE: &str = "free";

/// One cell median of the main table, as a `--csv` row has it.
struct Median {
    alloc: Allocator,
    /// A size in bytes, or the mixed list's range.
    size: String,
    state: HeapState,
    /// [`MALLOC`] or [`FREE`].
    metric: &'static str,
    ms: f32,
    /// Nulls over the cell's timed runs.
    failed: u64,
}

impl CsvOut<'_> {
    /// Append `medians` of a run on `gpu` at `threads` threads, one row each.
    fn append(&self, gpu: &Gpu, threads: u64, medians: &[Median]) -> Result<(), String> {
        let device = gpu.info().name.replace(',', " ");
        let mut rows = String::new();
        for m in medians {
            // The last column, `rounds`: one malloc (or free) per thread in each timed kernel.
            let _ = writeln!(
                rows,
                "{VARIANCE_SCENARIO},{},{},{threads},{},{},{},{},{},{device},1",
                m.alloc.name(),
                m.size,
                m.state.name(),
                m.metric,
                self.run_index,
                m.ms,
                m.failed,
            );
        }
        self.file.append(&rows)
    }
}

/// A heap for `threads` threads on `gpu`.
fn heap_bytes(gpu: &Gpu, threads: u64) -> toga::Result<u64> {
    Ok((threads * HEAP_BYTES_PER_THREAD).min(gpu.free_memory()? / HEAP_SHARE_OF_FREE))
}

/// `  (N failed)` after a row whose cells had nulls, else nothing.
fn failed_note(failed: u64) -> String {
    if failed > 0 {
        format!("  ({failed} failed)")
    } else {
        String::new()
    }
}

/// Print the tables, and append the main table's medians to `csv` when given; `Ok(false)` if
/// toga failed an allocation it should not have.
pub fn run(gpu: &Gpu, threads: u64, csv: Option<CsvOut>) -> Result<bool, Failure> {
    let mut b = MallocBench::new(gpu, threads, heap_bytes(gpu, threads)?)?;
    println!(
        "{} — one malloc per thread, kernel time (CUDA events); every cell is the median of {RUNS} \
         timed runs after one warm-up",
        gpu.info().name,
    );
    println!("\n{threads} threads (the last row: each thread a size from one seeded list):");
    println!(
        "{:>8} {:>14} {:>14} {:>14} {:>12} {:>10}",
        "size", "toga fresh ms", "toga warm ms", "toga free ms", "bump ms", "×bump"
    );
    let mut medians = Vec::new();
    let mut ok = true;
    let mut fresh_cells = Vec::new();
    for size in SIZES {
        let row = Row::measure(|alloc, state| b.run(alloc, size, state))?;
        let label = size.to_string();
        ok &= row.print(&label);
        medians.extend(row.medians(&label));
        fresh_cells.push(row.fresh);
    }
    let sizes = b
        .stream()
        .clone_htod(&mixed_sizes(threads))
        .map_err(toga::Error::from)?;
    let mixed = Row::measure(|alloc, state| b.run_sizes(alloc, &sizes, state))?;
    let label = mixed_label();
    ok &= mixed.print(&label);
    medians.extend(mixed.medians(&label));

    let cuda_n = cuda_threads(threads);
    // The CUDA cells, and toga's fresh cells beside them, at `cuda_n` threads: on a bench of its
    // own when that is fewer, else on `b` and with toga's cells of the table above.
    let mut small = if cuda_n < threads {
        Some(MallocBench::new(gpu, cuda_n, heap_bytes(gpu, cuda_n)?)?)
    } else {
        None
    };
    println!(
        "\n{cuda_n} threads: toga's fresh heap against CUDA's device malloc, which is slow and runs \
         at --threads but at most {CUDA_MAX_THREADS}; no larger sizes once a CUDA warm-up kernel \
         took over {CUDA_BUDGET_MS} ms:"
    );
    println!(
        "{:>8} {:>14} {:>14} {:>10}",
        "size", "toga fresh ms", "cuda malloc ms", "×cuda"
    );
    let mut over_budget = false;
    for (size, fresh_full) in SIZES.into_iter().zip(fresh_cells) {
        let at_cuda_n = small.as_mut().unwrap_or(&mut b);
        let toga = if cuda_n < threads {
            cell(|| at_cuda_n.run(Allocator::Toga, size, HeapState::Fresh))?
        } else {
            fresh_full
        };
        ok &= toga.failed == 0;
        if !over_budget {
            let warm_up = at_cuda_n.run(Allocator::CudaMalloc, size, HeapState::Fresh)?;
            over_budget = warm_up.malloc_ms > CUDA_BUDGET_MS;
        }
        let (cuda, times) = if over_budget {
            ("not run".to_string(), "—".to_string())
        } else {
            let c = timed_runs(|| at_cuda_n.run(Allocator::CudaMalloc, size, HeapState::Fresh))?;
            (
                format!("{:.3}", c.malloc_ms),
                format!("{:.1}", c.malloc_ms / toga.malloc_ms),
            )
        };
        println!(
            "{:>8} {:>14.4} {:>14} {:>10}{}",
            size,
            toga.malloc_ms,
            cuda,
            times,
            failed_note(toga.failed)
        );
    }
    if let Some(out) = csv {
        out.append(gpu, threads, &medians)
            .map_err(Failure::Output)?;
    }
    Ok(ok)
}
