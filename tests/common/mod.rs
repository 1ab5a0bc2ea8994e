//! Shared by the GPU test files.
//!
//! Every GPU test is `#[ignore]`d with the reason "needs a CUDA GPU", so `cargo test` on a machine
//! without one reports it as ignored rather than passed. `cargo test -- --include-ignored` runs
//! them (`scripts/gpu-suite.sh` does); then a machine without a GPU fails them, loudly.
#![allow(dead_code)]

use toga::Gpu;

/// The GPU toga's tests run on (`TOGA_TEST_DEVICE`, default 0), with the harness PTX loaded.
/// Panics, saying why, when there is none: a GPU test that was asked to run must not pass
/// without a GPU.
pub fn gpu() -> Gpu {
    let ordinal = std::env::var("TOGA_TEST_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    toga_harness::open(ordinal).unwrap_or_else(|e| {
        panic!(
            "GPU test without a GPU: opening device {ordinal}: {e} (GPU tests need a CUDA device)"
        )
    })
}
