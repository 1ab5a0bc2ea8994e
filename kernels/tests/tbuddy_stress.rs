//! TBuddy under OS threads standing in for GPU threads, checked against a shadow oracle.
//!
//! The heap region is a real host buffer aligned to its largest block; every live block is
//! filled with a pattern naming it, checked again before it is freed, so two blocks that
//! overlap show up as a corrupted pattern even if the oracle missed it. `assert_valid` walks
//! the tree after every quiescent phase.
#![cfg(not(loom))]

mod common;

use common::{Rng, with_deadline};

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Barrier, Mutex};

use toga_kernels::collective::Group;
use toga_kernels::platform::Atomic32;
use toga_kernels::tbuddy::{PAGE_SHIFT, PAGE_SIZE, TBuddy, TBuddyHeader};

const THREADS: usize = 8;

/// A tree, its node words and the memory it manages.
struct DeviceHeap {
    header: Box<TBuddyHeader>,
    nodes: Vec<Atomic32>,
    max_order: u32,
    region: *mut u8,
    layout: Layout,
}

// SAFETY: the region is plain memory; the tests give each live block to one thread at a time
// (that is what they check), and the tree words are atomics.
unsafe impl Sync for DeviceHeap {}
// SAFETY: as above; the raw pointer is owned by this struct.
unsafe impl Send for DeviceHeap {}

impl DeviceHeap {
    fn new(max_order: u32, usable_pages: u64) -> Self {
        let heap = Self::zeroed(max_order);
        heap.tree().init(usable_pages);
        heap.tree().assert_valid();
        heap
    }

    /// Zeroed header and nodes, not yet initialized.
    fn zeroed(max_order: u32) -> Self {
        let words = TBuddy::node_words(max_order);
        let bytes = PAGE_SIZE << max_order;
        let layout = Layout::from_size_align(bytes, bytes).unwrap();
        // SAFETY: the layout has a non-zero size.
        let region = unsafe { std::alloc::alloc(layout) };
        assert!(!region.is_null());
        Self {
            header: Box::new(TBuddyHeader::new()),
            nodes: (0..words).map(|_| Atomic32::new(0)).collect(),
            max_order,
            region,
            layout,
        }
    }

    fn tree(&self) -> TBuddy<'_> {
        TBuddy::new(&self.header, &self.nodes)
    }

    fn pages(&self) -> u64 {
        1 << self.max_order
    }

    /// The block's memory as u64 words.
    ///
    /// # Safety
    /// `(offset, order)` is a live block owned by the caller.
    #[allow(clippy::mut_from_ref)]
    unsafe fn block(&self, offset: u64, order: u32) -> &mut [u64] {
        let len = (PAGE_SIZE << order) / 8;
        assert!(offset as usize + len * 8 <= self.layout.size());
        // SAFETY: inside the region, aligned (offsets are page-aligned), owned by the caller.
        unsafe { std::slice::from_raw_parts_mut(self.region.add(offset as usize) as *mut u64, len) }
    }

    /// Fill a freshly allocated block with its pattern.
    fn fill(&self, offset: u64, order: u32, tag: u64) {
        // SAFETY: just allocated, ours.
        let words = unsafe { self.block(offset, order) };
        words.fill(pattern(offset, tag));
    }

    /// Check the pattern before freeing.
    fn check(&self, offset: u64, order: u32, tag: u64) {
        // SAFETY: live and ours until we free it.
        let words = unsafe { self.block(offset, order) };
        let want = pattern(offset, tag);
        if let Some(i) = words.iter().position(|&w| w != want) {
            panic!(
                "block {offset:#x} (order {order}) corrupted at word {i}: someone else wrote it"
            );
        }
    }
}

impl Drop for DeviceHeap {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.region, self.layout) }
    }
}

fn pattern(offset: u64, tag: u64) -> u64 {
    offset.rotate_left(17) ^ tag.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The shadow oracle: live blocks by start offset → (end, order).
#[derive(Default)]
struct Oracle(Mutex<BTreeMap<u64, (u64, u32)>>);

impl Oracle {
    fn insert(&self, heap: &DeviceHeap, offset: u64, order: u32) {
        let size = (PAGE_SIZE as u64) << order;
        let end = offset + size;
        assert_eq!(
            offset % size,
            0,
            "block {offset:#x} of order {order} not aligned to its size"
        );
        assert!(
            end <= heap.pages() << PAGE_SHIFT,
            "block {offset:#x} past the heap"
        );
        let mut live = self.0.lock().unwrap();
        if let Some((&s, &(e, o))) = live.range(..=offset).next_back() {
            assert!(
                e <= offset,
                "block {offset:#x}/{order} overlaps live {s:#x}/{o}"
            );
        }
        if let Some((&s, &(_, o))) = live.range(offset..).next() {
            assert!(
                end <= s,
                "block {offset:#x}/{order} overlaps live {s:#x}/{o}"
            );
        }
        live.insert(offset, (end, order));
    }

    fn remove(&self, offset: u64, order: u32) {
        let removed = self.0.lock().unwrap().remove(&offset);
        assert_eq!(
            removed.map(|(_, o)| o),
            Some(order),
            "freeing a block that is not live"
        );
    }

    fn live_pages(&self) -> u64 {
        self.0
            .lock()
            .unwrap()
            .values()
            .map(|&(_, o)| 1u64 << o)
            .sum()
    }
}

/// Everything is free again: the initial decomposition is back and the largest block it
/// allows can be allocated (for a full heap: the root).
fn assert_recovered(heap: &DeviceHeap, usable: u64) {
    let tree = heap.tree();
    tree.assert_valid();
    assert_eq!(
        tree.available_pages(),
        usable,
        "pages lost after freeing everything"
    );
    let top = 63 - usable.leading_zeros();
    let block = tree
        .alloc(top)
        .expect("largest block not allocatable after full recovery");
    assert_eq!(block, 0);
    tree.free(block, top);
    tree.assert_valid();
}

#[test]
fn serial_split_merge_and_alignment() {
    let heap = DeviceHeap::new(3, 8);
    let tree = heap.tree();
    assert_eq!(tree.max_order(), 3);
    assert_eq!(tree.available_pages(), 8);
    let a = tree.alloc(0).unwrap();
    tree.assert_valid_after(&[(a, 0)]);
    let b = tree.alloc(1).unwrap();
    let c = tree.alloc(2).unwrap();
    for (off, order) in [(a, 0), (b, 1), (c, 2)] {
        assert_eq!(off % ((PAGE_SIZE as u64) << order), 0);
    }
    assert_eq!(tree.available_pages(), 1);
    assert_eq!(tree.alloc(1), None);
    assert_eq!(tree.alloc(3), None);
    let d = tree.alloc(0).unwrap();
    assert_eq!(tree.alloc(0), None, "a full heap handed out a page");
    tree.assert_valid();
    for (off, order) in [(b, 1), (d, 0), (c, 2), (a, 0)] {
        tree.free(off, order);
        tree.assert_valid();
    }
    assert_recovered(&heap, 8);
    assert_eq!(tree.alloc(4), None, "an order above the root");
}

/// Extension used above: `assert_valid` plus the page balance against a list of live blocks.
trait ValidAfter {
    fn assert_valid_after(&self, live: &[(u64, u32)]);
}
impl ValidAfter for TBuddy<'_> {
    fn assert_valid_after(&self, live: &[(u64, u32)]) {
        self.assert_valid();
        let live: u64 = live.iter().map(|&(_, o)| 1u64 << o).sum();
        assert_eq!(self.available_pages() + live, self.usable_pages());
    }
}

/// Heaps of every size up to 2^5 pages: init marks the excess Busy, exactly `usable` pages can
/// be allocated one by one, and everything comes back.
#[test]
fn non_power_of_two_heaps() {
    const MAX_ORDER: u32 = 5;
    for usable in 0..=(1u64 << MAX_ORDER) {
        let heap = DeviceHeap::new(MAX_ORDER, usable);
        let tree = heap.tree();
        assert_eq!(tree.available_pages(), usable);
        let oracle = Oracle::default();
        let mut got = Vec::new();
        while let Some(off) = tree.alloc(0) {
            oracle.insert(&heap, off, 0);
            assert!(
                off >> PAGE_SHIFT < usable,
                "page {off:#x} beyond the usable {usable} pages"
            );
            got.push(off);
        }
        assert_eq!(got.len() as u64, usable);
        tree.assert_valid();
        for off in got {
            tree.free(off, 0);
        }
        if usable > 0 {
            assert_recovered(&heap, usable);
        } else {
            tree.assert_valid();
            assert_eq!(tree.alloc(0), None);
        }
    }
}

/// `init_nodes` over disjoint ranges from several threads gives the same words as a serial
/// `init`; a zeroed, uninitialized tree refuses every allocation.
#[test]
fn parallel_init_matches_serial() {
    const MAX_ORDER: u32 = 9;
    let usable = (1u64 << MAX_ORDER) - 37;
    let serial = DeviceHeap::new(MAX_ORDER, usable);
    let parallel = DeviceHeap::zeroed(MAX_ORDER);
    for order in 0..=MAX_ORDER {
        assert_eq!(
            parallel.tree().alloc(order),
            None,
            "zeroed tree handed out memory"
        );
    }
    let words = TBuddy::node_words(MAX_ORDER);
    let per = words.div_ceil(THREADS);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let tree = parallel.tree();
            s.spawn(move || {
                tree.init_nodes((t * per).min(words)..((t + 1) * per).min(words), usable)
            });
        }
    });
    parallel.tree().init_finish(usable);
    parallel.tree().assert_valid();
    for (i, (a, b)) in serial.nodes.iter().zip(&parallel.nodes).enumerate() {
        assert_eq!(a.load_relaxed(), b.load_relaxed(), "node word {i}");
    }
    assert_eq!(parallel.tree().available_pages(), usable);
}

/// Random alloc/free of mixed orders on 8 threads, with cross-thread frees, in phases; the
/// oracle checks every block, `assert_valid` every quiescent point. Half the threads allocate
/// through `alloc_together`.
#[test]
fn random_mixed_orders_with_oracle() {
    with_deadline(|| {
        const MAX_ORDER: u32 = 8;
        const PHASES: usize = 4;
        const OPS: usize = 3_000;
        const TOP_ORDER: u64 = 4;
        for usable in [1u64 << MAX_ORDER, 200] {
            let heap = DeviceHeap::new(MAX_ORDER, usable);
            let oracle = Oracle::default();
            // Blocks handed to another thread to free: (offset, order, tag).
            let exchange = Mutex::new(Vec::<(u64, u32, u64)>::new());
            let failures = AtomicUsize::new(0);
            let mut kept: Vec<Vec<(u64, u32, u64)>> = vec![Vec::new(); THREADS];
            for phase in 0..PHASES {
                std::thread::scope(|s| {
                    for (t, mine) in kept.iter_mut().enumerate() {
                        let (heap, oracle, exchange, failures) =
                            (&heap, &oracle, &exchange, &failures);
                        s.spawn(move || {
                            let tree = heap.tree();
                            let mut rng = Rng((phase * THREADS + t) as u64 * 7919 + usable);
                            for i in 0..OPS {
                                let r = rng.below(10);
                                if r < 5 || mine.is_empty() {
                                    // Orders skewed small: 0 most, TOP_ORDER least.
                                    let order =
                                        rng.below(TOP_ORDER + 1).min(rng.below(TOP_ORDER + 1))
                                            as u32;
                                    // Odd threads take the group path (a group of one
                                    // lane here), which falls back to `alloc` within a
                                    // quarter of the heap's end.
                                    let got = if t % 2 == 1 {
                                        tree.alloc_together(&Group::single(), order)
                                    } else {
                                        tree.alloc(order)
                                    };
                                    match got {
                                        Some(off) => {
                                            oracle.insert(heap, off, order);
                                            let tag = (t * OPS + i) as u64;
                                            heap.fill(off, order, tag);
                                            mine.push((off, order, tag));
                                        }
                                        None => {
                                            failures.fetch_add(1, SeqCst);
                                        }
                                    }
                                } else if r < 7 {
                                    // Hand a block to whichever thread frees from the exchange.
                                    let k = rng.below(mine.len() as u64) as usize;
                                    exchange.lock().unwrap().push(mine.swap_remove(k));
                                } else {
                                    let theirs = exchange.lock().unwrap().pop();
                                    let k = rng.below(mine.len() as u64) as usize;
                                    let (off, order, tag) =
                                        theirs.unwrap_or_else(|| mine.swap_remove(k));
                                    heap.check(off, order, tag);
                                    oracle.remove(off, order);
                                    tree.free(off, order);
                                }
                            }
                        });
                    }
                });
                // Quiescent: the tree is valid and every page is live or available.
                let tree = heap.tree();
                tree.assert_valid();
                assert_eq!(
                    tree.available_pages() + oracle.live_pages(),
                    usable,
                    "phase {phase}"
                );
            }
            assert!(
                failures.load(SeqCst) < PHASES * THREADS * OPS,
                "nothing was ever allocated"
            );
            let tree = heap.tree();
            let rest = kept
                .into_iter()
                .flatten()
                .chain(exchange.into_inner().unwrap());
            for (off, order, tag) in rest {
                heap.check(off, order, tag);
                oracle.remove(off, order);
                tree.free(off, order);
            }
            assert_eq!(oracle.live_pages(), 0);
            assert_recovered(&heap, usable);
        }
    });
}

/// Every page is freed at the same moment by its own thread: siblings race to merge, and the
/// pair lock must make every pair merge (TB1), all the way to the root.
#[test]
fn simultaneous_frees_merge_back_to_the_root() {
    with_deadline(|| {
        const MAX_ORDER: u32 = 3;
        const ROUNDS: usize = 200;
        let pages = 1usize << MAX_ORDER;
        let heap = DeviceHeap::new(MAX_ORDER, pages as u64);
        for round in 0..ROUNDS {
            let tree = heap.tree();
            let blocks: Vec<u64> = (0..pages).map(|_| tree.alloc(0).unwrap()).collect();
            assert_eq!(tree.alloc(0), None);
            let barrier = Barrier::new(pages);
            std::thread::scope(|s| {
                for &off in &blocks {
                    let (heap, barrier) = (&heap, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        heap.tree().free(off, 0);
                    });
                }
            });
            tree.assert_valid();
            assert_eq!(tree.available_pages(), pages as u64, "round {round}");
            let root = tree.alloc(MAX_ORDER);
            assert_eq!(
                root,
                Some(0),
                "round {round}: the pages did not merge back into the root"
            );
            tree.free(0, MAX_ORDER);
        }
    });
}

/// `alloc_split(order, levels)` hands out `2^levels` live blocks
/// of an order in one allocation: the tree stays valid with all of them live, each is freed on
/// its own (in order, in reverse, or all at once from as many threads), and the pages merge
/// back into the root.
#[test]
fn split_runs_are_freed_block_by_block() {
    with_deadline(|| {
        const MAX_ORDER: u32 = 4;
        let pages = 1u64 << MAX_ORDER;
        let heap = DeviceHeap::new(MAX_ORDER, pages);
        for round in 0..300u32 {
            let tree = heap.tree();
            let levels = 1 + round % 2;
            let order = round % (MAX_ORDER + 1 - levels);
            let block = (PAGE_SIZE as u64) << order;
            let mut runs = Vec::new();
            while let Some(off) = tree.alloc_split(order, levels) {
                assert_eq!(off % (block << levels), 0, "a run aligned to its size");
                runs.push(off);
            }
            assert_eq!(
                runs.len() as u64,
                pages >> (order + levels),
                "round {round}"
            );
            let live: Vec<(u64, u32)> = runs
                .iter()
                .flat_map(|&off| (0..1u64 << levels).map(move |i| (off + i * block, order)))
                .collect();
            tree.assert_valid_after(&live);
            assert_eq!(
                tree.alloc(0),
                None,
                "round {round}: a full heap handed out a page"
            );
            match round % 3 {
                0 => live.iter().for_each(|&(off, o)| tree.free(off, o)),
                1 => live.iter().rev().for_each(|&(off, o)| tree.free(off, o)),
                _ => std::thread::scope(|s| {
                    for &(off, o) in &live {
                        let heap = &heap;
                        s.spawn(move || heap.tree().free(off, o));
                    }
                }),
            }
            tree.assert_valid();
            assert_eq!(
                tree.alloc(MAX_ORDER),
                Some(0),
                "round {round}: the blocks did not merge back into the root"
            );
            tree.free(0, MAX_ORDER);
        }
    });
}

/// `free_run_tail` gives back the last blocks of a run (those a run of the heap held and nobody
/// took, `tbuddy::run`) merged into aligned blocks: for every split of a run of 8 between
/// blocks freed one by one (from another thread each) and a tail, the tree stays valid and
/// merges back into the root.
#[test]
fn run_tails_are_freed_merged() {
    with_deadline(|| {
        const MAX_ORDER: u32 = 5;
        const LEVELS: u32 = 3;
        let heap = DeviceHeap::new(MAX_ORDER, 1 << MAX_ORDER);
        for order in 0..=MAX_ORDER - LEVELS {
            for taken in 0..=1u32 << LEVELS {
                let tree = heap.tree();
                let block = (PAGE_SIZE as u64) << order;
                let mut runs = Vec::new();
                while let Some(off) = tree.alloc_split(order, LEVELS) {
                    runs.push(off);
                }
                std::thread::scope(|s| {
                    for &run in &runs {
                        let heap = &heap;
                        for i in 0..taken as u64 {
                            s.spawn(move || heap.tree().free(run + i * block, order));
                        }
                        if taken < 1 << LEVELS {
                            s.spawn(move || {
                                heap.tree().free_run_tail(
                                    run + taken as u64 * block,
                                    order,
                                    (1 << LEVELS) - taken,
                                )
                            });
                        }
                    }
                });
                tree.assert_valid();
                assert_eq!(
                    tree.alloc(MAX_ORDER),
                    Some(0),
                    "order {order}, {taken} taken: the blocks did not merge back into the root"
                );
                tree.free(0, MAX_ORDER);
            }
        }
    });
}

/// A tiny heap under heavy churn: 8 threads alloc and free orders 0..=2 of an 8-page tree as
/// fast as they can, so nearly every operation races with another.
#[test]
fn churn_on_a_tiny_heap() {
    with_deadline(|| {
        const MAX_ORDER: u32 = 3;
        const OPS: usize = 50_000;
        let heap = DeviceHeap::new(MAX_ORDER, 1 << MAX_ORDER);
        let oracle = Oracle::default();
        let successes = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (heap, oracle, successes) = (&heap, &oracle, &successes);
                s.spawn(move || {
                    let tree = heap.tree();
                    let mut rng = Rng(1000 + t as u64);
                    let mut mine = Vec::new();
                    for i in 0..OPS {
                        if mine.len() < 2 && rng.below(2) == 0 {
                            let order = rng.below(3) as u32;
                            if let Some(off) = tree.alloc(order) {
                                oracle.insert(heap, off, order);
                                heap.fill(off, order, i as u64);
                                mine.push((off, order, i as u64));
                                successes.fetch_add(1, SeqCst);
                            }
                        } else if let Some((off, order, tag)) = mine.pop() {
                            heap.check(off, order, tag);
                            oracle.remove(off, order);
                            tree.free(off, order);
                        }
                    }
                    for (off, order, tag) in mine {
                        heap.check(off, order, tag);
                        oracle.remove(off, order);
                        tree.free(off, order);
                    }
                });
            }
        });
        assert!(
            successes.load(SeqCst) > OPS / 4,
            "too few allocations to mean anything"
        );
        assert_recovered(&heap, 1 << MAX_ORDER);
    });
}

/// Runs `threads` threads that each want one page at once; returns the pages they got.
fn race_for_pages(heap: &DeviceHeap, threads: usize) -> Vec<u64> {
    let barrier = Barrier::new(threads);
    let got = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            let (heap, barrier, got) = (heap, &barrier, &got);
            s.spawn(move || {
                barrier.wait();
                if let Some(off) = heap.tree().alloc(0) {
                    got.lock().unwrap().push(off);
                }
            });
        }
    });
    got.into_inner().unwrap()
}

/// No false starvation: with K free pages and 2K threads each wanting one page, exactly K
/// succeed — from a whole heap (every page needs splits) and from a fragmented one.
#[test]
fn exactly_k_of_2k_page_requests_succeed() {
    with_deadline(|| {
        const MAX_ORDER: u32 = 4;
        const ROUNDS: usize = 15;
        let pages = 1u64 << MAX_ORDER;
        for round in 0..ROUNDS {
            // Whole heap: K = 16, 32 threads.
            let heap = DeviceHeap::new(MAX_ORDER, pages);
            let oracle = Oracle::default();
            let got = race_for_pages(&heap, 2 * pages as usize);
            assert_eq!(
                got.len() as u64,
                pages,
                "round {round}: {} of {pages} pages handed out",
                got.len()
            );
            for &off in &got {
                oracle.insert(&heap, off, 0);
            }
            heap.tree().assert_valid();
            assert_eq!(heap.tree().available_pages(), 0);
            for off in got {
                heap.tree().free(off, 0);
            }
            assert_recovered(&heap, pages);

            // Fragmented: keep blocks of orders 2, 0, 1 and 0; the K = 8 free pages left are
            // spread over several orders.
            let tree = heap.tree();
            let held: Vec<(u64, u32)> = [2, 0, 1, 0]
                .iter()
                .map(|&o| (tree.alloc(o).unwrap(), o))
                .collect();
            let k = tree.available_pages();
            assert_eq!(k, pages - 8);
            let got = race_for_pages(&heap, 2 * k as usize);
            assert_eq!(got.len() as u64, k, "round {round}: fragmented heap");
            tree.assert_valid();
            for off in got {
                tree.free(off, 0);
            }
            for (off, o) in held {
                tree.free(off, o);
            }
            assert_recovered(&heap, pages);
        }
    });
}

/// Threads allocate random orders until the heap is exhausted (every thread ends with a run of
/// failures, and order-0 requests fail only when no page is left), then everything is freed
/// from other threads and the heap is whole again.
#[test]
fn out_of_memory_then_full_recovery() {
    with_deadline(|| {
        const MAX_ORDER: u32 = 7;
        for usable in [1u64 << MAX_ORDER, 100] {
            let heap = DeviceHeap::new(MAX_ORDER, usable);
            let oracle = Oracle::default();
            let held = Mutex::new(Vec::new());
            let order0_failures = AtomicU64::new(0);
            std::thread::scope(|s| {
                for t in 0..THREADS {
                    let (heap, oracle, held, order0_failures) =
                        (&heap, &oracle, &held, &order0_failures);
                    s.spawn(move || {
                        let tree = heap.tree();
                        let mut rng = Rng(t as u64 + 99);
                        // Big orders first, then pages until even those run out.
                        loop {
                            let order = if rng.below(4) == 0 {
                                0
                            } else {
                                rng.below(4) as u32
                            };
                            match tree.alloc(order) {
                                Some(off) => {
                                    oracle.insert(heap, off, order);
                                    heap.fill(off, order, t as u64);
                                    held.lock().unwrap().push((off, order, t as u64));
                                }
                                None if order == 0 => {
                                    order0_failures.fetch_add(1, SeqCst);
                                    break;
                                }
                                None => {}
                            }
                        }
                    });
                }
            });
            let tree = heap.tree();
            tree.assert_valid();
            assert!(order0_failures.load(SeqCst) >= THREADS as u64);
            // A page request failed only because no page was left.
            assert_eq!(
                tree.available_pages(),
                0,
                "a page request failed with pages free"
            );
            assert_eq!(oracle.live_pages(), usable);
            assert_eq!(tree.alloc(0), None);
            // Free everything, each thread freeing other threads' blocks.
            let all = held.into_inner().unwrap();
            std::thread::scope(|s| {
                for t in 0..THREADS {
                    let (heap, oracle, all) = (&heap, &oracle, &all);
                    s.spawn(move || {
                        let tree = heap.tree();
                        for &(off, order, tag) in
                            all.iter().filter(|b| (b.2 as usize + 1) % THREADS == t)
                        {
                            heap.check(off, order, tag);
                            oracle.remove(off, order);
                            tree.free(off, order);
                        }
                    });
                }
            });
            assert_eq!(oracle.live_pages(), 0);
            assert_recovered(&heap, usable);
        }
    });
}
