//! # toga-harness: what toga's own tests, benchmarks and stress harness launch
//!
//! Not part of toga's public API and not published. `toga` (the library users depend on) embeds
//! a PTX with the allocator and the kernels that create and manage heaps, nothing else. This
//! crate embeds a second build of `kernels/`, with its `harness` feature: the same allocator
//! plus the workload kernels (fill, check, churn, storms), the baselines (CUDA's device
//! `malloc`, a bump allocator), the platform litmus tests and the kernels written the way users
//! write theirs. [`open`] loads it; [`Workloads`], [`MallocBench`] and [`ChurnBench`] launch it.
//!
//! The GPU tests (`tests/`), the benches (`benches/`) and `host` use it.

#![warn(missing_docs)]

use cudarc::driver::sys;
use cudarc::nvrtc::Ptx;
use toga::{Error, Gpu, Result};

mod census;
mod workload;

pub use census::*;
pub use workload::*;

/// The PTX of `kernels/` with the `harness` feature, for `sm_70` unless `TOGA_PTX_ARCH` said
/// otherwise at build time. A readable copy is written to `target/ptx/harness/toga_kernels.ptx`.
pub const HARNESS_PTX: &str = include_str!(env!("TOGA_HARNESS_PTX"));

/// The module the harness loads: the file named by the environment variable `TOGA_PTX_FILE`
/// when it is set (to compare builds of `kernels/` on one GPU without rebuilding the programs;
/// the file must be a harness build), otherwise [`HARNESS_PTX`]. A file whose name ends in
/// `.cubin` is loaded as a cubin (`ptxas -arch=sm_90 X.ptx -o X.cubin`), which spares the
/// driver's compilation of the PTX; any other file is read as PTX text.
pub fn harness_image() -> Result<Ptx> {
    let Some(path) = std::env::var_os("TOGA_PTX_FILE") else {
        return Ok(Ptx::from_src(HARNESS_PTX));
    };
    let unreadable = |e: std::io::Error| Error::PtxFile(format!("{}: {e}", path.to_string_lossy()));
    if std::path::Path::new(&path).extension() == Some("cubin".as_ref()) {
        std::fs::read(&path)
            .map(Ptx::from_binary)
            .map_err(unreadable)
    } else {
        std::fs::read_to_string(&path)
            .map(Ptx::from_src)
            .map_err(unreadable)
    }
}

/// Open device `ordinal` with the harness module loaded.
pub fn open(ordinal: usize) -> Result<Gpu> {
    Gpu::with_image(toga::gpu::context(ordinal)?, harness_image()?)
}

/// [`open`], with CUDA's own device-malloc heap (`cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE)`)
/// raised to `cuda_malloc_heap` bytes first, as the CUDA-malloc baseline needs: the limit can
/// only be set before the context's first module loads.
pub fn open_with_cuda_heap(ordinal: usize, cuda_malloc_heap: usize) -> Result<Gpu> {
    let ctx = toga::gpu::context(ordinal)?;
    ctx.set_limit(sys::CUlimit::CU_LIMIT_MALLOC_HEAP_SIZE, cuda_malloc_heap)?;
    Gpu::with_image(ctx, harness_image()?)
}
