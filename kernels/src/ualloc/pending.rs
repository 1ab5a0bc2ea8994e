//! The pending stack: bins that got a free slot back while they may be unlisted, waiting for
//! a walker (or `trim`) to link them, and small bins that filled while another thread held
//! the list's mutex, waiting to be unlinked. One per arena and class, in the class's
//! [`BinList`].
//!
//! `free` must not wait for the list's mutex (one relink per emptied-from-full bin made every
//! arena's frees queue on it), so the lane whose release crosses "full" downwards only *notes*
//! the bin here: one `fetch_add` on the bin's `pending` count and, for the first crossing, one
//! `swap` on the stack's head. No CAS loop, so no retries under contention. A drain takes the
//! whole stack with one `swap`, and settles each bin (reconciles its listing under the list's
//! mutex) until its count holds still.
//!
//! ```text
//!  head ──► bin C ──pnext──► bin B ──pnext──► bin A ──pnext──► 0
//!           pending ≥ 1      pending ≥ 1      pending ≥ 1
//! ```
//!
//! INV(UA13): `bin.pending != 0` iff the bin is on its owner's stack for its class (or taken by
//! a drain that has not finished it). A bin with a non-zero count is not returned to its chunk
//! (`UAlloc::run_callback` drains or defers), so a drain may read a bin it took without a
//! read section.
//!
//! Push links with a swap: `pnext = UNSET; prev = swap(head, bin); pnext = prev`. A drain that
//! reaches a bin between the swap and the link waits for the link (a few instructions away,
//! and Volta's independent thread scheduling lets the pusher finish).
//!
//! [`BinList`]: super::arena

use crate::platform::{self, Atomic64, Backoff};
use crate::ualloc::bin::{BinHeader, bin_at};

/// Bins a drain settles per batch (its fences are per batch; the addresses live on the
/// drainer's stack frame).
pub const DRAIN_BATCH: usize = 8;

/// `pnext` of a bin whose push has swapped it in but not linked it yet (bins are 128-aligned,
/// so no bin has this address).
const UNSET: u64 = 1;

/// A stack of bins, linked through their headers (see the module doc). Zeroed memory is empty.
#[repr(C)]
pub struct PendingStack {
    /// Top bin (address, 0 = empty).
    head: Atomic64,
}

impl PendingStack {
    /// An empty stack (all-zero).
    pub fn new() -> Self {
        Self {
            head: Atomic64::new(0),
        }
    }

    /// Whether the stack looks empty (a relaxed snapshot: a hint before a drain).
    #[inline(always)]
    pub fn is_empty_hint(&self) -> bool {
        self.head.load_relaxed() == 0
    }

    /// Note a crossing of "full" of `bin`, which must then be settled by a drain: downwards
    /// by a `free`, or upwards by a claimer of a small bin that found the list's mutex held
    /// (`resync_listing`).
    /// Call after the release that crossed, while the bin cannot be returned to its chunk
    /// (inside its arena's read section). Returns whether this call pushed the bin (the first
    /// crossing since the bin's last drain).
    pub fn note(&self, bin: &BinHeader) -> bool {
        // Acq_rel. Release: the caller's release (its update of `used`) happens before a drain
        // that reads this count with acquire. Acquire: a drain's final CAS to 0 happens before
        // our push, so its last read of `pnext` is done before we overwrite it.
        if bin.pending.fetch_add_acq_rel(1) != 0 {
            return false;
        }
        let me = bin as *const BinHeader as u64;
        bin.pnext.store_relaxed(UNSET);
        // Release: `UNSET` above (and the count) is written before a drain can reach us.
        // No acquire half, and the link below is relaxed (each was a MEMBAR on the GPU: ncu
        // of 2^20 frees of 4 KB put 3.5% of the stall samples on each): a drain takes the
        // stack with an acquire swap of the head, which synchronizes with the release swap of
        // every push before it (each later swap, a read-modify-write of the head, continues
        // the release sequence of the earlier ones). So every bin it can reach through links
        // had its `UNSET` written before, and the drain reads that or the final link, never a
        // link of an earlier push; the link's value itself is all the drain needs of it.
        let prev = self.head.swap_release(me);
        bin.pnext.store_relaxed(prev);
        true
    }

    /// Take every bin noted so far and settle them in batches of up to [`DRAIN_BATCH`]: call
    /// `settle` on each batch (bin addresses), and again on a bin whose count moved meanwhile
    /// (a crossing came during the call), until its count holds still; then clear the counts.
    /// Returns how many bins it took. `settle` runs with its bins pinned (INV(UA13)).
    ///
    /// Per batch, the counts are read relaxed and ordered by ONE acquire fence, and cleared by
    /// relaxed CASes after ONE release fence: a drain of a warm heap's stack settles hundreds
    /// of bins, and a fenced load and a fenced CAS per bin made it several µs per bin.
    pub fn drain(&self, mut settle: impl FnMut(&[u64])) -> u32 {
        if self.is_empty_hint() {
            return 0;
        }
        // Acquire: pairs with the release swaps in `note` (the pushed bins and their `UNSET`:
        // the swaps form one release sequence on the head).
        let mut at = self.head.swap_acq_rel(0);
        let mut taken = 0;
        let mut bins = [0u64; DRAIN_BATCH];
        let mut seen = [0u32; DRAIN_BATCH];
        while at != 0 {
            let mut n = 0;
            while at != 0 && n < DRAIN_BATCH {
                bins[n] = at;
                // SAFETY: INV(UA13): a bin on the stack is not returned to its chunk until its
                // count is back to 0, which only this drain does.
                let bin = unsafe { bin_at(at) };
                // Read the link before the count goes to 0: the bin may be pushed again after.
                at = Self::link(bin);
                n += 1;
            }
            for i in 0..n {
                // SAFETY: as above.
                seen[i] = unsafe { bin_at(bins[i]) }.pending.load_relaxed();
            }
            // Acquire (fence form, for every count read above): pairs with the release half of
            // each `note`'s `fetch_add`, so the crossings counted are visible to `settle`.
            platform::fence_acq_rel();
            settle(&bins[..n]);
            // Release (fence form, for every CAS below): our settling happens before a later
            // push's acquire and before the bin's return (`pending_count`'s acquire).
            platform::fence_acq_rel();
            for i in 0..n {
                // SAFETY: as above, until our CAS succeeds.
                let bin = unsafe { bin_at(bins[i]) };
                while let Err(now) = bin.pending.compare_exchange_relaxed(seen[i], 0) {
                    // A crossing came while we settled: settle the bin again.
                    seen[i] = now;
                    platform::fence_acq_rel();
                    settle(&bins[i..i + 1]);
                    platform::fence_acq_rel();
                }
            }
            taken += n as u32;
        }
        taken
    }

    /// The link of `bin`, taken off the stack by a drain: waits out a push between its swap
    /// and its link (a few instructions).
    fn link(bin: &BinHeader) -> u64 {
        let mut backoff = Backoff::new();
        loop {
            // Relaxed: the drain's acquire swap of the head ordered every `UNSET` of the bins
            // it can reach before this load (`note`); the link is a value, not a publication.
            let next = bin.pnext.load_relaxed();
            if next != UNSET {
                return next;
            }
            backoff.snooze();
        }
    }

    /// Call `f` on every bin on the stack and return how many there are (quiescent checks:
    /// no push or drain may run).
    pub fn for_each_quiescent(&self, mut f: impl FnMut(&BinHeader)) -> u32 {
        let (mut at, mut n) = (self.head.load_relaxed(), 0);
        while at != 0 {
            // SAFETY: INV(UA13): bins on the stack are live; quiescent, so nothing changes.
            let bin = unsafe { bin_at(at) };
            f(bin);
            n += 1;
            at = bin.pnext.load_relaxed();
        }
        n
    }
}

impl Default for PendingStack {
    fn default() -> Self {
        Self::new()
    }
}
