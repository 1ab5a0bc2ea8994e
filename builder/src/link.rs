//! Linker mode: what rustc's `llbc` linker flavor asks of a linker, done with LLVM's own tools.
//!
//! For a fat-LTO cdylib rustc passes one bitcode object (and `compiler_builtins`' rlib) with
//! `--export-symbol NAME … OBJ.o … --target-cpu sm_XX -o OUT.ptx`. We link the objects, keep only
//! the exported kernels public (`internalize` + `globaldce`), optimize, and lower to PTX with `llc`.

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::BuildError;

/// What rustc asked the linker to do.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LinkRequest {
    /// Bitcode objects to link in full.
    pub objects: Vec<PathBuf>,
    /// Archives (rlibs) whose members are linked only where needed.
    pub archives: Vec<PathBuf>,
    /// Symbols that stay public: the kernel entry points.
    pub exports: Vec<String>,
    /// `--target-cpu`, e.g. `sm_70`.
    pub cpu: Option<String>,
    /// `-o`.
    pub output: Option<PathBuf>,
}

impl LinkRequest {
    /// Parse the arguments of an `llbc`-flavor link line.
    pub fn parse(args: &[OsString]) -> Self {
        let mut req = Self::default();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let s = arg.to_string_lossy();
            match s.as_ref() {
                "--export-symbol" => {
                    if let Some(sym) = it.next() {
                        req.exports.push(sym.to_string_lossy().into_owned());
                    }
                }
                "--target-cpu" => req.cpu = it.next().map(|v| v.to_string_lossy().into_owned()),
                "-o" => req.output = it.next().map(PathBuf::from),
                "--target" | "-L" | "--linker-plugin-lto" => {
                    it.next();
                }
                _ if s.starts_with('-') => {}
                _ if s.ends_with(".rlib") || s.ends_with(".a") => req.archives.push(arg.into()),
                _ if s.ends_with(".o") || s.ends_with(".bc") => req.objects.push(arg.into()),
                _ => {}
            }
        }
        req
    }
}

/// Run the link described by rustc's arguments.
pub fn run(args: Vec<OsString>) -> Result<(), BuildError> {
    let req = LinkRequest::parse(&args);
    let bin = PathBuf::from(
        env::var_os("TOGA_PTX_LLVM_BIN").ok_or_else(|| BuildError::Io {
            path: "TOGA_PTX_LLVM_BIN".into(),
            error: std::io::Error::other("linker mode without TOGA_PTX_LLVM_BIN"),
        })?,
    );
    let output = req.output.clone().ok_or_else(|| BuildError::Io {
        path: "-o".into(),
        error: std::io::Error::other("no output path on the link line"),
    })?;
    let cpu = req
        .cpu
        .clone()
        .unwrap_or_else(|| crate::DEFAULT_ARCH.into());
    let ptx =
        env::var("TOGA_PTX_VERSION").unwrap_or_else(|_| crate::DEFAULT_PTX_VERSION.to_string());
    let work = output.with_extension("link");
    std::fs::create_dir_all(&work).map_err(|error| BuildError::Io {
        path: work.clone(),
        error,
    })?;

    let linked = work.join("linked.bc");
    let mut cmd = Command::new(bin.join("llvm-link"));
    cmd.args(&req.objects).arg("-o").arg(&linked);
    // Archive members only fill in symbols the kernels still need (compiler_builtins' helpers).
    let members = extract_archives(&bin, &req.archives, &work)?;
    if !members.is_empty() {
        cmd.arg("--only-needed").args(&members);
    }
    run_tool(&mut cmd, "llvm-link")?;

    let optimized = work.join("optimized.bc");
    run_tool(
        Command::new(bin.join("opt"))
            .arg(format!(
                "-internalize-public-api-list={}",
                req.exports.join(",")
            ))
            .arg("-passes=internalize,globaldce,default<O3>")
            .arg(&linked)
            .arg("-o")
            .arg(&optimized),
        "opt",
    )?;
    run_tool(
        Command::new(bin.join("llc"))
            .arg(format!("-mcpu={cpu}"))
            .arg(format!("-mattr=+ptx{ptx}"))
            .arg("-O3")
            .arg(&optimized)
            .arg("-o")
            .arg(&output),
        "llc",
    )?;
    // The register budget (budget.rs): kernels that call the allocator fit 1024-thread blocks.
    let io = |error| BuildError::Io {
        path: output.clone(),
        error,
    };
    let text = std::fs::read_to_string(&output).map_err(io)?;
    let (capped, _) = crate::budget::apply(&text, crate::budget::KERNEL_REGISTER_BUDGET);
    std::fs::write(&output, capped).map_err(io)
}

fn extract_archives(
    bin: &Path,
    archives: &[PathBuf],
    work: &Path,
) -> Result<Vec<PathBuf>, BuildError> {
    let mut members = Vec::new();
    for (i, archive) in archives.iter().enumerate() {
        let dir = work.join(format!("ar{i}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|error| BuildError::Io {
            path: dir.clone(),
            error,
        })?;
        run_tool(
            Command::new(bin.join("llvm-ar"))
                .arg("x")
                .arg(std::path::absolute(archive).unwrap_or(archive.clone()))
                .current_dir(&dir),
            "llvm-ar",
        )?;
        let entries = std::fs::read_dir(&dir).map_err(|error| BuildError::Io {
            path: dir.clone(),
            error,
        })?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "o"))
            .filter(|p| is_bitcode(p))
            .collect();
        found.sort();
        members.extend(found);
    }
    Ok(members)
}

fn is_bitcode(path: &Path) -> bool {
    std::fs::read(path).is_ok_and(|b| b.starts_with(b"BC\xC0\xDE"))
}

fn run_tool(cmd: &mut Command, tool: &str) -> Result<(), BuildError> {
    let status = cmd.status().map_err(|error| BuildError::Spawn {
        tool: tool.into(),
        error,
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(BuildError::Failed {
            tool: tool.into(),
            status,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_an_llbc_link_line() {
        let line = "--export-symbol k1 --export-symbol k2 /t/deps/x.x.rcgu.o /t/libcompiler_builtins-1.rlib \
                    --target nvptx64-nvidia-cuda --target-cpu sm_90 -L /t/deps -o /t/x.ptx -O3 --debug";
        let args: Vec<OsString> = line.split_whitespace().map(OsString::from).collect();
        let req = LinkRequest::parse(&args);
        assert_eq!(req.exports, ["k1", "k2"]);
        assert_eq!(req.objects, [PathBuf::from("/t/deps/x.x.rcgu.o")]);
        assert_eq!(
            req.archives,
            [PathBuf::from("/t/libcompiler_builtins-1.rlib")]
        );
        assert_eq!(req.cpu.as_deref(), Some("sm_90"));
        assert_eq!(req.output, Some(PathBuf::from("/t/x.ptx")));
    }
}
