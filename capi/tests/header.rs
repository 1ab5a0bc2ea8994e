//! `include/toga.h` is what cbindgen makes of `capi/src/lib.rs` with `capi/cbindgen.toml`:
//! the checked-in header cannot drift from the library. `TOGA_BLESS=1` rewrites it.

use std::path::PathBuf;

#[test]
fn checked_in_header_is_the_generated_one() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("capi/cbindgen.toml is readable");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen reads capi/src/lib.rs")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("the header is UTF-8");
    let path = crate_dir.join("../include/toga.h");
    if std::env::var_os("TOGA_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("include/toga.h is writable");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "include/toga.h differs from what cbindgen generates from capi/src/lib.rs; \
         run `TOGA_BLESS=1 cargo test -p toga-capi --test header` and commit the result"
    );
    for name in [
        "toga_heap_create",
        "toga_heap_create_growable",
        "toga_heap_destroy",
        "toga_last_error_message",
        "TOGA_ERROR_INVALID_HANDLE",
    ] {
        assert!(
            generated.contains(name),
            "{name} is missing from the header"
        );
    }
}
