//! # toga-kernels: the device allocator
//!
//! `malloc` and `free` for Rust kernels on NVIDIA GPUs, built for thousands of threads calling
//! at once. A throughput-oriented allocator after Gelado & Garland (PPoPP 2019), in `no_std`
//! Rust: bulk semaphores, TBuddy (a concurrent buddy tree for large blocks) and UAlloc (per-SM
//! arenas of 4 KiB bins for small ones).
//!
//! # Example
//!
//! A kernel crate's `src/lib.rs` (its `Cargo.toml` depends on `toga-kernels`; a host crate
//! builds it to PTX with `toga_builder` and binds a `toga::Heap` to the module):
//!
//! ```no_run
//! #![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, stdarch_nvptx))]
//! # // The doctest builds for the host, with std; a kernel crate is `#![no_std]`.
//! extern crate alloc;
//! use alloc::vec::Vec;
//!
//! // `Vec`, `Box` and `String` allocate from the heap bound to the module.
//! #[global_allocator]
//! static ALLOC: toga_kernels::Toga = toga_kernels::Toga;
//!
//! /// One thread's work: the sum of `i, i + 1, ..., i + len - 1`, or `None` when the heap had
//! /// no memory for it.
//! pub fn sum(i: u64, len: usize) -> Option<u64> {
//!     // A raw block, as C's `malloc` gives: null when the heap is out of memory.
//!     let total = toga_kernels::malloc(8) as *mut u64;
//!     if total.is_null() {
//!         return None;
//!     }
//!     let mut v = Vec::new();
//!     // `try_reserve` fails where `push` would trap the kernel.
//!     let sum = v.try_reserve_exact(len).ok().map(|()| {
//!         v.extend((0..len as u64).map(|k| i + k));
//!         // SAFETY: `total` holds 8 bytes, aligned for a `u64`.
//!         unsafe { total.write(v.iter().sum()) };
//!         // SAFETY: as above.
//!         unsafe { total.read() }
//!     });
//!     // SAFETY: `total` came from `malloc` and is freed once.
//!     unsafe { toga_kernels::free(total.cast()) };
//!     sum
//! }
//!
//! /// The kernel: thread `i` writes `sum(i, len)` to `out[i]` (`u64::MAX` when out of memory).
//! ///
//! /// # Safety
//! /// `out` has `n` elements, and a toga heap is bound to the module.
//! #[cfg(target_arch = "nvptx64")]
//! #[unsafe(no_mangle)]
//! pub unsafe extern "ptx-kernel" fn sums(out: *mut u64, n: usize, len: usize) {
//!     use core::arch::nvptx::*;
//!     // SAFETY: special-register reads.
//!     let i = unsafe { (_block_idx_x() * _block_dim_x() + _thread_idx_x()) as usize };
//!     if i < n {
//!         // SAFETY: `i < n`.
//!         unsafe { *out.add(i) = sum(i as u64, len).unwrap_or(u64::MAX) };
//!     }
//! }
//! # fn main() {}
//! ```
//!
//! # In a kernel crate
//! - [`malloc`], [`calloc`], [`malloc_aligned`], [`realloc`], [`free`] and [`usable_size`];
//! - `alloc::{Box, Vec, String}` through `#[global_allocator] static A: Toga = Toga;`.
//!
//! Out of memory is a null pointer, never a hang. `free(null)` is a no-op; a double or foreign
//! free is counted for the host and changes nothing. Every function fits kernels launched with
//! 1024-thread blocks (at most 64 registers per thread). The README's "Use toga in your
//! kernels" has a whole project (kernel crate, `build.rs`, host program), which CI builds.
//!
//! # Features
//! - `panic-handler` (default): a `#[panic_handler]` that traps, ending the kernel with an
//!   error the host sees. Turn it off to provide your own.
//! - `harness`: toga's own test, benchmark and baseline kernels. For toga's harness only.
//!
//! # Layers
//! The same code compiles to PTX (`nvptx64-nvidia-cuda`) and for the host, where OS threads
//! stand in for GPU threads, so every algorithm is tested on CPU and under loom. Layers, lowest
//! first; a module imports only from layers below it (`docs/architecture.md`):
//! 1. `platform`: atomics, fences, warp collectives, special registers.
//! 2. the allocator's structures, written against `platform` only.
//! 3. `entry` (nvptx only): the `extern "ptx-kernel"` functions the host launches.
//!
//! Those modules are public for toga's host crate and tests, and hidden from these docs: they
//! are not an API.
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, stdarch_nvptx, asm_experimental_arch)
)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

#[cfg(all(target_arch = "nvptx64", feature = "harness"))]
extern crate alloc;
#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

// The allocator's parts. They are public only for toga's host crate, its harness and the CPU
// and loom tests, which check each structure on its own; they are not an API for kernels and
// may change in any release, so the docs hide them.
#[doc(hidden)]
pub mod platform;

#[doc(hidden)]
pub mod bulk_semaphore;
#[doc(hidden)]
pub mod collective;
#[doc(hidden)]
pub mod heap;
#[doc(hidden)]
pub mod pattern;
#[doc(hidden)]
pub mod rcu;
#[doc(hidden)]
pub mod run;
#[doc(hidden)]
pub mod size_class;
#[doc(hidden)]
pub mod stash;
#[doc(hidden)]
pub mod tbuddy;
#[doc(hidden)]
pub mod ualloc;

#[cfg(target_arch = "nvptx64")]
mod entry;

#[doc(hidden)]
pub use heap::DeviceHeap;
#[cfg(not(loom))]
pub use heap::{Toga, calloc, free, malloc, malloc_aligned, realloc, usable_size};

#[cfg(all(target_arch = "nvptx64", feature = "panic-handler"))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    platform::trap()
}
