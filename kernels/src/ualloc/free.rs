//! `free` and `usable_size`: pointer → chunk → bin → slot, validation, retirement.

use crate::platform::Backoff;
use crate::size_class::{BinKind, SizeClass};
use crate::ualloc::alloc::sync_listing;
use crate::ualloc::arena::Arena;
use crate::ualloc::bin::{BinHeader, Release};
use crate::ualloc::chunk::{ChunkHeader, chunk_base};
use crate::ualloc::layout::{PAGE_SIZE, SlotArea, area_of};
use crate::ualloc::{ChunkSource, FreeOutcome, UAlloc};

/// The bin, class and slot that `addr` (inside the live chunk `chunk`) is the start of.
fn locate(chunk: &ChunkHeader, addr: usize) -> Option<(&BinHeader, SizeClass, u32)> {
    let kind = chunk.kind();
    let (index, area) = area_of(kind == BinKind::Small, addr - chunk.base())?;
    let bin = chunk.bin(index);
    // INV(UA5): not carved → 0 → None.
    let class = bin.class()?;
    if class.kind() != kind {
        return None;
    }
    let (offset, first) = match area {
        SlotArea::Body(x) => (x, 0),
        SlotArea::Tail(x) => (x, class.main_slots()),
    };
    if offset & (class.size() - 1) != 0 {
        return None;
    }
    let slot = first + (offset >> class.shift()) as u32;
    let limit = match area {
        SlotArea::Body(_) => class.main_slots(),
        SlotArea::Tail(_) => class.slots(),
    };
    if slot >= limit {
        return None;
    }
    Some((bin, class, slot))
}

impl<S: ChunkSource> UAlloc<'_, S> {
    /// Free the block at `p`. Detects double frees (slot bit already clear) and pointers that
    /// are not UAlloc blocks, and then changes nothing.
    ///
    /// # Safety
    /// `p` is not page-aligned or is rejected at once; otherwise the `CHUNK_SIZE`-aligned
    /// block containing `p` must be readable memory (inside the heap's data region) for the
    /// duration of the call. `p` need not be a live block.
    pub unsafe fn free(&self, p: *mut u8) -> FreeOutcome {
        let addr = p as usize;
        // INV(UA1): UAlloc blocks are never page-aligned (null included).
        if addr.is_multiple_of(PAGE_SIZE) {
            return FreeOutcome::Invalid;
        }
        // SAFETY: the caller guarantees the chunk-aligned block around `p` is readable.
        let chunk = unsafe { ChunkHeader::at(chunk_base(addr)) };
        if !chunk.is_live() {
            return FreeOutcome::Invalid;
        }
        let ai = chunk.arena.load_relaxed() as usize;
        let Some(arena) = self.arenas.get(ai) else {
            return FreeOutcome::Invalid;
        };
        let reader = arena.rcu.read_lock();
        // INV(UA8)/INV(RCU1): re-checked inside the read section, the chunk stays UAlloc's (and
        // this arena's) until we leave it.
        if !chunk.is_live() || chunk.arena.load_relaxed() as usize != ai {
            return FreeOutcome::Invalid;
        }
        let Some((bin, class, slot)) = locate(chunk, addr) else {
            return FreeOutcome::Invalid;
        };
        let Release::Freed {
            was_full,
            now_empty,
        } = bin.release(class, slot)
        else {
            return FreeOutcome::DoubleFree;
        };
        if was_full {
            // INV(UA7): a bin that was full rejoins its list before its unit is released.
            sync_listing(arena, class, bin);
        }
        arena.class(class).slots.0.release(1);
        let retired = now_empty && Self::free_slow_retire(arena, class, bin);
        drop(reader);
        if retired {
            // SAFETY: INV(UA4): the bin is retired and unlinked; its header stays valid until the
            // callback returns it to the chunk, and it is queued once per retirement.
            unsafe { arena.rcu.call_rcu(&bin.rcu) };
            arena
                .rcu
                .barrier_conditional(|head| self.run_callback(head));
        }
        FreeOutcome::Freed(class)
    }

    /// The class size of the live block at `p` (what `realloc` may use in place); 0 if `p` is
    /// not a UAlloc block.
    ///
    /// # Safety
    /// As for [`free`](Self::free), and `p` must stay live during the call.
    pub unsafe fn usable_size(&self, p: *mut u8) -> usize {
        let addr = p as usize;
        if addr.is_multiple_of(PAGE_SIZE) {
            return 0;
        }
        // SAFETY: the caller guarantees the chunk-aligned block around `p` is readable.
        let chunk = unsafe { ChunkHeader::at(chunk_base(addr)) };
        if !chunk.is_live() {
            return 0;
        }
        locate(chunk, addr).map_or(0, |(_, class, _)| class.size())
    }

    /// Retire `bin` if it is still empty (INV(UA4)): take its slots' units back from the
    /// semaphore, then `used` 0 → RETIRED, then unlink. Spins while the units are out with
    /// waiters that have not claimed yet: by INV(UA2) they must claim in this bin (ending the
    /// attempt) unless frees bring the units back, so the loop ends; it never holds a lock.
    /// Called inside a read section of the arena.
    #[cold]
    #[inline(never)]
    fn free_slow_retire(arena: &Arena, class: SizeClass, bin: &BinHeader) -> bool {
        let slots = &arena.class(class).slots.0;
        let mut backoff = Backoff::new();
        loop {
            if bin.used_word() != 0 {
                // Claimed again (its free retries) or retired by another free.
                return false;
            }
            if slots.try_wait(class.slots()) {
                if bin.try_retire() {
                    // INV(UA7): RETIRED → unlinked.
                    sync_listing(arena, class, bin);
                    return true;
                }
                slots.release(class.slots());
                return false;
            }
            backoff.snooze();
        }
    }
}
