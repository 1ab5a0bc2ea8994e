//! The C ABI of the device allocator, for CUDA C++ (`include/toga.cuh`, `docs/cpp.md`): plain
//! `extern "C"` functions that the builder keeps as `.visible .func` in the PTX, so that
//! `nvcc -dc` turns the PTX into a relocatable device object a C++ program links with `-rdc`.
//!
//! Each function is the Rust one of the same name (`crate::malloc` and so on, the heap bound to
//! the module), with the same semantics, warp aggregation included: nothing is re-implemented
//! here. Only with the `capi` feature.
//!
//! A heap is bound with [`toga_bind`], called from a kernel the C++ program compiles itself:
//! a global defined only in PTX has no host shadow, so `cudaMemcpyToSymbol` cannot set it.
//! Allocations while no heap is bound return null and are counted in [`UNBOUND_MALLOCS`], which
//! [`toga_unbound_mallocs`] reads.
//!
//! The ABI is scalars and pointers only (`usize` is `size_t` on nvptx64).

use crate::heap;
use crate::platform::Atomic64;

/// The base that the last [`toga_bind`] set (0: none). `crate::heap::bind` holds the heap the
/// allocator uses; this copy only tells an unbound null from an out-of-memory one, and is read
/// only after an allocation returned null.
static BOUND_BASE: Atomic64 = Atomic64::new(0);

/// Allocation calls (`toga_malloc`, `toga_calloc`, `toga_malloc_aligned`, and `toga_realloc`
/// when it allocates) made while no heap was bound: each returned null.
static UNBOUND_MALLOCS: Atomic64 = Atomic64::new(0);

/// Count an allocation that returned null for want of a bound heap.
#[inline(always)]
fn note_null(p: *mut u8) -> *mut u8 {
    if p.is_null() && BOUND_BASE.load_relaxed() == 0 {
        UNBOUND_MALLOCS.fetch_add_relaxed(1);
    }
    p
}

/// Make `base` (a heap's device address, `toga_heap_base` on the host; 0 unbinds) the heap of
/// every `toga_*` function of this program. Call it from one thread of a kernel; kernels
/// launched after that kernel completed see it.
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

/// `crate::malloc`: `size` bytes, or null (size 0, out of memory, no heap bound).
#[unsafe(no_mangle)]
pub extern "C" fn toga_malloc(size: usize) -> *mut u8 {
    note_null(crate::malloc(size))
}

/// `crate::calloc`: `count * size` zeroed bytes, or null (also on overflow).
#[unsafe(no_mangle)]
pub extern "C" fn toga_calloc(count: usize, size: usize) -> *mut u8 {
    note_null(crate::calloc(count, size))
}

/// `crate::malloc_aligned`: `size` bytes aligned to `align` (a power of two), or null.
#[unsafe(no_mangle)]
pub extern "C" fn toga_malloc_aligned(size: usize, align: usize) -> *mut u8 {
    note_null(crate::malloc_aligned(size, align))
}

/// `crate::free`: null is a no-op; a foreign or double free is counted and changes nothing.
///
/// # Safety
/// As for `crate::free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn toga_free(p: *mut u8) {
    // SAFETY: forwarded from the caller.
    unsafe { crate::free(p) }
}

/// `crate::realloc`: C's `realloc` on the bound heap.
///
/// # Safety
/// As for `crate::realloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn toga_realloc(p: *mut u8, size: usize) -> *mut u8 {
    // SAFETY: forwarded from the caller.
    let q = unsafe { crate::realloc(p, size) };
    if size == 0 { q } else { note_null(q) }
}

/// `crate::usable_size`: the usable bytes of the live block at `p`; 0 for null.
///
/// # Safety
/// As for `crate::usable_size`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn toga_usable_size(p: *mut u8) -> usize {
    // SAFETY: forwarded from the caller.
    unsafe { crate::usable_size(p) }
}
