//! Workload kernels shared by the GPU tests, the `host` harness and the benchmarks, and the two
//! baselines (CUDA's device malloc and a bump allocator). Thread `i` of a 1-D grid handles element
//! `i < n`; `base` is an initialized heap.

use alloc::vec::Vec;
use core::arch::nvptx;

use crate::heap::DeviceHeap;
use crate::pattern;
use crate::platform::{self, Atomic64};

fn tid() -> usize {
    platform::global_thread_id() as usize
}

/// Errors are counted in `errors[0]` (pattern words or bytes wrong) and `errors[1]` (other).
fn count_error(errors: *const Atomic64, which: usize, n: u64) {
    if n != 0 {
        // SAFETY: `errors` has two words (every kernel's contract).
        unsafe { &*errors.add(which) }.fetch_add_relaxed(n);
    }
}

/// `ptrs[i] = malloc(sizes[i])`, then fill the block with the pattern of `(i, tag)`; each
/// thread takes `i = tid, tid + grid threads, ...` (one index each when the grid has `n`).
///
/// # Safety
/// `ptrs` and `sizes` have `n` elements.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_alloc_fill(
    base: *mut u8,
    ptrs: *mut u64,
    sizes: *const u32,
    n: u64,
    tag: u32,
) {
    // SAFETY: kernel contract.
    let heap = unsafe { DeviceHeap::from_base(base) };
    let mut i = tid() as u64;
    while i < n {
        // SAFETY: kernel contract.
        let size = unsafe { *sizes.add(i as usize) } as usize;
        let p = heap.malloc(size);
        if !p.is_null() {
            // SAFETY: `p` holds `size` bytes, aligned to 16.
            unsafe { pattern::fill(p, size, i, tag) };
        }
        // SAFETY: kernel contract.
        unsafe { *ptrs.add(i as usize) = p as u64 };
        i += platform::grid_threads();
    }
}

/// Check the pattern of `ptrs[i]` (if not null) and, when `free != 0`, free it; indices as in
/// `toga_alloc_fill`.
///
/// # Safety
/// `ptrs`/`sizes` as filled by `toga_alloc_fill` with the same `tag`; `errors` has two words.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_check_free(
    base: *mut u8,
    ptrs: *const u64,
    sizes: *const u32,
    n: u64,
    tag: u32,
    free: u32,
    errors: *const Atomic64,
) {
    // SAFETY: kernel contract.
    let heap = unsafe { DeviceHeap::from_base(base) };
    let mut i = tid() as u64;
    while i < n {
        // SAFETY: kernel contract.
        let (p, size) = unsafe {
            (
                *ptrs.add(i as usize) as *mut u8,
                *sizes.add(i as usize) as usize,
            )
        };
        if !p.is_null() {
            // SAFETY: `p` is a live block of `size` bytes filled for `(i, tag)`.
            count_error(errors, 0, unsafe { pattern::check(p, size, i, tag) });
            if free != 0 {
                // SAFETY: `p` came from this heap and is freed once.
                unsafe { heap.free(p) };
            }
        }
        i += platform::grid_threads();
    }
}

/// Benchmark: `ptrs[i] = malloc(size)`.
///
/// # Safety
/// `ptrs` has `n` elements.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_malloc(base: *mut u8, ptrs: *mut u64, size: u32, n: u64) {
    let i = tid();
    if (i as u64) < n {
        // SAFETY: kernel contract.
        unsafe { *ptrs.add(i) = DeviceHeap::from_base(base).malloc(size as usize) as u64 };
    }
}

/// Benchmark: `free(ptrs[i])`.
///
/// # Safety
/// `ptrs` has `n` elements from `toga_malloc` on the same heap (nulls allowed).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_free(base: *mut u8, ptrs: *const u64, n: u64) {
    let i = tid();
    if (i as u64) < n {
        // SAFETY: kernel contract.
        unsafe { DeviceHeap::from_base(base).free(*ptrs.add(i) as *mut u8) };
    }
}

/// Benchmark: `malloc(size)`, write one word, `free`, in one kernel; nulls counted in
/// `errors[1]`.
///
/// # Safety
/// `errors` has two words.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_malloc_free(
    base: *mut u8,
    size: u32,
    n: u64,
    errors: *const Atomic64,
) {
    let i = tid();
    if (i as u64) >= n {
        return;
    }
    // SAFETY: kernel contract.
    let heap = unsafe { DeviceHeap::from_base(base) };
    let p = heap.malloc(size as usize);
    if p.is_null() {
        count_error(errors, 1, 1);
    } else {
        // SAFETY: `p` holds at least `size` ≥ 4 bytes... or fewer: write one byte.
        unsafe {
            p.write_volatile(i as u8);
            heap.free(p);
        }
    }
}

/// Baseline: CUDA's device `malloc`.
///
/// # Safety
/// `ptrs` has `n` elements; the context's malloc heap limit was raised before loading.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn cuda_malloc(ptrs: *mut u64, size: u32, n: u64) {
    let i = tid();
    if (i as u64) < n {
        // SAFETY: kernel contract.
        unsafe { *ptrs.add(i) = nvptx::malloc(size as usize) as u64 };
    }
}

/// Baseline: CUDA's device `free`.
///
/// # Safety
/// `ptrs` from `cuda_malloc`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn cuda_free(ptrs: *const u64, n: u64) {
    let i = tid();
    if (i as u64) < n {
        // SAFETY: kernel contract.
        unsafe { nvptx::free(*ptrs.add(i) as *mut core::ffi::c_void) };
    }
}

/// Baseline: a bump allocator, one `atom.add` per thread on one global word, no reuse: the
/// practical ceiling. `bump[0]` is the offset into `arena` of `limit` bytes; past it, null.
///
/// # Safety
/// `ptrs` has `n` elements; `bump` one word.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn bump_malloc(
    ptrs: *mut u64,
    size: u32,
    n: u64,
    bump: *const Atomic64,
    arena: u64,
    limit: u64,
) {
    let i = tid();
    if (i as u64) < n {
        let size = (size as u64).div_ceil(16) * 16;
        // SAFETY: kernel contract.
        let off = unsafe { &*bump }.fetch_add_relaxed(size);
        let p = if off + size <= limit { arena + off } else { 0 };
        // SAFETY: kernel contract.
        unsafe { *ptrs.add(i) = p };
    }
}

/// Each thread grows a `Vec<u64>` to `len` elements through `GlobalAlloc`, checks it, and writes
/// the sum to `out[i]` (`u64::MAX` if an allocation failed).
///
/// # Safety
/// `out` has `n` elements; a heap is bound to this module.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_vec_push(out: *mut u64, n: u64, len: u32) {
    let i = tid();
    if (i as u64) >= n {
        return;
    }
    let mut v: Vec<u64> = Vec::new();
    let mut sum = 0u64;
    for k in 0..len as u64 {
        if v.try_reserve(1).is_err() {
            sum = u64::MAX;
            break;
        }
        v.push(i as u64 * 1000 + k);
    }
    if sum != u64::MAX {
        sum = v
            .iter()
            .enumerate()
            .map(|(k, &x)| {
                if x == i as u64 * 1000 + k as u64 {
                    x
                } else {
                    0
                }
            })
            .sum();
    }
    // SAFETY: kernel contract.
    unsafe { *out.add(i) = sum };
}

/// Fragmentation churn: each thread keeps up to `SLOTS` live blocks and, for `rounds` steps,
/// frees one (checking its pattern) or allocates a random size in `[min, max]`. Everything is
/// freed at the end. `errors[0]`: corrupted patterns; `errors[1]`: failed allocations.
///
/// # Safety
/// `errors` has two words.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_churn(
    base: *mut u8,
    n: u64,
    rounds: u32,
    seed: u32,
    min: u32,
    max: u32,
    errors: *const Atomic64,
) {
    const SLOTS: usize = 4;
    let i = tid();
    if (i as u64) >= n {
        return;
    }
    // SAFETY: kernel contract.
    let heap = unsafe { DeviceHeap::from_base(base) };
    let mut live: [(*mut u8, u32, u32); SLOTS] = [(core::ptr::null_mut(), 0, 0); SLOTS];
    let mut rng = (i as u64 ^ (seed as u64) << 32).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut bad, mut failed) = (0, 0);
    for round in 0..rounds {
        let r = next();
        let slot = (r % SLOTS as u64) as usize;
        let (p, size, tag) = live[slot];
        if !p.is_null() {
            // SAFETY: a live block filled with `(i, tag)`.
            unsafe {
                bad += pattern::check(p, size as usize, i as u64, tag);
                heap.free(p);
            }
            live[slot].0 = core::ptr::null_mut();
        } else {
            let size = min + ((r >> 32) % (max - min + 1) as u64) as u32;
            let p = heap.malloc(size as usize);
            if p.is_null() {
                failed += 1;
            } else {
                // SAFETY: `p` holds `size` bytes.
                unsafe { pattern::fill(p, size as usize, i as u64, round) };
                live[slot] = (p, size, round);
            }
        }
    }
    for (p, size, tag) in live {
        if !p.is_null() {
            // SAFETY: a live block filled with `(i, tag)`.
            unsafe {
                bad += pattern::check(p, size as usize, i as u64, tag);
                heap.free(p);
            }
        }
    }
    count_error(errors, 0, bad);
    count_error(errors, 1, failed);
}

/// Spreads consecutive thread ids over the xorshift state (2^64 / φ, odd).
const SEED_MIX: u64 = 0x9E37_79B9_7F4A_7C15;
/// Bytes the bump baseline rounds every block up to, so its blocks are aligned as toga's are.
const BUMP_ALIGN: u64 = 16;
/// Bytes of a pattern word the `*_churn_pairs` kernels write.
const CHURN_WORD: usize = size_of::<u32>();

/// A block a `*_churn_pairs` thread holds for one round: its first word (null: none) and the
/// index of its last. The pattern's tag is the round that `malloc`ed it, which the loop knows.
#[derive(Clone, Copy)]
struct Held {
    words: *mut u32,
    last: u32,
}

impl Held {
    const NONE: Self = Self {
        words: core::ptr::null_mut(),
        last: 0,
    };

    /// Write the block's first and last pattern words for `(owner, round)`.
    ///
    /// # Safety
    /// `words` holds at least `last + 1` words (a live block).
    #[inline(always)]
    unsafe fn write(self, owner: u64, round: u32) {
        let last = self.last as usize;
        // SAFETY: words 0 and `last` are inside the block (caller).
        unsafe {
            self.words.write_volatile(pattern::word(owner, round, 0));
            self.words
                .add(last)
                .write_volatile(pattern::word(owner, round, last));
        }
    }

    /// How many of the two words [`write`](Self::write) wrote for `(owner, round)` now differ.
    ///
    /// # Safety
    /// As [`write`](Self::write): the block is still live.
    #[inline(always)]
    unsafe fn check(self, owner: u64, round: u32) -> u64 {
        let last = self.last as usize;
        // SAFETY: words 0 and `last` are inside the block (caller).
        let (first_word, last_word) = unsafe {
            (
                self.words.read_volatile(),
                self.words.add(last).read_volatile(),
            )
        };
        (first_word != pattern::word(owner, round, 0)) as u64
            + (last_word != pattern::word(owner, round, last)) as u64
    }
}

/// The loop of the `*_churn_pairs` kernels for thread `i`: `rounds` times, `malloc` a size drawn
/// uniformly from `[min, max]` (a seeded xorshift per thread: the same sizes for every allocator)
/// and write the block's first and last 4-byte words with the pattern of `(i, round)`; then check
/// and `free` the block of the round before. Each block is checked when it is freed, a round
/// (one `malloc` of its owner) after its words were written, so a block the allocator also
/// handed to another thread in that time shows as words the other owner overwrote (as
/// `toga_churn` checks its blocks; checked right after the write, an overlap would show only if
/// the other write fell between the two). A thread holds at most two blocks, and each round is
/// still one `malloc` and one `free`; a last pass without a `malloc` checks and frees the last
/// block. Returns (words wrong at free, failed mallocs).
///
/// `malloc` returns null or a block of at least the size asked, 4-byte aligned; `free` is given
/// each block `malloc` returned exactly once. The caller guarantees `CHURN_WORD <= min <= max <
/// u32::MAX`.
#[inline(always)]
fn churn_pairs_loop(
    i: u64,
    rounds: u32,
    seed: u32,
    (min, max): (u32, u32),
    mut malloc: impl FnMut(usize) -> *mut u8,
    mut free: impl FnMut(*mut u8),
) -> (u64, u64) {
    let mut rng = (i ^ (seed as u64) << 32).wrapping_mul(SEED_MIX) | 1;
    let span = (max - min + 1) as u64;
    let (mut bad, mut failed) = (0, 0);
    // The block of round `round - 1`, checked and freed in round `round`. One pass more than
    // `rounds` frees the last block without a `malloc`, at the loop's one call site of `free`.
    let mut held = Held::NONE;
    for round in 0..rounds as u64 + 1 {
        let round = round as u32;
        let new = if round < rounds {
            // xorshift64 (Marsaglia's 13, 7, 17), as `toga_churn` and the host's `uniform_sizes`.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let size = min as usize + ((rng >> 32) % span) as usize;
            let block = Held {
                words: malloc(size) as *mut u32,
                last: (size / CHURN_WORD - 1) as u32,
            };
            if block.words.is_null() {
                failed += 1;
            } else {
                // SAFETY: the block holds `size` ≥ `CHURN_WORD` bytes, 4-byte aligned
                // (`malloc`'s contract), so words 0 and `last` are inside it.
                unsafe { block.write(i, round) };
            }
            block
        } else {
            Held::NONE
        };
        if !held.words.is_null() {
            // SAFETY: `held` is live until this `free`, the one it is given.
            bad += unsafe { held.check(i, round.wrapping_sub(1)) };
            free(held.words as *mut u8);
        }
        held = new;
    }
    (bad, failed)
}

/// Benchmark (churn of malloc/free pairs): each of `n` threads, `rounds` times, `malloc`s a size
/// in `[min, max]` and writes its first and last words, then checks those of the block it
/// `malloc`ed the round before and `free`s it (`churn_pairs_loop`): one `malloc` and one `free`
/// per round, at most two live blocks per thread. `errors[0]`: words found wrong at `free`;
/// `errors[1]`: failed mallocs.
///
/// # Safety
/// `errors` has two words; `4 <= min <= max < u32::MAX`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_churn_pairs(
    base: *mut u8,
    n: u64,
    rounds: u32,
    seed: u32,
    min: u32,
    max: u32,
    errors: *const Atomic64,
) {
    let i = tid();
    if (i as u64) >= n {
        return;
    }
    // SAFETY: kernel contract.
    let heap = unsafe { DeviceHeap::from_base(base) };
    let (bad, failed) = churn_pairs_loop(
        i as u64,
        rounds,
        seed,
        (min, max),
        |size| heap.malloc(size),
        // SAFETY: `churn_pairs_loop` frees each block this heap's `malloc` gave it, once.
        |p| unsafe { heap.free(p) },
    );
    count_error(errors, 0, bad);
    count_error(errors, 1, failed);
}

/// Baseline of `toga_churn_pairs` with CUDA's device `malloc` and `free`: the same sizes, writes,
/// checks and counts.
///
/// # Safety
/// As `toga_churn_pairs`; the context's malloc heap limit was raised before loading.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn cuda_churn_pairs(
    n: u64,
    rounds: u32,
    seed: u32,
    min: u32,
    max: u32,
    errors: *const Atomic64,
) {
    let i = tid();
    if (i as u64) >= n {
        return;
    }
    let (bad, failed) = churn_pairs_loop(
        i as u64,
        rounds,
        seed,
        (min, max),
        // SAFETY: CUDA's device malloc may be called from any thread.
        |size| unsafe { nvptx::malloc(size) as *mut u8 },
        // SAFETY: `churn_pairs_loop` frees each block CUDA's `malloc` gave it, once.
        |p| unsafe { nvptx::free(p as *mut core::ffi::c_void) },
    );
    count_error(errors, 0, bad);
    count_error(errors, 1, failed);
}

/// Baseline of `toga_churn_pairs` with the bump allocator: `malloc` is one `atom.add` on
/// `bump[0]`, its offset taken modulo `ring_bytes` into `ring`, and `free` does nothing: the same
/// sizes, writes, checks and atomics per pair with no reuse logic, the practical ceiling. A word
/// found wrong would mean the ring wrapped past a block between its write and its check (a round
/// of its owner later).
///
/// # Safety
/// As `toga_churn_pairs`; `bump` has one word; `ring_bytes` is a power of two and `ring` holds
/// `ring_bytes + max` bytes (a block may start just below `ring_bytes`).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn bump_churn_pairs(
    n: u64,
    rounds: u32,
    seed: u32,
    min: u32,
    max: u32,
    bump: *const Atomic64,
    ring: *mut u8,
    ring_bytes: u64,
    errors: *const Atomic64,
) {
    let i = tid();
    if (i as u64) >= n {
        return;
    }
    // SAFETY: kernel contract.
    let bump = unsafe { &*bump };
    let (bad, failed) = churn_pairs_loop(
        i as u64,
        rounds,
        seed,
        (min, max),
        |size| {
            let size = (size as u64).div_ceil(BUMP_ALIGN) * BUMP_ALIGN;
            let off = bump.fetch_add_relaxed(size) & (ring_bytes - 1);
            // SAFETY: `off < ring_bytes`, and `ring` holds `ring_bytes + max` bytes.
            unsafe { ring.add(off as usize) }
        },
        |_| {},
    );
    count_error(errors, 0, bad);
    count_error(errors, 1, failed);
}

/// Whole-heap check, one thread, on a quiescent heap: `out[0]` = free bytes TBuddy holds,
/// `out[1]` = 1 if a block of the tree's largest order could be taken (and it is given back).
///
/// # Safety
/// `out` has two words; nothing else runs on the heap.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_heap_probe(base: *mut u8, out: *mut u64) {
    if tid() != 0 {
        return;
    }
    // SAFETY: kernel contract.
    let buddy = unsafe { DeviceHeap::from_base(base) }.buddy();
    let free = buddy.available_pages() << crate::tbuddy::PAGE_SHIFT;
    let whole = match buddy.alloc(buddy.max_order()) {
        Some(off) => {
            buddy.free(off, buddy.max_order());
            1
        }
        None => 0,
    };
    // SAFETY: kernel contract.
    unsafe {
        *out = free;
        *out.add(1) = whole;
    }
}

/// Benchmark: `ptrs[i] = malloc(sizes[i])`.
///
/// # Safety
/// `ptrs` and `sizes` have `n` elements.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_malloc_sizes(
    base: *mut u8,
    ptrs: *mut u64,
    sizes: *const u32,
    n: u64,
) {
    let i = tid();
    if (i as u64) < n {
        // SAFETY: kernel contract.
        unsafe { *ptrs.add(i) = DeviceHeap::from_base(base).malloc(*sizes.add(i) as usize) as u64 };
    }
}

/// Benchmark of one thread's latency: thread 0 alone makes `ptrs[i] = malloc(sizes[i])` for
/// every `i < n`, one after another (launch it as one thread).
///
/// # Safety
/// `ptrs` and `sizes` have `n` elements.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_malloc_serial(
    base: *mut u8,
    ptrs: *mut u64,
    sizes: *const u32,
    n: u64,
) {
    if tid() != 0 {
        return;
    }
    // SAFETY: kernel contract.
    let heap = unsafe { DeviceHeap::from_base(base) };
    for i in 0..n as usize {
        // SAFETY: kernel contract.
        unsafe { *ptrs.add(i) = heap.malloc(*sizes.add(i) as usize) as u64 };
    }
}

/// Baseline: `ptrs[i] = CUDA malloc(sizes[i])`.
///
/// # Safety
/// `ptrs` and `sizes` have `n` elements; the malloc heap limit was raised before loading.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn cuda_malloc_sizes(ptrs: *mut u64, sizes: *const u32, n: u64) {
    let i = tid();
    if (i as u64) < n {
        // SAFETY: kernel contract.
        unsafe { *ptrs.add(i) = nvptx::malloc(*sizes.add(i) as usize) as u64 };
    }
}

/// `out` = sizes of the shared structures as the GPU build lays them out, for the host to compare
/// with its own: `[HeapHeader, StatsShard, Arena, Geometry]`.
///
/// # Safety
/// `out` has four words.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_layout(out: *mut u64) {
    if tid() == 0 {
        let sizes = [
            size_of::<crate::heap::HeapHeader>(),
            size_of::<crate::heap::StatsShard>(),
            size_of::<crate::ualloc::Arena>(),
            size_of::<crate::heap::Geometry>(),
        ];
        for (k, s) in sizes.into_iter().enumerate() {
            // SAFETY: four words (kernel contract).
            unsafe { *out.add(k) = s as u64 };
        }
    }
}
