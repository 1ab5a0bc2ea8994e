//! The results table and its JSON form.

use serde::Serialize;
use toga::HeapStats;

/// One workload's result.
#[derive(Serialize, Debug)]
pub struct Row {
    pub workload: String,
    pub threads: u64,
    pub sizes: String,
    pub operations: u64,
    pub kernel_ms: f64,
    pub mops_per_s: f64,
    pub failed_allocations: u64,
    pub verified: bool,
    pub note: String,
}

impl Row {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        workload: &str,
        threads: u64,
        sizes: String,
        operations: u64,
        kernel_ms: f64,
        failed_allocations: u64,
        verified: bool,
        note: String,
    ) -> Self {
        Self {
            workload: workload.into(),
            threads,
            sizes,
            operations,
            kernel_ms,
            mops_per_s: if kernel_ms > 0.0 {
                operations as f64 / kernel_ms / 1e3
            } else {
                0.0
            },
            failed_allocations,
            verified,
            note,
        }
    }
}

#[derive(Serialize)]
struct StatsJson<'a> {
    after: &'a str,
    reserved_bytes: u64,
    reserved_high: u64,
    used_bytes: u64,
    used_high: u64,
    live_blocks: u64,
    mallocs: u64,
    frees: u64,
    failed_allocations: u64,
    invalid_frees: u64,
    double_frees: u64,
    /// Growable heaps: what is mapped now and at most, the maximum, and the growths kernels
    /// got and failed to get (a fixed heap: its capacity three times, and zeros).
    mapped_bytes: u64,
    mapped_high: u64,
    max_bytes: u64,
    kernel_grows: u64,
    kernel_grow_failures: u64,
}

/// Print the table (or JSON with the statistics after each workload).
pub fn print_rows(rows: &[Row], stats: &[(String, HeapStats)], json: bool) {
    if json {
        let stats: Vec<StatsJson> = stats
            .iter()
            .map(|(k, s)| StatsJson {
                after: k,
                reserved_bytes: s.reserved_bytes,
                reserved_high: s.reserved_high,
                used_bytes: s.used_bytes,
                used_high: s.used_high,
                live_blocks: s.live_blocks(),
                mallocs: s.mallocs,
                frees: s.frees,
                failed_allocations: s.failed_allocations,
                invalid_frees: s.invalid_frees,
                double_frees: s.double_frees,
                mapped_bytes: s.mapped_bytes,
                mapped_high: s.mapped_high,
                max_bytes: s.max_bytes,
                kernel_grows: s.kernel_grows,
                kernel_grow_failures: s.kernel_grow_failures,
            })
            .collect();
        let doc = serde_json::json!({ "results": rows, "stats": stats });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return;
    }
    print_header();
    for r in rows {
        print_row(r);
    }
}

/// The table's header line.
pub fn print_header() {
    println!(
        "{:<9} {:>9} {:>18} {:>11} {:>11} {:>9} {:>8} {:>3}  note",
        "workload", "threads", "sizes", "operations", "kernel ms", "M ops/s", "failed", "ok"
    );
}

/// One table row.
pub fn print_row(r: &Row) {
    println!(
        "{:<9} {:>9} {:>18} {:>11} {:>11.3} {:>9.1} {:>8} {:>3}  {}",
        r.workload,
        r.threads,
        r.sizes,
        r.operations,
        r.kernel_ms,
        r.mops_per_s,
        r.failed_allocations,
        if r.verified { "✓" } else { "✗" },
        r.note
    );
}
