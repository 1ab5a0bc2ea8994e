//! `host mix`: one heap that host and kernels both allocate from and free into, on several
//! streams at once (`Heap::alloc_async`, `free_async` and the batched forms;
//! `docs/host-api.md`).
//!
//! Each round, on each stream:
//! - the host allocates a batch of blocks (`alloc_async_batch`) and a few single blocks
//!   (`alloc_async`, whose pointers kernels read from the handles' slots);
//! - a kernel allocates as many with its own `malloc` (`toga_alloc_fill`);
//! - kernels fill every block with the pattern of its owner and check it;
//! - then each side frees the other's: a kernel frees the host's batch, the host frees the
//!   kernel's blocks (`free_async_batch`) and its single blocks (`free_async`).
//!
//! The streams run side by side: nothing waits between them until the round ends. After each
//! round the heap must be empty, with exact counts of mallocs and frees, no failed
//! allocation and no bad free.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use toga::{Gpu, Heap, HeapStats, HostBlock};
use toga_harness::{Workloads, host_pattern, uniform_sizes};

use crate::cli::{Common, MAX_THREADS};

/// `host mix`.
#[derive(clap::Args, Debug, Clone)]
pub struct MixArgs {
    #[command(flatten)]
    pub common: Common,
    /// Heap size (data bytes), e.g. 512MiB or 2GiB.
    #[arg(long, value_parser = parse_heap_size, default_value = "1GiB")]
    pub heap_size: u64,
    /// Blocks each side allocates per stream and round (fewer when half the heap cannot hold
    /// them all at 8 KiB each).
    #[arg(long, default_value_t = 1 << 15, value_parser = clap::value_parser!(u64).range(1..=MAX_THREADS))]
    pub threads: u64,
    /// Streams that allocate and free side by side.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub streams: u32,
    /// Rounds; the heap must be empty after each.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub rounds: u32,
    /// Seed for the sizes.
    #[arg(long, default_value_t = 0x7064)]
    pub seed: u32,
}

/// A heap size toga can make on some GPU (as `--heap-size` of the other subcommands).
fn parse_heap_size(s: &str) -> Result<u64, String> {
    let bytes = parse_size::Config::new()
        .with_binary()
        .parse_size(s)
        .map_err(|e| format!("{e} (try 512MiB or 2GiB)"))?;
    toga::heap::check_heap_size(bytes).map_err(|e| e.to_string())?;
    Ok(bytes)
}

/// Request sizes, uniform over this range.
const SIZES: (u32, u32) = (16, 8192);
/// Single `alloc_async` blocks per stream and round.
const SINGLES: usize = 32;

/// What one stream enqueued in a round, kept until the round's checks.
struct Lane {
    stream: Arc<CudaStream>,
    host_ptrs: CudaSlice<u64>,
    host_sizes: CudaSlice<u64>,
    kernel_ptrs: CudaSlice<u64>,
    kernel_sizes: CudaSlice<u32>,
    singles: Vec<HostBlock>,
    single_slots: CudaSlice<u64>,
    single_sizes: CudaSlice<u64>,
    /// Wrong words / null blocks, counted by the checking kernels.
    errors: CudaSlice<u64>,
}

/// Run the rounds; `Ok(true)` when every one verified.
pub fn run(gpu: &Gpu, args: &MixArgs) -> toga::Result<bool> {
    let creator = gpu.default_stream();
    let heap = Heap::new(gpu, &creator, args.heap_size)?;
    creator.synchronize()?;
    let w = Workloads::new(gpu)?;
    let streams: Vec<_> = (0..args.streams)
        .map(|_| gpu.new_stream())
        .collect::<Result<_, _>>()?;
    // Per stream, host blocks and kernel blocks, at most half the heap in all.
    let per_block = SIZES.1 as u64;
    let n = args
        .threads
        .min(heap.capacity() / 2 / per_block / (2 * args.streams as u64))
        .max(1);
    println!(
        "{} ({} SMs), heap {} MiB, {} streams × {n} host + {n} kernel blocks of {}–{} B + {SINGLES} single host blocks, {} rounds",
        gpu.info().name,
        gpu.info().sm_count,
        heap.capacity() >> 20,
        args.streams,
        SIZES.0,
        SIZES.1,
        args.rounds
    );
    let mut ok = true;
    let mut expected = 0u64;
    for round in 0..args.rounds {
        let start = std::time::Instant::now();
        let mut lanes = Vec::new();
        for (k, stream) in streams.iter().enumerate() {
            let seed = (args.seed as u64) << 16 | (round as u64) << 8 | k as u64;
            let tag = round * 64 + k as u32;
            let host_sizes: Vec<u64> = uniform_sizes(n, SIZES.0, SIZES.1, seed)
                .iter()
                .map(|&s| s as u64)
                .collect();
            let host_sizes = stream.clone_htod(&host_sizes)?;
            let mut host_ptrs = stream.alloc_zeros::<u64>(n as usize)?;
            heap.alloc_async_batch(&host_sizes, &mut host_ptrs, stream)?;
            let kernel_sizes = stream.clone_htod(&uniform_sizes(n, SIZES.0, SIZES.1, !seed))?;
            let mut kernel_ptrs = stream.alloc_zeros::<u64>(n as usize)?;
            w.alloc_fill(stream, &heap, &mut kernel_ptrs, &kernel_sizes, tag)?;
            let single_bytes: Vec<u64> = (0..SINGLES as u64).map(|i| 16 << (i % 10)).collect();
            let singles = single_bytes
                .iter()
                .map(|&b| heap.alloc_async(b, stream))
                .collect::<toga::Result<Vec<_>>>()?;
            let single_slots =
                stream.clone_htod(&singles.iter().map(HostBlock::slot).collect::<Vec<_>>())?;
            let single_sizes = stream.clone_htod(&single_bytes)?;
            let mut errors = stream.alloc_zeros::<u64>(2)?;
            host_pattern(
                gpu,
                stream,
                &host_ptrs,
                false,
                &host_sizes,
                tag,
                false,
                &mut errors,
            )?;
            host_pattern(
                gpu,
                stream,
                &single_slots,
                true,
                &single_sizes,
                tag,
                false,
                &mut errors,
            )?;
            lanes.push(Lane {
                stream: stream.clone(),
                host_ptrs,
                host_sizes,
                kernel_ptrs,
                kernel_sizes,
                singles,
                single_slots,
                single_sizes,
                errors,
            });
        }
        // Check everything, then each side frees the other's blocks; still no wait between
        // the streams.
        for (k, lane) in lanes.iter_mut().enumerate() {
            let tag = round * 64 + k as u32;
            let s = &lane.stream;
            host_pattern(
                gpu,
                s,
                &lane.host_ptrs,
                false,
                &lane.host_sizes,
                tag,
                true,
                &mut lane.errors,
            )?;
            host_pattern(
                gpu,
                s,
                &lane.single_slots,
                true,
                &lane.single_sizes,
                tag,
                true,
                &mut lane.errors,
            )?;
            w.check_free(
                s,
                &heap,
                &lane.kernel_ptrs,
                &lane.kernel_sizes,
                tag,
                false,
                &mut lane.errors,
            )?;
            w.free(s, Some(&heap), &lane.host_ptrs)?;
            heap.free_async_batch(&mut lane.kernel_ptrs, s)?;
            for b in lane.singles.drain(..) {
                heap.free_async(b, s)?;
            }
        }
        let mut bad = [0u64; 2];
        for lane in &lanes {
            let e = lane.stream.clone_dtoh(&lane.errors)?;
            bad[0] += e[0];
            bad[1] += e[1];
        }
        let ms = start.elapsed().as_secs_f64() * 1e3;
        expected += args.streams as u64 * (2 * n + SINGLES as u64);
        let s: HeapStats = heap.stats(&creator)?;
        let mut problems = Vec::new();
        if bad != [0, 0] {
            problems.push(format!("{} wrong words, {} null blocks", bad[0], bad[1]));
        }
        if s.live_blocks() != 0 || s.used_bytes != 0 {
            problems.push(format!(
                "{} blocks ({} B) still live",
                s.live_blocks(),
                s.used_bytes
            ));
        }
        if s.mallocs != expected || s.frees != expected {
            problems.push(format!(
                "{} mallocs and {} frees, {expected} of each expected",
                s.mallocs, s.frees
            ));
        }
        if s.failed_allocations + s.invalid_frees + s.double_frees != 0 {
            problems.push(format!(
                "{} failed allocations, {} invalid and {} double frees",
                s.failed_allocations, s.invalid_frees, s.double_frees
            ));
        }
        let verified = problems.is_empty();
        ok &= verified;
        println!(
            "round {round}: {} {} blocks allocated and freed across sides in {ms:.2} ms (wall); mallocs {} frees {} {}",
            if verified { "✓" } else { "✗" },
            args.streams as u64 * (2 * n + SINGLES as u64),
            s.mallocs,
            s.frees,
            problems.join("; ")
        );
    }
    Ok(ok)
}
