//! A run: a few items that one stock set aside side by side, handed out one at a time to lone
//! lanes with one atomic add on a single word.
//!
//! Two kinds of runs use it: eight large blocks that one split of the buddy tree took
//! (`tbuddy::run`), and the slots of one bin carved full for an SM's lone lanes of a size
//! class (`ualloc::run`). A lone lane's own way to an item is a chain of dependent atomics
//! and fences (a climb of the tree; a semaphore, a read section and a claim for a slot). From
//! a run it costs one add, and the chain is paid once per run by the lane that stocks it.
//!
//! ```text
//!  word: │ base + 1 (40 bits; 0: no run) │ items handed out (24 bits) │
//!  take: fetch_add(1) → (run, i):  i < items               → item i of the run is ours;
//!        i == items, or no run and i == 0 or RECHECK       → we stock the next run;
//!        otherwise                                          → elsewhere (another lane stocks,
//!                                                             or memory is short: parked).
//!  stock / flush: swap in the new run (or a parked word, or none); the run swapped out has
//!        handed out exactly min(i, items) items, and the swapper gives back the rest.
//! ```
//!
//! A stocker that finds no memory for a run parks the word (no run, count 1): the lanes that
//! come next go elsewhere at the cost of their add, and the [`RECHECK`]-th of them looks for
//! memory again. Without parking, each of them would try to stock in turn (a heap with little
//! memory left would pay a look and a swap per request).
//!
//! Invariants (`docs/invariants.md`):
//! - TB14: every item of a run is handed out once, or given back once by the thread whose
//!   swap took the run out of its word; never both, never neither.

use crate::platform::Atomic64;

/// Bits of the count of items handed out.
const TAKEN_BITS: u32 = 24;
const TAKEN_MASK: u64 = (1 << TAKEN_BITS) - 1;
/// The largest base a word can name.
pub const MAX_BASE: u64 = (1 << (64 - TAKEN_BITS)) - 2;
/// The adds on a parked word after which one lane looks for memory again.
pub const RECHECK: u64 = 256;
/// A parked word: no run, one add counted (so that its adds never read 0 and stock at once).
const PARKED: u64 = 1;
/// Counts at or above this give their add back: while a stocker is slow, lanes that come
/// back again and again cannot carry the count into the base.
const CEILING: u64 = 1 << (TAKEN_BITS - 1);

/// The most items a run may hold (far below the ceiling).
pub const MAX_ITEMS: u32 = 1 << 16;
const _: () = assert!((MAX_ITEMS as u64) < CEILING && RECHECK < CEILING);

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
    pub fn take(&self, items: u32) -> Take {
        debug_assert!((1..=MAX_ITEMS).contains(&items));
        // Acquire: pairs with the swap that installed the run (what its stocker wrote about
        // the items, before we use ours).
        let word = self.0.fetch_add_acquire(1);
        let (base, taken) = (word >> TAKEN_BITS, word & TAKEN_MASK);
        if base != 0 && taken < items as u64 {
            return Take::Item {
                base: base - 1,
                index: taken as u32,
            };
        }
        let stock_at = if base != 0 {
            // The add that used the run up.
            items as u64
        } else if taken == 0 {
            // The first add on an empty word.
            0
        } else {
            // A parked word, time to look again.
            RECHECK
        };
        if taken == stock_at {
            Take::Stock
        } else {
            if taken >= CEILING {
                self.0.fetch_sub_relaxed(1);
            }
            Take::Elsewhere
        }
    }

    /// Install the run at `base` (at most [`MAX_BASE`]), whose item 0 the stocker keeps;
    /// `None`: park the word (no memory for a run). Returns the items of the run this swap
    /// took out that nobody was handed.
    pub fn stock(&self, base: Option<u64>, items: u32) -> Option<Leftover> {
        let word = match base {
            Some(base) => {
                debug_assert!(base <= MAX_BASE);
                (base + 1) << TAKEN_BITS | 1
            }
            None => PARKED,
        };
        // Release: what the stocker wrote about the run's items comes before a taker sees
        // it. Acquire: the run we displace was set aside before we give its items back.
        Self::leftover(self.0.swap_acq_rel(word), items)
    }

    /// Take the run out of its word (a trim): the items nobody was handed, to give back. A
    /// parked word is emptied too, so that the next `take` looks for memory at once.
    pub fn flush(&self, items: u32) -> Option<Leftover> {
        // Relaxed: a hint; a run that a `stock` installs after it is the next trim's.
        if self.0.load_relaxed() == 0 {
            return None;
        }
        // Acq_rel: as in `stock`.
        Self::leftover(self.0.swap_acq_rel(0), items)
    }

    fn leftover(word: u64, items: u32) -> Option<Leftover> {
        let (base, taken) = (word >> TAKEN_BITS, word & TAKEN_MASK);
        if base == 0 || taken >= items as u64 {
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
        assert_eq!(run.stock(Some(5), ITEMS), None);
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
        run.stock(Some(0), ITEMS);
        assert_eq!(run.take(ITEMS), Take::Item { base: 0, index: 1 });
        assert_eq!(run.take(ITEMS), Take::Item { base: 0, index: 2 });
        // A second stocker (after a flush raced a stock) displaces the run: items 3.. back.
        let back = Leftover {
            base: 0,
            first: 3,
            count: ITEMS - 3,
        };
        assert_eq!(run.stock(Some(MAX_BASE), ITEMS), Some(back));
        let back = Leftover {
            base: MAX_BASE,
            first: 1,
            count: ITEMS - 1,
        };
        assert_eq!(run.flush(ITEMS), Some(back));
        assert_eq!(run.flush(ITEMS), None);
        // A used-up run has nothing to give back.
        run.stock(Some(7), ITEMS);
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
        assert_eq!(run.stock(None, ITEMS), None);
        for _ in 1..RECHECK {
            assert_eq!(run.take(ITEMS), Take::Elsewhere);
        }
        assert_eq!(run.take(ITEMS), Take::Stock);
        assert_eq!(run.take(ITEMS), Take::Elsewhere);
        assert_eq!(run.stock(None, ITEMS), None);
        assert_eq!(run.take(ITEMS), Take::Elsewhere);
        // A trim empties a parked word, which gives nothing back: the next add looks at once.
        assert_eq!(run.flush(ITEMS), None);
        assert_eq!(run.take(ITEMS), Take::Stock);
        assert_eq!(run.stock(Some(2), ITEMS), None);
        assert_eq!(run.take(ITEMS), Take::Item { base: 2, index: 1 });
    }

    #[test]
    fn counts_stop_below_the_base_while_a_stocker_is_slow() {
        let run = Run::new();
        run.stock(Some(MAX_BASE), ITEMS);
        // Far more adds than items, as if the stocker never came back: the count stays
        // under the ceiling (plus the adds in flight), the base intact.
        run.0
            .store_relaxed((MAX_BASE + 1) << TAKEN_BITS | (CEILING - 2));
        for _ in 0..10 {
            assert_eq!(run.take(ITEMS), Take::Elsewhere);
        }
        let word = run.0.load_relaxed();
        assert_eq!(word >> TAKEN_BITS, MAX_BASE + 1);
        assert!(word & TAKEN_MASK <= CEILING, "{:#x}", word & TAKEN_MASK);
        assert_eq!(run.flush(ITEMS), None);
    }
}
