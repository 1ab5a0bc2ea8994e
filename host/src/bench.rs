//! `host bench`: a quick throughput table of toga against CUDA's device malloc and a bump
//! allocator, measured in the same run. The criterion suite in `benches/` is the thorough one.

use toga::Gpu;
use toga_harness::{Allocator, HeapState, MallocBench};

const SIZES: [u32; 5] = [16, 64, 256, 1024, 4096];
/// Timed repetitions per cell (after one warm-up); the table shows the median.
const REPS: usize = 5;
/// CUDA's malloc needs seconds for 2^20 blocks of 256 B or more: one timed run per size, after
/// the warm-up of the first size, keeps `bench` short.
const CUDA_REPS: usize = 1;
/// Once one CUDA malloc kernel took longer than this, larger sizes are not run for it (the
/// table says so): CUDA's allocator gets slower with size.
const CUDA_BUDGET_MS: f32 = 3000.0;

/// CUDA's device-malloc heap must hold every thread's largest block, with room for its own
/// bookkeeping; it is sized before the module loads.
pub fn cuda_malloc_heap(threads: u64) -> usize {
    let largest = *SIZES.iter().max().unwrap_or(&4096) as u64;
    (threads * largest * 3 / 2) as usize
}

fn median(mut v: Vec<f32>) -> f32 {
    v.sort_by(f32::total_cmp);
    v[v.len() / 2]
}

/// Print the table; `Ok(false)` if toga failed an allocation it should not have.
pub fn run(gpu: &Gpu, threads: u64) -> toga::Result<bool> {
    let heap = (threads * 4096 * 2).min(gpu.free_memory()? / 3);
    let mut b = MallocBench::new(gpu, threads, heap)?;
    println!(
        "{} — {} threads, one malloc each, kernel time (CUDA events), median of {REPS} (CUDA malloc: \
         {CUDA_REPS} run, none for larger sizes once one took over {CUDA_BUDGET_MS} ms)",
        gpu.info().name,
        threads
    );
    println!(
        "{:>6} {:>14} {:>14} {:>14} {:>12} {:>14} {:>10} {:>10}",
        "size",
        "toga fresh ms",
        "toga warm ms",
        "toga free ms",
        "bump ms",
        "cuda malloc ms",
        "×cuda",
        "×bump"
    );
    let mut ok = true;
    let mut cuda_last = 0.0f32;
    for (i, size) in SIZES.into_iter().enumerate() {
        let mut cell = |alloc, state, reps, warm_up: bool| -> toga::Result<(f32, f32, u64)> {
            if warm_up {
                b.run(alloc, size, state)?;
            }
            let (mut m, mut f, mut failed) = (Vec::new(), Vec::new(), 0);
            for _ in 0..reps {
                let t = b.run(alloc, size, state)?;
                m.push(t.malloc_ms);
                f.push(t.free_ms);
                failed += t.failed;
            }
            Ok((median(m), median(f), failed))
        };
        let (fresh, free, failed) = cell(Allocator::Toga, HeapState::Fresh, REPS, true)?;
        let (warm, _, failed_warm) = cell(Allocator::Toga, HeapState::Warm, REPS, true)?;
        let (bump, _, _) = cell(Allocator::Bump, HeapState::Fresh, REPS, true)?;
        let cuda = if cuda_last <= CUDA_BUDGET_MS {
            cuda_last = cell(Allocator::CudaMalloc, HeapState::Fresh, CUDA_REPS, i == 0)?.0;
            Some(cuda_last)
        } else {
            None
        };
        ok &= failed + failed_warm == 0;
        let (cuda, times) = match cuda {
            Some(ms) => (format!("{ms:.3}"), format!("{:.0}", ms / fresh)),
            None => ("not run".to_string(), "—".to_string()),
        };
        println!(
            "{:>6} {:>14.4} {:>14.4} {:>14.4} {:>12.4} {:>14} {:>10} {:>10.1}{}",
            size,
            fresh,
            warm,
            free,
            bump,
            cuda,
            times,
            fresh / bump,
            if failed + failed_warm > 0 {
                format!("  ({} failed)", failed + failed_warm)
            } else {
                String::new()
            }
        );
    }
    Ok(ok)
}
