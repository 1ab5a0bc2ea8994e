//! Shared by every bench file: open the GPU (or skip), run a scenario against each allocator with
//! GPU time from CUDA events through `iter_custom`, and append every sample to a CSV.
//!
//! CSV rows go to `$TOGA_BENCH_CSV_DIR/<scenario>.csv` (default `target/toga-bench/`):
//! `scenario,allocator,size,threads,state,metric,iteration,ms,failed,device,rounds`, where
//! `rounds` is the number of `metric` operations each thread does in the timed kernel (1 but for
//! churn), so the kernel does `threads × rounds` of them.
#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{BenchmarkGroup, Criterion, Throughput, measurement::WallTime};
use toga::Gpu;
use toga_harness::{Allocator, CSV_HEADER, HeapState, MallocBench, Timing};

/// Runs of each cell written to the CSV: its first this many, for every allocator alike
/// (criterion runs a fast cell many more times than a slow one, and at least a warm-up run and
/// [`group`]'s 10 samples of one run or more, so every cell has this many).
pub const TIMED_RUNS: usize = 10;

/// 2^20 threads, the paper's and the issues' benchmark size.
pub const THREADS: u64 = 1 << 20;
/// Sizes of scenario (a).
pub const SIZES: [u32; 5] = [16, 64, 256, 1024, 4096];

/// CUDA's device malloc takes seconds per kernel for 2^20 blocks of 256 B and more (about 5 s at
/// 256 B on an H100), and criterion runs each cell about a dozen times: it is run only for
/// cells of at most this many bytes in all (2^20 × 64 B), and `host bench` times it once at
/// every size. The docs say which cells have no CUDA number.
pub const CUDA_MAX_BYTES: u64 = (1 << 20) * 64;

/// CUDA's own default device-malloc heap (8 MiB): [`gpu`] never sets the limit below it.
pub const CUDA_DEFAULT_HEAP: u64 = 8 << 20;

/// Whether a cell of `threads` allocations of up to `size` bytes is run for `alloc`.
pub fn affordable(alloc: Allocator, threads: u64, size: u32) -> bool {
    alloc != Allocator::CudaMalloc || threads * size as u64 <= CUDA_MAX_BYTES
}

/// The GPU for benchmarks, with CUDA's malloc heap raised for `threads × largest` bytes (and
/// half again for its own overhead); `None` (after saying so) when there is no GPU.
pub fn gpu(threads: u64, largest: u32) -> Option<Gpu> {
    let cuda_heap = (threads * largest as u64 * 3 / 2).max(CUDA_DEFAULT_HEAP) as usize;
    match toga_harness::open_with_cuda_heap(0, cuda_heap) {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("skipped: no CUDA device ({e})");
            None
        }
    }
}

pub fn group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10)
        // GPU time per cell, as criterion counts it (`iter_custom`); the wall time is several
        // times more (heap set-up, copies), and a lease is short.
        .warm_up_time(Duration::from_millis(50))
        .measurement_time(Duration::from_millis(300))
        .sampling_mode(criterion::SamplingMode::Flat);
    g
}

/// Appends samples to the scenario's CSV.
pub struct Csv {
    file: std::fs::File,
    device: String,
    /// Operations per thread in each timed kernel (the `rounds` column).
    rounds: u32,
}

impl Csv {
    pub fn new(scenario: &str, gpu: &Gpu) -> Self {
        let dir = std::env::var_os("TOGA_BENCH_CSV_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/toga-bench"));
        std::fs::create_dir_all(&dir).expect("creating the CSV directory");
        let path = dir.join(format!("{scenario}.csv"));
        let new = !path.exists();
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("opening the CSV");
        if new {
            writeln!(file, "{CSV_HEADER}").unwrap();
        }
        Self {
            file,
            device: gpu.info().name.replace(',', " "),
            rounds: 1,
        }
    }

    /// Every row of this CSV is for kernels in which each thread does `rounds` operations.
    pub fn with_rounds(mut self, rounds: u32) -> Self {
        self.rounds = rounds;
        self
    }

    /// One sample, written only for the cell's first [`TIMED_RUNS`] iterations (0-based), so
    /// that every allocator's cell has the same number of samples.
    #[allow(clippy::too_many_arguments)]
    pub fn row(
        &mut self,
        scenario: &str,
        alloc: &str,
        size: &str,
        threads: u64,
        state: &str,
        metric: &str,
        iteration: usize,
        ms: f32,
        failed: u64,
    ) {
        if iteration >= TIMED_RUNS {
            return;
        }
        writeln!(
            self.file,
            "{scenario},{alloc},{size},{threads},{state},{metric},{iteration},{ms},{failed},{},{}",
            self.device, self.rounds
        )
        .unwrap();
    }
}

/// What one benchmark cell is, for its CSV rows.
struct Cell<'a> {
    scenario: &'a str,
    alloc: Allocator,
    label: &'a str,
    threads: u64,
    state: &'a str,
    metric: &'a str,
}

impl Cell<'_> {
    /// The GPU time of the cell's kernel in `t`, written to `csv` as the row of `iteration`.
    fn record(&self, csv: &mut Csv, iteration: usize, t: Timing) -> f32 {
        let ms = if self.metric == "free" {
            t.free_ms
        } else {
            t.malloc_ms
        };
        csv.row(
            self.scenario,
            self.alloc.name(),
            self.label,
            self.threads,
            self.state,
            self.metric,
            iteration,
            ms,
            t.failed,
        );
        ms
    }
}

/// Benchmark `metric` ("malloc" or "free") of `alloc` at `size` in `state`: each criterion
/// iteration is one full `MallocBench::run`, and only the chosen kernel's GPU time counts.
#[allow(clippy::too_many_arguments)]
pub fn bench_malloc(
    g: &mut BenchmarkGroup<WallTime>,
    b: &mut MallocBench,
    csv: &mut Csv,
    scenario: &str,
    alloc: Allocator,
    size: u32,
    state: HeapState,
    metric: &'static str,
) {
    let threads = b.threads();
    if !affordable(alloc, threads, size) {
        return;
    }
    g.throughput(Throughput::Elements(threads));
    let id = format!("{}/{}/{}/{size}", alloc.name(), state.name(), metric);
    gpu_timed(g, id, |iteration| {
        let t: Timing = b.run(alloc, size, state).expect("benchmark iteration");
        Cell {
            scenario,
            alloc,
            label: &size.to_string(),
            threads,
            state: state.name(),
            metric,
        }
        .record(csv, iteration, t)
    });
}

/// Benchmark `metric` ("malloc" or "free") of `alloc` at `size`, one launch per iteration on the
/// heap as the iterations before it left it ([`MallocBench::run_steady`]); the caller warms the
/// heap first (a [`MallocBench::run`] in [`HeapState::Warm`]). Rows say `warm`.
pub fn bench_steady(
    g: &mut BenchmarkGroup<WallTime>,
    b: &mut MallocBench,
    csv: &mut Csv,
    scenario: &str,
    alloc: Allocator,
    size: u32,
    metric: &'static str,
) {
    let threads = b.threads();
    if !affordable(alloc, threads, size) {
        return;
    }
    let state = HeapState::Warm.name();
    g.throughput(Throughput::Elements(threads));
    let id = format!("{}/{state}/{metric}/{size}", alloc.name());
    gpu_timed(g, id, |iteration| {
        let t = b.run_steady(alloc, size).expect("benchmark iteration");
        Cell {
            scenario,
            alloc,
            label: &size.to_string(),
            threads,
            state,
            metric,
        }
        .record(csv, iteration, t)
    });
}

/// Benchmark `metric` ("malloc" or "free") of `alloc` where thread `i` asks for `sizes[i]`
/// (`label` names the sizes in the id and the CSV), in `state`: each criterion iteration is one
/// `MallocBench::run_sizes`, and only the chosen kernel's GPU time counts.
#[allow(clippy::too_many_arguments)]
pub fn bench_sizes(
    g: &mut BenchmarkGroup<WallTime>,
    b: &mut MallocBench,
    csv: &mut Csv,
    scenario: &str,
    alloc: Allocator,
    sizes: &cudarc::driver::CudaSlice<u32>,
    label: &str,
    state: HeapState,
    metric: &'static str,
) {
    let threads = b.threads();
    g.throughput(Throughput::Elements(threads));
    let id = format!("{}/{}/{metric}/{label}", alloc.name(), state.name());
    gpu_timed(g, id, |iteration| {
        let t = b
            .run_sizes(alloc, sizes, state)
            .expect("benchmark iteration");
        Cell {
            scenario,
            alloc,
            label,
            threads,
            state: state.name(),
            metric,
        }
        .record(csv, iteration, t)
    });
}

/// Register benchmark `id` whose every iteration is `one(iteration)`, returning the GPU time (ms)
/// that counts; criterion sees only those times (`iter_custom`).
pub fn gpu_timed(g: &mut BenchmarkGroup<WallTime>, id: String, mut one: impl FnMut(usize) -> f32) {
    let mut iteration = 0;
    g.bench_function(id, |bencher| {
        bencher.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                total += Duration::from_secs_f64(one(iteration) as f64 / 1e3);
                iteration += 1;
            }
            total
        })
    });
}
