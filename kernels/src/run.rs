//! A run: items that one stock set aside side by side, handed out with one atomic add on a
//! single word: one item to a lone lane, or several to a warp's group of lanes at once.
//!
//! Two kinds of runs use it: sixteen large blocks that one split of the buddy tree took
//! (`tbuddy::run`), and the slots of bins carved full for an SM's lanes of a size class
//! (`ualloc::run`). A lane's own way to an item is a chain of dependent atomics and fences (a
//! climb of the tree; a semaphore, a read section and a claim for a slot). From a run it costs
//! one add, and the chain is paid once per run by the lane that stocks it.
//!
//! ```text
//!  word: │ base + 1 (40 bits; 0: no run) │ P │ items counted (23 bits) │   P: parked
//!  take k: fetch_add(k) → (run, t):
//!        t < items                                  → items t..min(t + k, items) are ours, and
//!                                                     if t + k > items we stock the next run;
//!        t ≤ at < t + k, where at is items (a run), 0 (no run) or RECHECK (parked)
//!                                                   → we stock the next run;
//!        otherwise                                  → busy (another lane stocks; the word
//!                                                     changes when it is done) or parked
//!                                                     (memory is short: take them elsewhere).
//!  stock / flush: swap in the new run (or a parked word, or none); the run swapped out has
//!        handed out exactly min(t, items) items, and the swapper gives back the rest.
//!
//!  guarded swap (`replace`, UAlloc's runs of slots, whose frees must tell a slot the run
//!  still holds from one it handed out):
//!        fetch_or(D) → the old run's t   (D: draining; adds see a count ≥ items: busy)
//!        give back items t.. of the old run
//!        swap in │ new base + 1 │ D │ kept │   (named, closed: its bins are published now)
//!        swap in │ new base + 1 │ 0 │ kept │   (open)
//! ```
//!
//! A reader ([`Run::look`], a `free`) that finds its slot's bin in the run the word names
//! knows, from the word alone, whether the run handed the slot out: its item is below the
//! count; or that a swap is under way (D): it waits for the swap and looks again. A run that
//! the word no longer names handed out or gave back every item, so the slot's bit tells the
//! truth (INV(UA19)).
//!
//! A stocker that finds no memory for a run parks the word: the lanes that come next go
//! elsewhere at the cost of their add, and the add that reaches [`RECHECK`] looks for memory
//! again. Without parking, each of them would try to stock in turn (a heap with little memory
//! left would pay a look and a swap per request).
//!
//! Invariants (`docs/invariants.md`):
//! - TB14: every item of a run is handed out once, or given back once by the thread whose
//!   swap took the run out of its word; never both, never neither.
//! - UA19 (guarded swaps): while the word names a run without D, its items below the count
//!   are exactly those handed out; a run's leftover items are given back before the word
//!   stops naming it.

use crate::platform::Atomic64;

/// Where the base sits: above the count and the parked flag.
const TAKEN_BITS: u32 = 24;
/// The count of items handed out (taken by adds), with the draining flag as its top bit: a
/// taker reads a draining word's count as far above any run's items.
const COUNT_MASK: u64 = (1 << (TAKEN_BITS - 1)) - 1;
/// The parked flag: no run, and memory was short when one was last looked for.
const PARKED: u64 = 1 << (TAKEN_BITS - 1);
/// The draining flag of a guarded swap ([`Run::replace`]): a swap is under way; takers wait
/// or go elsewhere, and readers wait.
const DRAIN: u64 = 1 << (TAKEN_BITS - 2);
/// The largest base a word can name.
pub const MAX_BASE: u64 = (1 << (64 - TAKEN_BITS)) - 2;
/// The count on a parked word at which one lane looks for memory again.
pub const RECHECK: u64 = 256;
/// Counts at or above this give their add back: while a stocker is slow, lanes that come
/// back again and again cannot carry the count into the flag. Adds in flight on one word
/// are at most the lanes that may use it (an SM's 2,048 threads, up to [`MAX_TAKE`] each for
/// ualloc's and tbuddy's per-SM runs), far below the room left above the ceiling.
const CEILING: u64 = 1 << (TAKEN_BITS - 3);

/// The most items a run may hold (far below the ceiling).
pub const MAX_ITEMS: u32 = 1 << 16;
/// The most items one add may take (a warp).
pub const MAX_TAKE: u32 = 32;
const _: () = assert!((MAX_ITEMS as u64) < CEILING && RECHECK < CEILING);
// Counts of a word that is not draining stay below the flag (the adds in flight at the
// ceiling included)...
const _: () = assert!(CEILING + 2048 * MAX_TAKE as u64 <= DRAIN);
// ...and those of a draining word below the parked flag: a drain starts from such a count,
// and its adds, which are not given back (`take_many`), are those of the lanes that come to
// the word while one swap gives back at most one run's items: each lane adds once and waits
// (groups) or goes elsewhere (a lone lane, whose next `malloc` may add again). Room for 2^20
// adds, 512 per thread of a full SM, during one swap's few dozen atomics.
const _: () = assert!(DRAIN + CEILING + 2048 * MAX_TAKE as u64 + (1 << 20) <= PARKED);

/// How many items the run at a base holds (at most [`MAX_ITEMS`]): one count for every run
/// of a word (a `u32`), or a count that the stocker folded into the base itself
/// (`tbuddy::run`, whose runs' size depends on the heap), so that a taker learns it from the
/// word its add returns.
pub trait RunItems: Copy {
    /// The items of the run at `base`.
    fn of(self, base: u64) -> u32;
}

impl RunItems for u32 {
    #[inline(always)]
    fn of(self, _base: u64) -> u32 {
        self
    }
}

/// What [`Run::take`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// Item `index` of the run at `base`, ours.
    Item { base: u64, index: u32 },
    /// The run is used up (or there is none, or it is time to look again) and this lane
    /// stocks the next one ([`Run::stock`]).
    Stock,
    /// Another lane stocks the run, or memory is short: take the item elsewhere.
    Elsewhere,
}

/// What [`Run::take_many`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Takes {
    /// Items `first..first + n` of the run at `base` are ours (`1 <= n <= k`). `stock`: our
    /// add crossed the end of the run, so this lane stocks the next run (UAlloc's groups keep
    /// these `n` for their first lanes and take the other `k - n` from it).
    Items {
        base: u64,
        first: u32,
        n: u32,
        stock: bool,
    },
    /// Nothing from this run, and this lane stocks the next one ([`Run::stock`]).
    Stock,
    /// Another lane stocks the next run: the word after our add, for
    /// [`Run::wait_for_stock`].
    Busy(u64),
    /// Memory is short (the word is parked): take the items elsewhere.
    Parked,
}

/// What a guarded swap ([`Run::replace`]) puts in the word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// The run at `base`, whose items `0..kept` the swapper keeps.
    Run { base: u64, kept: u32 },
    /// No run, parked (memory is short).
    Parked,
    /// No run; the next add stocks.
    Empty,
}

/// A guarded run's word, read ([`Run::look`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Look {
    /// The run the word names (`None`: none).
    pub base: Option<u64>,
    /// Adds counted on it (its items below this were handed out, when not draining).
    pub taken: u64,
    /// A guarded swap is under way.
    pub draining: bool,
    word: u64,
}

/// Items of a run that a swap took out of its word and that nobody was handed (INV(TB14)):
/// items `first..first + count` of the run at `base`, for the swapper to give back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leftover {
    pub base: u64,
    pub first: u32,
    pub count: u32,
}

/// One run's word (all-zero: no run; the first `take` stocks one).
#[repr(transparent)]
pub struct Run(Atomic64);

impl Run {
    /// No run (equal to all-zero memory).
    pub fn new() -> Self {
        Self(Atomic64::new(0))
    }

    /// Take the next of a run of `items` (at most [`MAX_ITEMS`]): one add.
    #[inline(always)]
    pub fn take(&self, items: impl RunItems) -> Take {
        match self.take_many(1, items) {
            Takes::Items { base, first, .. } => Take::Item { base, index: first },
            Takes::Stock => Take::Stock,
            Takes::Busy(_) | Takes::Parked => Take::Elsewhere,
        }
    }

    /// Take the next `k` (`1..=MAX_TAKE`) of a run of `items` (at most [`MAX_ITEMS`]): one
    /// add. Every taker of a word must pass the same `items`.
    #[inline(always)]
    pub fn take_many(&self, k: u32, items: impl RunItems) -> Takes {
        debug_assert!((1..=MAX_TAKE).contains(&k));
        let k = k as u64;
        // Acquire: pairs with the swap that installed the run (what its stocker wrote about
        // the items, before we use ours).
        let word = self.0.fetch_add_acquire(k);
        let (base, taken) = (word >> TAKEN_BITS, word & COUNT_MASK);
        // Only a run's items matter (below, `stock_at` of a word with a run).
        let items = if base != 0 { items.of(base - 1) } else { 0 };
        debug_assert!(base == 0 || (1..=MAX_ITEMS).contains(&items));
        let items = items as u64;
        if base != 0 && taken < items {
            return Takes::Items {
                base: base - 1,
                first: taken as u32,
                n: (items - taken).min(k) as u32,
                stock: taken + k > items,
            };
        }
        let parked = word & PARKED != 0;
        let stock_at = if base != 0 {
            // The add that reaches the end of the run (one ending exactly at it took items).
            items
        } else if parked {
            // A parked word, time to look again.
            RECHECK
        } else {
            // The first add on an empty word.
            0
        };
        if taken <= stock_at && stock_at < taken + k {
            return Takes::Stock;
        }
        if (CEILING..DRAIN).contains(&taken) {
            self.give_add_back(word.wrapping_add(k), k);
        }
        if parked {
            Takes::Parked
        } else {
            Takes::Busy(word.wrapping_add(k))
        }
    }

    /// Wait until the word no longer holds the run (or the empty word) that
    /// [`Takes::Busy`] reported as `seen` (the word after our add): its stocker has installed
    /// the next one, parked the word or emptied it. Adds only raise the count, so a swap shows
    /// as other upper bits or a count below ours: a stocker that empties an empty word
    /// ([`clear`](Self::clear)) changes only the count, and waiters that watched the upper
    /// bits alone waited for an add that none of them would make. Plain loads with back-off; a
    /// hint only (the next `take_many` decides).
    pub fn wait_for_stock(&self, seen: u64) {
        let mut backoff = crate::platform::Backoff::new();
        loop {
            let word = self.0.load_relaxed();
            if word & !COUNT_MASK != seen & !COUNT_MASK || word & COUNT_MASK < seen & COUNT_MASK {
                return;
            }
            backoff.snooze();
        }
    }

    /// Take back an add of `k` that found a count at the ceiling, while the word holds the run
    /// it was made on (`seen`, the word after it): a subtraction that came after a swap would
    /// lower the next run's count, and hand its items out twice. Cold: a stocker was slow for
    /// 2^21 adds.
    #[cold]
    fn give_add_back(&self, seen: u64, k: u64) {
        let mut word = self.0.load_relaxed();
        while word & !COUNT_MASK == seen & !COUNT_MASK && word & COUNT_MASK >= CEILING + k {
            match self.0.compare_exchange_relaxed(word, word - k) {
                Ok(_) => return,
                Err(now) => word = now,
            }
        }
    }

    /// A guarded swap (module doc): put `next` in the word, giving the items of the run it
    /// displaces that nobody was handed to `give_back` first, and calling `publish` while the
    /// new run is named but closed (its bins' classes: a `free` that finds one of them waits
    /// until the run opens). `wait`: when another guarded swap is under way, wait for it and
    /// displace what it installs; otherwise return `false` at once, having done nothing (a
    /// trim's flush: the other swapper empties the word of the run it displaces).
    ///
    /// Only UAlloc's runs of slots swap this way; every swap of their words must.
    pub fn replace(
        &self,
        next: Next,
        items: impl RunItems,
        wait: bool,
        give_back: impl FnOnce(Leftover),
        publish: impl FnOnce(),
    ) -> bool {
        let mut backoff = crate::platform::Backoff::new();
        let old = loop {
            // Acq_rel: acquire the displaced run (what its stocker wrote about its items)
            // before we give its items back; the count it returns is what was handed out.
            let old = self.0.fetch_or_acq_rel(DRAIN);
            if old & DRAIN == 0 {
                break old;
            }
            if !wait {
                return false;
            }
            while self.0.load_relaxed() & DRAIN != 0 {
                backoff.snooze();
            }
        };
        if let Some(left) = Self::leftover(old, items) {
            give_back(left);
        }
        match next {
            Next::Run { base, kept } => {
                debug_assert!(base <= MAX_BASE && (1..=items.of(base)).contains(&kept));
                let named = (base + 1) << TAKEN_BITS | kept as u64;
                // Release: the displaced run's items are given back (their bits clear) before
                // a reader sees that the word no longer names it (INV(UA19)).
                self.0.swap_acq_rel(named | DRAIN);
                publish();
                // Release: pairs with the takers' acquire (the bins' classes and words).
                self.0.swap_acq_rel(named);
            }
            Next::Parked => {
                // As `stock(None)`: one add counted. Release as above.
                self.0.swap_acq_rel(PARKED | 1);
            }
            Next::Empty => {
                self.0.swap_acq_rel(0);
            }
        }
        true
    }

    /// The word as a reader of a guarded run sees it. Relaxed: what a `free` decides from it
    /// needs no order. A count at or above the item was read after the item was handed out
    /// to whoever frees it (the caller's own order), so a refusal is never of a live block;
    /// and a `free` that goes on to the bitmap (a word that no longer names the run) clears
    /// the bit with an RMW, as the swapper's give-back does: whichever comes second finds
    /// the bit clear and gives no unit, so the slot is freed once whatever their order, and
    /// the run hands it out no more.
    #[inline(always)]
    pub fn look(&self) -> Look {
        let word = self.0.load_relaxed();
        let base = word >> TAKEN_BITS;
        Look {
            base: if base == 0 { None } else { Some(base - 1) },
            taken: word & (DRAIN - 1),
            draining: word & DRAIN != 0,
            word,
        }
    }

    /// Whether the word is all-zero (no run, not parked). Relaxed: a hint.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.0.load_relaxed() == 0
    }

    /// Wait until the word is no longer the draining word `seen` ([`Look`]): the swap under
    /// way has ended (or moved on). Plain loads with back-off.
    pub fn wait_while_draining(&self, seen: &Look) {
        let mut backoff = crate::platform::Backoff::new();
        loop {
            let word = self.0.load_relaxed();
            if word & DRAIN == 0 || word & !COUNT_MASK != seen.word & !COUNT_MASK {
                return;
            }
            backoff.snooze();
        }
    }

    /// Install the run at `base` (at most [`MAX_BASE`]) of `items` items, whose items
    /// `0..kept` the stocker keeps (`1 <= kept <= items`); `None`: park the word (no memory
    /// for a run). Returns the items of the run this swap took out that nobody was handed.
    pub fn stock(&self, base: Option<u64>, kept: u32, items: impl RunItems) -> Option<Leftover> {
        let word = match base {
            Some(base) => {
                debug_assert!(base <= MAX_BASE && (1..=items.of(base)).contains(&kept));
                (base + 1) << TAKEN_BITS | kept as u64
            }
            // One add counted, so that the RECHECK-th add looks again.
            None => PARKED | 1,
        };
        // Release: what the stocker wrote about the run's items comes before a taker sees
        // it. Acquire: the run we displace was set aside before we give its items back.
        Self::leftover(self.0.swap_acq_rel(word), items)
    }

    /// Empty the word (no run, not parked): the next add stocks. Returns the items of the
    /// run this swap took out that nobody was handed. For a stocker whose memory was not fit
    /// for a run but may be again soon.
    pub fn clear(&self, items: impl RunItems) -> Option<Leftover> {
        // Acq_rel: as in `stock`.
        Self::leftover(self.0.swap_acq_rel(0), items)
    }

    /// Take the run out of its word (a trim): the items nobody was handed, to give back. A
    /// parked word is emptied too, so that the next `take` looks for memory at once.
    pub fn flush(&self, items: impl RunItems) -> Option<Leftover> {
        // Relaxed: a hint; a run that a `stock` installs after it is the next trim's.
        if self.0.load_relaxed() == 0 {
            return None;
        }
        self.clear(items)
    }

    fn leftover(word: u64, items: impl RunItems) -> Option<Leftover> {
        let (base, taken) = (word >> TAKEN_BITS, word & COUNT_MASK);
        if base == 0 {
            return None;
        }
        let items = items.of(base - 1);
        if taken >= items as u64 {
            return None;
        }
        Some(Leftover {
            base: base - 1,
            first: taken as u32,
            count: items - taken as u32,
        })
    }
}

impl Default for Run {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const ITEMS: u32 = 8;

    #[test]
    fn an_empty_word_asks_its_first_taker_to_stock() {
        let run = Run::new();
        assert_eq!(run.take(ITEMS), Take::Stock);
        assert_eq!(run.take(ITEMS), Take::Elsewhere);
        // The stocker installs run 5 and keeps its item 0; the late add above is forgotten.
        assert_eq!(run.stock(Some(5), 1, ITEMS), None);
        for i in 1..ITEMS {
            assert_eq!(run.take(ITEMS), Take::Item { base: 5, index: i });
        }
        assert_eq!(run.take(ITEMS), Take::Stock);
        assert_eq!(run.take(ITEMS), Take::Elsewhere);
    }

    #[test]
    fn a_swap_gives_back_exactly_the_items_nobody_took() {
        let run = Run::new();
        assert_eq!(run.take(ITEMS), Take::Stock);
        run.stock(Some(0), 1, ITEMS);
        assert_eq!(run.take(ITEMS), Take::Item { base: 0, index: 1 });
        assert_eq!(run.take(ITEMS), Take::Item { base: 0, index: 2 });
        // A second stocker (after a flush raced a stock) displaces the run: items 3.. back.
        let back = Leftover {
            base: 0,
            first: 3,
            count: ITEMS - 3,
        };
        assert_eq!(run.stock(Some(MAX_BASE), 1, ITEMS), Some(back));
        let back = Leftover {
            base: MAX_BASE,
            first: 1,
            count: ITEMS - 1,
        };
        assert_eq!(run.flush(ITEMS), Some(back));
        assert_eq!(run.flush(ITEMS), None);
        // A used-up run has nothing to give back.
        run.stock(Some(7), 1, ITEMS);
        for _ in 1..ITEMS + 3 {
            run.take(ITEMS);
        }
        assert_eq!(run.flush(ITEMS), None);
    }

    #[test]
    fn a_parked_word_sends_lanes_elsewhere_and_looks_again_every_recheck_adds() {
        let run = Run::new();
        assert_eq!(run.take(ITEMS), Take::Stock);
        // No memory: parked. The next adds go elsewhere until the RECHECK-th.
        assert_eq!(run.stock(None, 1, ITEMS), None);
        for _ in 1..RECHECK {
            assert_eq!(run.take(ITEMS), Take::Elsewhere);
        }
        assert_eq!(run.take(ITEMS), Take::Stock);
        assert_eq!(run.take(ITEMS), Take::Elsewhere);
        assert_eq!(run.stock(None, 1, ITEMS), None);
        assert_eq!(run.take(ITEMS), Take::Elsewhere);
        // A trim empties a parked word, which gives nothing back: the next add looks at once.
        assert_eq!(run.flush(ITEMS), None);
        assert_eq!(run.take(ITEMS), Take::Stock);
        assert_eq!(run.stock(Some(2), 1, ITEMS), None);
        assert_eq!(run.take(ITEMS), Take::Item { base: 2, index: 1 });
    }

    #[test]
    fn counts_stop_below_the_base_while_a_stocker_is_slow() {
        let run = Run::new();
        run.stock(Some(MAX_BASE), 1, ITEMS);
        // Far more adds than items, as if the stocker never came back: the count stays
        // under the ceiling (plus the adds in flight), the base intact.
        run.0
            .store_relaxed((MAX_BASE + 1) << TAKEN_BITS | (CEILING - 2));
        for _ in 0..10 {
            assert_eq!(run.take(ITEMS), Take::Elsewhere);
        }
        let word = run.0.load_relaxed();
        assert_eq!(word >> TAKEN_BITS, MAX_BASE + 1);
        assert!(word & COUNT_MASK <= CEILING, "{:#x}", word & COUNT_MASK);
        assert_eq!(word & PARKED, 0);
        assert_eq!(run.flush(ITEMS), None);
    }

    #[test]
    fn a_group_takes_its_items_with_one_add_and_the_crosser_stocks() {
        let run = Run::new();
        // The first add on an empty word stocks, whatever its size; the stocker keeps 3.
        assert_eq!(run.take_many(3, ITEMS), Takes::Stock);
        assert!(matches!(run.take_many(2, ITEMS), Takes::Busy(_)));
        assert_eq!(run.stock(Some(9), 3, ITEMS), None);
        let items = |first, n, stock| Takes::Items {
            base: 9,
            first,
            n,
            stock,
        };
        assert_eq!(run.take_many(2, ITEMS), items(3, 2, false));
        // Items 5..8 are the group's three of four; its add used the run up: it stocks.
        assert_eq!(run.take_many(4, ITEMS), items(5, 3, true));
        let Takes::Busy(seen) = run.take_many(1, ITEMS) else {
            panic!("a used-up run is busy until the crosser stocks");
        };
        // The crosser keeps its fourth item from the next run (item 0).
        assert_eq!(run.stock(Some(11), 1, ITEMS), None);
        assert_ne!(run.0.load_relaxed() & !COUNT_MASK, seen & !COUNT_MASK);
        run.wait_for_stock(seen);
        assert_eq!(
            run.take_many(7, ITEMS),
            Takes::Items {
                base: 11,
                first: 1,
                n: 7,
                stock: false
            }
        );
        // An add that ends exactly at the end took items and does not stock; the next does.
        assert_eq!(run.take_many(1, ITEMS), Takes::Stock);
        // A parked word: adds go elsewhere until one reaches RECHECK.
        assert_eq!(run.stock(None, 1, ITEMS), None);
        let mut count = 0;
        loop {
            match run.take_many(5, ITEMS) {
                Takes::Parked => count += 5,
                Takes::Stock => break,
                other => panic!("{other:?}"),
            }
        }
        assert!(count <= RECHECK && RECHECK < count + 5, "{count}");
        // A clear leaves an empty word: its first add stocks at once.
        assert_eq!(run.clear(ITEMS), None);
        assert_eq!(run.take_many(2, ITEMS), Takes::Stock);
        // A waiter on an empty word whose stocker empties it again (its bins were not fit for
        // a run) sees the swap, although the upper bits did not change, and its next add
        // stocks. Watching the upper bits alone, it waited for ever.
        let Takes::Busy(seen) = run.take_many(3, ITEMS) else {
            panic!("the first add stocks; the next waits");
        };
        assert_eq!(run.clear(ITEMS), None);
        run.wait_for_stock(seen);
        assert_eq!(run.take_many(3, ITEMS), Takes::Stock);
        // Adds of other waiters meanwhile do not end the wait; a stock does.
        let Takes::Busy(seen) = run.take_many(1, ITEMS) else {
            panic!("busy while the stocker works");
        };
        assert!(matches!(run.take_many(4, ITEMS), Takes::Busy(_)));
        assert_eq!(run.0.load_relaxed() & !COUNT_MASK, seen & !COUNT_MASK);
        assert!(run.0.load_relaxed() & COUNT_MASK >= seen & COUNT_MASK);
        run.stock(Some(3), 3, ITEMS);
        run.wait_for_stock(seen);
    }

    #[test]
    fn a_guarded_swap_gives_back_first_then_names_the_run_closed_then_opens_it() {
        let run = Run::new();
        assert_eq!(run.take(ITEMS), Take::Stock);
        let none = |_: Leftover| panic!("nothing to give back");
        assert!(run.replace(Next::Run { base: 4, kept: 1 }, ITEMS, true, none, || {}));
        let look = run.look();
        assert_eq!((look.base, look.taken, look.draining), (Some(4), 1, false));
        assert_eq!(run.take(ITEMS), Take::Item { base: 4, index: 1 });
        // The next swap gives items 2.. back while the word still names run 4, draining, and
        // publishes run 9 while the word names it closed; takes meanwhile are busy.
        let mut seen = None;
        assert!(run.replace(
            Next::Run { base: 9, kept: 2 },
            ITEMS,
            true,
            |left| {
                let l = run.look();
                assert_eq!((l.base, l.draining), (Some(4), true));
                assert_eq!(run.take(ITEMS), Take::Elsewhere);
                seen = Some(left);
            },
            || {
                let l = run.look();
                assert_eq!((l.base, l.taken & 0xff, l.draining), (Some(9), 2, true));
                assert!(matches!(run.take_many(3, ITEMS), Takes::Busy(_)));
            },
        ));
        let back = Leftover {
            base: 4,
            first: 2,
            count: ITEMS - 2,
        };
        assert_eq!(seen, Some(back));
        // Open, with the count the swapper kept: the adds made while it was closed are gone.
        let look = run.look();
        assert_eq!((look.base, look.taken, look.draining), (Some(9), 2, false));
        assert_eq!(run.take(ITEMS), Take::Item { base: 9, index: 2 });
        // A flush that finds another swap under way does nothing.
        run.0.fetch_or_acq_rel(DRAIN);
        assert!(!run.replace(Next::Empty, ITEMS, false, none, || {}));
        run.0.fetch_and_acq_rel(!DRAIN);
        let mut left = None;
        assert!(run.replace(Next::Empty, ITEMS, false, |l| left = Some(l), || {}));
        assert_eq!(left.map(|l| (l.base, l.first)), Some((9, 3)));
        assert!(run.is_empty());
    }

    #[test]
    fn a_swap_counts_a_groups_items_as_handed_out() {
        let run = Run::new();
        assert_eq!(run.take_many(4, ITEMS), Takes::Stock);
        run.stock(Some(1), 4, ITEMS);
        assert!(matches!(
            run.take_many(2, ITEMS),
            Takes::Items { first: 4, n: 2, .. }
        ));
        let back = Leftover {
            base: 1,
            first: 6,
            count: ITEMS - 6,
        };
        assert_eq!(run.flush(ITEMS), Some(back));
    }
}
