//! TBuddy: the coarse-grained allocator, a concurrent static buddy tree over a region of
//! `PAGE_SIZE << max_order` bytes, with one bulk semaphore per order (Gelado & Garland §TBuddy).
//!
//! ```text
//!  order 2            [1: Partial]                 node n: children 2n, 2n+1, parent n/2
//!                    /            \                order k holds nodes 2^(M-k) .. 2^(M-k+1)-1
//!  order 1     [2: Busy]          [3: Partial]     (M = max_order)
//!              /      \           /        \
//!  order 0  [4: B]  [5: B]    [6: Avail]  [7: Busy]    ← one block of PAGE_SIZE each
//!           └─ block of order 1 ─┘  page 2     page 3
//! ```
//! States (two bits of the node's `Atomic32`; bit 31 is the lock of the node's two children):
//! - **Available**: the block is free, and counted in its order's semaphore.
//! - **Busy**: the block is not free as a whole and nothing below it is: allocated, being split or
//!   merged by the thread that owns it, outside the heap, or inside a bigger whole block.
//! - **Partial**: the block is split; its children carry the state.
//!
//! Zeroed memory is a valid tree before init: every node Busy, every semaphore empty, so every
//! `alloc` returns `None` (INV(TB8)).
//!
//! # alloc(order k)
//! Two stages: first count a unit, then find it. `wait(1, 2)` on semaphore k; on `Acquired` a
//! node of order k is Available for us somewhere (INV(TB4)): the availability index
//! (`index.rs`) points to one from a scattered start and a CAS takes it Available→Busy. On
//! `MustRefill` we go up an order and try there; once an order j > k yields a node, we split it
//! down to k: at each order the node becomes Partial, its right child Available (`signal(1, 1)`
//! on the semaphore below, which we promised), and we keep the left child. If even the root
//! order must be refilled, the promises made on the way up are retracted one by one, each
//! order is tried once more on the way down (see below), and then the answer is `None`; no
//! thread ever waits for memory that does not exist.
//!
//! # free(offset, order k)
//! Lock the parent (the pair lock, INV(TB5)); if the buddy is Available, take one unit of order k
//! with `try_wait` and CAS the buddy Available→Busy: the pair merges, the parent becomes Busy
//! and is freed one order up (announced there first with a promise). Otherwise the block
//! becomes Available and `release(1)` counts it,
//! still under the lock, so the buddy's own free (which needs the same lock) sees it and merges.
//! A free that sees its buddy Available but gets no unit waits (lock dropped) until the buddy is
//! taken or the unit shows up (INV(TB1)).
//!
//! # A warp's requests together ([`TBuddy::alloc_together`])
//! The lanes of a warp that ask for one order share the blocks above instead of climbing one
//! by one: the leader takes, without waiting, the spare units each order has (those no
//! reserved waiter is owed) for the lanes still unserved, a block of order k + d serving `2^d`
//! lanes; the lanes split the blocks among themselves with plain stores (inner nodes Partial)
//! and only the last lane's spare halves become Available (INV(TB11)). Lanes left over take
//! the single path below. A walk holds units without a promise, so the tree counts walks in
//! flight, and a single-path attempt that one overlapped does not count toward out of memory
//! (INV(TB13)).
//!
//! # A warp's frees together ([`TBuddy::free_together`])
//! The lanes of a warp that free blocks of one order merge the buddies they both hold first,
//! without the pair lock (both halves are theirs), and free what is left on the single path
//! (INV(TB12)).
//!
//! # No false starvation
//! Two allocators that decide at once to refill one order may race for one block above; the
//! loser, about to fail at the root, walks back down retrying each order it promised to
//! ([`TBuddy::alloc`]), where the winner's split leaves a spare unit. A merging free announces
//! the merged block on the order above (a semaphore promise) before its halves stop being
//! counted, so pages in transit make allocators wait, not fail.
//!
//! # Invariants (`docs/invariants.md`; cited as `INV(TBn)`)
//! - TB1: two siblings are never both Available at quiescence.
//! - TB2: every descendant of an Available or Busy node is Busy.
//! - TB3: a leaf (order 0) is never Partial.
//! - TB4: for each order k, Available nodes ≥ C_k + units held (taken, node not yet claimed);
//!   equal at quiescence, where E_k = R_k = 0. A node is Available and indexed before its unit
//!   is counted, and a unit is taken before its node leaves Available.
//! - TB5: the pair lock (bit 31 of node p) is taken only by a thread freeing a child of p,
//!   which is then Partial; one lock at a time, never held while waiting.
//! - TB6: the availability index matches the node states at quiescence (bit n ⇔ node n
//!   Available; summary bit ⇔ word below non-zero).
//! - TB7: nodes wholly beyond the extent are Busy forever. In a fixed tree the extent is
//!   `usable_pages`, nodes straddling it are Partial forever, and init's Available nodes are the
//!   binary decomposition of `usable_pages`. A growable tree starts all Busy; a node straddling
//!   its extent is Busy until a `grow` below it makes it Partial.
//! - TB8: all-zero memory is a valid tree: all Busy, semaphores empty, every `alloc` is `None`.
//! - TB9: the free-page counter is the pages of Available blocks and of blocks in transit
//!   (being split or merged), less the pages reserved by allocators that have not found their
//!   block yet; at quiescence, exactly the pages of Available blocks. An allocation reserves
//!   its pages first and gives them back if it fails; a free adds them after the block is
//!   back in the tree. So the counter never promises pages that do not exist, and with K free
//!   pages at most K one-page requests get past it.
//! - TB10 (growable trees): a page is in the tree from the `grow` that adds it until the `take`
//!   that removes it. A node holding a page outside the tree is Busy or Partial, never
//!   Available, allocated or merging; `grow` adds only blocks wholly outside the tree, and
//!   `take` removes only whole free blocks.
//! - TB11 (group path): see `alloc_together`; spares are the right siblings on the last used
//!   leaf's path, counted after a warp sync; units are taken only beyond reservations.
//! - TB12 (group free): two lanes merge a pair only if they hold both halves; the left lane
//!   stores the parent Busy and holds it.
//! - TB13 (walks and exact out of memory): a walk is counted as started before its first take
//!   and as ended after its spares are signalled; `alloc` counts a failed attempt toward out of
//!   memory only if the counters were equal when it began and none started since.

pub mod index;
pub mod run;

use core::ops::Range;

use crate::bulk_semaphore::{BulkSemaphore, Fields, Global, Wait};
use crate::collective::Group;
use crate::platform::{self, Atomic32, Atomic64, Backoff};
use index::AvailIndex;

/// log2 of the page, the smallest block (order 0).
pub const PAGE_SHIFT: u32 = 12;
/// The smallest block TBuddy hands out.
pub const PAGE_SIZE: usize = 1 << PAGE_SHIFT;
/// Orders a tree may have: `max_order <= MAX_LEVELS - 1`, so a heap of up to
/// `PAGE_SIZE << (MAX_LEVELS - 1)` bytes (32 GiB).
pub const MAX_LEVELS: u32 = 24;
/// The largest `max_order`.
pub const MAX_ORDER: u32 = MAX_LEVELS - 1;
/// Units per refill of an order: one block of order k+1 makes two of order k.
pub const BATCH: u32 = 2;
/// How often the leader of [`TBuddy::alloc_together`] walks the orders for blocks before the
/// lanes still unserved take the single path.
pub const GROUP_WALKS: u32 = 32;
/// The longest pause between two of those walks.
pub const GROUP_SLEEP_NS: u32 = 2_048;
/// How often a one-page `alloc` that holds a page reservation searches before it gives up.
/// The page exists (INV(TB9)), so a search fails only while it is in transit; the bound is a
/// safety net against a hang, far above what transit needs.
pub const SEARCH_TRIES: u32 = 1000;

// Node indices are u32 (`2^MAX_LEVELS` of them), block offsets fit u64.
const _: () = assert!(MAX_LEVELS < u32::BITS);
// INV(SEM2): an order of `2^(MAX_ORDER - k)` nodes holds at most half of them Available (TB1:
// siblings never both, except a pair in a free that is about to merge, one per resident
// thread); the semaphore's C must hold that.
const _: () =
    assert!((1u64 << (MAX_ORDER - 1)) + (1 << 19) <= Fields::<Global>::MAX_AVAILABLE as u64);
const _: () = assert!(MAX_ORDER + PAGE_SHIFT < u64::BITS);

/// Node state: Busy. Zero, so that zeroed memory is all Busy (INV(TB8)).
const BUSY: u32 = 0;
/// Node state: Available.
const AVAILABLE: u32 = 1;
/// Node state: Partial (split).
const PARTIAL: u32 = 2;
/// The state bits of a node word.
const STATE_MASK: u32 = 0b11;
/// The pair lock of the node's children (INV(TB5)).
const LOCKED: u32 = 1 << 31;
const _: () = assert!(STATE_MASK & LOCKED == 0 && PARTIAL & !STATE_MASK == 0);

/// One semaphore alone on a cache line: order 0 is hammered, its neighbours should not be.
#[repr(C, align(128))]
struct OrderSemaphore(BulkSemaphore);

/// The free-page counter, alone on its cache line: every `alloc` and `free` adds to it.
#[repr(C, align(128))]
struct PageCounter(Atomic64);

/// The shared part of a TBuddy: one semaphore per order and the geometry. Zeroed memory is a
/// valid, empty header; [`TBuddy::init_finish`] fills it.
#[repr(C)]
pub struct TBuddyHeader {
    /// Semaphore k counts Available nodes of order k (INV(TB4)).
    sems: [OrderSemaphore; MAX_LEVELS as usize],
    /// Pages in free blocks, less the pages that allocators have reserved and not yet taken
    /// (INV(TB9)): the cheap test that turns an allocation away when memory is out.
    free_pages: PageCounter,
    /// Pages in the tree: set by `init_finish`, raised by [`TBuddy::grow`], lowered by
    /// [`TBuddy::take`] (0 before init).
    usable_pages: Atomic64,
    /// Pages the tree may ever hold (`init_finish`'s pages, or a growable tree's extent): nodes
    /// wholly beyond stay Busy forever (INV(TB7)).
    extent_pages: Atomic64,
    /// Nonzero for a growable tree ([`TBuddy::init_growable_finish`]): ranges of the extent
    /// come and go with [`TBuddy::grow`] and [`TBuddy::take`].
    growable: Atomic32,
    /// Group walks (`TBuddy::alloc_together`) started and ended: a walk holds units without a
    /// promise, so a single-path attempt that a walk overlapped may have missed units that are
    /// about to come back (INV(TB13)). Two 64-bit counters, which never wrap in practice (one
    /// word with two 32-bit halves would carry from one into the other after 2^32 walks).
    walks_started: Atomic64,
    walks_ended: Atomic64,
}

impl TBuddyHeader {
    /// An empty header (what zeroed memory holds), for host tests.
    pub fn new() -> Self {
        Self {
            sems: core::array::from_fn(|_| OrderSemaphore(BulkSemaphore::new(0))),
            free_pages: PageCounter(Atomic64::new(0)),
            usable_pages: Atomic64::new(0),
            extent_pages: Atomic64::new(0),
            growable: Atomic32::new(0),
            walks_started: Atomic64::new(0),
            walks_ended: Atomic64::new(0),
        }
    }

    /// The semaphore of `order`.
    pub fn semaphore(&self, order: u32) -> &BulkSemaphore {
        &self.sems[order as usize].0
    }

    /// The free-page counter (INV(TB9)), as a signed snapshot: it dips below zero while
    /// reservations that failed are being given back.
    pub fn free_pages(&self) -> i64 {
        self.free_pages.0.load_relaxed() as i64
    }
}

impl Default for TBuddyHeader {
    fn default() -> Self {
        Self::new()
    }
}

/// A tree node, by heap index: the root is 1, node n has children 2n and 2n+1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Node(u32);

impl Node {
    const ROOT: Node = Node(1);

    fn parent(self) -> Node {
        Node(self.0 >> 1)
    }
    fn buddy(self) -> Node {
        Node(self.0 ^ 1)
    }
    fn left(self) -> Node {
        Node(self.0 << 1)
    }
    fn right(self) -> Node {
        Node((self.0 << 1) | 1)
    }
}

/// A view of one buddy tree: its header and its node words. Cheap to copy.
#[derive(Clone, Copy)]
pub struct TBuddy<'a> {
    header: &'a TBuddyHeader,
    /// `2^(max_order+1)` node words (index 0 unused), then the availability index.
    nodes: &'a [Atomic32],
    index: AvailIndex<'a>,
    max_order: u32,
}

impl<'a> TBuddy<'a> {
    /// Node words of a tree of `max_order`: one per node (heap order, index 0 unused) plus the
    /// availability index.
    pub const fn node_words(max_order: u32) -> usize {
        assert!(max_order <= MAX_ORDER);
        (2usize << max_order) + index::index_words(max_order + 1)
    }

    /// The tree whose node words are `nodes` (at least `node_words(max_order)` words, for the
    /// largest such `max_order`). Works on zeroed memory, before init.
    pub fn new(header: &'a TBuddyHeader, nodes: &'a [Atomic32]) -> Self {
        assert!(
            nodes.len() >= Self::node_words(0),
            "TBuddy: node array too small"
        );
        // SAFETY: checked just above.
        unsafe { Self::new_unchecked(header, nodes) }
    }

    /// [`new`](Self::new) without its check, and with no branch: for the view that every
    /// `malloc` and `free` builds (`DeviceHeap::from_base`), where a branch between the loads of
    /// the heap's header split them into two round trips to memory.
    ///
    /// # Safety
    /// `nodes` holds at least `node_words(0)` words.
    #[inline(always)]
    pub unsafe fn new_unchecked(header: &'a TBuddyHeader, nodes: &'a [Atomic32]) -> Self {
        // node_words(m) lies in [2^(m+1), 2^(m+2)): the index is far smaller than the tree.
        let len = nodes.len();
        let mut max_order = (usize::BITS - 1 - len.leading_zeros() - 1).min(MAX_ORDER);
        if (2usize << max_order) + index::index_words(max_order + 1) > len {
            max_order -= 1;
        }
        let tree_words = 2usize << max_order;
        // SAFETY: `tree_words <= len` by the choice of `max_order` (the caller's bound makes it
        // at least 0).
        let (tree, rest) = unsafe {
            (
                nodes.get_unchecked(..tree_words),
                nodes.get_unchecked(tree_words..),
            )
        };
        Self {
            header,
            nodes: tree,
            index: AvailIndex::new(rest, max_order + 1),
            max_order,
        }
    }

    /// The largest order: the root's.
    pub fn max_order(&self) -> u32 {
        self.max_order
    }

    // ---- geometry -------------------------------------------------------------------------

    /// The first node of `order`.
    #[inline(always)]
    fn first_of(&self, order: u32) -> u32 {
        1 << (self.max_order - order)
    }

    /// The node of the block of `order` at byte `offset`.
    #[inline(always)]
    fn node_at(&self, offset: u64, order: u32) -> Node {
        Node(self.first_of(order) + (offset >> (order + PAGE_SHIFT)) as u32)
    }

    /// Byte offset of `node`'s block, `node` being of `order`.
    #[inline(always)]
    fn offset_of(&self, node: Node, order: u32) -> u64 {
        ((node.0 - self.first_of(order)) as u64) << (order + PAGE_SHIFT)
    }

    /// The order of `node`.
    #[inline(always)]
    fn order_of(&self, node: Node) -> u32 {
        self.max_order - (u32::BITS - 1 - node.0.leading_zeros())
    }

    #[inline(always)]
    fn word(&self, node: Node) -> &'a Atomic32 {
        &self.nodes[node.0 as usize]
    }

    #[inline(always)]
    fn sem(&self, order: u32) -> &'a BulkSemaphore {
        self.header.semaphore(order)
    }

    // ---- init -----------------------------------------------------------------------------

    /// The state `node` has right after init for `usable_pages` (INV(TB7)): the Available nodes
    /// are the binary decomposition of `[0, usable_pages)`; nodes outside are Busy, nodes that
    /// straddle the end are Partial.
    fn initial_state(&self, node: Node, usable_pages: u64) -> u32 {
        if node.0 == 0 {
            return BUSY;
        }
        let order = self.order_of(node);
        let start = self.offset_of(node, order) >> PAGE_SHIFT;
        let end = start + (1u64 << order);
        if end <= usable_pages {
            let whole_parent = node != Node::ROOT && {
                let parent_start = start & !((2u64 << order) - 1);
                parent_start + (2u64 << order) <= usable_pages
            };
            if whole_parent { BUSY } else { AVAILABLE }
        } else if start < usable_pages {
            PARTIAL
        } else {
            BUSY
        }
    }

    /// The Available node of `order` right after init, if any: bit `order` of `usable_pages`
    /// set means the block `[usable_pages & !(2^(order+1)-1), +2^order)` is one.
    fn initial_available(&self, order: u32, usable_pages: u64) -> Option<Node> {
        if (usable_pages >> order) & 1 == 0 {
            return None;
        }
        Some(Node(
            self.first_of(order) + ((usable_pages >> order) - 1) as u32,
        ))
    }

    /// Initialization, step 1: write node words `range` (indices into the `nodes` slice given to
    /// [`new`](Self::new), so `0..node_words(max_order)` in all) for a heap of `usable_pages`
    /// pages (`<= 2^max_order`; the rest is Busy forever). Threads may split the words between
    /// them in disjoint ranges; all must finish before [`init_finish`](Self::init_finish).
    pub fn init_nodes(&self, range: Range<usize>, usable_pages: u64) {
        assert!(
            usable_pages <= 1u64 << self.max_order,
            "TBuddy: more pages than the tree covers"
        );
        let tree_words = self.nodes.len();
        for i in range {
            if i < tree_words {
                let state = self.initial_state(Node(i as u32), usable_pages);
                self.nodes[i].store_relaxed(state);
            } else {
                let available =
                    (0..=self.max_order).filter_map(|o| self.initial_available(o, usable_pages));
                let value = self
                    .index
                    .initial_word(i - tree_words, available.map(|n| n.0));
                self.index.store_word(i - tree_words, value);
            }
        }
    }

    /// Initialization, step 2 (one thread, after every `init_nodes`): fill the semaphores,
    /// which must be empty (a zeroed header). A kernel boundary (or a join on the host) between
    /// the steps orders the node words before the first `alloc`.
    pub fn init_finish(&self, usable_pages: u64) {
        for order in 0..=self.max_order {
            debug_assert_eq!(
                self.sem(order).counters(),
                (0, 0, 0),
                "init_finish on a used header"
            );
            let available = self.initial_available(order, usable_pages).is_some();
            // INV(TB4): C = number of Available nodes of the order.
            self.sem(order).release(available as u32);
        }
        // INV(TB9): every page starts free.
        self.header.free_pages.0.store_relaxed(usable_pages);
        self.header.extent_pages.store_relaxed(usable_pages);
        self.header.usable_pages.store_release(usable_pages);
    }

    /// Initialization of a growable tree, step 2 (after `init_nodes` with 0 usable pages, which
    /// leaves every node Busy and the index empty): the tree starts empty and may later hold
    /// any page below `extent_pages` (`<= 2^max_order`), added with [`grow`](Self::grow).
    pub fn init_growable_finish(&self, extent_pages: u64) {
        assert!(
            extent_pages <= 1u64 << self.max_order,
            "TBuddy: more pages than the tree covers"
        );
        self.header.free_pages.0.store_relaxed(0);
        self.header.extent_pages.store_relaxed(extent_pages);
        self.header.growable.store_relaxed(1);
        self.header.usable_pages.store_release(0);
    }

    // ---- growth ---------------------------------------------------------------------------

    /// Add the block of `order` at byte `offset` to the tree, as if it were freed: it merges
    /// with free buddies and can be allocated at once. Safe while other threads allocate and
    /// free, and while other `grow`s add other blocks.
    ///
    /// The block must lie below the extent and hold no page of the tree: never added before, or
    /// taken out whole by [`take`](Self::take) (INV(TB10)). Then every node inside it is Busy or
    /// Partial left over from an earlier life, and every ancestor that is Busy is Busy only
    /// because it holds pages outside the tree: no thread allocates, splits or merges any of
    /// them, since an allocated, split or merging block holds only pages of the tree.
    pub fn grow(&self, offset: u64, order: u32) {
        debug_assert!(order <= self.max_order);
        debug_assert_eq!(offset & ((PAGE_SIZE as u64) << order).wrapping_sub(1), 0);
        debug_assert!(
            (offset >> PAGE_SHIFT) + (1u64 << order) <= self.header.extent_pages.load_relaxed()
        );
        let node = self.node_at(offset, order);
        // INV(TB2): the block is about to be freed whole, so everything below it must be Busy.
        // Nodes split in an earlier life (before `take`) may still say Partial; nobody else
        // reads them.
        self.word(node).store_relaxed(BUSY);
        self.reset_below(node);
        // INV(TB5): a freed node's ancestors are Partial. Top-down, so that each conversion
        // lands under a Partial parent; a CAS, because a concurrent `grow` under the same
        // ancestor may convert it first (then it is Partial, and maybe locked, already).
        let depth = self.max_order - order;
        for level in 0..depth {
            let ancestor = Node(node.0 >> (depth - level));
            // Release: a `free` that locks this word sees the Busy children stores above.
            let _ = self.word(ancestor).compare_exchange_acq_rel(BUSY, PARTIAL);
        }
        self.header.usable_pages.fetch_add_relaxed(1u64 << order);
        self.free(offset, order);
    }

    /// Store Busy over every Partial node strictly below `top`, visiting only Partial nodes
    /// (a stackless depth-first walk; a Busy node's subtree is Busy already, INV(TB2)).
    fn reset_below(&self, top: Node) {
        if self.order_of(top) == 0 {
            return;
        }
        let mut cur = top.left();
        loop {
            let word = self.word(cur);
            if word.load_relaxed() & STATE_MASK == PARTIAL {
                word.store_relaxed(BUSY);
                // INV(TB3): a Partial node has children.
                cur = cur.left();
                continue;
            }
            // Next: the right sibling, after climbing out of finished right subtrees.
            while cur.0 & 1 == 1 {
                cur = cur.parent();
                if cur == top {
                    return;
                }
            }
            cur = cur.buddy();
        }
    }

    /// Take a free block of `order` out of the tree for good (a growable heap unmaps it): an
    /// [`alloc`](Self::alloc) that also lowers the tree's page count. `None` when no block of
    /// that order is free. The block may come back later with [`grow`](Self::grow).
    pub fn take(&self, order: u32) -> Option<u64> {
        let offset = self.alloc(order)?;
        self.header.usable_pages.fetch_sub_relaxed(1u64 << order);
        Some(offset)
    }

    /// Pages the tree may ever hold.
    pub fn extent_pages(&self) -> u64 {
        self.header.extent_pages.load_relaxed()
    }

    /// Serial init (host tests): `init_nodes` over everything, then `init_finish`.
    pub fn init(&self, usable_pages: u64) {
        self.init_nodes(0..Self::node_words(self.max_order), usable_pages);
        self.init_finish(usable_pages);
    }

    // ---- alloc ----------------------------------------------------------------------------

    /// A block of `PAGE_SIZE << order` bytes, aligned to its size: its byte offset from the
    /// region's start. `None` when out of memory (or `order > max_order`); never hangs.
    ///
    /// First the pages are reserved on the free-page counter (INV(TB9)): one add, which turns
    /// every request beyond the free pages away at once, so a heap that runs out costs the
    /// losers one atomic each instead of a climb to the root. A thread holding a reservation
    /// then looks for a block ([`alloc_block`](Self::alloc_block)). For one page that always
    /// succeeds in the end: a reserved page is free, maybe in transit in another thread's split
    /// or merge, so a search that came back empty is repeated (after a back-off, at most
    /// [`SEARCH_TRIES`] times). Larger orders give up sooner: free pages need not be
    /// contiguous.
    pub fn alloc(&self, order: u32) -> Option<u64> {
        if order > self.max_order {
            return None;
        }
        let pages = 1u64 << order;
        if !self.reserve_pages(pages) {
            return None;
        }
        let tries = if order == 0 { SEARCH_TRIES } else { 2 };
        let mut backoff = Backoff::new();
        let mut failed = 0;
        while failed < tries {
            // Ended, then started: equal means no walk was in flight between the two loads.
            // Acquire: pairs with the release that ends a walk (its spares are Available).
            let ended = self.header.walks_ended.load_acquire();
            let started = self.header.walks_started.load_acquire();
            if let Some(offset) = self.alloc_block(order) {
                return Some(offset);
            }
            // INV(TB13): an attempt that a group walk overlapped may have missed units the
            // walk holds without a promise; it does not count toward out of memory. A walk
            // whose take our attempt saw is counted here (its start is fenced before its
            // takes, and our semaphore operations are acquires).
            let now = self.header.walks_started.load_acquire();
            if started == ended && now == started {
                failed += 1;
            }
            backoff.snooze();
        }
        // INV(TB9): the pages were not taken; give the reservation back.
        self.header.free_pages.0.fetch_add_relaxed(pages);
        None
    }

    /// `2^levels` blocks of `order` side by side, in one allocation: [`alloc`](Self::alloc) of
    /// `order + levels`, whose inner nodes above `order` then go from Busy to Partial, top
    /// down, so that each block of `order` is a live block of its own, freed on its own
    /// (INV(TB2): the blocks stay Busy; INV(TB5): a freed block's parent is Partial). Plain
    /// stores: the block is ours, and nobody else writes its nodes while it is allocated
    /// (claims CAS only Available words, and a pair lock is taken only by a free of a block
    /// below it). Returns the first block's offset.
    pub fn alloc_split(&self, order: u32, levels: u32) -> Option<u64> {
        let offset = self.alloc(order + levels)?;
        // Relaxed: the fence below publishes them all.
        self.store_inner(self.node_at(offset, order + levels), levels, PARTIAL);
        // Release (fence form, one MEMBAR for the run instead of one per inner node): pairs
        // with the acquire `lock` of the free of a block below, which reached the block through
        // a publication after this fence.
        platform::fence_acq_rel();
        Some(offset)
    }

    /// Store `state` (relaxed), top down, into the inner nodes of the block at `top` made of
    /// `2^levels` blocks: `top` and its descendants on the `levels - 1` levels below it (none
    /// for `levels == 0`). The caller holds the block, so nobody else writes them (INV(TB2),
    /// INV(TB5)).
    #[inline(always)]
    fn store_inner(&self, top: Node, levels: u32, state: u32) {
        for depth in 0..levels {
            // A level's nodes are side by side: one bounds check per level, not per node (a
            // run's 127 inner nodes, checked one by one, made one thread's mallocs 2.5%
            // slower with the run's size known only at run time; H100).
            let first = (top.0 << depth) as usize;
            for word in &self.nodes[first..first + (1 << depth)] {
                word.store_relaxed(state);
            }
        }
    }

    /// Give back the last `count` blocks of `order` of a run that
    /// [`alloc_split`](Self::alloc_split) made, the first at byte `first`, all held by the
    /// caller: merged into the fewest
    /// aligned blocks first (at most one per level of the run), each freed once. The inner
    /// nodes inside a merged block go from Partial to Busy with plain stores, as in
    /// [`free_together`](Self::free_together): every block below them is ours (INV(TB2),
    /// INV(TB12)).
    pub fn free_run_tail(&self, first: u64, order: u32, count: u32) {
        let shift = order + PAGE_SHIFT;
        let (mut index, end) = (first >> shift, (first >> shift) + count as u64);
        while index < end {
            // The largest block at `index` that is aligned to its size and ends by `end`.
            let levels = index
                .trailing_zeros()
                .min(63 - (end - index).leading_zeros());
            self.store_inner(self.node_at(index << shift, order + levels), levels, BUSY);
            self.free(index << shift, order + levels);
            index += 1 << levels;
        }
    }

    /// Reserve `pages` on the free-page counter: one subtraction, rolled back when the counter
    /// was short (INV(TB9)).
    fn reserve_pages(&self, pages: u64) -> bool {
        self.reserve_pages_above(pages, 0)
    }

    /// [`reserve_pages`](Self::reserve_pages), which also fails unless `margin` pages stay free
    /// after it.
    fn reserve_pages_above(&self, pages: u64, margin: u64) -> bool {
        let free = &self.header.free_pages.0;
        // Relaxed: an account only; the blocks themselves are published through the node words
        // and the semaphores.
        let old = free.fetch_sub_relaxed(pages) as i64;
        if old >= (pages + margin) as i64 {
            return true;
        }
        free.fetch_add_relaxed(pages);
        false
    }

    /// One search for a block of `order` (Gelado & Garland's TBuddy allocation): count a unit
    /// on the order's semaphore, climbing to refill it where it is empty, then find and split.
    fn alloc_block(&self, order: u32) -> Option<u64> {
        // Stage 1: count a unit at the lowest order that has one, promising a refill to every
        // order passed on the way (INV(SEM4)).
        let mut have = order;
        loop {
            match self.sem(have).wait(1, BATCH) {
                Wait::Acquired => break,
                Wait::MustRefill if have < self.max_order => have += 1,
                Wait::MustRefill => {
                    // Nothing at the root's order, and nothing above it can refill it.
                    self.sem(have).retract(BATCH - 1);
                    have = self.retry_downwards(have, order)?;
                    break;
                }
            }
        }
        // Stage 2: find the unit, then split it down, keeping the left half each time. Each
        // right half is counted as soon as it is Available and indexed (INV(TB4)), so that the
        // waiters of that order go on at once (a fresh heap's chunk refills climb many orders).
        let mut node = self.claim(have);
        while have > order {
            self.split(node);
            have -= 1;
            self.sem(have).signal(BATCH - 1, BATCH - 1);
            node = node.left();
        }
        Some(self.offset_of(node, order))
    }

    /// [`alloc`](Self::alloc) for every lane of `group`, all asking for `order` (the heap groups
    /// a warp's large requests by order): the lanes share the blocks above, so a warp climbs
    /// once and nobody waits.
    ///
    /// The leader reserves the group's pages with one add, then walks up from `order` and
    /// takes from each order's semaphore, without waiting, as many units as the lanes still
    /// unserved need there: a block of order `order + d` serves `2^d` lanes. It stops at the
    /// first order that serves the rest. The blocks it took cover the lanes in
    /// runs, smallest order first; only the last block may be partly used (its first lanes'
    /// worth of leaves). The first lane of each run claims the run's block; every lane takes
    /// its leaf of it and marks Partial the inner nodes whose first leaf it holds (INV(TB2),
    /// INV(TB5): each is written once). The block's spare halves, the right siblings on the
    /// last lane's path, become Available and are counted by that lane after a group sync, so
    /// that everything above them is Partial first (INV(TB4)); there is at most one per order,
    /// as in a split (INV(TB1)).
    ///
    /// No reservation on any semaphore and no spinning: where that serves fewer lanes than the
    /// group has (units in transit, or none at the root), the rest fall back to
    /// [`alloc`](Self::alloc) one by one, with its exact out-of-memory answer. The walk takes
    /// only units that no reserved waiter of the single path is owed (`take_spare`). The group
    /// path runs only while a quarter of the tree's pages stay free after its reservation;
    /// nearer the end of memory every lane takes the single path. ncu on 2^17 requests of
    /// 8 KiB before it: 73% of the stall samples were lanes polling one order's semaphore for
    /// units that came one split at a time. Collective (the `collective` module's convergence
    /// rules).
    pub fn alloc_together(&self, group: &Group, order: u32) -> Option<u64> {
        if order > self.max_order {
            return None;
        }
        let n = group.size();
        let margin = self.header.usable_pages.load_relaxed() / 4;
        let reserved = group.is_leader() && self.reserve_pages_above((n as u64) << order, margin);
        if group.broadcast_u32(reserved as u32) == 0 {
            return self.alloc(order);
        }
        if group.is_leader() {
            // INV(TB13): the walk is announced before it takes a unit. Relaxed add, then a
            // fence: every take below is then a release of the announcement.
            self.header.walks_started.fetch_add_relaxed(1);
            platform::fence_acq_rel();
        }
        // The plan (leader): bit r of `starts` set where the run of lane rank r begins;
        // `covered` lanes are served; the last run's block is of order `top`.
        let (mut starts, mut covered, mut top) = (0u32, 0u32, order);
        if group.is_leader() {
            let mut backoff = Backoff::new();
            for walk in 0..GROUP_WALKS {
                if walk > 0 {
                    // The pages are reserved, so they exist (INV(TB9)), in transit: another
                    // group's spare halves are about to be counted (a fresh heap's first
                    // blocks come one split at a time). Walk again after a moment, but only
                    // while a quarter of the tree is free, the bound the group path starts
                    // under: a group that walks holds its reservation and the units it took,
                    // which a fuller heap may need elsewhere. (The bound was half the tree
                    // until 2026-11-25: with spare chunks stocked at init, f_large's fills of
                    // half the heap crossed it, and their last groups fell to the single path:
                    // 16 KiB × 2^17 took 9–17 ms instead of 0.26–0.34.)
                    if self.header.free_pages() < margin as i64 {
                        break;
                    }
                    platform::nanosleep(GROUP_SLEEP_NS.min(backoff.current_ns() << 3));
                    backoff.grow();
                }
                let mut level = order;
                loop {
                    let d = level - order;
                    let need = n - covered;
                    // Only units no reserved waiter is owed (INV(SEM6) holds for the waiters).
                    let got = self.sem(level).take_spare(need.div_ceil(1 << d.min(31)));
                    // Runs in the order taken; a walk that ends short took whole blocks only
                    // (fewer than it needed at each order), so only the very last run may be
                    // partly used, and a run's length gives its order, the last run's `top`.
                    for _ in 0..got {
                        starts |= 1 << covered;
                        covered += (n - covered).min(1 << d.min(31));
                    }
                    if got > 0 {
                        top = level;
                    }
                    if covered == n || level == self.max_order {
                        break;
                    }
                    level += 1;
                }
                if covered == n {
                    break;
                }
            }
            // INV(TB9): the pages of the lanes left over go back; they reserve their own.
            if covered < n {
                self.header
                    .free_pages
                    .0
                    .fetch_add_relaxed(((n - covered) as u64) << order);
            }
        }
        let starts = group.broadcast_u32(starts);
        let covered = group.broadcast_u32(covered);
        let top = group.broadcast_u32(top);
        let rank = group.rank();
        // This lane's run: its first rank, the next run's, and the run's block order.
        let first = if rank < covered {
            31 - (starts & (u32::MAX >> (31 - rank))).leading_zeros()
        } else {
            rank
        };
        let later = starts & !(u32::MAX >> (31 - rank));
        let level = if later != 0 {
            order + (later.trailing_zeros() - first).trailing_zeros()
        } else {
            top
        };
        let block = if rank < covered && rank == first {
            self.claim(level).0
        } else {
            0
        };
        let from = platform::nth_set_bit_u32(group.mask(), first);
        let block = platform::shfl_idx_u32(group.mask(), block, from);
        let served = rank < covered;
        let d = level - order;
        let t = rank - first;
        let leaf = Node((block << d) | t);
        if served {
            for h in 1..=d {
                // The inner node `h` above our leaf, if its first leaf is ours.
                if t & ((1 << h) - 1) == 0 {
                    self.word(Node(leaf.0 >> h)).store_relaxed(PARTIAL);
                }
            }
        }
        // Every lane's inner nodes are Partial before a spare is Available.
        group.sync();
        if served && rank == covered - 1 {
            for h in 0..d {
                let node = Node(leaf.0 >> h);
                if node.0 & 1 == 0 {
                    self.make_available(node.buddy(), order + h, 1, false);
                }
            }
        }
        // INV(TB13): the walk ends once every unit it took is a claimed block or an Available
        // spare (bar.warp.sync orders the last lane's signals before the leader's release),
        // and before the lanes it left over take the single path, which waits out walks.
        group.sync();
        if group.is_leader() {
            self.header.walks_ended.fetch_add_release(1);
        }
        if !served {
            return self.alloc(order);
        }
        Some(self.offset_of(leaf, order))
    }

    /// The climb from `order` failed at `top`: before answering `None`, withdraw each promise
    /// made on the way, newest first, and wait once more at that order without climbing. Another
    /// thread that decided to refill the same order at the same time may have won the block
    /// above; its split makes one spare unit at each order it passes, and that unit is ours to
    /// wait for (no false starvation, INV(TB4)). Returns the order at which a unit was counted.
    #[cold]
    fn retry_downwards(&self, top: u32, order: u32) -> Option<u32> {
        let mut have = top;
        while have > order {
            have -= 1;
            // Our own promise must go first, or the wait below would spin on it (INV(SEM6)).
            self.sem(have).retract(BATCH - 1);
            match self.sem(have).wait(1, BATCH) {
                // The promises below `have` are still ours and the split will keep them.
                Wait::Acquired => return Some(have),
                // Nothing spare here either; no climbing back up (that is how this ends).
                Wait::MustRefill => self.sem(have).retract(BATCH - 1),
            }
        }
        None
    }

    /// Find and take an Available node of `order`; this thread holds one of its units, so one
    /// exists or is about to (INV(TB4)).
    fn claim(&self, order: u32) -> Node {
        let mut backoff = Backoff::new();
        let mut seed = scatter_seed(order);
        loop {
            if let Some(n) = self.index.find(self.max_order - order, seed) {
                let node = Node(n);
                // Acq_rel: the acquire half pairs with the release that made the node Available
                // (`make_available` / `split`), so the block's previous life happened before ours.
                if self
                    .word(node)
                    .compare_exchange_acq_rel(AVAILABLE, BUSY)
                    .is_ok()
                {
                    self.index.clear(node.0);
                    return node;
                }
            }
            // Another holder took that node, or ours is between its Available store and its
            // index bit (INV(TB6)): look again after a moment, from a new start. The seed
            // differs between SMs and lanes and over time (`scatter_seed`); the timer moves it
            // on with no memory operation. Two threads whose seeds agree (same SM, lane and
            // order in one tick of the timer) may pick the same node again, but each such
            // collision has a winner, who leaves. (A ticket from one shared counter moved the
            // seed before: an atomic whose answer every retry waited for, from every SM at
            // once. ncu of a fresh fill of 2^20 requests of 1–8192 B: 7 retries per claim,
            // and the fill 2.08–2.11 → 1.92–1.99 ms without the ticket, H100.)
            backoff.snooze();
            seed = mix(seed ^ platform::global_timer_ns());
        }
    }

    /// Split `node` (Busy, ours): it becomes Partial, its right child Available; the left child
    /// (Busy) stays ours. The caller then signals the order below.
    fn split(&self, node: Node) {
        // INV(TB3): only blocks above order 0 are split (the caller splits down to `order`).
        debug_assert!(self.order_of(node) > 0);
        // INV(TB2): the children of a Busy node are Busy. Release: a thread that frees a child
        // locks this word and must see Partial (INV(TB5)).
        debug_assert_eq!(self.word(node.left()).load_relaxed(), BUSY);
        debug_assert_eq!(self.word(node.right()).load_relaxed(), BUSY);
        self.word(node).store_release(PARTIAL);
        // Release: pairs with the acquire CAS in `claim` or `free` that takes it.
        self.word(node.right()).store_release(AVAILABLE);
        self.index.set(node.right().0);
    }

    // ---- free -----------------------------------------------------------------------------

    /// Give back a block from [`alloc`](Self::alloc). The caller guarantees `(offset, order)` is
    /// a live block of this tree (no double free).
    pub fn free(&self, offset: u64, order: u32) {
        self.free_block(offset, order);
        // INV(TB9): counted free once it can be found. Relaxed, as in `reserve_pages`.
        self.header.free_pages.0.fetch_add_relaxed(1u64 << order);
    }

    /// [`free`](Self::free) for the lanes of a warp that give back blocks of one order at once
    /// (`group`; each lane its own live block at `offset`). Lanes whose blocks are buddies merge
    /// them without the pair lock, up the tree while pairs form: the lane of the left half
    /// stores the parent Busy, a whole block it now holds, and the lane of the right half is
    /// done (INV(TB12)). Then each lane still holding a block frees it on the single path. A
    /// warp that frees the blocks `alloc_together` gave it frees each of its runs as one block,
    /// instead of climbing the pair locks and semaphores once per block.
    ///
    /// Collective over `group` (collective.rs rules: every round's `match.any` and ballot are
    /// reached by every lane of the group).
    pub fn free_together(&self, group: &Group, offset: u64, order: u32) {
        if group.is_single() {
            return self.free(offset, order);
        }
        let mask = group.mask();
        let mut node = self.node_at(offset, order);
        let mut level = order;
        let mut holding = true;
        loop {
            // Lanes that hold both children of one parent have the same key; no other lane
            // shares a key (the lanes' blocks are disjoint, and a lane holding nothing or the
            // root has a key of its own).
            let key = if holding && node != Node::ROOT {
                node.parent().0 as u64
            } else {
                u64::MAX - platform::lane_id() as u64
            };
            let pair = platform::match_any(mask, key).count_ones() == 2;
            if pair {
                if node.0 & 1 == 0 {
                    // INV(TB12): both halves are ours and Busy, so nobody else locks or reads
                    // the pair: the parent goes from Partial to a Busy block, ours.
                    node = node.parent();
                    level += 1;
                    self.word(node).store_relaxed(BUSY);
                } else {
                    holding = false;
                }
            }
            if platform::ballot(mask, pair) == 0 {
                break;
            }
        }
        // bar.warp.sync orders every lane's writes to its half before the release that makes
        // a merged block Available, by whichever lane frees it.
        group.sync();
        if holding {
            self.free_block(self.offset_of(node, level), level);
            // INV(TB9): the merged block's pages (every merged lane's) once it can be found.
            self.header.free_pages.0.fetch_add_relaxed(1u64 << level);
        }
    }

    /// Return the block to the tree, merging it with free buddies on the way up.
    fn free_block(&self, offset: u64, order: u32) {
        debug_assert!(order <= self.max_order);
        debug_assert_eq!(offset & ((PAGE_SIZE as u64) << order).wrapping_sub(1), 0);
        let mut node = self.node_at(offset, order);
        let mut order = order;
        // Whether we hold an open promise of one unit of `order` (INV(TB4)): after a merge.
        let mut promised = false;
        loop {
            debug_assert_eq!(self.word(node).load_relaxed() & STATE_MASK, BUSY);
            if node == Node::ROOT {
                self.make_available(node, order, 1, promised);
                return;
            }
            if !self.free_or_merge(node, order, promised) {
                return;
            }
            // Merged: the parent is Busy and ours, announced one order up; free it there.
            node = node.parent();
            order += 1;
            promised = true;
        }
    }

    /// One step of `free` below the root: `true` if `node` merged with its buddy (the parent is
    /// now Busy and ours, with a promise open on the parent's order), `false` if `node` became
    /// Available. `promised`: we hold an open promise on `order` (we came from a merge below).
    fn free_or_merge(&self, node: Node, order: u32, promised: bool) -> bool {
        let parent = node.parent();
        let buddy = node.buddy();
        let up = self.sem(order + 1);
        let mut backoff = Backoff::new();
        loop {
            // The buddy's state before the lock, so that the load's round trip overlaps the
            // lock's: a hint only. An Available hint is checked by the CAS that takes the
            // buddy below; any other is loaded again under the lock.
            let hint = self.word(buddy).load_relaxed() & STATE_MASK;
            self.lock(parent);
            // INV(TB5): under the pair lock the buddy becomes Available only by our hands, so
            // a buddy that is not Available now cannot merge with us before we unlock.
            if hint != AVAILABLE && self.word(buddy).load_acquire() & STATE_MASK != AVAILABLE {
                self.make_available(node, order, 1, promised);
                self.unlock_after_fence(parent);
                return false;
            }
            // INV(TB4): announce the merged block before its halves leave this order, so that
            // an allocator never finds the pages in transit missing (it waits for them).
            up.promise(BATCH - 1);
            if self.sem(order).try_wait(1) {
                // Acquire: pairs with the release that made the buddy Available. No release
                // half: nobody reads through the buddy's Busy word (a claim's CAS only fails on
                // it), and what we wrote before is published by the release that ends this
                // free (`make_available`).
                if self
                    .word(buddy)
                    .compare_exchange_acquire(AVAILABLE, BUSY)
                    .is_ok()
                {
                    self.index.clear_merged(buddy.0);
                    // INV(TB2): both children Busy; the parent is a whole Busy block, ours.
                    // Relaxed: nobody waits for this lock (its other child was Available, not
                    // live), and the next one to take it does so after the parent is claimed
                    // and split, which acquires the release that ends this free.
                    self.word(parent).store_relaxed(BUSY);
                    if promised {
                        // Our block now lives one order up, where the new promise stands.
                        self.sem(order).retract(BATCH - 1);
                    }
                    return true;
                }
                // An allocator holding its own unit took the buddy first (or the hint was
                // stale): our unit stands for another Available node; give it back together
                // with ours.
                self.make_available(node, order, 2, promised);
                self.unlock_after_fence(parent);
                up.retract(BATCH - 1);
                return false;
            }
            up.retract(BATCH - 1);
            // INV(TB1): the buddy is Available (or was, by a stale hint: the next try loads
            // it again) but no unit is free: each is held by an allocator about to claim an
            // Available node (maybe the buddy), or hidden in a fast path's roll-back
            // (INV(SEM3)). Becoming Available now could leave two Available siblings; wait
            // (without the lock) until one of the two resolves.
            self.unlock(parent);
            backoff.snooze();
        }
    }

    /// `node` (Busy, ours) becomes Available and `units` units of its order are released (ours,
    /// plus one we took and did not use); `promised`: one of them fulfils our open promise.
    ///
    /// Ends with an acq_rel fence before the count, so a caller's relaxed store right after
    /// it is a release of everything before the fence (`unlock_after_fence`).
    fn make_available(&self, node: Node, order: u32, units: u32, promised: bool) {
        // Release: pairs with the acquire CAS of the next owner (`claim` or a merging `free`).
        self.word(node).store_release(AVAILABLE);
        self.index.set(node.0);
        // INV(TB4): the node is Available (and indexed) before it is counted. The fence and
        // the relaxed add are the count's release (INV(SEM7)).
        platform::fence_acq_rel();
        let expected = if promised { BATCH - 1 } else { 0 };
        self.sem(order).signal_fenced(units, expected);
    }

    /// Take the pair lock of `parent`'s children (INV(TB5)). One lock at a time per thread, held
    /// only for a few non-blocking steps, so no deadlock.
    fn lock(&self, parent: Node) {
        let word = self.word(parent);
        let mut backoff = Backoff::new();
        // INV(TB5): a freed node's parent is Partial while the node is allocated, and a free
        // pair lock is exactly Partial (`unlock` stores it): the first try is a CAS with no
        // load before it, one round trip per level of a free's climb where there were two.
        let mut cur = PARTIAL;
        loop {
            debug_assert_eq!(cur & STATE_MASK, PARTIAL);
            if cur & LOCKED == 0 {
                // Acquire: pairs with the release in `unlock`. No release half: taking the
                // lock publishes nothing (the freed block's writes are published by the
                // release that makes it Available), and on the GPU it was a MEMBAR per try.
                match word.compare_exchange_acquire(cur, cur | LOCKED) {
                    Ok(_) => return,
                    Err(seen) if seen & LOCKED == 0 => {
                        cur = seen;
                        continue;
                    }
                    Err(_) => {}
                }
            }
            backoff.snooze();
            cur = word.load_relaxed();
        }
    }

    /// Release the pair lock; `parent` stays Partial.
    fn unlock(&self, parent: Node) {
        // Release: pairs with the acquire in the next `lock`. Nothing else writes a locked
        // Partial word (claims CAS only Available words), so a store is exact.
        self.word(parent).store_release(PARTIAL);
    }

    /// [`unlock`](Self::unlock) right after [`make_available`](Self::make_available), whose
    /// fence makes this relaxed store a release of the critical section (the fence before a
    /// relaxed store is PTX's release pattern): one MEMBAR on the GPU instead of two. Only the
    /// count that `make_available` added after its fence may show after the unlock; a sibling
    /// that takes the lock and misses it waits and retries (`free_or_merge`'s INV(TB1) case).
    fn unlock_after_fence(&self, parent: Node) {
        self.word(parent).store_relaxed(PARTIAL);
    }

    // ---- inspection -----------------------------------------------------------------------

    /// Pages in Available blocks, summed over orders from the semaphores (a snapshot; exact at
    /// quiescence).
    pub fn available_pages(&self) -> u64 {
        (0..=self.max_order)
            .map(|o| (self.sem(o).available() as u64) << o)
            .sum()
    }

    /// The free-page counter (INV(TB9)): pages in free blocks less open reservations.
    pub fn free_pages(&self) -> u64 {
        self.header.free_pages().max(0) as u64
    }

    /// Pages the tree manages (set by `init_finish`).
    pub fn usable_pages(&self) -> u64 {
        self.header.usable_pages.load_acquire()
    }

    /// Host diagnosis of a snapshot taken while the tree is in use (a stuck kernel's heap):
    /// per order with anything in it, `order: Available nodes / index bits / locked parents`,
    /// then the count of stale-negative index summaries.
    #[cfg(not(target_arch = "nvptx64"))]
    pub fn census(&self) -> std::string::String {
        use std::fmt::Write;
        let mut out = std::string::String::new();
        for order in 0..=self.max_order {
            let nodes = self.first_of(order)..2 * self.first_of(order);
            let available = nodes
                .clone()
                .filter(|&n| self.word(Node(n)).load_relaxed() & STATE_MASK == AVAILABLE)
                .count();
            let locked = nodes
                .clone()
                .filter(|&n| self.word(Node(n)).load_relaxed() & LOCKED != 0)
                .count();
            let (bits, _) = self.index.census(nodes);
            if available + locked + bits as usize > 0 {
                let _ = write!(out, "{order}:{available}/{bits}/{locked} ");
            }
        }
        let (_, stale) = self.index.census(0..0);
        let _ = write!(out, "; stale summaries {stale}");
        out
    }

    /// Walk the whole tree and check TB1–TB7 (host only; call it at quiescence).
    #[cfg(not(target_arch = "nvptx64"))]
    pub fn assert_valid(&self) {
        let extent = self.extent_pages();
        let growable = self.header.growable.load_relaxed() != 0;
        let mut available = [0u32; MAX_LEVELS as usize];
        let nodes = self.nodes.len() as u32;
        for n in 1..nodes {
            let node = Node(n);
            let order = self.order_of(node);
            let word = self.word(node).load_relaxed();
            let state = word & STATE_MASK;
            assert_eq!(word & LOCKED, 0, "TB5: node {n} still locked");
            assert!(state <= PARTIAL, "node {n}: bad state word {word:#x}");
            if node != Node::ROOT {
                let parent = self.word(node.parent()).load_relaxed() & STATE_MASK;
                assert!(
                    parent == PARTIAL || state == BUSY,
                    "TB2: node {n} is {state}, under a whole (non-Partial) parent"
                );
                if n & 1 == 0 {
                    let buddy = self.word(node.buddy()).load_relaxed() & STATE_MASK;
                    assert!(
                        !(state == AVAILABLE && buddy == AVAILABLE),
                        "TB1: siblings {n} and {} both Available",
                        n + 1
                    );
                }
            }
            if state == PARTIAL {
                assert!(order > 0, "TB3: leaf {n} is Partial");
            }
            let start = self.offset_of(node, order) >> PAGE_SHIFT;
            let end = start + (1u64 << order);
            if start >= extent {
                assert_eq!(state, BUSY, "TB7: node {n} beyond the heap is not Busy");
            } else if end > extent && !growable {
                assert_eq!(
                    state, PARTIAL,
                    "TB7: node {n} straddles the heap's end, not Partial"
                );
            }
            if state == AVAILABLE {
                available[order as usize] += 1;
            }
        }
        for order in 0..=self.max_order {
            let (c, e, r) = self.sem(order).counters();
            assert_eq!(
                (e, r),
                (0, 0),
                "TB4: order {order} has promises or reservations left"
            );
            assert_eq!(
                c, available[order as usize],
                "TB4: order {order}: C differs from its nodes"
            );
        }
        let free: u64 = (0..=self.max_order)
            .map(|o| (available[o as usize] as u64) << o)
            .sum();
        assert_eq!(
            self.free_pages(),
            free,
            "TB9: the free-page counter differs from the Available blocks"
        );
        self.index.assert_consistent(nodes, |n| {
            n != 0 && self.word(Node(n)).load_relaxed() & STATE_MASK == AVAILABLE
        });
    }
}

/// A scattered start for the search (ScatterAlloc-style): SM, lane, time and order, mixed.
fn scatter_seed(order: u32) -> u64 {
    let salt =
        ((platform::sm_id() as u64) << 40) ^ ((platform::lane_id() as u64) << 32) ^ order as u64;
    mix(platform::global_timer_ns() ^ salt)
}

/// SplitMix64's finalizer: a cheap, well-spread 64-bit mix.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
