//! Loom models of the stash (`stash.rs`): givers and takers on a ring as small as the values
//! there are (INV(ST2)), so that puts wait on slots whose takers have not emptied them yet.
//! Run with
//! `RUSTFLAGS="--cfg loom -C debug-assertions=on" LOOM_MAX_PREEMPTIONS=2 cargo test -p toga-kernels --release --test loom_stash`.
//!
//! The oracle is INV(ST1): every value put is taken exactly once or is still in the stash at
//! the end, never both, never neither.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;

use toga_kernels::collective::Group;
use toga_kernels::platform::Atomic32;
use toga_kernels::stash::{Stash, StashHeader};

struct Shared {
    header: StashHeader,
    slots: Vec<Atomic32>,
}

impl Shared {
    fn new(slots: usize) -> Arc<Self> {
        Arc::new(Self {
            header: StashHeader::new(),
            slots: (0..slots).map(|_| Atomic32::new(0)).collect(),
        })
    }

    fn stash(&self) -> Stash<'_> {
        Stash::new(&self.header, &self.slots)
    }
}

/// Everything left in the stash, then the whole multiset of values, sorted.
fn settle(shared: &Shared, mut seen: Vec<u32>) -> Vec<u32> {
    let stash = shared.stash();
    while let Some(v) = stash.take_one() {
        seen.push(v);
    }
    assert!(stash.is_empty());
    seen.sort_unstable();
    seen
}

/// One value in a ring of one slot. Two threads each take it if they can and put it back:
/// a put may find the slot full until the other thread's take empties it.
#[test]
fn one_value_passes_between_two_threads_through_one_slot() {
    loom::model(|| {
        let shared = Shared::new(1);
        shared.stash().put(&Group::single(), 7);
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let shared = shared.clone();
                thread::spawn(move || {
                    let stash = shared.stash();
                    if let Some(v) = stash.take_one() {
                        assert_eq!(v, 7);
                        stash.put(&Group::single(), v);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(settle(&shared, Vec::new()), vec![7]);
    });
}

/// Two values in a ring of two slots: each thread puts its own, then takes one, which may be
/// either value; nothing is lost or taken twice.
#[test]
fn two_givers_that_take_lose_and_double_nothing() {
    loom::model(|| {
        let shared = Shared::new(2);
        let handles: Vec<_> = (1..=2u32)
            .map(|v| {
                let shared = shared.clone();
                thread::spawn(move || {
                    let stash = shared.stash();
                    stash.put(&Group::single(), v);
                    stash.take_one()
                })
            })
            .collect();
        let taken: Vec<u32> = handles
            .into_iter()
            .filter_map(|h| h.join().unwrap())
            .collect();
        // Each take comes after its own thread's put is counted, and the other thread takes
        // at most one: both find a value.
        assert_eq!(taken.len(), 2);
        assert_eq!(settle(&shared, taken), vec![1, 2]);
    });
}

/// Two values in a ring of two slots, both put at the start. Two threads each take one and
/// put it back: a put's ticket wraps to the slot of the first value, which may still be
/// there while its taker holds its ticket, so the put waits for that take.
#[test]
fn a_put_waits_for_the_taker_of_its_slot() {
    loom::model(|| {
        let shared = Shared::new(2);
        shared.stash().put(&Group::single(), 1);
        shared.stash().put(&Group::single(), 2);
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let shared = shared.clone();
                thread::spawn(move || {
                    let stash = shared.stash();
                    let v = stash.take_one().expect("two values for two takes");
                    stash.put(&Group::single(), v);
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(settle(&shared, Vec::new()), vec![1, 2]);
    });
}
