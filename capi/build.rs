//! Builds `kernels/` with the `capi` feature: the PTX whose `.visible .func` entries
//! (`toga_malloc`, `toga_free`, ...) a CUDA C++ program links as a relocatable device object.
//! `toga_device_ptx()` returns it; a readable copy lands in `target/ptx/capi/toga_kernels.ptx`,
//! which `scripts/bundle-cpp` ships.

use std::path::PathBuf;

fn main() {
    // The builder must come first: when rustc runs this script as the PTX linker, `new` links
    // and exits.
    let builder = toga_builder::Builder::new("../kernels").feature("capi");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let builder = match out.ancestors().nth(4) {
        Some(target) => builder.copy_to(target.join("ptx").join("capi")),
        None => builder,
    };
    let ptx = builder.build().unwrap_or_else(|e| e.exit());
    println!("cargo::rustc-env=TOGA_DEVICE_PTX={}", ptx.display());
}
