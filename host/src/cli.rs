//! The command line: each subcommand takes the flags it uses and no others. The groups several
//! subcommands share ([`Common`], [`HeapSize`], [`RunArgs`]) are flattened into them. With no
//! subcommand, `host` runs `stress` and takes the stress flags at the top level; a top-level
//! flag together with a subcommand is a usage error (`host info --device 1`, not
//! `host --device 1 info`).

use std::ffi::OsString;

use clap::{Args, CommandFactory, Parser, Subcommand, error::ErrorKind};

use crate::{bench, exit, workloads};

/// The most seconds `--timeout` takes: a day.
pub const MAX_TIMEOUT_S: u64 = 24 * 60 * 60;
/// The most threads a workload kernel runs.
pub const MAX_THREADS: u64 = 1 << 24;
const DEFAULT_THREADS: u64 = 1 << 20;

#[derive(Parser, Debug)]
#[command(
    name = "host",
    version,
    about = "toga's stress harness: verifies and times the GPU allocator under contention",
    long_about = "toga's stress harness: verifies and times the GPU allocator under contention.\n\n\
                  With no subcommand it runs `stress` and takes the stress flags below; each \
                  subcommand takes its own flags (`host <COMMAND> --help`).",
    args_conflicts_with_subcommands = true,
    after_help = exit::TABLE
)]
pub struct Cli {
    #[command(
        flatten,
        next_help_heading = "Stress options (when no subcommand is given)"
    )]
    pub stress: StressArgs,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Run the verified workloads (the default).
    #[command(after_help = exit::TABLE)]
    Stress(StressArgs),
    /// Quick throughput table: toga, CUDA's device malloc and a bump allocator, same run.
    #[command(after_help = exit::TABLE)]
    Bench(BenchArgs),
    /// Device, SMs, memory, heap geometry and size classes.
    #[command(after_help = exit::TABLE)]
    Info(InfoArgs),
    /// One malloc and one free kernel per size and thread count (2^8 up to --threads), each
    /// with a time limit: where does the allocator stop scaling?
    #[command(after_help = exit::TABLE)]
    Scan(ScanArgs),
    /// A growable heap alone: start small, grow under load, trim after; a table per round.
    ///
    /// Rounds of --threads / 16, --threads / 4 and --threads threads (16–4096 B each, every
    /// pattern checked, exact counts) grow the heap inside the kernels; once all is free, a
    /// trim and a synchronize must take it back to --initial, and one more round must work.
    #[command(after_help = exit::TABLE)]
    Grow(GrowArgs),
    /// Host and kernels share one heap on several streams: each allocates (alloc_async,
    /// malloc) and frees the other's blocks (free_async, free); every block pattern-checked,
    /// exact counts after each round.
    #[command(after_help = exit::TABLE)]
    Mix(crate::host_alloc::MixArgs),
}

impl Command {
    /// The flags every subcommand has.
    pub fn common(&self) -> &Common {
        match self {
            Command::Stress(a) => &a.common,
            Command::Bench(a) => &a.common,
            Command::Info(a) => &a.common,
            Command::Scan(a) => &a.common,
            Command::Grow(a) => &a.common,
            Command::Mix(a) => &a.common,
        }
    }

    /// What the parser cannot see on its own: a relation between two flags. A usage error
    /// (exit 2, in clap's words and form) before anything touches the GPU.
    pub fn validate(&self) -> Result<(), clap::Error> {
        if let Command::Grow(GrowArgs {
            initial,
            max: Some(max),
            ..
        }) = self
            && initial > max
        {
            let mut cmd = Cli::command();
            cmd.build();
            let grow = cmd
                .find_subcommand_mut("grow")
                .expect("`grow` is a subcommand");
            return Err(grow.error(
                ErrorKind::ArgumentConflict,
                format!("--initial ({initial} B) must not be above --max ({max} B)"),
            ));
        }
        Ok(())
    }
}

/// Flags of every subcommand.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Give up (exit 4) if the whole run takes longer than this many seconds (1 to 86400): a
    /// kernel that never finishes cannot be interrupted otherwise.
    #[arg(
        long,
        default_value_t = 300,
        value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_S)
    )]
    pub timeout: u64,
}

/// The heap of `stress`, `scan` and `info`.
#[derive(Args, Debug, Clone)]
pub struct HeapSize {
    /// Heap size (data bytes), e.g. 512MiB or 2GiB. Default: the smaller of 1 GiB and a quarter
    /// of free device memory.
    #[arg(long, value_parser = parse_heap_size)]
    pub heap_size: Option<u64>,
}

/// The verified workloads' settings, shared by `stress` and `grow`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Threads per workload kernel.
    #[arg(long, default_value_t = DEFAULT_THREADS, value_parser = threads())]
    pub threads: u64,
    /// Seed for the random workloads.
    #[arg(long, default_value_t = 0x7064)]
    pub seed: u32,
    /// Print results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Growable heap workload: grow the heap from the host before each round instead of from
    /// inside the kernels. For compute-sanitizer memcheck, which does not see memory mapped
    /// while a kernel runs (docs/growable.md).
    #[arg(long)]
    pub host_growth: bool,
}

/// `host stress`, and `host` alone.
#[derive(Args, Debug, Clone)]
pub struct StressArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub heap: HeapSize,
    #[command(flatten)]
    pub run: RunArgs,
    /// Run only this workload.
    #[arg(long, value_enum)]
    pub workload: Option<workloads::Kind>,
}

/// `host bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    #[command(flatten)]
    pub common: Common,
    /// Threads per kernel, one malloc each; the heaps are sized for them.
    #[arg(long, default_value_t = DEFAULT_THREADS, value_parser = threads())]
    pub threads: u64,
    /// Append the main table's cell medians to FILE, one CSV row each, as `report` reads them
    /// (scenario v_variance); the header goes first when FILE is new or empty. FILE is opened
    /// when the command line is read: one that cannot be opened is a usage error.
    #[arg(long, value_name = "FILE", value_parser = bench::CsvFile::open)]
    pub csv: Option<bench::CsvFile>,
    /// The --csv rows' iteration column: this process's index among those appending to FILE
    /// (scripts/gpu-variance.sh runs 0, 1, 2, ...).
    #[arg(long, value_name = "N", default_value_t = 0, requires = "csv")]
    pub run_index: u64,
}

/// `host info`.
#[derive(Args, Debug, Clone)]
pub struct InfoArgs {
    #[command(flatten)]
    pub common: Common,
    // The heap whose geometry is shown.
    #[command(flatten)]
    pub heap: HeapSize,
}

/// `host scan`.
#[derive(Args, Debug, Clone)]
pub struct ScanArgs {
    #[command(flatten)]
    pub common: Common,
    // A fresh heap of this size per row.
    #[command(flatten)]
    pub heap: HeapSize,
    /// The largest thread count scanned (from 2^8 up, a factor of 4 per row).
    #[arg(long, default_value_t = DEFAULT_THREADS, value_parser = threads())]
    pub threads: u64,
    /// Request sizes to scan, e.g. 16,4KiB,1MiB: 1 B to 4 GiB - 1 B each (default: 16, 256,
    /// 2048, 4096, 65536 and 1 MiB).
    #[arg(long, value_delimiter = ',', value_parser = parse_request_size)]
    pub sizes: Vec<u32>,
    /// Skip the out-of-memory round trip that opens the scan.
    #[arg(long)]
    pub no_exhaust: bool,
}

/// `host grow`.
#[derive(Args, Debug, Clone)]
pub struct GrowArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub run: RunArgs,
    /// Bytes mapped at creation, and the release threshold a trim goes back to, e.g. 8MiB: a
    /// whole number of 2 MiB granules, at least one.
    #[arg(long, value_parser = parse_initial, default_value = "8MiB")]
    pub initial: u64,
    /// Bytes the heap may grow to, e.g. 4GiB: at least one 2 MiB granule, at most toga's
    /// largest heap. Default: the smaller of 4 GiB and half the free device memory.
    #[arg(long, value_parser = parse_max)]
    pub max: Option<u64>,
}

fn threads() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(1..=MAX_THREADS)
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s)
        .map_err(|e| format!("{e} (try 512MiB or 2GiB)"))
}

/// A request size of `scan`: 1 B up to what a `u32` holds.
fn parse_request_size(s: &str) -> Result<u32, String> {
    let bytes = parse_bytes(s)?;
    match u32::try_from(bytes) {
        Ok(0) => Err("a request size must be at least 1 byte".to_owned()),
        Ok(size) => Ok(size),
        Err(_) => Err(format!(
            "{bytes} B is above the largest request size scan makes, {} B (4 GiB - 1 B)",
            u32::MAX
        )),
    }
}

/// `grow --initial`: whole granules, at least one (a growable heap maps nothing smaller, and
/// `grow` checks that a trim goes back to exactly this).
fn parse_initial(s: &str) -> Result<u64, String> {
    let bytes = parse_bytes(s)?;
    let granule = toga::heap::MIN_GRANULE;
    if bytes == 0 || bytes % granule != 0 {
        return Err(format!(
            "{bytes} B is not a positive whole number of granules: a growable heap maps {} MiB at a time; give 2MiB, 8MiB, ...",
            granule >> 20
        ));
    }
    Ok(bytes)
}

/// `grow --max`: at least one granule, and no more than toga's largest heap.
fn parse_max(s: &str) -> Result<u64, String> {
    let bytes = parse_bytes(s)?;
    let granule = toga::heap::MIN_GRANULE;
    if bytes < granule {
        return Err(format!(
            "{bytes} B is below one granule: a growable heap grows {} MiB at a time; give at least 2MiB",
            granule >> 20
        ));
    }
    toga::heap::check_heap_size(bytes).map_err(|e| e.to_string())?;
    Ok(bytes)
}

/// `host help [COMMAND] [--help]` as clap's `host [COMMAND] --help`: clap's own `help`
/// subcommand takes no flags, so `host help --help` was an error.
pub fn help_as_flag(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut args: Vec<OsString> = args.into_iter().collect();
    if args.get(1).is_some_and(|a| a == "help") {
        args.remove(1);
        args.retain(|a| a != "--help" && a != "-h");
        args.push("--help".into());
    }
    args
}

/// A heap size that can work on some GPU: zero, below one chunk and above toga's largest heap
/// are usage errors. Whether it fits this GPU's free memory is known only once it is open.
fn parse_heap_size(s: &str) -> Result<u64, String> {
    let bytes = parse_bytes(s)?;
    toga::heap::check_heap_size(bytes).map_err(|e| e.to_string())?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_words_become_the_help_flag() {
        let args = |v: &[&str]| help_as_flag(v.iter().map(OsString::from));
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(args(&["host", "help"]), os(&["host", "--help"]));
        assert_eq!(args(&["host", "help", "--help"]), os(&["host", "--help"]));
        assert_eq!(
            args(&["host", "help", "grow", "-h"]),
            os(&["host", "grow", "--help"])
        );
        // Anything else is left to clap.
        assert_eq!(
            args(&["host", "grow", "help"]),
            os(&["host", "grow", "help"])
        );
        assert_eq!(args(&["host"]), os(&["host"]));
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn no_subcommand_is_a_stress_run_with_its_flags() {
        let cli = Cli::try_parse_from(["host", "--threads", "4096", "--heap-size", "64MiB"])
            .expect("parses");
        assert!(cli.command.is_none());
        assert_eq!(cli.stress.run.threads, 4096);
        assert_eq!(cli.stress.heap.heap_size, Some(64 << 20));
    }

    #[test]
    fn a_top_level_flag_with_a_subcommand_is_a_usage_error() {
        let e = Cli::try_parse_from(["host", "--device", "1", "info"]).unwrap_err();
        assert_eq!(e.exit_code(), exit::USAGE as i32);
    }

    #[test]
    fn grow_initial_above_max_is_a_usage_error() {
        let cli =
            Cli::try_parse_from(["host", "grow", "--initial", "64MiB", "--max", "8MiB"]).unwrap();
        let e = cli.command.unwrap().validate().unwrap_err();
        assert_eq!(e.exit_code(), exit::USAGE as i32);
        assert!(e.to_string().contains("--initial"), "{e}");
        let cli =
            Cli::try_parse_from(["host", "grow", "--initial", "8MiB", "--max", "8MiB"]).unwrap();
        assert!(cli.command.unwrap().validate().is_ok());
    }
}
