//! Numbers as people read them on a plot: rates as `120 M/s` or `1.2 G/s`, sizes as `16 B` or
//! `4 KiB`, times as `5 µs` or `1.5 ms`.

/// A number with at most three significant digits and no trailing zeros: `1.2`, `12`, `120`,
/// `1.25`.
fn short(v: f64) -> String {
    let text = if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// A rate (per second) with a decimal prefix: `950 /s`, `12 k/s`, `120 M/s`, `1.2 G/s`.
pub fn rate(per_second: f64) -> String {
    const PREFIXES: [(f64, &str); 4] = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")];
    // Tolerate rounding in a value meant as a power of ten (10^9 computed as 999999999.99).
    let nudged = per_second * (1.0 + 1e-9);
    match PREFIXES.iter().find(|(scale, _)| nudged >= *scale) {
        Some((scale, prefix)) => format!("{} {prefix}/s", short(per_second / scale)),
        None => format!("{} /s", short(per_second)),
    }
}

/// A byte count with a binary prefix: `16 B`, `4 KiB`, `64 KiB`, `1.5 MiB`.
pub fn bytes(n: u64) -> String {
    const PREFIXES: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    match PREFIXES.iter().find(|(shift, _)| n >= 1 << shift) {
        Some((shift, unit)) => format!("{} {unit}", short(n as f64 / (1u64 << shift) as f64)),
        None => format!("{n} B"),
    }
}

/// A size column as text: `16` → `16 B`, `16-4096` → `16 B–4 KiB`, `mixed 16-4096` →
/// `mixed 16 B–4 KiB`; anything else unchanged.
pub fn size(column: &str) -> String {
    let (prefix, range) = match column.rsplit_once(' ') {
        Some((word, range)) => (format!("{word} "), range),
        None => (String::new(), column),
    };
    let parts: Option<Vec<u64>> = range.split('-').map(|p| p.parse().ok()).collect();
    match parts {
        Some(parts) if !parts.is_empty() => {
            let parts: Vec<String> = parts.into_iter().map(bytes).collect();
            format!("{prefix}{}", parts.join("–"))
        }
        _ => column.to_string(),
    }
}

/// A time in microseconds: `5 µs`, `250 µs`, `1.5 ms`, `2 s`.
pub fn micros(us: f64) -> String {
    let nudged = us * (1.0 + 1e-9);
    if nudged >= 1e6 {
        format!("{} s", short(us / 1e6))
    } else if nudged >= 1e3 {
        format!("{} ms", short(us / 1e3))
    } else {
        format!("{} µs", short(us))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(rate(120e6), "120 M/s");
        assert_eq!(rate(1.2e9), "1.2 G/s");
        assert_eq!(rate(28.4e9), "28.4 G/s");
        assert_eq!(rate(1e6), "1 M/s");
        assert_eq!(rate(10f64.powf(9.0)), "1 G/s");
        assert_eq!(rate(999_999_999.999_9), "1 G/s");
        assert_eq!(rate(3_087_000.0), "3.09 M/s");
        assert_eq!(rate(12_000.0), "12 k/s");
        assert_eq!(rate(950.0), "950 /s");
    }

    #[test]
    fn byte_counts() {
        assert_eq!(bytes(16), "16 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1 KiB");
        assert_eq!(bytes(4096), "4 KiB");
        assert_eq!(bytes(65536), "64 KiB");
        assert_eq!(bytes(1536 << 10), "1.5 MiB");
        assert_eq!(bytes(8 << 20), "8 MiB");
        assert_eq!(bytes(1 << 30), "1 GiB");
    }

    #[test]
    fn size_columns() {
        assert_eq!(size("16"), "16 B");
        assert_eq!(size("1048576"), "1 MiB");
        assert_eq!(size("16-4096"), "16 B–4 KiB");
        assert_eq!(size("mixed 16-65536"), "mixed 16 B–64 KiB");
        assert_eq!(size("odd"), "odd");
    }

    #[test]
    fn times() {
        assert_eq!(micros(5.0), "5 µs");
        assert_eq!(micros(250.0), "250 µs");
        assert_eq!(micros(1500.0), "1.5 ms");
        assert_eq!(micros(2e6), "2 s");
    }
}
