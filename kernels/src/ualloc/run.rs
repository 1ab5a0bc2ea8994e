//! Runs of slots: bins carved full for an arena and class, side by side in one chunk, whose
//! slots are handed out by index with one add on the run's word ([`Run`](crate::run::Run),
//! whose base is the first bin's address in 128 B blocks). Item `i` of a run of a small class
//! is slot `i % slots` of its bin `i / slots`; a run of a large class is one bin.
//!
//! Who takes from them:
//! - the lane that is the one lane of its warp asking for a small block (`alloc_alone`), for
//!   every class: one item;
//! - a group of lanes of a small class (16 B – 128 B) whose arena's semaphore had no units
//!   for it (`alloc_group_after`): its `k` items with one add. That is a fresh fill's common
//!   case, and a warm heap's slots stay with the semaphore and the lists.
//!
//! Without a run, such a lane or group takes its slots with a chain of dependent atomics: the
//! class's semaphore, the arena's read section, the list's head, the bin's count and bitmap,
//! and the section's closing fence; and a fresh fill's groups wait for refills that list a
//! few bins at a time, whose walkers pass each other's full bins (`docs/benchmarks.md`). From
//! a run it costs one add; the lane whose add uses the run up (or finds none) carves the next
//! bins and keeps the items it still needs from them.
//!
//! A run's bin is an ordinary carved bin that happens to be full: its bitmap has every slot
//! set and its count is the bin's slots (`BinHeader::init_for` with every slot claimed), so it
//! is not listed, and nothing else claims from it. A slot handed out by the run is a live
//! block like any other: its free clears its bit and lowers the count, and the first such free
//! lists the bin (a bin that was full, INV(UA7)). The slots nobody was handed when the run is
//! swapped out (the next stock, or a trim's flush) are freed by the swapper, whose release
//! lists the bin and gives their units to the class's semaphore (INV(UA18)).
//!
//! # Stray frees (INV(UA19))
//! A slot the run still holds has its bit set like a live block's, so the bitmap alone would
//! take a free of it for a real one, and the run would hand it out again: two owners of one
//! block. A run's bins are marked ([`RUN_BIN`] on the owner word), and a `free` into a marked
//! bin asks the arena's run of the class ([`run_holds`]): a slot of the run the word names
//! whose item is at or above the count was never handed out, and the free is refused
//! (counted as invalid). Every swap of a run word is guarded ([`Run::replace`](crate::run::Run::replace)): the run's
//! leftover slots are given back before the word stops naming it, and the new run's bins are
//! published only while the word names it closed, so a `free` never finds a run's slot that
//! the word does not account for. A group that crosses the end of a run keeps the items it
//! got there (its first lanes) and takes only the rest from the next run: nothing it was
//! counted for goes back behind the word's back.
//!
//! Runs are stocked only while chunks are plenty (as many per arena as a refill of several
//! bins needs, `PLENTY_CHUNKS_PER_ARENA`); otherwise the word is parked and lanes take their
//! slots the usual way, at the cost of their add. A stocker that finds fewer neighbouring
//! free bins than a run needs carves them as ordinary listed bins (a refill) and empties the
//! word, so that the next add tries again.

use crate::platform;
use crate::run::{Leftover, Look, MAX_BASE, Next, Take, Takes};
use crate::size_class::{BinKind, NUM_CLASSES, SizeClass};
use crate::ualloc::arena::{give_units, release_bits};
use crate::ualloc::bin::{BinHeader, RUN_BIN, bin_at};
use crate::ualloc::layout::{BLOCK_SHIFT, PAGE_SHIFT, PAGE_SIZE, SMALL_BINS, WORD_BITS, slot_ptr};
use crate::ualloc::refill::{JOINED, PLENTY_CHUNKS_PER_ARENA};
use crate::ualloc::{ChunkSource, UAlloc};

/// The most items a run of a small class holds: a group's position in a run is the first
/// bin's page address plus the item's index, which must stay below the next page
/// ([`run_slot`]).
const RUN_ITEMS: u32 = PAGE_SIZE as u32;
/// How many adoptions of others a stock joins before it parks the word (each may leave it
/// none of the new chunk's bins).
const MAX_JOINS: u32 = 4;
/// Bins a run of `class` carves: for a small class, the most bins of at most `RUN_ITEMS`
/// slots in all that divide a small chunk's 124 bins, so that a chunk is carved into whole
/// runs and no stock finds fewer neighbouring free bins than a run needs (16 B: 16 bins, the
/// exception: a divisor below half the most, 4, is too few; 32 B: 31; 64 B: 62; 128 B: 124,
/// the whole chunk);
/// one bin of a large class.
#[inline(always)]
pub const fn run_bins(class: SizeClass) -> u32 {
    // A table: the search below ran on every take before (16 B: 13 divisions; fresh 16 B
    // mallocs 9% slower, H100).
    RUN_BINS[class.index()]
}

/// [`run_bins`] of every class, by index.
const RUN_BINS: [u32; NUM_CLASSES] = {
    let mut table = [1; NUM_CLASSES];
    let mut i = 0;
    while i < NUM_CLASSES {
        let class = SizeClass::ALL[i];
        if let BinKind::Small = class.kind() {
            let most = RUN_ITEMS / class.slots();
            let mut bins = most;
            while bins > 1 && !(SMALL_BINS as u32).is_multiple_of(bins) {
                bins -= 1;
            }
            table[i] = if bins * 2 < most { most } else { bins };
        }
        i += 1;
    }
    table
};

/// Items (slots) in a run of `class`.
#[inline(always)]
pub const fn run_items(class: SizeClass) -> u32 {
    run_bins(class) * class.slots()
}

// A small class's bin holds a page's worth of slots (body and tail), so that an item's bin
// and slot are a shift and a mask; and its runs' items are numbered below a page.
const _: () = {
    let mut i = 0;
    while i < SizeClass::ALL.len() {
        let class = SizeClass::ALL[i];
        if let BinKind::Small = class.kind() {
            assert!(class.slots() == (PAGE_SIZE >> class.shift()) as u32);
            assert!(run_items(class) <= RUN_ITEMS && class.slots() >= crate::run::MAX_TAKE);
        }
        i += 1;
    }
};

/// Item `item` of the run whose first bin is at `base`: its bin's address and its slot there.
#[inline(always)]
fn run_bin(base: u64, class: SizeClass, item: u32) -> (u64, u32) {
    match class.kind() {
        BinKind::Small => {
            let per_bin = PAGE_SHIFT - class.shift();
            let bin = base + (((item >> per_bin) as u64) << PAGE_SHIFT);
            (bin, item & ((1 << per_bin) - 1))
        }
        BinKind::Large => (base, item),
    }
}

/// What [`UAlloc::carve_run`] made.
#[derive(Clone, Copy)]
enum Carved {
    /// A run, at its first bin's address: prepared, its classes not yet published
    /// ([`UAlloc::publish_run`]).
    Run(u64),
    /// Ordinary listed bins, the first at this address.
    Listed(u64),
    Nothing,
}

/// The address of item `item` of the run whose first bin is at `base`.
#[inline(always)]
pub(crate) fn run_slot(base: u64, class: SizeClass, item: u32) -> *mut u8 {
    let (bin, slot) = run_bin(base, class, item);
    slot_ptr(bin, class, slot)
}

/// A group's position in a run of a small class: the first bin's (page) address plus the
/// index of the group's first item. Lane `r` of the group has item `first + r`.
#[inline(always)]
pub(crate) fn run_pos(base: u64, first: u32) -> u64 {
    debug_assert!(base.is_multiple_of(PAGE_SIZE as u64) && first < RUN_ITEMS);
    base | first as u64
}

/// The address of lane `r`'s item at a [`run_pos`].
#[inline(always)]
pub(crate) fn run_pos_slot(pos: u64, class: SizeClass, r: u32) -> *mut u8 {
    let page = PAGE_SIZE as u64 - 1;
    run_slot(pos & !page, class, (pos & page) as u32 + r)
}

/// What the run of a slot's class holds of it ([`run_holds`]).
///
/// Public for the loom model (`tests/loom_slot_run.rs`), which calls the real check.
pub enum Held {
    /// Not the run's: the slot's bit tells whether it is live.
    No,
    /// The run holds the slot: nobody was handed it.
    Yes,
    /// The run's word is in a swap: wait for it ([`Run::wait_while_draining`](crate::run::Run::wait_while_draining)), then look
    /// again.
    Swapping(Look),
}

/// Whether the run of `class` whose word reads `look` ([`Run::look`](crate::run::Run::look), of the bin's arena,
/// loaded inside the read section of the free that asks) holds slot `slot` of `bin` (a bin
/// carved for a run, [`RUN_BIN`]; INV(UA19)).
///
/// Public for the loom model (`tests/loom_slot_run.rs`), which calls the real check.
#[inline(always)]
pub fn run_holds(look: Look, class: SizeClass, bin: &BinHeader, slot: u32) -> Held {
    let Some(base) = look.base else {
        return Held::No;
    };
    let first = base << BLOCK_SHIFT;
    let at = bin as *const BinHeader as u64;
    let bins = run_bins(class) as u64;
    if at < first || at - first >= bins << PAGE_SHIFT {
        return Held::No;
    }
    if look.draining {
        return Held::Swapping(look);
    }
    let item = ((at - first) >> PAGE_SHIFT) * class.slots() as u64 + slot as u64;
    if item >= look.taken {
        Held::Yes
    } else {
        Held::No
    }
}

/// On a group leader's `at` ([`IN_RUNS`](super::alloc)): the group's add crossed the end of
/// the run; its first lanes have that run's last items (the leader's second word,
/// [`crossed_word`]), the others the next run's first (the position in `at`, 0: none).
pub(crate) const CROSSED: u64 = 1 << 62;
/// Where the count of a crossing group's items of the old run sits in the second word.
const CROSSED_SHIFT: u32 = 56;

/// The second word of a crossing group's leader: the run position of its items in the old
/// run and how many there are.
#[inline(always)]
pub(crate) fn crossed_word(pos: u64, n: u32) -> u64 {
    debug_assert!(pos < 1 << CROSSED_SHIFT && n <= crate::run::MAX_TAKE);
    pos | (n as u64) << CROSSED_SHIFT
}

/// Lane `rank`'s slot of a crossing group: from the old run (`second`, [`crossed_word`]) for
/// the first lanes, from the next run's position `next` for the rest; null for those when
/// there is no next run (take them the usual way).
#[inline(always)]
pub(crate) fn crossed_slot(class: SizeClass, next: u64, second: u64, rank: u32) -> *mut u8 {
    let n = (second >> CROSSED_SHIFT) as u32;
    if rank < n {
        run_pos_slot(second & ((1 << CROSSED_SHIFT) - 1), class, rank)
    } else if next != 0 {
        run_pos_slot(next, class, rank - n)
    } else {
        core::ptr::null_mut()
    }
}

impl<S: ChunkSource> UAlloc<'_, S> {
    /// A slot of `class` for a lone lane of arena `ai` from the arena's run: one add, and once
    /// per run a carving. Null: take the slot the usual way.
    #[inline(always)]
    pub(crate) fn alloc_from_run(&self, ai: usize, class: SizeClass) -> *mut u8 {
        match self.arenas[ai].slot_run(class).take(run_items(class)) {
            Take::Item { base, index } => run_slot(base << BLOCK_SHIFT, class, index),
            Take::Elsewhere => core::ptr::null_mut(),
            Take::Stock => match self.stock_slot_run(ai, class, 1) {
                0 => core::ptr::null_mut(),
                bin => slot_ptr(bin, class, 0),
            },
        }
    }

    /// `k` slots of a small `class` for a group of arena `ai` from the arena's run, for its
    /// leader: the run position ([`run_pos`]) of the group's first item, the others after it;
    /// 0 when memory is short (the run is parked): the group takes its slots the usual way.
    /// The second word is 0, or, with [`CROSSED`] on the first, the group's items of the
    /// run its add used up ([`crossed_slot`]).
    ///
    /// A group whose add finds another lane stocking waits for it: the usual way would be a
    /// refill of its own. A group whose add crosses the end of the run keeps the old run's
    /// last items for its first lanes and takes the rest from the next, which it stocks
    /// (INV(UA19): an item counted as handed out is handed out).
    #[cold]
    #[inline(never)]
    pub(crate) fn take_from_run(&self, ai: usize, class: SizeClass, k: u32) -> (u64, u64) {
        let run = self.arenas[ai].slot_run(class);
        loop {
            match run.take_many(k, run_items(class)) {
                Takes::Items {
                    base,
                    first,
                    n,
                    stock,
                } => {
                    let pos = run_pos(base << BLOCK_SHIFT, first);
                    if !stock {
                        return (pos, 0);
                    }
                    let next = self.stock_slot_run(ai, class, k - n);
                    return (next | CROSSED, crossed_word(pos, n));
                }
                Takes::Stock => return (self.stock_slot_run(ai, class, k), 0),
                Takes::Busy(seen) => run.wait_for_stock(seen),
                Takes::Parked => return (0, 0),
            }
        }
    }

    /// Carve the next run of `class` for arena `ai`, full, and install it; its first `keep`
    /// slots (`1..=MAX_TAKE`) are ours. Returns its first bin's address (a run position with
    /// item 0); or, when the neighbouring free bins were fewer than a run needs, the first of
    /// those, carved as ordinary listed bins with its first `keep` slots ours; 0 (the word
    /// parked) when chunks are not plenty or none is left.
    ///
    /// Not kept: a run carved ahead by the group that passes the middle of the run, which the
    /// stock at its end installed with one swap. 2^20 fresh mallocs of 64 B took 0.310 ms with
    /// it and 0.268 without, and a warm heap's 0.479 and 0.417 (H100).
    #[cold]
    #[inline(never)]
    pub(crate) fn stock_slot_run(&self, ai: usize, class: SizeClass, keep: u32) -> u64 {
        let run = self.arenas[ai].slot_run(class);
        let items = run_items(class);
        let carved = self.carve_run(ai, class, keep);
        let (next, bin) = match carved {
            Carved::Run(bin) => (
                Next::Run {
                    base: bin >> BLOCK_SHIFT,
                    kept: keep,
                },
                bin,
            ),
            Carved::Listed(bin) => (Next::Empty, bin),
            Carved::Nothing => (Next::Parked, 0),
        };
        // Guarded (INV(UA19)): the displaced run's leftovers go back before the word stops
        // naming it, and the new run's bins are published while it names them closed.
        run.replace(
            next,
            items,
            true,
            |left| self.give_back_slots(ai, class, left),
            || {
                if let Carved::Run(bin) = carved {
                    self.publish_run(class, bin);
                }
            },
        );
        if let Carved::Run(_) = carved {
            // INV(UA17): a trim may now find the run's slots to give back, so a refill out
            // of memory must not skip it as futile.
            self.arenas[ai].harvest().note();
        }
        bin
    }

    /// Publish the classes of the bins of a run that [`carve_run`](Self::carve_run) prepared
    /// (after its release fence), while the run's word names it closed.
    fn publish_run(&self, class: SizeClass, bin: u64) {
        for j in 0..run_bins(class) as u64 {
            // SAFETY: `take_bins` handed the carver these bins of a live chunk.
            unsafe { bin_at(bin + (j << PAGE_SHIFT)) }.publish_class(class);
        }
    }

    /// A run of `class` for arena `ai`: bins side by side, carved full (INV(UA18)); or, when
    /// fewer neighbouring free bins were left, those bins carved as ordinary listed bins (the
    /// first with its first `keep` slots taken, the rest given to the semaphore: a refill
    /// nobody promised, INV(SEM4)); or nothing, when chunks are not plenty or none is left.
    fn carve_run(&self, ai: usize, class: SizeClass, keep: u32) -> Carved {
        let plenty = self.source.chunks_left() >= self.arenas.len() * PLENTY_CHUNKS_PER_ARENA;
        let want = run_bins(class);
        let mut taken = (0, 0);
        if plenty {
            for _ in 0..MAX_JOINS {
                taken = self.take_bins(ai, class.kind(), want, true);
                // JOINED: another thread's adoption of a chunk of this kind came first; its
                // bins are there to take.
                if taken.0 != JOINED {
                    break;
                }
            }
        }
        let (bin, got) = taken;
        if got == 0 {
            return Carved::Nothing;
        }
        let arena = &self.arenas[ai];
        // An address the word cannot name (none on today's GPUs) makes ordinary bins.
        if got < want || bin >> BLOCK_SHIFT > MAX_BASE {
            self.carve_listed(ai, class, bin, got, keep);
            // INV(UA2): listed before their units are.
            let units = got * class.slots() - keep;
            arena.class(class).slots.0.release(units);
            return Carved::Listed(bin);
        }
        // Side by side (`take_bins`): bin `j` is a page after bin `j - 1`. Ours alone; marked
        // as a run's (INV(UA19)).
        for j in 0..got as u64 {
            // SAFETY: `take_bins` handed us these bins of a live chunk.
            unsafe { bin_at(bin + (j << PAGE_SHIFT)) }.prepare_for(
                ai as u32 | RUN_BIN,
                class,
                class.slots(),
            );
        }
        // One release for every bin's words; each bin's class follows (as a refill's) once
        // the run's word names the run ([`publish_run`](Self::publish_run)).
        platform::fence_acq_rel();
        Carved::Run(bin)
    }

    /// Free the slots of a run of arena `ai` that nobody was handed (INV(UA18)), a bitmap word
    /// at a time, as a warp's free does: the release lists the bin if it was full and gives
    /// the slots' units to the class's semaphore.
    #[cold]
    #[inline(never)]
    pub(crate) fn give_back_slots(&self, ai: usize, class: SizeClass, left: Leftover) {
        let arena = &self.arenas[ai];
        let base = left.base << BLOCK_SHIFT;
        let end = left.first + left.count;
        let mut item = left.first;
        while item < end {
            let (bin_addr, in_bin) = run_bin(base, class, item);
            // SAFETY: the run's bins stay carved while its slots are claimed, and these are.
            let bin = unsafe { bin_at(bin_addr) };
            let word = in_bin / WORD_BITS as u32;
            let len = (end - item)
                .min((word + 1) * WORD_BITS as u32 - in_bin)
                .min(class.slots() - in_bin);
            let bits = (u64::MAX >> (WORD_BITS as u32 - len)) << (in_bin % WORD_BITS as u32);
            let reader = arena.rcu.read_lock_fenced();
            let (old, emptied) = release_bits(arena, class, bin, word, bits);
            drop(reader);
            debug_assert_eq!(
                old & bits,
                bits,
                "a run's slots stay claimed until given back"
            );
            give_units(arena, class, old, bits, emptied);
            item += len;
        }
    }

    /// Empty arena `ai`'s runs of slots (a trim), each with a guarded swap that does not wait
    /// for another (whose swapper gives back what it displaces). Returns how many gave
    /// something back.
    pub(crate) fn flush_slot_runs(&self, ai: usize) -> u32 {
        let mut flushed = 0;
        for class in SizeClass::ALL {
            let run = self.arenas[ai].slot_run(class);
            // A hint: a run that a stock installs after it is the next trim's.
            if run.is_empty() {
                continue;
            }
            run.replace(
                Next::Empty,
                run_items(class),
                false,
                |left| {
                    self.give_back_slots(ai, class, left);
                    flushed += 1;
                },
                || {},
            );
        }
        flushed
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_small_chunk_is_carved_into_whole_runs() {
        let bins = SizeClass::ALL
            .iter()
            .filter(|c| c.kind() == BinKind::Small)
            .map(|&c| (c.size(), run_bins(c), run_items(c)))
            .collect::<std::vec::Vec<_>>();
        assert_eq!(
            bins,
            [
                (16, 16, 4096),
                (32, 31, 3968),
                (64, 62, 3968),
                (128, 124, 3968)
            ]
        );
    }
}
