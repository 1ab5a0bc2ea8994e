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
