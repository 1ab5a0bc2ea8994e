//! Model backend (`--cfg loom`): loom's atomics, so the model checker explores every
//! interleaving the C11 memory model allows. A warp is one lane.

use loom::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use loom::sync::atomic::{AtomicU32, AtomicU64};

#[path = "cpu.rs"]
mod cpu;
pub use cpu::*;

cpu::cpu_atomic!(Atomic32, u32, AtomicU32);
cpu::cpu_atomic!(Atomic64, u64, AtomicU64);

pub fn fence_acq_rel() {
    loom::sync::atomic::fence(AcqRel)
}
pub fn fence_sc() {
    loom::sync::atomic::fence(SeqCst)
}

/// Every modelled thread is on SM 0 (the models are about one arena's words).
pub fn sm_id() -> u32 {
    0
}
pub fn sm_count() -> u32 {
    1
}

/// A spinning thread must yield under loom, or the model never lets the others run.
pub fn nanosleep(_ns: u32) {
    loom::thread::yield_now()
}

pub fn global_timer_ns() -> u64 {
    0
}

/// Every modelled claimer starts at word 0, bit 0.
pub fn spread_seed() -> u32 {
    0
}

/// Load a word of memory another agent (the host's growth service) writes.
///
/// # Safety
/// `p` is a valid, 8-aligned address that is only accessed atomically.
pub unsafe fn load_sys(p: *const u64) -> u64 {
    // SAFETY: caller's contract.
    unsafe { core::sync::atomic::AtomicU64::from_ptr(p as *mut u64) }.load(SeqCst)
}

/// Store a word of memory another agent reads.
///
/// # Safety
/// As for [`load_sys`].
pub unsafe fn store_sys(p: *mut u64, v: u64) {
    // SAFETY: caller's contract.
    unsafe { core::sync::atomic::AtomicU64::from_ptr(p) }.store(v, SeqCst)
}

/// A full fence, as on the device at system scope.
pub fn fence_sys() {
    core::sync::atomic::fence(SeqCst)
}
