//! A run: [`RUN_BLOCKS`] blocks of one order that one
//! [`TBuddy::alloc_split`](super::TBuddy::alloc_split) took side by side, handed out one at a
//! time with one atomic add on a single word.
//!
//! The heap keeps one run per SM and per order of [`RUN_ORDERS`] for the lanes that ask for a
//! large block alone (a warp's lanes that ask together share a walk of the tree instead,
//! `TBuddy::alloc_together`). A lone lane's climb of the tree is a chain of dependent
//! atomics and fences: ncu found 13 MEMBARs and 18 L1 invalidations per large request of one
//! thread's mallocs (`docs/benchmarks.md`). From a run it costs one add, and the climb is paid
//! once per [`RUN_BLOCKS`] blocks.
//!
//! ```text
//!  word: │ first page + 1 (32 bits; 0: no run) │ blocks handed out (32 bits) │
//!  take: fetch_add(1) → (run, i): i < RUN_BLOCKS → block i of the run is ours;
//!        i == RUN_BLOCKS, or no run and i == 0 → we stock the next run;
//!        otherwise → the tree (another lane is stocking it, or memory is scarce).
//!  stock / flush: swap in the new run (or none); the run swapped out has handed out
//!        exactly min(i, RUN_BLOCKS) blocks, and the swapper frees the rest (`Leftover`).
//! ```
//!
//! Each block of a run is a live block of its own in the tree (`alloc_split` leaves its inner
//! nodes Partial), so a block from a run is freed like any other and coalesces. Blocks a run
//! holds that nobody took are out of the tree until the run is swapped out: by the next
//! stock, or by a flush (the heap's `trim`, which `malloc` runs before it answers null), so
//! runs strand no memory that a request could need (INV(TB14)).
//!
//! Invariants (`docs/invariants.md`):
//! - TB14: every block of a run is handed out once, or given back once by the thread whose
//!   swap took the run out of its word; never both, never neither.

use crate::platform::Atomic64;
use crate::tbuddy::PAGE_SHIFT;

/// log2 of the blocks in a run.
pub const RUN_LEVELS: u32 = 3;
/// Blocks in a run.
pub const RUN_BLOCKS: u32 = 1 << RUN_LEVELS;
/// The orders served from runs: `RUN_ORDERS.start..RUN_ORDERS.end` (8 KiB and 16 KiB blocks:
/// one run holds 64 or 128 KiB).
pub const RUN_ORDERS: core::ops::Range<u32> = 1..3;
/// Runs per SM.
pub const RUNS: usize = (RUN_ORDERS.end - RUN_ORDERS.start) as usize;

const TAKEN_MASK: u64 = u32::MAX as u64;

/// What [`BlockRun::take`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// A block of the run, ours: its byte offset in the tree.
    Block(u64),
    /// The run is used up (or there is none) and this lane stocks the next one
    /// ([`BlockRun::stock`]).
    Stock,
    /// The run is used up and another lane stocks it: take the block from the tree.
    Elsewhere,
}

/// Blocks of a run that a swap took out of its word and that nobody was handed (INV(TB14)):
/// `count` blocks from byte offset `first`, for the swapper to give back to the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leftover {
    pub first: u64,
    pub count: u32,
}

/// One run's word (all-zero: no run; the first `take` stocks one).
#[repr(transparent)]
pub struct BlockRun(Atomic64);

impl BlockRun {
    /// No run (equal to all-zero memory).
    pub fn new() -> Self {
        Self(Atomic64::new(0))
    }

    /// Take the next block of the run of blocks of `2^block_shift` bytes: one add.
    #[inline(always)]
    pub fn take(&self, block_shift: u32) -> Take {
        // Acquire: pairs with the swap that installed the run (the stocker's split of the
        // tree's nodes happened before our block's free locks them).
        let word = self.0.fetch_add_acquire(1);
        let (page, taken) = (word >> 32, word & TAKEN_MASK);
        if page != 0 && taken < RUN_BLOCKS as u64 {
            Take::Block(((page - 1) << PAGE_SHIFT) + (taken << block_shift))
        } else if taken == (page != 0) as u64 * RUN_BLOCKS as u64 {
            // The add that used the run up, or the first add on an empty word.
            Take::Stock
        } else {
            Take::Elsewhere
        }
    }

    /// Install the run whose blocks of `2^block_shift` bytes start at byte offset `first`
    /// (`None`: no run, the next `take` stocks again); the stocker keeps the run's first
    /// block. Returns the blocks of the run this swap took out that nobody was handed.
    pub fn stock(&self, first: Option<u64>, block_shift: u32) -> Option<Leftover> {
        let word = match first {
            Some(offset) => ((offset >> PAGE_SHIFT) + 1) << 32 | 1,
            None => 0,
        };
        // Release: the run's nodes are split before a taker sees it. Acquire: the run we
        // displace was split before we give its blocks back.
        Self::leftover(self.0.swap_acq_rel(word), block_shift)
    }

    /// Take the run out of its word (a trim): the blocks nobody was handed, to give back.
    pub fn flush(&self, block_shift: u32) -> Option<Leftover> {
        // Relaxed: a hint; a run that a `stock` installs after it is the next trim's.
        if self.0.load_relaxed() >> 32 == 0 {
            return None;
        }
        // Acq_rel: as in `stock`.
        Self::leftover(self.0.swap_acq_rel(0), block_shift)
    }

    fn leftover(word: u64, block_shift: u32) -> Option<Leftover> {
        let (page, taken) = (word >> 32, word & TAKEN_MASK);
        if page == 0 || taken >= RUN_BLOCKS as u64 {
            return None;
        }
        Some(Leftover {
            first: ((page - 1) << PAGE_SHIFT) + (taken << block_shift),
            count: RUN_BLOCKS - taken as u32,
        })
    }
}

impl Default for BlockRun {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const SHIFT: u32 = PAGE_SHIFT + 1;

    #[test]
    fn an_empty_word_asks_its_first_taker_to_stock() {
        let run = BlockRun::new();
        assert_eq!(run.take(SHIFT), Take::Stock);
        assert_eq!(run.take(SHIFT), Take::Elsewhere);
        // The stocker installs a run at 1 MiB and keeps its first block; the late adds above
        // are forgotten.
        assert_eq!(run.stock(Some(1 << 20), SHIFT), None);
        for i in 1..RUN_BLOCKS as u64 {
            assert_eq!(run.take(SHIFT), Take::Block((1 << 20) + (i << SHIFT)));
        }
        assert_eq!(run.take(SHIFT), Take::Stock);
        assert_eq!(run.take(SHIFT), Take::Elsewhere);
    }

    #[test]
    fn a_swap_gives_back_exactly_the_blocks_nobody_took() {
        let run = BlockRun::new();
        assert_eq!(run.take(SHIFT), Take::Stock);
        run.stock(Some(0), SHIFT);
        assert_eq!(run.take(SHIFT), Take::Block(1 << SHIFT));
        assert_eq!(run.take(SHIFT), Take::Block(2 << SHIFT));
        // A second stocker (after a flush raced a stock) displaces the run: blocks 3.. back.
        assert_eq!(
            run.stock(Some(1 << 30), SHIFT),
            Some(Leftover {
                first: 3 << SHIFT,
                count: RUN_BLOCKS - 3
            })
        );
        assert_eq!(
            run.flush(SHIFT),
            Some(Leftover {
                first: (1 << 30) + (1 << SHIFT),
                count: RUN_BLOCKS - 1
            })
        );
        assert_eq!(run.flush(SHIFT), None);
        // A used-up run has nothing to give back.
        run.stock(Some(0), SHIFT);
        for _ in 1..RUN_BLOCKS + 3 {
            run.take(SHIFT);
        }
        assert_eq!(run.flush(SHIFT), None);
        // Scarce memory: the stocker installs no run, and the next taker tries again.
        assert_eq!(run.take(SHIFT), Take::Stock);
        assert_eq!(run.stock(None, SHIFT), None);
        assert_eq!(run.take(SHIFT), Take::Stock);
    }
}
