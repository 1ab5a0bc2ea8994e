//! `host bench`: a quick throughput table of toga against CUDA's device malloc and a bump
//! allocator, measured in the same run. The criterion suite in `benches/` is the thorough one.

use toga::workload::{Allocator, HeapState, MallocBench};
use toga::{Gpu, GpuOptions};

use crate::Cli;

const SIZES: [u32; 5] = [16, 64, 256, 1024, 4096];
/// Timed repetitions per cell (after one warm-up); the table shows the median.
const REPS: usize = 5;
/// CUDA's malloc needs 2^20 × 1 KiB in several seconds: fewer repetitions keep `bench` short.
const CUDA_REPS: usize = 3;

/// CUDA's device-malloc heap must hold every thread's largest block, with room for its own
/// bookkeeping; it is sized before the module loads.
pub fn gpu_options(threads: u64) -> GpuOptions {
    let largest = *SIZES.iter().max().unwrap_or(&4096) as u64;
    GpuOptions {
        cuda_malloc_heap: Some((threads * largest * 3 / 2) as usize),
    }
}

fn median(mut v: Vec<f32>) -> f32 {
    v.sort_by(f32::total_cmp);
    v[v.len() / 2]
}

/// Print the table; `Ok(false)` if toga failed an allocation it should not have.
pub fn run(gpu: &Gpu, cli: &Cli) -> toga::Result<bool> {
    let threads = cli.threads;
    let heap = (threads * 4096 * 2).min(gpu.free_memory()? / 3);
    let mut b = MallocBench::new(gpu, threads, heap)?;
    println!(
        "{} — {} threads, one malloc each, kernel time (CUDA events), median of {REPS} ({CUDA_REPS} for CUDA malloc)",
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
    for size in SIZES {
        let mut cell = |alloc, state, reps| -> toga::Result<(f32, f32, u64)> {
            b.run(alloc, size, state)?; // warm-up
            let (mut m, mut f, mut failed) = (Vec::new(), Vec::new(), 0);
            for _ in 0..reps {
                let t = b.run(alloc, size, state)?;
                m.push(t.malloc_ms);
                f.push(t.free_ms);
                failed += t.failed;
            }
            Ok((median(m), median(f), failed))
        };
        let (fresh, free, failed) = cell(Allocator::Toga, HeapState::Fresh, REPS)?;
        let (warm, _, failed_warm) = cell(Allocator::Toga, HeapState::Warm, REPS)?;
        let (bump, _, _) = cell(Allocator::Bump, HeapState::Fresh, REPS)?;
        let (cuda, _, _) = cell(Allocator::CudaMalloc, HeapState::Fresh, CUDA_REPS)?;
        ok &= failed + failed_warm == 0;
        println!(
            "{:>6} {:>14.4} {:>14.4} {:>14.4} {:>12.4} {:>14.3} {:>10.0} {:>10.1}{}",
            size,
            fresh,
            warm,
            free,
            bump,
            cuda,
            cuda / fresh,
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
