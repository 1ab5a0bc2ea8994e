//! Loom models of the bulk semaphore: three threads, every interleaving (up to the preemption
//! bound). Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p toga-kernels --release --test loom_bulk_semaphore`.
//!
//! A hang shows up as loom's "too many branches" failure (a spin loop that never ends).
#![cfg(loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicI64, AtomicUsize, Ordering::SeqCst};
use loom::thread;

use toga_kernels::bulk_semaphore::{BulkSemaphore, Global, Layout, PerSm, Wait};

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
        const BATCH: u32 = 2;
        let ok = match self.sem.wait(1, BATCH) {
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
