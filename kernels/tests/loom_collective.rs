//! Loom models of the collective mutex (`collective.rs`). Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p toga-kernels --release --test loom_collective`.
//!
//! Under loom a warp is one lane, so a group of two members is modelled by two threads: one
//! acquires for both (`acquire(2)`, the leader's half of `lock`) and then starts the other
//! (spawning orders it after the acquisition, as `bar.warp.sync` does), and each leaves on its
//! own. Critical-section data are loom `UnsafeCell`s: overlapping sections show up as races.
//!
//! Loom cannot finish a model in which two threads spin at once (they yield to each other
//! forever, even for a plain CAS spin lock), so in every model at most one thread spins; the
//! others contend with `try_acquire`.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

use toga_kernels::collective::{CollectiveMutex, Group};

struct Shared {
    mutex: CollectiveMutex,
    a: UnsafeCell<u32>,
    b: UnsafeCell<u32>,
}

fn bump(cell: &UnsafeCell<u32>) {
    // SAFETY: inside the critical section (what loom checks).
    cell.with_mut(|v| unsafe { *v += 1 });
}

fn get(cell: &UnsafeCell<u32>) -> u32 {
    // SAFETY: inside the critical section or after every thread joined.
    cell.with(|v| unsafe { *v })
}

fn shared() -> Arc<Shared> {
    Arc::new(Shared {
        mutex: CollectiveMutex::new(),
        a: UnsafeCell::new(0),
        b: UnsafeCell::new(0),
    })
}

/// Single lanes: one spins in `lock`, two others try once each; mutual exclusion, and the
/// lock ends free.
#[test]
fn single_lanes_exclude_each_other() {
    loom::model(|| {
        let s = shared();
        let triers: Vec<_> = (0..2)
            .map(|_| {
                let s = s.clone();
                thread::spawn(move || {
                    let got = s.mutex.try_acquire(1);
                    if got {
                        bump(&s.a);
                        assert!(s.mutex.unlock());
                    }
                    got as u32
                })
            })
            .collect();
        s.mutex.lock(&Group::single());
        bump(&s.a);
        assert!(s.mutex.unlock());
        let tried: u32 = triers.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(get(&s.a), 1 + tried);
        assert!(!s.mutex.is_locked());
    });
}

/// A group of two enters with one acquisition; members leave in any order; an outsider gets
/// in only after both left, and sees both members' writes.
#[test]
fn group_enters_together_and_last_member_unlocks() {
    loom::model(|| {
        let s = shared();
        let outsider = {
            let s = s.clone();
            thread::spawn(move || {
                s.mutex.lock_single();
                let seen = (get(&s.a), get(&s.b));
                s.mutex.unlock();
                seen
            })
        };
        s.mutex.acquire(2);
        // The member starts after the acquisition (the warp barrier of `lock`).
        let member = {
            let s = s.clone();
            thread::spawn(move || {
                bump(&s.b);
                s.mutex.unlock()
            })
        };
        bump(&s.a);
        let leader_last = s.mutex.unlock();
        let member_last = member.join().unwrap();
        assert!(
            leader_last != member_last,
            "exactly one member releases the lock"
        );
        let seen = outsider.join().unwrap();
        // The outsider ran entirely before the group or entirely after it.
        assert!(
            seen == (0, 0) || seen == (1, 1),
            "outsider overlapped the group: {seen:?}"
        );
        assert!(!s.mutex.is_locked());
    });
}

/// `try_acquire` fails while anyone is inside and succeeds once all left.
#[test]
fn try_acquire_respects_members() {
    loom::model(|| {
        let s = shared();
        s.mutex.acquire(2);
        let other = {
            let s = s.clone();
            thread::spawn(move || {
                let got = s.mutex.try_acquire(1);
                if got {
                    bump(&s.a);
                    s.mutex.unlock();
                }
                got
            })
        };
        s.mutex.unlock();
        bump(&s.b);
        s.mutex.unlock();
        let got = other.join().unwrap();
        // Before both left, the other thread cannot have entered; after, it may have.
        assert_eq!(get(&s.a), got as u32);
        assert!(!s.mutex.is_locked());
    });
}
