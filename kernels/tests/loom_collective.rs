//! Loom models of the collective mutex and of `SingleFlight` (`collective.rs`). Run with
//! `RUSTFLAGS="--cfg loom -C debug-assertions=on" LOOM_MAX_PREEMPTIONS=3 cargo test -p toga-kernels --release --test loom_collective`.
//!
//! Here a group of two members is modelled by two threads of no model warp (a warp of one
//! lane each; `loom_warp.rs` runs the group paths on `platform::ModelWarp`s of two lanes): one
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
use loom::sync::atomic::{AtomicU32, Ordering::Relaxed};
use loom::thread;

use toga_kernels::collective::{CollectiveMutex, Group, SingleFlight};

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

/// A [`SingleFlight`] model's shared state: `x` is written by the first run only (so a
/// caller's read of it races with nothing but that write), `runs` counts runs, `ended` is the
/// number of the newest run that ended.
struct Flight {
    gate: SingleFlight,
    x: UnsafeCell<u32>,
    runs: AtomicU32,
    ended: AtomicU32,
}

/// The work: run number `n`; the first run writes `x`.
fn flight(f: &Flight) -> u32 {
    let n = f.runs.fetch_add(1, Relaxed) + 1;
    if n == 1 {
        // SAFETY: only the first run writes; loom checks every read is ordered after it.
        f.x.with_mut(|v| unsafe { *v = 1 });
    }
    f.ended.store(n, Relaxed);
    n
}

/// One caller: the run it got must have ended after the call began (INV(SF1)), and its
/// effects (the first run's `x`) are visible without a race once the call returns.
fn call(f: &Flight) -> u32 {
    let before = f.ended.load(Relaxed);
    let got = f.gate.run_or_join(|| flight(f));
    assert!(
        got > before,
        "run {got} ended before the call began (after {before})"
    );
    assert_eq!(get(&f.x), 1, "the run's write is not visible to its caller");
    got
}

/// INV(SF1) with two callers: `run_or_join` returns a run that started after it began and
/// sees its effects; runs never overlap (each is numbered once); the gate ends idle. Loom
/// explores the join (the main thread waits out the other's run, then runs) and runs in turn.
#[test]
fn single_flight_callers_share_a_run_or_run_in_turn() {
    loom::model(|| {
        let f = Arc::new(Flight {
            gate: SingleFlight::new(),
            x: UnsafeCell::new(0),
            runs: AtomicU32::new(0),
            ended: AtomicU32::new(0),
        });
        // Loom cannot finish a model in which the spawned thread spins (see the top): it tries
        // once, and the main thread, which may join its run, spins.
        let other = {
            let f = f.clone();
            thread::spawn(move || {
                let before = f.ended.load(Relaxed);
                let got = f.gate.try_run(|| flight(&f)).ok();
                if let Some(got) = got {
                    assert!(got > before);
                    assert_eq!(get(&f.x), 1);
                }
                got
            })
        };
        let got = call(&f);
        let other_got = other.join().unwrap();
        let runs = f.runs.load(Relaxed);
        match (runs, other_got) {
            // One run: the main thread's; the other found it running.
            (1, None) => assert_eq!(got, 1),
            // Runs in turn, each numbered once: the other's run, which the main thread began
            // before and so did not take as its own, or which ended before it began.
            (2, Some(o)) => assert_eq!(got + o, 3, "runs overlap: {got} and {o}"),
            _ => panic!("{runs} runs; main got {got}, the other {other_got:?}"),
        }
        assert!(
            !f.gate.is_running(),
            "runs {runs}, got {got}, other {other_got:?}"
        );
    });
}
