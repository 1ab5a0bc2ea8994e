//! Out of memory without a trim per refill: the harvest epoch (INV(UA17)).
//!
//! A refill that finds no bin and no chunk trims before it gives up (`alloc_slow`): empty bins
//! of other classes go back to their chunks, empty chunks to the source. A trim walks every
//! arena and waits for grace periods. In a heap that is out of memory, every SM's refills fail
//! one after another, and each of them trimmed again, although nothing had changed since the
//! last trim: an 8 MiB heap asked for twice its size in 16 B blocks took 0.66 s, with 300
//! trims (H100, ncu: 68% of the stall samples in lanes waiting for their leader, 30% in
//! waiters sleeping on the arena's semaphore behind those refills).
//!
//! So each arena counts the events after which a trim may find something new to give back
//! (`Arena::note_harvest`):
//! - a release that leaves a bin with no slot taken (`free`);
//! - a claim that gives its count back to a bin that was empty (`ListClaimer`);
//! - an empty bin a trim had to leave carved, because some of its units were out for a moment.
//!
//! The **harvest epoch** is the sum of the counts over the arenas. A refill reads it before
//! each trim. If after its last trim it still finds no memory, it records that epoch in the
//! heap's [`TrimGate`]. A later refill that reads the same epoch knows a trim has already run
//! since the last such event and found nothing that helps: it skips its own trim. It still
//! takes bins from the arenas and chunks from the source first, so memory that comes back
//! without a trim (a freed large block, a bin returned by another trim, a growth) is found as
//! before. Only the trim, which could not give anything back, is skipped.

use crate::collective::SingleFlight;
use crate::platform::{self, Atomic64};

/// One arena's count of the events after which a trim may find something to give back
/// (INV(UA17)). Only grows; zeroed memory is 0.
#[repr(transparent)]
pub struct HarvestCount(Atomic64);

impl HarvestCount {
    /// No event yet (all-zero).
    pub fn new() -> Self {
        Self(Atomic64::new(0))
    }

    /// Count an event, for a caller that issued a release fence after it (the exit of a read
    /// section, `SrcuReader::drop`).
    #[inline(always)]
    pub fn note_fenced(&self) {
        // Relaxed: the caller's fence makes this add a release of the event.
        self.0.fetch_add_relaxed(1);
    }

    /// Count an event, with a release of its own.
    #[cold]
    pub fn note(&self) {
        // Release: the event happens before the acquire of a refill that reads this count
        // (`TrimGate::epoch`), and so before its trim.
        self.0.fetch_add_release(1);
    }
}

impl Default for HarvestCount {
    fn default() -> Self {
        Self::new()
    }
}

/// One heap's trims, shared by every view of it (`UAlloc::with_trim_gate`): one trim walks the
/// arenas at a time ([`SingleFlight`], INV(SF1)), and the harvest epoch of the last trim after
/// which a refill still found no memory. Alone on its cache line; zeroed memory is an idle gate
/// with nothing recorded.
#[repr(C, align(128))]
pub struct TrimGate {
    pub(crate) run: SingleFlight,
    /// 1 + that epoch (INV(UA17)); 0: none yet.
    exhausted: Atomic64,
}

impl TrimGate {
    /// An idle gate (all-zero).
    pub fn new() -> Self {
        Self {
            run: SingleFlight::new(),
            exhausted: Atomic64::new(0),
        }
    }

    /// The harvest epoch over `counts` (every arena's), and whether a trim is futile in it: a
    /// refill [`record`](Self::record)ed this epoch after its trim. One load per count; for a
    /// refill, before its trim.
    pub fn epoch<'c>(&self, counts: impl Iterator<Item = &'c HarvestCount>) -> (u64, bool) {
        // Acquire: pairs with the release in `record`, so the recording refill's reads of the
        // counts happen before ours, which therefore read each count as new or newer: equal
        // sums mean no event in between.
        let recorded = self.exhausted.load_acquire();
        let mut epoch = 0u64;
        for count in counts {
            // Relaxed: the fence below is the acquire of every count.
            epoch = epoch.wrapping_add(count.0.load_relaxed());
        }
        // Acquire (fence form, for every count read above): each counted event happens before
        // whatever the caller does next (its trim).
        platform::fence_acq_rel();
        (epoch, recorded == epoch.wrapping_add(1))
    }

    /// A refill read harvest epoch `epoch` ([`epoch`](Self::epoch)), then a trim ran (one that
    /// started after that read, INV(SF1)), and then the refill found no memory.
    #[cold]
    pub fn record(&self, epoch: u64) {
        // Release: pairs with the acquire in `epoch`. A racing refill may store an older epoch over a newer one:
        // that only makes the next refills trim.
        self.exhausted.store_release(epoch + 1);
    }

    /// Trims run through this gate so far (wrapping; statistics and tests).
    pub fn trims(&self) -> u32 {
        self.run.runs()
    }
}

impl Default for TrimGate {
    fn default() -> Self {
        Self::new()
    }
}
