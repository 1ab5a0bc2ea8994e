//! Kernels written the way a user writes them, a few lines around one allocator call, for
//! `tests/fit_gpu.rs`, which launches them with 1024-thread blocks. CUDA's largest block leaves a
//! thread at most 64 of an SM's 65,536 registers; a kernel that needs more does not launch at
//! all (`CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`). `tests/ptxas.rs` checks the counts without a GPU.
//!
//! Thread `i` of a 1-D grid handles element `i < n`; `base` is an initialized heap. `errors` has
//! two words: pattern words or bytes found wrong go to `errors[0]`, other failures (a block not
//! aligned as asked) to `errors[1]`. Every block is filled with the pattern of its owner thread
//! and a tag ([`pattern`]), so two live blocks that overlap show up as a corrupted pattern.

use alloc::vec::Vec;

use crate::heap::DeviceHeap;
use crate::pattern;
use crate::platform::{self, Atomic64, WARP_SIZE};

/// `errors[PATTERN_ERRORS]`: pattern words or bytes found wrong.
const PATTERN_ERRORS: usize = 0;
/// `errors[OTHER_ERRORS]`: anything else found wrong.
const OTHER_ERRORS: usize = 1;

/// What `toga_fit_vec` writes for a thread whose `Vec` could not grow.
const VEC_FAILED: u64 = u64::MAX;
/// `toga_fit_vec`'s elements carry their thread's id above this bit, their index below.
const VEC_OWNER_SHIFT: u32 = 32;

fn tid() -> usize {
    platform::global_thread_id() as usize
}

/// Add `n` to `errors[which]` (nothing when `n` is 0).
fn count_error(errors: *const Atomic64, which: usize, n: u64) {
    if n != 0 {
        // SAFETY: `errors` has two words (every kernel's contract).
        unsafe { &*errors.add(which) }.fetch_add_relaxed(n);
    }
}

/// Check the pattern of the block `p` of `size` bytes filled for `(owner, tag)`, count what is
/// wrong, and free it. Null is skipped.
///
/// # Safety
/// `p` is null or a live block of `heap` of `size` bytes filled for `(owner, tag)`, freed here
/// and nowhere else; `errors` has two words.
unsafe fn check_and_free(
    heap: &DeviceHeap,
    p: *mut u8,
    size: usize,
    owner: u64,
    tag: u32,
    errors: *const Atomic64,
) {
    if !p.is_null() {
        // SAFETY: the caller's contract.
        unsafe {
            count_error(errors, PATTERN_ERRORS, pattern::check(p, size, owner, tag));
            heap.free(p);
        }
    }
}

/// With `free == 0`: `ptrs[i] = malloc(size)`, filled with the pattern of `(i, tag)` (null when
/// out of memory). Otherwise: check the pattern of `ptrs[i]`, free it and clear `ptrs[i]`.
///
/// # Safety
/// `ptrs` has `n` elements, zeroed or as an allocating launch with the same `size` and `tag` left
/// them (when freeing); `errors` has two words.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_fit_malloc_free(
    base: *mut u8,
    ptrs: *mut u64,
    n: u64,
    size: u32,
    tag: u32,
    free: u32,
    errors: *const Atomic64,
) {
    let i = tid();
    if i as u64 >= n {
        return;
    }
    // SAFETY: kernel contract.
    let (heap, slot) = unsafe { (DeviceHeap::from_base(base), ptrs.add(i)) };
    let size = size as usize;
    if free == 0 {
        let p = heap.malloc(size);
        if !p.is_null() {
            // SAFETY: `p` holds `size` bytes, aligned to 16.
            unsafe { pattern::fill(p, size, i as u64, tag) };
        }
        // SAFETY: `i < n`.
        unsafe { *slot = p as u64 };
    } else {
        // SAFETY: kernel contract: a block filled for `(i, tag)` or null, freed by this thread only.
        unsafe {
            check_and_free(&heap, *slot as *mut u8, size, i as u64, tag, errors);
            *slot = 0;
        }
    }
}

/// `ptrs[i] = malloc_aligned(size, aligns[i % count])`, filled with the pattern of `(i, tag)`
/// (null when out of memory); a block not aligned as asked counts in `errors[1]`. Free them with
/// `toga_fit_malloc_free` (same `size` and `tag`).
///
/// # Safety
/// `ptrs` has `n` elements; `aligns` has `count > 0` powers of two; `errors` has two words.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_fit_aligned(
    base: *mut u8,
    ptrs: *mut u64,
    n: u64,
    size: u32,
    aligns: *const u32,
    count: u32,
    tag: u32,
    errors: *const Atomic64,
) {
    let i = tid();
    if i as u64 >= n {
        return;
    }
    // SAFETY: kernel contract.
    let (heap, align) = unsafe { (DeviceHeap::from_base(base), *aligns.add(i % count as usize)) };
    let (size, align) = (size as usize, align as usize);
    let p = heap.malloc_aligned(size, align);
    if !p.is_null() {
        count_error(
            errors,
            OTHER_ERRORS,
            !(p as usize).is_multiple_of(align) as u64,
        );
        // SAFETY: `p` holds `size` bytes, aligned to 16 at least.
        unsafe { pattern::fill(p, size, i as u64, tag) };
    }
    // SAFETY: `i < n`.
    unsafe { *ptrs.add(i) = p as u64 };
}

/// Thread `i` pushes `len` elements `i << 32 | k` (`k = 0, 1, …`) one at a time onto a
/// `Vec<u64>` through the bound heap's `GlobalAlloc`, reads them back and writes their sum to
/// `out[i]`, an element found wrong counting as 0; `u64::MAX` if the `Vec` could not grow. The
/// `Vec` is dropped (freed) at the end.
///
/// # Safety
/// `out` has `n` elements; a heap is bound to this module.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_fit_vec(out: *mut u64, n: u64, len: u32) {
    let i = tid();
    if i as u64 >= n {
        return;
    }
    let element = |k: usize| (i as u64) << VEC_OWNER_SHIFT | k as u64;
    let mut v: Vec<u64> = Vec::new();
    let mut sum = 0u64;
    for k in 0..len as usize {
        if v.try_reserve(1).is_err() {
            sum = VEC_FAILED;
            break;
        }
        v.push(element(k));
    }
    if sum != VEC_FAILED {
        sum = v
            .iter()
            .enumerate()
            .map(|(k, &x)| if x == element(k) { x } else { 0 })
            .sum();
    }
    // SAFETY: `i < n`.
    unsafe { *out.add(i) = sum };
}

/// One round of cross-warp churn. With `alloc != 0`, thread `i` first takes
/// `next[i] = malloc(sizes[i])` and fills it with the pattern of `(i, round)`. Then it checks and
/// frees the block that thread `j = (i + warps * 32) % n` took in the previous round (`prev[j]`,
/// pattern `(j, round - 1)`; null is skipped) and clears `prev[j]`. `j` runs over every thread
/// once, so each block is freed by one thread, of another warp when `warps` is not a multiple of
/// `n / 32`. Launch rounds one after another on a stream, swapping `prev` and `next`; a last
/// round with `alloc == 0` frees what is left.
///
/// # Safety
/// `prev`, `next` and `sizes` have `n` elements and do not overlap; `prev` is zeroed or as the
/// previous round left `next`, with the same `sizes`; `warps < n`; `errors` has two words.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_fit_cross_free(
    base: *mut u8,
    prev: *mut u64,
    next: *mut u64,
    sizes: *const u32,
    n: u64,
    round: u32,
    warps: u64,
    alloc: u32,
    errors: *const Atomic64,
) {
    let i = tid() as u64;
    if i >= n {
        return;
    }
    // SAFETY: kernel contract.
    let heap = unsafe { DeviceHeap::from_base(base) };
    if alloc != 0 {
        // SAFETY: `i < n`.
        let size = unsafe { *sizes.add(i as usize) } as usize;
        let p = heap.malloc(size);
        if !p.is_null() {
            // SAFETY: `p` holds `size` bytes, aligned to 16.
            unsafe { pattern::fill(p, size, i, round) };
        }
        // SAFETY: `i < n`; no other thread touches `next[i]`.
        unsafe { *next.add(i as usize) = p as u64 };
    }
    let j = (i + warps * WARP_SIZE as u64) % n;
    // SAFETY: `j < n`; `prev[j]` is null or the live block thread `j` filled last round, and this
    // thread is the only one that reads or frees it.
    unsafe {
        let slot = prev.add(j as usize);
        let size = *sizes.add(j as usize) as usize;
        check_and_free(
            &heap,
            *slot as *mut u8,
            size,
            j,
            round.wrapping_sub(1),
            errors,
        );
        *slot = 0;
    }
}
