//! UAlloc: the fine-grained allocator for blocks of 16 B to 4 KB, with one arena per SM.
//!
//! ```text
//!  ChunkSource (TBuddy) ──512 KB chunk──► Arena (per SM)
//!                                          ├─ per kind:  chunk lists + bins semaphore
//!                                          │     chunk ─┬─ bin ─┬─ slot   (small: 124 × 4 KB,
//!                                          │            │       ├─ slot           tails)
//!                                          │            │       └─ ...
//!                                          │            └─ bin ...        (large: 5 × 102 KB)
//!                                          └─ per class: bin list (SRCU) + slots semaphore
//!
//!  pointer p ──► chunk = p & !(CHUNK_SIZE − 1)      (ChunkHeader: magic, kind, arena)
//!            ──► bin   = page (small) or (p − 256) / LARGE_BIN_SIZE (large); a tail maps back
//!                        to its bin (layout::area_of)
//!            ──► slot  = (offset in body or tail) >> class shift
//! ```
//!
//! # malloc (two stages: count, then find)
//! 1. Lanes of a warp asking for the same class in the same arena form a [`Group`](crate::collective::Group); its
//!    leader takes `k` units from the class's slots semaphore with one `wait`.
//! 2. `Acquired` (the fast path, `serve_group`): the leader walks the
//!    class's bin list under the arena's SRCU and claims free bits with one `fetch_or` per
//!    bitmap word (usually one for the whole group), broadcasting each claim to the group.
//!    The lanes whose groups got their units this way leave `malloc` together (a
//!    `bar.warp.sync`), so that a warp split by class meets again in the caller.
//! 3. `MustRefill` (the slow path, `alloc_slow`): the leader takes fresh bins from the
//!    arena's chunks (a collective over the lanes of the warp that need bins of that kind:
//!    one chunk-list lock, each member walks to its own run of free bins; several bins while
//!    chunks are plentiful, [`SizeClass::refill_bins`](crate::size_class::SizeClass::refill_bins))
//!    or adopts a new chunk, keeps `k` slots, lists the bins with one splice and signals the
//!    rest.
//!
//! A lone lane takes the same steps without collectives (`alloc_fast_single`).
//!
//! # free
//! Find the chunk (check its magic), enter its arena's SRCU read section, find bin and slot
//! (check the class and the slot boundary), clear the bit. Lanes of a warp whose slots share a
//! bitmap word do this once for the group. A bin that was full rejoins its list; the units go
//! back to the semaphore. A bin that becomes empty stays carved and listed: `trim` (run by
//! `malloc` before it reports out of memory, and by the host through `DeviceHeap::trim`) retires
//! empty bins (their slots taken back from the semaphore, `used` 0 → RETIRED, unlinked) and
//! returns them to their chunks after a grace period; a chunk whose bins are all free goes
//! back to the source after another. So memory flows back between classes and kinds.
//!
//! Invariants are listed in `docs/invariants.md` (UA*, RCU*, CM*).

pub mod arena;
pub mod bin;
pub mod chunk;
pub mod layout;
pub mod pending;

mod alloc;
mod exhaust;
mod free;
mod refill;
mod run;
mod steal;
mod validate;

use crate::rcu::RcuHead;
use crate::size_class::SizeClass;

pub use crate::size_class::MAX_SMALL_SIZE;
pub use arena::Arena;
pub use exhaust::{HarvestCount, TrimGate};
pub use layout::{CHUNK_SHIFT, CHUNK_SIZE, PAGE_SHIFT, PAGE_SIZE};
pub(crate) use refill::OOM_RETRIES;
#[doc(hidden)]
pub use run::{Held, run_holds};
pub use run::{run_bins, run_items};

/// Where UAlloc gets its chunks (the heap implements it over TBuddy).
pub trait ChunkSource {
    /// A `CHUNK_SIZE`-aligned chunk (absolute address), or `None` when out of memory. Its
    /// contents are arbitrary.
    fn alloc_chunk(&self) -> Option<*mut u8>;

    /// Give back a chunk that `alloc_chunk` returned.
    ///
    /// # Safety
    /// `chunk` came from `alloc_chunk` of this source and is not used any more.
    unsafe fn free_chunk(&self, chunk: *mut u8);

    /// `2^log2` chunks side by side (the first's address, `CHUNK_SIZE`-aligned), each given
    /// back on its own with `free_chunk`; `None` when the source has no such run at hand
    /// (default: never), and the caller takes one chunk instead. One trip to the source for
    /// several chunks: UAlloc keeps the second as the arena's spare and adopts the others.
    fn alloc_chunk_run(&self, log2: u32) -> Option<*mut u8> {
        let _ = log2;
        None
    }

    /// Give back what the source keeps aside and nobody uses, so that `alloc_chunk` can find
    /// it (default: nothing). [`UAlloc::trim`] calls it first; returns how much it found (0:
    /// nothing). The heap empties its SMs' runs of large blocks into its buddy tree
    /// (`tbuddy::run`, INV(TB14)).
    fn reclaim(&self) -> u32 {
        0
    }

    /// Like [`reclaim`](Self::reclaim), for what callers can share (default: nothing):
    /// [`UAlloc::trim`] runs it on every caller before the one trim that walks the arenas (and
    /// calls `reclaim`), so that threads out of memory at once share the work instead of
    /// waiting for one of them.
    /// Returns how much this caller found. The heap gives its stashed large blocks back to its
    /// buddy tree (INV(HP6)), each with its climb of the tree.
    fn reclaim_shared(&self) -> u32 {
        0
    }

    /// About how many chunks `alloc_chunk` could still hand out (a hint; default: plenty).
    /// Fewer than four per arena makes UAlloc share bins and adoptions between arenas
    /// (INV(UA16), steal.rs).
    fn chunks_left(&self) -> usize {
        usize::MAX
    }

    /// The most chunks the source could ever hold (default: no bound). A source with fewer
    /// than four per arena is a small heap, whose chunks are always scarce: a group whose own
    /// arena has no slots goes to its class's home before it waits for a refill of its own
    /// (INV(UA16), `UAlloc::serve_at_home`).
    fn chunks_at_most(&self) -> usize {
        usize::MAX
    }
}

/// What [`UAlloc::free`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeOutcome {
    /// A live block of this class was freed.
    Freed(SizeClass),
    /// The block was already free (its slot bit was clear); nothing changed. Once a bin that
    /// became empty has gone back to its chunk, a second free of one of its blocks finds no
    /// carved bin and reports [`Invalid`](FreeOutcome::Invalid) instead.
    DoubleFree,
    /// Not a UAlloc block: no live UAlloc chunk, a header or padding, not at a slot
    /// boundary, or a bin that is not carved. Nothing changed.
    Invalid,
}

/// UAlloc over a slice of arenas and a chunk source. A cheap view: building one per call is
/// fine (two words plus the source).
pub struct UAlloc<'a, S: ChunkSource> {
    arenas: &'a [Arena],
    source: S,
    /// Shared by every view of one heap: one [`trim`](Self::trim) walks the arenas at a time,
    /// callers meanwhile share its result, and refills skip a trim that cannot help
    /// (INV(UA17)). `None`: each caller walks, and every refill that finds nothing trims.
    trim_gate: Option<&'a TrimGate>,
}

/// Passes in [`alloc::ListClaimer`] before a walk of the bin list starts over: bounds the
/// length of a read section (so barriers progress) when bins are relinked under a walker.
/// Lists are short (full bins leave them), so a real walk rarely comes near it.
const SCAN_LIMIT: u32 = 256;

/// Tags that keep the keys of different `Group::of` call sites apart.
const CLASS_GROUP_TAG: u64 = 1 << 40;
const KIND_GROUP_TAG: u64 = 2 << 40;

impl<'a, S: ChunkSource> UAlloc<'a, S> {
    /// UAlloc over `arenas` (at least one; all-zero or [`Arena::new`]) and `source`.
    pub fn new(arenas: &'a [Arena], source: S) -> Self {
        debug_assert!(!arenas.is_empty());
        Self {
            arenas,
            source,
            trim_gate: None,
        }
    }

    /// This view with `gate` in front of [`trim`](Self::trim): the heap gives every view the
    /// same gate (`HeapHeader::trim_gate`).
    pub fn with_trim_gate(self, gate: &'a TrimGate) -> Self {
        Self {
            trim_gate: Some(gate),
            ..self
        }
    }

    /// The arenas.
    pub fn arenas(&self) -> &'a [Arena] {
        self.arenas
    }

    /// The chunk source.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// Chunks UAlloc holds now (a snapshot).
    pub fn chunks_held(&self) -> usize {
        self.arenas.iter().map(|a| a.chunk_count() as usize).sum()
    }

    /// Wait until every deferred bin and chunk return queued so far has run, in every arena.
    /// Not needed for correctness (frees run them); for tests and shutdown.
    pub fn flush(&self) {
        for arena in self.arenas {
            arena.rcu.barrier(|head| self.run_callback(head));
        }
    }

    /// This thread's arena: `sm_id % arenas`.
    #[inline(always)]
    fn arena_index(&self) -> usize {
        crate::platform::sm_id() as usize % self.arenas.len()
    }

    /// An RCU callback: return a retired bin to its chunk, or a retired chunk to the source.
    #[cold]
    #[inline(never)]
    fn run_callback(&self, head: *const RcuHead) {
        let chunk_addr =
            (head as usize).wrapping_sub(core::mem::offset_of!(chunk::ChunkHeader, rcu));
        if chunk_addr.is_multiple_of(CHUNK_SIZE) {
            // SAFETY: INV(RCU4): a chunk's head was queued by `return_bin` after the chunk left
            // every list and lost its magic; the grace period has passed.
            unsafe { self.source.free_chunk(chunk_addr as *mut u8) };
        } else {
            let bin_addr = head as usize - core::mem::offset_of!(bin::BinHeader, rcu);
            // SAFETY: INV(RCU4): a bin's head was queued by `trim` after the bin was retired
            // and unlinked; its chunk is live until the bin is back in it.
            let bin = unsafe { bin::bin_at(bin_addr as u64) };
            if !self.unpinned(bin) {
                // INV(UA13): a drain holds it. Ask again after another grace period (the
                // drain finishes meanwhile; this owner runs again because the queue is not
                // empty).
                let owner = &self.arenas[bin.owner() as usize];
                // SAFETY: retired and unlinked as above; it stays valid until this callback
                // runs again.
                unsafe { owner.rcu.call_rcu(head) };
                return;
            }
            self.return_bin(bin);
        }
    }
}

impl<S: ChunkSource> UAlloc<'_, S> {
    /// Whether the retired `bin` is off every pending stack (INV(UA13)), after draining its
    /// class's stack in its arena if it was on it. A retired bin gets no more crossings (it has
    /// no live slot), so once this is true it stays true.
    fn unpinned(&self, bin: &bin::BinHeader) -> bool {
        if bin.pending_count() == 0 {
            return true;
        }
        if let Some(class) = bin.class() {
            arena::drain_pending(&self.arenas[bin.owner() as usize], class);
        }
        bin.pending_count() == 0
    }
}

// INV(RCU4): a bin's RCU head can never look like a chunk's (bins are 128-aligned and never at
// a chunk's start).
#[cfg(not(loom))]
const _: () = assert!(
    core::mem::offset_of!(bin::BinHeader, rcu) % layout::BLOCK_SIZE
        != core::mem::offset_of!(chunk::ChunkHeader, rcu) % layout::BLOCK_SIZE
);
