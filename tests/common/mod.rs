//! Shared by the GPU test files: open the GPU or report the test as skipped.
#![allow(dead_code)]

use toga::{Error, Gpu};

/// The GPU toga's tests run on (`TOGA_TEST_DEVICE`, default 0), or `None` after printing
/// "skipped: no CUDA device" when this machine has no driver or no device.
pub fn gpu() -> Option<Gpu> {
    let ordinal = std::env::var("TOGA_TEST_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    match Gpu::open(ordinal) {
        Ok(g) => Some(g),
        Err(Error::NoDriver | Error::NoDevice(_)) => {
            eprintln!("skipped: no CUDA device");
            None
        }
        Err(e) => panic!("opening GPU {ordinal}: {e}"),
    }
}

/// `gpu()` or return from the test.
#[macro_export]
macro_rules! gpu_or_skip {
    () => {
        match common::gpu() {
            Some(g) => g,
            None => return,
        }
    };
}
