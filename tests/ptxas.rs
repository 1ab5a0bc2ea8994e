//! The embedded PTX must assemble with NVIDIA's `ptxas`, and must not use system-scope atomics or
//! fences (toga's heap is on one GPU; `.sys` scope is slower and never what the code means).
//!
//! `ptxas` comes from PyPI (`pip install nvidia-cuda-nvcc==13.0.88`, see `.ci/run`); set `PTXAS`
//! to use another. Without it the assembly test says so and passes. The per-kernel register and
//! spill report is written to `target/ptx/ptxas-<arch>.txt`.

use std::path::{Path, PathBuf};
use std::process::Command;

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

fn report_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("ptx")
}

#[test]
fn ptx_has_no_system_scope_atomics_or_fences() {
    let ptx = toga::KERNELS_PTX;
    for (n, line) in ptx.lines().enumerate() {
        let l = line.trim();
        let is_memory_op = l.starts_with("atom")
            || l.starts_with("red")
            || l.starts_with("fence")
            || l.starts_with("ld.acquire")
            || l.starts_with("st.release");
        assert!(
            !(is_memory_op && l.contains(".sys")),
            "line {}: system scope: {l}",
            n + 1
        );
        assert!(!l.starts_with("membar.sys"), "line {}: {l}", n + 1);
    }
    assert!(
        ptx.contains(".gpu"),
        "no .gpu-scoped operation at all: is this the right PTX?"
    );
}

#[test]
fn ptx_assembles_for_turing_and_hopper() {
    let Some(ptxas) = find_ptxas() else {
        eprintln!("skipped: ptxas not installed (pip install nvidia-cuda-nvcc==13.0.88)");
        return;
    };
    let dir = report_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("toga_kernels.check.ptx");
    std::fs::write(&src, toga::KERNELS_PTX).unwrap();
    // CUDA 13's ptxas no longer accepts sm_70; the module still targets sm_70 so that the driver
    // can JIT it for Volta. sm_75 is the oldest architecture CUDA 13 assembles.
    let mut archs = vec!["sm_75", "sm_90"];
    let probe = Command::new(&ptxas)
        .args(["-arch=sm_70", "--version"])
        .output()
        .unwrap();
    if probe.status.success() {
        archs.insert(0, "sm_70");
    }
    for arch in archs {
        let out = Command::new(&ptxas)
            .arg(format!("-arch={arch}"))
            .arg("-v")
            .arg(&src)
            .arg("-o")
            .arg("/dev/null")
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        std::fs::write(dir.join(format!("ptxas-{arch}.txt")), &log).unwrap();
        assert!(out.status.success(), "ptxas -arch={arch} failed:\n{log}");
        assert!(
            !log.contains("error"),
            "ptxas -arch={arch} reported an error:\n{log}"
        );
    }
}
