//! Memory that flows between arenas before any null (issue 13, item 2).
//!
//! An arena holds what its SM carved: chunks with bins not yet carved, and bins of each class
//! with free slots. When its own arena and the source (after a trim) have nothing left, a
//! thread takes from the other arenas before `malloc` returns null:
//! 1. `alloc_slow` carves a free bin of another arena's chunk of the right kind
//!    ([`UAlloc::carve_elsewhere`]);
//! 2. when even that fails, each lane takes one free slot of its class from another arena's
//!    listed bins ([`UAlloc::steal_slot`]).
//!
//! What is taken stays the other arena's: the bin is carved in that arena's chunk, listed in
//! that arena's class list, and its units live in that arena's semaphore; `free` finds all of
//! it through the chunk's `arena` field as always. The arenas are tried in order from the
//! thread's own, so threads of different SMs start at different arenas.
//!
//! # Never wait on another arena's semaphore
//! An arena's semaphores have the `PerSm` layout: R and E are sized for the threads of one SM
//! (INV(SEM2)). A thief therefore takes units only with `try_wait`, which never reserves nor
//! promises: it only makes a transient deduction of C, whose negative half holds far more than
//! every thread of the GPU (INV(SEM3)). It takes the arena's mutexes like the arena's own
//! threads do, and walks its class list inside the arena's read section.

use core::ptr;

use crate::size_class::SizeClass;
use crate::ualloc::alloc::{ListClaimer, slot_ptr};
use crate::ualloc::arena::{Arena, bin_at};
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

    /// A fresh bin of `class` in another arena than `ai`, carved with its first `k` slots
    /// taken, listed there and its other slots released there; its address, or `None` when no
    /// other arena has a free bin of the class's kind. `k <= class.slots()`.
    #[cold]
    #[inline(never)]
    pub(crate) fn carve_elsewhere(&self, ai: usize, class: SizeClass, k: u32) -> Option<u64> {
        let kind = class.kind();
        for arena in self.others(ai) {
            let ks = arena.kind(kind);
            // INV(UA9): a unit is a free bin on the partial list, ours to take.
            if !ks.bins.0.try_wait(1) {
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
            let addr = (chunk.base() + bin_offset(kind, index)) as u64;
            // SAFETY: the bin was free in a live chunk and is ours alone now.
            let bin = unsafe { bin_at(addr) };
            bin.init(class, k);
            let rest = class.slots() - k;
            if rest > 0 {
                let classes = &arena.class(class).list.0;
                classes.lock.lock_single();
                classes.push_locked(bin);
                classes.lock.unlock();
                // INV(UA2): listed before its units are.
                arena.class(class).slots.0.release(rest);
            }
            return Some(addr);
        }
        None
    }

    /// One free slot of `class` from another arena's listed bins than `ai`; null when none
    /// has one. For a lane whose own arena, the source and [`carve_elsewhere`] have failed.
    ///
    /// [`carve_elsewhere`]: Self::carve_elsewhere
    #[cold]
    #[inline(never)]
    pub(crate) fn steal_slot(&self, ai: usize, class: SizeClass) -> *mut u8 {
        for arena in self.others(ai) {
            // INV(UA2): a unit is a free slot in a listed bin; the claimer finds it.
            if arena.class(class).slots.0.try_wait(1) {
                let (bin, word, bits) = ListClaimer::new(arena, class).next(1);
                return slot_ptr(bin, class, word * WORD_BITS as u32 + bits.trailing_zeros());
            }
        }
        ptr::null_mut()
    }
}
