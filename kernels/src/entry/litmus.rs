//! Litmus kernels for the platform layer: the GPU tests in `tests/platform_gpu.rs` launch them
//! and compare what they record with what the memory model and the warp rules promise.

use crate::platform::{self, Atomic32, Atomic64};

/// Smoke test: thread `i` writes `i * 3 + 1` into `out[i]` and bumps `count[0]`.
///
/// # Safety
/// `out` has `n` elements; `count` has one.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_smoke(out: *mut u32, count: *const Atomic32, n: u32) {
    let i = platform::global_thread_id();
    if i < n as u64 {
        // SAFETY: `i < n` and `out` has `n` elements (kernel contract).
        unsafe { *out.add(i as usize) = i as u32 * 3 + 1 };
        // SAFETY: `count` points at one word (kernel contract).
        unsafe { &*count }.fetch_add_relaxed(1);
    }
}

/// Message passing across blocks. Even blocks write: for round `1..=rounds`, `data[s] = r`
/// (relaxed) then `flag[s] = r` (release). Odd blocks read: `f = flag[s]` (acquire) then
/// `d = data[s]` (relaxed). A reader that sees `d < f` saw the flag without the data it
/// publishes: a stale read. `result[0]` counts stale reads, `result[1]` trials with `f > 0`.
///
/// # Safety
/// `data` and `flag` have `blockDim.x * gridDim.x / 2` elements each; `result` has two.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_litmus_message_passing(
    data: *const Atomic32,
    flag: *const Atomic32,
    result: *const Atomic64,
    rounds: u32,
) {
    use core::arch::nvptx::*;
    // SAFETY: special-register reads.
    let (block, dim, tid) = unsafe {
        (
            _block_idx_x() as usize,
            _block_dim_x() as usize,
            _thread_idx_x() as usize,
        )
    };
    let slot = (block / 2) * dim + tid;
    // SAFETY: `slot` is below half the grid (kernel contract).
    let (data, flag) = unsafe { (&*data.add(slot), &*flag.add(slot)) };
    if block % 2 == 0 {
        for r in 1..=rounds {
            data.store_relaxed(r);
            // Pairs with the acquire load of the reader below.
            flag.store_release(r);
        }
    } else {
        let (mut stale, mut trials) = (0u64, 0u64);
        for _ in 0..rounds {
            // Pairs with the writer's release store: data written before it must be visible.
            let f = flag.load_acquire();
            let d = data.load_relaxed();
            if f > 0 {
                trials += 1;
                stale += (d < f) as u64;
            }
        }
        // SAFETY: `result` has two words (kernel contract).
        let result = unsafe { core::slice::from_raw_parts(result, 2) };
        result[0].fetch_add_relaxed(stale);
        result[1].fetch_add_relaxed(trials);
    }
}

/// Every read-modify-write under full-grid contention. Thread `i` (of `n`):
/// - `words[0] += i + 1`; `words[1]` incremented by a CAS loop;
/// - `words[2] = min(words[2], key(i))`, `words[3] = max(words[3], key(i))`;
/// - `exch[i] = swap(words[4], i + 1)` (the old values and the final one are a permutation of `0..=n`);
/// - sets bit `i` of `bits_or` with `fetch_or` and clears bit `i` of `bits_and` with `fetch_and`,
///   counting in `words[5]` any old value that already had its bit in the wrong state;
/// - `words32[0] += 1` (32-bit add).
///
/// `key(i) = (i * 2654435761) mod 2^32 + 1`.
///
/// # Safety
/// `words` has 6 elements, `words32` one, `exch` `n`, `bits_or`/`bits_and` `n / 64` rounded up.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_litmus_atomics(
    words: *const Atomic64,
    words32: *const Atomic32,
    exch: *mut u64,
    bits_or: *const Atomic64,
    bits_and: *const Atomic64,
    n: u64,
) {
    let i = platform::global_thread_id();
    if i >= n {
        return;
    }
    // SAFETY: sizes per the kernel contract.
    let w = unsafe { core::slice::from_raw_parts(words, 6) };
    w[0].fetch_add_relaxed(i + 1);
    let mut cur = w[1].load_relaxed();
    let mut backoff = platform::Backoff::new();
    loop {
        match w[1].compare_exchange_acq_rel(cur, cur + 1) {
            Ok(_) => break,
            Err(actual) => {
                cur = actual;
                backoff.snooze();
            }
        }
    }
    let key = ((i * 2_654_435_761) & 0xffff_ffff) + 1;
    w[2].fetch_min_relaxed(key);
    w[3].fetch_max_relaxed(key);
    // SAFETY: `exch` has `n` elements and `i < n`.
    unsafe { *exch.add(i as usize) = w[4].swap_acq_rel(i + 1) };
    let bit = 1u64 << (i % 64);
    // SAFETY: the bitmaps have `ceil(n / 64)` words.
    let (or_word, and_word) = unsafe {
        (
            &*bits_or.add((i / 64) as usize),
            &*bits_and.add((i / 64) as usize),
        )
    };
    let wrong = (or_word.fetch_or_acq_rel(bit) & bit != 0) as u64
        + (and_word.fetch_and_acq_rel(!bit) & bit == 0) as u64;
    if wrong != 0 {
        w[5].fetch_add_relaxed(wrong);
    }
    // SAFETY: `words32` has one element.
    unsafe { &*words32 }.fetch_add_relaxed(1);
}

/// Warp collectives on divergent masks. Each thread computes `pred(i) = (i * 0x9E3779B9) >> 29 != 0`
/// (about 7 lanes in 8 take part), the warp takes `mask = ballot(full, pred)`, and the taking lanes
/// record, in `out[i * 6 ..]`: `active_mask()`, `ballot(mask, lane % 3 == 0)`,
/// `match_any(mask, lane % 5)`, `shfl_idx(mask, lane * 10 + 7, leader)`,
/// `shfl_down(mask, lane * 10 + 7, 1)`, `mask`. Lanes that do not take part write `u32::MAX`.
///
/// # Safety
/// `out` has `6 * n` elements; the grid has `n` threads, a multiple of 32.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_litmus_warp(out: *mut u32) {
    let i = platform::global_thread_id();
    let lane = platform::lane_id();
    let pred = ((i as u32).wrapping_mul(0x9E37_79B9) >> 29) != 0;
    let mask = platform::ballot(u32::MAX, pred);
    // SAFETY: `out` has six slots per thread (kernel contract).
    let out = unsafe { core::slice::from_raw_parts_mut(out.add(i as usize * 6), 6) };
    if pred {
        let leader = platform::leader_of(mask);
        out[0] = platform::active_mask();
        out[1] = platform::ballot(mask, lane % 3 == 0);
        out[2] = platform::match_any(mask, (lane % 5) as u64);
        out[3] = platform::shfl_idx_u32(mask, lane * 10 + 7, leader);
        out[4] = platform::shfl_down_u32(mask, lane * 10 + 7, 1);
        out[5] = mask;
    } else {
        out.fill(u32::MAX);
    }
}

/// Every thread records its SM and the SM-id bound: `out[2i] = %smid`, `out[2i + 1] = %nsmid`.
///
/// # Safety
/// `out` has `2 * n` elements for a grid of `n` threads.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn toga_litmus_smid(out: *mut u32) {
    let i = platform::global_thread_id() as usize;
    // SAFETY: two slots per thread (kernel contract).
    unsafe {
        *out.add(2 * i) = platform::sm_id();
        *out.add(2 * i + 1) = platform::sm_count();
    }
}
