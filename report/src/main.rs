//! `cargo run -p report`: turn the benchmark CSVs (written by `benches/`, kept in `docs/results/`) into
//! `docs/benchmarks.md`'s tables and its plots. Needs no GPU.
//!
//! Inputs in the results directory: `<scenario>.csv` (rows `scenario,allocator,size,threads,state,
//! metric,iteration,ms,failed,device[,rounds]`; `rounds`, the operations per thread in the timed
//! kernel, is 1 where absent), `meta.txt` (GPU, driver, commit, date: one `key: value` per line)
//! and `notes.md` (the hand-written analysis, copied in verbatim).
//!
//! Outputs: the markdown file, `throughput.png` (malloc and free throughput against size),
//! `scenarios.png` (the mixed, malloc-then-free and churn rates, and the time of one warm launch)
//! and, when `u_utilization.csv` is there, `utilization.png` (utilization against heap size)
//! beside the CSVs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;

/// One CSV row.
struct Sample {
    scenario: String,
    allocator: String,
    size: String,
    threads: u64,
    rounds: u64,
    state: String,
    metric: String,
    ms: f64,
    failed: u64,
}

/// Columns every row has (the `rounds` column after them is optional).
const REQUIRED_COLUMNS: usize = 10;
/// The `rounds` column's index.
const ROUNDS_COLUMN: usize = 10;

/// allocator, size, threads, rounds, state, metric
type Key = (String, String, u64, u64, String, String);

/// A cell's median time (ms), its sample count and the most failures of any sample.
#[derive(Clone, Copy)]
struct Cell {
    ms: f64,
    n: usize,
    failed: u64,
}

impl Cell {
    /// Operations per second, in millions: `threads × rounds` operations in `ms`.
    fn mops(&self, threads: u64, rounds: u64) -> f64 {
        (threads * rounds) as f64 / self.ms / 1e3
    }
}

fn read(dir: &Path) -> std::io::Result<BTreeMap<String, Vec<Sample>>> {
    let mut by_scenario: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .collect();
    files.sort();
    for path in files {
        for line in std::fs::read_to_string(&path)?.lines().skip(1) {
            let f: Vec<&str> = line.split(',').collect();
            if f.len() < REQUIRED_COLUMNS {
                continue;
            }
            let s = Sample {
                scenario: f[0].into(),
                allocator: f[1].into(),
                size: f[2].into(),
                threads: f[3].parse().unwrap_or(0),
                state: f[4].into(),
                metric: f[5].into(),
                ms: f[7].parse().unwrap_or(f64::NAN),
                failed: f[8].parse().unwrap_or(0),
                rounds: f
                    .get(ROUNDS_COLUMN)
                    .and_then(|r| r.parse().ok())
                    .unwrap_or(1),
            };
            by_scenario.entry(s.scenario.clone()).or_default().push(s);
        }
    }
    Ok(by_scenario)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn size_key(s: &str) -> u64 {
    s.split('-')
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or(u64::MAX)
}

/// The bytes of a heap label such as `8MiB` or `1GiB` (the `state` column of `u_utilization`);
/// `None` for other states (`fresh`, `warm`).
fn heap_bytes(label: &str) -> Option<u64> {
    let (number, shift) = [("KiB", 10), ("MiB", 20), ("GiB", 30), ("TiB", 40)]
        .into_iter()
        .find_map(|(unit, shift)| label.strip_suffix(unit).map(|n| (n, shift)))?;
    number.trim().parse::<u64>().ok().map(|n| n << shift)
}

/// A byte count as a heap label: `8 MiB`, `1 GiB` (whole units only, else bytes).
fn bytes_label(bytes: u64) -> String {
    [("GiB", 30), ("MiB", 20), ("KiB", 10)]
        .into_iter()
        .find(|&(_, shift)| bytes >= 1 << shift && bytes.is_multiple_of(1 << shift))
        .map(|(unit, shift)| format!("{} {unit}", bytes >> shift))
        .unwrap_or_else(|| format!("{bytes} B"))
}

/// Medians per (allocator, size, threads, rounds, state, metric), with sample counts and failures.
fn summarize(samples: &[Sample]) -> BTreeMap<Key, Cell> {
    let mut groups: BTreeMap<Key, Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        groups
            .entry((
                s.allocator.clone(),
                s.size.clone(),
                s.threads,
                s.rounds,
                s.state.clone(),
                s.metric.clone(),
            ))
            .or_default()
            .push(s);
    }
    groups
        .into_iter()
        .map(|(k, v)| {
            let cell = Cell {
                ms: median(v.iter().map(|s| s.ms).collect()),
                n: v.len(),
                failed: v.iter().map(|s| s.failed).max().unwrap_or(0),
            };
            (k, cell)
        })
        .collect()
}

/// What a scenario measures, printed under its heading (the thread counts, sizes and rounds are in
/// its table).
fn describe(scenario: &str) -> Option<&'static str> {
    Some(match scenario {
        "a_malloc_only" => {
            "malloc only: every thread calls `malloc` once, on a fresh heap (just initialized) and \
             on a warm one (after a malloc/free round of the same size)."
        }
        "b_free" => {
            "free only: every thread frees the one block it got from a `malloc` kernel (not timed)."
        }
        "b_malloc_free" => {
            "malloc then free in one kernel: every thread `malloc`s, writes a byte, `free`s."
        }
        "c_mixed" => {
            "mixed sizes: every thread `malloc`s a size drawn uniformly from the range (one seeded \
             list), fresh heap; then the kernel that frees those blocks, timed as its own row."
        }
        "d_scaling" => "thread scaling: one `malloc` per thread, fresh heap.",
        "e_fill" => {
            "fill: a quarter more requests than the pool can serve; throughput until it is exhausted."
        }
        "e_fill_utilization" => {
            "fill: bytes handed out ÷ pool bytes (the median column holds the utilization)."
        }
        "u_utilization" => {
            "utilization: on a fresh heap of the size in the heap column, rounds of one kernel of \
             `threads` requests totalling about twice the heap (so many return null), then every \
             block checked and freed, with no trim in between. Utilization is live block bytes \
             (as the allocator rounds them) ÷ the heap's data bytes after each fill; the median \
             column holds its median over the `n` rounds, `failed` the most nulls of a round."
        }
        "f_churn" => {
            "churn: every thread does `rounds` × (`malloc` a size drawn from the range, write and \
             read back its first and last words, `free`) in one kernel, on a warm heap (one round \
             served and freed before the timed kernel). The rate is malloc/free pairs per second: \
             threads × rounds ÷ kernel time. The bump ceiling never frees."
        }
        "g_warm_launch" => {
            "warm launch: the time of one small launch. `warm` rows run on a heap that has served \
             and freed this size in the launches before (no reset in between): each iteration is \
             one `malloc` launch, then one `free` launch, each a row; `fresh` is the first launch on \
             a just-initialized heap."
        }
        _ => return None,
    })
}

/// The rate column's heading: what one operation of the scenario's metrics is.
fn rate_heading(metrics: &[&str]) -> &'static str {
    let unit = |m: &str| match m {
        "malloc" => "allocs",
        "free" => "frees",
        "malloc_free" | "malloc_write_free" => "pairs",
        _ => "ops",
    };
    match metrics.first() {
        Some(first) if metrics.iter().all(|m| unit(m) == unit(first)) => match unit(first) {
            "allocs" => "M allocs/s",
            "frees" => "M frees/s",
            "pairs" => "M pairs/s",
            _ => "M ops/s",
        },
        _ => "M ops/s",
    }
}

/// Rows of a size and state list malloc first, then free, then the rest by name.
fn metric_rank(metric: &str) -> u8 {
    match metric {
        "malloc" => 0,
        "free" => 1,
        _ => 2,
    }
}

/// Times below this many milliseconds are printed with 4 significant digits instead of 4
/// decimals (a small launch takes a few microseconds).
const SMALL_MS: f64 = 0.1;

fn format_ms(ms: f64) -> String {
    if ms > 0.0 && ms < SMALL_MS {
        let decimals = (3 - ms.log10().floor() as i32).max(4) as usize;
        format!("{ms:.decimals$}")
    } else {
        format!("{ms:.4}")
    }
}

fn main() -> std::process::ExitCode {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut args = std::env::args_os().skip(1);
    let results = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("docs/results"));
    let doc = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("docs/benchmarks.md"));
    match run(&results, &doc) {
        Ok(written) => {
            let names: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
            println!("wrote {}", names.join(", "));
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("report: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The plots' file names, in the results directory.
const THROUGHPUT_PNG: &str = "throughput.png";
const SCENARIOS_PNG: &str = "scenarios.png";
const UTILIZATION_PNG: &str = "utilization.png";

/// The scenario of the utilization plot.
const UTILIZATION: &str = "u_utilization";

/// Write `docs/benchmarks.md` and the plots; returns the files written.
fn run(results: &Path, doc: &Path) -> Result<Vec<PathBuf>, String> {
    let data = read(results).map_err(|e| format!("{}: {e}", results.display()))?;
    if data.is_empty() {
        return Err(format!("no CSV files in {}", results.display()));
    }
    let meta = std::fs::read_to_string(results.join("meta.txt")).unwrap_or_default();
    let notes = std::fs::read_to_string(results.join("notes.md")).unwrap_or_default();
    let mut md = String::new();
    let _ = writeln!(md, "# Benchmarks\n");
    let _ = writeln!(
        md,
        "Generated by `cargo run -p report` from the CSVs in `docs/results/` (raw samples, one \
         row per timed kernel). Kernel time by CUDA events; each cell is the median of its samples \
         (`n`); rates are threads × rounds ÷ median time. Reproduce: `scripts/bundle`, then on the \
         GPU machine `bash scripts/gpu-bench.sh` (or `TOGA_BENCH_CSV_DIR=results ./run.sh bench` \
         in the bundle), copy the CSVs to `docs/results/`, run the report.\n"
    );
    for line in meta.lines() {
        let _ = writeln!(md, "- {line}");
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "![throughput against size](results/{THROUGHPUT_PNG})\n");
    let _ = writeln!(
        md,
        "![mixed, malloc-then-free, churn and warm-launch scenarios](results/{SCENARIOS_PNG})\n"
    );
    let utilization_png = results.join(UTILIZATION_PNG);
    let drew_utilization = utilization_plot(&data, &utilization_png)?;
    if drew_utilization {
        let _ = writeln!(
            md,
            "![utilization against heap size, median over rounds](results/{UTILIZATION_PNG})\n"
        );
    }
    for (scenario, samples) in &data {
        table(&mut md, scenario, &summarize(samples));
    }
    md.push_str(&notes);
    std::fs::write(doc, md).map_err(|e| format!("{}: {e}", doc.display()))?;
    throughput_plot(&data, &results.join(THROUGHPUT_PNG))?;
    scenarios_plot(&data, &results.join(SCENARIOS_PNG))?;
    let mut written = vec![
        doc.to_path_buf(),
        results.join(THROUGHPUT_PNG),
        results.join(SCENARIOS_PNG),
    ];
    if drew_utilization {
        written.push(utilization_png);
    }
    Ok(written)
}

/// One scenario's section: heading, description, table of medians.
fn table(md: &mut String, scenario: &str, summary: &BTreeMap<Key, Cell>) {
    let _ = writeln!(md, "## {scenario}\n");
    if let Some(text) = describe(scenario) {
        let _ = writeln!(md, "{text}\n");
    }
    let mut metrics: Vec<&str> = summary.keys().map(|k| k.5.as_str()).collect();
    metrics.sort_unstable();
    metrics.dedup();
    let rate = rate_heading(&metrics);
    // A rounds column only where some kernel does more than one operation per thread.
    let with_rounds = summary.keys().any(|k| k.3 != 1);
    let rounds_heading = if with_rounds { " rounds |" } else { "" };
    let rounds_rule = if with_rounds { " --- |" } else { "" };
    let _ = writeln!(
        md,
        "| allocator | size (B) | threads |{rounds_heading} heap | metric | median ms | n | {rate} | failed |"
    );
    let _ = writeln!(
        md,
        "| --- | --- | --- |{rounds_rule} --- | --- | --- | --- | --- | --- |"
    );
    let mut rows: Vec<_> = summary.iter().collect();
    rows.sort_by_key(|((a, size, threads, rounds, state, metric), _)| {
        (
            size_key(size),
            size.clone(),
            heap_bytes(state).unwrap_or(0),
            *threads,
            *rounds,
            state.clone(),
            metric_rank(metric),
            metric.clone(),
            a.clone(),
        )
    });
    for ((alloc, size, threads, rounds, state, metric), cell) in rows {
        let (value, rate) = if metric == "utilization" {
            (format!("{:.1} %", cell.ms * 100.0), String::new())
        } else {
            (
                format_ms(cell.ms),
                format!("{:.0}", cell.mops(*threads, *rounds)),
            )
        };
        let rounds = if with_rounds {
            format!(" {rounds} |")
        } else {
            String::new()
        };
        let _ = writeln!(
            md,
            "| {alloc} | {size} | {threads} |{rounds} {state} | {metric} | {value} | {} | {rate} | {} |",
            cell.n, cell.failed
        );
    }
    let _ = writeln!(md);
}

/// The colour of an allocator in every plot.
fn color(alloc: &str) -> RGBColor {
    match alloc {
        "toga" => RGBColor(31, 119, 180),
        "cuda-malloc" => RGBColor(214, 39, 40),
        "bump" => RGBColor(127, 127, 127),
        _ => RGBColor(44, 160, 44),
    }
}

/// Pixels of a dash, of the gap after it, and of a legend's line.
const DASH: u32 = 8;
const DASH_GAP: u32 = 6;
const LEGEND_LINE: i32 = 20;

/// A plotting error as a string.
fn plot_err(e: impl std::error::Error) -> String {
    e.to_string()
}

/// One line of the throughput plot: (size, operations per second) points, and whether it is
/// dashed.
type Line = (Vec<(f64, f64)>, bool);

/// Throughput (operations per second) against size, log-log, from 2^20-thread kernels on a fresh
/// heap: one solid line per allocator for malloc (scenario a_malloc_only), one dashed line per
/// allocator for free (b_free).
fn throughput_plot(data: &BTreeMap<String, Vec<Sample>>, path: &Path) -> Result<(), String> {
    // (scenario, metric, dashed)
    let sources = [("a_malloc_only", "malloc", false), ("b_free", "free", true)];
    let mut series: BTreeMap<(String, &str), Line> = BTreeMap::new();
    for (scenario, metric, dashed) in sources {
        let Some(samples) = data.get(scenario) else {
            continue;
        };
        for ((alloc, size, threads, rounds, state, m), cell) in summarize(samples) {
            if state == "fresh" && m == metric && cell.ms > 0.0 {
                series
                    .entry((alloc, metric))
                    .or_insert_with(|| (Vec::new(), dashed))
                    .0
                    .push((size_key(&size) as f64, cell.mops(threads, rounds) * 1e6));
            }
        }
    }
    if series.is_empty() {
        return Ok(());
    }
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "malloc (solid) and free (dashed) throughput, 2^20 threads, fresh heap",
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((8f64..8192f64).log_scale(), (1e5f64..1e12f64).log_scale())
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("allocation size (bytes)")
        .y_desc("operations per second")
        .x_label_formatter(&|v| format!("{v}"))
        .y_label_formatter(&|v| format!("{v:.0e}"))
        .draw()
        .map_err(plot_err)?;
    for ((alloc, metric), (mut points, dashed)) in series {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let style = color(&alloc).stroke_width(2);
        let label = format!("{alloc} {metric}");
        if dashed {
            chart
                .draw_series(DashedLineSeries::new(points.clone(), DASH, DASH_GAP, style))
                .map_err(plot_err)?
                .label(label)
                .legend(move |(x, y)| {
                    DashedPathElement::new(
                        vec![(x, y), (x + LEGEND_LINE, y)],
                        DASH,
                        DASH_GAP,
                        style,
                    )
                });
        } else {
            chart
                .draw_series(LineSeries::new(points.clone(), style))
                .map_err(plot_err)?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + LEGEND_LINE, y)], style));
        }
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 4, color(&alloc).filled())),
            )
            .map_err(plot_err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}

/// One bar of a bar panel.
struct Bar {
    label: String,
    allocator: String,
    value: f64,
}

/// The bars of one scenario: one per cell that `keep` accepts, labelled `name` and the cell's
/// size, state and metric, valued by `value(threads, rounds, cell)`.
fn bars(
    data: &BTreeMap<String, Vec<Sample>>,
    scenario: &str,
    name: &str,
    keep: impl Fn(&Key) -> bool,
    value: impl Fn(u64, u64, &Cell) -> f64,
) -> Vec<Bar> {
    let Some(samples) = data.get(scenario) else {
        return Vec::new();
    };
    let mut cells: Vec<_> = summarize(samples)
        .into_iter()
        .filter(|(k, c)| keep(k) && c.ms > 0.0)
        .collect();
    cells.sort_by_key(|((a, size, _, _, state, metric), _)| {
        (
            size_key(size),
            state.clone(),
            metric_rank(metric),
            metric.clone(),
            a.clone(),
        )
    });
    cells
        .into_iter()
        .map(
            |((alloc, size, threads, rounds, state, metric), cell)| Bar {
                label: format!("{name} {size} B, {state} {metric}"),
                value: value(threads, rounds, &cell),
                allocator: alloc,
            },
        )
        .collect()
}

/// The scenarios that are not one line against size: the rates (M operations per second) of
/// mixed sizes, malloc-then-free at 16 B and 1 KB, and churn; and the time of one warm launch.
fn scenarios_plot(data: &BTreeMap<String, Vec<Sample>>, path: &Path) -> Result<(), String> {
    let rate = |threads, rounds, c: &Cell| c.mops(threads, rounds);
    let mut rates = bars(data, "c_mixed", "mixed", |_| true, rate);
    rates.extend(bars(
        data,
        "b_malloc_free",
        "malloc+free",
        |k| matches!(size_key(&k.1), 16 | 1024),
        rate,
    ));
    rates.extend(bars(data, "f_churn", "churn", |_| true, rate));
    let micros = |_, _, c: &Cell| c.ms * 1e3;
    let launch = bars(data, "g_warm_launch", "1024 thr", |_| true, micros);
    if rates.is_empty() && launch.is_empty() {
        return Ok(());
    }
    let height = |bars: &[Bar]| match bars.len() {
        0 => 0,
        rows => PANEL_CHROME + BAR_ROW * rows as u32,
    };
    let top_height = height(&rates);
    let root =
        BitMapBackend::new(path, (BAR_WIDTH, top_height + height(&launch))).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let (top, bottom) = root.split_vertically(top_height);
    bar_panel(
        &top,
        "throughput: mixed sizes, malloc+free in one kernel, churn (pairs)",
        "million operations per second",
        &rates,
    )?;
    bar_panel(
        &bottom,
        "one launch on a warm heap (fresh: first launch)",
        "kernel time (µs)",
        &launch,
    )?;
    root.present().map_err(plot_err)?;
    Ok(())
}

/// Pixels: the width of the bar plot, the height of a bar's row, and what a panel needs besides
/// its rows (title, axis, margins).
const BAR_WIDTH: u32 = 1000;
const BAR_ROW: u32 = 34;
const PANEL_CHROME: u32 = 110;
/// Pixels of a bar panel's labels (fixed: by default they scale with the panel's height).
const BAR_FONT: u32 = 12;

/// Pixels right of a bar panel, for the last label of its axis.
const BAR_MARGIN_RIGHT: u32 = 40;

/// Horizontal bars on a log axis, one row per bar (first at the top), coloured by allocator.
fn bar_panel(
    area: &DrawingArea<BitMapBackend, Shift>,
    title: &str,
    x_desc: &str,
    bars: &[Bar],
) -> Result<(), String> {
    if bars.is_empty() {
        return Ok(());
    }
    let (lo, hi) = bars.iter().fold((f64::MAX, f64::MIN), |(lo, hi), b| {
        (lo.min(b.value), hi.max(b.value))
    });
    let (lo, hi) = (
        10f64.powf(lo.log10().floor()),
        10f64.powf(hi.log10().ceil().max(lo.log10().floor() + 1.0)),
    );
    let n = bars.len();
    // Segments of the y axis: one per bar, and at least two (a segmented range of one value does
    // not lay out). Bar `k` is the segment from height `m - 1 - k` to the next, so the first bar
    // is at the top; the inner range `0..=m - 1` has `m` segments, the last one ending at `Last`.
    let m = n.max(2) as i32;
    let row = |k: usize| m - 1 - k as i32;
    let top_of = |r: i32| {
        if r + 1 == m {
            SegmentValue::Last
        } else {
            SegmentValue::Exact(r + 1)
        }
    };
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .margin_right(BAR_MARGIN_RIGHT)
        .x_label_area_size(36)
        .y_label_area_size(300)
        .build_cartesian_2d((lo..hi).log_scale(), (0..m - 1).into_segmented())
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .label_style(("sans-serif", BAR_FONT))
        .axis_desc_style(("sans-serif", BAR_FONT))
        .x_desc(x_desc)
        .x_label_formatter(&|v| format!("{v}"))
        .y_labels(m as usize)
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(r) => bars
                .get((m - 1 - r) as usize)
                .map(|b| format!("{} · {}", b.label, b.allocator))
                .unwrap_or_default(),
            _ => String::new(),
        })
        .draw()
        .map_err(plot_err)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(k, b)| {
            let mut bar = Rectangle::new(
                [(lo, SegmentValue::Exact(row(k))), (b.value, top_of(row(k)))],
                color(&b.allocator).filled(),
            );
            bar.set_margin(4, 4, 0, 0);
            bar
        }))
        .map_err(plot_err)?;
    Ok(())
}

/// Colours of the utilization plot's lines, one per size distribution in turn.
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// One line of the utilization plot: its label, (log2 heap bytes, percent) points, and whether
/// it is dashed (mixed sizes).
type UtilLine = (String, Vec<(f64, f64)>, bool);

/// The utilization plot's lines from `u_utilization`: one per allocator and size distribution
/// (single sizes by size, then the mixed ones), points at the median utilization over rounds.
fn utilization_lines(data: &BTreeMap<String, Vec<Sample>>) -> Vec<UtilLine> {
    let Some(samples) = data.get(UTILIZATION) else {
        return Vec::new();
    };
    let mut series: BTreeMap<(u64, String, String), Vec<(f64, f64)>> = BTreeMap::new();
    for ((alloc, size, _, _, state, metric), cell) in summarize(samples) {
        let Some(bytes) = heap_bytes(&state) else {
            continue;
        };
        if metric != "utilization" || !cell.ms.is_finite() || bytes == 0 {
            continue;
        }
        series
            .entry((size_key(&size), size, alloc))
            .or_default()
            .push(((bytes as f64).log2(), cell.ms * 100.0));
    }
    series
        .into_iter()
        .map(|((key, size, alloc), mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mixed = key == u64::MAX;
            let size = format!("{size} B");
            let label = if alloc == "toga" {
                size
            } else {
                format!("{size} ({alloc})")
            };
            (label, points, mixed)
        })
        .collect()
}

/// Utilization (percent of the heap's data bytes in live blocks when `malloc` returns null)
/// against heap size on a log2 axis, the median over rounds: one line per size distribution,
/// solid for single sizes, dashed for mixed ones. Returns whether it drew (only with data).
fn utilization_plot(data: &BTreeMap<String, Vec<Sample>>, path: &Path) -> Result<bool, String> {
    let lines = utilization_lines(data);
    let (lo, hi) = lines
        .iter()
        .flat_map(|l| l.1.iter())
        .fold((f64::MAX, f64::MIN), |(lo, hi), p| {
            (lo.min(p.0), hi.max(p.0))
        });
    if lines.is_empty() || lo > hi {
        return Ok(false);
    }
    // One power of two of margin on each side; a label at every power of two.
    let (lo, hi) = (lo.floor() - 1.0, hi.ceil() + 1.0);
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "utilization when malloc returns null, median over rounds",
            ("sans-serif", 22),
        )
        .margin(12)
        .margin_right(24)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(lo..hi, 0f64..105f64)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("heap size (data bytes)")
        .y_desc("utilization (%)")
        .x_labels((hi - lo) as usize + 1)
        .x_label_formatter(&|v| {
            if (v - v.round()).abs() < 1e-6 && (0.0..64.0).contains(v) {
                bytes_label(1u64 << v.round() as u32)
            } else {
                String::new()
            }
        })
        .y_labels(12)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(plot_err)?;
    for (i, (label, points, dashed)) in lines.into_iter().enumerate() {
        let c = PALETTE[i % PALETTE.len()];
        let style = c.stroke_width(2);
        if dashed {
            chart
                .draw_series(DashedLineSeries::new(points.clone(), DASH, DASH_GAP, style))
                .map_err(plot_err)?
                .label(label)
                .legend(move |(x, y)| {
                    DashedPathElement::new(
                        vec![(x, y), (x + LEGEND_LINE, y)],
                        DASH,
                        DASH_GAP,
                        style,
                    )
                });
        } else {
            chart
                .draw_series(LineSeries::new(points.clone(), style))
                .map_err(plot_err)?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + LEGEND_LINE, y)], style));
        }
        chart
            .draw_series(points.into_iter().map(|p| Circle::new(p, 4, c.filled())))
            .map_err(plot_err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(true)
}
