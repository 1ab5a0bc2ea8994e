//! Loom models of TBuddy: a 4-page tree (max order 2), two threads, every interleaving up to
//! the preemption bound. Run with
//! `RUSTFLAGS="--cfg loom -C debug-assertions=on" LOOM_MAX_PREEMPTIONS=2 cargo test -p toga-kernels --release --test loom_tbuddy`.
//!
//! Each model ends by checking the tree (`assert_valid`: TB1–TB7) and that every page came
//! back; the blocks two threads hold at once must not overlap.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;

use toga_kernels::collective::Group;
use toga_kernels::platform::Atomic32;
use toga_kernels::tbuddy::{PAGE_SIZE, TBuddy, TBuddyHeader};

const MAX_ORDER: u32 = 2;
const PAGES: u64 = 1 << MAX_ORDER;

struct Tree {
    header: TBuddyHeader,
    nodes: Vec<Atomic32>,
}

impl Tree {
    fn new(usable: u64) -> Arc<Self> {
        let tree = Arc::new(Self {
            header: TBuddyHeader::new(),
            nodes: (0..TBuddy::node_words(MAX_ORDER))
                .map(|_| Atomic32::new(0))
                .collect(),
        });
        tree.view().init(usable);
        tree
    }

    fn view(&self) -> TBuddy<'_> {
        TBuddy::new(&self.header, &self.nodes)
    }
}

fn span(offset: u64, order: u32) -> (u64, u64) {
    (offset, offset + ((PAGE_SIZE as u64) << order))
}

fn disjoint(a: (u64, u64), b: (u64, u64)) -> bool {
    a.1 <= b.0 || b.1 <= a.0
}

/// Both threads split the whole root at once (orders 0 and 1), hold their blocks together
/// (checked disjoint), then free them: the frees race to merge back to the root.
#[test]
fn concurrent_split_and_merge() {
    loom::model(|| {
        let tree = Tree::new(PAGES);
        let other = {
            let tree = tree.clone();
            thread::spawn(move || {
                let off = tree.view().alloc(1).expect("2 of 4 pages free");
                (off, 1)
            })
        };
        let mine = (tree.view().alloc(0).expect("4 pages, 3 wanted"), 0);
        let theirs = other.join().unwrap();
        assert!(disjoint(span(mine.0, mine.1), span(theirs.0, theirs.1)));
        let other = {
            let tree = tree.clone();
            thread::spawn(move || tree.view().free(theirs.0, theirs.1))
        };
        tree.view().free(mine.0, mine.1);
        other.join().unwrap();
        let view = tree.view();
        view.assert_valid();
        assert_eq!(view.available_pages(), PAGES);
        assert_eq!(
            view.alloc(MAX_ORDER),
            Some(0),
            "the frees did not merge back to the root"
        );
    });
}

/// Two pages left (one order-1 block); each thread wants a page and frees it at once, racing
/// an allocation against a merging free.
#[test]
fn alloc_races_merge() {
    loom::model(|| {
        let tree = Tree::new(PAGES);
        let held = tree.view().alloc(1).unwrap();
        let other = {
            let tree = tree.clone();
            thread::spawn(move || {
                let off = tree.view().alloc(0).expect("two pages free");
                tree.view().free(off, 0);
            })
        };
        let off = tree.view().alloc(0).expect("two pages free");
        tree.view().free(off, 0);
        other.join().unwrap();
        tree.view().free(held, 1);
        let view = tree.view();
        view.assert_valid();
        assert_eq!(view.alloc(MAX_ORDER), Some(0));
    });
}

/// A group walk (`alloc_together`, a one-lane group here) takes the root's unit without a
/// promise and splits it for one page; a single-path `alloc(1)` that runs meanwhile can find
/// no unit and no promise at any order, yet the walk's spare of order 1 is about to be
/// Available (INV(TB13)). Both must get disjoint blocks, and every page must come back.
/// Limits of the model: the single path's attempts do fail here (88 failed attempts over the
/// interleavings with three preemptions, 32 of them with the walk in flight throughout), but
/// never twice in one execution, because its back-off between attempts lets the walk finish.
/// So a mutation that counts every failed attempt toward out of memory is not caught, even
/// with three preemptions; what a preempted host thread does across two attempts is beyond
/// the bound.
#[test]
fn single_path_waits_out_a_group_walk() {
    loom::model(|| {
        let tree = Tree::new(PAGES);
        let other = {
            let tree = tree.clone();
            thread::spawn(move || tree.view().alloc(1).expect("2 of 4 pages free"))
        };
        let mine = tree
            .view()
            .alloc_together(&Group::single(), 0)
            .expect("4 pages, 3 wanted");
        let theirs = other.join().unwrap();
        assert!(disjoint(span(mine, 0), span(theirs, 1)));
        tree.view().free(mine, 0);
        tree.view().free(theirs, 1);
        let view = tree.view();
        view.assert_valid();
        assert_eq!(view.alloc(MAX_ORDER), Some(0));
    });
}

/// One page in a 3-page heap (the fourth is outside): two threads want it, exactly one gets it,
/// the other gets `None` without hanging.
#[test]
fn last_page_goes_to_exactly_one() {
    loom::model(|| {
        let tree = Tree::new(3);
        let view = tree.view();
        let held = [view.alloc(1).unwrap()];
        let other = {
            let tree = tree.clone();
            thread::spawn(move || tree.view().alloc(0))
        };
        let mine = view.alloc(0);
        let theirs = other.join().unwrap();
        assert_eq!(
            mine.is_some() as u32 + theirs.is_some() as u32,
            1,
            "{mine:?} {theirs:?}"
        );
        view.free(mine.or(theirs).unwrap(), 0);
        view.free(held[0], 1);
        view.assert_valid();
        assert_eq!(view.available_pages(), 3);
    });
}

/// All four pages allocated; two threads free two pages each (thread A pages 0 and 2, thread B
/// pages 1 and 3): both sibling pairs race to merge, then the two halves race at the root.
#[test]
fn sibling_frees_race_to_the_root() {
    loom::model(|| {
        let tree = Tree::new(PAGES);
        let view = tree.view();
        let pages: Vec<u64> = (0..PAGES).map(|_| view.alloc(0).unwrap()).collect();
        assert_eq!(view.alloc(0), None);
        let page = |i: u64| {
            pages
                .iter()
                .copied()
                .find(|&p| p == i * PAGE_SIZE as u64)
                .unwrap()
        };
        race_frees_to_the_root(&tree, &[page(0), page(2)], &[page(1), page(3)]);
    });
}

/// Thread A frees the pages `a`, thread B the pages `b`, at once; then the tree must be valid
/// and whole again (a block of the root's order at 0).
fn race_frees_to_the_root(tree: &Arc<Tree>, a: &[u64], b: &[u64]) {
    let other = {
        let (tree, b) = (tree.clone(), b.to_vec());
        thread::spawn(move || b.iter().for_each(|&p| tree.view().free(p, 0)))
    };
    let view = tree.view();
    a.iter().for_each(|&p| view.free(p, 0));
    other.join().unwrap();
    view.assert_valid();
    assert_eq!(
        view.alloc(MAX_ORDER),
        Some(0),
        "the pages did not merge back to the root"
    );
}

/// Page 3 is Available with its unit free; thread B frees page 2 (its buddy) while thread A
/// allocates a page: when A holds the unit but has not claimed page 3 yet, B sees its buddy
/// Available without a free unit and waits (TB1). The wait must end in every interleaving, and
/// the tree must come out valid.
#[test]
fn free_waits_for_a_claim_in_flight() {
    loom::model(|| {
        let tree = Tree::new(PAGES);
        let view = tree.view();
        let half = view.alloc(1).unwrap();
        let page2 = view.alloc(0).unwrap();
        assert_eq!((half, page2), (0, 2 * PAGE_SIZE as u64));
        let other = {
            let tree = tree.clone();
            thread::spawn(move || tree.view().alloc(0))
        };
        view.free(page2, 0);
        let got = other.join().unwrap().expect("a page was free all along");
        view.assert_valid();
        view.free(got, 0);
        view.free(half, 1);
        view.assert_valid();
        assert_eq!(view.alloc(MAX_ORDER), Some(0));
    });
}

// ---- growable trees ---------------------------------------------------------------------------

impl Tree {
    /// An empty growable tree of `max_order` that may hold `extent` pages: `init_nodes` with no
    /// pages (all Busy), then `init_growable_finish`.
    fn growable(max_order: u32, extent: u64) -> Arc<Self> {
        let tree = Arc::new(Self {
            header: TBuddyHeader::new(),
            nodes: (0..TBuddy::node_words(max_order))
                .map(|_| Atomic32::new(0))
                .collect(),
        });
        let view = tree.view();
        view.init_nodes(0..TBuddy::node_words(max_order), 0);
        view.init_growable_finish(extent);
        tree
    }
}

/// Byte offset of page `i`.
fn page(i: u64) -> u64 {
    i * PAGE_SIZE as u64
}

/// After the threads of a growth model joined: the tree is valid, holds `pages` pages, all free.
fn assert_all_free(view: &TBuddy<'_>, pages: u64) {
    view.assert_valid();
    assert_eq!(view.usable_pages(), pages);
    assert_eq!(view.free_pages(), pages);
    assert_eq!(view.available_pages(), pages);
}

/// Pages 2–3 grown (Available), page 0 grown and allocated. Thread B grows page 1 while thread
/// A frees page 0, its buddy: the grow's `free` and A's free race for the pair lock of node 2
/// and to merge, and the merged half then merges with pages 2–3 into the root.
#[test]
fn grow_races_a_merging_free() {
    loom::model(|| {
        let tree = Tree::growable(MAX_ORDER, PAGES);
        let view = tree.view();
        view.grow(page(2), 1);
        view.grow(page(0), 0);
        assert_eq!(view.alloc(0), Some(page(0)), "the only order-0 block");
        let other = {
            let tree = tree.clone();
            thread::spawn(move || tree.view().grow(page(1), 0))
        };
        view.free(page(0), 0);
        other.join().unwrap();
        assert_all_free(&view, PAGES);
        assert_eq!(
            view.alloc(MAX_ORDER),
            Some(0),
            "the grow and the free did not merge back to the root"
        );
    });
}

/// Pages 2–3 grown; threads A and B grow pages 0 and 1 at once: both convert node 2 from
/// Busy to Partial (one CAS wins), then their frees race to merge, and on into the root.
#[test]
fn two_buddies_grow_at_once() {
    loom::model(|| {
        let tree = Tree::growable(MAX_ORDER, PAGES);
        let view = tree.view();
        view.grow(page(2), 1);
        let other = {
            let tree = tree.clone();
            thread::spawn(move || tree.view().grow(page(1), 0))
        };
        view.grow(page(0), 0);
        other.join().unwrap();
        assert_all_free(&view, PAGES);
        assert_eq!(
            view.alloc(MAX_ORDER),
            Some(0),
            "the grown pages did not merge"
        );
    });
}

/// An empty tree; threads A and B grow its two halves at once: both convert the root from
/// Busy to Partial, then race to merge at the root.
#[test]
fn two_halves_grow_into_an_empty_tree() {
    loom::model(|| {
        let tree = Tree::growable(MAX_ORDER, PAGES);
        let view = tree.view();
        let other = {
            let tree = tree.clone();
            thread::spawn(move || tree.view().grow(page(2), 1))
        };
        view.grow(page(0), 1);
        other.join().unwrap();
        assert_all_free(&view, PAGES);
        assert_eq!(view.alloc(MAX_ORDER), Some(0), "the halves did not merge");
    });
}

/// Pages 0–1 grown (Available). Thread B grows pages 2–3, their buddy, while thread A
/// allocates two pages and frees them: B's merge races A's claim (B may see its buddy
/// Available with its unit held by A, and must wait, TB1), and A's free races B's merge.
#[test]
fn alloc_races_a_merging_grow() {
    loom::model(|| {
        let tree = Tree::growable(MAX_ORDER, PAGES);
        let view = tree.view();
        view.grow(page(0), 1);
        let other = {
            let tree = tree.clone();
            thread::spawn(move || tree.view().grow(page(2), 1))
        };
        // Whether it finds pages 0–1 or splits the merged root, it keeps the left half.
        let got = view.alloc(1);
        assert_eq!(got, Some(page(0)), "two pages were free all along");
        view.free(page(0), 1);
        other.join().unwrap();
        assert_all_free(&view, PAGES);
        assert_eq!(view.alloc(MAX_ORDER), Some(0));
    });
}

/// Pages 0–1 grown. Thread A takes two pages while thread B grows pages 2–3: A takes pages
/// 0–1 (whole, or split off the merged root), B's block stays in the tree, and pages 0–1 can
/// be grown back to a whole tree.
#[test]
fn take_races_a_buddy_grow() {
    loom::model(|| {
        let tree = Tree::growable(MAX_ORDER, PAGES);
        let view = tree.view();
        view.grow(page(0), 1);
        let other = {
            let tree = tree.clone();
            thread::spawn(move || tree.view().grow(page(2), 1))
        };
        assert_eq!(view.take(1), Some(page(0)), "two pages were free all along");
        other.join().unwrap();
        assert_all_free(&view, 2);
        assert_eq!(view.alloc(1), Some(page(2)), "the grown half");
        view.free(page(2), 1);
        view.grow(page(0), 1);
        assert_all_free(&view, PAGES);
        assert_eq!(view.alloc(MAX_ORDER), Some(0));
    });
}

/// An 8-page tree (max order 3), pages 0–3 grown and allocated whole. Thread B grows pages
/// 4–5, converting node 3 (pages 4–7, the buddy of A's block) from Busy to Partial, while
/// thread A frees pages 0–3: A locks the root and reads node 3 mid-conversion; B locks node 3
/// to free node 6. Neither may merge; growing pages 6–7 afterwards must merge everything.
#[test]
fn grow_converts_the_buddy_of_a_block_being_freed() {
    const MAX_ORDER: u32 = 3;
    const PAGES: u64 = 1 << MAX_ORDER;
    loom::model(|| {
        let tree = Tree::growable(MAX_ORDER, PAGES);
        let view = tree.view();
        view.grow(page(0), 2);
        assert_eq!(view.alloc(2), Some(page(0)));
        let other = {
            let tree = tree.clone();
            thread::spawn(move || tree.view().grow(page(4), 1))
        };
        view.free(page(0), 2);
        other.join().unwrap();
        assert_all_free(&view, 6);
        view.grow(page(6), 1);
        assert_all_free(&view, PAGES);
        assert_eq!(
            view.alloc(MAX_ORDER),
            Some(0),
            "the tree did not merge whole"
        );
    });
}

/// A pair of pages from one allocation (`alloc_split(0, 1)`: pages 0–1 as two live blocks) while
/// another thread takes a page: the three blocks are disjoint. Then the pair's halves are freed
/// at once by two threads (one of them frees the other page too): everything merges back to
/// the root.
#[test]
fn a_pairs_halves_are_freed_at_once() {
    loom::model(|| {
        let tree = Tree::new(PAGES);
        let other = {
            let tree = tree.clone();
            thread::spawn(move || tree.view().alloc(0).expect("4 pages, 3 wanted"))
        };
        let pair = tree.view().alloc_split(0, 1).expect("4 pages, 3 wanted");
        let page = other.join().unwrap();
        for half in [pair, pair + PAGE_SIZE as u64] {
            assert!(disjoint(span(half, 0), span(page, 0)));
        }
        race_frees_to_the_root(&tree, &[pair, page], &[pair + PAGE_SIZE as u64]);
    });
}

/// The whole tree as four pages from one allocation (`alloc_split(0, 2)`); two threads free two
/// pages each (thread A pages 0 and 2, thread B pages 1 and 3): the pages of the run merge
/// back to the root as pages split one by one do.
#[test]
fn a_runs_pages_are_freed_at_once() {
    loom::model(|| {
        let tree = Tree::new(PAGES);
        let view = tree.view();
        let run = view.alloc_split(0, MAX_ORDER).expect("a fresh tree");
        assert_eq!(run, 0);
        assert_eq!(view.alloc(0), None);
        let page = |i: u64| run + i * PAGE_SIZE as u64;
        race_frees_to_the_root(&tree, &[page(0), page(2)], &[page(1), page(3)]);
    });
}
