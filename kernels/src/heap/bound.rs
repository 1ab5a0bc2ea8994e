//! The heap bound to this module: what the free functions `malloc`/`free` and [`Toga`] use.
//! (Not built under loom: a static atomic needs a `const` constructor.)

use core::ptr;

use super::Heap;
use crate::platform::Atomic64;

/// The heap that the free functions [`malloc`]/[`free`] and [`Toga`] use: set by the host
/// through the `toga_bind_heap` kernel of each module (0 = none: every malloc returns null).
static BOUND_HEAP: Atomic64 = Atomic64::new(0);

/// Make `base` the heap of this module's free functions.
///
/// # Safety
/// `base` is 0 or an initialized heap that outlives every later call of [`malloc`]/[`free`].
pub unsafe fn bind(base: *mut u8) {
    BOUND_HEAP.store_relaxed(base as u64);
}

fn bound() -> Option<Heap<'static>> {
    let base = BOUND_HEAP.load_relaxed();
    // SAFETY: `bind`'s contract: a nonzero value is an initialized heap.
    (base != 0).then(|| unsafe { Heap::from_base(base as *mut u8) })
}

/// `malloc` on the bound heap (null if none is bound).
pub fn malloc(size: usize) -> *mut u8 {
    bound().map_or(ptr::null_mut(), |h| h.malloc(size))
}

/// `calloc` on the bound heap.
pub fn calloc(count: usize, size: usize) -> *mut u8 {
    bound().map_or(ptr::null_mut(), |h| h.calloc(count, size))
}

/// `malloc_aligned` on the bound heap.
pub fn malloc_aligned(size: usize, align: usize) -> *mut u8 {
    bound().map_or(ptr::null_mut(), |h| h.malloc_aligned(size, align))
}

/// `free` on the bound heap.
///
/// # Safety
/// As for [`Heap::free`].
pub unsafe fn free(p: *mut u8) {
    if let Some(h) = bound() {
        // SAFETY: forwarded from the caller.
        unsafe { h.free(p) }
    }
}

/// `realloc` on the bound heap.
///
/// # Safety
/// As for [`Heap::realloc`].
pub unsafe fn realloc(p: *mut u8, size: usize) -> *mut u8 {
    // SAFETY: forwarded from the caller.
    bound().map_or(ptr::null_mut(), |h| unsafe { h.realloc(p, size) })
}

/// `GlobalAlloc` over the bound heap: `#[global_allocator] static A: toga_kernels::Toga = Toga;`
/// makes `alloc::{Box, Vec, String}` work in kernels. Alignments are honoured as
/// [`Heap::malloc_aligned`] describes; one no block can meet gets null, never a misaligned block.
pub struct Toga;

// SAFETY: `alloc` returns null or a block of at least `layout.size()` bytes aligned to
// `layout.align()` (`malloc_aligned`'s promise); `dealloc` frees only what `alloc` returned.
unsafe impl core::alloc::GlobalAlloc for Toga {
    unsafe fn alloc(&self, layout: core::alloc::Layout) -> *mut u8 {
        malloc_aligned(layout.size(), layout.align())
    }

    unsafe fn dealloc(&self, p: *mut u8, _layout: core::alloc::Layout) {
        // SAFETY: `p` came from `alloc` (GlobalAlloc's contract).
        unsafe { free(p) }
    }
}
