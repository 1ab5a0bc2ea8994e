//! Heap bring-up and binding.

use crate::heap::{self, DeviceHeap};
use crate::platform;

/// `*out = %nsmid`, the bound of the SM ids: the host gives every SM id an arena of its own,
/// so that only one SM's threads wait on an arena's semaphores (INV(SEM2), layout `PerSm`).
///
/// # Safety
/// `out` points to one writable `u32`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_sm_id_bound(out: *mut u32) {
    if platform::global_thread_id() == 0 {
        // SAFETY: kernel contract.
        unsafe { *out = platform::sm_count() };
    }
}

/// Initialization, step 1: the grid's threads split the buddy tree between them.
///
/// # Safety
/// `base` is a zeroed heap allocation whose header holds its `Geometry`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_heap_init_nodes(base: *mut u8) {
    // SAFETY: kernel contract.
    let heap = unsafe { DeviceHeap::from_base(base) };
    heap.init_nodes(platform::global_thread_id(), platform::grid_threads());
}

/// Initialization, step 2: one thread finishes (launched after step 1 on the same stream).
///
/// # Safety
/// As for `toga_heap_init_nodes`, after it completed.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_heap_init_finish(base: *mut u8) {
    if platform::global_thread_id() == 0 {
        // SAFETY: kernel contract.
        unsafe { DeviceHeap::from_base(base) }.init_finish();
    }
}

/// Initialization, step 3 (fixed heaps, launched after step 2 with `2 × arenas` threads):
/// each arena gets a spare chunk of each bin kind where the heap is large enough
/// (`DeviceHeap::stock_arenas`).
///
/// # Safety
/// As for `toga_heap_init_finish`, after it completed, and before any kernel allocates.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_heap_stock_arenas(base: *mut u8) {
    // SAFETY: kernel contract.
    unsafe { DeviceHeap::from_base(base) }.stock_arenas(platform::global_thread_id());
}

/// Make `base` the heap of this module's `malloc`/`free`/`GlobalAlloc` (0 unbinds).
///
/// # Safety
/// `base` is 0 or an initialized heap that outlives every kernel of this module that allocates.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_bind_heap(base: *mut u8) {
    if platform::global_thread_id() == 0 {
        // SAFETY: kernel contract.
        unsafe { heap::bind(base) };
    }
}

/// Give back what the heap holds but does not use (`DeviceHeap::trim`): every thread gives
/// stashed large blocks back to the tree, one at a time (`DeviceHeap::flush_stashes`), so
/// that their climbs run side by side; thread 0 then trims UAlloc, which more threads would
/// only join.
///
/// # Safety
/// `base` is an initialized heap.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_trim(base: *mut u8) {
    // SAFETY: kernel contract.
    let heap = unsafe { DeviceHeap::from_base(base) };
    heap.flush_stashes();
    if platform::global_thread_id() == 0 {
        heap.trim();
    }
}

/// Initialization of a growable heap, step 2: one thread leaves the tree empty (launched after
/// `toga_heap_init_nodes`); `toga_heap_add_range` then adds the mapped granules.
///
/// # Safety
/// As for `toga_heap_init_finish`, for a heap laid out by `Geometry::growable`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_heap_init_growable_finish(base: *mut u8) {
    if platform::global_thread_id() == 0 {
        // SAFETY: kernel contract.
        unsafe { DeviceHeap::from_base(base) }.init_growable_finish();
    }
}

/// Add `bytes` of freshly mapped memory at data offset `offset` to a growable heap (one thread).
///
/// # Safety
/// `base` is an initialized growable heap; the range is whole granules, mapped, and not in it.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_heap_add_range(base: *mut u8, offset: u64, bytes: u64) {
    if platform::global_thread_id() == 0 {
        // SAFETY: kernel contract.
        unsafe { DeviceHeap::from_base(base) }.add_range(offset, bytes);
    }
}

/// Take up to `max` free granules out of a growable heap (one thread): their data offsets go
/// to `out`, their number to `*count`. The host unmaps them afterwards.
///
/// # Safety
/// `base` is an initialized heap; `out` holds `max` words and `count` one.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_heap_take_granules(
    base: *mut u8,
    out: *mut u64,
    max: u64,
    count: *mut u64,
) {
    if platform::global_thread_id() == 0 {
        // SAFETY: kernel contract.
        unsafe {
            let out = core::slice::from_raw_parts_mut(out, max as usize);
            *count = DeviceHeap::from_base(base).take_granules(out) as u64;
        }
    }
}

/// Take in a growth the host granted after its asker gave up (one thread).
///
/// # Safety
/// `base` is an initialized heap.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_heap_collect(base: *mut u8) {
    if platform::global_thread_id() == 0 {
        // SAFETY: kernel contract.
        unsafe { DeviceHeap::from_base(base) }.collect_growth();
    }
}

/// Where a quiescent heap's memory is (`DeviceHeap::census`), written to `out` (one thread; a
/// diagnostic for tests).
///
/// # Safety
/// `base` is an initialized heap nothing else uses meanwhile; `out` is a `HeapCensus`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_heap_census(base: *mut u8, out: *mut heap::HeapCensus) {
    if platform::global_thread_id() == 0 {
        // SAFETY: kernel contract.
        unsafe { *out = DeviceHeap::from_base(base).census() };
    }
}
