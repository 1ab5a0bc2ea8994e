//! The example's own kernels must launch with 1024-thread blocks, CUDA's largest, as users launch
//! theirs: at most [`MAX_REGISTERS`] registers per thread, checked by assembling the example's PTX
//! (which holds toga's allocator too) with NVIDIA's `ptxas`. toga's own entries in the module
//! (`toga_*`: heap init, bind, trim) are launched by toga with its own block size and only listed.
//!
//! `ptxas` comes from PyPI (`pip install nvidia-cuda-nvcc==13.0.88`, see `.ci/run`); set `PTXAS`
//! to use another. Without it the test fails, unless `TOGA_SKIP_PTXAS=1` is set: then it prints
//! that it skipped and returns (CI never sets it). The register table is printed and
//! written to `target/ptx/vec-kernel-registers-<arch>.txt`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The example's PTX, as `build.rs` wrote it.
const PTX_PATH: &str = env!("VEC_KERNEL_PTX");
/// Registers an SM gives one block (64 Ki 32-bit registers from Volta to Hopper).
const REGISTERS_PER_BLOCK: u32 = 64 * 1024;
/// The block size users launch: CUDA's largest.
const USER_BLOCK_THREADS: u32 = 1024;
/// The most registers a thread of a [`USER_BLOCK_THREADS`]-thread block can have.
const MAX_REGISTERS: u32 = REGISTERS_PER_BLOCK / USER_BLOCK_THREADS;
/// Architectures to assemble for: the oldest CUDA 13's ptxas takes, and Hopper.
const ARCHS: [&str; 2] = ["sm_75", "sm_90"];
/// The prefix of toga's own entries, which toga launches itself.
const TOGA_PREFIX: &str = "toga_";

/// `ptxas` from `PTXAS`, the `PATH`, or the `nvidia-cuda-nvcc` wheel of `python3`
/// (as toga's `tests/ptxas.rs` finds it).
fn find_ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PTXAS") {
        return Some(p.into());
    }
    if Command::new("ptxas")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Some("ptxas".into());
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .ok()?;
    let site = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let p = site.join("nvidia/cu13/bin/ptxas");
    p.exists().then_some(p)
}

/// `(entry, registers)` for every entry of a `ptxas -v` log: the "Used N registers" line that
/// follows each "Compiling entry function 'NAME'" line (the `.func` properties ptxas prints
/// after it carry no register count). A short version of the parser in toga's `tests/ptxas.rs`.
fn registers_per_entry(log: &str) -> Vec<(String, Option<u32>)> {
    let mut entries: Vec<(String, Option<u32>)> = Vec::new();
    for line in log.lines() {
        if let Some((_, rest)) = line.split_once("Compiling entry function '") {
            entries.push((rest.split('\'').next().unwrap_or_default().to_owned(), None));
        } else if let (Some((_, used)), Some((_, registers @ None))) =
            (line.split_once("Used "), entries.last_mut())
        {
            *registers = used.split_whitespace().next().and_then(|n| n.parse().ok());
        }
    }
    entries
}

#[test]
fn user_kernels_fit_1024_thread_blocks() {
    let Some(ptxas) = find_ptxas() else {
        if std::env::var("TOGA_SKIP_PTXAS").as_deref() == Ok("1") {
            eprintln!("skipped: ptxas not found (TOGA_SKIP_PTXAS=1)");
            return;
        }
        panic!(
            "ptxas not found: install it with `python3 -m pip install nvidia-cuda-nvcc==13.0.88`, \
             set PTXAS to its path, or set TOGA_SKIP_PTXAS=1 to skip this test"
        );
    };
    // CARGO_TARGET_TMPDIR is `<target>/tmp`; toga's reports are in `<target>/ptx`.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../ptx");
    std::fs::create_dir_all(&dir).unwrap();
    let mut too_big = Vec::new();
    for arch in ARCHS {
        let out = Command::new(&ptxas)
            .arg(format!("-arch={arch}"))
            .arg("-v")
            .arg(PTX_PATH)
            .arg("-o")
            .arg("/dev/null")
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "ptxas -arch={arch} failed:\n{log}");
        let entries = registers_per_entry(&log);
        assert!(
            entries.iter().any(|(k, _)| !k.starts_with(TOGA_PREFIX)),
            "no kernel of the example in ptxas's report:\n{log}"
        );
        let mut table = format!(
            "{:<24} {:<6} {:>9}  {USER_BLOCK_THREADS}-thread blocks\n",
            "kernel", "arch", "registers"
        );
        for (kernel, registers) in &entries {
            let Some(registers) = *registers else {
                panic!("no register count for {kernel} on {arch}:\n{log}");
            };
            let fits = if kernel.starts_with(TOGA_PREFIX) {
                "not checked (toga's)"
            } else if registers <= MAX_REGISTERS {
                "fit"
            } else {
                too_big.push(format!("{kernel} on {arch}: {registers} registers"));
                "DO NOT FIT"
            };
            table += &format!("{kernel:<24} {arch:<6} {registers:>9}  {fits}\n");
        }
        println!("{table}");
        std::fs::write(dir.join(format!("vec-kernel-registers-{arch}.txt")), &table).unwrap();
    }
    assert!(
        too_big.is_empty(),
        "the example's kernels need more than {MAX_REGISTERS} registers per thread, so a \
         {USER_BLOCK_THREADS}-thread block of them fails to launch:\n  {}",
        too_big.join("\n  ")
    );
}

#[test]
fn register_parser_skips_called_functions() {
    let log = "\
ptxas info    : Compiling entry function 'grow_vectors' for 'sm_90'
ptxas info    : Function properties for grow_vectors
    400 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 400 bytes cumulative stack size
ptxas info    : Function properties for _RNvMs1_NtCshd2U8DeUYug_12toga_kernels6tbuddyNtB5_6TBuddy5alloc
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'toga_bind_heap' for 'sm_90'
ptxas info    : Function properties for toga_bind_heap
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
";
    assert_eq!(
        registers_per_entry(log),
        [
            ("grow_vectors".to_owned(), Some(255)),
            ("toga_bind_heap".to_owned(), Some(8)),
        ]
    );
}
