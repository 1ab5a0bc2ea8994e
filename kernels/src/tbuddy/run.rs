//! Runs of large blocks: [`RUN_BLOCKS`] blocks of one order that one
//! [`TBuddy::alloc_split`](super::TBuddy::alloc_split) took side by side, handed out one at a
//! time with one atomic add on a single word (a [`Run`](crate::run::Run) whose base is the
//! run's first page).
//!
//! The heap keeps one run per SM and per order of [`RUN_ORDERS`] for the lanes that ask for a
//! large block alone (a warp's lanes that ask together share a walk of the tree instead,
//! `TBuddy::alloc_together`). A lone lane's climb of the tree is a chain of dependent
//! atomics and fences: ncu found 13 MEMBARs and 18 L1 invalidations per large request of one
//! thread's mallocs (`docs/benchmarks.md`). From a run it costs one add, and the climb is paid
//! once per [`RUN_BLOCKS`] blocks.
//!
//! Each block of a run is a live block of its own in the tree (`alloc_split` leaves its inner
//! nodes Partial), so a block from a run is freed like any other and coalesces. Blocks a run
//! holds that nobody took are out of the tree until the run is swapped out: by the next
//! stock, or by a flush (the heap's `trim`, which `malloc` runs before it answers null), so
//! runs strand no memory that a request could need (INV(TB14)).

use crate::run::{self, Run};
use crate::tbuddy::PAGE_SHIFT;

/// log2 of the blocks in a run. 16 blocks: one thread's mallocs of 1-8192 B spent a fifth of
/// their stall samples in the stocks' climbs of the tree with eight (ncu, H100).
pub const RUN_LEVELS: u32 = 4;
/// Blocks in a run.
pub const RUN_BLOCKS: u32 = 1 << RUN_LEVELS;
/// The orders served from runs: `RUN_ORDERS.start..RUN_ORDERS.end` (8 KiB and 16 KiB blocks:
/// one run holds 128 or 256 KiB).
pub const RUN_ORDERS: core::ops::Range<u32> = 1..3;
/// Runs per SM.
pub const RUNS: usize = (RUN_ORDERS.end - RUN_ORDERS.start) as usize;

// Every page of the largest heap can start a run.
const _: () = assert!(1u64 << (super::MAX_LEVELS - 1) <= run::MAX_BASE);

/// What [`BlockRun::take`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// A block of the run, ours: its byte offset in the tree.
    Block(u64),
    /// The run is used up (or there is none) and this lane stocks the next one
    /// ([`BlockRun::stock`]).
    Stock,
    /// The run is used up and another lane stocks it, or memory is short: take the block
    /// from the tree.
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
pub struct BlockRun(Run);

impl BlockRun {
    /// No run (equal to all-zero memory).
    pub fn new() -> Self {
        Self(Run::new())
    }

    /// Take the next block of the run of blocks of `2^block_shift` bytes: one add.
    #[inline(always)]
    pub fn take(&self, block_shift: u32) -> Take {
        match self.0.take(RUN_BLOCKS) {
            run::Take::Item { base, index } => {
                Take::Block((base << PAGE_SHIFT) + ((index as u64) << block_shift))
            }
            run::Take::Stock => Take::Stock,
            run::Take::Elsewhere => Take::Elsewhere,
        }
    }

    /// Install the run whose blocks of `2^block_shift` bytes start at byte offset `first`
    /// (`None`: no memory for a run; the word is parked, `crate::run`); the stocker keeps the
    /// run's first block. Returns the blocks of the run this swap took out that nobody was
    /// handed.
    pub fn stock(&self, first: Option<u64>, block_shift: u32) -> Option<Leftover> {
        let left = self
            .0
            .stock(first.map(|offset| offset >> PAGE_SHIFT), 1, RUN_BLOCKS);
        left.map(|l| Self::blocks(l, block_shift))
    }

    /// Take the run out of its word (a trim): the blocks nobody was handed, to give back.
    pub fn flush(&self, block_shift: u32) -> Option<Leftover> {
        let left = self.0.flush(RUN_BLOCKS);
        left.map(|l| Self::blocks(l, block_shift))
    }

    fn blocks(left: run::Leftover, block_shift: u32) -> Leftover {
        Leftover {
            first: (left.base << PAGE_SHIFT) + ((left.first as u64) << block_shift),
            count: left.count,
        }
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
        // Scarce memory: the stocker installs no run, and the next takers go to the tree.
        assert_eq!(run.take(SHIFT), Take::Stock);
        assert_eq!(run.stock(None, SHIFT), None);
        assert_eq!(run.take(SHIFT), Take::Elsewhere);
    }
}
