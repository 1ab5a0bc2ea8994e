//! `cargo run -p host`: toga's stress harness. With no arguments it runs the standard suite on
//! GPU 0 and prints one row per workload; it exits 1 if any verification fails, 2 when there is
//! no GPU to run on.

mod bench;
mod growable;
mod report;
mod scan;
mod workloads;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use toga::{Error, Gpu};

/// Exit code when there is no GPU or driver to run on.
const EXIT_NO_GPU: u8 = 2;
/// Exit code for any other failure: bad input, a failed verification, a CUDA error.
const EXIT_FAILURE: u8 = 1;
/// The default heap: the smaller of this and a quarter of free memory.
const DEFAULT_HEAP_MAX: u64 = 1 << 30;

#[derive(Parser, Debug)]
#[command(
    name = "host",
    version,
    about = "toga's stress harness: verifies and times the GPU allocator under contention"
)]
struct Cli {
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0, global = true)]
    device: usize,
    /// Heap size (data bytes), e.g. 512MiB or 2GiB. Default: the smaller of 1 GiB and a quarter
    /// of free device memory.
    #[arg(long, value_parser = parse_bytes, global = true)]
    heap_size: Option<u64>,
    /// Threads per workload kernel.
    #[arg(long, default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(1..=(1 << 24)), global = true)]
    threads: u64,
    /// Seed for the random workloads.
    #[arg(long, default_value_t = 0x7064, global = true)]
    seed: u32,
    /// Print results as JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// Give up (exit 1) if the whole run takes longer than this many seconds: a kernel that
    /// never finishes cannot be interrupted otherwise.
    #[arg(long, default_value_t = 300, global = true)]
    timeout: u64,
    /// Run only this workload (see `stress --help` for the names).
    #[arg(long, value_enum, global = true)]
    workload: Option<workloads::Kind>,
    /// Growable heap workload: grow the heap from the host before each round instead of from
    /// inside the kernels. For compute-sanitizer memcheck, which does not see memory mapped
    /// while a kernel runs (docs/growable.md).
    #[arg(long, global = true)]
    host_growth: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug, Clone)]
enum Command {
    /// Run the verified workloads (the default).
    Stress,
    /// Quick throughput table: toga, CUDA's device malloc and a bump allocator, same run.
    Bench,
    /// Device, SMs, memory, heap geometry and size classes.
    Info,
    /// One malloc and one free kernel per size and thread count (2^8 up to --threads), each
    /// with a time limit: where does the allocator stop scaling?
    Scan {
        /// Sizes to scan, in bytes (default: 16, 256, 2048, 4096, 65536 and 1 MiB).
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<u32>,
        /// Skip the out-of-memory round trip that opens the scan.
        #[arg(long)]
        no_exhaust: bool,
    },
    /// A growable heap alone: start small, grow under load, trim after; a table per round.
    ///
    /// Rounds of --threads / 16, --threads / 4 and --threads threads (16–4096 B each, every
    /// pattern checked, exact counts) grow the heap inside the kernels; once all is free, a
    /// trim and a synchronize must take it back to --initial, and one more round must work.
    Grow {
        /// Bytes mapped at creation, and the release threshold a trim goes back to, e.g. 8MiB.
        #[arg(long, value_parser = parse_bytes, default_value = "8MiB")]
        initial: u64,
        /// Bytes the heap may grow to, e.g. 4GiB. Default: the smaller of 4 GiB and half the
        /// free device memory.
        #[arg(long, value_parser = parse_bytes)]
        max: Option<u64>,
    },
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s)
        .map_err(|e| format!("{e} (try 512MiB or 2GiB)"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    watchdog(cli.timeout);
    match run(&cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(EXIT_FAILURE),
        Err(e @ (Error::NoDriver | Error::NoDevice(_))) => {
            eprintln!("host: {e}");
            ExitCode::from(EXIT_NO_GPU)
        }
        Err(e) => {
            eprintln!("host: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// A GPU kernel that never finishes blocks the host forever in the next synchronization; after
/// `seconds` the watchdog says so and ends the process.
fn watchdog(seconds: u64) {
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(seconds));
        eprintln!("host: gave up after {seconds} s: a kernel did not finish (see --timeout)");
        std::process::exit(EXIT_FAILURE as i32);
    });
}

/// Ok(true) when everything verified.
fn run(cli: &Cli) -> toga::Result<bool> {
    let command = cli.command.clone().unwrap_or(Command::Stress);
    // Sizes that can never work are refused before touching the GPU.
    if let Some(bytes) = cli.heap_size {
        toga::heap::check_heap_size(bytes)?;
    }
    // Only the bench needs CUDA's own malloc heap, which must be sized before the module loads.
    let gpu = match &command {
        Command::Bench => {
            toga_harness::open_with_cuda_heap(cli.device, bench::cuda_malloc_heap(cli.threads))?
        }
        _ => toga_harness::open(cli.device)?,
    };
    let heap_size = match cli.heap_size {
        Some(s) => s,
        None => DEFAULT_HEAP_MAX.min(gpu.free_memory()? / 4),
    };
    match command {
        Command::Info => info(&gpu, heap_size).map(|_| true),
        Command::Stress => workloads::stress(&gpu, heap_size, cli),
        Command::Bench => bench::run(&gpu, cli),
        Command::Scan { sizes, no_exhaust } => scan::run(&gpu, heap_size, cli, &sizes, !no_exhaust),
        Command::Grow { initial, max } => growable::run(&gpu, cli, initial, max),
    }
}

fn info(gpu: &Gpu, heap_size: u64) -> toga::Result<()> {
    let i = gpu.info();
    println!(
        "device {}: {} (sm_{}{}), {} SMs, {:.1} GiB total, {:.1} GiB free, driver {}.{}",
        i.ordinal,
        i.name,
        i.compute_capability.0,
        i.compute_capability.1,
        i.sm_count,
        i.total_memory as f64 / (1u64 << 30) as f64,
        i.free_memory as f64 / (1u64 << 30) as f64,
        i.driver_version / 1000,
        i.driver_version % 1000 / 10
    );
    let stream = gpu.default_stream();
    let heap = toga::Heap::new(gpu, &stream, heap_size)?;
    let g = heap.geometry();
    println!(
        "heap: {} data bytes ({} pages, buddy orders 0..={}), {} arenas, {} metadata bytes",
        g.data_bytes(),
        g.pages,
        g.max_order,
        g.arenas,
        g.data_offset
    );
    let classes: Vec<String> = (0..toga_kernels::size_class::NUM_CLASSES)
        .map(|c| {
            toga_kernels::size_class::SizeClass::ALL[c]
                .size()
                .to_string()
        })
        .collect();
    println!(
        "size classes (UAlloc, bytes): {}; larger requests: TBuddy blocks of 4 KiB << order",
        classes.join(" ")
    );
    let probe = toga_harness::Workloads::new(gpu)?.probe(&stream, &heap)?;
    println!(
        "heap check: {} bytes free in the buddy tree, whole-heap block {}",
        probe.free_bytes,
        if probe.whole_heap_block {
            "available"
        } else {
            "not available (heap is not a power of two)"
        }
    );
    Ok(())
}
