//! The C ABI of the device allocator, for CUDA C++ (`include/toga.cuh`, `docs/cpp.md`): plain
//! `extern "C"` functions that the builder keeps as `.visible .func` in the PTX, so that
//! `nvcc -dc` turns the PTX into a relocatable device object a C++ program links with `-rdc`.
//!
//! Each function is the [`DeviceHeap`] method of the same name on the heap bound with
//! [`toga_bind`] (the method a Rust kernel's `malloc` and the harness's benchmark kernels call),
//! with the same semantics, warp aggregation included: nothing is re-implemented here. Only
//! with the `capi` feature.
//!
//! A heap is bound with [`toga_bind`], called from a kernel the C++ program compiles itself:
//! a global defined only in PTX has no host shadow, so `cudaMemcpyToSymbol` cannot set it.
//! Allocations while no heap is bound return null and are counted in [`UNBOUND_MALLOCS`], which
//! [`toga_unbound_mallocs`] reads.
//!
//! The bound base is read once per call, through the read-only data path
//! ([`bound_heap`]): a C++ kernel's call of `toga_malloc` costs one load that hits in L1, not a
//! GPU-scope load from L2 before the allocator's first step.
//!
//! The ABI is scalars and pointers only (`usize` is `size_t` on nvptx64).

use core::ptr;

use crate::heap::{self, DeviceHeap};
use crate::platform::Atomic64;

/// The base that the last [`toga_bind`] set (0: none): the heap of every `toga_*` function.
/// (`crate::heap::bind` gets the same base, for the module's Rust functions.)
static BOUND_BASE: Atomic64 = Atomic64::new(0);

/// Allocation calls (`toga_malloc`, `toga_calloc`, `toga_malloc_aligned`, and `toga_realloc`
/// when it allocates) made while no heap was bound: each returned null.
static UNBOUND_MALLOCS: Atomic64 = Atomic64::new(0);

/// The heap bound now, or `None`.
///
/// `ld.global.nc`: the word is only written by [`toga_bind`], whose kernel has completed before
/// any kernel that allocates starts (its contract), so it is read-only for the whole life of
/// an allocating kernel and may come from the non-coherent, L1-cached path. A relaxed
/// GPU-scope load, as `crate::malloc` makes, goes to L2 on every call.
#[inline(always)]
fn bound_heap() -> Option<DeviceHeap<'static>> {
    let base = BOUND_BASE.load_read_only();
    // SAFETY: `toga_bind`'s contract: a nonzero base is an initialized heap.
    (base != 0).then(|| unsafe { DeviceHeap::from_base(base as *mut u8) })
}

/// An allocation call with no heap bound: counted, and null.
#[cold]
#[inline(never)]
fn unbound() -> *mut u8 {
    UNBOUND_MALLOCS.fetch_add_relaxed(1);
    ptr::null_mut()
}

/// Make `base` (a heap's device address, `toga_heap_base` on the host; 0 unbinds) the heap of
/// every `toga_*` function of this program. Call it from one thread of a kernel; kernels
/// launched after that kernel completed see it. No kernel that calls a `toga_*` allocation
/// function may run at the same time (they read the base through the non-coherent path).
///
/// # Safety
/// `base` is 0 or an initialized heap that outlives every later allocation call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn toga_bind(base: *mut u8) {
    // SAFETY: forwarded from the caller.
    unsafe { heap::bind(base) };
    BOUND_BASE.store_relaxed(base as u64);
}

/// The heap base [`toga_bind`] set last (null: none).
#[unsafe(no_mangle)]
pub extern "C" fn toga_bound_heap() -> *mut u8 {
    BOUND_BASE.load_relaxed() as *mut u8
}

/// How many allocation calls returned null because no heap was bound.
#[unsafe(no_mangle)]
pub extern "C" fn toga_unbound_mallocs() -> u64 {
    UNBOUND_MALLOCS.load_relaxed()
}

/// `DeviceHeap::malloc`: `size` bytes, or null (size 0, out of memory, no heap bound).
#[unsafe(no_mangle)]
pub extern "C" fn toga_malloc(size: usize) -> *mut u8 {
    match bound_heap() {
        Some(h) => h.malloc(size),
        None => unbound(),
    }
}

/// `DeviceHeap::calloc`: `count * size` zeroed bytes, or null (also on overflow).
#[unsafe(no_mangle)]
pub extern "C" fn toga_calloc(count: usize, size: usize) -> *mut u8 {
    match bound_heap() {
        Some(h) => h.calloc(count, size),
        None => unbound(),
    }
}

/// `DeviceHeap::malloc_aligned`: `size` bytes aligned to `align` (a power of two), or null.
#[unsafe(no_mangle)]
pub extern "C" fn toga_malloc_aligned(size: usize, align: usize) -> *mut u8 {
    match bound_heap() {
        Some(h) => h.malloc_aligned(size, align),
        None => unbound(),
    }
}

/// `DeviceHeap::free`: null is a no-op; a foreign or double free is counted and changes
/// nothing; with no heap bound, nothing happens.
///
/// # Safety
/// As for `crate::free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn toga_free(p: *mut u8) {
    if let Some(h) = bound_heap() {
        // SAFETY: forwarded from the caller.
        unsafe { h.free(p) }
    }
}

/// `DeviceHeap::realloc`: C's `realloc` on the bound heap.
///
/// # Safety
/// As for `crate::realloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn toga_realloc(p: *mut u8, size: usize) -> *mut u8 {
    match bound_heap() {
        // SAFETY: forwarded from the caller.
        Some(h) => unsafe { h.realloc(p, size) },
        // `realloc(p, 0)` frees: no allocation to count.
        None if size == 0 => ptr::null_mut(),
        None => unbound(),
    }
}

/// `DeviceHeap::usable_size`: the usable bytes of the live block at `p`; 0 for null.
///
/// # Safety
/// As for `crate::usable_size`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn toga_usable_size(p: *mut u8) -> usize {
    // SAFETY: forwarded from the caller.
    bound_heap().map_or(0, |h| unsafe { h.usable_size(p) })
}
