//! Growable TBuddy trees (`init_growable_finish`, `grow`, `take`) on OS threads.
//!
//! The heap grows in granules (aligned blocks of [`GRANULE_ORDER`]) inside an extent that is not
//! a power of two, in a shuffled order. The serial tests check the page accounts and
//! `assert_valid` (TB1–TB10's checkable part) after every step; the concurrent ones keep a shadow
//! owner word per page: a page goes `OUT` → `FREE` just before it is grown, `FREE` → `OUT` when
//! it is taken, and `FREE` → a thread's tag while that thread holds it. Every one of those
//! moves is a compare-exchange that must succeed, so two blocks that overlap, a page handed out
//! before it was grown or after it was taken, or a take of a live page all fail the test.
#![cfg(not(loom))]

mod common;

use common::{Rng, with_deadline};

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::SeqCst};

use toga_kernels::platform::Atomic32;
use toga_kernels::tbuddy::{PAGE_SHIFT, TBuddy, TBuddyHeader};

/// The tree of the serial and stress tests: 4096 pages, of which the extent may hold 3000.
const MAX_ORDER: u32 = 12;
/// Not a power of two, and not a multiple of the granule: the last 24 pages are never grown.
const EXTENT_PAGES: u64 = 3000;
/// The unit of growth and of `take`: 32 pages.
const GRANULE_ORDER: u32 = 5;
const GRANULE_PAGES: u64 = 1 << GRANULE_ORDER;
/// Granules that fit in the extent: 93, i.e. 2976 pages.
const GRANULES: u64 = EXTENT_PAGES / GRANULE_PAGES;
const GROWN_PAGES: u64 = GRANULES * GRANULE_PAGES;
/// The largest block inside the grown pages: 2048 pages at offset 0.
const TOP_ORDER: u32 = 63 - GROWN_PAGES.leading_zeros();
const _: () = assert!(EXTENT_PAGES <= 1 << MAX_ORDER && GROWN_PAGES == 2976 && TOP_ORDER == 11);

/// Allocating threads in the stress tests.
const THREADS: usize = 8;
/// Orders the stress allocators ask for: up to two granules.
const STRESS_TOP_ORDER: u64 = 6;
/// Blocks one stress allocator holds at most.
const HELD: usize = 4;

/// Shadow word of a page outside the tree (never grown, or taken).
const OUT: u32 = u32::MAX;
/// Shadow word of a page in the tree that no thread holds.
const FREE: u32 = 0;

/// A tree's header and node words in host memory (there is no region: the shadow stands in).
struct Tree {
    header: Box<TBuddyHeader>,
    nodes: Vec<Atomic32>,
}

impl Tree {
    /// An empty growable tree of `max_order` over `extent` pages, checked empty.
    fn growable(max_order: u32, extent: u64) -> Self {
        let tree = Self {
            header: Box::new(TBuddyHeader::new()),
            nodes: (0..TBuddy::node_words(max_order))
                .map(|_| Atomic32::new(0))
                .collect(),
        };
        let view = tree.view();
        view.init_nodes(0..TBuddy::node_words(max_order), 0);
        view.init_growable_finish(extent);
        view.assert_valid();
        assert_eq!(view.max_order(), max_order);
        assert_eq!(view.extent_pages(), extent);
        assert_eq!(
            (
                view.usable_pages(),
                view.free_pages(),
                view.available_pages()
            ),
            (0, 0, 0)
        );
        for order in 0..=max_order {
            assert_eq!(
                view.alloc(order),
                None,
                "an empty growable tree gave memory"
            );
        }
        tree
    }

    fn view(&self) -> TBuddy<'_> {
        TBuddy::new(&self.header, &self.nodes)
    }
}

fn page_of(offset: u64) -> u64 {
    offset >> PAGE_SHIFT
}

fn offset_of_page(page: u64) -> u64 {
    page << PAGE_SHIFT
}

/// Byte offset of granule `g`.
fn granule_offset(g: u64) -> u64 {
    offset_of_page(g * GRANULE_PAGES)
}

/// Fisher–Yates with the seeded generator.
fn shuffle<T>(items: &mut [T], rng: &mut Rng) {
    for i in (1..items.len()).rev() {
        items.swap(i, rng.below(i as u64 + 1) as usize);
    }
}

fn shuffled_granules(seed: u64) -> Vec<u64> {
    let mut granules: Vec<u64> = (0..GRANULES).collect();
    shuffle(&mut granules, &mut Rng(seed));
    granules
}

/// The tree holds `pages` pages, all free, and walks clean.
fn assert_all_free(tree: &TBuddy<'_>, pages: u64) {
    tree.assert_valid();
    assert_eq!(tree.usable_pages(), pages, "usable pages");
    assert_eq!(tree.free_pages(), pages, "free-page counter");
    assert_eq!(tree.available_pages(), pages, "pages in Available blocks");
}

/// One page at a time until none is left: every page handed out lies in a grown granule, none
/// twice, and the count is the free pages; then all go back.
fn exhaust_pages(tree: &TBuddy<'_>, grown: &HashSet<u64>) {
    let free = tree.free_pages();
    let mut pages = HashSet::new();
    while let Some(off) = tree.alloc(0) {
        let page = page_of(off);
        assert!(
            grown.contains(&(page / GRANULE_PAGES)),
            "page {page} handed out, its granule never grown"
        );
        assert!(pages.insert(page), "page {page} handed out twice");
    }
    assert_eq!(
        pages.len() as u64,
        free,
        "free pages that alloc(0) cannot find"
    );
    assert_eq!(tree.free_pages(), 0);
    tree.assert_valid();
    for &page in &pages {
        tree.free(offset_of_page(page), 0);
    }
    assert_all_free(tree, free);
}

/// Whole-heap allocation: after growing every granule, the order-11 block at 0 exists and
/// nothing larger does; the rest of the grown pages form one block per bit of 2976 - 2048.
fn assert_top_block(tree: &TBuddy<'_>) {
    assert_eq!(
        tree.alloc(TOP_ORDER + 1),
        None,
        "a block past the grown pages"
    );
    let top = tree.alloc(TOP_ORDER);
    assert_eq!(
        top,
        Some(0),
        "the grown granules did not merge into the top block"
    );
    // 928 pages are left, below 1024: no second block of order 10.
    assert_eq!(tree.alloc(TOP_ORDER - 1), None);
    tree.free(0, TOP_ORDER);
    assert_all_free(tree, GROWN_PAGES);
}

/// Grow the granules one by one in a shuffled order: the accounts follow every grow, pages come
/// only from grown granules (checked half-way), and in the end the granules have merged into
/// the largest block the grown pages hold.
#[test]
fn serial_grow_granules_in_shuffled_order() {
    let heap = Tree::growable(MAX_ORDER, EXTENT_PAGES);
    let tree = heap.view();
    let mut grown = HashSet::new();
    for (i, g) in shuffled_granules(1).into_iter().enumerate() {
        tree.grow(granule_offset(g), GRANULE_ORDER);
        grown.insert(g);
        assert_all_free(&tree, grown.len() as u64 * GRANULE_PAGES);
        if i as u64 == GRANULES / 2 {
            exhaust_pages(&tree, &grown);
        }
    }
    assert_eq!(tree.extent_pages(), EXTENT_PAGES);
    assert_top_block(&tree);
    exhaust_pages(&tree, &grown);
}

/// Take every granule back (each once, aligned, inside the extent) until the tree is empty,
/// then grow them all back in another order: the tree is whole again.
#[test]
fn take_everything_then_regrow() {
    let heap = Tree::growable(MAX_ORDER, EXTENT_PAGES);
    let tree = heap.view();
    for g in shuffled_granules(2) {
        tree.grow(granule_offset(g), GRANULE_ORDER);
    }
    assert_all_free(&tree, GROWN_PAGES);
    for round in 0..2 {
        let mut taken = Vec::new();
        while let Some(off) = tree.take(GRANULE_ORDER) {
            let page = page_of(off);
            assert_eq!(page % GRANULE_PAGES, 0, "taken block {off:#x} not aligned");
            assert!(
                page + GRANULE_PAGES <= GROWN_PAGES,
                "taken block {off:#x} beyond the grown pages"
            );
            taken.push(page / GRANULE_PAGES);
            assert_all_free(&tree, GROWN_PAGES - taken.len() as u64 * GRANULE_PAGES);
        }
        let distinct: HashSet<u64> = taken.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            taken.len(),
            "round {round}: a granule taken twice"
        );
        assert_eq!(
            taken.len() as u64 * GRANULE_PAGES,
            GROWN_PAGES,
            "round {round}"
        );
        assert_all_free(&tree, 0);
        for order in 0..=MAX_ORDER {
            assert_eq!(
                tree.alloc(order),
                None,
                "round {round}: an emptied tree gave memory"
            );
        }
        // Back in another order than they were taken in.
        shuffle(&mut taken, &mut Rng(round + 3));
        for (i, &g) in taken.iter().enumerate() {
            tree.grow(granule_offset(g), GRANULE_ORDER);
            assert_all_free(&tree, (i as u64 + 1) * GRANULE_PAGES);
        }
        assert_top_block(&tree);
    }
}

/// Take and grow in other sizes than the granule: the top block is taken whole and comes back
/// as granules; then every granule is taken (leaving split nodes behind in the emptied tree)
/// and the heap comes back as its binary decomposition, five blocks of orders 11, 9, 8, 7, 5,
/// whose grows must reset the stale Partial nodes below them (TB2).
#[test]
fn take_and_grow_blocks_of_other_orders() {
    let heap = Tree::growable(MAX_ORDER, EXTENT_PAGES);
    let tree = heap.view();
    for g in shuffled_granules(4) {
        tree.grow(granule_offset(g), GRANULE_ORDER);
    }
    assert_eq!(tree.take(TOP_ORDER), Some(0));
    let top_granules = 1u64 << (TOP_ORDER - GRANULE_ORDER);
    assert_all_free(&tree, GROWN_PAGES - (top_granules << GRANULE_ORDER));
    assert_eq!(
        tree.alloc(TOP_ORDER),
        None,
        "the taken block is still in the tree"
    );
    let mut back: Vec<u64> = (0..top_granules).collect();
    shuffle(&mut back, &mut Rng(5));
    for g in back {
        tree.grow(granule_offset(g), GRANULE_ORDER);
    }
    assert_all_free(&tree, GROWN_PAGES);
    assert_top_block(&tree);

    let mut taken = 0;
    while tree.take(GRANULE_ORDER).is_some() {
        taken += 1;
    }
    assert_eq!(taken, GRANULES);
    assert_all_free(&tree, 0);
    // [0, 2976) = 2048 + 512 + 256 + 128 + 32 pages, grown from the small end.
    let mut blocks = Vec::new();
    let mut start = 0;
    for order in (0..=TOP_ORDER).rev() {
        if GROWN_PAGES >> order & 1 == 1 {
            blocks.push((start, order));
            start += 1 << order;
        }
    }
    assert_eq!(
        blocks.iter().map(|b| b.1).collect::<Vec<_>>(),
        [11, 9, 8, 7, 5]
    );
    let mut pages = 0;
    for &(page, order) in blocks.iter().rev() {
        tree.grow(offset_of_page(page), order);
        pages += 1 << order;
        assert_all_free(&tree, pages);
        assert_eq!(
            tree.alloc(order),
            Some(offset_of_page(page)),
            "the block just grown"
        );
        tree.free(offset_of_page(page), order);
    }
    assert_top_block(&tree);
    let grown: HashSet<u64> = (0..GRANULES).collect();
    exhaust_pages(&tree, &grown);
}

/// The shadow owner words, one per page of the whole tree (pages past the extent stay `OUT`).
struct Shadow(Vec<AtomicU32>);

impl Shadow {
    fn new() -> Self {
        Self(
            (0..1u64 << MAX_ORDER)
                .map(|_| AtomicU32::new(OUT))
                .collect(),
        )
    }

    /// Move every page of the block from `from` to `to`; each page must hold `from`.
    fn claim(&self, offset: u64, order: u32, from: u32, to: u32, what: &str) {
        let first = page_of(offset);
        for page in first..first + (1 << order) {
            if let Err(found) = self.0[page as usize].compare_exchange(from, to, SeqCst, SeqCst) {
                panic!(
                    "{what}: block {offset:#x} (order {order}), page {page} holds {found:#x}, \
                     expected {from:#x}"
                );
            }
        }
    }
}

/// Check a block the tree handed out: aligned to its size and inside the grown pages.
fn assert_placed(offset: u64, order: u32) {
    let page = page_of(offset);
    assert_eq!(
        page % (1 << order),
        0,
        "block {offset:#x} of order {order} not aligned"
    );
    assert!(
        page + (1 << order) <= GROWN_PAGES,
        "block {offset:#x} of order {order} beyond the grown pages"
    );
}

/// What the grower threads did, for the end-of-test sanity checks.
#[derive(Default)]
struct GrowerCounts {
    grows: AtomicUsize,
    takes: AtomicUsize,
}

/// `growers` threads grow the granules (grower `k` owns granule `g` when `g % growers == k`, so
/// buddy granules belong to different growers) in a random order, and take granules back now
/// and then (a granule taken belongs to its taker until it grows it again); meanwhile
/// [`THREADS`] allocators allocate and free orders `0..=6`. Every page move goes through the
/// shadow. At the end all blocks are freed, all granules grown, and the tree is whole.
fn stress_with_growers(growers: usize, ops: usize, seed: u64) {
    let heap = Tree::growable(MAX_ORDER, EXTENT_PAGES);
    let shadow = Shadow::new();
    let running = AtomicUsize::new(THREADS);
    let counts = GrowerCounts::default();
    let allocated = AtomicUsize::new(0);
    let granules = shuffled_granules(seed);
    std::thread::scope(|s| {
        for k in 0..growers {
            let (heap, shadow, running, counts) = (&heap, &shadow, &running, &counts);
            let mut pending: Vec<u64> = granules
                .iter()
                .copied()
                .filter(|g| *g % growers as u64 == k as u64)
                .collect();
            s.spawn(move || {
                let tree = heap.view();
                let mut rng = Rng(seed ^ (0x6b00 + k as u64));
                let grow = |g: u64| {
                    let off = granule_offset(g);
                    // Free in the shadow before the tree can hand it out.
                    shadow.claim(off, GRANULE_ORDER, OUT, FREE, "grow");
                    tree.grow(off, GRANULE_ORDER);
                    counts.grows.fetch_add(1, SeqCst);
                };
                while running.load(SeqCst) > 0 {
                    if !pending.is_empty() && rng.below(3) > 0 {
                        let i = rng.below(pending.len() as u64) as usize;
                        grow(pending.swap_remove(i));
                    } else if let Some(off) = tree.take(GRANULE_ORDER) {
                        assert_placed(off, GRANULE_ORDER);
                        // Nobody may hold any page of it.
                        shadow.claim(off, GRANULE_ORDER, FREE, OUT, "take");
                        pending.push(page_of(off) / GRANULE_PAGES);
                        counts.takes.fetch_add(1, SeqCst);
                    } else {
                        std::thread::yield_now();
                    }
                }
                for g in pending {
                    grow(g);
                }
            });
        }
        for t in 0..THREADS {
            let (heap, shadow, running, allocated) = (&heap, &shadow, &running, &allocated);
            s.spawn(move || {
                let tree = heap.view();
                let tag = t as u32 + 1;
                let mut rng = Rng(seed.wrapping_mul(31) + t as u64);
                let mut mine: Vec<(u64, u32)> = Vec::new();
                // Start once there is something to allocate: a thread scheduled before the
                // first grow would spend all its operations on `None`.
                while tree.usable_pages() == 0 {
                    std::thread::yield_now();
                }
                let free = |(off, order): (u64, u32)| {
                    shadow.claim(off, order, tag, FREE, "free");
                    tree.free(off, order);
                };
                for _ in 0..ops {
                    if mine.len() < HELD && rng.below(2) == 0 {
                        // Orders skewed small: 0 most, 6 least.
                        let order = rng
                            .below(STRESS_TOP_ORDER + 1)
                            .min(rng.below(STRESS_TOP_ORDER + 1))
                            as u32;
                        if let Some(off) = tree.alloc(order) {
                            assert_placed(off, order);
                            shadow.claim(off, order, FREE, tag, "alloc");
                            mine.push((off, order));
                            allocated.fetch_add(1, SeqCst);
                        }
                    } else if !mine.is_empty() {
                        let i = rng.below(mine.len() as u64) as usize;
                        free(mine.swap_remove(i));
                    }
                }
                mine.into_iter().for_each(free);
                running.fetch_sub(1, SeqCst);
            });
        }
    });
    let tree = heap.view();
    assert_all_free(&tree, GROWN_PAGES);
    for (page, word) in shadow.0.iter().enumerate() {
        let want = if (page as u64) < GROWN_PAGES {
            FREE
        } else {
            OUT
        };
        assert_eq!(word.load(SeqCst), want, "page {page} left in the shadow");
    }
    let (grows, takes) = (counts.grows.load(SeqCst), counts.takes.load(SeqCst));
    assert_eq!(
        grows,
        GRANULES as usize + takes,
        "every granule grown once more than taken"
    );
    assert!(takes > 0, "no take succeeded: the test did not test take");
    assert!(
        allocated.load(SeqCst) > THREADS * ops / 8,
        "too few allocations to mean anything"
    );
    assert_top_block(&tree);
}

/// One grower against eight allocators.
#[test]
fn concurrent_grow_take_alloc_free_one_grower() {
    with_deadline(|| {
        for seed in 0..3 {
            stress_with_growers(1, 100_000, seed);
        }
    });
}

/// Two growers with disjoint granules (buddy granules on different growers, so their grows
/// race to merge) against eight allocators.
#[test]
fn concurrent_grow_take_alloc_free_two_growers() {
    with_deadline(|| {
        for seed in 10..13 {
            stress_with_growers(2, 100_000, seed);
        }
    });
}

/// Four growers and nothing else: all granules race in at once, then out again with `take`
/// from four threads, many rounds; the grows must merge every time (TB1), and the takes must
/// find every granule, each once.
#[test]
fn concurrent_growers_merge_every_time() {
    with_deadline(|| {
        const GROWERS: usize = 4;
        let heap = Tree::growable(MAX_ORDER, EXTENT_PAGES);
        let tree = heap.view();
        let mut out: Vec<u64> = (0..GRANULES).collect();
        for round in 0..100 {
            shuffle(&mut out, &mut Rng(round));
            std::thread::scope(|s| {
                for k in 0..GROWERS {
                    let (heap, out) = (&heap, &out);
                    s.spawn(move || {
                        let tree = heap.view();
                        for &g in out.iter().skip(k).step_by(GROWERS) {
                            tree.grow(granule_offset(g), GRANULE_ORDER);
                        }
                    });
                }
            });
            assert_all_free(&tree, GROWN_PAGES);
            assert_top_block(&tree);
            // Empty it again, from several threads at once.
            let taken = Mutex::new(Vec::new());
            std::thread::scope(|s| {
                for _ in 0..GROWERS {
                    let (heap, taken) = (&heap, &taken);
                    s.spawn(move || {
                        let tree = heap.view();
                        while let Some(off) = tree.take(GRANULE_ORDER) {
                            assert_placed(off, GRANULE_ORDER);
                            taken.lock().unwrap().push(page_of(off) / GRANULE_PAGES);
                        }
                    });
                }
            });
            out = taken.into_inner().unwrap();
            let distinct: HashSet<u64> = out.iter().copied().collect();
            assert_eq!(
                distinct.len() as u64,
                GRANULES,
                "round {round}: a granule taken twice"
            );
            assert_eq!(out.len() as u64, GRANULES, "round {round}");
            assert_all_free(&tree, 0);
        }
    });
}
