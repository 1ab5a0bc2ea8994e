//! `host bench`: a quick throughput table of toga against CUDA's device malloc and a bump
//! allocator, measured in the same run. The criterion suite in `benches/` is the thorough one.
//!
//! Every cell is the median of [`RUNS`] timed runs after one untimed warm-up, for every
//! allocator, so each ratio compares medians of equally many runs. CUDA's malloc is too slow to
//! run at `--threads` that often (2^20 × 16 B takes about 300 ms a kernel, larger sizes seconds):
//! it runs at [`cuda_threads`] threads, in a second table beside toga's fresh heap at the same
//! thread count.

use toga::Gpu;
use toga_harness::{Allocator, HeapState, MallocBench};

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

/// The timed runs of one cell after a warm-up that [`cell`] or the caller ran.
fn timed_runs(
    b: &mut MallocBench,
    alloc: Allocator,
    size: u32,
    state: HeapState,
) -> toga::Result<Cell> {
    let (mut m, mut f, mut failed) = (Vec::new(), Vec::new(), 0);
    for _ in 0..RUNS {
        let t = b.run(alloc, size, state)?;
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

/// One untimed warm-up run, then [`RUNS`] timed ones.
fn cell(b: &mut MallocBench, alloc: Allocator, size: u32, state: HeapState) -> toga::Result<Cell> {
    b.run(alloc, size, state)?;
    timed_runs(b, alloc, size, state)
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

/// Print the tables; `Ok(false)` if toga failed an allocation it should not have.
pub fn run(gpu: &Gpu, threads: u64) -> toga::Result<bool> {
    let mut b = MallocBench::new(gpu, threads, heap_bytes(gpu, threads)?)?;
    println!(
        "{} — one malloc per thread, kernel time (CUDA events); every cell is the median of {RUNS} \
         timed runs after one warm-up",
        gpu.info().name,
    );
    println!("\n{threads} threads:");
    println!(
        "{:>6} {:>14} {:>14} {:>14} {:>12} {:>10}",
        "size", "toga fresh ms", "toga warm ms", "toga free ms", "bump ms", "×bump"
    );
    let mut ok = true;
    let mut fresh_cells = Vec::new();
    for size in SIZES {
        let fresh = cell(&mut b, Allocator::Toga, size, HeapState::Fresh)?;
        let warm = cell(&mut b, Allocator::Toga, size, HeapState::Warm)?;
        let bump = cell(&mut b, Allocator::Bump, size, HeapState::Fresh)?;
        let failed = fresh.failed + warm.failed;
        ok &= failed == 0;
        println!(
            "{:>6} {:>14.4} {:>14.4} {:>14.4} {:>12.4} {:>10.1}{}",
            size,
            fresh.malloc_ms,
            warm.malloc_ms,
            fresh.free_ms,
            bump.malloc_ms,
            fresh.malloc_ms / bump.malloc_ms,
            failed_note(failed)
        );
        fresh_cells.push(fresh);
    }

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
        "{:>6} {:>14} {:>14} {:>10}",
        "size", "toga fresh ms", "cuda malloc ms", "×cuda"
    );
    let mut over_budget = false;
    for (size, fresh_full) in SIZES.into_iter().zip(fresh_cells) {
        let at_cuda_n = small.as_mut().unwrap_or(&mut b);
        let toga = if cuda_n < threads {
            cell(at_cuda_n, Allocator::Toga, size, HeapState::Fresh)?
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
            let c = timed_runs(at_cuda_n, Allocator::CudaMalloc, size, HeapState::Fresh)?;
            (
                format!("{:.3}", c.malloc_ms),
                format!("{:.1}", c.malloc_ms / toga.malloc_ms),
            )
        };
        println!(
            "{:>6} {:>14.4} {:>14} {:>10}{}",
            size,
            toga.malloc_ms,
            cuda,
            times,
            failed_note(toga.failed)
        );
    }
    Ok(ok)
}
