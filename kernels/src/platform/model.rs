//! Model backend (`--cfg loom`): loom's atomics, so the model checker explores every
//! interleaving the C11 memory model allows.
//!
//! # Model warps
//! A modelled thread is lane 0 of a warp of one lane on SM 0, unless it joined a [`ModelWarp`]
//! ([`ModelWarp::enter`]): then it is lane `lane` of that warp, on the SM the warp names, and
//! the warp's collectives (`ballot`, `match_any`, the shuffles, `sync_warp`) exchange values
//! with the other lanes that joined it. A model of a group path spawns one loom thread per
//! lane, and each calls `enter` first.
//!
//! - [`active_mask`] is the set of lanes that joined the warp: a model makes every one of them
//!   call the same entry point, as the lanes of a converged warp do. Lanes that diverge later
//!   call the collectives with the subsets the code computes (a group's mask), as on the GPU.
//! - The value collectives order no memory (as `shfl.sync`, `vote.sync` and `match.sync` do
//!   not): the values pass outside loom's memory model, so they add no happens-before edge a
//!   fence of the code should provide. Each waits (yielding) until every lane of its mask
//!   arrived at the same collective: the `n`-th call with one mask of one lane meets the
//!   `n`-th with that mask of every other lane of it.
//! - [`sync_warp`] orders memory among the lanes of its mask, as `bar.warp.sync` does: a
//!   barrier on a loom mutex and condition variable, so every lane's writes before it happen
//!   before every lane's reads after it. Its lanes block (they do not spin), so a model may
//!   have another thread spin meanwhile (loom cannot finish a model where two threads spin).

use loom::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use loom::sync::atomic::{AtomicU32, AtomicU64};

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Mutex;

#[path = "cpu.rs"]
#[allow(dead_code)] // its warp of one lane is shadowed by the model warp below
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

/// The SM of this thread: 0, or the SM of the [`ModelWarp`] it joined.
pub fn sm_id() -> u32 {
    with_lane(|l| l.map_or(0, |l| l.warp.sm))
}
/// SMs the models use: warps name SM 0 or 1.
pub fn sm_count() -> u32 {
    MODEL_SMS
}
/// How many SMs a [`ModelWarp`] may name.
pub const MODEL_SMS: u32 = 2;

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

/// Lanes of a model warp: lane ids are below 32, as on the GPU.
pub const WARP_SIZE: u32 = 32;

/// A warp of model threads (module doc). Create it in the model's closure (one per
/// execution), share it with an `Arc`, and have each lane's thread call [`enter`](Self::enter).
pub struct ModelWarp {
    /// The lanes that take part ([`active_mask`]).
    mask: u32,
    sm: u32,
    /// Whether value collectives block ([`ModelWarp::blocking`]).
    blocking: bool,
    /// Values posted to value collectives: `(mask, n)` → the value of each lane that arrived.
    posted: Mutex<HashMap<CallKey, [Option<u64>; 32]>>,
    /// Arrivals at each [`sync_warp`], by `(mask, n)`, and the lanes waiting for the rest.
    arrived: loom::sync::Mutex<HashMap<(u32, u32), u32>>,
    all_arrived: loom::sync::Condvar,
}

impl ModelWarp {
    /// A warp whose lanes are the bits of `mask`, on SM `sm` (below [`MODEL_SMS`]).
    pub fn new(mask: u32, sm: u32) -> std::sync::Arc<Self> {
        Self::with(mask, sm, false)
    }

    /// [`new`](Self::new), with value collectives that block as [`sync_warp`] does, and so
    /// order memory among their lanes, which PTX does not promise: a missing barrier between
    /// lanes that exchange a value goes unseen. What it buys: a waiting lane is not runnable,
    /// so loom switches to another warp's thread without spending a preemption, and reaches
    /// the interleavings where a whole group's path runs between two steps of another thread
    /// (with spinning lanes, each wait is a switch that the bound counts).
    pub fn blocking(mask: u32, sm: u32) -> std::sync::Arc<Self> {
        Self::with(mask, sm, true)
    }

    fn with(mask: u32, sm: u32, blocking: bool) -> std::sync::Arc<Self> {
        assert!(
            mask != 0 && sm < MODEL_SMS,
            "a model warp of no lanes or SM {sm}"
        );
        std::sync::Arc::new(Self {
            mask,
            sm,
            blocking,
            posted: Mutex::new(HashMap::new()),
            arrived: loom::sync::Mutex::new(HashMap::new()),
            all_arrived: loom::sync::Condvar::new(),
        })
    }

    /// Make this (loom) thread lane `lane` of `warp` for the rest of its life.
    pub fn enter(warp: &std::sync::Arc<Self>, lane: u32) {
        assert!(warp.mask >> lane & 1 == 1, "lane {lane} is not in the warp");
        LANE.with(|l| {
            *l.borrow_mut() = Some(Lane {
                warp: warp.clone(),
                lane,
                calls: HashMap::new(),
            })
        });
    }
}

/// A collective call of a warp: its mask, and how many calls with that mask each of its lanes
/// made before it.
type CallKey = (u32, u32);

/// What a thread that joined a warp knows.
struct Lane {
    warp: std::sync::Arc<ModelWarp>,
    lane: u32,
    /// Collectives this lane called, per mask.
    calls: HashMap<u32, u32>,
}

loom::thread_local! {
    static LANE: RefCell<Option<Lane>> = RefCell::new(None);
}

fn with_lane<R>(f: impl FnOnce(Option<&Lane>) -> R) -> R {
    LANE.with(|l| f(l.borrow().as_ref()))
}

/// This lane's warp and the key of its next collective over `mask` (`None`: the thread joined
/// no warp).
fn next_call(mask: u32) -> Option<(std::sync::Arc<ModelWarp>, (u32, u32))> {
    LANE.with(|l| {
        let mut l = l.borrow_mut();
        let l = l.as_mut()?;
        assert!(
            mask >> l.lane & 1 == 1 && mask & !l.warp.mask == 0,
            "lane {} calls a collective with mask {mask:#x} of warp {:#x}",
            l.lane,
            l.warp.mask
        );
        let n = l.calls.entry(mask).or_insert(0);
        let key = (mask, *n);
        *n += 1;
        Some((l.warp.clone(), key))
    })
}

/// Post `value` to this lane's next collective over `mask`, wait until every lane of `mask`
/// posted to it, and return every lane's value (lanes outside `mask`: `None`). A thread that
/// joined no warp is lane 0 of a warp of one lane.
fn exchange(mask: u32, value: u64) -> [Option<u64>; 32] {
    let mine = next_call(mask).inspect(|(warp, key)| {
        warp.posted
            .lock()
            .unwrap()
            .entry(*key)
            .or_insert([None; 32])[lane_id() as usize] = Some(value);
    });
    let Some((warp, key)) = mine else {
        assert_eq!(
            mask, 1,
            "a thread outside a model warp is lane 0 of a warp of one"
        );
        let mut all = [None; 32];
        all[0] = Some(value);
        return all;
    };
    if warp.blocking {
        // Count the arrival as `sync_warp` does, and block until every lane arrived.
        barrier(&warp, key, mask);
        return warp.posted.lock().unwrap()[&key];
    }
    loop {
        let all = warp.posted.lock().unwrap()[&key];
        if (0..32).all(|i| mask >> i & 1 == 0 || all[i].is_some()) {
            return all;
        }
        loom::thread::yield_now();
    }
}

/// Wait on the warp's loom mutex and condition variable until every lane of `mask` arrived at
/// the collective `key` (orders the lanes' memory).
fn barrier(warp: &ModelWarp, key: (u32, u32), mask: u32) {
    let mut arrived = warp.arrived.lock().unwrap();
    *arrived.entry(key).or_insert(0) += 1;
    if arrived[&key] == mask.count_ones() {
        warp.all_arrived.notify_all();
    }
    while arrived[&key] < mask.count_ones() {
        arrived = warp.all_arrived.wait(arrived).unwrap();
    }
}

#[inline]
pub fn lane_id() -> u32 {
    with_lane(|l| l.map_or(0, |l| l.lane))
}
#[inline]
pub fn active_mask() -> u32 {
    with_lane(|l| l.map_or(1, |l| l.warp.mask))
}
#[inline]
pub fn lanemask_lt() -> u32 {
    (1u32 << lane_id()) - 1
}
#[inline]
pub fn ballot(mask: u32, pred: bool) -> u32 {
    let all = exchange(mask, pred as u64);
    (0..32)
        .filter(|&i| all[i] == Some(1))
        .fold(0, |m, i| m | 1 << i)
}
#[inline]
pub fn match_any(mask: u32, value: u64) -> u32 {
    let all = exchange(mask, value);
    (0..32)
        .filter(|&i| all[i] == Some(value))
        .fold(0, |m, i| m | 1 << i)
}
#[inline]
pub fn shfl_idx_u32(mask: u32, value: u32, src: u32) -> u32 {
    shfl_idx_u64(mask, value as u64, src) as u32
}
#[inline]
pub fn shfl_idx_u64(mask: u32, value: u64, src: u32) -> u64 {
    let all = exchange(mask, value);
    all[src as usize].expect("shfl from a lane outside the mask")
}
/// The value of lane `lane + delta`, or this lane's own where that lane is outside `mask`.
#[inline]
pub fn shfl_down_u32(mask: u32, value: u32, delta: u32) -> u32 {
    let all = exchange(mask, value as u64);
    let src = (lane_id() + delta) as usize;
    all.get(src).copied().flatten().unwrap_or(value as u64) as u32
}
/// The OR over the warp's lanes (every lane that joined it must call it).
#[inline]
pub fn or_whole_warp_u64(value: u64) -> u64 {
    let all = exchange(active_mask(), value);
    all.iter().flatten().fold(0, |a, v| a | v)
}
/// [`or_whole_warp_u64`] of two values.
#[inline]
pub fn or_whole_warp_u64_pair(a: u64, b: u64) -> (u64, u64) {
    (or_whole_warp_u64(a), or_whole_warp_u64(b))
}
/// A barrier of the lanes of `mask` that orders their memory (module doc).
#[inline]
pub fn sync_warp(mask: u32) {
    let Some((warp, key)) = next_call(mask) else {
        assert_eq!(
            mask, 1,
            "a thread outside a model warp is lane 0 of a warp of one"
        );
        return;
    };
    barrier(&warp, key, mask);
}
