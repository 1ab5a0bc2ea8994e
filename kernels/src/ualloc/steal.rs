//! Memory that flows between arenas before any null (issue 13, item 2).
//!
//! An arena holds the chunks its SM adopted, and bins of each class with free slots. Two ways
//! let other SMs use them:
//! 1. **Free bins** ([`UAlloc::take_bin_elsewhere`]): a refill takes a free bin from another
//!    arena's chunk and carves it for its own arena. The bin's `owner` says whose class list,
//!    slot semaphore and SRCU domain hold it (INV(UA12)); the chunk stays with the arena that
//!    adopted it (its chunk lists, its bins semaphore, its return to the source). A refill does
//!    this when its own arena and the source have no chunk left, and, when the source holds
//!    fewer chunks than there are arenas (small heaps), before it takes a new chunk: then a few
//!    SMs cannot hold every chunk while the others get nothing.
//! 2. **Free slots** ([`UAlloc::steal_slot`]): when even that fails, each lane takes one free
//!    slot of its class from another arena's listed bins; the bin stays that arena's.
//!
//! The arenas are tried in order from the thread's own, so threads of different SMs start at
//! different arenas.
//!
//! # Never wait on another arena's semaphore
//! An arena's semaphores have the `PerSm` layout: R and E are sized for the threads of one SM
//! (INV(SEM2)). A thief therefore takes units only with `try_wait`, which never reserves nor
//! promises: it only makes a transient deduction of C, whose negative half holds far more than
//! every thread of the GPU (INV(SEM3)). It takes the arena's mutexes like the arena's own
//! threads do, and walks its class list inside the arena's read section.

use core::ptr;

use crate::size_class::{BinKind, SizeClass};
use crate::ualloc::alloc::{ListClaimer, slot_ptr};
use crate::ualloc::arena::Arena;
use crate::ualloc::chunk::bin_offset;
use crate::ualloc::layout::WORD_BITS;
use crate::ualloc::refill::nth_free_bin;
use crate::ualloc::{ChunkSource, UAlloc};

impl<S: ChunkSource> UAlloc<'_, S> {
    /// The arenas other than `ai`, in order from the one after it.
    fn others(&self, ai: usize) -> impl Iterator<Item = &Arena> {
        let n = self.arenas.len();
        (1..n).map(move |step| &self.arenas[(ai + step) % n])
    }

    /// A free bin of `kind` from another arena's chunks than `ai`, taken off its chunk for the
    /// caller to carve for arena `ai` (INV(UA12)); `None` when no other arena has one.
    #[cold]
    #[inline(never)]
    pub(crate) fn take_bin_elsewhere(&self, ai: usize, kind: BinKind) -> Option<u64> {
        for arena in self.others(ai) {
            let ks = arena.kind(kind);
            // A plain load first: threads that run out together look at every arena, and a
            // failed `try_wait` costs two atomics on another SM's line.
            // INV(UA9): a unit is a free bin on the partial list, ours to take.
            if ks.bins.0.available() == 0 || !ks.bins.0.try_wait(1) {
                continue;
            }
            let list = &ks.chunks.0;
            list.lock.lock_single();
            let (chunk, index) = nth_free_bin(list, 0);
            chunk.take_bin(index);
            if chunk.n_free.load_relaxed() == 0 {
                // INV(UA10): a chunk with no free bin leaves the partial list.
                list.unlink_partial_locked(chunk);
            }
            list.lock.unlock();
            return Some((chunk.base() + bin_offset(kind, index)) as u64);
        }
        None
    }

    /// One free slot of `class` from another arena's listed bins than `ai`; null when none
    /// has one. For a lane whose own arena, the source and [`take_bin_elsewhere`] have failed.
    ///
    /// [`take_bin_elsewhere`]: Self::take_bin_elsewhere
    #[cold]
    #[inline(never)]
    pub(crate) fn steal_slot(&self, ai: usize, class: SizeClass) -> *mut u8 {
        for arena in self.others(ai) {
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
