//! The plots: which ones the data gives ([`figures`]) and drawing them ([`Figure::draw`]).
//!
//! - `malloc.png`, `free.png`: throughput against allocation size, one line per allocator, from
//!   the fresh-heap rows of `a_malloc_only` and `b_free`.
//! - `scenarios.png`: bars for the rates that are not one line against size (mixed sizes,
//!   malloc+free at 16 B and 1 KiB, churn), and for the time of one warm launch.
//! - `utilization.png`: utilization against heap size from `u_utilization`, one line per size
//!   distribution.
//!
//! Axes are in readable units (`120 M/s`, `4 KiB`, `50 %`, `5 µs`); the line plots' legends sit
//! in a column right of the plot area, so they cover no data.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::input::Sample;
use crate::markdown::metric_rank;
use crate::summary::{Cell, Key, heap_bytes, size_key, summarize};
use crate::units;

/// One plot: its file name (in the plots directory), the alt text of its markdown link, and
/// what to draw.
pub struct Figure {
    pub file: &'static str,
    pub alt: &'static str,
    kind: Kind,
}

enum Kind {
    Lines(LineChart),
    Bars(Vec<BarPanel>),
}

impl Figure {
    /// Draw the figure into the PNG `path`.
    pub fn draw(&self, path: &Path) -> Result<(), String> {
        match &self.kind {
            Kind::Lines(chart) => draw_lines(chart, path),
            Kind::Bars(panels) => draw_bars(panels, path),
        }
        .map_err(|e| e.to_string())
    }
}

/// The plots the data gives, in the order the markdown shows them: `malloc.png`, `free.png`,
/// `scenarios.png`, `utilization.png` (each only where there is something to draw).
pub fn figures(data: &BTreeMap<String, Vec<Sample>>) -> Vec<Figure> {
    let mut figures = Vec::new();
    if let Some(chart) = throughput_chart(data, "a_malloc_only", "malloc", "allocations") {
        figures.push(Figure {
            file: "malloc.png",
            alt: "malloc throughput against allocation size",
            kind: Kind::Lines(chart),
        });
    }
    if let Some(chart) = throughput_chart(data, "b_free", "free", "frees") {
        figures.push(Figure {
            file: "free.png",
            alt: "free throughput against allocation size",
            kind: Kind::Lines(chart),
        });
    }
    let panels = scenario_panels(data);
    if !panels.is_empty() {
        figures.push(Figure {
            file: "scenarios.png",
            alt: "mixed, malloc-then-free, churn and warm-launch scenarios",
            kind: Kind::Bars(panels),
        });
    }
    if let Some(chart) = utilization_chart(data) {
        figures.push(Figure {
            file: "utilization.png",
            alt: "utilization against heap size, median over rounds",
            kind: Kind::Lines(chart),
        });
    }
    figures
}

/// The result of a drawing step.
type Drawn = Result<(), Box<dyn std::error::Error>>;

/// An axis's scale and the unit of its labels. Values are given in the unit; the plot is drawn
/// in a transformed coordinate (log2 bytes, log10 rate, ...) with ticks placed by hand.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Axis {
    /// Bytes on a log2 scale, a tick at each power of two.
    Bytes,
    /// A rate per second on a log10 scale, a tick at each power of ten.
    Rate,
    /// Microseconds on a log10 scale, a tick at each power of ten.
    Micros,
    /// Percent, linear, up to a little above 100 (from 0, or from the tens below the data).
    Percent,
}

impl Axis {
    /// The plot coordinate of a value.
    fn to_plot(self, v: f64) -> f64 {
        match self {
            Axis::Bytes => v.log2(),
            Axis::Rate | Axis::Micros => v.log10(),
            Axis::Percent => v,
        }
    }

    /// The plot range that holds plot coordinates `lo..=hi` with some room around them.
    fn range(self, lo: f64, hi: f64) -> (f64, f64) {
        match self {
            Axis::Bytes => (lo.floor() - 0.5, hi.ceil() + 0.5),
            Axis::Rate | Axis::Micros => {
                let (lo, hi) = ((lo - 0.05).floor(), (hi + 0.05).ceil());
                (lo, hi.max(lo + 1.0))
            }
            // From the ten below the lowest point less 5 (so lines near 100 % stay apart), to
            // a little above 100.
            Axis::Percent => (
                (((lo - 5.0) / 10.0).floor() * 10.0).max(0.0),
                hi.max(100.0) + 5.0,
            ),
        }
    }

    /// Where the labelled ticks go (and the bold grid lines), within `lo..=hi`.
    fn ticks(self, lo: f64, hi: f64) -> Vec<f64> {
        let (first, last) = (lo.ceil() as i64, hi.floor() as i64);
        match self {
            Axis::Bytes | Axis::Rate | Axis::Micros => {
                // At most about a dozen labels.
                let step = ((last - first) / 12 + 1) as usize;
                (first..=last).step_by(step).map(|v| v as f64).collect()
            }
            Axis::Percent => ((lo / 10.0).ceil() as i64..=(hi / 10.0).floor() as i64)
                .map(|v| v as f64 * 10.0)
                .collect(),
        }
    }

    /// Where the light grid lines go: 2 to 9 times each power of ten on the log10 scales, the
    /// fives between the tens of percent.
    fn minor_ticks(self, lo: f64, hi: f64) -> Vec<f64> {
        match self {
            Axis::Bytes => Vec::new(),
            Axis::Rate | Axis::Micros => (lo.floor() as i64..=hi.ceil() as i64)
                .flat_map(|decade| (2..10).map(move |k| decade as f64 + f64::from(k).log10()))
                .filter(|v| (lo..=hi).contains(v))
                .collect(),
            Axis::Percent => ((lo / 10.0).floor() as i64..=(hi / 10.0).floor() as i64)
                .map(|v| v as f64 * 10.0 + 5.0)
                .filter(|v| (lo..=hi).contains(v))
                .collect(),
        }
    }

    /// The label of the tick at plot coordinate `v`.
    fn label(self, v: f64) -> String {
        match self {
            Axis::Bytes => units::bytes(2f64.powf(v).round() as u64),
            Axis::Rate => units::rate(10f64.powf(v)),
            Axis::Micros => units::micros(10f64.powf(v)),
            Axis::Percent => format!("{v:.0} %"),
        }
    }
}

/// A linear `f64` coordinate whose grid lines and labels go where it is told: `bold` (labelled)
/// and `light` (grid only). Plotters' own `with_key_points` wrapper cannot take a label
/// formatter for `f64`, this one can.
struct Ticked {
    lo: f64,
    hi: f64,
    bold: Vec<f64>,
    light: Vec<f64>,
}

impl Ticked {
    /// The coordinate `lo..hi` of `axis`, with its ticks.
    fn new(axis: Axis, lo: f64, hi: f64) -> Ticked {
        Ticked {
            lo,
            hi,
            bold: axis.ticks(lo, hi),
            light: axis.minor_ticks(lo, hi),
        }
    }
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        if self.hi == self.lo {
            return (limit.0 + limit.1) / 2;
        }
        let fraction = (value - self.lo) / (self.hi - self.lo);
        limit.0 + (f64::from(limit.1 - limit.0) * fraction + 1e-3).floor() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.light.clone()
        } else {
            self.bold.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

/// One line of a line chart, its points in the axes' units.
struct Series {
    label: String,
    color: RGBColor,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

/// A line chart with its legend in a column on the right.
struct LineChart {
    title: String,
    x: Axis,
    y: Axis,
    x_desc: &'static str,
    y_desc: &'static str,
    legend_title: &'static str,
    series: Vec<Series>,
    /// Points only, each series shifted a little sideways: for series measured at a few x
    /// values, which lines would join through values never measured, and which may lie on one
    /// another (the utilization plot's 64 KiB and 1 MiB, both at 100 %).
    dodged: bool,
}

/// How far apart, in plot units of x, the points of neighbouring series go in a dodged chart
/// (on the byte axis, a quarter of a doubling).
const DODGE: f64 = 0.25;

/// The colour of an allocator in every plot.
fn color(alloc: &str) -> RGBColor {
    match alloc {
        "toga" => RGBColor(31, 119, 180),
        "cuda-malloc" => RGBColor(214, 39, 40),
        "bump" => RGBColor(127, 127, 127),
        _ => RGBColor(44, 160, 44),
    }
}

/// Allocators in legend order: toga first, then the others by name.
fn allocator_rank(alloc: &str) -> (bool, &str) {
    (alloc != "toga", alloc)
}

/// "2^20 threads", "1000 threads" or "1024–4096 threads": the thread counts of a plot's points.
fn threads_text(threads: &BTreeSet<u64>) -> String {
    match (threads.first(), threads.last()) {
        (Some(&lo), Some(&hi)) if lo == hi => {
            if lo >= 1024 && lo.is_power_of_two() {
                format!("2^{} threads", lo.trailing_zeros())
            } else {
                format!("{lo} threads")
            }
        }
        (Some(lo), Some(hi)) => format!("{lo}–{hi} threads"),
        _ => String::new(),
    }
}

/// Throughput against size from `scenario`'s fresh-heap `metric` rows of single sizes: one line
/// per allocator. `None` when there are no such rows.
fn throughput_chart(
    data: &BTreeMap<String, Vec<Sample>>,
    scenario: &str,
    metric: &str,
    operations: &str,
) -> Option<LineChart> {
    let samples = data.get(scenario)?;
    let mut lines: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut threads_seen = BTreeSet::new();
    for ((alloc, size, threads, rounds, state, m), cell) in summarize(samples) {
        let Ok(bytes) = size.parse::<u64>() else {
            continue;
        };
        if state == "fresh" && m == metric && cell.ms > 0.0 && bytes > 0 {
            threads_seen.insert(threads);
            lines
                .entry(alloc)
                .or_default()
                .push((bytes as f64, cell.per_second(threads, rounds)));
        }
    }
    if lines.is_empty() {
        return None;
    }
    let mut series: Vec<Series> = lines
        .into_iter()
        .map(|(alloc, mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series {
                color: color(&alloc),
                label: alloc,
                dashed: false,
                points,
            }
        })
        .collect();
    series.sort_by(|a, b| allocator_rank(&a.label).cmp(&allocator_rank(&b.label)));
    Some(LineChart {
        title: format!(
            "{metric} throughput, fresh heap, {} (median kernel time)",
            threads_text(&threads_seen)
        ),
        x: Axis::Bytes,
        y: Axis::Rate,
        x_desc: "allocation size",
        y_desc: match operations {
            "frees" => "frees per second",
            _ => "allocations per second",
        },
        legend_title: "allocator",
        series,
        dodged: false,
    })
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

/// The scenario of the utilization plot.
const UTILIZATION: &str = "u_utilization";

/// Utilization (percent of the heap's data bytes in live blocks when `malloc` returns null)
/// against heap size, the median over rounds: one line per allocator and size distribution
/// (single sizes by size, solid; then the mixed ones, dashed). `None` without such rows.
fn utilization_chart(data: &BTreeMap<String, Vec<Sample>>) -> Option<LineChart> {
    let samples = data.get(UTILIZATION)?;
    let mut lines: BTreeMap<(u64, String, String), Vec<(f64, f64)>> = BTreeMap::new();
    for ((alloc, size, _, _, state, metric), cell) in summarize(samples) {
        let Some(bytes) = heap_bytes(&state) else {
            continue;
        };
        if metric != "utilization" || bytes == 0 {
            continue;
        }
        lines
            .entry((size_key(&size), size, alloc))
            .or_default()
            .push((bytes as f64, cell.ms * 100.0));
    }
    if lines.is_empty() {
        return None;
    }
    let series = lines
        .into_iter()
        .enumerate()
        .map(|(i, ((key, size, alloc), mut points))| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let size = units::size(&size);
            let name = if alloc == "toga" {
                size
            } else {
                format!("{size}, {alloc}")
            };
            // The values in the label too: lines at the same height hide each other.
            let (lo, hi) = points.iter().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
                (lo.min(p.1), hi.max(p.1))
            });
            let (lo, hi) = (format!("{lo:.1}"), format!("{hi:.1}"));
            let values = if lo == hi {
                format!("{lo} %")
            } else {
                format!("{lo}–{hi} %")
            };
            Series {
                label: format!("{name}: {values}"),
                color: PALETTE[i % PALETTE.len()],
                dashed: key == u64::MAX,
                points,
            }
        })
        .collect();
    Some(LineChart {
        title: "utilization when malloc returns null, median over rounds".into(),
        x: Axis::Bytes,
        y: Axis::Percent,
        x_desc: "heap size (data bytes)",
        y_desc: "utilization (live block bytes ÷ heap data bytes)",
        legend_title: "block size: median utilization",
        series,
        dodged: true,
    })
}

/// Pixels: the size of a line chart, the least width of its legend column (it widens to fit
/// the labels), the legend's rows.
const LINE_SIZE: (u32, u32) = (1000, 560);
const LEGEND_MIN_WIDTH: u32 = 180;
const LEGEND_ROW: i32 = 24;
/// Pixels: where a legend's labels start (right of its line), and the room right of them.
const LEGEND_TEXT_X: i32 = LEGEND_LEFT + LEGEND_LINE + 8;
const LEGEND_MARGIN: u32 = 28;
const LEGEND_LEFT: i32 = 4;
/// Pixels of a dash, of the gap after it, and of a legend's line.
const DASH: u32 = 8;
const DASH_GAP: u32 = 6;
const LEGEND_LINE: i32 = 30;
/// Font sizes (pixels): titles, axis labels and descriptions, legend entries.
const TITLE_FONT: u32 = 22;
const LABEL_FONT: u32 = 15;
const DESC_FONT: u32 = 16;

/// Draw a line chart: the plot on the left, the legend in a column on the right.
fn draw_lines(chart: &LineChart, path: &Path) -> Drawn {
    let n = chart.series.len() as f64;
    let plotted = |(i, s): (usize, &Series)| -> Vec<(f64, f64)> {
        let shift = if chart.dodged {
            (i as f64 - (n - 1.0) / 2.0) * DODGE
        } else {
            0.0
        };
        s.points
            .iter()
            .map(|&(x, y)| (chart.x.to_plot(x) + shift, chart.y.to_plot(y)))
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect()
    };
    let lines: Vec<Vec<(f64, f64)>> = chart.series.iter().enumerate().map(plotted).collect();
    let bounds = |pick: fn(&(f64, f64)) -> f64| {
        lines
            .iter()
            .flatten()
            .map(pick)
            .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)))
    };
    let (x_lo, x_hi) = bounds(|p| p.0);
    let (y_lo, y_hi) = bounds(|p| p.1);
    if x_lo > x_hi {
        return Err("no finite points to draw".into());
    }
    let (x_lo, x_hi) = chart.x.range(x_lo, x_hi);
    let (y_lo, y_hi) = chart.y.range(y_lo, y_hi);

    let root = BitMapBackend::new(path, LINE_SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(&chart.title, ("sans-serif", TITLE_FONT))?;
    let mut legend_width = LEGEND_MIN_WIDTH;
    for s in &chart.series {
        let (w, _) = root.estimate_text_size(
            &s.label,
            &TextStyle::from(("sans-serif", LABEL_FONT).into_font()),
        )?;
        legend_width = legend_width.max(w + LEGEND_TEXT_X as u32 + LEGEND_MARGIN);
    }
    let (plot_area, legend_area) = root.split_horizontally(LINE_SIZE.0 - legend_width);
    let (x_axis, y_axis) = (chart.x, chart.y);
    let mut plot = ChartBuilder::on(&plot_area)
        .margin(10)
        .margin_right(20)
        .x_label_area_size(50)
        .y_label_area_size(100)
        .build_cartesian_2d(
            Ticked::new(x_axis, x_lo, x_hi),
            Ticked::new(y_axis, y_lo, y_hi),
        )?;
    plot.configure_mesh()
        .label_style(("sans-serif", LABEL_FONT))
        .axis_desc_style(("sans-serif", DESC_FONT))
        .x_desc(chart.x_desc)
        .y_desc(chart.y_desc)
        .x_label_formatter(&|v| x_axis.label(*v))
        .y_label_formatter(&|v| y_axis.label(*v))
        .bold_line_style(BLACK.mix(0.25))
        .light_line_style(BLACK.mix(0.07))
        .draw()?;
    // The first series (toga in the throughput plots) is drawn last, on top.
    for (series, points) in chart.series.iter().zip(&lines).rev() {
        let style = series.color.stroke_width(2);
        if chart.dodged {
            // Points only: nothing was measured between them.
        } else if series.dashed {
            plot.draw_series(DashedLineSeries::new(points.clone(), DASH, DASH_GAP, style))?;
        } else {
            plot.draw_series(LineSeries::new(points.clone(), style))?;
        }
        plot.draw_series(
            points
                .iter()
                .map(|&p| Circle::new(p, 4, series.color.filled())),
        )?;
    }
    draw_legend(&legend_area, chart.legend_title, &chart.series)?;
    root.present()?;
    Ok(())
}

/// The legend of a line chart, top-aligned in its own column: a heading, then per series its
/// line (dashed where it is), a marker and its label.
fn draw_legend(area: &DrawingArea<BitMapBackend, Shift>, title: &str, series: &[Series]) -> Drawn {
    let left = LEGEND_LEFT;
    let top = 20;
    let centered = |size: u32| {
        TextStyle::from(("sans-serif", size).into_font()).pos(Pos::new(HPos::Left, VPos::Center))
    };
    area.draw(&Text::new(
        title.to_string(),
        (left, top),
        centered(DESC_FONT).font.style(FontStyle::Bold),
    ))?;
    for (i, s) in series.iter().enumerate() {
        let y = top + LEGEND_ROW * (i as i32 + 1);
        let style = s.color.stroke_width(2);
        let ends = vec![(left, y), (left + LEGEND_LINE, y)];
        if s.dashed {
            area.draw(&DashedPathElement::new(ends, DASH, DASH_GAP, style))?;
        } else {
            area.draw(&PathElement::new(ends, style))?;
        }
        area.draw(&Circle::new(
            (left + LEGEND_LINE / 2, y),
            4,
            s.color.filled(),
        ))?;
        area.draw(&Text::new(
            s.label.clone(),
            (LEGEND_TEXT_X, y),
            centered(LABEL_FONT),
        ))?;
    }
    Ok(())
}

/// One bar of a bar panel.
struct Bar {
    label: String,
    allocator: String,
    /// In the panel's axis unit.
    value: f64,
}

/// A panel of horizontal bars on a log axis.
struct BarPanel {
    title: &'static str,
    x_desc: &'static str,
    axis: Axis,
    bars: Vec<Bar>,
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
                label: format!("{name} {}, {state} {metric}", units::size(&size)),
                value: value(threads, rounds, &cell),
                allocator: alloc,
            },
        )
        .collect()
}

/// The scenarios that are not one line against size: the rates of mixed sizes, malloc-then-free
/// at 16 B and 1 KiB, and churn; and the time of one warm launch. Empty panels are left out.
fn scenario_panels(data: &BTreeMap<String, Vec<Sample>>) -> Vec<BarPanel> {
    let rate = |threads, rounds, c: &Cell| c.per_second(threads, rounds);
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
    [
        BarPanel {
            title: "throughput (higher is better): mixed sizes, malloc+free in one kernel, churn",
            x_desc: "operations per second",
            axis: Axis::Rate,
            bars: rates,
        },
        BarPanel {
            title: "time of one launch on a warm heap (lower is better; fresh: first launch)",
            x_desc: "kernel time",
            axis: Axis::Micros,
            bars: launch,
        },
    ]
    .into_iter()
    .filter(|p| !p.bars.is_empty())
    .collect()
}

/// Pixels: the width of the bar plot, the height of a bar's row, and what a panel needs besides
/// its rows (title, axis, margins).
const BAR_WIDTH: u32 = 1000;
const BAR_ROW: u32 = 34;
const PANEL_CHROME: u32 = 120;
/// Pixels of a bar panel's bar labels, and of the area they go in.
const BAR_FONT: u32 = 13;
const BAR_LABEL_AREA: u32 = 330;
/// Pixels right of a bar panel, for the last label of its axis.
const BAR_MARGIN_RIGHT: u32 = 40;
/// A bar whose end is further right than this fraction of the axis has its value written inside
/// it; shorter ones, after it.
const VALUE_INSIDE: f64 = 0.8;

/// Draw the bar panels one above the other.
fn draw_bars(panels: &[BarPanel], path: &Path) -> Drawn {
    let height = |p: &BarPanel| PANEL_CHROME + BAR_ROW * p.bars.len() as u32;
    let total: u32 = panels.iter().map(height).sum();
    let root = BitMapBackend::new(path, (BAR_WIDTH, total)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut rest = root.clone();
    for panel in panels {
        let (area, below) = rest.split_vertically(height(panel));
        bar_panel(&area, panel)?;
        rest = below;
    }
    root.present()?;
    Ok(())
}

/// Horizontal bars on a log axis, one row per bar (first at the top), coloured by allocator, each
/// with its value written at its end.
fn bar_panel(area: &DrawingArea<BitMapBackend, Shift>, panel: &BarPanel) -> Drawn {
    let axis = panel.axis;
    let ends: Vec<f64> = panel.bars.iter().map(|b| axis.to_plot(b.value)).collect();
    let (lo, hi) = ends
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let (lo, hi) = axis.range(lo, hi);
    let n = panel.bars.len();
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
        .caption(panel.title, ("sans-serif", 18))
        .margin(10)
        .margin_right(BAR_MARGIN_RIGHT)
        .x_label_area_size(44)
        .y_label_area_size(BAR_LABEL_AREA)
        .build_cartesian_2d(Ticked::new(axis, lo, hi), (0..m - 1).into_segmented())?;
    let bars = &panel.bars;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .label_style(("sans-serif", BAR_FONT))
        .axis_desc_style(("sans-serif", BAR_FONT))
        .x_desc(panel.x_desc)
        .x_label_formatter(&|v| axis.label(*v))
        .bold_line_style(BLACK.mix(0.25))
        .light_line_style(BLACK.mix(0.07))
        .y_labels(m as usize)
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(r) => bars
                .get((m - 1 - r) as usize)
                .map(|b| format!("{} · {}", b.label, b.allocator))
                .unwrap_or_default(),
            _ => String::new(),
        })
        .draw()?;
    chart.draw_series(bars.iter().zip(&ends).enumerate().map(|(k, (b, &end))| {
        let mut bar = Rectangle::new(
            [(lo, SegmentValue::Exact(row(k))), (end, top_of(row(k)))],
            color(&b.allocator).filled(),
        );
        bar.set_margin(4, 4, 0, 0);
        bar
    }))?;
    chart.draw_series(ends.iter().enumerate().map(|(k, &end)| {
        let inside = (end - lo) / (hi - lo) > VALUE_INSIDE;
        let (offset, anchor, ink): (i32, HPos, &'static RGBColor) = if inside {
            (-6, HPos::Right, &WHITE)
        } else {
            (6, HPos::Left, &BLACK)
        };
        let style = TextStyle::from(("sans-serif", BAR_FONT).into_font())
            .pos(Pos::new(anchor, VPos::Center))
            .color(ink);
        EmptyElement::at((end, SegmentValue::CenterOf(row(k))))
            + Text::new(axis.label(end), (offset, 0), style)
    }))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_axis_ticks_every_power_of_two() {
        let (lo, hi) = Axis::Bytes.range(16f64.log2(), 4096f64.log2());
        let labels: Vec<String> = Axis::Bytes
            .ticks(lo, hi)
            .into_iter()
            .map(|v| Axis::Bytes.label(v))
            .collect();
        assert_eq!(
            labels,
            [
                "16 B", "32 B", "64 B", "128 B", "256 B", "512 B", "1 KiB", "2 KiB", "4 KiB"
            ]
        );
    }

    #[test]
    fn rate_axis_ticks_every_power_of_ten() {
        let (lo, hi) = Axis::Rate.range(3e6f64.log10(), 2.9e10f64.log10());
        let labels: Vec<String> = Axis::Rate
            .ticks(lo, hi)
            .into_iter()
            .map(|v| Axis::Rate.label(v))
            .collect();
        assert_eq!(
            labels,
            ["1 M/s", "10 M/s", "100 M/s", "1 G/s", "10 G/s", "100 G/s"]
        );
        assert_eq!(Axis::Rate.minor_ticks(lo, hi).len(), 5 * 8);
    }

    #[test]
    fn percent_axis() {
        let (lo, hi) = Axis::Percent.range(59.9, 100.0);
        assert_eq!((lo, hi), (50.0, 105.0));
        assert_eq!(
            Axis::Percent.ticks(lo, hi),
            [50.0, 60.0, 70.0, 80.0, 90.0, 100.0]
        );
        assert_eq!(
            Axis::Percent.minor_ticks(lo, hi),
            [55.0, 65.0, 75.0, 85.0, 95.0, 105.0]
        );
        assert_eq!(Axis::Percent.range(3.0, 40.0), (0.0, 105.0));
        assert_eq!(Axis::Percent.label(50.0), "50 %");
    }

    #[test]
    fn thread_counts() {
        assert_eq!(threads_text(&BTreeSet::from([1 << 20])), "2^20 threads");
        assert_eq!(threads_text(&BTreeSet::from([1000])), "1000 threads");
        assert_eq!(
            threads_text(&BTreeSet::from([1024, 4096])),
            "1024–4096 threads"
        );
    }
}
