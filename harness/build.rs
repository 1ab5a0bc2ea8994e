//! Compiles `kernels/` with its `harness` feature (the workload, baseline, litmus and fit
//! kernels beside the allocator) to PTX and embeds it (`toga_harness::HARNESS_PTX`). A readable
//! copy lands in `target/ptx/harness/toga_kernels.ptx`.

use std::path::PathBuf;

fn main() {
    // The builder must come first: when rustc runs this script as the PTX linker, `new` links
    // and exits.
    let builder = toga_builder::Builder::new("../kernels").feature("harness");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let builder = match out.ancestors().nth(4) {
        Some(target) => builder.copy_to(target.join("ptx").join("harness")),
        None => builder,
    };
    let ptx = builder.build().unwrap_or_else(|e| e.exit());
    println!("cargo::rustc-env=TOGA_HARNESS_PTX={}", ptx.display());
}
