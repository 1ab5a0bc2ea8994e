//! A user's kernel crate: plain `no_std` Rust that allocates with toga. Built to PTX by
//! `toga_builder::Builder` from the example's `build.rs`; on the host it compiles to nothing.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, stdarch_nvptx))]

#[cfg(target_arch = "nvptx64")]
mod kernels {
    extern crate alloc;
    use alloc::vec::Vec;

    #[global_allocator]
    static ALLOC: toga_kernels::Toga = toga_kernels::Toga;

    // toga-kernels' default `panic-handler` feature provides the `#[panic_handler]` (a trap).

    fn thread_id() -> usize {
        // SAFETY: special-register reads.
        unsafe {
            use core::arch::nvptx::*;
            (_block_idx_x() * _block_dim_x() + _thread_idx_x()) as usize
        }
    }

    /// Thread `i`: a raw `malloc`/`free` round trip, then a `Vec` grown to `len` elements.
    /// `out[i]` = the Vec's sum, or `u64::MAX` if any allocation failed.
    ///
    /// # Safety
    /// `out` has `n` elements; a toga heap is bound to this module.
    #[unsafe(no_mangle)]
    pub unsafe extern "ptx-kernel" fn grow_vectors(out: *mut u64, n: usize, len: usize) {
        let i = thread_id();
        if i >= n {
            return;
        }
        let p = toga_kernels::malloc(48) as *mut u64;
        if p.is_null() {
            // SAFETY: `i < n`.
            unsafe { *out.add(i) = u64::MAX };
            return;
        }
        // SAFETY: `p` holds 48 bytes, 16-byte aligned.
        unsafe {
            p.write(i as u64);
            toga_kernels::free(p as *mut u8);
        }
        let mut v = Vec::new();
        if v.try_reserve(1).is_err() {
            // SAFETY: `i < n`.
            unsafe { *out.add(i) = u64::MAX };
            return;
        }
        for k in 0..len as u64 {
            v.push(i as u64 + k);
        }
        // SAFETY: `i < n`.
        unsafe { *out.add(i) = v.iter().sum() };
    }
}
