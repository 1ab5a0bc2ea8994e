//! Medians of the samples: one [`Cell`] per allocator, size, threads, rounds, state and metric.

use std::collections::BTreeMap;

use crate::input::Sample;

/// allocator, size, threads, rounds, state, metric
pub type Key = (String, String, u64, u64, String, String);

/// A cell's median time (ms), its fastest and slowest sample, its sample count and the most
/// failures of any sample.
#[derive(Clone, Copy, Debug)]
pub struct Cell {
    pub ms: f64,
    /// The smallest sample (ms).
    pub fastest: f64,
    /// The largest sample (ms).
    pub slowest: f64,
    pub n: usize,
    pub failed: u64,
}

impl Cell {
    /// Operations per second, in millions: `threads × rounds` operations in `ms`.
    pub fn mops(&self, threads: u64, rounds: u64) -> f64 {
        (threads * rounds) as f64 / self.ms / 1e3
    }

    /// Operations per second: `threads × rounds` operations in `ms`.
    pub fn per_second(&self, threads: u64, rounds: u64) -> f64 {
        self.mops(threads, rounds) * 1e6
    }
}

/// The median (the upper one of an even count); `v` is not empty.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The first number of a size (`16`, `16-4096`), for ordering; `u64::MAX` for a size that does
/// not start with one (`mixed 16-4096`).
pub fn size_key(s: &str) -> u64 {
    s.split('-')
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or(u64::MAX)
}

/// The bytes of a heap label such as `8MiB` or `1GiB` (the `state` column of `u_utilization`);
/// `None` for other states (`fresh`, `warm`).
pub fn heap_bytes(label: &str) -> Option<u64> {
    let (number, shift) = [("KiB", 10), ("MiB", 20), ("GiB", 30), ("TiB", 40)]
        .into_iter()
        .find_map(|(unit, shift)| label.strip_suffix(unit).map(|n| (n, shift)))?;
    number.trim().parse::<u64>().ok().map(|n| n << shift)
}

/// Medians per (allocator, size, threads, rounds, state, metric), with the fastest and slowest
/// samples, sample counts and failures.
pub fn summarize(samples: &[Sample]) -> BTreeMap<Key, Cell> {
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
            let ms = || v.iter().map(|s| s.ms);
            let cell = Cell {
                ms: median(ms().collect()),
                fastest: ms().fold(f64::INFINITY, f64::min),
                slowest: ms().fold(f64::NEG_INFINITY, f64::max),
                n: v.len(),
                failed: v.iter().map(|s| s.failed).max().unwrap_or(0),
            };
            (k, cell)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_heaps() {
        assert_eq!(size_key("16"), 16);
        assert_eq!(size_key("16-4096"), 16);
        assert_eq!(size_key("mixed 16-4096"), u64::MAX);
        assert_eq!(heap_bytes("8MiB"), Some(8 << 20));
        assert_eq!(heap_bytes("1GiB"), Some(1 << 30));
        assert_eq!(heap_bytes("fresh"), None);
    }

    #[test]
    fn medians_group_by_key() {
        let sample = |ms, failed| Sample {
            scenario: "s".into(),
            allocator: "toga".into(),
            size: "16".into(),
            threads: 1000,
            rounds: 1,
            state: "fresh".into(),
            metric: "malloc".into(),
            ms,
            failed,
        };
        let cells = summarize(&[sample(3.0, 0), sample(1.0, 2), sample(2.0, 1)]);
        assert_eq!(cells.len(), 1);
        let cell = cells.values().next().unwrap();
        assert_eq!((cell.ms, cell.n, cell.failed), (2.0, 3, 2));
        assert_eq!((cell.fastest, cell.slowest), (1.0, 3.0));
        assert_eq!(cell.per_second(1000, 1), 500_000.0);
    }
}
