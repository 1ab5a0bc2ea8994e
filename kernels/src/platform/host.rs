//! Host backend: OS threads stand in for GPU threads; a warp is one lane.

use core::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use core::sync::atomic::{AtomicU32, AtomicU64};
use std::cell::Cell;

#[path = "cpu.rs"]
mod cpu;
pub use cpu::*;

// `new` is const here as on the GPU, so statics work the same on both.
cpu::cpu_atomic!(Atomic32, u32, AtomicU32, const);
cpu::cpu_atomic!(Atomic64, u64, AtomicU64, const);

#[inline]
pub fn fence_acq_rel() {
    core::sync::atomic::fence(AcqRel)
}
#[inline]
pub fn fence_sc() {
    core::sync::atomic::fence(SeqCst)
}

/// How many "SMs" host threads are spread over.
pub const HOST_SM_COUNT: u32 = 8;

static NEXT_SM: AtomicU32 = AtomicU32::new(0);
std::thread_local! {
    static SM: Cell<u32> = Cell::new(NEXT_SM.fetch_add(1, Relaxed) % HOST_SM_COUNT);
}

/// The "SM" of this host thread: threads are dealt round-robin over [`HOST_SM_COUNT`].
pub fn sm_id() -> u32 {
    SM.with(|s| s.get())
}
/// Tests: this host thread stands for SM `id` from now on (its arena is `id % arenas`), so that
/// one thread can play the warps of many SMs in the order a GPU would run them.
pub fn set_sm_id(id: u32) {
    SM.with(|s| s.set(id))
}
pub fn sm_count() -> u32 {
    HOST_SM_COUNT
}

/// On the host a spinning thread yields; sleeping would only slow the tests down.
pub fn nanosleep(_ns: u32) {
    std::thread::yield_now()
}

pub fn global_timer_ns() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A seed that differs between threads (and over time): spreads claimers over a bin's words.
pub fn spread_seed() -> u32 {
    (global_timer_ns().wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32
}
