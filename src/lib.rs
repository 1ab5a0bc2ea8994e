//! # toga: host side
//!
//! Loads toga's device allocator (compiled from `kernels/` to PTX by `build.rs` and embedded
//! here), creates heaps in device memory and launches kernels, through `cudarc` with dynamic
//! loading: nothing CUDA is needed to build this crate, and a machine without a driver gets
//! [`Error::NoDriver`] at run time.

#![warn(missing_docs)]

pub mod error;
pub mod gpu;
pub mod heap;
mod vmm;

pub use error::{Error, Result};
pub use gpu::{DeviceInfo, Gpu, device_count};
pub use heap::{Freeable, Heap, HeapBuilder, HeapStats, HostBlock};
/// The layout of a heap in device memory ([`Heap::geometry`]).
pub use toga_kernels::heap::Geometry;

/// The version of `cudarc` toga's signatures use (streams, modules, device slices): use this
/// one, or depend on the same version, so the types match.
pub use cudarc;

/// The PTX of `kernels/`, for `sm_70` unless `TOGA_PTX_ARCH` said otherwise at build time.
/// A readable copy is written to `target/ptx/toga_kernels.ptx`.
pub const KERNELS_PTX: &str = include_str!(env!("TOGA_KERNELS_PTX"));

/// Threads per block for toga's own launches.
pub const BLOCK_SIZE: u32 = 256;

/// A 1-D launch configuration covering `threads` threads.
pub fn launch_config(threads: u64) -> cudarc::driver::LaunchConfig {
    let blocks = threads.div_ceil(BLOCK_SIZE as u64).max(1) as u32;
    cudarc::driver::LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK_SIZE, 1, 1),
        shared_mem_bytes: 0,
    }
}

// A `Gpu` and a `Heap` can be shared between host threads (for example an `Arc<Heap>` used by
// threads that launch on streams of their own): checked here at compile time.
const _: () = {
    const fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<Gpu>();
    send_and_sync::<Heap>();
};
