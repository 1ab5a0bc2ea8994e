//! The `report` binary from the outside: arguments, rejected rows, where the markdown goes, and
//! errors, on small CSVs in temporary directories.

use std::path::Path;
use std::process::{Command, Output};

const HEADER: &str = "scenario,allocator,size,threads,state,metric,iteration,ms,failed,device";

/// Run `report` with `args`.
fn report(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_report"))
        .args(args)
        .output()
        .expect("report runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A results directory holding `files` (name, contents).
fn results(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write");
    }
    dir
}

/// Two good malloc rows (toga and bump at 16 B) of `a_malloc_only`.
fn good_csv() -> String {
    format!(
        "{HEADER}\n\
         a_malloc_only,toga,16,1048576,fresh,malloc,0,0.5,0,GPU\n\
         a_malloc_only,bump,16,1048576,fresh,malloc,0,0.05,0,GPU\n"
    )
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("UTF-8 temp path")
}

#[test]
fn help_prints_usage_and_exits_0() {
    let out = report(&["--help"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let help = stdout(&out);
    for word in [
        "Usage: report",
        "--out",
        "--plots",
        "--strict",
        "RESULTS_DIR",
    ] {
        assert!(help.contains(word), "no {word} in:\n{help}");
    }
}

#[test]
fn an_unknown_flag_is_a_usage_error() {
    let out = report(&["--bogus"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("Usage: report"), "{}", stderr(&out));
}

#[test]
fn malformed_rows_are_named_and_good_rows_still_reported() {
    let csv = format!(
        "{}\
         a_malloc_only,toga,64,1048576,fresh,malloc,0,0.8\n\
         a_malloc_only,toga,64,lots,fresh,malloc,0,0.8,0,GPU\n\
         a_malloc_only,toga,64,1048576,fresh,malloc,0,NaN,0,GPU\n",
        good_csv()
    );
    let dir = results(&[("a_malloc_only.csv", &csv)]);
    let out = report(&[path_str(dir.path()), "--no-plots"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let file = dir.path().join("a_malloc_only.csv");
    let file = file.display();
    for line in [
        format!("{file}:4: rejected: 8 fields, the header has 10"),
        format!("{file}:5: rejected: threads `lots` is not a whole number"),
        format!("{file}:6: rejected: ms `NaN` is not finite"),
    ] {
        assert!(err.lines().any(|l| l == line), "no `{line}` in:\n{err}");
    }
    assert!(err.contains("3 rejected"), "{err}");
    assert!(err.contains("--strict"), "{err}");
    let md = stdout(&out);
    assert!(
        md.contains("| toga | 16 | 1048576 | 0.5000 | 2097 | 1 | 0 |"),
        "{md}"
    );
    assert!(md.contains("| bump | 16 |"), "{md}");
    assert!(!md.contains("| toga | 64 |"), "{md}");
}

#[test]
fn strict_fails_on_a_rejected_row_and_writes_nothing() {
    let csv = format!(
        "{}a_malloc_only,toga,64,1048576,fresh,malloc,0,-2,0,GPU\n",
        good_csv()
    );
    let dir = results(&[("a_malloc_only.csv", &csv)]);
    let md = dir.path().join("out.md");
    let out = report(&[path_str(dir.path()), "--strict", "--out", path_str(&md)]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(":4: rejected: ms `-2` is negative"), "{err}");
    assert!(err.contains("--strict"), "{err}");
    assert!(!md.exists());
    assert!(!dir.path().join("malloc.png").exists());
}

#[test]
fn out_writes_the_markdown_and_the_plots() {
    let dir = results(&[
        ("a_malloc_only.csv", &good_csv()),
        ("notes.md", "## Notes\n\nverbatim *text*\n"),
        ("meta.txt", "GPU: test\n"),
    ]);
    let md = dir.path().join("docs.md");
    let out = report(&[path_str(dir.path()), "--out", path_str(&md)]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    let text = std::fs::read_to_string(&md).expect("markdown written");
    assert!(text.starts_with("# Benchmarks\n"), "{text}");
    assert!(text.contains("- GPU: test\n"), "{text}");
    assert!(text.contains("## a_malloc_only"), "{text}");
    assert!(text.ends_with("## Notes\n\nverbatim *text*\n"), "{text}");
    // The markdown sits beside the plots: links without a directory.
    assert!(
        text.contains("](malloc.png)"),
        "no link to malloc.png in:\n{text}"
    );
    assert!(err.contains("wrote"), "{err}");
    assert!(dir.path().join("malloc.png").is_file());
    assert!(!dir.path().join("throughput.png").exists());
}

#[test]
fn plots_go_where_asked_and_links_follow() {
    let dir = results(&[("a_malloc_only.csv", &good_csv())]);
    let plots = dir.path().join("pictures");
    let out = report(&[path_str(dir.path()), "--plots", path_str(&plots)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(plots.join("malloc.png").is_file());
    // On stdout, links are relative to the plots directory's parent.
    assert!(
        stdout(&out).contains("](pictures/malloc.png)"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn stdout_mode_prints_the_markdown() {
    let dir = results(&[("a_malloc_only.csv", &good_csv())]);
    let out = report(&[path_str(dir.path()), "--no-plots"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let md = stdout(&out);
    assert!(md.starts_with("# Benchmarks\n"), "{md}");
    assert!(md.contains("| allocator | size (B) |"), "{md}");
    assert!(stderr(&out).contains("none rejected"), "{}", stderr(&out));
    assert!(!dir.path().join("malloc.png").exists());
}

#[test]
fn rounds_multiply_the_rate() {
    let csv = format!("{HEADER},rounds\nf_churn,toga,16-4096,1000,warm,malloc_free,0,1,0,GPU,4\n");
    let dir = results(&[("f_churn.csv", &csv)]);
    let out = report(&[path_str(dir.path()), "--no-plots"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // 1000 threads × 4 rounds in 1 ms: 4 M pairs/s.
    let md = stdout(&out);
    assert!(
        md.contains("| toga | 16-4096 | 1000 | 4 | warm | malloc_free | 1.0000 | 1 | 4 | 0 |"),
        "{md}"
    );
}

/// A one-line error on stderr, exit status 1, no panic.
fn assert_clean_error(out: &Output, needle: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "not one line:\n{err}");
    assert!(err.starts_with("report: "), "{err}");
    assert!(err.contains(needle), "no `{needle}` in:\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(stdout(out).is_empty());
}

#[test]
fn a_missing_directory_is_a_clean_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("not-there");
    let out = report(&[path_str(&missing)]);
    assert_clean_error(&out, "cannot read the results directory");
}

#[test]
fn a_directory_without_csv_is_a_clean_error() {
    let dir = results(&[("notes.md", "nothing\n")]);
    let out = report(&[path_str(dir.path())]);
    assert_clean_error(&out, "no CSV files");
}

#[test]
fn a_wrong_header_is_a_clean_error() {
    let dir = results(&[("x.csv", "name,value\na,1\n")]);
    let out = report(&[path_str(dir.path())]);
    assert_clean_error(&out, "x.csv:1: the header is `name,value`");
}

#[test]
fn an_unwritable_out_is_a_clean_error() {
    let dir = results(&[("a_malloc_only.csv", &good_csv())]);
    let md = dir.path().join("no-such-dir").join("out.md");
    let out = report(&[path_str(dir.path()), "--no-plots", "--out", path_str(&md)]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(last.contains("cannot write"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // Checked before drawing: no plots either.
    let out = report(&[path_str(dir.path()), "--out", path_str(&md)]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!dir.path().join("malloc.png").exists());
}
