//! The heap bound to this module: what the free functions `malloc`/`free` and [`Toga`] use.
//! (Not built under loom: a static atomic needs a `const` constructor.)

use core::ptr;

use super::DeviceHeap;
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

fn bound() -> Option<DeviceHeap<'static>> {
    let base = BOUND_HEAP.load_relaxed();
    // SAFETY: `bind`'s contract: a nonzero value is an initialized heap.
    (base != 0).then(|| unsafe { DeviceHeap::from_base(base as *mut u8) })
}

/// Allocate `size` bytes from the heap the host bound to this module.
///
/// Returns null when `size` is 0, when it is larger than the heap, when memory is out (a
/// growable heap first asks the host for more, `docs/growable.md`), or when no heap is bound.
/// It never hangs. Blocks are aligned to 16 bytes at least: small blocks (up to 4 KiB) to their
/// size class, larger ones to their power-of-two size. Any thread may call it, in any kernel
/// shape; it fits kernels of 1024-thread blocks (`docs/registers.md`).
pub fn malloc(size: usize) -> *mut u8 {
    bound().map_or(ptr::null_mut(), |h| h.malloc(size))
}

/// Allocate `count * size` zeroed bytes from the bound heap; null on overflow of
/// `count * size` and wherever [`malloc`] returns null.
pub fn calloc(count: usize, size: usize) -> *mut u8 {
    bound().map_or(ptr::null_mut(), |h| h.calloc(count, size))
}

/// Allocate `size` bytes aligned to `align` (a power of two) from the bound heap. Alignments
/// up to a small block's own are free; stricter ones are served from whole pages. Null where
/// [`malloc`] returns null, and for alignments above 512 KiB.
pub fn malloc_aligned(size: usize, align: usize) -> *mut u8 {
    bound().map_or(ptr::null_mut(), |h| h.malloc_aligned(size, align))
}

/// Give back a block from [`malloc`], [`calloc`], [`malloc_aligned`] or [`realloc`]; any thread
/// may free any thread's block. `free(null)` is a no-op. A pointer the heap did not hand out, or
/// one freed already, is counted where that is cheap to detect (the host reads the counts as
/// `HeapStats::invalid_frees` and `double_frees`) and leaves the heap intact.
///
/// # Safety
/// Misuse that cannot be detected cheaply (a pointer into the middle of a live block that falls
/// on a slot boundary, a use after free) is undefined behaviour, as with any `free`.
pub unsafe fn free(p: *mut u8) {
    if let Some(h) = bound() {
        // SAFETY: forwarded from the caller.
        unsafe { h.free(p) }
    }
}

/// C's `realloc` on the bound heap: a null `p` is `malloc(size)`; `size == 0` frees `p` and
/// returns null; otherwise the contents move to a block of `size` bytes (in place when the
/// block already fits and is at most twice too big). On failure null is returned and `p` stays
/// valid.
///
/// # Safety
/// As for [`free`].
pub unsafe fn realloc(p: *mut u8, size: usize) -> *mut u8 {
    // SAFETY: forwarded from the caller.
    bound().map_or(ptr::null_mut(), |h| unsafe { h.realloc(p, size) })
}

/// The usable bytes of the live block at `p`: at least what was asked for, the whole size class
/// or page run the block occupies; 0 for null or a pointer that is not a live block's start.
///
/// # Safety
/// `p` is null or was returned by this module's allocation functions and not freed.
pub unsafe fn usable_size(p: *mut u8) -> usize {
    // SAFETY: forwarded from the caller.
    bound().map_or(0, |h| unsafe { h.usable_size(p) })
}

/// `GlobalAlloc` over the bound heap: `#[global_allocator] static A: toga_kernels::Toga = Toga;`
/// makes `alloc::{Box, Vec, String}` work in kernels. Alignments are honoured as
/// [`malloc_aligned`] describes; one no block can meet gets null (an allocation error), never a
/// misaligned block.
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
