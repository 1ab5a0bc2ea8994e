//! The slow paths: a new bin for a class (`alloc_slow`), bins from the arena's chunks
//! (`take_bins`, collective), new chunks (`adopt_chunk`), and the way back (`return_bin`).

use crate::bulk_semaphore::{Fields, PerSm, Wait};
use crate::collective::Group;
use crate::platform::{self, Backoff};
use crate::size_class::{BinKind, NUM_CLASSES, SizeClass};
use crate::ualloc::arena::{Arena, ChunkList, KindState, drain_pending, sync_listing};
use crate::ualloc::bin::{BinHeader, bin_at};
use crate::ualloc::chunk::{ChunkHeader, bin_offset, bins_per_chunk, chunk_at, chunk_base};
use crate::ualloc::layout::{CHUNK_SIZE, LARGE_BINS, MAX_SOURCE_BYTES, SMALL_BINS};
use crate::ualloc::{ChunkSource, KIND_GROUP_TAG, UAlloc};

/// How often a refill that found no chunk runs [`UAlloc::trim`] and tries again before it
/// reports out of memory. It always tries again after the first trim (another thread's trim
/// may have just given this arena its bins back, leaving nothing for ours to find), and after
/// later ones only while they still find something to give back.
pub(crate) const OOM_RETRIES: u32 = 4;

/// The `rank`-th free bin on the partial list, in list order (under the list's mutex).
/// INV(UA9): the caller holds `rank + 1` or more units of the bins semaphore, so it exists.
pub(crate) fn nth_free_bin(list: &ChunkList, mut rank: u32) -> (&ChunkHeader, usize) {
    let mut at = list.partial.load_relaxed();
    loop {
        assert!(at != 0, "INV(UA9): fewer free bins than semaphore units");
        // SAFETY: chunks on the partial list are live (INV(UA10)).
        let chunk = unsafe { chunk_at(at) };
        let n = chunk.n_free.load_relaxed();
        if rank < n {
            let bin = chunk
                .nth_free_bin(rank)
                .expect("INV(UA9): n_free matches free_bins");
            return (chunk, bin);
        }
        rank -= n;
        at = chunk.next.load_relaxed();
    }
}

/// What [`UAlloc::adopt_chunk`] returns to a caller that waited for another thread's adoption
/// of the same kind (never a chunk address: those are `CHUNK_SIZE`-aligned).
pub(crate) const JOINED: u64 = 1;

/// How many adoptions of others a refill waits for, each followed by a look at every arena's
/// free bins, before it counts a miss as running out. Each one that succeeded took a chunk from
/// the source, so the bound only stops a refill that others outrun thousands of times; a
/// small one made refills of many SMs that lost the race answer null with memory left.
const MAX_JOINS: u32 = 4096;

/// Chunks per arena the source must still hold for a refill to carve several bins at once
/// ([`SizeClass::refill_bins`]); below it a refill carves one (a small or nearly full heap).
pub(crate) const PLENTY_CHUNKS_PER_ARENA: usize = 4;

/// Chunks per arena the source must still hold for an adoption to take two chunks in one trip
/// (`ChunkSource::alloc_chunk_run`) and keep the second as the arena's spare: twice the
/// bound below which chunks are scarce, so that spares never hold the last of them.
pub(crate) const PAIR_CHUNKS_PER_ARENA: usize = 8;

/// Chunks per arena the source must still hold for an adoption to take four chunks in one trip
/// (the second the arena's spare, the other two adopted at once), which it does only while at
/// most a quarter of the source's chunks are out. Four per trip at any fill made a fresh
/// 2^20 × 4 KB malloc 12% and mixed 16 B – 4 KB 16% faster, and divergent warps of 1–8192 B,
/// which share an 8 GiB heap with TBuddy's large blocks, 72% slower (H100, not profiled);
/// with the quarter bound, 14% and 12% faster and the divergent warps unchanged
/// (docs/benchmarks.md).
pub(crate) const QUAD_CHUNKS_PER_ARENA: usize = 16;

/// Chunks per arena a fixed heap may hold at most for a refill's promise on the bins semaphore
/// to cover every chunk of its adoption's trip (`take_bins`, `UAlloc::adopt_chunk`): 64, a
/// heap below about 4.2 GiB on an H100. In bigger heaps each refill that comes meanwhile takes
/// a trip of its own: 2^16 threads asking 1 KB each held 1.4 GiB of chunks for their 64 MiB,
/// which such a heap absorbs within the quarter that trips of four chunks may use.
const RUN_SHARED_BELOW_CHUNKS_PER_ARENA: usize = 64;

/// The most slots a refill of an arena promises ([`UAlloc::refill_batch`]): a 1 KB refill's
/// five bins. A waiter's conversion of its reservation into a promise adds `batch - n` to E
/// for a moment, and every thread of an SM may do so at once: 2,048 + 510 + 2,048 × 509 is
/// below E's 2^20 (INV(SEM2), asserted in `arena.rs`). A 256 B refill's five bins hold 2,040.
pub(crate) const MAX_REFILL_BATCH: u32 = 510;

// INV(SEM2) for the arena semaphores (layout `PerSm`). C: a class's free slots in one arena
// are at most the slots of the largest heap with every chunk carved into that class's bins,
// and a kind's free bins at most its bins. E: a batch is one bin's slots (or one chunk's
// bins), or a refill's promise of at most `MAX_REFILL_BATCH` slots, and every thread of an
// SM may wait at once (2,048 on sm_70–sm_90).
const _: () = {
    let chunks = MAX_SOURCE_BYTES / CHUNK_SIZE as u64;
    let max_c = Fields::<PerSm>::MAX_AVAILABLE as u64;
    let mut i = 0;
    let mut batch = SMALL_BINS as u64;
    if (MAX_REFILL_BATCH as u64) > batch {
        batch = MAX_REFILL_BATCH as u64;
    }
    while i < NUM_CLASSES {
        let slots = SizeClass::ALL[i].slots() as u64;
        let bins = match SizeClass::ALL[i].kind() {
            BinKind::Small => SMALL_BINS,
            BinKind::Large => LARGE_BINS,
        } as u64;
        assert!(
            chunks * bins * slots <= max_c,
            "an arena's free slots overflow C"
        );
        if slots > batch {
            batch = slots;
        }
        i += 1;
    }
    assert!(chunks * SMALL_BINS as u64 <= max_c);
    const THREADS_PER_SM: u64 = 2048;
    assert!(THREADS_PER_SM <= Fields::<PerSm>::MAX_RESERVED as u64);
    assert!(
        THREADS_PER_SM + batch + THREADS_PER_SM * (batch - 1)
            <= Fields::<PerSm>::MAX_EXPECTED as u64
    );
};

/// Steps a trim takes along one bin list before it stops (a list that bins keep rejoining
/// under it could otherwise be walked forever); far more bins than an arena's class holds.
const TRIM_SCAN_LIMIT: u32 = 1 << 20;

/// Retire every empty bin on `class`'s list in `arena`: take its slots' units back from the
/// semaphore, mark it retired (`used` 0 → RETIRED, INV(UA4)), unlink it and queue its return
/// to the chunk. One attempt per bin, never a wait: a bin whose units are out with waiters
/// that have not claimed yet is left for the next trim. Returns the bins retired; their
/// returns run after the arena's next grace period.
fn retire_empty_bins(arena: &Arena, class: SizeClass) -> u32 {
    let list = &arena.class(class).list.0;
    let slots = &arena.class(class).slots.0;
    let reader = arena.rcu.read_lock();
    // Acquire: pairs with the release in `BinList::push_locked`/`unlink_locked`.
    let mut at = list.head.load_acquire();
    let (mut steps, mut retired) = (0, 0);
    while at != 0 && steps < TRIM_SCAN_LIMIT {
        steps += 1;
        // SAFETY: INV(UA7)/INV(RCU1): reached from the list inside the read section.
        let bin = unsafe { bin_at(at) };
        // Acquire: pairs with the release stores that linked the next bin. An unlinked bin
        // keeps its `next`, so the walk goes on after a retirement.
        at = bin.next.load_acquire();
        if bin.used_word() != 0 {
            continue;
        }
        if !slots.try_wait(class.slots()) {
            // Empty, but some of its units are out (with a waiter about to claim, or in a
            // deduction given back at once, INV(SEM3)): left for the next trim, which a refill
            // must then not skip (INV(UA17)).
            arena.harvest().note();
            continue;
        }
        if bin.try_retire() {
            // INV(UA7): RETIRED → unlinked.
            sync_listing(arena, class, bin);
            // SAFETY: INV(UA4): retired and unlinked; the header stays valid until the
            // callback returns the bin to its chunk, and a bin is retired once per carving.
            unsafe { arena.rcu.call_rcu(&bin.rcu) };
            retired += 1;
        } else {
            slots.release(class.slots());
        }
    }
    drop(reader);
    retired
}

/// Queue the return of every chunk of `arena` whose bins are all free (INV(UA11)): a chunk
/// adopted with none of its bins taken that never had one carved (`adopt_extra`), or one whose
/// last bin's return found the bins' units out with waiters. Per chunk, the bins' units are
/// taken back first with one attempt, never a wait (units out with a waiter leave the chunk
/// for the next trim), then the chunk leaves both lists and loses its magic under the list's
/// mutex, as in `return_bin`; the caller's barrier gives it to the source after the grace
/// period. Returns the chunks queued.
fn return_empty_chunks(arena: &Arena) -> u32 {
    let mut queued = 0;
    for kind in BinKind::ALL {
        let ks = arena.kind(kind);
        let per = bins_per_chunk(kind);
        let list = &ks.chunks.0;
        list.lock.lock_single();
        let mut at = list.partial.load_relaxed();
        while at != 0 {
            // SAFETY: chunks on the partial list are live (INV(UA10)).
            let chunk = unsafe { chunk_at(at) };
            at = chunk.next.load_relaxed();
            if chunk.n_free.load_relaxed() != per || !ks.bins.0.try_wait(per) {
                continue;
            }
            list.unlist_locked(chunk);
            // SAFETY: off every list; its header stays valid until the callback frees it;
            // queued once.
            unsafe { arena.rcu.call_rcu(&chunk.rcu) };
            queued += 1;
        }
        list.lock.unlock();
    }
    queued
}

impl<S: ChunkSource> UAlloc<'_, S> {
    /// Slots an arena's refill of `class` promises to the waiters of its slots semaphore (the
    /// `batch` of their `wait`). One bin's, so that an SM's warps that miss together refill
    /// side by side, each carving [`SizeClass::refill_bins`] bins. But for a large class (256 B
    /// – 4 KB, whose refill takes two bins or a whole chunk's five) in a fixed heap below
    /// `RUN_SHARED_BELOW_CHUNKS_PER_ARENA` chunks per arena, once the source holds fewer than
    /// [`PAIR_CHUNKS_PER_ARENA`] per arena (and until they are scarce, when a refill carves one
    /// bin): all the slots of those bins, at most [`MAX_REFILL_BATCH`], so one refill per
    /// arena and class at a time.
    /// - With one bin's promise, a refill of 1 KB took a chunk's five bins but covered two of
    ///   an SM's sixteen warps, and the others each adopted a chunk of their own: 2^16 threads
    ///   asking 1 KB in a 512 MiB heap held 384 MiB of chunks for their 64 MiB, and 2^18 ran the
    ///   heap out of chunks and took 23 ms instead of 1.9 (H100).
    /// - From the quad bound (16 per arena) on, 2^20 threads asking 1 KB in a 2 GiB heap took
    ///   5% longer, and for the small classes too, 2^18 × 16 B in 512 MiB 8% longer: a small
    ///   chunk's 124 bins serve many refills, so theirs side by side adopt few chunks.
    #[inline(always)]
    pub(crate) fn refill_batch(&self, class: SizeClass) -> u32 {
        let arenas = self.arenas.len();
        if class.kind() == BinKind::Large
            && self.source.chunks_at_most() < arenas * RUN_SHARED_BELOW_CHUNKS_PER_ARENA
        {
            let left = self.source.chunks_left();
            if left < arenas * PAIR_CHUNKS_PER_ARENA && !self.scarce_with(left) {
                return (class.refill_bins() * class.slots())
                    .min(MAX_REFILL_BATCH)
                    .max(class.slots());
            }
        }
        class.slots()
    }

    /// The slow path of malloc (`alloc_slow`): after `MustRefill` on the class's slots
    /// semaphore, carve new bins (the first with its first `k` slots taken), list them, and
    /// signal the rest (or retract the promise when out of memory, INV(SEM4)). Returns the
    /// first bin's address.
    ///
    /// `promised` is what the caller's `wait` promised on `owner`'s slots ([`refill_batch`]
    /// less the group's `k`), settled here with `signal` or `retract`.
    ///
    /// [`refill_batch`]: Self::refill_batch
    ///
    /// While the source has chunks to spare ([`PLENTY_CHUNKS_PER_ARENA`]) a refill carves
    /// [`SizeClass::refill_bins`] bins at once, and signals all their slots against what its
    /// `wait` promised (INV(SEM4): a refill may make more or fewer units than it promised). A
    /// fresh heap then pays the two list mutexes once per several bins. Otherwise it carves
    /// one, so that no arena holds bins it does not need when memory is short, except for a
    /// class's home, which every SM takes from then: [`SizeClass::home_refill_bins`].
    ///
    /// The bins are carved for arena `owner` (its list, its slots semaphore, which holds the
    /// promise); they come from the chunks of arena `ai`, the caller's, or elsewhere. `owner`
    /// is `ai` except for a refill on behalf of a class's home (INV(UA16)).
    #[cold]
    #[inline(never)]
    pub(crate) fn alloc_slow(
        &self,
        ai: usize,
        owner: usize,
        class: SizeClass,
        k: u32,
        promised: u32,
    ) -> Option<u64> {
        let slots = &self.arenas[owner].class(class).slots.0;
        let mut retries = 0;
        let kind = class.kind();
        let chunks_left = self.source.chunks_left();
        let scarce = self.scarce_with(chunks_left);
        // While chunks are scarce, one bin for an arena of its own, and a crowd's worth for a
        // class's home, which every SM takes from (INV(UA16)) if the class shares it.
        let want = if !scarce {
            class.refill_bins()
        } else if owner == self.home(class.index()) && self.shares_home(class) {
            class.home_refill_bins()
        } else {
            1
        };
        // Where fresh bins come from, in order: this arena's chunks; while chunks are scarce
        // (a small heap, or one nearly full), any arena's free bins before a new chunk, so
        // that a few SMs do not hold every chunk while the others have none, and one new chunk
        // of a kind at a time (INV(UA16)); the source; other arenas' chunks; and after a trim,
        // all again.
        let mut taken = if scarce {
            self.take_free_bins(ai, kind, want, true)
        } else {
            (0, 0)
        };
        let mut joined = 0;
        // The harvest epoch read before our last trim (INV(UA17)).
        let mut trimmed_at = None;
        while taken.1 == 0 {
            taken = self.take_bins(ai, kind, want, false);
            if taken.1 > 0 {
                break;
            }
            // Fewer than `want` free bins of our own and no chunk to adopt: free bins in any
            // arena's chunks (steal.rs), our own first, come before a trim, which walks every
            // arena and waits for grace periods. Ours: what a trim gave back, or the chunk of
            // an adoption we joined (`JOINED`), may hold fewer bins than `want`.
            let joined_now = taken.0 == JOINED;
            taken = self.take_free_bins(ai, kind, want, false);
            if taken.1 > 0 {
                break;
            }
            if joined_now && joined < MAX_JOINS {
                // Another thread adopted a chunk of this kind just now, and others took its
                // bins first: that is no sign of running out.
                joined += 1;
                continue;
            }
            // Out of chunks. Empty bins of other classes, and bins and chunks on their way
            // back, may be what is missing: give them back and try again before failing.
            // Unless a trim has found nothing to help since the last event that could give it
            // something (INV(UA17)): then ours would find nothing either.
            let mut progress = false;
            if retries < OOM_RETRIES {
                let (epoch, futile) = self.harvest_epoch();
                if futile {
                    slots.retract(promised);
                    return None;
                }
                trimmed_at = Some(epoch);
                progress = self.trim() > 0;
            }
            if !progress && retries > 0 || retries == OOM_RETRIES {
                if let (Some(gate), Some(epoch)) = (self.trim_gate, trimmed_at) {
                    gate.record(epoch);
                }
                slots.retract(promised);
                return None;
            }
            retries += 1;
        }
        let (first, count) = taken;
        self.carve_listed(owner, class, first, count, k);
        let made = count * class.slots() - k;
        // INV(UA2): the bins are listed before their units are. INV(SEM4): `made` may be more
        // or less than the promise (a refill that found chunks scarce carves one bin).
        slots.signal(made, promised);
        Some(first)
    }

    /// Carve the `count` bins chained from `first` (through `next`; ours alone, fresh from
    /// the chunks) for arena `owner` and `class`, the first with its first `k` slots taken,
    /// and list them, all but a full first one, with one splice. The caller then signals
    /// their units (INV(UA2): listed first).
    pub(crate) fn carve_listed(
        &self,
        owner: usize,
        class: SizeClass,
        first: u64,
        count: u32,
        k: u32,
    ) {
        // Carve them (INV(UA12): the owner's, wherever their chunks are; the first keeps the
        // group's `k` slots), and chain those to list, all but a full first one, through their
        // links (INV(UA7)): stores only, so the list's mutex is held for one splice. The bins
        // are ours alone until the splice publishes them; only a chain of several costs loads.
        let (mut head, mut tail) = (0, 0);
        let mut at = first;
        for i in 0..count {
            // SAFETY: `take_bins`/`take_free_bins` handed us these bins of live chunks,
            // exclusively.
            let bin = unsafe { bin_at(at) };
            let next = if i + 1 < count {
                bin.next.load_relaxed()
            } else {
                0
            };
            let claimed = if i == 0 { k } else { 0 };
            bin.prepare_for(owner as u32, class, claimed);
            if claimed < class.slots() {
                // Appended, so that the first bin, which has the fewest free slots, is the
                // head and fills first.
                if tail == 0 {
                    head = at;
                } else {
                    // SAFETY: as above.
                    unsafe { bin_at(tail) }.next.store_relaxed(at);
                    bin.prev.store_relaxed(tail);
                }
                bin.listed.store_relaxed(1);
                tail = at;
            }
            at = next;
        }
        // One release for every bin's words, then each bin's class (`BinHeader::init_for`,
        // split): a fence per bin made each bin of a refill cost about 1.6 µs while warps
        // waited for it (H100, 16 or 64 bins per refill for a class's home).
        platform::fence_acq_rel();
        // SAFETY: as above.
        unsafe { bin_at(first) }.publish_class(class);
        let mut at = head;
        while at != 0 {
            // SAFETY: as above.
            let bin = unsafe { bin_at(at) };
            if at != first {
                bin.publish_class(class);
            }
            at = if at == tail {
                0
            } else {
                bin.next.load_relaxed()
            };
        }
        if head != 0 {
            let list = &self.arenas[owner].class(class).list.0;
            list.lock.lock_single();
            list.splice_locked(head, tail);
            list.lock.unlock();
        }
    }

    /// Give back what UAlloc holds but does not use: every empty bin of every arena goes back
    /// to its chunk, and every chunk left with no carved bin goes back to the source, each
    /// after its grace period (INV(UA4), INV(UA11)). Returns the bins retired plus the arenas
    /// whose deferred returns it ran. Safe alongside `malloc` and `free` (a bin claimed
    /// meanwhile is kept). `malloc` runs it before it reports out of memory; the host runs it
    /// through `toga_trim`. Must not be called inside a read section.
    ///
    /// With a trim gate ([`with_trim_gate`](Self::with_trim_gate)), one trim walks the arenas
    /// at a time: a caller that comes while one runs waits for it to end and returns what it
    /// found (INV(SF1)). Before that, every caller does its share of what the source gives back
    /// side by side (`ChunkSource::reclaim_shared`).
    #[cold]
    #[inline(never)]
    pub fn trim(&self) -> u32 {
        let shared = self.source.reclaim_shared();
        shared
            + match self.trim_gate {
                Some(gate) => gate.run.run_or_join(|| self.trim_arenas()),
                None => self.trim_arenas(),
            }
    }

    /// The harvest epoch (INV(UA17)), and whether a trim is futile in it (`TrimGate::epoch`).
    /// Without a trim gate, never.
    #[cold]
    #[inline(never)]
    fn harvest_epoch(&self) -> (u64, bool) {
        match self.trim_gate {
            Some(gate) => gate.epoch(self.arenas.iter().map(|a| a.harvest())),
            None => (0, false),
        }
    }

    /// [`trim`](Self::trim)'s walk. An arena another thread is trimming is waited for, not
    /// walked again.
    fn trim_arenas(&self) -> u32 {
        let mut done = self.source.reclaim();
        for (ai, arena) in self.arenas.iter().enumerate() {
            if !arena.trim.0.lock.try_acquire(1) {
                // Another thread is trimming this arena: wait for it (its returns are what a
                // caller out of memory is waiting for) and count that as progress.
                arena.trim.0.lock.lock_single();
                arena.trim.0.lock.unlock();
                done += 1;
                continue;
            }
            // The runs' slots first (INV(UA18)): their bins are listed or emptied below.
            done += self.flush_slot_runs(ai);
            for class in SizeClass::ALL {
                // Bins that emptied while unlisted are listed first, so they are retired too.
                drain_pending(arena, class);
                done += retire_empty_bins(arena, class);
            }
            done += return_empty_chunks(arena);
            if !arena.rcu.is_idle() {
                arena.rcu.barrier(|head| self.run_callback(head));
                done += 1;
            }
            arena.trim.0.lock.unlock();
        }
        // Spares that no arena adopted are memory nobody uses (INV(UA14)).
        done += self.give_back_spares();
        // A bin carved for one arena in another arena's chunk (INV(UA12)) that went back
        // above may have emptied its chunk, whose return is queued in the chunk's arena,
        // which the loop may have passed already. Chunk returns queue nothing more.
        for arena in self.arenas {
            if !arena.rcu.is_idle() && arena.trim.0.lock.try_acquire(1) {
                arena.rcu.barrier(|head| self.run_callback(head));
                arena.trim.0.lock.unlock();
                done += 1;
            }
        }
        done
    }

    /// `want` fresh bins of `kind` for each lane that calls this now: `(first, want)`, the
    /// others chained after the first through `next` in the order taken; `(0, 0)` when the
    /// arena has none and the source is out of memory. Collective over those lanes, grouped by
    /// arena, kind, `want` and `side_by_side` (collective.rs rules: straight-line code, the
    /// branches below depend on broadcast values only). The group takes its bins' units of the
    /// bins semaphore with one `wait`, enters the chunk list with one lock, each member takes
    /// the free bins at its ranks, and the last member splits the exhausted chunks off the
    /// list.
    ///
    /// `side_by_side` (a run of slots, `ualloc::run`): each lane is a group of its own, and
    /// its bins are neighbours in one chunk, `first` and the bins after it at the bin stride;
    /// it may get fewer than `want` (at least one), and the units of the free bins it did not
    /// take go back to the bins semaphore.
    #[cold]
    #[inline(never)]
    pub(crate) fn take_bins(
        &self,
        ai: usize,
        kind: BinKind,
        want: u32,
        side_by_side: bool,
    ) -> (u64, u32) {
        let ks = self.arenas[ai].kind(kind);
        let per = bins_per_chunk(kind);
        debug_assert!(want >= 1 && want <= per);
        // Lanes that reached malloc apart (each a group of its own) can meet here, up to a
        // whole warp. Cut the group so that it waits for at most one chunk's worth (a batch
        // smaller than the request would underflow E, INV(SEM4)).
        let key = KIND_GROUP_TAG
            | (side_by_side as u64) << 48
            | (want as u64) << 32
            | (ai as u64) << 8
            | kind.index() as u64;
        let group = Group::of(key).split(if side_by_side { 1 } else { per / want });
        let k = group.size() * want;
        let first = group.rank() * want;
        // The batch is what an adoption would bring (`adoption_log2`): with several chunks
        // per trip to the source, its promise covers the arena's other refills that come
        // meanwhile, which wait for it instead of each taking chunks of their own. Not in a
        // heap that holds `RUN_SHARED_BELOW_CHUNKS_PER_ARENA` chunks per arena or more: there
        // the refills' trips side by side cost little memory and the wait made fresh
        // mallocs of 1 KB and 4 KB 9-11% slower (H100, 8 GiB heap).
        let mut batch = per;
        let acquired = if group.is_leader() {
            if self.source.chunks_at_most() < self.arenas.len() * RUN_SHARED_BELOW_CHUNKS_PER_ARENA
            {
                batch = per << self.adoption_log2(self.source.chunks_left());
            }
            (ks.bins.0.wait(k, batch) == Wait::Acquired) as u32
        } else {
            0
        };
        if group.broadcast_u32(acquired) == 0 {
            let chunk = if group.is_leader() {
                self.adopt_chunk(ai, kind, k, batch - k)
            } else {
                0
            };
            let chunk = group.broadcast_u64(chunk);
            if chunk == 0 || chunk == JOINED {
                return (chunk, 0);
            }
            let bin = |index: u32| chunk + bin_offset(kind, index as usize) as u64;
            for index in first + 1..first + want {
                // SAFETY: bins of the chunk we adopted, ours alone.
                unsafe { bin_at(bin(index - 1)) }
                    .next
                    .store_relaxed(bin(index));
            }
            return (bin(first), want);
        }
        let list = &ks.chunks.0;
        list.lock.lock(&group);
        // Phase 1, read-only: find this member's first bin.
        let (mut chunk, mut index) = nth_free_bin(list, first);
        group.sync();
        // Phase 2: take it and the free bins after it in list order, `want` in all. Members
        // take disjoint runs: the bins before `first` are the lower ranks', and this member
        // stops before the next rank's run begins.
        // Free bins side by side go with one atomic per bitmap word (`take_neighbours`): a bin
        // at a time was two dependent round trips to memory per bin.
        let head = (chunk.base() + bin_offset(kind, index)) as u64;
        let mut last = head;
        let mut taken = 0;
        loop {
            let n = chunk.take_neighbours(index, want - taken);
            for j in 0..n as usize {
                let addr = (chunk.base() + bin_offset(kind, index + j)) as u64;
                if addr != head {
                    // SAFETY: bins we took, ours alone.
                    unsafe { bin_at(last) }.next.store_relaxed(addr);
                    last = addr;
                }
            }
            taken += n;
            if taken == want || side_by_side {
                // `side_by_side`: a lone member (no rank after ours), so the free bins it
                // leaves are nobody's.
                break;
            }
            // INV(UA9): the units we hold are free bins on the partial list, after these.
            let mut next = chunk.next_free_bin(index + n as usize);
            while next.is_none() {
                let at = chunk.next.load_relaxed();
                assert!(at != 0, "INV(UA9): fewer free bins than semaphore units");
                // SAFETY: chunks on the partial list are live (INV(UA10)).
                chunk = unsafe { chunk_at(at) };
                next = chunk.next_free_bin(0);
            }
            index = next.unwrap_or_default();
        }
        group.sync();
        // Phase 3: the highest rank took the last bin in list order; every chunk before its
        // own is now full: split them off (INV(UA10)).
        if group.rank() == group.size() - 1 {
            let stop = if chunk.n_free.load_relaxed() == 0 {
                chunk.next.load_relaxed()
            } else {
                chunk.base() as u64
            };
            let mut at = list.partial.load_relaxed();
            while at != stop {
                // SAFETY: chunks on the partial list are live.
                let full = unsafe { chunk_at(at) };
                debug_assert_eq!(full.n_free.load_relaxed(), 0);
                full.listed.store_relaxed(0);
                at = full.next.load_relaxed();
            }
            list.partial.store_relaxed(stop);
            if stop != 0 {
                // SAFETY: as above.
                unsafe { chunk_at(stop) }.prev.store_relaxed(0);
            }
        }
        list.lock.unlock();
        if taken < want {
            // INV(UA9): the bins we did not take are still free on the partial list.
            ks.bins.0.release(want - taken);
        }
        (head, taken)
    }

    /// How many chunks, as a power of two, an adoption of the arena takes from the source in
    /// one trip (`ChunkSource::alloc_chunk_run`) when it holds `chunks_left`: four
    /// ([`QUAD_CHUNKS_PER_ARENA`]) while at most a quarter of the source's chunks are out, two
    /// ([`PAIR_CHUNKS_PER_ARENA`]), or one (and always one while chunks are scarce).
    #[inline(always)]
    fn adoption_log2(&self, chunks_left: usize) -> u32 {
        if self.scarce_with(chunks_left) {
            return 0;
        }
        let most = self.source.chunks_at_most();
        if chunks_left >= self.arenas.len() * QUAD_CHUNKS_PER_ARENA
            && chunks_left >= most - most / 4
        {
            2
        } else if chunks_left >= self.arenas.len() * PAIR_CHUNKS_PER_ARENA {
            1
        } else {
            0
        }
    }

    /// After `MustRefill` on the bins semaphore with a promise of `promised` bins: adopt a
    /// chunk from the source with its first `k` bins taken, list it and signal the other bins;
    /// 0 (and the promise retracted) when the source is out of memory.
    ///
    /// With several chunks per trip ([`adoption_log2`](Self::adoption_log2)) in a heap below
    /// [`RUN_SHARED_BELOW_CHUNKS_PER_ARENA`] chunks per arena, the promise covers them all
    /// (`take_bins`' batch), so that the arena's other refills wait for this one. Before, it
    /// covered one chunk: where a refill takes a whole chunk's bins (1 KB, 5 bins) it covered
    /// nobody, every refill of the arena that came meanwhile took four chunks of its own, and
    /// 2^16 threads asking 1 KB each held 1.4 GiB of chunks for 64 MiB of blocks; in a 2 GiB
    /// heap, 2^18 threads then ran out of plenty and took 49.8 ms (0.23 ms in an 8 GiB heap;
    /// H100, f4e7563). Each chunk of the run settles the part of the promise its bins answer,
    /// the first chunk's first, and what is left (the spare's part) is retracted last; a
    /// spare or a single chunk settles all of it with fewer bins (INV(SEM4)).
    ///
    /// While chunks are scarce, one adoption of a kind at a time in the whole heap (INV(UA16)):
    /// SMs that run out together would otherwise each adopt a chunk for a few blocks (on the
    /// H100, a mixed fill of 64 MiB left 120 of its 128 chunks small ones with 14,520 free
    /// bins). A caller that comes while another adopts waits for it and returns [`JOINED`]
    /// (its promise retracted): the new chunk's free bins are for it to take.
    #[cold]
    #[inline(never)]
    fn adopt_chunk(&self, ai: usize, kind: BinKind, k: u32, promised: u32) -> u64 {
        let ks = self.arenas[ai].kind(kind);
        if let Some(base) = self.take_spare(ks) {
            return self.adopt_against(ai, kind, k, base, promised);
        }
        let chunks_left = self.source.chunks_left();
        if !self.scarce_with(chunks_left) {
            let log2 = self.adoption_log2(chunks_left);
            if log2 > 0
                && let Some(run) = self.source.alloc_chunk_run(log2)
            {
                // Each chunk's signal settles the part of the promise its bins answer, the
                // first chunk's first, so that the arena's waiters never see the promise gone
                // before its bins are there.
                let per = bins_per_chunk(kind);
                let mut owed = promised;
                let mut settle = |bins: u32| {
                    let part = owed.min(bins);
                    owed -= part;
                    part
                };
                let first = self.adopt_against(ai, kind, k, run, settle(per - k));
                for i in 1..1usize << log2 {
                    let chunk = run.wrapping_add(i * CHUNK_SIZE);
                    // INV(UA14): the second chunk, unused, is the arena's spare: its next
                    // adoption of this kind takes it with one swap instead of a trip to the
                    // source. If another adoption of this kind in this arena stocked a spare
                    // while ours went to the source (at 2^20 fresh mallocs of 4 KB, 5,731 of
                    // 7,407 pairs found one), and for the chunks after the second, the arena
                    // adopts it, its bins signalled against what is left of our promise, or
                    // beyond it (INV(SEM4)).
                    if i == 1 && self.stock_spare(ai, kind, chunk) {
                        continue;
                    }
                    self.adopt_against(ai, kind, 0, chunk, settle(per));
                }
                if owed > 0 {
                    // The spare's share: nobody gets its bins before the next adoption.
                    self.arenas[ai].kind(kind).bins.0.retract(owed);
                }
                return first;
            }
            return match self.source.alloc_chunk() {
                Some(base) => self.adopt_against(ai, kind, k, base, promised),
                None => self.no_chunk(ai, kind, promised, 0),
            };
        }
        let gate = &self.arenas[self.home(kind.index())]
            .kind(kind)
            .chunks
            .0
            .adoption;
        let mut got = 0;
        let run = gate.try_run(|| match self.source.alloc_chunk() {
            Some(base) => {
                got = self.adopt_against(ai, kind, k, base, promised);
                1
            }
            None => 0,
        });
        match run {
            Ok(_) if got != 0 => got,
            Ok(_) => self.no_chunk(ai, kind, promised, 0),
            Err(running) => {
                let adopted = gate.join(running) != 0;
                self.no_chunk(ai, kind, promised, if adopted { JOINED } else { 0 })
            }
        }
    }

    /// An adoption that found no chunk: its promise of `promised` bins is retracted
    /// (INV(SEM4)); returns `result`.
    fn no_chunk(&self, ai: usize, kind: BinKind, promised: u32, result: u64) -> u64 {
        self.arenas[ai].kind(kind).bins.0.retract(promised);
        result
    }

    /// Adopt the chunk at `base` for arena `ai` with its first `k` bins taken; list it and
    /// signal its free bins, settling a promise of `promised` (INV(SEM4): 0 for a chunk nobody
    /// waits for; it may be more or less than the bins signalled). Returns `base`.
    fn adopt_against(&self, ai: usize, kind: BinKind, k: u32, base: *mut u8, promised: u32) -> u64 {
        let ks = self.arenas[ai].kind(kind);
        let per = bins_per_chunk(kind);
        debug_assert!(
            (base as usize).is_multiple_of(CHUNK_SIZE),
            "ChunkSource returned a misaligned chunk"
        );
        // SAFETY: a fresh chunk from the source is ours alone.
        let chunk = unsafe { ChunkHeader::adopt(base as usize, ai as u32, kind, k) };
        let list = &ks.chunks.0;
        list.lock.lock_single();
        list.push_all_locked(chunk);
        if k < per {
            list.push_partial_locked(chunk);
        }
        list.lock.unlock();
        // INV(UA9): listed before its units are.
        ks.bins.0.signal(per - k, promised);
        if k < per {
            self.note_free_bins(kind);
        }
        base as u64
    }

    /// Adopt `base`, a chunk from the source that nobody waits for, for arena `ai` as a chunk
    /// of `kind`, with none of its bins taken: it is listed and its bins' units are added to
    /// the arena's bins semaphore beyond any promise (INV(SEM4)). The chunks of a run after
    /// the spare, and the spare's chunk too when the arena got one meanwhile (`adopt_chunk`).
    /// If none of its bins is ever carved, no bin's return gives it back: `trim` does
    /// (`return_empty_chunks`).
    ///
    /// # Safety
    /// `base` came from this UAlloc's source (`alloc_chunk` or a run's chunk) and is used by
    /// nobody else.
    pub unsafe fn adopt_extra(&self, ai: usize, kind: BinKind, base: *mut u8) {
        self.adopt_against(ai, kind, 0, base, 0);
    }

    /// The arena's spare chunk of this kind, if it still has one (INV(UA14)): a load, and a
    /// `swap` only where the load saw one.
    #[inline(always)]
    fn take_spare(&self, ks: &KindState) -> Option<*mut u8> {
        let spare = &ks.chunks.0.spare;
        if spare.load_relaxed() == 0 {
            return None;
        }
        // Acquire: pairs with the release in `stock_spare` (on the GPU the stocking kernel has
        // ended before any malloc runs; the host's tests need the pair).
        match spare.swap_acquire(0) {
            0 => None,
            chunk => Some(chunk as *mut u8),
        }
    }

    /// Give `chunk` (from the source, not used) to arena `ai` as its spare of `kind`: the
    /// arena's next adoption of that kind takes it instead of asking the source. Returns
    /// `false` (and keeps nothing) if the arena has a spare of that kind already; the caller
    /// still owns `chunk` then. The heap stocks its arenas this way when it is initialized
    /// (`DeviceHeap::stock_arenas`).
    pub fn stock_spare(&self, ai: usize, kind: BinKind, chunk: *mut u8) -> bool {
        debug_assert!((chunk as usize).is_multiple_of(CHUNK_SIZE));
        let spare = &self.arenas[ai].kind(kind).chunks.0.spare;
        // Release: pairs with the acquire swaps in `take_spare` and `give_back_spares`.
        spare.compare_exchange_acq_rel(0, chunk as u64).is_ok()
    }

    /// Give every arena's unused spare chunks back to the source (INV(UA14)). Returns how many.
    #[cold]
    #[inline(never)]
    fn give_back_spares(&self) -> u32 {
        let mut given = 0;
        for arena in self.arenas {
            for kind in BinKind::ALL {
                let spare = &arena.kind(kind).chunks.0.spare;
                if spare.load_relaxed() == 0 {
                    continue;
                }
                // Acquire: as in `take_spare`.
                let chunk = spare.swap_acquire(0);
                if chunk != 0 {
                    // SAFETY: INV(UA14): a spare came from the source, and the swap made it
                    // ours alone; nothing ever used it.
                    unsafe { self.source.free_chunk(chunk as *mut u8) };
                    given += 1;
                }
            }
        }
        given
    }

    /// An RCU callback: the retired `bin` goes back to its chunk; a chunk left with no carved
    /// bin goes back to the source after one more grace period (INV(UA11)).
    #[cold]
    #[inline(never)]
    pub(crate) fn return_bin(&self, bin: &BinHeader) {
        let base = chunk_base(bin as *const BinHeader as usize);
        // SAFETY: a retired bin's chunk is live until its last bin is back (INV(UA11)).
        let chunk = unsafe { ChunkHeader::at(base) };
        let ai = chunk.arena.load_relaxed() as usize;
        let kind = chunk.kind();
        let arena = &self.arenas[ai];
        let ks = arena.kind(kind);
        let per = bins_per_chunk(kind);
        let index = chunk.bin_index(bin);
        // INV(UA5): from now on `free` rejects pointers into this bin.
        bin.uncarve();
        let list = &ks.chunks.0;
        list.lock.lock_single();
        let free_bins = chunk.put_bin(index);
        if chunk.listed.load_relaxed() == 0 {
            list.push_partial_locked(chunk);
        }
        if free_bins < per {
            list.lock.unlock();
            ks.bins.0.release(1);
            self.note_free_bins(kind);
            return;
        }
        // Every bin is free: take the other bins' units back and give the chunk away. The
        // units may be out with waiters that have not taken a bin yet; they take one from this
        // chunk (ending the attempt) unless bins come back elsewhere, so the loop ends
        // (INV(UA11)). The mutex is dropped between tries so that they can.
        let mut backoff = Backoff::new();
        loop {
            if chunk.n_free.load_relaxed() != per {
                list.lock.unlock();
                ks.bins.0.release(1);
                self.note_free_bins(kind);
                return;
            }
            if ks.bins.0.try_wait(per - 1) {
                list.unlist_locked(chunk);
                list.lock.unlock();
                // SAFETY: the chunk is off every list; its header stays valid until the
                // callback frees it; queued once.
                unsafe { arena.rcu.call_rcu(&chunk.rcu) };
                return;
            }
            list.lock.unlock();
            backoff.snooze();
            list.lock.lock_single();
        }
    }
}
