//! `report`: turn the benchmark CSVs (written by `benches/`, and `v_variance` by
//! `scripts/gpu-variance.sh` through `host bench --csv`; kept in `docs/results/`) into the
//! markdown of `docs/benchmarks.md` and its plots. Needs no GPU.
//!
//! Usual run, from the repository root:
//!
//! ```text
//! cargo run -p report -- --out docs/benchmarks.md
//! ```
//!
//! # Inputs
//!
//! In the results directory (the positional argument, `docs/results` by default):
//!
//! - `*.csv`, or `*.csv.gz` compressed with gzip (as `docs/results/` keeps them): one row per
//!   timed kernel, under the header
//!   `scenario,allocator,size,threads,state,metric,iteration,ms,failed,device[,rounds]`
//!   (`rounds`, the operations per thread in the timed kernel, is 1 where the file has no such
//!   column). Rows that cannot be used (a field count other than the header's, a number column
//!   that holds no number, a time that is negative or not finite, ...) are rejected: each one is
//!   named on stderr as `file:line: rejected: why`, followed by a count.
//! - `meta.txt`: GPU, driver, commit, date, one `key: value` per line (optional).
//! - `notes.md`: the hand-written analysis, appended verbatim (optional).
//!
//! # Outputs
//!
//! - The markdown: on stdout, or into the file named by `--out`. Its image links are relative to
//!   the markdown's directory: that of `--out`, or with stdout the parent of the plots directory
//!   (so `report > docs/benchmarks.md` links `results/malloc.png`).
//! - The plots, into `--plots DIR` (the results directory by default) unless `--no-plots`:
//!   `malloc.png` and `free.png` (throughput against allocation size), `scenarios.png` (the
//!   other rates as bars, and the time of one warm launch) and `utilization.png` (utilization
//!   against heap size), each only where its CSVs are there.
//! - Progress (what was read, rejected and written) on stderr.
//!
//! # Exit codes
//!
//! - 0: the report was written. Rejected rows do not change that (stderr lists them and says
//!   the report leaves them out) unless `--strict` is given.
//! - 1: nothing usable or nothing written: the results directory or a CSV cannot be read, a CSV's
//!   header is not the expected one, no CSV or no usable row is there, an output cannot be
//!   written; or, with `--strict`, some row was rejected (then nothing is written). One line on
//!   stderr says why.
//! - 2: bad arguments (clap's usage message).

mod input;
mod markdown;
mod plot;
mod summary;
mod units;
mod variance;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;

/// Turn the benchmark CSVs into docs/benchmarks.md's markdown and its plots.
///
/// Rows that cannot be parsed are listed on stderr as `file:line: rejected: why` and left out
/// of the report. Exit status: 0 when the report was written (even with rejected rows, unless
/// --strict), 1 on an error (nothing or not everything written), 2 on bad arguments.
#[derive(Parser, Debug)]
#[command(
    name = "report",
    version,
    after_help = "Usual run, from the repository root: cargo run -p report -- --out docs/benchmarks.md"
)]
struct Args {
    /// The directory holding the benchmark CSVs, meta.txt and notes.md.
    #[arg(value_name = "RESULTS_DIR", default_value = "docs/results")]
    results: PathBuf,

    /// Write the markdown into FILE instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    out: Option<PathBuf>,

    /// Write the plots (PNG) into DIR [default: RESULTS_DIR].
    #[arg(long, value_name = "DIR", conflicts_with = "no_plots")]
    plots: Option<PathBuf>,

    /// Draw no plots (the markdown still links the plots the data would give).
    #[arg(long)]
    no_plots: bool,

    /// Exit 1, writing nothing, when any CSV row is rejected.
    #[arg(long)]
    strict: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("report: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Read the CSVs, then draw the plots and write the markdown; errors are one line.
fn run(args: &Args) -> Result<(), String> {
    let results = &args.results;
    let data = input::read_dir(results)?;
    for rejection in &data.rejected {
        eprintln!("{rejection}");
    }
    let rejected = data.rejected.len();
    eprintln!(
        "report: read {} from {} in {}; {}",
        plural(data.rows, "row"),
        plural(data.files, "CSV file"),
        results.display(),
        match rejected {
            0 => "none rejected".to_string(),
            n => format!("{n} rejected (above)"),
        }
    );
    if rejected > 0 && args.strict {
        return Err(format!(
            "{} and --strict: nothing written",
            plural(rejected, "rejected row")
        ));
    }
    if rejected > 0 {
        eprintln!(
            "report: the report leaves the rejected rows out (exit status 0; --strict makes them \
             an error)"
        );
    }
    if data.samples.is_empty() {
        return Err(format!(
            "no usable rows in the CSV files in {}",
            results.display()
        ));
    }

    // The markdown's directory must be there before anything is drawn.
    if let Some(out) = &args.out
        && let Some(dir) = out.parent()
        && !dir.as_os_str().is_empty()
        && !dir.is_dir()
    {
        return Err(format!(
            "{}: cannot write: no directory {}",
            out.display(),
            dir.display()
        ));
    }
    let meta = read_optional(&results.join("meta.txt"))?;
    let notes = read_optional(&results.join("notes.md"))?;
    let figures = plot::figures(&data.samples);
    let plots_dir = args.plots.as_deref().unwrap_or(results);
    let mut written = Vec::new();
    if !args.no_plots && !figures.is_empty() {
        std::fs::create_dir_all(plots_dir).map_err(|e| {
            format!(
                "{}: cannot create the plots directory: {e}",
                plots_dir.display()
            )
        })?;
        for figure in &figures {
            let path = plots_dir.join(figure.file);
            figure
                .draw(&path)
                .map_err(|e| format!("{}: cannot draw: {e}", path.display()))?;
            written.push(path);
        }
    }

    let markdown_dir = match &args.out {
        Some(out) => match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        },
        None => plots_dir.join(".."),
    };
    let prefix = link_prefix(&markdown_dir, plots_dir);
    let links: Vec<(String, &str)> = figures
        .iter()
        .map(|f| (format!("{prefix}{}", f.file), f.alt))
        .collect();
    let md = markdown::document(&data.samples, &meta, &notes, &links);
    match &args.out {
        Some(out) => {
            std::fs::write(out, md).map_err(|e| format!("{}: cannot write: {e}", out.display()))?;
            written.insert(0, out.clone());
        }
        None => {
            use std::io::Write as _;
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(md.as_bytes())
                .and_then(|()| stdout.flush())
                .map_err(|e| format!("stdout: cannot write: {e}"))?;
        }
    }
    if !written.is_empty() {
        let names: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
        eprintln!("report: wrote {}", names.join(", "));
    }
    Ok(())
}

/// `1 row`, `2 rows`.
fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// A file's text, or empty when there is no such file; another error is one.
fn read_optional(path: &Path) -> Result<String, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(format!("{}: cannot read: {e}", path.display())),
    }
}

/// What to put before a plot's file name in a link from a markdown file in `from` to a plot in
/// `to`: the relative path with `/` separators and a trailing `/` (empty when they are the same
/// directory). Where either directory cannot be resolved (it does not exist yet), `to` as given.
fn link_prefix(from: &Path, to: &Path) -> String {
    let with_slash = |p: &Path| {
        let s = p.to_string_lossy().replace('\\', "/");
        if s.is_empty() || s.ends_with('/') {
            s
        } else {
            format!("{s}/")
        }
    };
    let (Ok(from), Ok(to)) = (from.canonicalize(), to.canonicalize()) else {
        return with_slash(to);
    };
    let (from, to): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut relative = PathBuf::new();
    for _ in common..from.len() {
        relative.push("..");
    }
    for part in &to[common..] {
        relative.push(part);
    }
    with_slash(&relative)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn arguments_are_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn link_prefix_is_relative() {
        let dir = tempfile::tempdir().unwrap();
        let docs = dir.path().join("docs");
        let results = docs.join("results");
        std::fs::create_dir_all(&results).unwrap();
        assert_eq!(link_prefix(&docs, &results), "results/");
        assert_eq!(link_prefix(&results, &results), "");
        assert_eq!(link_prefix(&results, &docs), "../");
        let other = dir.path().join("other");
        std::fs::create_dir_all(&other).unwrap();
        assert_eq!(link_prefix(&other, &results), "../docs/results/");
        // Not there (yet): the path as given.
        assert_eq!(
            link_prefix(&docs, Path::new("nowhere/plots")),
            "nowhere/plots/"
        );
    }
}
