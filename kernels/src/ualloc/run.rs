//! Runs of slots for lanes alone in their warp: one bin per arena and class, carved full,
//! whose slots are handed out by index with one add on the run's word
//! ([`Run`](crate::run::Run), whose base is the bin's address in 128 B blocks). Only the lane
//! that is the one lane of its warp asking for a small block comes here (`alloc_alone`).
//!
//! Such a lane would otherwise take a slot with a chain of dependent atomics: the class's semaphore, the arena's read section, the list's head, the
//! bin's count and bitmap, and the section's closing fence. ncu of one thread's mallocs put a
//! third of its time there (`docs/benchmarks.md`). From a run it costs one add; the lane whose
//! add uses the run up (or finds none) carves the next bin and keeps its slot 0.
//!
//! A run's bin is an ordinary carved bin that happens to be full: its bitmap has every slot
//! set and its count is the bin's slots (`BinHeader::init_for` with every slot claimed), so it
//! is not listed, and nothing else claims from it. A slot handed out by the run is a live
//! block like any other: its free clears its bit and lowers the count, and the first such free
//! lists the bin (a bin that was full, INV(UA7)). The slots nobody was handed when the run is
//! swapped out (the next stock, or a trim's flush) are freed by the swapper, whose release
//! lists the bin and gives their units to the class's semaphore (INV(UA18)).
//!
//! Runs are stocked only while chunks are plenty (as many per arena as a refill of several
//! bins needs, `PLENTY_CHUNKS_PER_ARENA`); otherwise the word is parked and lone lanes take
//! their slots the usual way, at the cost of their add.

use crate::run::{Leftover, MAX_BASE, Take};
use crate::size_class::SizeClass;
use crate::ualloc::alloc::slot_ptr;
use crate::ualloc::arena::bin_at;
use crate::ualloc::free::{give_units, release_bits};
use crate::ualloc::layout::{BLOCK_SHIFT, WORD_BITS};
use crate::ualloc::refill::PLENTY_CHUNKS_PER_ARENA;
use crate::ualloc::{ChunkSource, UAlloc};

impl<S: ChunkSource> UAlloc<'_, S> {
    /// A slot of `class` for a lone lane of arena `ai` from the arena's run: one add, and once
    /// per run a carving. Null: take the slot the usual way.
    #[inline(always)]
    pub(crate) fn alloc_from_run(&self, ai: usize, class: SizeClass) -> *mut u8 {
        match self.arenas[ai].slot_run(class).take(class.slots()) {
            Take::Item { base, index } => slot_ptr(base << BLOCK_SHIFT, class, index),
            Take::Elsewhere => core::ptr::null_mut(),
            Take::Stock => self.stock_run(ai, class),
        }
    }

    /// Carve a bin of `class` full for arena `ai`'s run and install it; its slot 0 is ours.
    /// Null (the word parked) when chunks are not plenty or none is left.
    #[cold]
    #[inline(never)]
    fn stock_run(&self, ai: usize, class: SizeClass) -> *mut u8 {
        let plenty = self.source.chunks_left() >= self.arenas.len() * PLENTY_CHUNKS_PER_ARENA;
        let bin = if plenty {
            match self.take_bins(ai, class.kind(), 1) {
                (bin, 1) => Some(bin),
                _ => None,
            }
        } else {
            None
        };
        let arena = &self.arenas[ai];
        let run = arena.slot_run(class);
        // An address the word cannot name (none on today's GPUs) makes an ordinary bin: all
        // but our slot freed at once, and the word parked.
        let named = bin.filter(|&b| b >> BLOCK_SHIFT <= MAX_BASE);
        if let Some(bin) = bin {
            // SAFETY: `take_bins` handed us this bin of a live chunk, ours alone.
            unsafe { bin_at(bin) }.init_for(ai as u32, class, class.slots());
        }
        if let Some(left) = run.stock(named.map(|b| b >> BLOCK_SHIFT), class.slots()) {
            self.give_back_slots(ai, class, left);
        }
        if named.is_some() {
            // INV(UA17): a trim may now find the run's slots to give back, so a refill out of
            // memory must not skip it as futile.
            arena.harvest().note();
        }
        let Some(bin) = bin else {
            return core::ptr::null_mut();
        };
        if named.is_none() {
            let left = Leftover {
                base: bin >> BLOCK_SHIFT,
                first: 1,
                count: class.slots() - 1,
            };
            self.give_back_slots(ai, class, left);
        }
        slot_ptr(bin, class, 0)
    }

    /// Free the slots of a run of arena `ai` that nobody was handed (INV(UA18)), a bitmap word
    /// at a time, as a warp's free does: the release lists the bin if it was full and gives
    /// the slots' units to the class's semaphore.
    #[cold]
    #[inline(never)]
    pub(crate) fn give_back_slots(&self, ai: usize, class: SizeClass, left: Leftover) {
        let arena = &self.arenas[ai];
        // SAFETY: the run's bin stays carved while its slots are claimed, and these are.
        let bin = unsafe { bin_at(left.base << BLOCK_SHIFT) };
        let end = left.first + left.count;
        let mut at = left.first;
        while at < end {
            let word = at / WORD_BITS as u32;
            let stop = end.min((word + 1) * WORD_BITS as u32);
            let len = stop - at;
            let bits = (u64::MAX >> (WORD_BITS as u32 - len)) << (at % WORD_BITS as u32);
            let reader = arena.rcu.read_lock_fenced();
            let (old, emptied) = release_bits(arena, class, bin, word, bits);
            drop(reader);
            debug_assert_eq!(
                old & bits,
                bits,
                "a run's slots stay claimed until given back"
            );
            give_units(arena, class, old, bits, emptied);
            at = stop;
        }
    }

    /// Empty arena `ai`'s runs of slots (a trim). Returns how many gave something back.
    pub(crate) fn flush_slot_runs(&self, ai: usize) -> u32 {
        let mut flushed = 0;
        for class in SizeClass::ALL {
            if let Some(left) = self.arenas[ai].slot_run(class).flush(class.slots()) {
                self.give_back_slots(ai, class, left);
                flushed += 1;
            }
        }
        flushed
    }
}
