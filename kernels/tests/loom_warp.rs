//! Loom models of the group paths with warps of two lanes (`platform::ModelWarp`): groups that
//! `match.any` forms, the collective mutex entered by a group of two with one acquisition
//! (`collective.rs`), and a stash's take for a group of two (`stash.rs`). Run with
//! `RUSTFLAGS="--cfg loom -C debug-assertions=on" LOOM_MAX_PREEMPTIONS=3 cargo test -p toga-kernels --release --test loom_warp`
//! (debug assertions on, as `.ci/run` does).
//!
//! Each lane is a loom thread that joins its warp first; the warps name SM 0 and SM 1.
//! Critical-section data and the blocks a stash passes are loom `UnsafeCell`s: an access that
//! the code's fences and barriers do not order after the previous one shows up as a race.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

use toga_kernels::bulk_semaphore::{BulkSemaphore, PerSm, Wait};
use toga_kernels::collective::{CollectiveMutex, Group};
use toga_kernels::platform::{self, Atomic32, ModelWarp};
use toga_kernels::stash::{Stash, StashHeader};

/// Run `f(lane)` on one loom thread per lane of `warp` (after joining it).
fn lanes<R: Send + 'static>(
    warp: &std::sync::Arc<ModelWarp>,
    mask: u32,
    f: impl Fn(u32) -> R + Clone + Send + 'static,
) -> Vec<thread::JoinHandle<R>> {
    (0..32)
        .filter(|l| mask >> l & 1 == 1)
        .map(|lane| {
            let (warp, f) = (warp.clone(), f.clone());
            thread::spawn(move || {
                ModelWarp::enter(&warp, lane);
                f(lane)
            })
        })
        .collect()
}

/// Two lanes with one key form one group (lane 0 leads), two with different keys two groups
/// of one; every lane learns its leader's value by a broadcast. Lane ids, masks and SM ids are
/// the warp's.
#[test]
fn match_any_groups_lanes_by_key() {
    loom::model(|| {
        for (keys, groups) in [([7u64, 7], [0b11u32, 0b11]), ([7, 8], [0b01, 0b10])] {
            let warp = ModelWarp::new(0b11, 1);
            let got: Vec<_> = lanes(&warp, 0b11, move |lane| {
                assert_eq!(platform::active_mask(), 0b11);
                assert_eq!((platform::lane_id(), platform::sm_id()), (lane, 1));
                let g = Group::of(keys[lane as usize]);
                let from_leader = g.broadcast_u32(100 + lane);
                (g.mask(), g.leader(), from_leader)
            })
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
            for (lane, (mask, leader, value)) in got.into_iter().enumerate() {
                assert_eq!(mask, groups[lane], "keys {keys:?}");
                assert_eq!(value, 100 + leader);
            }
        }
    });
}

struct Section {
    mutex: CollectiveMutex,
    /// One cell per lane of the group; the lone lane writes both.
    data: [UnsafeCell<u32>; 2],
}

// SAFETY: every access to the cell is one loom checks for races.
unsafe impl Sync for Section {}

fn bump(cell: &UnsafeCell<u32>) {
    // SAFETY: inside the critical section (what loom checks).
    cell.with_mut(|v| unsafe { *v += 1 });
}

/// A group of two lanes (SM 0) enters the collective mutex with one acquisition and each
/// member leaves on its own, while a lone lane of another warp (SM 1) holds it before or
/// after them (it tries once; the group spins). INV(CM1): the members' and the other
/// holder's sections do not overlap (each member writes its own cell, the lone lane both);
/// INV(CM2): `bar.warp.sync` orders the leader's acquire
/// before the other member's accesses, so neither member's access races the lone lane's.
#[test]
fn a_group_of_two_lanes_enters_with_one_acquisition() {
    loom::model(|| {
        let s = Arc::new(Section {
            mutex: CollectiveMutex::new(),
            data: [UnsafeCell::new(0), UnsafeCell::new(0)],
        });
        let lone = {
            let s = s.clone();
            let warp = ModelWarp::new(0b1, 1);
            lanes(&warp, 0b1, move |_| {
                let got = s.mutex.try_acquire(1);
                if got {
                    bump(&s.data[0]);
                    bump(&s.data[1]);
                    assert!(s.mutex.unlock());
                }
                got as u32
            })
        };
        let warp = ModelWarp::new(0b11, 0);
        let members = {
            let s = s.clone();
            lanes(&warp, 0b11, move |lane| {
                let g = Group::of(1);
                assert_eq!(g.size(), 2);
                s.mutex.lock(&g);
                bump(&s.data[lane as usize]);
                s.mutex.unlock() as u32
            })
        };
        let last: u32 = members.into_iter().map(|h| h.join().unwrap()).sum();
        let lone: u32 = lone.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(last, 1, "exactly one member unlocks");
        assert!(!s.mutex.is_locked());
        for cell in &s.data {
            // SAFETY: every thread joined.
            assert_eq!(cell.with(|v| unsafe { *v }), 1 + lone);
        }
    });
}

struct Shared {
    header: StashHeader,
    slots: Vec<Atomic32>,
    /// The "blocks" the values stand for: value `v` is block `v - 1`.
    blocks: Vec<UnsafeCell<u32>>,
}

/// A group of two lanes takes from a stash (`take` with n = 2: one count, one drain ticket for
/// both, each lane its own slot) while a lone lane of another warp puts a second value. Each
/// value is taken once or is still there; the block's write before its put happens before
/// its taker's read (the put's fence, the take's acquire swap).
#[test]
fn a_group_of_two_takes_from_a_stash_while_another_warp_puts() {
    loom::model(|| {
        let shared = Arc::new(Shared {
            header: StashHeader::new(),
            slots: (0..2).map(|_| Atomic32::new(0)).collect(),
            blocks: (0..2).map(|_| UnsafeCell::new(0)).collect(),
        });
        let write = |s: &Shared, v: u32| {
            // SAFETY: the block is the putter's until its put (what loom checks).
            s.blocks[v as usize - 1].with_mut(|b| unsafe { *b = 10 * v });
        };
        write(&shared, 1);
        shared.stash().put(&Group::single(), 1);
        let putter = {
            let s = shared.clone();
            lanes(&ModelWarp::new(0b1, 1), 0b1, move |_| {
                write(&s, 2);
                s.stash().put(&Group::single(), 2);
            })
        };
        let takers = {
            let s = shared.clone();
            lanes(&ModelWarp::new(0b11, 0), 0b11, move |_| {
                let g = Group::of(0);
                let (value, got) = s.stash().take(&g);
                assert!((1..=2).contains(&got) && (g.rank() < got) == value.is_some());
                if let Some(v) = value {
                    // SAFETY: the taker owns the block (what loom checks).
                    let b = s.blocks[v as usize - 1].with(|b| unsafe { *b });
                    assert_eq!(b, 10 * v, "a taken block's contents");
                }
                value
            })
        };
        for h in putter {
            h.join().unwrap();
        }
        let mut seen: Vec<u32> = takers
            .into_iter()
            .filter_map(|h| h.join().unwrap())
            .collect();
        let stash = shared.stash();
        while let Some(v) = stash.take_one() {
            seen.push(v);
        }
        seen.sort_unstable();
        assert_eq!(seen, [1, 2], "every value taken once or left");
    });
}

// SAFETY: as for `Section`.
unsafe impl Sync for Shared {}

impl Shared {
    fn stash(&self) -> Stash<'_> {
        Stash::new(&self.header, &self.slots)
    }
}

/// `BulkSemaphore::wait_collective` for a group of two lanes (the leader's one add takes a unit
/// for each lane it can serve, the others go the slow way) while a lone lane of another warp
/// waits too, on a semaphore with 2 units for 3 lanes. A lane told to refill makes a batch of
/// 2, keeps 1 and signals the other. Every lane gets a unit, and the units left are exactly
/// those the refills made beyond what they kept: none lost, none twice (INV(SEM1),
/// INV(SEM3)), no reservation or promise left.
#[test]
fn a_group_of_two_and_a_lone_lane_wait_on_one_semaphore() {
    loom::model(|| {
        let sem = Arc::new(BulkSemaphore::<PerSm>::new(2));
        let wait = |sem: &BulkSemaphore<PerSm>| match sem.wait_collective(1, 2) {
            Wait::Acquired => 0,
            Wait::MustRefill => {
                sem.signal(1, 1);
                1
            }
        };
        let lone = {
            let sem = sem.clone();
            lanes(&ModelWarp::new(0b1, 1), 0b1, move |_| wait(&sem))
        };
        let group = {
            let sem = sem.clone();
            lanes(&ModelWarp::blocking(0b11, 0), 0b11, move |_| wait(&sem))
        };
        let refills: u32 = group
            .into_iter()
            .chain(lone)
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(
            sem.counters(),
            (refills, 0, 0),
            "(C, E, R) after {refills} refills"
        );
    });
}
