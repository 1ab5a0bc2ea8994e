//! The platform layer: the only module that touches atomics, fences, warp collectives and
//! special registers, and the only module with `cfg(target_arch)` in it.
//!
//! Everything above this module is written against one contract, with three backends:
//!
//! | backend | selected by | atomics | a "warp" is |
//! | --- | --- | --- | --- |
//! | `nvptx` | `target_arch = "nvptx64"` | inline PTX, `.gpu` scope, explicit semantics | 32 lanes |
//! | `host`  | any other target | `core::sync::atomic` | one lane |
//! | `model` | `--cfg loom` | `loom::sync::atomic` | one lane, or the threads of a `ModelWarp` |
//!
//! # Why not `core::sync::atomic` on the GPU
//! rustc's nvptx backend drops the ordering of every read-modify-write (`atomicrmw … seq_cst`
//! becomes a relaxed `atom.add`) and gives what it keeps system scope (`ld.acquire.sys`,
//! `fence.sc.sys`). So the allocator never uses `core::sync::atomic` directly: each operation here
//! names its ordering and its scope, and the nvptx backend emits exactly that PTX. All scopes are
//! `.gpu`: toga's heap lives in one GPU's global memory and is shared by every block on it.
//!
//! # Names
//! `<op>_<ordering>` with ordering one of `relaxed`, `acquire`, `release`, `acq_rel`; the scope
//! is always the GPU (device) scope. Every non-relaxed use in the allocator carries a comment naming
//! the operation it pairs with.
//!
//! # Warp collectives
//! Functions that take a `mask` are `*.sync` collectives. Rule for all of them: the calling lane
//! must be set in `mask`, and every lane in `mask` must reach the same call (same call site, same
//! mask) before any can leave it; otherwise the behaviour is undefined. Take the mask from
//! [`active_mask`] (or a subset computed from it) and never assume the warp is converged.
//! On the host backend a warp is one lane, so `mask` is always `1` and every collective
//! returns the lane's own value; so it is under loom for a thread that joined no `ModelWarp`
//! (`model.rs`: the threads that join one are its lanes, and exchange values).

#[cfg(all(target_arch = "nvptx64", not(loom)))]
mod nvptx;
#[cfg(all(target_arch = "nvptx64", not(loom)))]
pub use nvptx::*;

#[cfg(all(not(target_arch = "nvptx64"), not(loom)))]
mod host;
#[cfg(all(not(target_arch = "nvptx64"), not(loom)))]
pub use host::*;

#[cfg(loom)]
mod model;
#[cfg(loom)]
pub use model::*;

/// Lowest set lane of `mask`: the leader that acts for a group of lanes.
#[inline(always)]
pub fn leader_of(mask: u32) -> u32 {
    mask.trailing_zeros()
}

/// Number of lanes in `mask` below `lane`: the lane's rank within its group.
#[inline(always)]
pub fn rank_in(mask: u32, lane: u32) -> u32 {
    (mask & ((1u32 << lane) - 1)).count_ones()
}

/// Exponential back-off for spin loops: starts at [`BACKOFF_MIN_NS`], doubles up to
/// [`BACKOFF_MAX_NS`].
pub struct Backoff {
    ns: u32,
}

/// First sleep of a spinning thread. Short enough that a refill finishing a few hundred cycles
/// later is noticed quickly.
pub const BACKOFF_MIN_NS: u32 = 32;
/// Longest sleep: bounds the latency added to a waiter once the resource appears. Measured on
/// an H100 (`host scan`, docs/benchmarks.md): 4 KiB sleeps made TBuddy's refill chains several
/// times slower than 256 ns at 2^12–2^16 threads.
pub const BACKOFF_MAX_NS: u32 = 256;

impl Backoff {
    pub fn new() -> Self {
        Self { ns: BACKOFF_MIN_NS }
    }

    /// Sleep (GPU) or yield (host, loom), then lengthen the next sleep.
    #[inline]
    pub fn snooze(&mut self) {
        nanosleep(self.ns);
        self.grow();
    }

    /// The next sleep's length.
    #[inline]
    pub fn current_ns(&self) -> u32 {
        self.ns
    }

    /// Lengthen the next sleep (for callers that sleep on their own terms).
    #[inline]
    pub fn grow(&mut self) {
        self.ns = (self.ns * 2).min(BACKOFF_MAX_NS);
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}
