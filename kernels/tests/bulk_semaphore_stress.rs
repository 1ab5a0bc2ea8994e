//! Stress tests of the bulk semaphore with OS threads standing in for GPU threads.
//!
//! A shadow pool (`Pool::units`) holds the units that really exist: producers add to it before
//! they `signal`, consumers take from it after `wait` succeeds. If the semaphore ever handed out
//! a unit that does not exist, the shadow count would go negative.
#![cfg(not(loom))]

mod common;

use common::{Rng, with_deadline};

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::SeqCst};

use toga_kernels::bulk_semaphore::{BulkSemaphore, Wait};

const THREADS: usize = 8;

/// A pool of units behind a semaphore, with a budget of refills.
struct Pool {
    sem: BulkSemaphore,
    /// Units that exist and are not handed out (the shadow of C).
    units: AtomicI64,
    /// Refills that may still succeed; a refill past it fails (out of memory).
    refills_left: AtomicI64,
    failed_refills: AtomicU64,
}

impl Pool {
    fn new(refills: i64) -> Self {
        Self {
            sem: BulkSemaphore::new(0),
            units: AtomicI64::new(0),
            refills_left: AtomicI64::new(refills),
            failed_refills: AtomicU64::new(0),
        }
    }

    /// Take `n` units; `false` when out of memory.
    fn take(&self, n: u32, batch: u32, collective: bool) -> bool {
        let w = if collective {
            self.sem.wait_collective(n, batch)
        } else {
            self.sem.wait(n, batch)
        };
        match w {
            Wait::Acquired => {
                let before = self.units.fetch_sub(n as i64, SeqCst);
                assert!(
                    before >= n as i64,
                    "semaphore handed out {n} units, only {before} existed"
                );
                true
            }
            Wait::MustRefill => {
                if self.refills_left.fetch_sub(1, SeqCst) > 0 {
                    // Create `batch`, keep `n`, publish the rest before signalling.
                    self.units.fetch_add((batch - n) as i64, SeqCst);
                    self.sem.signal(batch - n, batch - n);
                    true
                } else {
                    self.failed_refills.fetch_add(1, SeqCst);
                    self.sem.retract(batch - n);
                    false
                }
            }
        }
    }

    fn give_back(&self, n: u32) {
        self.units.fetch_add(n as i64, SeqCst);
        self.sem.release(n);
    }

    fn assert_quiescent(&self) {
        let (c, e, r) = self.sem.counters();
        assert_eq!((e, r), (0, 0), "promises or reservations left over");
        assert_eq!(
            c as i64,
            self.units.load(SeqCst),
            "C differs from the shadow pool"
        );
    }
}

/// Random take/give-back with an unlimited refill budget: every take succeeds, the shadow pool
/// never goes negative, and the counters end consistent.
#[test]
fn wait_signal_release_with_shadow_count() {
    with_deadline(|| {
        const OPS: usize = 100_000;
        const BATCH: u32 = 8;
        let pool = Pool::new(i64::MAX);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let pool = &pool;
                s.spawn(move || {
                    let mut rng = Rng(t as u64 + 1);
                    let mut held: Vec<u32> = Vec::new();
                    for _ in 0..OPS {
                        if held.is_empty() || rng.below(3) != 0 {
                            let n = 1 + rng.below(3) as u32;
                            assert!(
                                pool.take(n, BATCH, t % 2 == 0),
                                "take failed with unlimited refills"
                            );
                            held.push(n);
                        } else {
                            let i = rng.below(held.len() as u64) as usize;
                            pool.give_back(held.swap_remove(i));
                        }
                    }
                    for n in held {
                        pool.give_back(n);
                    }
                });
            }
        });
        pool.assert_quiescent();
        assert_eq!(pool.failed_refills.load(SeqCst), 0);
    });
}

/// Out of memory: `REFILLS` refills of `BATCH` units exist; more threads want one unit each and
/// keep it. Exactly `REFILLS * BATCH` succeed (no false starvation), the rest fail, none hangs.
#[test]
fn exhausted_refills_fail_without_hanging_and_without_false_starvation() {
    with_deadline(|| {
        const REFILLS: i64 = 40;
        const BATCH: u32 = 4;
        const WANTS_PER_THREAD: usize = 30;
        for round in 0..20 {
            let pool = Pool::new(REFILLS);
            let got = AtomicU64::new(0);
            std::thread::scope(|s| {
                for t in 0..THREADS {
                    let (pool, got) = (&pool, &got);
                    s.spawn(move || {
                        for _ in 0..WANTS_PER_THREAD {
                            if pool.take(1, BATCH, (t + round) % 2 == 0) {
                                got.fetch_add(1, SeqCst);
                            }
                        }
                    });
                }
            });
            let capacity = REFILLS as u64 * BATCH as u64;
            assert!((THREADS * WANTS_PER_THREAD) as u64 > capacity);
            assert_eq!(
                got.load(SeqCst),
                capacity,
                "round {round}: units left unused or over-handed"
            );
            pool.assert_quiescent();
            assert_eq!(pool.sem.counters(), (0, 0, 0));
        }
    });
}

/// Refills fail at random (a flaky producer): waiters that counted on a failed refill must
/// retry, and every take either gets real units or reports failure.
#[test]
fn random_refill_failures_never_hang() {
    with_deadline(|| {
        const OPS: usize = 10_000;
        const BATCH: u32 = 3;
        let pool = Pool::new(0);
        let attempts = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (pool, attempts) = (&pool, &attempts);
                s.spawn(move || {
                    let mut rng = Rng(0xfeed + t as u64);
                    for _ in 0..OPS {
                        // The budget is topped up at random, too slowly for the demand.
                        if rng.below(4 * BATCH as u64) == 0 {
                            pool.refills_left.fetch_add(1, SeqCst);
                        }
                        attempts.fetch_add(1, SeqCst);
                        if pool.take(1, BATCH, false) && rng.below(2) == 0 {
                            pool.give_back(1);
                        }
                    }
                });
            }
        });
        pool.assert_quiescent();
        assert!(
            pool.failed_refills.load(SeqCst) > 0,
            "the test never exercised a failed refill"
        );
    });
}

/// `try_wait` never takes units that are not there, and never refills.
#[test]
fn try_wait_takes_only_what_exists() {
    with_deadline(|| {
        const START: u32 = 5;
        const OPS: usize = 20_000;
        let pool = Pool::new(0);
        pool.units.store(START as i64, SeqCst);
        pool.sem.release(START);
        let successes = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (pool, successes) = (&pool, &successes);
                s.spawn(move || {
                    let mut rng = Rng(77 + t as u64);
                    for _ in 0..OPS {
                        let n = 1 + rng.below(2) as u32;
                        if pool.sem.try_wait(n) {
                            let before = pool.units.fetch_sub(n as i64, SeqCst);
                            assert!(
                                before >= n as i64,
                                "try_wait took {n}, only {before} existed"
                            );
                            successes.fetch_add(1, SeqCst);
                            pool.give_back(n);
                        }
                    }
                });
            }
        });
        assert!(successes.load(SeqCst) > 0);
        assert_eq!(pool.sem.counters(), (START, 0, 0));
        assert_eq!(pool.units.load(SeqCst), START as i64);
        // Nothing left to take beyond START, and a failed try_wait changes nothing.
        assert!(!pool.sem.try_wait(START + 1));
        assert!(pool.sem.try_wait(START));
        assert_eq!(pool.sem.counters(), (0, 0, 0));
    });
}
