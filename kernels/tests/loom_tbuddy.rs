//! Loom models of TBuddy: a 4-page tree (max order 2), two threads, every interleaving up to
//! the preemption bound. Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p toga-kernels --release --test loom_tbuddy`.
//!
//! Each model ends by checking the tree (`assert_valid`: TB1–TB7) and that every page came
//! back; the blocks two threads hold at once must not overlap.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;

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
        let (a, b) = ([page(0), page(2)], [page(1), page(3)]);
        let other = {
            let tree = tree.clone();
            thread::spawn(move || b.iter().for_each(|&p| tree.view().free(p, 0)))
        };
        a.iter().for_each(|&p| view.free(p, 0));
        other.join().unwrap();
        view.assert_valid();
        assert_eq!(
            view.alloc(MAX_ORDER),
            Some(0),
            "the pages did not merge back to the root"
        );
    });
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
