//! Kernel entry points: thin `extern "ptx-kernel"` wrappers, kept apart from the algorithms.
//! Every pointer argument is a device pointer the host allocated with the size the kernel's doc
//! gives; the host wrappers in the root crate uphold that.

mod litmus;
