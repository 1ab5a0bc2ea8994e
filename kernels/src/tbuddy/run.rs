//! Runs of large blocks: up to [`MAX_RUN_BLOCKS`] blocks of one order that one
//! [`TBuddy::alloc_split`](super::TBuddy::alloc_split) took side by side, handed out one at a
//! time with one atomic add on a single word (a [`Run`](crate::run::Run) whose base is the
//! run's first page).
//!
//! The heap keeps one run per SM and per order of [`RUN_ORDERS`] for the lanes that ask for a
//! large block alone (a warp's lanes that ask together share a walk of the tree instead,
//! `TBuddy::alloc_together`). A lone lane's climb of the tree is a chain of dependent
//! atomics and fences: ncu found 13 MEMBARs and 18 L1 invalidations per large request of one
//! thread's mallocs (`docs/benchmarks.md`). From a run it costs one add, and the climb is paid
//! once per run.
//!
//! How many blocks a run holds depends on the heap ([`run_levels`]): the runs of one order on
//! every SM together hold at most 1/[`RUN_SHARE`] of the heap's pages, and at most
//! [`MAX_RUN_BLOCKS`] blocks each; a heap too small for runs of [`MIN_RUN_LEVELS`] has none of
//! that order. In a 4 GiB heap on an H100 (132 SMs) a run holds 256 blocks of 8 KiB or 128 of
//! 16 KiB (2 MiB); in 1 GiB 64 and 32 (512 KiB); in 64 MiB four 8 KiB blocks and no 16 KiB run;
//! in 8 MiB none.
//!
//! Each block of a run is a live block of its own in the tree (`alloc_split` leaves its inner
//! nodes Partial), so a block from a run is freed like any other and coalesces. Blocks a run
//! holds that nobody took are out of the tree until the run is swapped out: by the next
//! stock, or by a flush (the heap's `trim`, which `malloc` runs before it answers null), so
//! runs strand no memory that a request could need (INV(TB14)).

use crate::run::{self, Run};
use crate::tbuddy::PAGE_SHIFT;

/// log2 of the most blocks in a run. One thread's mallocs of 1-8192 B (half of them 8 KiB
/// blocks from runs, in a 4 GiB heap) took 2.33 µs per call with runs of 16 blocks, 2.13 with
/// 32, 2.03 with 64, 2.00-2.02 with at most 128 and 1.98 with at most 256: every stock is a
/// climb of the tree (H100, `docs/benchmarks.md`). [`RUN_SHARE`] bounds what they hold.
pub const MAX_RUN_LEVELS: u32 = 8;
/// The most blocks in a run.
pub const MAX_RUN_BLOCKS: u32 = 1 << MAX_RUN_LEVELS;
/// log2 of the fewest blocks a run is worth: a heap whose share allows fewer has no runs of
/// that order, and its lone lanes take their blocks from the tree.
pub const MIN_RUN_LEVELS: u32 = 2;
/// The runs of one order on all SMs hold at most 1/`RUN_SHARE` of the heap's pages.
pub const RUN_SHARE: u64 = 8;

/// log2 of the blocks of order `order` in a run of a heap of `pages` pages with `arenas` SMs:
/// the most with `arenas × RUN_SHARE × 2^(order + levels) ≤ pages`, at most
/// [`MAX_RUN_LEVELS`]; 0 (no runs of this order) below [`MIN_RUN_LEVELS`]. Shifts and
/// compares only (no division on the lone lane's path).
#[inline(always)]
pub fn run_levels(pages: u64, arenas: u64, order: u32) -> u32 {
    let budget = arenas * RUN_SHARE;
    let mut levels = MAX_RUN_LEVELS;
    while levels >= MIN_RUN_LEVELS && budget << (order + levels) > pages {
        levels -= 1;
    }
    if levels < MIN_RUN_LEVELS { 0 } else { levels }
}

/// The orders served from runs: `RUN_ORDERS.start..RUN_ORDERS.end` (8 KiB and 16 KiB blocks).
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

    /// Take the next block of the run (of blocks of `2^block_shift` bytes): one add. The
    /// run's size comes back with the add, in the low bits of its first page
    /// ([`LevelsInBase`]): no lookup of the heap's size on this path.
    #[inline(always)]
    pub fn take(&self, block_shift: u32) -> Take {
        match self.0.take(LevelsInBase) {
            run::Take::Item { base, index } => {
                Take::Block(LevelsInBase::offset(base) + ((index as u64) << block_shift))
            }
            run::Take::Stock => Take::Stock,
            run::Take::Elsewhere => Take::Elsewhere,
        }
    }

    /// Install the run of `2^levels` blocks (`MIN_RUN_LEVELS..=MAX_RUN_LEVELS`) of
    /// `2^block_shift` bytes whose first starts at byte offset `first`, aligned to the run's
    /// size, as `alloc_split` gives it (`None`: no memory for a run; the word is parked,
    /// `crate::run`); the stocker keeps the run's first block. Returns the blocks of the run
    /// this swap took out that nobody was handed.
    pub fn stock(&self, first: Option<u64>, block_shift: u32, levels: u32) -> Option<Leftover> {
        let base = first.map(|offset| {
            debug_assert!((MIN_RUN_LEVELS..=MAX_RUN_LEVELS).contains(&levels));
            debug_assert!(offset.is_multiple_of(1 << (block_shift + levels)));
            LevelsInBase::base(offset, levels)
        });
        let left = self.0.stock(base, 1, LevelsInBase);
        left.map(|l| Self::blocks(l, block_shift))
    }

    /// Empty the word, for a lane asked to stock that found a block elsewhere (a stash): the
    /// next take stocks. Returns the blocks of the run this swap took out that nobody was
    /// handed, to give back.
    pub fn clear(&self, block_shift: u32) -> Option<Leftover> {
        let left = self.0.clear(LevelsInBase);
        left.map(|l| Self::blocks(l, block_shift))
    }

    /// Take the run out of its word (a trim): the blocks nobody was handed, to give back.
    pub fn flush(&self, block_shift: u32) -> Option<Leftover> {
        let left = self.0.flush(LevelsInBase);
        left.map(|l| Self::blocks(l, block_shift))
    }

    fn blocks(left: run::Leftover, block_shift: u32) -> Leftover {
        Leftover {
            first: LevelsInBase::offset(left.base) + ((left.first as u64) << block_shift),
            count: left.count,
        }
    }
}

/// A run's base in its word: the run's first page, whose low [`LEVEL_BITS`] bits (zero: a
/// run of at least `2^MIN_RUN_LEVELS` blocks of 8 KiB or more starts on a multiple of 8
/// pages) hold its `levels - MIN_RUN_LEVELS`.
#[derive(Clone, Copy)]
struct LevelsInBase;

/// Bits of a run's first page that hold its size.
const LEVEL_BITS: u32 = 3;
const LEVEL_MASK: u64 = (1 << LEVEL_BITS) - 1;
const _: () = assert!(
    MAX_RUN_LEVELS - MIN_RUN_LEVELS <= LEVEL_MASK as u32
        && RUN_ORDERS.start + MIN_RUN_LEVELS >= LEVEL_BITS
);

impl LevelsInBase {
    fn base(offset: u64, levels: u32) -> u64 {
        (offset >> PAGE_SHIFT) | (levels - MIN_RUN_LEVELS) as u64
    }

    #[inline(always)]
    fn offset(base: u64) -> u64 {
        (base & !LEVEL_MASK) << PAGE_SHIFT
    }
}

impl run::RunItems for LevelsInBase {
    #[inline(always)]
    fn of(self, base: u64) -> u32 {
        1 << (MIN_RUN_LEVELS + (base & LEVEL_MASK) as u32)
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
    const L: u32 = MAX_RUN_LEVELS;
    const RUN_BLOCKS: u32 = MAX_RUN_BLOCKS;

    #[test]
    fn run_levels_follow_the_heap() {
        // 4 GiB, 1 GiB, 64 MiB and 8 MiB of 4 KiB pages on 132 SMs.
        let levels = |pages: u64| [1, 2].map(|order| run_levels(pages, 132, order));
        assert_eq!(levels(1 << 20), [8, 7]);
        assert_eq!(levels(1 << 18), [6, 5]);
        assert_eq!(levels(1 << 14), [2, 0]);
        assert_eq!(levels(1 << 11), [0, 0]);
        // The share holds at every size: all SMs' runs of one order within 1/RUN_SHARE.
        for pages in (20..48).map(|k| (1u64 << (k / 2)) | k as u64) {
            for order in RUN_ORDERS {
                let l = run_levels(pages, 132, order);
                let fits = |l: u32| (132 * RUN_SHARE) << (order + l) <= pages;
                if l == 0 {
                    assert!(!fits(MIN_RUN_LEVELS));
                } else {
                    assert!((MIN_RUN_LEVELS..=MAX_RUN_LEVELS).contains(&l) && fits(l));
                    assert!(l == MAX_RUN_LEVELS || !fits(l + 1), "the most that fit");
                }
            }
        }
    }

    #[test]
    fn an_empty_word_asks_its_first_taker_to_stock() {
        let run = BlockRun::new();
        assert_eq!(run.take(SHIFT), Take::Stock);
        assert_eq!(run.take(SHIFT), Take::Elsewhere);
        // The stocker installs a run at 16 MiB and keeps its first block; the late adds above
        // are forgotten.
        assert_eq!(run.stock(Some(1 << 24), SHIFT, L), None);
        for i in 1..RUN_BLOCKS as u64 {
            assert_eq!(run.take(SHIFT), Take::Block((1 << 24) + (i << SHIFT)));
        }
        assert_eq!(run.take(SHIFT), Take::Stock);
        assert_eq!(run.take(SHIFT), Take::Elsewhere);
    }

    #[test]
    fn a_run_s_size_comes_back_with_each_add() {
        let run = BlockRun::new();
        assert_eq!(run.take(SHIFT), Take::Stock);
        // Four blocks at 64 KiB: three more to hand out, then the next stock.
        assert_eq!(run.stock(Some(1 << 16), SHIFT, MIN_RUN_LEVELS), None);
        for i in 1..4 {
            assert_eq!(run.take(SHIFT), Take::Block((1 << 16) + (i << SHIFT)));
        }
        assert_eq!(run.take(SHIFT), Take::Stock);
        // A bigger run displaces a smaller one that handed out one block: three come back.
        run.stock(Some(1 << 20), SHIFT, MIN_RUN_LEVELS);
        assert_eq!(
            run.stock(Some(2 << 20), SHIFT, MIN_RUN_LEVELS + 1),
            Some(Leftover {
                first: (1 << 20) + (1 << SHIFT),
                count: 3
            })
        );
        assert_eq!(
            run.flush(SHIFT),
            Some(Leftover {
                first: (2 << 20) + (1 << SHIFT),
                count: 7
            })
        );
    }

    #[test]
    fn a_swap_gives_back_exactly_the_blocks_nobody_took() {
        let run = BlockRun::new();
        assert_eq!(run.take(SHIFT), Take::Stock);
        run.stock(Some(0), SHIFT, L);
        assert_eq!(run.take(SHIFT), Take::Block(1 << SHIFT));
        assert_eq!(run.take(SHIFT), Take::Block(2 << SHIFT));
        // A second stocker (after a flush raced a stock) displaces the run: blocks 3.. back.
        assert_eq!(
            run.stock(Some(1 << 30), SHIFT, L),
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
        run.stock(Some(0), SHIFT, L);
        for _ in 1..RUN_BLOCKS + 3 {
            run.take(SHIFT);
        }
        assert_eq!(run.flush(SHIFT), None);
        // Scarce memory: the stocker installs no run, and the next takers go to the tree.
        assert_eq!(run.take(SHIFT), Take::Stock);
        assert_eq!(run.stock(None, SHIFT, L), None);
        assert_eq!(run.take(SHIFT), Take::Elsewhere);
    }
}
