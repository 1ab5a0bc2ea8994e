//! The README's "Use toga in your kernels" is a user project: a directory tree (the code block
//! after `<!-- tree -->`) and the files in it (each code block after `<!-- file: PATH -->`).
//! These tests lay that project out as the README says, in a directory of the workspace's target
//! directory, with `toga/` a link to this checkout, and build it with cargo, as a user would. A
//! wrong path, a missing file or code that does not compile fails here, without a GPU.
//!
//! The build takes a few minutes the first time (it compiles `core` and `alloc` for the GPU,
//! twice); its target directory is kept under the workspace's, so later runs rebuild only what
//! changed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const TREE: &str = "<!-- tree -->";
const FILE: &str = "<!-- file: ";

/// The two tests that lay the project out share its directory: one at a time.
static SCRATCH: Mutex<()> = Mutex::new(());

/// What the README says the project is.
#[derive(Debug)]
struct Project {
    /// The paths in the tree, relative to its top directory; directories end with `/`.
    tree: Vec<String>,
    /// `(path, contents)` of each file block.
    files: Vec<(String, String)>,
}

/// The code block that starts on the line after `lines`' current one.
fn block<'a>(lines: &mut impl Iterator<Item = &'a str>, what: &str) -> Result<String, String> {
    let fence = lines.next().unwrap_or_default();
    if !fence.starts_with("```") {
        return Err(format!(
            "{what}: the marker is not followed by a code block"
        ));
    }
    let mut code = String::new();
    for line in lines.by_ref() {
        if line == "```" {
            return Ok(code);
        }
        code.push_str(line);
        code.push('\n');
    }
    Err(format!("{what}: the code block does not end"))
}

/// The paths of a tree drawn as `tree` draws it: one entry a line, four columns a level, a
/// directory's name ending with `/`, and text after two spaces a comment.
fn parse_tree(text: &str) -> Result<Vec<String>, String> {
    let mut stack: Vec<String> = Vec::new();
    let mut paths = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let chars: Vec<char> = line.chars().collect();
        let start = chars
            .iter()
            .position(|c| !matches!(c, ' ' | '│' | '├' | '└' | '─'))
            .ok_or_else(|| format!("tree: no name on the line {line:?}"))?;
        if start % 4 != 0 {
            return Err(format!("tree: {line:?} is not indented by levels of 4"));
        }
        let depth = start / 4;
        let rest: String = chars[start..].iter().collect();
        let name = rest.split("  ").next().unwrap_or_default().trim_end();
        if depth > stack.len() || (depth == 0 && !paths.is_empty()) {
            return Err(format!("tree: {line:?} has no parent directory"));
        }
        stack.truncate(depth);
        if let Some(parent) = stack.last()
            && !parent.ends_with('/')
        {
            return Err(format!("tree: {line:?} is inside the file {parent}"));
        }
        let path = format!("{}{name}", stack.last().map(String::as_str).unwrap_or(""));
        stack.push(path.clone());
        paths.push(path);
    }
    // Paths relative to the top directory, which is not itself an entry.
    let top = paths.first().cloned().ok_or("tree: empty")?;
    Ok(paths
        .iter()
        .skip(1)
        .map(|p| p[top.len()..].to_owned())
        .collect())
}

/// Reads the project out of the README's text.
fn project(readme: &str) -> Result<Project, String> {
    let mut tree = None;
    let mut files = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if line.trim() == TREE {
            if tree.is_some() {
                return Err("two trees".into());
            }
            tree = Some(parse_tree(&block(&mut lines, "tree")?)?);
        } else if let Some(rest) = line.trim().strip_prefix(FILE) {
            let path = rest
                .strip_suffix(" -->")
                .ok_or_else(|| format!("{line:?}: the marker does not end with ` -->`"))?;
            files.push((path.to_owned(), block(&mut lines, path)?));
        }
    }
    let tree = tree.ok_or("no `<!-- tree -->` block")?;
    let project = Project { tree, files };
    project.check()?;
    Ok(project)
}

impl Project {
    /// Every file of the tree has a block, and every block is a file of the tree, once.
    fn check(&self) -> Result<(), String> {
        let dirs: BTreeSet<&str> = self.tree.iter().map(String::as_str).collect();
        let in_tree: BTreeSet<&str> = self
            .tree
            .iter()
            .filter(|p| !p.ends_with('/'))
            .map(String::as_str)
            .collect();
        let mut shown = BTreeSet::new();
        for (path, _) in &self.files {
            if !shown.insert(path.as_str()) {
                return Err(format!("{path}: shown twice"));
            }
            if !in_tree.contains(path.as_str()) {
                return Err(format!("{path}: shown but not in the tree"));
            }
        }
        if let Some(missing) = in_tree.difference(&shown).next() {
            return Err(format!("{missing}: in the tree but never shown"));
        }
        if !dirs.contains("toga/") {
            return Err("the tree has no toga/ beside the project".into());
        }
        Ok(())
    }

    /// The directory that holds a `Cargo.toml` with a `[package]` and a `build.rs`: the host
    /// crate, where the README says to run cargo.
    fn host_crate(&self) -> Result<String, String> {
        let has = |p: &str| self.files.iter().any(|(path, _)| path == p);
        self.files
            .iter()
            .filter_map(|(path, _)| path.strip_suffix("Cargo.toml"))
            .find(|dir| has(&format!("{dir}build.rs")))
            .map(str::to_owned)
            .ok_or_else(|| "no directory with both a Cargo.toml and a build.rs".into())
    }

    /// Writes the project under `top`, with `toga/` a link to this checkout, and returns the
    /// host crate's directory.
    fn lay_out(&self, top: &Path) -> Result<PathBuf, String> {
        let io = |what: &Path, e: std::io::Error| format!("{}: {e}", what.display());
        let host = top.join(self.host_crate()?);
        // Whatever an older README left there goes, except the link.
        for entry in self
            .tree
            .iter()
            .filter(|p| p.ends_with('/') && p.matches('/').count() == 1)
        {
            let dir = top.join(entry);
            if entry != "toga/" && dir.exists() {
                std::fs::remove_dir_all(&dir).map_err(|e| io(&dir, e))?;
            }
        }
        for path in self
            .tree
            .iter()
            .filter(|p| p.ends_with('/') && *p != "toga/")
        {
            let dir = top.join(path);
            std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
        }
        for (path, code) in &self.files {
            let file = top.join(path);
            std::fs::write(&file, code).map_err(|e| io(&file, e))?;
        }
        let toga = top.join("toga");
        if std::fs::read_link(&toga).ok().as_deref() != Some(Path::new(ROOT)) {
            let _ = std::fs::remove_file(&toga);
            std::os::unix::fs::symlink(ROOT, &toga).map_err(|e| io(&toga, e))?;
        }
        // This checkout's lock file, so that the build needs no registry look-up and uses the
        // versions toga is tested with; cargo drops what the project does not use.
        let lock = host.join("Cargo.lock");
        std::fs::copy(Path::new(ROOT).join("Cargo.lock"), &lock).map_err(|e| io(&lock, e))?;
        Ok(host)
    }
}

fn readme() -> String {
    std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README.md")
}

/// Where the project is laid out and built: under the workspace's target directory, the same
/// place each run, so that its own target directory is reused.
fn scratch() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme")
}

/// `cargo <args>` in `dir`, as a user runs it there: the README's `rust-toolchain.toml` picks
/// the toolchain, not the one running these tests.
fn user_cargo(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(dir)
        .args(args)
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("RUSTDOC")
        .env_remove("CARGO_BUILD_TARGET")
        .env("CARGO_TARGET_DIR", scratch().join("target"));
    cmd
}

#[test]
fn the_readme_project_builds_as_laid_out() {
    let _one = SCRATCH.lock().unwrap_or_else(|e| e.into_inner());
    let project = project(&readme()).unwrap_or_else(|e| panic!("README.md: {e}"));
    let host = project
        .lay_out(&scratch().join("work"))
        .unwrap_or_else(|e| panic!("laying out the README's project: {e}"));
    let status = user_cargo(&host, &["build"])
        .status()
        .expect("cargo could not be started");
    assert!(
        status.success(),
        "the README's project in {} does not build ({status}); cargo's messages are above",
        host.display()
    );
}

/// Runs the project the first test built: on a GPU, it must print that no thread ran out of
/// memory and exit 0.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_readme_project_runs_on_a_gpu() {
    let _one = SCRATCH.lock().unwrap_or_else(|e| e.into_inner());
    let project = project(&readme()).unwrap_or_else(|e| panic!("README.md: {e}"));
    let host = project
        .lay_out(&scratch().join("work"))
        .unwrap_or_else(|e| panic!("laying out the README's project: {e}"));
    let out = user_cargo(&host, &["run"])
        .output()
        .expect("cargo could not be started");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}: {}\n{stdout}\n{}",
        host.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(" threads, 0 out of memory;"), "{stdout}");
}

#[test]
fn the_tree_parser_reads_paths_and_rejects_bad_trees() {
    let tree = "top/\n├── a/  a comment\n│   └── f.rs\n└── b/\n    ├── Cargo.toml\n    └── src/\n        └── lib.rs\n";
    assert_eq!(
        parse_tree(tree).unwrap(),
        [
            "a/",
            "a/f.rs",
            "b/",
            "b/Cargo.toml",
            "b/src/",
            "b/src/lib.rs"
        ]
    );
    assert!(parse_tree("top/\n  ├── a\n").is_err(), "odd indentation");
    assert!(
        parse_tree("top/\n└── f.rs\n    └── g.rs\n").is_err(),
        "inside a file"
    );
    assert!(parse_tree("top/\n        └── deep\n").is_err(), "no parent");
    assert!(parse_tree("").is_err());
}

#[test]
fn the_project_check_sees_missing_and_extra_files() {
    let readme = |files: &str| {
        format!(
            "{TREE}\n```text\nw/\n├── toga/\n└── app/\n    ├── Cargo.toml\n    └── build.rs\n```\n{files}"
        )
    };
    let file = |path: &str| format!("{FILE}{path} -->\n```toml\nx\n```\n");
    let both = format!("{}{}", file("app/Cargo.toml"), file("app/build.rs"));
    let p = project(&readme(&both)).unwrap();
    assert_eq!(p.host_crate().unwrap(), "app/");
    let missing = project(&readme(&file("app/Cargo.toml"))).unwrap_err();
    assert!(
        missing.contains("app/build.rs: in the tree but never shown"),
        "{missing}"
    );
    let extra = project(&readme(&format!("{both}{}", file("app/x.rs")))).unwrap_err();
    assert!(
        extra.contains("app/x.rs: shown but not in the tree"),
        "{extra}"
    );
    let twice = project(&readme(&format!("{both}{}", file("app/build.rs")))).unwrap_err();
    assert!(twice.contains("shown twice"), "{twice}");
    assert!(project("no tree here").is_err());
}
