//! Values the parser refuses or accepts, and `host help`: usage errors exit 2 with clap's
//! message, before anything touches the GPU, so these run on any machine. Runs the real binary.

use std::process::Output;

const USAGE: i32 = 2;

fn host(args: &[&str]) -> Output {
    let bin =
        std::env::var_os("TOGA_HOST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_host").into());
    std::process::Command::new(bin)
        .args(args)
        .output()
        .expect("running host")
}

/// A usage error naming `flag` and saying `why`, with no panic.
fn refused(args: &[&str], flag: &str, why: &str) {
    let o = host(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(USAGE), "{args:?}: {err}");
    assert!(err.contains(flag), "{args:?}: {flag:?} not in: {err}");
    assert!(err.contains(why), "{args:?}: {why:?} not in: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
}

/// Not a usage error: the value parsed (the run then needs a GPU, or reports that it has none).
fn parsed(args: &[&str]) {
    let o = host(args);
    assert_ne!(
        o.status.code(),
        Some(USAGE),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn scan_sizes_take_units() {
    refused(
        &["scan", "--sizes", "64GiB"],
        "--sizes",
        "above the largest request size",
    );
    refused(&["scan", "--sizes", "16,lots"], "--sizes", "512MiB");
    // Parsed, then the run starts: on a machine without a GPU, exit 3. A tiny timeout keeps a
    // GPU machine from running the whole scan.
    if toga::device_count().is_err() {
        parsed(&["scan", "--sizes", "16,4KiB,1MiB", "--timeout", "1"]);
    }
}

#[test]
fn scan_size_zero_is_refused() {
    refused(&["scan", "--sizes", "0"], "--sizes", "at least 1 byte");
    refused(&["scan", "--sizes", "16,0"], "--sizes", "at least 1 byte");
}

#[test]
fn grow_initial_is_whole_granules() {
    for bad in ["0", "1KiB", "3MiB"] {
        refused(
            &["grow", "--initial", bad],
            "--initial",
            "not a positive whole number of granules",
        );
    }
}

#[test]
fn grow_max_is_blamed_for_itself() {
    for bad in ["0", "1MiB"] {
        let o = host(&["grow", "--max", bad]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !err.contains("--initial"),
            "--max {bad} blamed --initial: {err}"
        );
        refused(&["grow", "--max", bad], "--max", "below one granule");
    }
    refused(&["grow", "--max", "64GiB"], "--max", "above the limit");
}

#[test]
fn help_subcommand_takes_help_flags() {
    for args in [
        &["help"][..],
        &["help", "--help"],
        &["help", "-h"],
        &["--help"],
    ] {
        let o = host(args);
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(out.contains("Usage: host"), "{args:?}: {out}");
        assert!(
            out.contains("grow"),
            "{args:?} lists the subcommands: {out}"
        );
    }
    for args in [
        &["help", "grow"][..],
        &["help", "grow", "--help"],
        &["grow", "--help"],
    ] {
        let o = host(args);
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{args:?}");
        assert!(out.contains("Usage: host grow"), "{args:?}: {out}");
        assert!(out.contains("--initial"), "{args:?}: {out}");
    }
    refused(&["help", "nosuch"], "nosuch", "unrecognized subcommand");
}

#[test]
fn bench_csv_that_cannot_be_opened_is_refused() {
    let missing_dir = std::env::temp_dir()
        .join(format!("toga-cli-values-{}", std::process::id()))
        .join("v_variance.csv");
    let missing = missing_dir.to_string_lossy();
    refused(&["bench", "--csv", &missing], "--csv", "cannot open");
    // A directory is no file to append to.
    let dir = std::env::temp_dir();
    refused(
        &["bench", "--csv", &dir.to_string_lossy()],
        "--csv",
        "cannot open",
    );
}

#[test]
fn bench_run_index_needs_csv() {
    refused(&["bench", "--run-index", "3"], "--csv", "required");
    refused(
        &["bench", "--run-index", "lots"],
        "--run-index",
        "invalid value",
    );
}
