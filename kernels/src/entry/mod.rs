//! Kernel entry points: thin `extern "ptx-kernel"` wrappers, kept apart from the algorithms.
//! Every pointer argument is a device pointer the host allocated with the size the kernel's doc
//! gives; the host wrappers in the root crate uphold that.
//!
//! `heap` is in every module that links toga-kernels (the host needs it to bind a heap); the
//! rest only with the `harness` feature, in toga's own PTX.

#[cfg(feature = "capi")]
mod capi;
#[cfg(feature = "harness")]
mod fit;
mod heap;
mod host_ops;
#[cfg(feature = "harness")]
mod litmus;
#[cfg(feature = "harness")]
mod workload;

#[cfg(feature = "harness")]
#[global_allocator]
static GLOBAL: crate::Toga = crate::Toga;
