//! # toga: `malloc` and `free` in Rust kernels, host side
//!
//! This crate loads PTX that contains toga's device allocator, creates heaps in device memory,
//! binds them to the module so that its kernels' `malloc`, `free` and `Vec` use them, and reads
//! their statistics. The kernels' side is [`toga_kernels`](https://docs.rs/toga-kernels), and
//! `toga_builder` compiles a kernel crate to PTX from a `build.rs`.
//!
//! # Example
//!
//! ```no_run
//! use toga::cudarc::driver::PushKernelArg;
//! use toga::{Gpu, Heap};
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // PTX built from your kernel crate by `toga_builder` (usually embedded with
//!     // `include_str!`); it holds toga's allocator besides your kernels.
//!     let ptx = std::fs::read_to_string("my_kernels.ptx")?;
//!     let gpu = Gpu::open_with(0, &ptx)?;
//!     let stream = gpu.default_stream();
//!
//!     // A heap that maps device memory as the kernels need it, bound to the module.
//!     let heap = Heap::growable().create(&gpu, &stream)?;
//!
//!     let n = 1usize << 20;
//!     let mut out = stream.alloc_zeros::<u64>(n)?;
//!     let kernel = gpu.function("my_kernel")?;
//!     // SAFETY: `my_kernel(out: *mut u64, n: usize)` writes `out[i]` for each `i < n`.
//!     unsafe {
//!         stream
//!             .launch_builder(&kernel)
//!             .arg(&mut out)
//!             .arg(&n)
//!             .launch(toga::launch_config(n as u64))?;
//!     }
//!     let stats = heap.stats(&stream)?;
//!     println!(
//!         "{} mallocs, {} returned null, {} blocks still live",
//!         stats.mallocs,
//!         stats.failed_allocations,
//!         stats.live_blocks()
//!     );
//!     Ok(())
//! }
//! ```
//!
//! A fixed heap is [`Heap::new`]; [`Heap::growable`] and [`Heap::builder`] give a
//! [`HeapBuilder`] for the rest. Without an NVIDIA driver, [`Gpu::open`] returns
//! [`Error::NoDriver`]: nothing CUDA is needed to build this crate, and `libcuda` is loaded at
//! run time by [`cudarc`], whose version toga's signatures use.
//!
//! The README's "Use toga in your kernels" has a whole project (kernel crate, `build.rs`,
//! host program), which CI builds.

#![warn(missing_docs)]

pub mod error;
pub mod gpu;
pub mod heap;
mod vmm;

pub use error::{Error, Result};
pub use gpu::{DeviceInfo, Gpu, device_count};
pub use heap::{Freeable, Heap, HeapBuilder, HeapStats, HostBlock};
#[cfg(target_os = "linux")]
pub use heap::{ImportedHeap, IpcDescriptor, IpcExport, recv_export, send_export};
/// The layout of a heap in device memory ([`Heap::geometry`]): for toga's harness and tests,
/// not an API.
#[doc(hidden)]
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
