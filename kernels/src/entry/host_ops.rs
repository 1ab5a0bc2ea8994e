//! Stream-ordered allocation from the host: the kernels behind `Heap::alloc_async`,
//! `Heap::free_async` and their batched forms. Each is the heap's own `malloc`/`free` on
//! threads of a small launch, so a block the host allocates is an ordinary block (a kernel may
//! free it), a block a kernel allocated may be freed here, and the heap's statistics count
//! both.
//!
//! In every module that links toga-kernels, like `heap`: the host's heap needs them whatever
//! module it was created with.

use crate::heap::DeviceHeap;
use crate::platform;

/// `*slot = malloc(bytes)` on one thread (null when the heap has no such block).
///
/// # Safety
/// `base` is an initialized heap; `slot` points to one writable `u64`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_host_malloc(base: *mut u8, bytes: u64, slot: *mut u64) {
    if platform::global_thread_id() == 0 {
        // SAFETY: kernel contract.
        let heap = unsafe { DeviceHeap::from_base(base) };
        let p = heap.malloc(bytes as usize);
        // SAFETY: kernel contract.
        unsafe { slot.write_volatile(p as u64) };
    }
}

/// Thread `i < n`: `out[i] = malloc(sizes[i])`, or `malloc(size)` when `sizes` is null.
///
/// # Safety
/// `base` is an initialized heap; `out` holds `n` words, and `sizes` is null or holds `n`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_host_malloc_batch(
    base: *mut u8,
    sizes: *const u64,
    size: u64,
    out: *mut u64,
    n: u64,
) {
    let i = platform::global_thread_id();
    if i >= n {
        return;
    }
    // SAFETY: kernel contract.
    let heap = unsafe { DeviceHeap::from_base(base) };
    let bytes = if sizes.is_null() {
        size
    } else {
        // SAFETY: `i < n`, the length of `sizes`.
        unsafe { *sizes.add(i as usize) }
    };
    let p = heap.malloc(bytes as usize);
    // SAFETY: `i < n`, the length of `out`.
    unsafe { *out.add(i as usize) = p as u64 };
}

/// Free one block on one thread: the pointer in `*slot` (which is then cleared) when `slot` is
/// not null, else `ptr`. A pointer the heap did not hand out, or one freed already, is counted
/// by the heap's `free` and changes nothing else.
///
/// # Safety
/// `base` is an initialized heap; `slot` is null or points to one `u64` the host owns.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_host_free(base: *mut u8, ptr: u64, slot: *mut u64) {
    if platform::global_thread_id() != 0 {
        return;
    }
    // SAFETY: kernel contract.
    let heap = unsafe { DeviceHeap::from_base(base) };
    let p = if slot.is_null() {
        ptr
    } else {
        // SAFETY: kernel contract.
        unsafe {
            let p = slot.read_volatile();
            slot.write_volatile(0);
            p
        }
    };
    // SAFETY: `free` detects and counts the misuse it can; the rest is the host's contract.
    unsafe { heap.free(p as *mut u8) };
}

/// Thread `i < n` frees `ptrs[i]` (null entries are skipped, as `free(null)` is) and, when
/// `clear` is nonzero, sets the entry to null.
///
/// # Safety
/// `base` is an initialized heap; `ptrs` holds `n` words.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_host_free_batch(
    base: *mut u8,
    ptrs: *mut u64,
    n: u64,
    clear: u32,
) {
    let i = platform::global_thread_id();
    if i >= n {
        return;
    }
    // SAFETY: kernel contract.
    let heap = unsafe { DeviceHeap::from_base(base) };
    // SAFETY: `i < n`, the length of `ptrs`.
    let at = unsafe { ptrs.add(i as usize) };
    // SAFETY: as above.
    let p = unsafe { *at };
    // SAFETY: as in `toga_host_free`.
    unsafe { heap.free(p as *mut u8) };
    if clear != 0 {
        // SAFETY: as above.
        unsafe { *at = 0 };
    }
}

/// Test kernel (harness only): thread `i < n` takes the block `ptrs[i]` (when `indirect` is
/// nonzero, `ptrs[i]` is the address of a slot that holds the block's pointer, as a
/// `HostBlock`'s does) of `sizes[i]` bytes and fills it with the pattern of `(i, tag)`, or,
/// when `check` is nonzero, counts its wrong words in `errors[0]`. A null block counts one in
/// `errors[1]`.
///
/// # Safety
/// `ptrs` and `sizes` hold `n` words, `errors` two; every non-null block holds its size.
#[cfg(feature = "harness")]
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn toga_host_pattern(
    ptrs: *const u64,
    indirect: u32,
    sizes: *const u64,
    n: u64,
    tag: u32,
    check: u32,
    errors: *const crate::platform::Atomic64,
) {
    let i = platform::global_thread_id();
    if i >= n {
        return;
    }
    // SAFETY: kernel contract.
    let (mut p, size) = unsafe { (*ptrs.add(i as usize), *sizes.add(i as usize) as usize) };
    if indirect != 0 && p != 0 {
        // SAFETY: a slot the host owns.
        p = unsafe { (p as *const u64).read_volatile() };
    }
    let (which, bad) = if p == 0 {
        (1, 1)
    } else if check != 0 {
        // SAFETY: a live block of `size` bytes, filled for `(i, tag)`.
        (0, unsafe {
            crate::pattern::check(p as *const u8, size, i, tag)
        })
    } else {
        // SAFETY: a live block of `size` bytes.
        unsafe { crate::pattern::fill(p as *mut u8, size, i, tag) };
        (0, 0)
    };
    if bad != 0 {
        // SAFETY: `errors` holds two words.
        unsafe { &*errors.add(which) }.fetch_add_relaxed(bad);
    }
}

/// Test kernel (harness only): thread `i < n` frees `ptrs[i]` with the free function `free`,
/// into whatever heap the host bound to this module (a block of a heap on another device is
/// not in it, and is counted as a foreign free).
///
/// # Safety
/// `ptrs` holds `n` words.
#[cfg(feature = "harness")]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_bound_free(ptrs: *const u64, n: u64) {
    let i = platform::global_thread_id();
    if i < n {
        // SAFETY: kernel contract; the bound heap's `free` counts what is not its own.
        unsafe { crate::free(*ptrs.add(i as usize) as *mut u8) };
    }
}
