//! # toga-kernels: the device allocator
//!
//! A throughput-oriented allocator for NVIDIA GPUs after Gelado & Garland (PPoPP 2019), in
//! `no_std` Rust. The same code compiles to PTX (`nvptx64-nvidia-cuda`) and for the host, where
//! OS threads stand in for GPU threads so every algorithm is tested on CPU and under loom.
//!
//! Layers, lowest first; a module imports only from layers below it (`docs/architecture.md`):
//! 1. [`platform`]: atomics, fences, warp collectives, special registers.
//! 2. the allocator's structures, written against `platform` only.
//! 3. `entry` (nvptx only): the `extern "ptx-kernel"` functions the host launches.
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, stdarch_nvptx, asm_experimental_arch)
)]
#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(all(target_arch = "nvptx64", feature = "harness"))]
extern crate alloc;
#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

pub mod platform;

pub mod bulk_semaphore;
pub mod collective;
pub mod heap;
pub mod pattern;
pub mod rcu;
pub mod size_class;
pub mod tbuddy;
pub mod ualloc;

#[cfg(target_arch = "nvptx64")]
mod entry;

pub use heap::Heap;
#[cfg(not(loom))]
pub use heap::{Toga, calloc, free, malloc, malloc_aligned, realloc};

#[cfg(all(target_arch = "nvptx64", feature = "panic-handler"))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    platform::trap()
}
