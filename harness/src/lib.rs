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
use toga::{Error, Gpu, Result};

mod census;
mod workload;

pub use census::*;
pub use workload::*;

/// The PTX of `kernels/` with the `harness` feature, for `sm_70` unless `TOGA_PTX_ARCH` said
/// otherwise at build time. A readable copy is written to `target/ptx/harness/toga_kernels.ptx`.
pub const HARNESS_PTX: &str = include_str!(env!("TOGA_HARNESS_PTX"));

/// The PTX the harness loads: the file named by the environment variable `TOGA_PTX_FILE` when
/// it is set (to compare builds of `kernels/` on one GPU without rebuilding the programs; the
/// file must be a harness build), otherwise [`HARNESS_PTX`].
pub fn harness_ptx() -> Result<std::borrow::Cow<'static, str>> {
    match std::env::var_os("TOGA_PTX_FILE") {
        Some(path) => std::fs::read_to_string(&path)
            .map(Into::into)
            .map_err(|e| Error::PtxFile(format!("{}: {e}", path.to_string_lossy()))),
        None => Ok(HARNESS_PTX.into()),
    }
}

/// Open device `ordinal` with the harness PTX loaded.
pub fn open(ordinal: usize) -> Result<Gpu> {
    Gpu::open_with(ordinal, &harness_ptx()?)
}

/// [`open`], with CUDA's own device-malloc heap (`cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE)`)
/// raised to `cuda_malloc_heap` bytes first, as the CUDA-malloc baseline needs: the limit can
/// only be set before the context's first module loads.
pub fn open_with_cuda_heap(ordinal: usize, cuda_malloc_heap: usize) -> Result<Gpu> {
    let ctx = toga::gpu::context(ordinal)?;
    ctx.set_limit(sys::CUlimit::CU_LIMIT_MALLOC_HEAP_SIZE, cuda_malloc_heap)?;
    Gpu::with_context(ctx, &harness_ptx()?)
}
