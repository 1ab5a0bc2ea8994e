//! The register budget: every kernel that calls into toga's allocator gets `.maxnreg 64`, so
//! that it launches with 1024-thread blocks (65,536 registers per SM / 1,024 threads).
//!
//! ptxas allocates registers over a kernel's whole call graph and a function call keeps the
//! caller's live values in registers of their own, so the allocator's deepest path (a `malloc`
//! that refills a bin from a new chunk of the buddy tree) would set the price of every kernel
//! that calls `malloc` at all. The hot paths are written to fit far below the budget (no spill
//! there, `tests/ptxas.rs` checks it); the directive makes ptxas keep the rare refill paths
//! within it too, spilling there if it must. A kernel that sets its own `.maxnreg`,
//! `.maxntid` or `.minnctapersm` is left alone, and so is one that never calls the allocator.

use std::collections::{HashMap, HashSet};

/// Registers per thread that a 1024-thread block allows on sm_70–sm_90.
pub const KERNEL_REGISTER_BUDGET: u32 = 64;

/// Whether a function belongs to toga's allocator (its mangled name names the crate).
fn is_allocator(name: &str) -> bool {
    name.contains("12toga_kernels")
}

/// A function or kernel of the module: its name, whether it is a kernel, where its header ends
/// (the line index of its closing `)`), and the functions it calls.
struct Def {
    name: String,
    entry: bool,
    header_end: usize,
    tuned: bool,
    calls: Vec<String>,
}

/// The name a definition line declares (`.visible .entry NAME(` or `.func (...) NAME(`).
fn declared_name(line: &str) -> Option<&str> {
    let line = line.trim_end().strip_suffix("()").unwrap_or(line);
    let open = line.rfind('(').unwrap_or(line.len());
    let head = line[..open].trim_end();
    head.rsplit(|c: char| c.is_whitespace() || c == ')').next()
}

/// The function a `call` line calls.
fn callee(line: &str) -> Option<&str> {
    let rest = line.trim_start().strip_prefix("call")?;
    let rest = rest.split_once(|c: char| c.is_whitespace())?.1.trim_start();
    let rest = match rest.strip_prefix('(') {
        Some(r) => r.split_once("),")?.1.trim_start(),
        None => rest,
    };
    rest.split(|c: char| c == ',' || c == ';' || c.is_whitespace())
        .next()
        .filter(|s| !s.is_empty())
}

fn parse(lines: &[&str]) -> Vec<Def> {
    let mut defs: Vec<Def> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let is_def = (line.starts_with(".visible .entry")
            || line.starts_with(".entry")
            || line.starts_with(".func")
            || line.starts_with(".visible .func"))
            && (line.trim_end().ends_with('(') || line.trim_end().ends_with("()"));
        if !is_def {
            i += 1;
            continue;
        }
        let name = declared_name(line).unwrap_or_default().to_string();
        let entry = line.contains(".entry");
        // The parameter list ends at a line starting with `)`; the body follows (a prototype,
        // ended by `;`, has none).
        let mut j = i;
        if line.trim_end().ends_with('(') {
            j += 1;
            while j < lines.len() && !lines[j].starts_with(')') {
                j += 1;
            }
        }
        let header_end = j;
        let mut k = j + 1;
        let mut tuned = false;
        while k < lines.len() && !lines[k].starts_with('{') && !lines[k].trim_end().ends_with(';') {
            let t = lines[k].trim_start();
            tuned |= t.starts_with(".maxnreg") || t.starts_with(".maxntid");
            tuned |= t.starts_with(".minnctapersm") || t.starts_with(".reqntid");
            k += 1;
        }
        if k >= lines.len() || !lines[k].starts_with('{') {
            i = k + 1;
            continue;
        }
        let mut calls = Vec::new();
        let mut end = k + 1;
        while end < lines.len() && !lines[end].starts_with('}') {
            if let Some(c) = callee(lines[end]) {
                calls.push(c.to_string());
            }
            end += 1;
        }
        defs.push(Def {
            name,
            entry,
            header_end,
            tuned,
            calls,
        });
        i = end + 1;
    }
    defs
}

/// `ptx` with `.maxnreg budget` added to every kernel that reaches an allocator function
/// and sets no launch bound of its own. Returns the new text and the kernels it capped.
pub fn apply(ptx: &str, budget: u32) -> (String, Vec<String>) {
    let lines: Vec<&str> = ptx.lines().collect();
    let defs = parse(&lines);
    let graph: HashMap<&str, &Vec<String>> =
        defs.iter().map(|d| (d.name.as_str(), &d.calls)).collect();
    let reaches_allocator = |start: &str| {
        let mut seen = HashSet::new();
        let mut stack = vec![start.to_string()];
        while let Some(f) = stack.pop() {
            if !seen.insert(f.clone()) {
                continue;
            }
            if f != start && is_allocator(&f) {
                return true;
            }
            if let Some(calls) = graph.get(f.as_str()) {
                stack.extend(calls.iter().cloned());
            }
        }
        false
    };
    let mut capped = Vec::new();
    let mut after = HashSet::new();
    for d in &defs {
        if d.entry && !d.tuned && reaches_allocator(&d.name) {
            after.insert(d.header_end);
            capped.push(d.name.clone());
        }
    }
    let mut out = String::with_capacity(ptx.len() + capped.len() * 16);
    for (n, line) in lines.iter().enumerate() {
        out.push_str(line);
        out.push('\n');
        if after.contains(&n) {
            out.push_str(&format!(".maxnreg {budget}\n"));
        }
    }
    (out, capped)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
.func  (.param .b64 func_retval0) _RNv12toga_kernels4heap6malloc(
\t.param .b64 p0
)
{
\tret;
}
.func _RNv4core9panicking9panic_fmt()
{
\tret;
}
.visible .entry user_kernel(
\t.param .u64 user_kernel_param_0
)
{
\t{ // callseq 0, 0
\tcall.uni (retval0), _RNv12toga_kernels4heap6malloc, (param0);
\t} // callseq 0
\tret;
}
.visible .entry tuned(
\t.param .u64 tuned_param_0
)
.maxntid 256, 1, 1
{
\tcall.uni (retval0), _RNv12toga_kernels4heap6malloc, (param0);
\tret;
}
.visible .entry plain()
{
\tcall.uni _RNv4core9panicking9panic_fmt, ();
\tret;
}
.visible .entry no_params()
{
\tcall.uni (retval0), _RNv12toga_kernels4heap6malloc, (param0);
\tret;
}
";

    #[test]
    fn caps_only_untuned_kernels_that_reach_the_allocator() {
        let (out, capped) = apply(SAMPLE, 64);
        assert_eq!(capped, vec!["user_kernel".to_string(), "no_params".into()]);
        assert!(
            out.contains("user_kernel_param_0\n)\n.maxnreg 64\n{"),
            "{out}"
        );
        assert!(out.contains("no_params()\n.maxnreg 64\n{"), "{out}");
        assert_eq!(out.matches(".maxnreg").count(), 2);
        assert_eq!(callee("\tcall.uni (retval0), f_x, (param0);"), Some("f_x"));
        assert_eq!(callee("\tcall.uni g, ();"), Some("g"));
    }
}
