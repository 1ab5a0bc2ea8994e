//! A user's PTX is rebuilt when a path dependency of the kernel crate changes, and only then.
//!
//! Builds a throwaway project the way a user's looks: a `no_std` library `dep`, a kernel crate
//! `kern` that depends on it by path, and a host crate `user` whose `build.rs` compiles `kern`
//! with this builder and embeds the PTX (its binary prints it). Then it changes only `dep`'s
//! source. Needs the nightly toolchain with `rust-src` and `llvm-tools` (`.ci/run` installs
//! them); without them the build fails and so does the test, saying why. Takes about a minute.

use std::path::{Path, PathBuf};
use std::process::Command;

const TOGA: &str = env!("CARGO_MANIFEST_DIR");

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The three crates, with `dep::MAGIC = magic`.
fn project(root: &Path, magic: u32) {
    let toolchain = Path::new(TOGA).join("../rust-toolchain.toml");
    std::fs::copy(toolchain, root.join("rust-toolchain.toml")).unwrap();
    write(
        &root.join("dep/Cargo.toml"),
        "[package]\nname = \"dep\"\nversion = \"0.1.0\"\nedition = \"2024\"\n",
    );
    set_magic(root, magic);
    write(
        &root.join("kern/Cargo.toml"),
        "[package]\nname = \"kern\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
         [dependencies]\ndep = { path = \"../dep\" }\n",
    );
    write(
        &root.join("kern/src/lib.rs"),
        r#"#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// # Safety
/// `out` is a device pointer to one `u32`.
#[cfg(target_arch = "nvptx64")]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn write_magic(out: *mut u32) {
    unsafe { out.write_volatile(dep::MAGIC) }
}
"#,
    );
    // toga's lock file pins the builder's dependencies to the versions toga builds with, which
    // its own build has already downloaded.
    std::fs::create_dir_all(root.join("user")).unwrap();
    std::fs::copy(
        Path::new(TOGA).join("../Cargo.lock"),
        root.join("user/Cargo.lock"),
    )
    .unwrap();
    let builder = Path::new(TOGA).display().to_string();
    write(
        &root.join("user/Cargo.toml"),
        &format!(
            "[package]\nname = \"user\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
             [build-dependencies]\ntoga-builder = {{ path = {builder:?} }}\n"
        ),
    );
    write(
        &root.join("user/build.rs"),
        "fn main() {\n    let ptx = toga_builder::Builder::new(\"../kern\").build().unwrap_or_else(|e| e.exit());\n    \
         println!(\"cargo::rustc-env=KERN_PTX={}\", ptx.display());\n}\n",
    );
    write(
        &root.join("user/src/main.rs"),
        "fn main() {\n    print!(\"{}\", include_str!(env!(\"KERN_PTX\")));\n}\n",
    );
}

fn set_magic(root: &Path, magic: u32) {
    write(
        &root.join("dep/src/lib.rs"),
        &format!("#![no_std]\n/// What the kernel writes.\npub const MAGIC: u32 = {magic};\n"),
    );
}

/// `cargo run` of the user crate, as a fresh shell would: none of the outer `cargo test`'s
/// build settings. Returns the PTX it prints and cargo's messages.
fn run_user(root: &Path) -> (String, String) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_TARGET",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
        "RUSTC",
        "RUSTDOC",
        "TOGA_PTX_TARGET_DIR",
        "TOGA_PTX_ARCH",
    ] {
        cmd.env_remove(var);
    }
    let out = cmd
        .current_dir(root.join("user"))
        .env("CARGO_TARGET_DIR", root.join("target"))
        .args(["run", "--quiet"])
        .output()
        .expect("running cargo");
    let messages = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "building the user crate failed (is the nightly toolchain there, with rust-src and \
         llvm-tools?):\n{messages}"
    );
    (String::from_utf8_lossy(&out.stdout).into_owned(), messages)
}

/// The PTX's `write_magic` stores this constant (ptx prints it in decimal).
fn stores(ptx: &str, magic: u32) -> bool {
    ptx.contains(".entry write_magic") && ptx.contains(&format!(", {magic};"))
}

#[test]
fn a_change_to_a_dependency_of_the_kernel_crate_rebuilds_the_ptx() {
    let tmp = tempfile::tempdir().unwrap();
    let root: PathBuf = tmp.path().into();
    project(&root, 1111);

    let (ptx, _) = run_user(&root);
    assert!(stores(&ptx, 1111), "the first build's PTX:\n{ptx}");

    // Only the dependency changes: the kernel crate's own sources and manifest do not.
    set_magic(&root, 2222);
    let (ptx, _) = run_user(&root);
    assert!(
        stores(&ptx, 2222) && !stores(&ptx, 1111),
        "the PTX is stale after dep/src/lib.rs changed:\n{ptx}"
    );

    // Nothing changed: the build script does not run again.
    let ptx_file = root.join("target/ptx-build");
    let before = newest_mtime(&ptx_file);
    let (ptx, _) = run_user(&root);
    assert!(stores(&ptx, 2222));
    assert_eq!(
        newest_mtime(&ptx_file),
        before,
        "the PTX was rebuilt with nothing changed"
    );
}

/// The newest modification time of the `.ptx` files under `dir`.
fn newest_mtime(dir: &Path) -> std::time::SystemTime {
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "ptx") {
                newest = newest.max(e.metadata().unwrap().modified().unwrap());
            }
        }
    }
    newest
}
