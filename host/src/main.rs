//! `cargo run -p host`: toga's stress harness.
//!
//! # Subcommands
//!
//! Each takes only its own flags (`host <COMMAND> --help`; docs/cli.md lists them all).
//! Every one takes `--device` and `--timeout`.
//!
//! - `stress` (the default: `host` alone runs it, with its flags at the top level, e.g.
//!   `host --threads 4096 --heap-size 64MiB --host-growth`): the verified workloads, one row
//!   each; `--heap-size`, `--threads`, `--seed`, `--json`, `--host-growth`, `--workload`.
//! - `bench`: a quick throughput table of toga, CUDA's device malloc and a bump allocator,
//!   at each size and at mixed sizes; `--threads`, `--csv`, `--run-index`.
//! - `info`: the device, its memory, a heap's geometry and the size classes; `--heap-size`.
//! - `scan`: one malloc and one free kernel per size and thread count, each with a time limit;
//!   `--heap-size`, `--threads`, `--sizes`, `--no-exhaust`.
//! - `grow`: a growable heap alone, grown under load and trimmed after; `--threads`, `--seed`,
//!   `--json`, `--host-growth`, `--initial`, `--max`.
//!
//! # Exit codes
//!
//! One meaning each (the [`exit`] module, also shown by `host --help`):
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | success: everything ran and verified |
//! | 1 | verification failure: a check found wrong data, a row did not verify |
//! | 2 | usage error: a bad flag or value, before anything touches the GPU (clap's own code) |
//! | 3 | no GPU: no CUDA driver, no device, or `--device` names one that does not exist |
//! | 4 | timeout: a kernel did not finish (the `--timeout` watchdog, or `scan`'s limit per kernel) |
//! | 5 | any other CUDA or heap error, e.g. a heap larger than the device's free memory; or `bench --csv` rows that could not be written |
//!
//! Codes 1 and 3 to 5 end with one line on stderr that says why, starting `host: ` (a
//! verification failure also shows in the output: rows marked ✗, or a note of failed
//! allocations); a usage error is clap's message.

mod bench;
mod cli;
mod growable;
mod host_alloc;
mod report;
mod scan;
mod workloads;

use std::process::ExitCode;

use clap::Parser;
use toga::Gpu;

use crate::cli::{Cli, Command};

/// The process's exit codes, one meaning each. [`TABLE`](exit::TABLE) is what `--help` shows;
/// docs/cli.md and this crate's documentation repeat it.
pub mod exit {
    use toga::Error;

    /// Everything ran and verified.
    pub const SUCCESS: u8 = 0;
    /// A verification failed: a check found wrong data, or a row did not verify.
    pub const VERIFY_FAILED: u8 = 1;
    /// A usage error: a bad flag or value (clap exits with this code itself).
    pub const USAGE: u8 = 2;
    /// No GPU to run on: no CUDA driver, no device, or `--device` out of range.
    pub const NO_GPU: u8 = 3;
    /// A kernel did not finish: the `--timeout` watchdog, or `scan`'s limit per kernel.
    pub const TIMEOUT: u8 = 4;
    /// Any other CUDA or heap error (a heap larger than the device's free memory, a driver
    /// error, an unreadable `TOGA_PTX_FILE`, ...), or `bench --csv` rows that could not be
    /// written.
    pub const CUDA_ERROR: u8 = 5;

    /// The table `--help` shows after the flags.
    pub const TABLE: &str = "Exit codes:
  0  success: everything ran and verified
  1  verification failure: a check found wrong data, a row did not verify
  2  usage error: a bad flag or value (nothing touched the GPU)
  3  no GPU: no CUDA driver, no device, or --device names one that does not exist
  4  timeout: a kernel did not finish (the --timeout watchdog, or scan's limit per kernel)
  5  any other CUDA or heap error, e.g. a heap larger than the device's free memory, or bench's CSV not written";

    /// The exit code for an error of the run.
    pub fn for_error(e: &Error) -> u8 {
        match e {
            Error::NoDriver | Error::NoDevice(_) | Error::DeviceOutOfRange { .. } => NO_GPU,
            _ => CUDA_ERROR,
        }
    }
}

/// Why a run stopped short.
#[derive(Debug)]
pub enum Failure {
    /// toga or CUDA failed.
    Toga(toga::Error),
    /// An output file could not be written (`bench --csv`, opened when the command line was
    /// read); the message names it.
    Output(String),
}

impl From<toga::Error> for Failure {
    fn from(e: toga::Error) -> Self {
        Failure::Toga(e)
    }
}

impl Failure {
    /// The exit code: [`exit::for_error`]'s, [`exit::CUDA_ERROR`] for an output file.
    fn exit_code(&self) -> u8 {
        match self {
            Failure::Toga(e) => exit::for_error(e),
            Failure::Output(_) => exit::CUDA_ERROR,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Toga(e) => e.fmt(f),
            Failure::Output(why) => f.write_str(why),
        }
    }
}

/// The default heap: the smaller of this and a quarter of free memory.
const DEFAULT_HEAP_MAX: u64 = 1 << 30;

fn main() -> ExitCode {
    let cli = Cli::parse_from(cli::help_as_flag(std::env::args_os()));
    let command = cli.command.unwrap_or(Command::Stress(cli.stress));
    if let Err(e) = command.validate() {
        e.exit();
    }
    watchdog(command.common().timeout);
    ExitCode::from(match run(command) {
        Ok(true) => exit::SUCCESS,
        Ok(false) => {
            eprintln!("host: verification failed (see the output above)");
            exit::VERIFY_FAILED
        }
        Err(e) => {
            eprintln!("host: {e}");
            e.exit_code()
        }
    })
}

/// A GPU kernel that never finishes blocks the host forever in the next synchronization; after
/// `seconds` the watchdog says so and ends the process.
fn watchdog(seconds: u64) {
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(seconds));
        eprintln!("host: gave up after {seconds} s: a kernel did not finish (see --timeout)");
        std::process::exit(exit::TIMEOUT as i32);
    });
}

/// The heap to use: `--heap-size`, or the smaller of [`DEFAULT_HEAP_MAX`] and a quarter of free
/// memory.
fn heap_size(gpu: &Gpu, asked: Option<u64>) -> toga::Result<u64> {
    match asked {
        Some(s) => Ok(s),
        None => Ok(DEFAULT_HEAP_MAX.min(gpu.free_memory()? / 4)),
    }
}

/// Ok(true) when everything verified.
fn run(command: Command) -> Result<bool, Failure> {
    let device = command.common().device;
    match command {
        Command::Stress(a) => {
            let gpu = toga_harness::open(device)?;
            let bytes = heap_size(&gpu, a.heap.heap_size)?;
            Ok(workloads::stress(&gpu, bytes, &a)?)
        }
        // Only the bench needs CUDA's own malloc heap, which must be sized before the module
        // loads.
        Command::Bench(a) => {
            let gpu =
                toga_harness::open_with_cuda_heap(device, bench::cuda_malloc_heap(a.threads))?;
            let csv = a.csv.as_ref().map(|file| bench::CsvOut {
                file,
                run_index: a.run_index,
            });
            bench::run(&gpu, a.threads, csv)
        }
        Command::Info(a) => {
            let gpu = toga_harness::open(device)?;
            let bytes = heap_size(&gpu, a.heap.heap_size)?;
            info(&gpu, bytes)?;
            Ok(true)
        }
        Command::Scan(a) => {
            let gpu = toga_harness::open(device)?;
            let bytes = heap_size(&gpu, a.heap.heap_size)?;
            Ok(scan::run(&gpu, bytes, a.threads, &a.sizes, !a.no_exhaust)?)
        }
        Command::Mix(a) => {
            let gpu = toga_harness::open(device)?;
            Ok(host_alloc::run(&gpu, &a)?)
        }
        Command::Grow(a) => {
            let gpu = toga_harness::open(device)?;
            Ok(growable::run(&gpu, &a)?)
        }
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

#[cfg(test)]
mod tests {
    use super::exit;

    #[test]
    fn exit_codes_are_distinct_and_all_in_the_table() {
        let codes = [
            exit::SUCCESS,
            exit::VERIFY_FAILED,
            exit::USAGE,
            exit::NO_GPU,
            exit::TIMEOUT,
            exit::CUDA_ERROR,
        ];
        for (i, c) in codes.iter().enumerate() {
            assert_eq!(*c as usize, i, "codes are 0, 1, 2, ... in this order");
            assert!(exit::TABLE.contains(&format!("\n  {c}  ")), "{c} missing");
        }
        assert_eq!(exit::TABLE.lines().count(), codes.len() + 1);
    }

    #[test]
    fn clap_usage_errors_exit_with_the_usage_code() {
        use clap::Parser;
        let e = super::Cli::try_parse_from(["host", "--turbo"]).unwrap_err();
        assert_eq!(e.exit_code(), exit::USAGE as i32);
    }

    #[test]
    fn no_gpu_errors_have_their_own_code() {
        use toga::Error;
        assert_eq!(exit::for_error(&Error::NoDriver), exit::NO_GPU);
        assert_eq!(exit::for_error(&Error::NoDevice("x".into())), exit::NO_GPU);
        let out = Error::DeviceOutOfRange {
            ordinal: 9,
            count: 1,
        };
        assert_eq!(exit::for_error(&out), exit::NO_GPU);
        let big = Error::HeapTooLarge {
            requested: 2,
            limit: 1,
            why: "free device memory",
        };
        assert_eq!(exit::for_error(&big), exit::CUDA_ERROR);
    }
}
