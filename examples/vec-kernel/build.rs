fn main() {
    // First thing: in linker mode the builder links and exits.
    let ptx = toga_builder::Builder::new("device")
        .build()
        .unwrap_or_else(|e| e.exit());
    println!("cargo::rustc-env=VEC_KERNEL_PTX={}", ptx.display());
}
