//! `malloc`: the group fast path, the lone-lane path, and the list walk they share.

use core::ptr;

use crate::bulk_semaphore::{Miss, Wait};
use crate::collective::Group;
use crate::platform::{self, Backoff};
use crate::rcu::SrcuReader;
use crate::size_class::{BinKind, MAX_SMALL_SIZE, SizeClass};
use crate::ualloc::arena::{Arena, drain_pending, resync_listing};
use crate::ualloc::bin::{Claim, bin_at};
use crate::ualloc::layout::{WORD_BITS, slot_ptr};
use crate::ualloc::run::{CROSSED, crossed_slot, run_pos_slot};
use crate::ualloc::{CLASS_GROUP_TAG, ChunkSource, SCAN_LIMIT, UAlloc};

/// Where a group's slots are, as its leader found them: one word, broadcast to the lanes.
/// - 0: nowhere (out of memory; each lane looks for a slot elsewhere, `steal_slot`);
/// - odd: `units_at(i)`, arena `i` holds the group's units of the class: claim them from its
///   list;
/// - even: the address of a fresh bin (128-aligned) whose first slots are the group's.
#[inline(always)]
pub(crate) fn units_at(arena: usize) -> u64 {
    (arena as u64) << 1 | 1
}

/// On a group leader's `at`: the group's slots are the items of the arena's run of the class
/// at the run position in the other bits, one per lane in rank order (`ualloc::run`). No
/// address has this bit.
const IN_RUNS: u64 = 1 << 63;

/// The fewest lanes of a group that take their slots from a run (`find_group_slots_after`).
const RUN_GROUP: u32 = 32;

/// Lane `rank`'s slot of a group whose leader found them in a run (`at`, with [`IN_RUNS`]).
/// Out of line: the group path of every class carries only the call.
#[inline(never)]
fn run_group_slot(class: SizeClass, at: u64, rank: u32) -> *mut u8 {
    run_pos_slot(at & !IN_RUNS, class, rank)
}

/// The `n`-th lowest set bit of `bits` (`n < popcount(bits)`): one `fns` per half on the GPU
/// (a loop over the lower bits was 12% of malloc's stall samples at 16 B).
#[inline(always)]
fn nth_set_bit(bits: u64, n: u32) -> u32 {
    let low = bits as u32;
    let below = low.count_ones();
    if n < below {
        platform::nth_set_bit_u32(low, n)
    } else {
        32 + platform::nth_set_bit_u32((bits >> 32) as u32, n - below)
    }
}

/// Walks a class's bin list and claims slots, for a leader (or a lone lane) that holds slot
/// units from the semaphore: INV(UA2) guarantees the free slots exist in the list, so `next`
/// loops (leaving the read section and backing off between passes) until it finds some.
pub(crate) struct ListClaimer<'x> {
    arena: &'x Arena,
    class: SizeClass,
    reader: Option<SrcuReader<'x>>,
    /// The bin the walk stands on (address, 0 = end); valid while `reader` is held.
    cursor: u64,
    steps: u32,
    /// First bitmap word to try and the bit to start from in a word: spread warps of one SM
    /// over a bin's words and bits (fewer claims that collide and retry).
    start_word: u32,
    rotate: u32,
    backoff: Backoff,
}

impl<'x> ListClaimer<'x> {
    pub(crate) fn new(arena: &'x Arena, class: SizeClass) -> Self {
        let seed = platform::spread_seed();
        Self {
            arena,
            class,
            reader: None,
            cursor: 0,
            steps: 0,
            start_word: seed % class.bitmap_words() as u32,
            // 0 or 32: two warps that want 32 of a word's 64 free slots take disjoint halves
            // or collide whole (the loser moves on to the next word). Rotations 16 apart made
            // partial collisions, which split a warp's blocks over two words: after a refill
            // of several bins, half the warps of a 64 B free then formed two groups (ncu,
            // docs/benchmarks.md): free 64 B took 0.116–0.138 ms against 0.105 with 0 or 32.
            rotate: seed >> 8 & 0x20,
            backoff: Backoff::new(),
        }
    }

    /// Claim between 1 and `need` slots: `(bin address, word, bits)`. Out of line: the walk
    /// is the bulk of malloc's code, and inlined into every caller it would cost each of them
    /// its registers (docs/registers.md).
    #[inline(never)]
    pub(crate) fn next(&mut self, need: u32) -> (u64, u32, u64) {
        let list = &self.arena.class(self.class).list.0;
        loop {
            if self.reader.is_none() {
                self.reader = Some(self.arena.rcu.read_lock());
                // Acquire: pairs with the release in `BinList::push_locked`/`unlink_locked`.
                self.cursor = list.head.load_acquire();
                self.steps = 0;
            }
            if self.cursor == 0 || self.steps >= SCAN_LIMIT {
                // End of a pass: leave the read section so barriers can run. Units are ours,
                // so the slots exist (INV(UA2)); if no listed bin had them, they are in bins
                // on the pending stack (INV(UA7)): start over at once after draining it.
                self.reader = None;
                if !drain_pending(self.arena, self.class) {
                    self.backoff.snooze();
                    // Another thread may be draining or relinking under the mutex: wait for it
                    // with plain loads instead of passes (each pass enters a read section, and
                    // a storm of those slowed the drain itself: docs/benchmarks.md).
                    while list.lock.is_locked() {
                        self.backoff.snooze();
                    }
                }
                continue;
            }
            self.steps += 1;
            // SAFETY: INV(UA7)/INV(RCU1): a bin reached from the list inside the read section
            // is not returned to its chunk before the section ends.
            let bin = unsafe { bin_at(self.cursor) };
            debug_assert_eq!(bin.class(), Some(self.class));
            match bin.claim_from(self.class, self.start_word, self.rotate, need) {
                Claim::Got { word, bits, resync } => {
                    if resync {
                        // The claimer that fills a bin unlinks it (or has the mutex's holder
                        // do it), so walks stay short.
                        resync_listing(self.arena, self.class, bin);
                    }
                    // Stay on this bin: it may have more for the rest of the group.
                    return (self.cursor, word, bits);
                }
                Claim::NoneFree { resync, emptied } => {
                    if resync {
                        resync_listing(self.arena, self.class, bin);
                    }
                    if emptied {
                        // INV(UA17): our count kept a trim from retiring the empty bin.
                        self.arena.harvest().note();
                    }
                    // Acquire: pairs with the release stores that linked the next bin.
                    self.cursor = bin.next.load_acquire();
                }
                Claim::Retired => {
                    // Acquire: pairs with the release stores that linked the next bin.
                    self.cursor = bin.next.load_acquire();
                }
            }
        }
    }
}

impl<S: ChunkSource> UAlloc<'_, S> {
    /// A block of at least `size` bytes (`1..=MAX_SMALL_SIZE`), aligned to its class's
    /// [`align`](SizeClass::align); null when out of memory or `size > MAX_SMALL_SIZE`. Never
    /// hangs. Callable from any lanes of a warp in any convergence.
    pub fn malloc(&self, size: usize) -> *mut u8 {
        if size > MAX_SMALL_SIZE {
            return ptr::null_mut();
        }
        let class = SizeClass::from_size(size);
        let ai = self.arena_index();
        let active = platform::active_mask();
        let group = Group::of_among(
            active,
            CLASS_GROUP_TAG | (ai as u64) << 8 | class.index() as u64,
        )
        .split(class.max_group());
        if active & active.wrapping_sub(1) == 0 {
            return self.alloc_alone(ai, class);
        }
        // Every other lane takes the group path, a lane alone with its class as a group of one:
        // the lone-lane path beside it made a warp of several classes run both, one after the
        // other. Each leader first tries its class's semaphore with one add; the lanes whose
        // group got its units claim them and wait for each other before they return, so that
        // they leave together and the caller's next steps (a `free`, the next `malloc`) find
        // them in one group per class again. Without that, a warp that split by class here
        // stayed split: at 2^18 threads × 64 rounds of malloc, write and free of 16–256 B, the
        // kernel ran each warp's paths one group at a time (ncu: 3.1 group paths and 2.5 lone
        // ones entered per warp and round, 55% of the stall samples waiting for instructions),
        // and took 38.9 ms; with the wait, 10.1 ms (H100, docs/benchmarks.md). Lanes whose
        // group missed (a refill, the runs, out of memory) do not wait: with a wait for every
        // lane at the end of `malloc`, the fresh fills of mixed sizes were 20–45% slower.
        let miss = if group.is_leader() {
            self.arenas[ai]
                .class(class)
                .slots
                .0
                .wait_fast(group.size())
                .err()
        } else {
            None
        };
        let got = platform::ballot(active, group.is_leader() && miss.is_none());
        let fast = got >> group.leader() & 1 != 0;
        let fast_lanes = platform::ballot(active, fast);
        if fast {
            let p = self.serve_group(units_at(ai), ai, class, &group);
            // Every lane of `fast_lanes` gets here: a claim with units in hand ends (INV(UA2):
            // their slots are listed, or on the pending stack that the walk drains itself),
            // and no lane waiting here holds a lock or a promise that another lane needs.
            platform::sync_warp(fast_lanes);
            p
        } else {
            self.alloc_group_after(miss, ai, class, &group)
        }
    }

    /// `out.len()` blocks of `size` bytes as one group takes them (`UAlloc::malloc`'s group path, for a
    /// single thread): one semaphore operation, or the arena's run of the class when that
    /// found no units. All or nothing: `out.len() <= max_group()` of the class. Returns
    /// whether it succeeded; on failure `out` is all null.
    pub fn malloc_bulk(&self, size: usize, out: &mut [*mut u8]) -> bool {
        out.fill(ptr::null_mut());
        let k = out.len() as u32;
        if size > MAX_SMALL_SIZE || k == 0 || k > SizeClass::from_size(size).max_group() {
            return k == 0;
        }
        let class = SizeClass::from_size(size);
        let ai = self.arena_index();
        let (at, crossed) = self.find_group_slots(ai, class, k);
        if at & CROSSED != 0 {
            let next = at & !(IN_RUNS | CROSSED);
            for (r, p) in out.iter_mut().enumerate() {
                *p = crossed_slot(class, next, crossed, r as u32);
                if p.is_null() {
                    *p = self.alloc_fast_single(ai, class);
                }
            }
            if out.iter().all(|p| !p.is_null()) {
                return true;
            }
            // All or nothing.
            for p in out.iter_mut().filter(|p| !p.is_null()) {
                // SAFETY: a block this call just took.
                unsafe { self.free(*p) };
                *p = ptr::null_mut();
            }
            return false;
        }
        if at & IN_RUNS != 0 {
            for (r, p) in out.iter_mut().enumerate() {
                *p = run_group_slot(class, at, r as u32);
            }
            return true;
        }
        if at == 0 {
            return false;
        }
        if at & 1 == 0 {
            for (i, p) in out.iter_mut().enumerate() {
                *p = slot_ptr(at, class, i as u32);
            }
            return true;
        }
        let mut claimer = ListClaimer::new(&self.arenas[(at >> 1) as usize], class);
        let mut assigned = 0;
        while assigned < k {
            let (bin, word, bits) = claimer.next(k - assigned);
            let mut rest = bits;
            while rest != 0 {
                let slot = word * WORD_BITS as u32 + rest.trailing_zeros();
                out[assigned as usize] = slot_ptr(bin, class, slot);
                assigned += 1;
                rest &= rest - 1;
            }
        }
        true
    }

    /// Where `k` slots of `class` are for a group of arena `ai` ([`units_at`]): its own units
    /// with one `wait` (the fast path); in a small heap, the class's home's units or its
    /// refill's when ours ran out (INV(UA16), [`serve_at_home`](Self::serve_at_home)); or the
    /// refill's.
    /// For the group's leader (or a lone lane).
    #[inline(always)]
    fn find_slots(&self, ai: usize, class: SizeClass, k: u32) -> u64 {
        match self.arenas[ai].class(class).slots.0.wait_fast(k) {
            Ok(()) => units_at(ai),
            Err(miss) => self.find_slots_after(miss, ai, class, k),
        }
    }

    /// [`find_slots`](Self::find_slots) for a group's leader; but a group of a small class of
    /// a whole warp's lanes whose arena had no units for it, outside a small heap, takes the
    /// arena's run's items: the run position with [`IN_RUNS`] ([`UAlloc::take_from_run`]).
    #[inline(always)]
    fn find_group_slots(&self, ai: usize, class: SizeClass, k: u32) -> (u64, u64) {
        match self.arenas[ai].class(class).slots.0.wait_fast(k) {
            Ok(()) => (units_at(ai), 0),
            Err(miss) => self.find_group_slots_after(miss, ai, class, k),
        }
    }

    /// [`find_group_slots`](Self::find_group_slots) after its fast path missed.
    ///
    /// The run comes after the semaphore, not before: a warm heap's freed slots are the
    /// semaphore's, and a run taken first would carve new bins while they wait. Only groups of
    /// [`RUN_GROUP`] lanes take from the runs: with runs carved ahead, a fresh fill of mixed
    /// 16 B – 4 KB (a few lanes per class and warp) was 17% slower with runs for every group
    /// and 10% slower for groups of 16 lanes or more; without them, groups of 16 or more and
    /// whole warps measured the same (H100, `docs/benchmarks.md`, 2026-11-26i).
    /// The second word is 0, or the old run's items of a group whose add crossed the end of
    /// a run ([`CROSSED`] on the first, `ualloc::run`).
    #[cold]
    #[inline(never)]
    fn find_group_slots_after(
        &self,
        miss: Miss,
        ai: usize,
        class: SizeClass,
        k: u32,
    ) -> (u64, u64) {
        if class.kind() == BinKind::Small && k >= RUN_GROUP && !self.small_heap() {
            // INV(SEM3): the miss's deduction goes back (one add nobody waits for).
            self.arenas[ai].class(class).slots.0.cancel(miss, k);
            let (at, crossed) = self.take_from_run(ai, class, k);
            if at != 0 || crossed != 0 {
                return (at | IN_RUNS, crossed);
            }
            // The run is parked: the usual way, from a new look at the semaphore.
            return (self.find_slots(ai, class, k), 0);
        }
        (self.find_slots_after(miss, ai, class, k), 0)
    }

    /// [`find_slots`](Self::find_slots) after its fast path missed: out of line, so that the
    /// fast path holds nothing for it.
    #[cold]
    #[inline(never)]
    fn find_slots_after(&self, miss: Miss, ai: usize, class: SizeClass, k: u32) -> u64 {
        // Only a small heap goes to the home first (a big one nearly full waits for its own
        // refill, which goes to the home): in a big heap's fresh fill a look there cost 3-5%
        // (H100, 88eca1d).
        if self.small_heap() && self.shares_home(class) {
            return self.find_slots_small(miss, ai, class, k);
        }
        let slots = &self.arenas[ai].class(class).slots.0;
        let batch = self.refill_batch(class);
        match slots.wait_after(miss, k, batch, false, || None::<u64>) {
            Ok(Wait::Acquired) => units_at(ai),
            Ok(Wait::MustRefill) => self.refill(ai, class, k, batch),
            Err(at) => at,
        }
    }

    /// [`find_slots_after`](Self::find_slots_after) in a small heap: the class's home and its
    /// refill before a reservation of our own (INV(UA16)). A function of its own: with the home
    /// inside `find_slots_after`, every miss of a big heap's fresh fill paid 51 more spill
    /// instructions there and 2^20 fresh mallocs of 16 B took 5% longer (H100).
    #[cold]
    #[inline(never)]
    fn find_slots_small(&self, miss: Miss, ai: usize, class: SizeClass, k: u32) -> u64 {
        let slots = &self.arenas[ai].class(class).slots.0;
        match slots.wait_after(miss, k, class.slots(), true, || {
            self.serve_at_home(ai, class, k)
        }) {
            Ok(Wait::Acquired) => units_at(ai),
            Ok(Wait::MustRefill) => self.refill(ai, class, k, class.slots()),
            Err(at) => at,
        }
    }

    /// After `MustRefill` on arena `ai`'s slots of `class`, a wait for `batch` slots (the
    /// promise is `batch - k`): while chunks are scarce, the class's home first (INV(UA16));
    /// then a refill of `ai`'s own ([`units_at`]).
    #[cold]
    #[inline(never)]
    fn refill(&self, ai: usize, class: SizeClass, k: u32, batch: u32) -> u64 {
        if self.scarce() && self.shares_home(class) {
            // Our promise stands while we are away: the arena's other waiters wait for us
            // instead of refilling too (one refill per arena at a time, as always).
            if let Some(found) = self.serve_at_home(ai, class, k) {
                // INV(SEM4): the promise is answered; its waiters look again.
                self.arenas[ai].class(class).slots.0.retract(batch - k);
                return found;
            }
        }
        self.alloc_slow(ai, ai, class, k, batch - k).unwrap_or(0)
    }

    /// The only lane of its warp that asks for a small block: a slot of the arena's run of the
    /// class (one add, `ualloc::run`), else the lone-lane path. Only such lanes go to the
    /// runs: they serve latency (one thread's mallocs, H100: 39.4 -> 28.1 ms for 10,000).
    /// Where the other lanes of the warp ask too, for other classes, the SM's many lone lanes
    /// soon use a run up and the rest pay an add for nothing: with every lane alone with its
    /// class at the runs, divergent warps of 1-8192 B took 12-19% longer and the churn 7%.
    #[inline(never)]
    fn alloc_alone(&self, ai: usize, class: SizeClass) -> *mut u8 {
        let p = self.alloc_from_run(ai, class);
        if p.is_null() {
            self.alloc_fast_single(ai, class)
        } else {
            p
        }
    }

    /// A lane alone with its class: one `wait`, one claim, no collectives.
    #[inline(never)]
    fn alloc_fast_single(&self, ai: usize, class: SizeClass) -> *mut u8 {
        let at = self.find_slots(ai, class, 1);
        if at == 0 {
            // Last: a free slot in another arena's bins (steal.rs).
            self.steal_slot(ai, class)
        } else if at & 1 == 0 {
            slot_ptr(at, class, 0)
        } else {
            let arena = &self.arenas[(at >> 1) as usize];
            let (bin, word, bits) = ListClaimer::new(arena, class).next(1);
            slot_ptr(bin, class, word * WORD_BITS as u32 + bits.trailing_zeros())
        }
    }

    /// The group path after its leader's `wait_fast` missed (`miss`, on the leader only): the
    /// leader finds the group's slots the slow way (a wait, a refill, the runs) and the group
    /// takes them ([`serve_group`](Self::serve_group)). Collective over `group`.
    ///
    /// A whole warp of a small class whose arena has no units for it takes its slots from the
    /// arena's run ([`IN_RUNS`], `ualloc::run`).
    #[inline(never)]
    fn alloc_group_after(
        &self,
        miss: Option<Miss>,
        ai: usize,
        class: SizeClass,
        group: &Group,
    ) -> *mut u8 {
        let (at, crossed) = match miss {
            Some(miss) => self.find_group_slots_after(miss, ai, class, group.size()),
            None => (0, 0),
        };
        let at = group.broadcast_u64(at);
        if at & CROSSED != 0 {
            // Uniform: `at` is the leader's.
            return self.serve_crossed(at, group.broadcast_u64(crossed), ai, class, group);
        }
        self.serve_group(at, ai, class, group)
    }

    /// A group whose add crossed the end of a run (`ualloc::run`): each lane's slot of the
    /// old run or the next one; lanes left without one (no next run) take theirs alone.
    #[cold]
    #[inline(never)]
    fn serve_crossed(
        &self,
        at: u64,
        crossed: u64,
        ai: usize,
        class: SizeClass,
        group: &Group,
    ) -> *mut u8 {
        let p = crossed_slot(class, at & !(IN_RUNS | CROSSED), crossed, group.rank());
        if p.is_null() {
            self.alloc_fast_single(ai, class)
        } else {
            p
        }
    }

    /// Each lane of `group` gets its slot of what the leader found (`at`, broadcast: see
    /// [`units_at`]): from the arena's run, a fresh bin, or the units' slots claimed from the
    /// arena's list by the leader, one broadcast per claim (usually one claim: one `fetch_or`
    /// on a 64-bit word serves the whole group); with nothing found, from another arena
    /// (steal.rs). Collective over `group` (collective.rs rules): the loop runs the same number
    /// of times on every lane because `assigned` only changes by broadcast values.
    #[inline(never)]
    fn serve_group(&self, at: u64, ai: usize, class: SizeClass, group: &Group) -> *mut u8 {
        let k = group.size();
        let rank = group.rank();
        if at & IN_RUNS != 0 {
            return run_group_slot(class, at, rank);
        }
        if at & 1 == 0 {
            return if at == 0 {
                // Last: each lane looks for a free slot in another arena's bins (steal.rs).
                self.steal_slot(ai, class)
            } else {
                slot_ptr(at, class, rank)
            };
        }
        let mut claimer = if group.is_leader() {
            Some(ListClaimer::new(&self.arenas[(at >> 1) as usize], class))
        } else {
            None
        };
        let mut assigned = 0;
        let mut mine = ptr::null_mut();
        while assigned < k {
            let (bin, word, bits) = match claimer.as_mut() {
                Some(c) => c.next(k - assigned),
                None => (0, 0, 0),
            };
            let bin = group.broadcast_u64(bin);
            let word = group.broadcast_u32(word);
            let bits = group.broadcast_u64(bits);
            let n = bits.count_ones();
            if rank >= assigned && rank < assigned + n {
                let slot = word * WORD_BITS as u32 + nth_set_bit(bits, rank - assigned);
                mine = slot_ptr(bin, class, slot);
            }
            assigned += n;
        }
        mine
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    #[test]
    fn nth_set_bit_matches_a_scan() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let set = (0..64u32).filter(|i| x >> i & 1 != 0);
            for (n, bit) in set.enumerate() {
                assert_eq!(super::nth_set_bit(x, n as u32), bit, "{x:#x} n={n}");
            }
        }
    }
}
