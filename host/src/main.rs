//! `cargo run -p host`: toga's stress harness.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cudarc::driver::PushKernelArg;
use toga::{Error, Gpu};

/// Exit code when there is no GPU or driver to run on.
const EXIT_NO_GPU: u8 = 2;
/// Exit code for any other failure (bad input, a failed verification, a CUDA error).
const EXIT_FAILURE: u8 = 1;

#[derive(Parser, Debug)]
#[command(name = "host", version, about = "toga's stress harness: verifies and times the GPU allocator")]
struct Cli {
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0, global = true)]
    device: usize,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Device, SMs, memory; runs a smoke kernel.
    Info,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
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

fn run(cli: &Cli) -> toga::Result<()> {
    let gpu = Gpu::open(cli.device)?;
    match cli.command.as_ref().unwrap_or(&Command::Info) {
        Command::Info => info(&gpu),
    }
}

fn info(gpu: &Gpu) -> toga::Result<()> {
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
    let n = 1u32 << 20;
    let mut out = stream.alloc_zeros::<u32>(n as usize)?;
    let mut count = stream.alloc_zeros::<u32>(1)?;
    let f = gpu.function("toga_smoke")?;
    // SAFETY: `out` has `n` elements and `count` one, as toga_smoke requires.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&mut out)
            .arg(&mut count)
            .arg(&n)
            .launch(toga::launch_config(n as u64))?;
    }
    let out = stream.clone_dtoh(&out)?;
    let count = stream.clone_dtoh(&count)?[0];
    let ok = count == n && out.iter().enumerate().all(|(k, &v)| v == k as u32 * 3 + 1);
    println!("smoke kernel: {n} threads, {}", if ok { "✓" } else { "✗" });
    Ok(())
}
