//! Bad input gets one clear line and a non-zero exit, never a panic. Runs the real binary.

use std::process::{Command, Output};

/// The binary under test: cargo's build of it, or `TOGA_HOST_BIN` (set by the GPU bundle's
/// run script, where the build path does not exist).
fn host(args: &[&str]) -> Output {
    let bin =
        std::env::var_os("TOGA_HOST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_host").into());
    Command::new(bin).args(args).output().expect("running host")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn assert_clean_failure(o: &Output, code: i32, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "a panic: {err}"
    );
}

/// Whether this machine can run GPU work (then the no-GPU expectations do not apply).
fn has_gpu() -> bool {
    toga::device_count().is_ok_and(|n| n > 0)
}

#[test]
fn help_lists_the_subcommands_and_flags() {
    let o = host(&["--help"]);
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    for word in [
        "stress",
        "bench",
        "info",
        "--device",
        "--heap-size",
        "--threads",
        "--seed",
        "--json",
        "--workload",
    ] {
        assert!(out.contains(word), "--help lacks {word}");
    }
}

#[test]
fn zero_heap_is_refused() {
    assert_clean_failure(
        &host(&["--heap-size", "0"]),
        1,
        "heap size must be greater than zero",
    );
}

#[test]
fn heap_below_one_chunk_is_refused() {
    assert_clean_failure(&host(&["--heap-size", "100KiB"]), 1, "below the minimum");
}

#[test]
fn heap_above_the_largest_is_refused() {
    assert_clean_failure(&host(&["--heap-size", "1000GiB"]), 1, "above the limit");
}

#[test]
fn unparsable_heap_size_is_refused() {
    assert_clean_failure(&host(&["--heap-size", "lots"]), 2, "try 512MiB or 2GiB");
}

#[test]
fn unknown_workload_is_refused() {
    assert_clean_failure(
        &host(&["--workload", "teleport"]),
        2,
        "invalid value 'teleport'",
    );
}

#[test]
fn unknown_flag_is_refused() {
    assert_clean_failure(&host(&["--turbo"]), 2, "unexpected argument '--turbo'");
}

#[test]
fn zero_threads_are_refused() {
    assert_clean_failure(&host(&["--threads", "0"]), 2, "--threads");
}

#[test]
fn device_out_of_range_or_no_driver() {
    let o = host(&["--device", "99", "info"]);
    if has_gpu() {
        assert_clean_failure(&o, 1, "device 99 does not exist");
    } else {
        assert_clean_failure(&o, 2, "no CUDA");
        assert_eq!(stderr(&o).lines().count(), 1, "one line");
    }
}

#[test]
fn no_gpu_means_exit_2_with_one_line() {
    if has_gpu() {
        eprintln!("skipped: this machine has a CUDA device");
        return;
    }
    let o = host(&[]);
    assert_clean_failure(&o, 2, "no CUDA");
    assert_eq!(stderr(&o).lines().count(), 1, "one line: {}", stderr(&o));
}

#[test]
fn heap_above_free_device_memory_is_refused() {
    if !has_gpu() {
        eprintln!("skipped: no CUDA device");
        return;
    }
    let free = toga::Gpu::open(0)
        .and_then(|g| g.free_memory())
        .expect("GPU 0");
    let size = toga_kernels::heap::MAX_HEAP_BYTES.min(free + (1 << 30));
    if size <= free {
        eprintln!("skipped: this GPU has more free memory ({free} B) than toga's largest heap");
        return;
    }
    let arg = size.to_string();
    assert_clean_failure(
        &host(&["--heap-size", &arg, "info"]),
        1,
        "free device memory",
    );
}

#[test]
fn grow_help_lists_its_flags() {
    let o = host(&["grow", "--help"]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for word in ["--initial", "--max", "--threads", "8MiB"] {
        assert!(out.contains(word), "grow --help lacks {word}");
    }
    let top = host(&["--help"]);
    assert!(String::from_utf8_lossy(&top.stdout).contains("grow"));
}

#[test]
fn unparsable_grow_sizes_are_refused() {
    assert_clean_failure(
        &host(&["grow", "--initial", "lots"]),
        2,
        "try 512MiB or 2GiB",
    );
    assert_clean_failure(&host(&["grow", "--max", "huge"]), 2, "--max <MAX>");
}

#[test]
fn grow_initial_above_max_is_refused_or_no_driver() {
    let o = host(&["grow", "--initial", "64MiB", "--max", "8MiB"]);
    if has_gpu() {
        assert_clean_failure(&o, 1, "the growable heap's maximum");
    } else {
        assert_clean_failure(&o, 2, "no CUDA");
    }
    assert_eq!(stderr(&o).lines().count(), 1, "one line: {}", stderr(&o));
}

#[test]
fn grow_runs_and_verifies() {
    if !has_gpu() {
        eprintln!("skipped: no CUDA device");
        return;
    }
    let o = host(&["grow"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "stdout: {out}\nstderr: {}",
        stderr(&o)
    );
    for word in ["round 3", "trim", "after trim", "growths"] {
        assert!(out.contains(word), "{word:?} missing from: {out}");
    }
    assert!(!out.contains('✗'), "{out}");
}
