//! Compiles `kernels/` (the allocator and the heap-management kernels, without the `harness`
//! feature's test kernels) to PTX and embeds it in the library (`toga::KERNELS_PTX`).
//! A readable copy lands in `target/ptx/toga_kernels.ptx`.

use std::path::PathBuf;

fn main() {
    // The builder must come first: when rustc runs this script as the PTX linker, `new` links
    // and exits.
    let builder = toga_builder::Builder::new("kernels");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target = out.ancestors().nth(4).map(|t| t.join("ptx"));
    let builder = match target {
        Some(dir) => builder.copy_to(dir),
        None => builder,
    };
    let ptx = builder.build().unwrap_or_else(|e| e.exit());
    println!("cargo::rustc-env=TOGA_KERNELS_PTX={}", ptx.display());
}
