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

/// [`toga_harness::host_pattern`] with its own error words, read back: (wrong words, null
/// blocks).
pub fn host_pattern(
    gpu: &Gpu,
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    ptrs: &cudarc::driver::CudaSlice<u64>,
    indirect: bool,
    sizes: &cudarc::driver::CudaSlice<u64>,
    tag: u32,
    check: bool,
) -> [u64; 2] {
    let mut errors = stream.alloc_zeros::<u64>(2).unwrap();
    toga_harness::host_pattern(gpu, stream, ptrs, indirect, sizes, tag, check, &mut errors)
        .unwrap();
    let e = stream.clone_dtoh(&errors).unwrap();
    [e[0], e[1]]
}
