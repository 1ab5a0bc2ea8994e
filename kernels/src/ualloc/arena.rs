//! An arena: one per SM, with a bin list per size class and a chunk list per bin kind.
//!
//! ```text
//!  Arena (repr(C), every hot word on its own 128 B line)
//!  ┌──────────────┬─────────────────────────────────┬─────────────────────────────────────┐
//!  │ Srcu (512 B) │ per class × 8:                  │ per kind × 2:                       │
//!  │ epoch and    │  slots: BulkSemaphore  (line)   │  bins: BulkSemaphore       (line)   │
//!  │ readers,     │  list: head + mutex    (line)   │  chunks: partial, all, mutex (line) │
//!  │ queue        │                                 │                                     │
//!  └──────────────┴─────────────────────────────────┴─────────────────────────────────────┘
//!  slots semaphore C = free slots in the class's listed bins (INV(UA2))
//!  bins semaphore  C = free bins in the kind's partial chunks (INV(UA9))
//! ```
//!
//! Zeroed memory is a valid empty arena: every semaphore holds 0 units, every list is empty,
//! every mutex is unlocked, the SRCU domain is idle.

use crate::bulk_semaphore::{BulkSemaphore, PerSm};
use crate::collective::{CollectiveMutex, SingleFlight};
use crate::platform::{Atomic32, Atomic64};
use crate::rcu::Srcu;
use crate::run::Run;
use crate::size_class::{BinKind, NUM_CLASSES, NUM_KINDS, SizeClass};
use crate::tbuddy::run::{BlockRun, RUN_ORDERS, RUNS};
use crate::ualloc::bin::{BinHeader, bin_at};
use crate::ualloc::chunk::{ChunkHeader, chunk_at};
use crate::ualloc::exhaust::HarvestCount;
use crate::ualloc::pending::PendingStack;

/// Keeps a value on its own 128 B line.
#[repr(C, align(128))]
pub(crate) struct Line<T>(pub(crate) T);

/// A class's list of bins (INV(UA7)): readers walk it under the arena's SRCU; writers link
/// and unlink under `lock`. A bin that gets a free slot while unlisted is linked lazily: the
/// freeing thread notes it on `pending`, and the next walker that finds nothing (or `trim`)
/// drains it.
#[repr(C)]
pub(crate) struct BinList {
    /// First bin (address, 0 = empty).
    pub(crate) head: Atomic64,
    pub(crate) lock: CollectiveMutex,
    /// Bins of this class and arena that got a free slot and may be unlisted (INV(UA7),
    /// INV(UA13)).
    pub(crate) pending: PendingStack,
    /// While chunks are scarce and this arena is the class's home, the one refill at a time
    /// that carves a bin for it on behalf of another SM (INV(UA16), steal.rs).
    pub(crate) home_refill: SingleFlight,
    /// The arena's run of slots of the class (`ualloc::run`): bins carved full, whose slots
    /// its lone lanes, and its groups of a small class that the semaphore had no units for,
    /// take by index. A trim gives back what it holds (INV(UA18)). On this line, which a
    /// fresh fill's groups leave alone while they take from the run (and the run is idle while
    /// the list serves): with every class's run on one line, a fresh fill of mixed 16 B – 4 KB
    /// was 14% slower than without runs for groups (H100).
    pub(crate) run: Run,
}

/// Per size class.
#[repr(C)]
pub(crate) struct ClassState {
    /// Free slots in the listed bins (INV(UA2)); batch = slots per bin.
    pub(crate) slots: Line<BulkSemaphore<PerSm>>,
    pub(crate) list: Line<BinList>,
}

/// The chunks of one kind an arena owns.
#[repr(C)]
pub(crate) struct ChunkList {
    /// Chunks with free bins (address, 0 = empty). Under `lock`.
    pub(crate) partial: Atomic64,
    /// Every chunk of the arena and kind. Under `lock`.
    pub(crate) all: Atomic64,
    /// Number of chunks on `all`.
    pub(crate) count: Atomic32,
    pub(crate) lock: CollectiveMutex,
    /// A chunk the heap took from the source for this arena and kind when it was initialized
    /// (address, 0 = none): the arena's first adoption takes it with one `swap` instead of a
    /// climb of the buddy tree, and `trim` gives it back unused (INV(UA14)).
    pub(crate) spare: Atomic64,
    /// While chunks are scarce and this arena is the kind's home, the one adoption of a chunk
    /// of this kind at a time in the heap (INV(UA16), `UAlloc::adopt_chunk`).
    pub(crate) adoption: SingleFlight,
    /// In the kind's home: 1 when some arena may hold free bins of this kind, 0 after a look
    /// at every arena found none since (a hint for `UAlloc::take_free_bins`, steal.rs).
    pub(crate) free_bins_hint: Atomic32,
}

/// Per bin kind.
#[repr(C)]
pub(crate) struct KindState {
    /// Free bins in the partial chunks (INV(UA9)); batch = bins per chunk.
    pub(crate) bins: Line<BulkSemaphore<PerSm>>,
    pub(crate) chunks: Line<ChunkList>,
}

/// One SM's share of UAlloc (see the module doc). All-zero memory is a valid empty arena.
#[repr(C)]
pub struct Arena {
    pub(crate) rcu: Srcu,
    pub(crate) classes: [ClassState; NUM_CLASSES],
    pub(crate) kinds: [KindState; NUM_KINDS],
    /// The arena's trim: its lock, and its count of what a trim could give back.
    pub(crate) trim: Line<ArenaTrim>,
}

/// An arena's share of the trims (refill.rs, exhaust.rs).
#[repr(C)]
pub(crate) struct ArenaTrim {
    /// Held by the one thread that trims this arena ([`UAlloc::trim`](super::UAlloc::trim));
    /// others skip the arena instead of walking its lists again.
    pub(crate) lock: CollectiveMutex,
    /// Events after which a trim may find something to give back: a bin of this arena left
    /// empty, or left carved by a trim (INV(UA17)).
    pub(crate) harvest: HarvestCount,
    /// The heap's runs of large blocks for this SM's lone lanes, one per order of
    /// `RUN_ORDERS` (`tbuddy::run`): a trim gives back what they hold (INV(TB14)). On this
    /// line, which trims and emptied bins touch, because a lone lane's large `malloc` is rare
    /// next to the words of the lines above.
    pub(crate) runs: [BlockRun; RUNS],
}

// The trim line stays one line.
#[cfg(not(loom))]
const _: () = assert!(core::mem::size_of::<ArenaTrim>() <= 128);

#[cfg(not(loom))]
const _: () =
    assert!(core::mem::size_of::<Arena>() == (4 + 2 * NUM_CLASSES + 2 * NUM_KINDS + 1) * 128);

impl Arena {
    /// An empty arena (equal to all-zero memory).
    pub fn new() -> Self {
        Self {
            rcu: Srcu::new(),
            classes: core::array::from_fn(|_| ClassState {
                slots: Line(BulkSemaphore::new(0)),
                list: Line(BinList {
                    head: Atomic64::new(0),
                    lock: CollectiveMutex::new(),
                    pending: PendingStack::new(),
                    home_refill: SingleFlight::new(),
                    run: Run::new(),
                }),
            }),
            kinds: core::array::from_fn(|_| KindState {
                bins: Line(BulkSemaphore::new(0)),
                chunks: Line(ChunkList {
                    partial: Atomic64::new(0),
                    all: Atomic64::new(0),
                    count: Atomic32::new(0),
                    lock: CollectiveMutex::new(),
                    spare: Atomic64::new(0),
                    adoption: SingleFlight::new(),
                    free_bins_hint: Atomic32::new(0),
                }),
            }),
            trim: Line(ArenaTrim {
                lock: CollectiveMutex::new(),
                harvest: HarvestCount::new(),
                runs: core::array::from_fn(|_| BlockRun::new()),
            }),
        }
    }

    #[inline(always)]
    pub(crate) fn class(&self, class: SizeClass) -> &ClassState {
        &self.classes[class.index()]
    }

    #[inline(always)]
    pub(crate) fn kind(&self, kind: BinKind) -> &KindState {
        &self.kinds[kind.index()]
    }

    /// The arena's count of events after which a trim may find something to give back
    /// (INV(UA17)).
    #[inline(always)]
    pub(crate) fn harvest(&self) -> &HarvestCount {
        &self.trim.0.harvest
    }

    /// The run of large blocks of `order` (in `RUN_ORDERS`) for this SM's lone lanes.
    #[inline(always)]
    pub fn run(&self, order: u32) -> &BlockRun {
        &self.trim.0.runs[(order - RUN_ORDERS.start) as usize]
    }

    /// The run of slots of `class` (`ualloc::run`).
    #[inline(always)]
    pub fn slot_run(&self, class: SizeClass) -> &Run {
        &self.class(class).list.0.run
    }

    /// Chunks this arena owns (a snapshot).
    pub fn chunk_count(&self) -> u32 {
        self.kinds
            .iter()
            .map(|k| k.chunks.0.count.load_relaxed())
            .sum()
    }

    /// Chunks of `kind` this arena owns (a snapshot).
    pub fn kind_chunk_count(&self, kind: BinKind) -> u32 {
        self.kind(kind).chunks.0.count.load_relaxed()
    }

    /// The arena's SRCU domain (statistics and tests).
    pub fn rcu(&self) -> &Srcu {
        &self.rcu
    }

    /// `(C, E, R)` of the class's slot semaphore (statistics and tests).
    pub fn slot_counters(&self, class: SizeClass) -> (u32, u32, u32) {
        self.class(class).slots.0.counters()
    }

    /// `(C, E, R)` of the kind's bin semaphore (statistics and tests).
    pub fn bin_counters(&self, kind: BinKind) -> (u32, u32, u32) {
        self.kind(kind).bins.0.counters()
    }
}

impl Default for Arena {
    fn default() -> Self {
        Self::new()
    }
}

impl BinList {
    /// Link `bin` at the head (under `lock`). Readers see it fully initialized: the head store
    /// is a release (pairs with the acquire loads in the readers' walk).
    pub(crate) fn push_locked(&self, bin: &BinHeader) {
        let head = self.chain_locked(bin, self.head.load_relaxed());
        // Release: pairs with the acquire load of `head` in `ListClaimer` (the bin's
        // initialization and `next` happen before a reader reaches it).
        self.head.store_release(head);
    }

    /// Put `bin` in front of the chain that starts at `head` and return the new start (under
    /// `lock`), without publishing it: the caller publishes the chain with one release store
    /// of `self.head`. Started from the list's head, the chain always ends in the list.
    pub(crate) fn chain_locked(&self, bin: &BinHeader, head: u64) -> u64 {
        debug_assert!(self.lock.is_locked() && bin.listed.load_relaxed() == 0);
        let me = bin as *const BinHeader as u64;
        bin.next.store_relaxed(head);
        bin.prev.store_relaxed(0);
        if head != 0 {
            // SAFETY: listed and chained bins are live (INV(UA7)).
            unsafe { bin_at(head) }.prev.store_relaxed(me);
        }
        bin.listed.store_relaxed(1);
        me
    }

    /// Link the chain `head ..= tail` at the head (under `lock`): bins already linked to each
    /// other through `next`/`prev` and marked listed, `head.prev == 0`. Published with one
    /// release store, like [`push_locked`](Self::push_locked).
    pub(crate) fn splice_locked(&self, head: u64, tail: u64) {
        debug_assert!(self.lock.is_locked());
        let old = self.head.load_relaxed();
        // SAFETY: the chain's bins are carved and ours until published; listed bins are live
        // (INV(UA7)).
        unsafe { bin_at(tail) }.next.store_relaxed(old);
        if old != 0 {
            // SAFETY: as above.
            unsafe { bin_at(old) }.prev.store_relaxed(tail);
        }
        // Release: pairs with the acquire load of `head` in `ListClaimer` (the chain's bins,
        // their initialization and links happen before a reader reaches them).
        self.head.store_release(head);
    }

    /// Unlink `bin` (under `lock`). `bin.next` is kept, so a reader standing on `bin` walks on
    /// into the list.
    pub(crate) fn unlink_locked(&self, bin: &BinHeader) {
        debug_assert!(self.lock.is_locked() && bin.listed.load_relaxed() == 1);
        let next = bin.next.load_relaxed();
        let prev = bin.prev.load_relaxed();
        if prev == 0 {
            // Release: readers that load the new head see the rest of the list as linked.
            self.head.store_release(next);
        } else {
            // SAFETY: listed bins are live (INV(UA7)).
            unsafe { bin_at(prev) }.next.store_release(next);
        }
        if next != 0 {
            // SAFETY: as above.
            unsafe { bin_at(next) }.prev.store_relaxed(prev);
        }
        bin.listed.store_relaxed(0);
    }
}

impl ChunkList {
    /// Put `chunk` at the head of the partial list (under `lock`).
    pub(crate) fn push_partial_locked(&self, chunk: &ChunkHeader) {
        debug_assert!(chunk.listed.load_relaxed() == 0);
        let me = chunk.base() as u64;
        let head = self.partial.load_relaxed();
        chunk.next.store_relaxed(head);
        chunk.prev.store_relaxed(0);
        if head != 0 {
            // SAFETY: listed chunks are live.
            unsafe { chunk_at(head) }.prev.store_relaxed(me);
        }
        chunk.listed.store_relaxed(1);
        self.partial.store_relaxed(me);
    }

    /// Take `chunk` off the partial list (under `lock`).
    pub(crate) fn unlink_partial_locked(&self, chunk: &ChunkHeader) {
        debug_assert!(chunk.listed.load_relaxed() == 1);
        let (next, prev) = (chunk.next.load_relaxed(), chunk.prev.load_relaxed());
        if prev == 0 {
            self.partial.store_relaxed(next);
        } else {
            // SAFETY: listed chunks are live.
            unsafe { chunk_at(prev) }.next.store_relaxed(next);
        }
        if next != 0 {
            // SAFETY: as above.
            unsafe { chunk_at(next) }.prev.store_relaxed(prev);
        }
        chunk.listed.store_relaxed(0);
    }

    /// Take `chunk`, all of whose bins are free and whose bins' units the caller took back,
    /// off both lists and out of UAlloc (under `lock`); the caller then queues its return to
    /// the source behind a grace period.
    pub(crate) fn unlist_locked(&self, chunk: &ChunkHeader) {
        self.unlink_partial_locked(chunk);
        self.unlink_all_locked(chunk);
        // INV(UA8): no longer UAlloc's. Relaxed: the grace period orders it before the chunk
        // goes back (the release in `call_rcu` publishes it to the owner).
        chunk.magic.store_relaxed(0);
    }

    /// Add `chunk` to the list of all chunks (under `lock`).
    pub(crate) fn push_all_locked(&self, chunk: &ChunkHeader) {
        let me = chunk.base() as u64;
        let head = self.all.load_relaxed();
        chunk.all_next.store_relaxed(head);
        chunk.all_prev.store_relaxed(0);
        if head != 0 {
            // SAFETY: chunks on `all` are live.
            unsafe { chunk_at(head) }.all_prev.store_relaxed(me);
        }
        self.all.store_relaxed(me);
        self.count.fetch_add_relaxed(1);
    }

    /// Remove `chunk` from the list of all chunks (under `lock`).
    pub(crate) fn unlink_all_locked(&self, chunk: &ChunkHeader) {
        let (next, prev) = (chunk.all_next.load_relaxed(), chunk.all_prev.load_relaxed());
        if prev == 0 {
            self.all.store_relaxed(next);
        } else {
            // SAFETY: chunks on `all` are live.
            unsafe { chunk_at(prev) }.all_next.store_relaxed(next);
        }
        if next != 0 {
            // SAFETY: as above.
            unsafe { chunk_at(next) }.all_prev.store_relaxed(prev);
        }
        self.count.fetch_sub_relaxed(1);
    }
}

/// Reconcile `bin`'s list membership with its `used` word under the class list's mutex:
/// listed iff carved, not retired and not full (INV(UA7) at the moment of the call). Waits for
/// the mutex: a claim that fills a bin, a new bin, a retirement, and a bin in another arena's
/// chunk that gets a free slot. `free` does not call it (`note_not_full`). Idempotent, so
/// racing transitions settle on the last one.
#[cold]
#[inline(never)]
pub(crate) fn sync_listing(arena: &Arena, class: SizeClass, bin: &BinHeader) {
    let list = &arena.class(class).list.0;
    list.lock.lock_single();
    reconcile_locked(list, class, bin);
    list.lock.unlock();
}

/// [`sync_listing`] for a claimer inside its read section. In a class of small bins (16 B –
/// 128 B) it does not wait for the mutex: if another thread holds it, the bin is noted on the
/// list's pending stack instead (INV(UA13)), for the next drain to reconcile; a claimer that
/// got the mutex drains the stack after it unlocks (one hold per batch, as a walker's drain).
/// A full bin stays listed until then: walkers pass it as they pass a bin that filled after
/// they read its link. At 2^18 threads × 64 rounds of malloc and free of 16–256 B, claimers
/// that filled bins queued for the mutex one by one; without the wait the churn was 36% faster
/// (H200). Large bins (256 B – 4 KB) wait for the mutex as before: a fresh fill of mixed 16 B –
/// 4 KB was 3–9% slower when they did not.
#[cold]
#[inline(never)]
pub(crate) fn resync_listing(arena: &Arena, class: SizeClass, bin: &BinHeader) {
    if class.kind() == BinKind::Large {
        sync_listing(arena, class, bin);
        return;
    }
    let list = &arena.class(class).list.0;
    if !list.lock.try_acquire(1) {
        list.pending.note(bin);
        return;
    }
    reconcile_locked(list, class, bin);
    list.lock.unlock();
    drain_pending(arena, class);
}

/// List `bin` iff it has a free slot and is not retired (INV(UA7)), under the list's mutex.
#[inline(always)]
fn reconcile_locked(list: &BinList, class: SizeClass, bin: &BinHeader) {
    // Relaxed: the mutex orders this load after the transition of every earlier caller, and
    // our own transition is before it in program order. Retired counts as full.
    let want = bin.used_count() < class.slots();
    let listed = bin.listed.load_relaxed() != 0;
    if want && !listed {
        list.push_locked(bin);
    } else if !want && listed {
        list.unlink_locked(bin);
    }
}

/// After a crossing of "full" downwards: `bin` (of `class`, carved by `arena`; the caller is
/// inside `arena`'s read section) has a free slot again and may be unlisted. INV(UA7): it must
/// be listed before a walker needs its slots, but `free` does not wait for the list's mutex:
/// it notes the bin on the list's pending stack (one `fetch_add`, and one `swap` for the first
/// crossing), which the next walker that finds nothing, or `trim`, drains ([`drain_pending`]).
#[inline(always)]
pub(crate) fn note_not_full(arena: &Arena, class: SizeClass, bin: &BinHeader) {
    arena.class(class).list.0.pending.note(bin);
}

/// Link the bins noted on `class`'s pending stack in `arena` that have free slots (INV(UA7)).
/// Returns whether there were any.
///
/// Per batch: one hold of the list's mutex (claimers that fill a bin get in between batches),
/// the bins to link chained in front of the list head and published with ONE release store,
/// and a noted bin that is listed but full again (rare) unlinked after that.
#[cold]
#[inline(never)]
pub(crate) fn drain_pending(arena: &Arena, class: SizeClass) -> bool {
    let list = &arena.class(class).list.0;
    if list.pending.is_empty_hint() {
        return false;
    }
    let taken = list.pending.drain(|bins| {
        list.lock.lock_single();
        let first = list.head.load_relaxed();
        let mut head = first;
        let mut full = 0u64;
        for (i, &at) in bins.iter().enumerate() {
            // SAFETY: pinned by the drain (INV(UA13)).
            let bin = unsafe { bin_at(at) };
            // Relaxed: the drain's fence orders these loads after the crossings it settles,
            // and the mutex after every other listing change.
            let want = bin.used_count() < class.slots();
            let listed = bin.listed.load_relaxed() != 0;
            if want && !listed {
                head = list.chain_locked(bin, head);
            } else if !want && listed {
                full |= 1 << i;
            }
        }
        if head != first {
            // Release: pairs with the acquire load of `head` in `ListClaimer` (the chained bins
            // and their links are visible to a reader that sees the new head).
            list.head.store_release(head);
        }
        while full != 0 {
            // SAFETY: as above.
            list.unlink_locked(unsafe { bin_at(bins[full.trailing_zeros() as usize]) });
            full &= full - 1;
        }
        list.lock.unlock();
    });
    taken > 0
}

/// The leader's part of a group free: clear `bits` (slots of `word` of `bin`, some of which
/// may already be free) and account for those that were taken. Returns the old bitmap word
/// (a lane's slot was freed by this call iff its bit is set in it) and whether the release
/// left the bin with no slot taken. Called inside a read section of `arena`; the caller then
/// gives the freed slots' units back with [`give_units`] after it left the section (so the
/// section's closing fence does not wait for that add).
pub(crate) fn release_bits(
    arena: &Arena,
    class: SizeClass,
    bin: &BinHeader,
    word: u32,
    bits: u64,
) -> (u64, bool) {
    // Fenced: inside a read section entered after the blocks' last writes (its entry's fence
    // makes this `fetch_and` a release of them; rcu.rs).
    let r = bin.release_many_fenced(class, word, bits);
    if r.was_full {
        // INV(UA7): a bin that was full (and may be unlisted) gets listed, lazily, before a
        // walker needs the units released below: no mutex here (alloc.rs).
        note_not_full(arena, class, bin);
    }
    (r.old, r.left == 0 && r.old & bits != 0)
}

/// Give the units of the slots of `bits` that `old` (from [`release_bits`]) shows taken back
/// to the class's semaphore, and count a bin the release left `emptied` for the trims
/// (INV(UA17)). Outside the read section, after its closing fence: until the units are back,
/// a trim cannot take the bin's units and so does not retire it; and the fence makes the
/// count a release of the emptying.
pub(crate) fn give_units(arena: &Arena, class: SizeClass, old: u64, bits: u64, emptied: bool) {
    let n = (old & bits).count_ones();
    if n > 0 {
        // Relaxed: the bits were published by the release `fetch_and`; a claimer that takes
        // these units acquires them with its `fetch_or` (INV(UA2) holds: the bin is listed).
        arena.class(class).slots.0.release_relaxed(n);
    }
    if emptied {
        arena.harvest().note_fenced();
    }
}
