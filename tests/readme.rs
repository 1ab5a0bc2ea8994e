//! The README's "Use toga in your kernels" snippets are pieces of `examples/vec-kernel`, which
//! the workspace builds (its kernel crate for the host and, through its `build.rs`, to PTX). A
//! code block preceded by `<!-- from: PATH -->` must still be in that file:
//! - Rust and other text: the block, cut at lines that read `// ...`, is a list of pieces, and
//!   each piece must appear in the file verbatim, in order.
//! - TOML: every table of the block is in the file with the same keys and values, except that
//!   a dependency's `path` or `git` (where the user's copy of toga lives) is not compared, a
//!   list in the README may be part of the file's, and a dependency table lists every
//!   dependency of the file's.

use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const MARK: &str = "<!-- from: ";
const ELISION: &str = "// ...";

/// `(file, language, code)` for every marked block of the README.
fn marked_blocks(readme: &str) -> Vec<(String, String, String)> {
    let mut blocks = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        let Some(path) = line.strip_prefix(MARK).and_then(|l| l.strip_suffix(" -->")) else {
            continue;
        };
        let fence = lines.next().unwrap_or_default();
        let language = fence
            .strip_prefix("```")
            .unwrap_or_else(|| panic!("{path}: the marked line is not followed by a fence"));
        let code: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
        blocks.push((path.to_owned(), language.to_owned(), code.join("\n")));
    }
    blocks
}

/// Checks a Rust (or any non-TOML) block: each piece between elisions is in `file`, in order.
fn check_pieces(path: &str, code: &str, file: &str) -> Result<(), String> {
    let mut from = 0;
    for piece in code.split(&format!("\n{ELISION}\n")) {
        let piece = piece.trim_matches('\n');
        match file[from..].find(piece) {
            Some(at) => from += at + piece.len(),
            None => {
                return Err(format!(
                    "{path}: this piece is not in the file (in order):\n{piece}"
                ));
            }
        }
    }
    Ok(())
}

/// Checks a TOML block against the file, as the module docs say.
fn check_toml(path: &str, code: &str, file: &str) -> Result<(), String> {
    let ours: toml::Table = code
        .parse()
        .map_err(|e| format!("{path}: README block: {e}"))?;
    let theirs: toml::Table = file.parse().map_err(|e| format!("{path}: {e}"))?;
    for (name, table) in &ours {
        let (Some(table), Some(other)) = (
            table.as_table(),
            theirs.get(name).and_then(toml::Value::as_table),
        ) else {
            return Err(format!("{path}: [{name}] is not a table in both"));
        };
        if name.ends_with("dependencies") {
            let (a, b): (Vec<_>, Vec<_>) = (table.keys().collect(), other.keys().collect());
            if a != b {
                return Err(format!("{path}: [{name}] lists {a:?}, the file {b:?}"));
            }
        }
        for (key, value) in table {
            let other = &other[key];
            if !same(value, other) {
                return Err(format!(
                    "{path}: [{name}] {key} = {value} here, {other} in the file"
                ));
            }
        }
    }
    Ok(())
}

/// Whether a README value agrees with the file's: equal, a list that is part of the file's, or
/// a dependency whose keys other than `path` and `git` agree.
fn same(ours: &toml::Value, theirs: &toml::Value) -> bool {
    use toml::Value::{Array, Table};
    match (ours, theirs) {
        (Array(a), Array(b)) => a.iter().all(|x| b.contains(x)),
        (Table(a), Table(b)) => {
            let rest = |t: &toml::Table| {
                t.iter()
                    .filter(|(k, _)| *k != "path" && *k != "git")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<Vec<_>>()
            };
            rest(a) == rest(b)
        }
        (a, b) => a == b,
    }
}

fn check(path: &str, language: &str, code: &str) -> Result<(), String> {
    let file =
        std::fs::read_to_string(Path::new(ROOT).join(path)).map_err(|e| format!("{path}: {e}"))?;
    if language == "toml" {
        check_toml(path, code, &file)
    } else {
        check_pieces(path, code, &file)
    }
}

#[test]
fn the_readme_kernel_guide_is_the_example() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let blocks = marked_blocks(&readme);
    let files: Vec<&str> = blocks.iter().map(|b| b.0.as_str()).collect();
    for needed in [
        "rust-toolchain.toml",
        "examples/vec-kernel/device/Cargo.toml",
        "examples/vec-kernel/Cargo.toml",
        "examples/vec-kernel/device/src/lib.rs",
        "examples/vec-kernel/build.rs",
        "examples/vec-kernel/src/main.rs",
    ] {
        assert!(
            files.contains(&needed),
            "the README no longer shows {needed}"
        );
    }
    let wrong: Vec<String> = blocks
        .iter()
        .filter_map(|(path, language, code)| check(path, language, code).err())
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

#[test]
fn the_checker_sees_a_changed_snippet() {
    let lib = "examples/vec-kernel/device/src/lib.rs";
    assert!(check(lib, "rust", "#![no_std]").is_ok());
    assert!(check(lib, "rust", "#![no_std]\n// ...\nfn not_there() {}").is_err());
    // Pieces out of order are wrong too.
    assert!(check(lib, "rust", "mod kernels {\n// ...\n#![no_std]").is_err());
    let manifest = "examples/vec-kernel/Cargo.toml";
    assert!(check(manifest, "toml", "[dependencies]\ntoga = { path = \"x\" }").is_ok());
    assert!(
        check(
            manifest,
            "toml",
            "[dependencies]\ntoga = { path = \"x\", features = [\"a\"] }"
        )
        .is_err()
    );
    assert!(check(manifest, "toml", "[dependencies]\nserde = \"1\"").is_err());
}
