//! Compile a `no_std` Rust kernel crate to PTX from a `build.rs`, with rustc's upstream
//! `nvptx64-nvidia-cuda` target.
//!
//! # Example
//!
//! The host crate's `build.rs`, for a kernel crate in its `device/` directory (with
//! `toga-builder` in the host crate's `[build-dependencies]`):
//!
//! ```no_run
//! fn main() {
//!     // Make the builder first: when rustc runs this script as the PTX linker, `new` does the
//!     // link and exits the process.
//!     let ptx = toga_builder::Builder::new("device")
//!         .build()
//!         .unwrap_or_else(|e| e.exit());
//!     // The host program embeds it with `include_str!(env!("MY_KERNELS_PTX"))`.
//!     println!("cargo::rustc-env=MY_KERNELS_PTX={}", ptx.display());
//! }
//! ```
//!
//! The kernel crate is plain `no_std` Rust whose `extern "ptx-kernel"` functions become the
//! PTX's entry points. It needs the `abi_ptx` feature (and `stdarch_nvptx` for
//! `core::arch::nvptx`'s thread indices) on the nvptx target only:
//!
//! ```ignore
//! #![no_std]
//! #![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, stdarch_nvptx))]
//!
//! #[cfg(target_arch = "nvptx64")]
//! #[unsafe(no_mangle)]
//! pub unsafe extern "ptx-kernel" fn add_one(x: *mut u32) {
//!     // SAFETY: the host passes one `u32`.
//!     unsafe { *x += 1 };
//! }
//! ```
//!
//! A kernel crate that depends on `toga-kernels` gets its `#[panic_handler]` from there (the
//! default `panic-handler` feature; a second one is an error, E0152). One that does not must
//! define it, on the nvptx target only. The README's "Use toga in your kernels" has a whole
//! project, which CI builds.
//!
//! # Requirements
//!
//! A nightly toolchain with the `rust-src` and `llvm-tools` components: a `rust-toolchain.toml`
//! at the workspace root with `channel = "nightly"` and
//! `components = ["rust-src", "llvm-tools"]` gives both. On any other toolchain
//! [`Builder::build`] fails with [`BuildError::NotNightly`], which says so. No CUDA toolkit is
//! needed.
//!
//! # How it works
//!
//! The target has no prebuilt `core` and no linker one can install, so this crate does both jobs:
//!
//! 1. it runs `cargo rustc --crate-type cdylib --target nvptx64-nvidia-cuda -Zbuild-std=core,alloc`
//!    on the kernel crate, with fat LTO and `panic=abort`, in a target directory of its own (so the
//!    inner cargo never waits on the lock of the outer build that runs the build script);
//! 2. rustc hands the linker one fat-LTO bitcode object; the "linker" is the build script itself,
//!    re-invoked in *linker mode*, which runs `llvm-link`, `opt` (internalize + O3) and `llc`
//!    from the `llvm-tools` rustup component and writes the PTX. Kernels are capped at 64
//!    registers a thread, so that each fits a 1024-thread block.
//!
//! # Environment
//! - `TOGA_PTX_ARCH` overrides the target architecture (default `sm_70`, which the driver JIT-compiles
//!   for any newer GPU; `sm_90` targets Hopper directly).
//! - `TOGA_PTX_TARGET_DIR` overrides where the inner builds go (default `<outer target>/ptx-build`);
//!   each crate and feature set still builds in a directory of its own under it.

// The crate doc shows a whole `build.rs`, whose `fn main` is the point.
#![allow(clippy::needless_doctest_main)]
#![warn(missing_docs)]

use std::env;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The rustc target this builder compiles for.
pub const TARGET: &str = "nvptx64-nvidia-cuda";
/// The architecture used when neither the API nor `TOGA_PTX_ARCH` names one.
pub const DEFAULT_ARCH: &str = "sm_70";
/// PTX ISA version written into the module: 7.8 (CUDA 11.8) has every instruction toga uses
/// (`nanosleep` needs 6.3, `atom.<sem>.<scope>` 6.0) and every driver from 520 on accepts it.
pub const DEFAULT_PTX_VERSION: u32 = 78;

/// Set in the inner cargo's environment; when present, the build script acts as the linker.
const LINKER_MODE_ENV: &str = "TOGA_PTX_LINKER_MODE";

/// Why a PTX build failed.
#[derive(Debug)]
pub enum BuildError {
    /// A tool could not be started at all (cargo, rustc, or an LLVM tool).
    Spawn {
        /// The program.
        tool: String,
        /// Why it could not start.
        error: std::io::Error,
    },
    /// A tool ran and failed; its own diagnostics went to stderr already.
    Failed {
        /// The program and what it built.
        tool: String,
        /// How it ended.
        status: std::process::ExitStatus,
    },
    /// `llvm-tools` is not installed for this toolchain.
    MissingLlvmTools(PathBuf),
    /// The toolchain is not a nightly: the nvptx target, `-Zbuild-std` and `abi_ptx` need one.
    NotNightly {
        /// `rustc -vV`'s `release:` line, such as `1.95.0`.
        release: String,
    },
    /// The build finished but left no PTX file where expected.
    NoOutput(PathBuf),
    /// Reading or writing a file failed.
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        error: std::io::Error,
    },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Spawn { tool, error } => write!(f, "could not run {tool}: {error}"),
            Self::Failed { tool, status } => {
                write!(
                    f,
                    "{tool} failed ({status}); its own messages are in this build script's output"
                )
            }
            Self::MissingLlvmTools(dir) => write!(
                f,
                "llvm-link/opt/llc not found in {}: the `llvm-tools` component is missing; add it to this build's toolchain with `rustup component add llvm-tools rust-src`, run in the workspace, or list both in its rust-toolchain.toml (components = [\"rust-src\", \"llvm-tools\"])",
                dir.display()
            ),
            Self::NotNightly { release } => write!(
                f,
                "rustc {release} is not a nightly: building kernels for nvptx needs nightly Rust. Put a rust-toolchain.toml at the workspace root with `[toolchain]`, `channel = \"nightly\"` and `components = [\"rust-src\", \"llvm-tools\"]` (rustup installs it on the next build)"
            ),
            Self::NoOutput(p) => write!(f, "the kernel build produced no PTX at {}", p.display()),
            Self::Io { path, error } => write!(f, "{}: {error}", path.display()),
        }
    }
}

impl std::error::Error for BuildError {}

impl BuildError {
    /// Report the error the way cargo shows build-script errors and exit with status 1.
    pub fn exit(self) -> ! {
        println!("cargo::error=toga-builder: {self}");
        eprintln!("toga-builder: {self}");
        std::process::exit(1)
    }
}

/// Builds one kernel crate to one PTX file.
#[derive(Clone, Debug)]
pub struct Builder {
    crate_dir: PathBuf,
    arch: Option<String>,
    ptx_version: u32,
    build_std: String,
    features: Vec<String>,
    copy_to: Option<PathBuf>,
}

impl Builder {
    /// A builder for the kernel crate at `crate_dir` (relative paths are taken from the calling
    /// package's manifest directory).
    ///
    /// If this process was started by rustc as the PTX linker, this performs the link and exits.
    pub fn new(crate_dir: impl AsRef<Path>) -> Self {
        if env::var_os(LINKER_MODE_ENV).is_some() {
            let code = match link::run(env::args_os().skip(1).collect()) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("toga-builder linker: {e}");
                    1
                }
            };
            std::process::exit(code);
        }
        let mut dir = crate_dir.as_ref().to_path_buf();
        if dir.is_relative()
            && let Some(manifest) = env::var_os("CARGO_MANIFEST_DIR")
        {
            dir = PathBuf::from(manifest).join(dir);
        }
        Self {
            crate_dir: dir,
            arch: None,
            ptx_version: DEFAULT_PTX_VERSION,
            build_std: "core,alloc".into(),
            features: Vec::new(),
            copy_to: None,
        }
    }

    /// Target architecture, such as `sm_70` or `sm_90`. `TOGA_PTX_ARCH` still wins when set.
    pub fn arch(mut self, arch: &str) -> Self {
        self.arch = Some(arch.to_owned());
        self
    }

    /// PTX ISA version times ten (78 means 7.8).
    pub fn ptx_version(mut self, version: u32) -> Self {
        self.ptx_version = version;
        self
    }

    /// Cargo features of the kernel crate to enable: one, or several separated by commas or
    /// spaces, as `cargo --features` takes them.
    pub fn feature(mut self, feature: &str) -> Self {
        self.features.push(feature.to_owned());
        self
    }

    /// Also copy the PTX into `dir`, where a person can read it.
    pub fn copy_to(mut self, dir: impl AsRef<Path>) -> Self {
        self.copy_to = Some(dir.as_ref().to_path_buf());
        self
    }

    /// The architecture this build will use.
    pub fn resolved_arch(&self) -> String {
        env::var("TOGA_PTX_ARCH")
            .ok()
            .filter(|s| !s.is_empty())
            .or_else(|| self.arch.clone())
            .unwrap_or_else(|| DEFAULT_ARCH.to_owned())
    }

    /// Compile the crate and return the path of the PTX file (inside `OUT_DIR` when run from a
    /// build script, else inside the inner target directory).
    pub fn build(self) -> Result<PathBuf, BuildError> {
        let arch = self.resolved_arch();
        let manifest = self.crate_dir.join("Cargo.toml");
        let in_build_script = env::var_os("OUT_DIR").is_some();
        if in_build_script {
            println!(
                "cargo::rerun-if-changed={}",
                self.crate_dir.join("src").display()
            );
            println!("cargo::rerun-if-changed={}", manifest.display());
            println!("cargo::rerun-if-env-changed=TOGA_PTX_ARCH");
            println!("cargo::rerun-if-env-changed=TOGA_PTX_TARGET_DIR");
        }
        let lib_name = crate_lib_name(&manifest)?;
        let target_dir = self.target_dir(&lib_name);
        check_nightly()?;
        let llvm_bin = llvm_tools_dir()?;
        let me = env::current_exe().map_err(|error| BuildError::Io {
            path: "current_exe".into(),
            error,
        })?;
        let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());

        let mut cmd = Command::new(&cargo);
        // Only what we set reaches the inner build: the outer build's flags, wrappers and
        // jobserver belong to a different target.
        for var in [
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_TARGET",
            "CARGO_MAKEFLAGS",
            "MAKEFLAGS",
            "MFLAGS",
            "RUSTC",
            "CARGO_PRIMARY_PACKAGE",
        ] {
            cmd.env_remove(var);
        }
        // The PTX ISA version is the linker's business (`llc -mattr=+ptxNN`): rustc's own
        // `+ptxNN` target feature is unstable and changes nothing in the bitcode we use.
        let rustflags = [format!("-Ctarget-cpu={arch}"), "-Cdebuginfo=0".to_owned()].join("\x1f");
        cmd.env("CARGO_ENCODED_RUSTFLAGS", rustflags)
            .env("CARGO_PROFILE_RELEASE_LTO", "fat")
            .env("CARGO_PROFILE_RELEASE_PANIC", "abort")
            .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
            .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "3")
            .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
            .env("CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS", "false")
            .env("CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS", "false")
            .env("CARGO_TARGET_NVPTX64_NVIDIA_CUDA_LINKER", &me)
            .env(LINKER_MODE_ENV, "1")
            .env("TOGA_PTX_LLVM_BIN", &llvm_bin)
            .env("TOGA_PTX_VERSION", self.ptx_version.to_string())
            .arg("rustc")
            .arg("--release")
            .arg("--lib")
            .arg("--crate-type")
            .arg("cdylib")
            .arg("--manifest-path")
            .arg(&manifest)
            .arg("--target")
            .arg(TARGET)
            .arg("--target-dir")
            .arg(&target_dir)
            .arg(format!("-Zbuild-std={}", self.build_std));
        if !self.features.is_empty() {
            cmd.arg("--features").arg(self.features.join(","));
        }
        let status = cmd.status().map_err(|error| BuildError::Spawn {
            tool: "cargo".into(),
            error,
        })?;
        if !status.success() {
            return Err(BuildError::Failed {
                tool: format!("cargo rustc --target {TARGET} ({})", manifest.display()),
                status,
            });
        }

        let built = target_dir
            .join(TARGET)
            .join("release")
            .join(format!("{lib_name}.ptx"));
        if !built.exists() {
            return Err(BuildError::NoOutput(built));
        }
        if in_build_script {
            // Every source the PTX was built from, path dependencies (toga-kernels) included:
            // the crate's own `src` alone would leave a stale PTX after a dependency changed.
            for source in dep_info_sources(&built.with_extension("d")) {
                println!("cargo::rerun-if-changed={}", source.display());
            }
        }
        let out_dir = env::var_os("OUT_DIR").map(PathBuf::from);
        let mut result = built.clone();
        if let Some(dir) = out_dir {
            result = dir.join(format!("{lib_name}.ptx"));
            copy(&built, &result)?;
        }
        if let Some(dir) = &self.copy_to {
            std::fs::create_dir_all(dir).map_err(|error| BuildError::Io {
                path: dir.clone(),
                error,
            })?;
            copy(&built, &dir.join(format!("{lib_name}.ptx")))?;
        }
        Ok(result)
    }

    /// The inner build's target directory: `<root>/<crate>[+feature...]` (see
    /// [`build_dir_name`]), where `<root>` is `TOGA_PTX_TARGET_DIR` when set, else
    /// `<outer target>/ptx-build`. Builds with different feature sets get directories of their
    /// own, so each also builds `core` once for itself (about 20 s); a shared one would leave
    /// only the last build's PTX at the path both read, and cargo may run two build scripts at
    /// once.
    fn target_dir(&self, lib_name: &str) -> PathBuf {
        let dir = build_dir_name(lib_name, &self.features);
        if let Some(root) = env::var_os("TOGA_PTX_TARGET_DIR") {
            return PathBuf::from(root).join(dir);
        }
        // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out.
        let root = match env::var_os("OUT_DIR") {
            Some(out) => {
                let out = PathBuf::from(out);
                out.ancestors()
                    .nth(4)
                    .map(|t| t.join("ptx-build"))
                    .unwrap_or_else(|| out.join("ptx-build"))
            }
            None => self.crate_dir.join("target").join("ptx-build"),
        };
        root.join(dir)
    }
}

/// The sources in a dep-info file (`target: a.rs b.rs ...`, spaces in paths escaped with `\`);
/// none when it cannot be read.
fn dep_info_sources(path: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let Some(line) = text.lines().next() else {
        return Vec::new();
    };
    let Some((_, deps)) = line.split_once(": ") else {
        return Vec::new();
    };
    let mut sources = Vec::new();
    let mut current = String::new();
    let mut chars = deps.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => current.extend(chars.next()),
            ' ' => {
                if !current.is_empty() {
                    sources.push(PathBuf::from(std::mem::take(&mut current)));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        sources.push(PathBuf::from(current));
    }
    sources
}

fn copy(from: &Path, to: &Path) -> Result<(), BuildError> {
    std::fs::copy(from, to)
        .map(|_| ())
        .map_err(|error| BuildError::Io {
            path: to.to_path_buf(),
            error,
        })
}

/// The library name cargo gives the crate: `[lib] name`, else the package name with `-` → `_`.
fn crate_lib_name(manifest: &Path) -> Result<String, BuildError> {
    let text = std::fs::read_to_string(manifest).map_err(|error| BuildError::Io {
        path: manifest.to_path_buf(),
        error,
    })?;
    lib_name_of(&text).map_err(|why| BuildError::Io {
        path: manifest.to_path_buf(),
        error: std::io::Error::other(why),
    })
}

/// [`crate_lib_name`] of a manifest's text.
fn lib_name_of(manifest: &str) -> Result<String, String> {
    let table: toml::Table = manifest.parse().map_err(|e| format!("not TOML: {e}"))?;
    let name = |section: &str| {
        table
            .get(section)
            .and_then(|s| s.get("name"))
            .and_then(toml::Value::as_str)
            .map(str::to_owned)
    };
    name("lib")
        .or_else(|| name("package").map(|n| n.replace('-', "_")))
        .ok_or_else(|| "no [package] name".to_owned())
}

/// The inner target directory's name for a crate built with `features`: one per crate and
/// feature set, in any order, so that two builds of one crate with different features (toga's
/// kernels, with and without `harness`) never overwrite each other's PTX.
///
/// Features given together (`"a,b"`, `"a b"`) count one by one, as cargo reads them. A byte
/// other than an ASCII letter, digit, `-` or `_` (the `/` of `dep/feature`, say) is written as
/// `%XX`, so that two different feature sets never share a name.
fn build_dir_name(lib_name: &str, features: &[String]) -> String {
    let mut features: Vec<&str> = features
        .iter()
        .flat_map(|f| f.split(|c: char| c == ',' || c.is_whitespace()))
        .filter(|f| !f.is_empty())
        .collect();
    features.sort_unstable();
    features.dedup();
    let mut name = lib_name.to_owned();
    for f in features {
        name.push('+');
        for b in f.bytes() {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                name.push(char::from(b));
            } else {
                name.push_str(&format!("%{b:02X}"));
            }
        }
    }
    name
}

/// `$(rustc --print sysroot)/lib/rustlib/<host>/bin`, where `llvm-tools` installs its binaries.
pub fn llvm_tools_dir() -> Result<PathBuf, BuildError> {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|error| BuildError::Spawn {
            tool: "rustc".into(),
            error,
        })?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let host = rustc_host(&rustc)?;
    let dir = sysroot.join("lib").join("rustlib").join(host).join("bin");
    if !dir.join("llc").exists() {
        return Err(BuildError::MissingLlvmTools(dir));
    }
    Ok(dir)
}

fn rustc_host(rustc: &OsString) -> Result<String, BuildError> {
    Ok(rustc_vv(rustc, "host")?.unwrap_or_else(|| "x86_64-unknown-linux-gnu".into()))
}

/// The value of `key: value` in `rustc -vV`'s output.
fn rustc_vv(rustc: &OsString, key: &str) -> Result<Option<String>, BuildError> {
    let out = Command::new(rustc)
        .arg("-vV")
        .output()
        .map_err(|error| BuildError::Spawn {
            tool: "rustc".into(),
            error,
        })?;
    let prefix = format!("{key}: ");
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()).map(str::to_owned)))
}

/// [`BuildError::NotNightly`] unless the build's rustc is a nightly (or a local build of rustc,
/// or a release told to act as one by `RUSTC_BOOTSTRAP`).
fn check_nightly() -> Result<(), BuildError> {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let release = rustc_vv(&rustc, "release")?.unwrap_or_default();
    let bootstrap = env::var_os("RUSTC_BOOTSTRAP").is_some_and(|v| !v.is_empty() && v != "0");
    if unstable_release(&release) || bootstrap {
        Ok(())
    } else {
        Err(BuildError::NotNightly { release })
    }
}

/// Whether a `release:` of `rustc -vV` allows unstable features: a nightly or a local build.
fn unstable_release(release: &str) -> bool {
    release.ends_with("-nightly") || release.ends_with("-dev")
}

mod budget;
mod link;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dep_info_lists_every_source_with_escaped_spaces() {
        let dir = std::env::temp_dir().join(format!("toga-builder-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let d = dir.join("x.d");
        std::fs::write(
            &d,
            "/t/x.ptx: /a/lib.rs /b/my\\ dir/m.rs /c/n.rs\n\n/a/lib.rs:\n",
        )
        .unwrap();
        assert_eq!(
            dep_info_sources(&d),
            ["/a/lib.rs", "/b/my dir/m.rs", "/c/n.rs"].map(PathBuf::from)
        );
        assert!(dep_info_sources(&dir.join("missing.d")).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_nightly_and_local_builds_count_as_nightly() {
        assert!(unstable_release("1.97.0-nightly"));
        assert!(unstable_release("1.97.0-dev"));
        assert!(!unstable_release("1.95.0"));
        assert!(!unstable_release("1.96.0-beta.3"));
        assert!(!unstable_release(""));
    }

    #[test]
    fn the_toolchain_errors_name_the_real_fix() {
        let stable = BuildError::NotNightly {
            release: "1.95.0".into(),
        }
        .to_string();
        assert!(stable.contains("rustc 1.95.0 is not a nightly"), "{stable}");
        assert!(stable.contains("channel = \"nightly\""), "{stable}");
        assert!(stable.contains("\"llvm-tools\""), "{stable}");
        // One line: cargo shows only the first line of a build script's `cargo::error`.
        assert_eq!(stable.lines().count(), 1, "{stable}");
        let tools = BuildError::MissingLlvmTools("/sysroot/bin".into()).to_string();
        assert!(tools.contains("rustup component add llvm-tools"), "{tools}");
        // Advice for another toolchain than the build's own changes nothing.
        assert!(!tools.contains("--toolchain"), "{tools}");
    }

    #[test]
    fn lib_names_come_from_real_toml() {
        let name = |text: &str| lib_name_of(text);
        assert_eq!(
            name("[package]\nname = \"my-kernels\""),
            Ok("my_kernels".into())
        );
        // What a hand-written parser got wrong: an inline comment, single quotes, spacing,
        // and a `name` key in another table.
        assert_eq!(
            name("[package]\nname = \"k\" # the kernels\n[dependencies]\nname = \"x\""),
            Ok("k".into())
        );
        assert_eq!(name("[package]\n  name='my-k'  "), Ok("my_k".into()));
        assert_eq!(
            name("[package]\nname = \"a-b\"\n\n[lib]\nname = \"custom_lib\"\ntest = false"),
            Ok("custom_lib".into())
        );
        assert_eq!(
            name("package = { name = \"inline-table\" }"),
            Ok("inline_table".into())
        );
        assert!(
            name("[lib]\ntest = false")
                .unwrap_err()
                .contains("no [package] name")
        );
        assert!(
            name("[package\nname = \"x\"")
                .unwrap_err()
                .contains("not TOML")
        );
    }

    #[test]
    fn each_feature_set_builds_in_its_own_directory() {
        let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(build_dir_name("toga_kernels", &[]), "toga_kernels");
        assert_eq!(
            build_dir_name("toga_kernels", &f(&["harness"])),
            "toga_kernels+harness"
        );
        assert_eq!(
            build_dir_name("k", &f(&["b", "a", "b"])),
            build_dir_name("k", &f(&["a", "b"]))
        );
        assert_ne!(build_dir_name("k", &f(&["a"])), build_dir_name("k", &[]));
        assert_eq!(build_dir_name("k", &f(&["dep/feat"])), "k+dep%2Ffeat");
        assert_ne!(
            build_dir_name("k", &f(&["dep/feat"])),
            build_dir_name("k", &f(&["dep_feat"]))
        );
        // Features given together are the same set as features given one by one.
        assert_eq!(
            build_dir_name("k", &f(&["b,a", " c"])),
            build_dir_name("k", &f(&["a", "b", "c"]))
        );
        assert_eq!(
            build_dir_name("k", &f(&["a b"])),
            build_dir_name("k", &f(&["b", "a"]))
        );
    }
}
