//! The markdown of the variance table (scenario [`SCENARIO`]): how far `host bench`'s cell
//! medians spread over fresh processes (`scripts/gpu-variance.sh` runs ten, each appending one
//! median per cell, its process index in the `iteration` column). One row per allocator, size,
//! threads, heap state and metric: the processes (`runs`), the fastest, median and slowest of
//! their medians, and slowest ÷ fastest, on which the variance target is judged.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::markdown::{format_ms, heading, row_order};
use crate::summary::{Cell, Key};

/// The scenario `host bench --csv` writes.
pub const SCENARIO: &str = "v_variance";

/// The table of `summary` (one [`Cell`] per cell of `host bench`, its samples the processes'
/// medians).
pub fn table(md: &mut String, summary: &BTreeMap<Key, Cell>) {
    heading(
        md,
        &[
            "allocator",
            "size (B)",
            "threads",
            "heap",
            "metric",
            "runs",
            "fastest ms",
            "median ms",
            "slowest ms",
            "slowest ÷ fastest",
            "failed",
        ],
    );
    let mut rows: Vec<_> = summary.iter().collect();
    rows.sort_by_key(|(key, _)| row_order(key));
    for ((alloc, size, threads, _, state, metric), cell) in rows {
        let _ = writeln!(
            md,
            "| {alloc} | {size} | {threads} | {state} | {metric} | {} | {} | {} | {} | {} | {} |",
            cell.n,
            format_ms(cell.fastest),
            format_ms(cell.ms),
            format_ms(cell.slowest),
            spread(cell),
            cell.failed
        );
    }
    let _ = writeln!(md);
}

/// Slowest ÷ fastest, to two decimals; `–` when the fastest took no time.
fn spread(cell: &Cell) -> String {
    if cell.fastest > 0.0 {
        format!("{:.2}", cell.slowest / cell.fastest)
    } else {
        "–".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::Sample;
    use crate::summary::summarize;

    /// One process's median of one cell (made-up numbers: these tests check the table's
    /// arithmetic and layout, not any GPU).
    fn median_of_process(alloc: &str, size: &str, state: &str, metric: &str, ms: f64) -> Sample {
        Sample::of(SCENARIO, alloc, size, state, metric, ms)
    }

    fn rendered(samples: &[Sample]) -> String {
        let mut md = String::new();
        table(&mut md, &summarize(samples));
        md
    }

    #[test]
    fn each_cell_shows_fastest_median_slowest_and_their_ratio() {
        let mut samples = Vec::new();
        for ms in [1.0, 1.2, 1.1, 1.25, 1.05] {
            samples.push(median_of_process("toga", "16", "fresh", "malloc", ms));
        }
        for ms in [0.5, 0.5, 0.8] {
            samples.push(median_of_process("toga", "16", "fresh", "free", ms));
        }
        let md = rendered(&samples);
        assert!(
            md.contains(
                "| toga | 16 | 1000 | fresh | malloc | 5 | 1.0000 | 1.1000 | 1.2500 | 1.25 | 0 |"
            ),
            "{md}"
        );
        assert!(
            md.contains(
                "| toga | 16 | 1000 | fresh | free | 3 | 0.5000 | 0.5000 | 0.8000 | 1.60 | 0 |"
            ),
            "{md}"
        );
        assert!(md.starts_with("| allocator | size (B) |"), "{md}");
    }

    #[test]
    fn rows_go_by_size_ranges_last_then_state_metric_and_allocator() {
        let md = rendered(&[
            median_of_process("toga", "16-4096", "fresh", "malloc", 1.0),
            median_of_process("toga", "4096", "warm", "malloc", 1.0),
            median_of_process("toga", "16", "warm", "malloc", 1.0),
            median_of_process("toga", "16", "fresh", "free", 1.0),
            median_of_process("toga", "16", "fresh", "malloc", 1.0),
            median_of_process("bump", "16", "fresh", "malloc", 1.0),
        ]);
        let order: Vec<String> = md
            .lines()
            .skip(2)
            .filter(|l| l.starts_with('|'))
            .map(|l| {
                let f: Vec<&str> = l.split(" | ").collect();
                format!(
                    "{} {} {} {}",
                    f[0].trim_start_matches("| "),
                    f[1],
                    f[3],
                    f[4]
                )
            })
            .collect();
        assert_eq!(
            order,
            [
                "bump 16 fresh malloc",
                "toga 16 fresh malloc",
                "toga 16 fresh free",
                "toga 16 warm malloc",
                "toga 4096 warm malloc",
                "toga 16-4096 fresh malloc",
            ]
        );
    }

    #[test]
    fn a_cell_of_zero_time_has_no_ratio() {
        let md = rendered(&[median_of_process("bump", "16", "fresh", "free", 0.0)]);
        assert!(md.contains("| 0.0000 | – | 0 |"), "{md}");
    }
}
