//! Loom models of the bulk semaphore: three threads, every interleaving (up to the preemption
//! bound). Run with
//! `RUSTFLAGS="--cfg loom -C debug-assertions=on" LOOM_MAX_PREEMPTIONS=2 cargo test -p toga-kernels --release --test loom_bulk_semaphore`.
//!
//! A hang shows up as loom's "too many branches" failure (a spin loop that never ends).
#![cfg(loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicI64, AtomicUsize, Ordering::SeqCst};
use loom::thread;

use toga_kernels::bulk_semaphore::{BulkSemaphore, Global, Layout, PerSm, Shared, Wait};
use toga_kernels::collective::SingleFlight;

/// Units per refill in these models.
const BATCH: u32 = 2;

/// Units behind a semaphore, a refill budget, and a shadow count of the units that exist.
struct Pool<L: Layout = Global> {
    sem: BulkSemaphore<L>,
    units: AtomicI64,
    refills_left: AtomicI64,
    got: AtomicUsize,
}

impl<L: Layout> Pool<L> {
    fn new(available: u32, refills: i64) -> Arc<Self> {
        Arc::new(Self {
            sem: BulkSemaphore::new(available),
            units: AtomicI64::new(available as i64),
            refills_left: AtomicI64::new(refills),
            got: AtomicUsize::new(0),
        })
    }

    /// One unit, batch 2: the TBuddy shape.
    fn take(&self) -> bool {
        self.settle(self.sem.wait(1, BATCH))
    }

    /// What a `wait` of one unit (batch 2) decided: take the unit, or refill from the budget.
    fn settle(&self, wait: Wait) -> bool {
        let ok = match wait {
            Wait::Acquired => {
                assert!(
                    self.units.fetch_sub(1, SeqCst) >= 1,
                    "handed out a unit that did not exist"
                );
                true
            }
            Wait::MustRefill => {
                if self.refills_left.fetch_sub(1, SeqCst) > 0 {
                    self.units.fetch_add(1, SeqCst);
                    self.sem.signal(1, 1);
                    true
                } else {
                    self.sem.retract(1);
                    false
                }
            }
        };
        if ok {
            self.got.fetch_add(1, SeqCst);
        }
        ok
    }
}

fn run<L: Layout + 'static>(pool: &Arc<Pool<L>>, threads: usize, body: fn(&Pool<L>)) {
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let pool = pool.clone();
            thread::spawn(move || body(&pool))
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// Three threads want one unit each; one refill of two exists: exactly two succeed (no false
/// starvation), the third fails and does not hang, and no promise or reservation is left.
#[test]
fn refill_then_exhaustion() {
    loom::model(|| {
        let pool = Pool::<Global>::new(0, 1);
        run(&pool, 3, |p| {
            p.take();
        });
        assert_eq!(pool.got.load(SeqCst), 2);
        assert_eq!(pool.sem.counters(), (0, 0, 0));
    });
}

/// The same with the arena layout (R 12, E 20, C 32 bits): the algorithm does not depend on
/// where the fields sit.
#[test]
fn refill_then_exhaustion_per_sm_layout() {
    loom::model(|| {
        let pool = Pool::<PerSm>::new(0, 1);
        run(&pool, 3, |p| {
            p.take();
        });
        assert_eq!(pool.got.load(SeqCst), 2);
        assert_eq!(pool.sem.counters(), (0, 0, 0));
    });
}

/// No refill can succeed and nothing is available: every thread fails, none hangs.
#[test]
fn failed_refills_release_waiters() {
    loom::model(|| {
        let pool = Pool::<Global>::new(0, 0);
        run(&pool, 3, |p| {
            assert!(!p.take());
        });
        assert_eq!(pool.sem.counters(), (0, 0, 0));
    });
}

/// One unit circulates between a `wait`er that gives it back and two `try_wait`ers.
#[test]
fn try_wait_against_wait_and_release() {
    loom::model(|| {
        let pool = Pool::<Global>::new(1, 0);
        let handles = [
            {
                let p = pool.clone();
                thread::spawn(move || {
                    if p.take() {
                        p.units.fetch_add(1, SeqCst);
                        p.sem.release(1);
                    }
                })
            },
            {
                let p = pool.clone();
                thread::spawn(move || {
                    if p.sem.try_wait(1) {
                        assert!(p.units.fetch_sub(1, SeqCst) >= 1);
                        p.units.fetch_add(1, SeqCst);
                        p.sem.release(1);
                    }
                })
            },
        ];
        if pool.sem.try_wait(1) {
            assert!(pool.units.fetch_sub(1, SeqCst) >= 1);
            pool.units.fetch_add(1, SeqCst);
            pool.sem.release(1);
        }
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(pool.sem.counters(), (1, 0, 0));
        assert_eq!(pool.units.load(SeqCst), 1);
    });
}

/// TBuddy's group walk (`take_spare`) against two waiters of the wait protocol and one refill:
/// the walk takes only units beyond the reservations, so the two units that exist go to the
/// waiters or to the walk, every one of them, none twice, and nothing is left reserved or
/// promised. A waiter fails only if the walk took the spare unit before the waiter reserved.
#[test]
fn take_spare_against_waiters() {
    loom::model(|| {
        let pool = Pool::<Global>::new(0, 1);
        let spare = Arc::new(AtomicUsize::new(0));
        let walker = {
            let (p, spare) = (pool.clone(), spare.clone());
            thread::spawn(move || {
                if p.sem.take_spare(1) == 1 {
                    assert!(
                        p.units.fetch_sub(1, SeqCst) >= 1,
                        "the walk took a unit that did not exist"
                    );
                    spare.fetch_add(1, SeqCst);
                }
            })
        };
        run(&pool, 2, |p| {
            p.take();
        });
        walker.join().unwrap();
        let (c, e, r) = pool.sem.counters();
        assert_eq!((e, r), (0, 0));
        assert_eq!(
            pool.got.load(SeqCst) + spare.load(SeqCst) + c as usize,
            2,
            "the refill's two units"
        );
        assert_eq!(pool.units.load(SeqCst), c as i64);
    });
}

/// A waiter that holds a reservation, covered by a refill in flight, gets the refill's unit
/// even while the group walk looks: `take_spare` sees the unit owed (C − R = 0) and takes
/// nothing. (A walk that took every unit in C would leave the waiter uncovered, and it would
/// turn refiller with nothing to refill from.)
#[test]
fn take_spare_leaves_a_reserved_waiter_its_unit() {
    loom::model(|| {
        let sem = Arc::new(BulkSemaphore::<Global>::new(0));
        // A refiller's promise: one unit is on its way.
        assert_eq!(sem.wait(1, 2), Wait::MustRefill);
        let waiter = {
            let s = sem.clone();
            thread::spawn(move || s.wait(1, 2))
        };
        while sem.counters().2 == 0 {
            thread::yield_now();
        }
        let walker = {
            let s = sem.clone();
            thread::spawn(move || s.take_spare(1))
        };
        sem.signal(1, 1);
        assert_eq!(waiter.join().unwrap(), Wait::Acquired);
        assert_eq!(walker.join().unwrap(), 0);
        assert_eq!(sem.counters(), (0, 0, 0));
    });
}

/// One unit through [`BulkSemaphore::take_shared`] (INV(UA16), a class's home): one refill of
/// two units at a time through the gate, from the pool's refill budget.
fn take_shared(p: &Pool<PerSm>, gate: &SingleFlight) -> Shared {
    let got = p.sem.take_shared(gate, 1, 2, 2, || {
        if p.refills_left.fetch_sub(1, SeqCst) > 0 {
            // Two made, one kept: one goes to the semaphore.
            p.units.fetch_add(1, SeqCst);
            p.sem.signal(1, 1);
            Some(2)
        } else {
            p.sem.retract(1);
            None
        }
    });
    match got {
        Shared::Taken => assert!(
            p.units.fetch_sub(1, SeqCst) >= 1,
            "handed out a unit that did not exist"
        ),
        Shared::Refilled(token) => assert_eq!(token, 2),
        Shared::Exhausted | Shared::Busy => return got,
    }
    p.got.fetch_add(1, SeqCst);
    got
}

/// Two threads of other SMs take units through the shared refill while the semaphore's own
/// thread waits and refills as usual, with one refill of two units in the budget. No unit goes
/// out twice or is lost, nothing stays promised or reserved, and a thread reports the heap
/// exhausted only when a refill really found nothing.
///
/// Bound 2 only: from bound 3 loom finds a schedule it cannot end, the waiter (covered by the
/// gate's promise) and the gate's joiner yielding to each other while the gate's refiller,
/// preempted inside `signal`, is never scheduled again (loom has no fairness between yielding
/// threads, tokio-rs/loom#53); `scripts/loom-deep.sh` skips it there.
#[test]
fn shared_refills_against_a_waiter() {
    loom::model(|| {
        let pool = Pool::<PerSm>::new(0, 1);
        let gate = Arc::new(SingleFlight::new());
        let others: Vec<_> = (0..2)
            .map(|_| {
                let (p, g) = (pool.clone(), gate.clone());
                thread::spawn(move || take_shared(&p, &g))
            })
            .collect();
        let own = pool.take();
        let results: Vec<Shared> = others.into_iter().map(|h| h.join().unwrap()).collect();
        let (c, e, r) = pool.sem.counters();
        assert_eq!((e, r), (0, 0));
        assert_eq!(pool.units.load(SeqCst), c as i64);
        assert_eq!(
            pool.got.load(SeqCst) + c as usize,
            2,
            "the refill's two units are handed out or left in the semaphore"
        );
        if results.contains(&Shared::Exhausted) || !own {
            assert!(
                pool.refills_left.load(SeqCst) <= 0,
                "failed with a refill left"
            );
        }
    });
}

/// One unit for a caller that looks at `home` (a class's home, INV(UA16)) when `p`'s fast path
/// misses, before it reserves on `p` (`wait_fast`, then `wait_after`).
fn take_or(p: &Pool<PerSm>, home: &Pool<PerSm>) -> bool {
    let miss = match p.sem.wait_fast(1) {
        Ok(()) => return p.settle(Wait::Acquired),
        Err(miss) => miss,
    };
    match p
        .sem
        .wait_after(miss, 1, BATCH, true, || home.sem.try_wait(1).then_some(()))
    {
        Err(()) => {
            assert!(
                home.units.fetch_sub(1, SeqCst) >= 1,
                "handed out a unit of the home that did not exist"
            );
            home.got.fetch_add(1, SeqCst);
            true
        }
        Ok(wait) => p.settle(wait),
    }
}

/// Two callers of `wait_fast`/`wait_after` that look at a home with one unit, and a plain waiter, on an empty
/// semaphore with one refill of two: the refill's two units and the home's one go out once
/// each (a look at the home can fail while the other's deduction is in flight, INV(SEM3), and
/// then three want the refill's two), nothing is lost, and no reservation or promise is left.
///
/// At bound 3 this once ended with a unit left in the semaphore and a caller failed: the main
/// thread's `wait_fast` deduction hid the unit the waiter's refill signalled, so the other
/// caller saw its reservation uncovered, refilled from an empty budget and gave up, and the
/// main thread then gave its deduction back and took the home's unit. `wait_after` now waits
/// here when its give-back shows the units back.
#[test]
fn a_miss_looks_at_the_home_before_it_reserves() {
    loom::model(|| {
        let pool = Pool::<PerSm>::new(0, 1);
        let home = Pool::<PerSm>::new(1, 0);
        let other = {
            let (p, h) = (pool.clone(), home.clone());
            thread::spawn(move || take_or(&p, &h))
        };
        let waiter = {
            let p = pool.clone();
            thread::spawn(move || p.take())
        };
        take_or(&pool, &home);
        other.join().unwrap();
        waiter.join().unwrap();
        assert_eq!(pool.got.load(SeqCst), 2);
        assert_eq!(pool.sem.counters(), (0, 0, 0));
        let from_home = home.got.load(SeqCst) as u32;
        assert!(from_home <= 1);
        assert_eq!(home.sem.counters(), (1 - from_home, 0, 0));
    });
}
