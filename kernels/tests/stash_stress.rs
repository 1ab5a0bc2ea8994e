//! The stash (`stash.rs`) under OS threads standing in for GPU threads, checked against a
//! shadow oracle: each value has one holder at a time, a thread or the stash, and every put
//! and take moves it between them exactly once (INV(ST1)). The ring is exactly as large as
//! the values there are, the tightest bound INV(ST2) allows, so puts wait on slots whose
//! takers are still on their way.
#![cfg(not(loom))]

mod common;

use common::{Rng, with_deadline};

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering::SeqCst};

use toga_kernels::collective::Group;
use toga_kernels::platform::Atomic32;
use toga_kernels::stash::{Stash, StashHeader};

const THREADS: usize = 8;
/// Values per thread at the start; the ring has a slot for every value of every thread.
const PER_THREAD: usize = 16;
const VALUES: usize = THREADS * PER_THREAD;
const ROUNDS: usize = 200_000;

/// Where a value is: with a thread or in the stash.
const HELD: u8 = 0;
const STASHED: u8 = 1;

struct Shared {
    header: StashHeader,
    slots: Vec<Atomic32>,
    /// The oracle: index `v - 1` for value `v`.
    whereabouts: Vec<AtomicU8>,
}

impl Shared {
    fn stash(&self) -> Stash<'_> {
        Stash::new(&self.header, &self.slots)
    }
}

#[test]
fn every_value_is_taken_once_for_each_put() {
    with_deadline(|| {
        let shared = Arc::new(Shared {
            header: StashHeader::new(),
            slots: (0..VALUES).map(|_| Atomic32::new(0)).collect(),
            whereabouts: (0..VALUES).map(|_| AtomicU8::new(HELD)).collect(),
        });
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let shared = shared.clone();
                std::thread::spawn(move || {
                    let stash = shared.stash();
                    let mut rng = Rng(t as u64 * 7919 + 1);
                    let mut mine: Vec<u32> = (0..PER_THREAD)
                        .map(|i| (t * PER_THREAD + i + 1) as u32)
                        .collect();
                    let (mut puts, mut takes) = (0u64, 0u64);
                    for _ in 0..ROUNDS {
                        if !mine.is_empty() && rng.below(2) == 0 {
                            let v = mine.swap_remove(rng.below(mine.len() as u64) as usize);
                            let was = shared.whereabouts[v as usize - 1].swap(STASHED, SeqCst);
                            assert_eq!(was, HELD, "value {v} put while in the stash");
                            stash.put(&Group::single(), v);
                            puts += 1;
                        } else if let Some(v) = stash.take_one() {
                            assert!((1..=VALUES as u32).contains(&v), "a value never put: {v}");
                            let was = shared.whereabouts[v as usize - 1].swap(HELD, SeqCst);
                            assert_eq!(was, STASHED, "value {v} taken twice");
                            mine.push(v);
                            takes += 1;
                        }
                    }
                    (mine, puts, takes)
                })
            })
            .collect();
        let mut held = Vec::new();
        let (mut puts, mut takes) = (0, 0);
        for h in handles {
            let (mine, p, t) = h.join().unwrap();
            held.extend(mine);
            puts += p;
            takes += t;
        }
        assert!(
            puts > ROUNDS as u64 && takes > ROUNDS as u64,
            "{puts} puts, {takes} takes"
        );
        // What the threads hold and what the stash gives back: every value exactly once.
        let stash = shared.stash();
        let in_stash = stash.len();
        while let Some(v) = stash.take_one() {
            held.push(v);
        }
        assert_eq!(held.len(), VALUES, "{in_stash} values were in the stash");
        held.sort_unstable();
        assert!(
            held.iter().copied().eq(1..=VALUES as u32),
            "a value lost or doubled"
        );
        assert!(stash.is_empty());
        assert_eq!(shared.header.items.0.load_relaxed(), 0);
        let (fill, drain) = (
            shared.header.fill.0.load_relaxed(),
            shared.header.drain.0.load_relaxed(),
        );
        assert_eq!(fill, drain, "every ticket handed to a giver was taken");
        assert!(shared.slots.iter().all(|s| s.load_relaxed() == 0));
    });
}
