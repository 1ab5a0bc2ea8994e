//! Bad input gets a clear message and its own exit code, never a panic; each subcommand takes
//! only its own flags. Runs the real binary.
//!
//! The exit codes (host/src/main.rs, `mod exit`): 0 success, 1 verification failure, 2 usage
//! error, 3 no GPU (or `--device` out of range), 4 a kernel timed out, 5 any other CUDA or heap
//! error. Tests that need a GPU are ignored by default and fail, saying why, when run without
//! one (`cargo test -- --include-ignored`); the others pass on machines with and without one.

use std::process::{Command, Output};

const SUCCESS: i32 = 0;
const USAGE: i32 = 2;
const NO_GPU: i32 = 3;
const CUDA_ERROR: i32 = 5;

/// Every way to start a run: `host` alone (a stress run) and each subcommand.
const RUNS: [&[&str]; 6] = [
    &[],
    &["stress"],
    &["bench"],
    &["info"],
    &["scan"],
    &["grow"],
];

/// The binary under test: cargo's build of it, or `TOGA_HOST_BIN` (set by the GPU bundle's
/// run script, where the build path does not exist).
fn host(args: &[&str]) -> Output {
    let bin =
        std::env::var_os("TOGA_HOST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_host").into());
    Command::new(bin).args(args).output().expect("running host")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
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

/// A failure after parsing: one line on stderr, starting `host: `.
fn assert_one_line(o: &Output) {
    let err = stderr(o);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("host: "), "{err}");
}

/// Whether this machine can run GPU work (then the no-GPU expectations do not apply).
fn has_gpu() -> bool {
    toga::device_count().is_ok_and(|n| n > 0)
}

/// The device GPU tests run on (`TOGA_TEST_DEVICE`, default 0), open; panics, saying why, when
/// there is none: a GPU test that was asked to run must not pass without a GPU.
fn gpu() -> (toga::Gpu, String) {
    let ordinal: usize = std::env::var("TOGA_TEST_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let gpu = toga::Gpu::open(ordinal).unwrap_or_else(|e| {
        panic!(
            "GPU test without a GPU: opening device {ordinal}: {e} (GPU tests need a CUDA device)"
        )
    });
    (gpu, ordinal.to_string())
}

/// `host <args> --help` on stdout, which must succeed.
fn help(args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.push("--help");
    let o = host(&all);
    assert!(o.status.success(), "{all:?}: {}", stderr(&o));
    stdout(&o)
}

#[test]
fn help_lists_the_subcommands_the_stress_flags_and_the_exit_codes() {
    let out = help(&[]);
    for word in [
        "stress",
        "bench",
        "info",
        "scan",
        "grow",
        "--device",
        "--timeout",
        "--heap-size",
        "--threads",
        "--seed",
        "--json",
        "--host-growth",
        "--workload",
        "Exit codes",
    ] {
        assert!(out.contains(word), "--help lacks {word}");
    }
    for code in 0..=5 {
        assert!(
            out.contains(&format!("\n  {code}  ")),
            "--help lacks exit code {code}"
        );
    }
    // Flags of other subcommands are not offered at the top level.
    for word in ["--sizes", "--no-exhaust", "--initial", "--max"] {
        assert!(!out.contains(word), "--help offers {word}");
    }
}

#[test]
fn each_subcommand_help_lists_only_its_own_flags() {
    const ALL: [&str; 14] = [
        "--device",
        "--timeout",
        "--heap-size",
        "--threads",
        "--seed",
        "--json",
        "--host-growth",
        "--workload",
        "--sizes",
        "--no-exhaust",
        "--initial",
        "--max",
        "--csv",
        "--run-index",
    ];
    let own: [(&str, &[&str]); 5] = [
        (
            "stress",
            &[
                "--device",
                "--timeout",
                "--heap-size",
                "--threads",
                "--seed",
                "--json",
                "--host-growth",
                "--workload",
            ],
        ),
        (
            "bench",
            &["--device", "--timeout", "--threads", "--csv", "--run-index"],
        ),
        ("info", &["--device", "--timeout", "--heap-size"]),
        (
            "scan",
            &[
                "--device",
                "--timeout",
                "--heap-size",
                "--threads",
                "--sizes",
                "--no-exhaust",
            ],
        ),
        (
            "grow",
            &[
                "--device",
                "--timeout",
                "--threads",
                "--seed",
                "--json",
                "--host-growth",
                "--initial",
                "--max",
            ],
        ),
    ];
    for (command, flags) in own {
        let out = help(&[command]);
        for flag in ALL {
            assert_eq!(
                out.contains(flag),
                flags.contains(&flag),
                "`host {command} --help` and {flag}:\n{out}"
            );
        }
        assert!(out.contains("Exit codes"), "{command}: {out}");
    }
}

#[test]
fn grow_help_shows_its_defaults() {
    let out = help(&["grow"]);
    assert!(out.contains("8MiB"), "{out}");
}

#[test]
fn flags_of_other_subcommands_are_refused() {
    for (args, flag) in [
        (&["info", "--threads", "4096"][..], "--threads"),
        (&["info", "--seed", "1"], "--seed"),
        (&["bench", "--heap-size", "1GiB"], "--heap-size"),
        (&["bench", "--json"], "--json"),
        (&["grow", "--heap-size", "1GiB"], "--heap-size"),
        (&["grow", "--workload", "storm"], "--workload"),
        (&["scan", "--json"], "--json"),
        (&["stress", "--sizes", "16"], "--sizes"),
        (&["--sizes", "16"], "--sizes"),
        (&["--initial", "8MiB"], "--initial"),
    ] {
        assert_clean_failure(&host(args), USAGE, &format!("unexpected argument '{flag}'"));
    }
}

#[test]
fn top_level_flags_go_after_the_subcommand() {
    assert_clean_failure(
        &host(&["--device", "1", "info"]),
        USAGE,
        "cannot be used with '--device",
    );
}

#[test]
fn zero_heap_is_refused() {
    assert_clean_failure(
        &host(&["--heap-size", "0"]),
        USAGE,
        "heap size must be greater than zero",
    );
}

#[test]
fn heap_below_one_chunk_is_refused() {
    for command in ["stress", "info", "scan"] {
        assert_clean_failure(
            &host(&[command, "--heap-size", "100KiB"]),
            USAGE,
            "below the minimum",
        );
    }
}

#[test]
fn heap_above_the_largest_is_refused() {
    assert_clean_failure(&host(&["--heap-size", "1000GiB"]), USAGE, "above the limit");
}

#[test]
fn unparsable_heap_size_is_refused() {
    assert_clean_failure(&host(&["--heap-size", "lots"]), USAGE, "try 512MiB or 2GiB");
}

#[test]
fn unknown_workload_is_refused() {
    assert_clean_failure(
        &host(&["--workload", "teleport"]),
        USAGE,
        "invalid value 'teleport'",
    );
}

#[test]
fn unknown_flag_is_refused() {
    assert_clean_failure(&host(&["--turbo"]), USAGE, "unexpected argument '--turbo'");
}

#[test]
fn zero_threads_are_refused() {
    for command in ["stress", "bench", "scan", "grow"] {
        assert_clean_failure(&host(&[command, "--threads", "0"]), USAGE, "--threads");
    }
}

#[test]
fn zero_timeout_is_refused_by_every_subcommand() {
    for run in RUNS {
        let mut args = run.to_vec();
        args.extend(["--timeout", "0"]);
        assert_clean_failure(&host(&args), USAGE, "invalid value '0' for '--timeout");
    }
}

#[test]
fn timeout_above_a_day_is_refused() {
    assert_clean_failure(
        &host(&["--timeout", "86401"]),
        USAGE,
        "invalid value '86401' for '--timeout",
    );
}

/// Without a GPU: `host` alone. With one: a device that does not exist. Exit 3 and one line
/// either way.
#[test]
fn no_gpu_means_exit_3_with_one_line() {
    let o = if has_gpu() {
        host(&["--device", "999"])
    } else {
        host(&[])
    };
    let needle = if has_gpu() {
        "device 999 does not exist"
    } else {
        "no CUDA"
    };
    assert_clean_failure(&o, NO_GPU, needle);
    assert_one_line(&o);
}

#[test]
fn device_out_of_range_or_no_driver_exits_3_for_every_subcommand() {
    let needle = if has_gpu() {
        "device 999 does not exist"
    } else {
        "no CUDA"
    };
    for run in RUNS {
        let mut args = run.to_vec();
        args.extend(["--device", "999"]);
        let o = host(&args);
        assert_clean_failure(&o, NO_GPU, needle);
        assert_one_line(&o);
    }
}

#[test]
fn unparsable_grow_sizes_are_refused() {
    assert_clean_failure(
        &host(&["grow", "--initial", "lots"]),
        USAGE,
        "try 512MiB or 2GiB",
    );
    assert_clean_failure(&host(&["grow", "--max", "huge"]), USAGE, "--max <MAX>");
}

/// Refused before anything touches the GPU, so the same on every machine.
#[test]
fn grow_initial_above_max_is_refused() {
    assert_clean_failure(
        &host(&["grow", "--initial", "64MiB", "--max", "8MiB"]),
        USAGE,
        "--initial (67108864 B) must not be above --max (8388608 B)",
    );
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn info_runs_on_the_gpu() {
    succeeds_on_the_gpu("info", &["SMs", "heap:", "size classes", "heap check"]);
}

/// `host <subcommand> --device N` on the test GPU exits 0 and prints each of `words`; returns
/// its stdout.
fn succeeds_on_the_gpu(subcommand: &str, words: &[&str]) -> String {
    // Opened only to fail loudly without one; host opens its own.
    let (gpu, device) = gpu();
    drop(gpu);
    let o = host(&[subcommand, "--device", &device]);
    let out = stdout(&o);
    assert_eq!(
        o.status.code(),
        Some(SUCCESS),
        "stdout: {out}\nstderr: {}",
        stderr(&o)
    );
    for word in words {
        assert!(out.contains(word), "{word:?} missing from: {out}");
    }
    out
}

/// A heap that toga could make but this device cannot hold now: this test holds all but 2 GiB
/// of the device's free memory, then asks `host` for a 4 GiB heap.
#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn heap_above_free_device_memory_is_refused() {
    const GIB: u64 = 1 << 30;
    let (gpu, device) = gpu();
    let stream = gpu.default_stream();
    let mut held = Vec::new();
    for _ in 0..4096 {
        let free = gpu.free_memory().expect("free device memory");
        if free <= 2 * GIB {
            break;
        }
        let bytes = (free - 2 * GIB).min(GIB) as usize;
        held.push(
            stream
                .alloc_zeros::<u8>(bytes)
                .expect("holding device memory"),
        );
        stream.synchronize().expect("synchronize");
    }
    let free = gpu.free_memory().expect("free device memory");
    assert!(
        free <= 2 * GIB,
        "holding {} buffers left {free} B free",
        held.len()
    );
    let o = host(&["info", "--device", &device, "--heap-size", "4GiB"]);
    assert_clean_failure(&o, CUDA_ERROR, "free device memory");
    assert_one_line(&o);
    drop(held);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn grow_runs_and_verifies() {
    let out = succeeds_on_the_gpu("grow", &["round 3", "trim", "after trim", "growths"]);
    assert!(!out.contains('✗'), "{out}");
}

/// Two `host bench --csv` processes append to one file: the header once, then one row per cell
/// median of the main table (4 columns × 6 rows: 5 sizes and the mixed list) each, in the
/// report's format, their `--run-index` in the iteration column.
#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn bench_csv_appends_the_medians_of_each_process() {
    let (gpu, device) = gpu();
    drop(gpu);
    let file = std::env::temp_dir().join(format!("toga-cli-{}-variance.csv", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let path = file.to_string_lossy().into_owned();
    for index in ["0", "1"] {
        let o = host(&[
            "bench",
            "--device",
            &device,
            "--threads",
            "4096",
            "--csv",
            &path,
            "--run-index",
            index,
        ]);
        assert_eq!(o.status.code(), Some(SUCCESS), "stderr: {}", stderr(&o));
        assert!(
            stdout(&o).contains("16-4096"),
            "no mixed row: {}",
            stdout(&o)
        );
    }
    let text = std::fs::read_to_string(&file).expect("the CSV");
    std::fs::remove_file(&file).expect("removing the CSV");
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("scenario,allocator,size,threads,state,metric,iteration,ms,failed,device,rounds")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 2 * 24, "{text}");
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row.len(), 11, "{row:?}");
        assert_eq!(row[0], "v_variance");
        assert_eq!(row[3], "4096");
        assert_eq!(row[6], if i < 24 { "0" } else { "1" }, "{row:?}");
        assert!(row[7].parse::<f64>().is_ok_and(|ms| ms > 0.0), "{row:?}");
        assert_eq!(row[8], "0", "nulls: {row:?}");
    }
    let cells: Vec<String> = rows[..24]
        .iter()
        .map(|r| format!("{} {} {} {}", r[1], r[2], r[4], r[5]))
        .collect();
    for cell in [
        "toga 16 fresh malloc",
        "toga 16 warm malloc",
        "toga 16 fresh free",
        "bump 16 fresh malloc",
        "toga 16-4096 warm malloc",
        "bump 4096 fresh malloc",
    ] {
        assert!(cells.iter().any(|c| c == cell), "no {cell}: {cells:?}");
    }
}
