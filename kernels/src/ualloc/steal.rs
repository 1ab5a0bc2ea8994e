//! Memory that flows between arenas before any null (issue 13, item 2).
//!
//! An arena holds the chunks its SM adopted, and bins of each class with free slots. Two ways
//! let other SMs use them:
//! 1. **Free bins** ([`UAlloc::take_free_bins`]): a refill takes free bins from another
//!    arena's chunks and carves them for its own arena (or for a class's home, below). The bin's
//!    `owner` says whose class list, slot semaphore and SRCU domain hold it (INV(UA12)); the
//!    chunk stays with the arena that adopted it (its chunk lists, its bins semaphore, its
//!    return to the source). A refill does this when its own arena and the source have no
//!    chunk left, and, while chunks are scarce, before it takes a new chunk.
//! 2. **Free slots** ([`UAlloc::steal_slot`]): when even that fails, each lane takes one free
//!    slot of its class from another arena's listed bins; the bin stays that arena's.
//!
//! The arenas are tried in order from the thread's own, so threads of different SMs start at
//! different arenas.
//!
//! # A class's home while chunks are scarce (INV(UA16))
//! With plenty of chunks each SM carves bins of its own. When the source holds fewer chunks
//! than [`HOME_CHUNKS_PER_ARENA`] per arena (a small heap, or one nearly full), that would
//! leave a partly used bin of every class in every arena: 132 bins of 104 KB for a class that
//! few requests ask for, more than a 8 MiB heap holds. So then a refill goes to the class's
//! **home**, one arena per class ([`UAlloc::home`]), before it carves anything for its own:
//! 1. it takes the group's slots from the home's bins (`try_wait` on the home's slots, then
//!    the home's list, as [`steal_slot`](UAlloc::steal_slot) does);
//! 2. otherwise, through the home's [`SingleFlight`](crate::collective::SingleFlight), ONE
//!    refill at a time carves a bin for the home (from the refiller's own chunks, or any
//!    arena's free bins, or the source) and keeps the first slots; SMs that come meanwhile
//!    wait for it and take the bin's other slots;
//! 3. when that refill finds no memory (after its trims), its waiters fail with it; a caller
//!    that lost the home's slots to others [`HOME_TRIES`] times (thousands: each loss
//!    follows a refill that carved a bin) refills its own arena.
//!
//! So while memory is short each class holds about one partly used bin in all, and bins go
//! to the classes that ask. The home's own threads keep the usual path.
//!
//! Other SMs only `try_wait` on the home's slots semaphore; the one refill in flight per class
//! and home adds its promise (`promise`, then `signal` or `retract`, INV(SEM4)), and takes its
//! bins from its own arena's chunks, whose semaphores are its SM's: INV(SEM2) holds.
//!
//! # Never wait on another arena's semaphore
//! An arena's semaphores have the `PerSm` layout: R and E are sized for the threads of one SM
//! (INV(SEM2)). A thief therefore takes units only with `try_wait`, which never reserves nor
//! promises: it only makes a transient deduction of C, whose negative half holds far more than
//! every thread of the GPU (INV(SEM3)). It takes the arena's mutexes like the arena's own
//! threads do, and walks its class list inside the arena's read section.

use core::ptr;

use crate::bulk_semaphore::Shared;
use crate::platform::Atomic32;
use crate::size_class::{BinKind, SizeClass};
use crate::ualloc::alloc::{ListClaimer, units_at};
use crate::ualloc::arena::Arena;
use crate::ualloc::bin::bin_at;
use crate::ualloc::chunk::bin_offset;
use crate::ualloc::layout::WORD_BITS;
use crate::ualloc::layout::slot_ptr;
use crate::ualloc::refill::nth_free_bin;
use crate::ualloc::{ChunkSource, UAlloc};

/// Below this many chunks per arena left in the source, refills go to a class's home first
/// (INV(UA16)).
pub(crate) const HOME_CHUNKS_PER_ARENA: usize = 4;

/// How often a refill looks for slots at the home before it carves a bin of its own: each look
/// after the first follows a home refill that succeeded but whose slots others took first
/// ([`Shared::Busy`]). Each such refill carved a bin from the heap, so the bound only stops a
/// refill that others outrun thousands of times. With 4, callers of a fill that asks for
/// twice a 64 MiB heap lost 4 times, carved bins of their own in 87 arenas, and stranded
/// 8 MB of 1 KB and 2 KB slots (H100: 85.5% of the heap served; with 4096, `utilization_gpu`
/// passes its 90% floor).
const HOME_TRIES: u32 = 4096;

/// How often [`UAlloc::take_free_bins`] tries an arena whose semaphore shows free bins.
const TRANSIENT_LOOKS: u32 = 4;

/// Arenas whose free bins [`UAlloc::take_free_bins`] loads at once.
const SCAN_BATCH: usize = 8;

impl<S: ChunkSource> UAlloc<'_, S> {
    /// Whether chunks are scarce: refills then go to a class's home first (INV(UA16)).
    #[inline(always)]
    pub(crate) fn scarce(&self) -> bool {
        self.scarce_with(self.source.chunks_left())
    }

    /// [`scarce`](Self::scarce) for a `chunks_left` the caller has read already.
    #[inline(always)]
    pub(crate) fn scarce_with(&self, chunks_left: usize) -> bool {
        chunks_left < self.arenas.len() * HOME_CHUNKS_PER_ARENA
    }

    /// Whether `class`'s refills go to its home while chunks are scarce (INV(UA16)): always
    /// for the large classes (a partly used bin of 104 KB per arena and class is 13 MiB over
    /// 132 arenas), and for the small ones (4 KB bins) only in a heap of fewer chunks than
    /// half the arenas (below about 33 MiB on an H100). Above that, a small class's partly used
    /// bins in every arena hold at most 132 × 4 × 4 KB, about 2 MiB (3% of 64 MiB), and each
    /// SM serves its own: in a 64 MiB heap a warm launch of 1,024 × 16 B took 26.7 µs at the
    /// home and 20.0 µs on its own arenas, 2^16 × 16 B in 128 MiB 0.77 ms and 0.37, while the
    /// mixed 16 B – 4 KB fill of 64 MiB served 94.7% instead of 97.7% (H100).
    #[inline(always)]
    pub(crate) fn shares_home(&self, class: SizeClass) -> bool {
        class.kind() == BinKind::Large || self.source.chunks_at_most() < self.arenas.len() / 2
    }

    /// Whether the source could never hold [`HOME_CHUNKS_PER_ARENA`] chunks per arena: a
    /// small fixed heap, always scarce. Plain loads of the heap's geometry.
    #[inline(always)]
    pub(crate) fn small_heap(&self) -> bool {
        self.source.chunks_at_most() < self.arenas.len() * HOME_CHUNKS_PER_ARENA
    }

    /// The arena that holds what SMs share while chunks are scarce: for `key` a class's index,
    /// the class's bins and its refill gate; for a kind's index, the kind's adoption gate.
    /// Spread over the arenas.
    #[inline(always)]
    pub(crate) fn home(&self, key: usize) -> usize {
        (key * 7 + 3) % self.arenas.len()
    }

    /// `k` slots of `class` for a group of arena `ai` from the class's home (INV(UA16)), as
    /// [`units_at`] encodes them: units there, or a fresh bin that a home refill carved from
    /// our chunks; 0 when a home refill (ours, or the one we waited for) found no memory after
    /// its trims, the same attempt as a refill of our own arena. `None`: not served at the home
    /// (our arena is the home, or others kept taking its slots); refill as usual.
    ///
    /// Two callers: a refill of our arena, which holds its promise meanwhile, so that the
    /// arena's other waiters wait for it; and, in a [`small_heap`](Self::small_heap) (always
    /// scarce), a group whose own arena has no units and no refill in flight, before it
    /// reserves there. Through the latter, every warp of an SM reaches the home side by side
    /// instead of one refill of its arena at a time: a warm launch of 1,024 threads × 16 B in
    /// a 64 MiB heap queued its eight warps per SM that way (38.3 µs; 30.2 µs with a look at
    /// the home's units, H100, 88eca1d), and a fresh one of 2^16 threads took one bin's worth
    /// per refill of each SM.
    #[cold]
    #[inline(never)]
    pub(crate) fn serve_at_home(&self, ai: usize, class: SizeClass, k: u32) -> Option<u64> {
        let h = self.home(class.index());
        if h == ai {
            return None;
        }
        let state = self.arenas[h].class(class);
        let refill = || self.alloc_slow(ai, h, class, k, class.slots() - k);
        match state.slots.0.take_shared(
            &state.list.0.home_refill,
            k,
            class.slots(),
            HOME_TRIES,
            refill,
        ) {
            Shared::Taken => Some(units_at(h)),
            Shared::Refilled(bin) => Some(bin),
            Shared::Exhausted => Some(0),
            Shared::Busy => None,
        }
    }

    /// The arenas in order from `ai + skip` round to the one before `ai` (`skip` 1: the arenas
    /// other than `ai`).
    fn arenas_from(&self, ai: usize, skip: usize) -> impl Iterator<Item = &Arena> {
        let n = self.arenas.len();
        (skip..n).map(move |step| &self.arenas[(ai + step) % n])
    }

    /// Up to `want` free bins of `kind` from one arena's chunks, taken off them for the caller
    /// to carve for arena `ai` (INV(UA12)): `(first, count)`, the others chained after the
    /// first through `next` in the order taken, as [`take_bins`](Self::take_bins) hands them
    /// out; `(0, 0)` when no arena has one. The arenas are tried in order from `ai`'s own:
    /// where `take_bins` waits for `want` bins at once, this takes the few that a trim gave
    /// back, or that another thread's adoption left.
    ///
    /// The looks go [`SCAN_BATCH`] arenas at a time, their loads issued together: one after
    /// another, a look at every arena was a chain of 132 round trips to memory, about 52 µs of
    /// the 75 µs that a home refill of 1 KB took in a fresh 128 MiB heap (H100, timed with the
    /// global timer), and home refills run one at a time.
    ///
    /// With `hinted`, the look happens only while the kind's hint says that some arena may
    /// hold free bins ([`note_free_bins`](Self::note_free_bins)); a look that finds none
    /// leaves the hint clear until bins are freed again. A home refill of 1 KB in a fresh
    /// 128 MiB heap, whose chunks all go whole to refills, spent 16 of its 39 µs in a look that
    /// could find nothing (H100, after the loads went eight at a time). A look without the
    /// hint (`alloc_slow`'s look before a trim, which precedes a null) sees every arena.
    #[cold]
    #[inline(never)]
    pub(crate) fn take_free_bins(
        &self,
        ai: usize,
        kind: BinKind,
        want: u32,
        hinted: bool,
    ) -> (u64, u32) {
        let hint = self.free_bins_hint(kind);
        // A plain load first; the swap (acquire: pairs with the release of the `note` whose 1
        // it takes) clears it for the look that follows.
        if hinted && (hint.load_relaxed() == 0 || hint.swap_acquire(0) == 0) {
            return (0, 0);
        }
        let taken = self.look_for_free_bins(ai, kind, want);
        if taken.1 > 0 {
            // Other arenas may hold more: the next look goes on.
            hint.store_release(1);
        }
        taken
    }

    /// The kind's hint that some arena may hold free bins (in the kind's home).
    #[inline(always)]
    fn free_bins_hint(&self, kind: BinKind) -> &Atomic32 {
        &self.arenas[self.home(kind.index())]
            .kind(kind)
            .chunks
            .0
            .free_bins_hint
    }

    /// Bins of `kind` were just freed in some arena (their units released): the next
    /// [`take_free_bins`](Self::take_free_bins) looks. Release: its look's acquire then sees
    /// the units.
    #[inline(always)]
    pub(crate) fn note_free_bins(&self, kind: BinKind) {
        self.free_bins_hint(kind).store_release(1);
    }

    /// [`take_free_bins`](Self::take_free_bins)'s look at every arena, from `ai`'s own.
    fn look_for_free_bins(&self, ai: usize, kind: BinKind, want: u32) -> (u64, u32) {
        let n = self.arenas.len();
        let mut step = 0;
        while step < n {
            // A fixed count, and the counts reduced to a mask before anything else uses them,
            // so that they stay in registers and no use waits for its load before the next
            // load is issued (with the counts in a local array, each store of one waited for
            // its load). The last batch wraps round to arenas looked at already.
            let at = |j: usize| ((ai + step + j) as u32 % n as u32) as usize;
            let mut free = [0u32; SCAN_BATCH];
            for (j, f) in free.iter_mut().enumerate() {
                *f = self.arenas[at(j)].kind(kind).bins.0.available();
            }
            let mut mask = 0u32;
            for (j, &f) in free.iter().enumerate() {
                mask |= ((f > 0) as u32) << j;
            }
            while mask != 0 {
                let j = mask.trailing_zeros() as usize;
                mask &= mask - 1;
                let taken = self.take_free_bins_of(&self.arenas[at(j)], kind, want);
                if taken.1 > 0 {
                    return taken;
                }
            }
            step += SCAN_BATCH;
        }
        (0, 0)
    }

    /// [`take_free_bins`](Self::take_free_bins) from one arena: `(0, 0)` when it has none, or
    /// they went to others first.
    fn take_free_bins_of(&self, arena: &Arena, kind: BinKind, want: u32) -> (u64, u32) {
        let ks = arena.kind(kind);
        // A plain load first: threads that run out together look at every arena, and a
        // failed `try_wait` costs two atomics on another SM's line. A `try_wait` fails while
        // others' deductions are in flight (INV(SEM3)): look again a few times while the load
        // shows units, or SMs that look together miss the free bins and adopt chunks they do
        // not need.
        // INV(UA9): a unit is a free bin on the partial list, ours to take.
        let mut got = 0;
        for _ in 0..TRANSIENT_LOOKS {
            let free = ks.bins.0.available();
            if free == 0 {
                break;
            }
            let n = free.min(want);
            if ks.bins.0.try_wait(n) {
                got = n;
                break;
            }
        }
        if got == 0 {
            return (0, 0);
        }
        let list = &ks.chunks.0;
        let (mut first, mut last) = (0, 0);
        list.lock.lock_single();
        for _ in 0..got {
            let (chunk, index) = nth_free_bin(list, 0);
            chunk.take_bin(index);
            if chunk.n_free.load_relaxed() == 0 {
                // INV(UA10): a chunk with no free bin leaves the partial list.
                list.unlink_partial_locked(chunk);
            }
            let at = (chunk.base() + bin_offset(kind, index)) as u64;
            if last == 0 {
                first = at;
            } else {
                // SAFETY: a bin we took, ours alone until the caller lists it.
                unsafe { bin_at(last) }.next.store_relaxed(at);
            }
            last = at;
        }
        list.lock.unlock();
        (first, got)
    }

    /// One free slot of `class` from another arena's listed bins than `ai`; null when none
    /// has one. For a lane whose own arena, the source and [`take_free_bins`] have failed.
    ///
    /// [`take_free_bins`]: Self::take_free_bins
    #[cold]
    #[inline(never)]
    pub(crate) fn steal_slot(&self, ai: usize, class: SizeClass) -> *mut u8 {
        for arena in self.arenas_from(ai, 1) {
            // INV(UA2): a unit is a free slot in a listed bin, or in one on the pending stack
            // that the claimer's drain links (INV(UA7)); the claimer finds it.
            let slots = &arena.class(class).slots.0;
            if slots.available() > 0 && slots.try_wait(1) {
                let (bin, word, bits) = ListClaimer::new(arena, class).next(1);
                return slot_ptr(bin, class, word * WORD_BITS as u32 + bits.trailing_zeros());
            }
        }
        ptr::null_mut()
    }
}
