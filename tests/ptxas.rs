//! The harness PTX (toga's allocator with every test and workload kernel) must assemble with NVIDIA's `ptxas`, must not use system-scope atomics or
//! fences (toga's heap is on one GPU; `.sys` scope is slower and never what the code means), must
//! name the `.global` state space in every GPU-scoped atomic, load and store, and
//! every kernel that calls the allocator must launch with 1024-thread blocks: at most
//! [`MAX_REGISTERS`] registers per thread.
//!
//! `ptxas` comes from PyPI (`pip install nvidia-cuda-nvcc==13.0.88`, see `.ci/run`); set `PTXAS`
//! to use another. Without it the assembly tests fail, unless `TOGA_SKIP_PTXAS=1` is set: then they
//! print that they skipped and return (CI never sets it). ptxas's own report is written to
//! `target/ptx/ptxas-<arch>.txt`, and the table of registers, stack and spills per kernel to
//! `target/ptx/registers-<arch>.txt` (and printed).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Registers an SM gives one block (64 Ki 32-bit registers from Volta to Hopper).
const REGISTERS_PER_BLOCK: u32 = 64 * 1024;
/// The block size users launch: CUDA's largest.
const USER_BLOCK_THREADS: u32 = 1024;
/// The most registers a thread of a [`USER_BLOCK_THREADS`]-thread block can have; a kernel that
/// needs more fails to launch with `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`.
const MAX_REGISTERS: u32 = REGISTERS_PER_BLOCK / USER_BLOCK_THREADS;

/// toga's own entries that need not fit [`USER_BLOCK_THREADS`]-thread blocks: those that do not
/// call the allocator (litmus, layout, smoke) and those toga launches itself with its own block
/// size (heap init, bind, trim, the whole-heap probe and census). Every other `toga_*` entry
/// calls the allocator the way a user's kernel does and is checked; the baselines (`cuda_*`,
/// `bump_*`) are not toga's allocator and are not.
const NOT_USER_KERNELS: &[&str] = &[
    "toga_heap_init_nodes",
    "toga_heap_init_finish",
    "toga_heap_stock_arenas",
    "toga_bind_heap",
    "toga_trim",
    "toga_heap_probe",
    "toga_heap_census",
    "toga_layout",
    "toga_smoke",
];
/// Prefix of the platform litmus kernels (no allocator).
const LITMUS_PREFIX: &str = "toga_litmus_";
/// The kernels written as a user would (`kernels/src/entry/fit.rs`): checked, and they must be
/// there, or the check checks nothing.
const FIT_KERNELS: &[&str] = &[
    "toga_fit_malloc_free",
    "toga_fit_aligned",
    "toga_fit_vec",
    "toga_fit_cross_free",
];

/// Whether `kernel` calls the allocator as a user's kernel does, so must fit
/// [`USER_BLOCK_THREADS`]-thread blocks.
fn must_fit(kernel: &str) -> bool {
    kernel.starts_with("toga_")
        && !kernel.starts_with(LITMUS_PREFIX)
        && !NOT_USER_KERNELS.contains(&kernel)
}

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

/// What a test that needs ptxas does without it: fail with how to install it, or, with
/// `TOGA_SKIP_PTXAS=1` (an explicit opt-out that CI never sets), say that it skipped.
fn no_ptxas() {
    if std::env::var("TOGA_SKIP_PTXAS").as_deref() == Ok("1") {
        eprintln!("skipped: ptxas not found (TOGA_SKIP_PTXAS=1)");
        return;
    }
    panic!(
        "ptxas not found: install it with `python3 -m pip install nvidia-cuda-nvcc==13.0.88`, \
         set PTXAS to its path, or set TOGA_SKIP_PTXAS=1 to skip this test"
    );
}

fn report_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("ptx")
}

/// One `ptxas -v` run over the embedded PTX.
struct Assembly {
    arch: &'static str,
    succeeded: bool,
    /// What ptxas printed on stderr: errors, warnings and the `-v` report.
    log: String,
}

/// The embedded PTX assembled for every architecture this ptxas takes (each once per test
/// binary, in parallel), or `None` without ptxas.
fn assemblies() -> Option<&'static [Assembly]> {
    static RUNS: OnceLock<Option<Vec<Assembly>>> = OnceLock::new();
    RUNS.get_or_init(|| {
        let ptxas = find_ptxas()?;
        let dir = report_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("toga_kernels.check.ptx");
        std::fs::write(&src, toga_harness::HARNESS_PTX).unwrap();
        // CUDA 13's ptxas no longer accepts sm_70; the module still targets sm_70 so that the
        // driver can JIT it for Volta. sm_75 is the oldest architecture CUDA 13 assembles.
        let mut archs = vec!["sm_75", "sm_90"];
        let probe = Command::new(&ptxas)
            .args(["-arch=sm_70", "--version"])
            .output()
            .unwrap();
        if probe.status.success() {
            archs.insert(0, "sm_70");
        }
        let runs = std::thread::scope(|s| {
            let handles: Vec<_> = archs
                .into_iter()
                .map(|arch| {
                    let (ptxas, src) = (&ptxas, &src);
                    s.spawn(move || {
                        let out = Command::new(ptxas)
                            .arg(format!("-arch={arch}"))
                            .arg("-v")
                            .arg(src)
                            .arg("-o")
                            .arg("/dev/null")
                            .output()
                            .unwrap();
                        Assembly {
                            arch,
                            succeeded: out.status.success(),
                            log: String::from_utf8_lossy(&out.stderr).into_owned(),
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        for run in &runs {
            std::fs::write(dir.join(format!("ptxas-{}.txt", run.arch)), &run.log).unwrap();
        }
        Some(runs)
    })
    .as_deref()
}

/// One entry function's resources, as `ptxas -v` reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Usage {
    kernel: String,
    registers: Option<u32>,
    /// The entry's own stack frame, and the stack it needs with everything it calls.
    frame: u32,
    stack: u32,
    spill_stores: u32,
    spill_loads: u32,
}

/// The number just before `unit` in `line`: `("Used 40 registers", " registers")` gives 40.
fn number_before(line: &str, unit: &str) -> Option<u32> {
    let head = &line[..line.find(unit)?];
    head.rsplit([' ', ','])
        .find(|w| !w.is_empty())?
        .parse()
        .ok()
}

/// Every entry of a `ptxas -v` log, in its order. Per entry ptxas prints "Compiling entry
/// function 'NAME'", "Function properties for NAME" and its frame and spill line, "Used N
/// registers, …", then a properties block for each `.func` the entry calls: those name other
/// functions and are skipped.
fn parse_ptxas(log: &str) -> Vec<Usage> {
    let mut entries: Vec<Usage> = Vec::new();
    // Whether the last "Function properties" line named the entry being compiled.
    let mut own_properties = false;
    for line in log.lines() {
        if let Some((_, rest)) = line.split_once("Compiling entry function '") {
            let kernel = rest.split('\'').next().unwrap_or_default().to_owned();
            entries.push(Usage {
                kernel,
                ..Usage::default()
            });
        } else if let Some((_, name)) = line.split_once("Function properties for ") {
            own_properties = entries.last().is_some_and(|e| e.kernel == name.trim());
        } else if let Some(e) = entries.last_mut() {
            let n = |unit: &str| number_before(line, unit).unwrap_or_default();
            if own_properties && line.contains(" bytes stack frame") {
                e.frame = n(" bytes stack frame");
                e.spill_stores = n(" bytes spill stores");
                e.spill_loads = n(" bytes spill loads");
                own_properties = false;
            } else if line.contains("Used ") && e.registers.is_none() {
                e.registers = number_before(line, " registers");
                e.stack = n(" bytes cumulative stack size").max(e.frame);
            }
        }
    }
    entries
}

/// The table written to `registers-<arch>.txt`, one line per entry, by name.
fn usage_table(arch: &str, usage: &[Usage]) -> String {
    let mut rows: Vec<&Usage> = usage.iter().collect();
    rows.sort_by(|a, b| a.kernel.cmp(&b.kernel));
    let mut t = format!(
        "{:<28} {:<6} {:>9} {:>11} {:>11} {:>12} {:>11}  {USER_BLOCK_THREADS}-thread blocks\n",
        "kernel", "arch", "registers", "stack frame", "stack total", "spill stores", "spill loads"
    );
    for u in rows {
        let registers = u.registers.unwrap_or_default();
        let fits = if !must_fit(&u.kernel) {
            "not checked"
        } else if registers <= MAX_REGISTERS {
            "fit"
        } else {
            "DO NOT FIT"
        };
        writeln!(
            t,
            "{:<28} {arch:<6} {registers:>9} {:>11} {:>11} {:>12} {:>11}  {fits}",
            u.kernel, u.frame, u.stack, u.spill_stores, u.spill_loads
        )
        .unwrap();
    }
    t
}

/// The kernels of the PTX users load (`toga::KERNELS_PTX`): the host's heap management and
/// host allocation, and nothing of the harness (`kernels/src/entry/heap.rs`, `host_ops.rs`).
const USER_PTX_ENTRIES: &[&str] = &[
    "toga_sm_id_bound",
    "toga_heap_init_nodes",
    "toga_heap_init_finish",
    "toga_heap_stock_arenas",
    "toga_bind_heap",
    "toga_trim",
    "toga_heap_init_growable_finish",
    "toga_heap_add_range",
    "toga_heap_take_granules",
    "toga_heap_collect",
    "toga_heap_census",
    "toga_host_malloc",
    "toga_host_malloc_batch",
    "toga_host_free",
    "toga_host_free_batch",
];

/// The `.entry` names of a PTX module.
fn entries(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .map(|l| l.split(['(', ' ']).next().unwrap_or(l))
        .collect()
}

#[test]
fn the_users_ptx_holds_the_heap_kernels_and_no_harness() {
    let mut user = entries(toga::KERNELS_PTX);
    user.sort_unstable();
    let mut expected = USER_PTX_ENTRIES.to_vec();
    expected.sort_unstable();
    assert_eq!(user, expected, "toga::KERNELS_PTX's kernels");
    // The harness PTX is a superset: the same heap kernels plus its own.
    let harness = entries(toga_harness::HARNESS_PTX);
    for kernel in USER_PTX_ENTRIES {
        assert!(
            harness.contains(kernel),
            "{kernel} missing from the harness PTX"
        );
    }
    for kernel in ["toga_malloc", "toga_free", "cuda_malloc", "bump_malloc"] {
        assert!(
            harness.contains(&kernel),
            "{kernel} missing from the harness PTX"
        );
    }
}

#[test]
fn ptx_has_no_system_scope_atomics_or_fences() {
    // System scope belongs to the growth mailbox in mapped host memory, and only there: the
    // functions that talk to the host (`Heap::grow_on_demand` and its `grow_locked`, and
    // `toga_heap_collect`'s `collect_growth`, and the `consume_reply` they share), wherever
    // LLVM inlines them. Anywhere else it would be rustc's `core::sync::atomic` leaking in
    // (docs/toolchain.md).
    let ptx = toga_harness::HARNESS_PTX;
    let mut function = "";
    let mut mailbox_ops = 0;
    for (n, line) in ptx.lines().enumerate() {
        let l = line.trim();
        if l.contains(".entry") || l.contains(".func") {
            function = l;
        }
        let is_memory_op = l.starts_with("atom")
            || l.starts_with("red")
            || l.starts_with("fence")
            || l.starts_with("ld.")
            || l.starts_with("st.");
        if is_memory_op && l.contains(".sys") {
            let mailbox = [
                "grow_on_demand",
                "grow_locked",
                "consume_reply",
                "collect_growth",
                "toga_heap_collect",
            ]
            .iter()
            .any(|f| function.contains(f));
            assert!(mailbox, "line {}: system scope in {function}: {l}", n + 1);
            mailbox_ops += 1;
        }
        assert!(!l.starts_with("membar.sys"), "line {}: {l}", n + 1);
    }
    assert!(
        mailbox_ops > 0,
        "the growth mailbox lost its system-scope accesses"
    );
    assert!(
        ptx.contains(".gpu"),
        "no .gpu-scoped operation at all: is this the right PTX?"
    );
}

#[test]
fn gpu_scoped_atomics_name_the_global_state_space() {
    // A generic `atom` or `ld.acquire` (no state space) assembles to the access plus a
    // shared-memory loop and a local fallback behind a branch at every site: the allocator's
    // hot functions were 10-40% longer that way, and the churn bench 12% slower on an H100
    // (docs/toolchain.md). Every atomic word is in global memory, so every `.gpu`-scoped
    // atomic, load and store must say `.global`.
    let ptx = toga_harness::HARNESS_PTX;
    let mut checked = 0;
    for (n, line) in ptx.lines().enumerate() {
        let l = line.trim();
        let access = ["atom.", "red.", "ld.", "st."]
            .iter()
            .any(|op| l.starts_with(op));
        if access && l.contains(".gpu.") {
            assert!(
                l.contains(".global."),
                "line {}: a GPU-scoped access without `.global`: {l}",
                n + 1
            );
            checked += 1;
        }
    }
    assert!(
        checked > 100,
        "only {checked} GPU-scoped accesses: is this the right PTX?"
    );
}

#[test]
fn ptx_assembles_for_turing_and_hopper() {
    let Some(runs) = assemblies() else {
        return no_ptxas();
    };
    for run in runs {
        let (arch, log) = (run.arch, &run.log);
        assert!(run.succeeded, "ptxas -arch={arch} failed:\n{log}");
        assert!(
            !log.contains("error"),
            "ptxas -arch={arch} reported an error:\n{log}"
        );
    }
}

#[test]
fn allocating_kernels_fit_1024_thread_blocks() {
    let Some(runs) = assemblies() else {
        return no_ptxas();
    };
    let mut too_big = Vec::new();
    for run in runs {
        assert!(
            run.succeeded,
            "ptxas -arch={} failed:\n{}",
            run.arch, run.log
        );
        let usage = parse_ptxas(&run.log);
        let table = usage_table(run.arch, &usage);
        println!("{table}");
        std::fs::write(
            report_dir().join(format!("registers-{}.txt", run.arch)),
            &table,
        )
        .unwrap();
        for e in &usage {
            assert!(
                e.registers.is_some(),
                "no register count for {} on {} in ptxas's report",
                e.kernel,
                run.arch
            );
        }
        for &kernel in FIT_KERNELS {
            assert!(
                usage.iter().any(|e| e.kernel == kernel),
                "{kernel} is not in the PTX (kernels/src/entry/fit.rs, feature `harness`)"
            );
        }
        for e in usage.iter().filter(|e| must_fit(&e.kernel)) {
            let registers = e.registers.unwrap_or_default();
            if registers > MAX_REGISTERS {
                too_big.push(format!(
                    "{} on {}: {registers} registers ({} B stack, {} B spilled)",
                    e.kernel, run.arch, e.stack, e.spill_stores
                ));
            }
        }
    }
    assert!(
        too_big.is_empty(),
        "{} kernel builds need more than {MAX_REGISTERS} registers per thread, so a \
         {USER_BLOCK_THREADS}-thread block of them fails to launch (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES):\n  {}",
        too_big.len(),
        too_big.join("\n  ")
    );
}

/// A `ptxas -v` report for sm_75 as CUDA 13.0 prints it (mangled names shortened, and the
/// callee's frame and spills made non-zero so that taking them for the entry's would show).
const SAMPLE_LOG: &str = "\
ptxas info    : 8 bytes gmem, 24 bytes cmem[4]
ptxas info    : Compiling entry function 'toga_vec_push' for 'sm_75'
ptxas info    : Function properties for toga_vec_push
    400 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 400 bytes cumulative stack size, 372 bytes cmem[0], 8 bytes cmem[2]
ptxas info    : Compile time = 2845.075 ms
ptxas info    : Function properties for _RNvMs1_NtCshd2U8DeUYug_12toga_kernels6tbuddyNtB5_6TBuddy5alloc
    48 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads
ptxas info    : Function properties for _RNvNtCsbSE61zFgCyu_4core9panicking9panic_fmt
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'toga_smoke' for 'sm_75'
ptxas info    : Function properties for toga_smoke
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers, 372 bytes cmem[0]
ptxas info    : Compile time = 2.267 ms
ptxas info    : Compiling entry function 'toga_free' for 'sm_75'
ptxas info    : Function properties for toga_free
    240 bytes stack frame, 16 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 63 registers, used 0 barriers, 288 bytes cumulative stack size, 384 bytes cmem[0]
ptxas info    : Compile time = 230.351 ms
ptxas info    : Function properties for _RNvMs1_NtCshd2U8DeUYug_12toga_kernels6tbuddyNtB5_6TBuddy4free
    48 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads
";

#[test]
fn ptxas_report_parser_gives_each_entry_its_own_numbers() {
    let usage = |kernel: &str, registers, frame, stack, spill_stores, spill_loads| Usage {
        kernel: kernel.to_owned(),
        registers: Some(registers),
        frame,
        stack,
        spill_stores,
        spill_loads,
    };
    assert_eq!(
        parse_ptxas(SAMPLE_LOG),
        [
            usage("toga_vec_push", 255, 400, 400, 0, 0),
            usage("toga_smoke", 10, 0, 0, 0, 0),
            usage("toga_free", 63, 240, 288, 16, 4),
        ]
    );
    assert_eq!(number_before("Used 40 registers", " registers"), Some(40));
    assert_eq!(number_before("Used 40 registers", " bytes spill"), None);
}
