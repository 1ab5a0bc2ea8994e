//! Loom models of one UAlloc bin under concurrent claims, releases and retirement
//! (`ualloc/bin.rs`). Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p toga-kernels --release --test loom_bin`.
//!
//! The bin is a 128 B class bin (32 slots, one bitmap word), so every claim and release hits
//! the same words. Checked: no slot is handed out twice, `used` matches the bitmap when the
//! threads are done (INV(UA3)), a retired bin hands out nothing (INV(UA4)), a double free is
//! reported once.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;

use toga_kernels::size_class::SizeClass;
use toga_kernels::ualloc::bin::{BinHeader, Claim, Release, USED_RETIRED};

fn class() -> SizeClass {
    SizeClass::from_size(128)
}

fn bin(claimed: u32) -> Arc<BinHeader> {
    let b = Arc::new(BinHeader::new());
    b.init(class(), claimed);
    b
}

fn claim_one(b: &BinHeader) -> Claim {
    b.claim(class(), 0, 1)
}

/// Two claimers race for the last free slot: exactly one gets it and sees the bin full.
#[test]
fn last_slot_goes_to_one_claimer() {
    loom::model(|| {
        let b = bin(class().slots() - 1);
        let other = {
            let b = b.clone();
            thread::spawn(move || claim_one(&b))
        };
        let mine = claim_one(&b);
        let theirs = other.join().unwrap();
        let got: Vec<_> = [mine, theirs]
            .into_iter()
            .filter(|c| matches!(c, Claim::Got { .. }))
            .collect();
        assert_eq!(got.len(), 1, "{mine:?} {theirs:?}");
        assert!(matches!(got[0], Claim::Got { now_full: true, .. }));
        assert_eq!(b.used_word(), class().slots());
        assert_eq!(b.taken_slots(class()), class().slots());
    });
}

/// Two claimers that each want two of three free slots get disjoint bits, at most three.
#[test]
fn group_claims_are_disjoint() {
    loom::model(|| {
        let b = bin(class().slots() - 3);
        let other = {
            let b = b.clone();
            thread::spawn(move || b.claim(class(), 0, 2))
        };
        let mine = b.claim(class(), 0, 2);
        let theirs = other.join().unwrap();
        let bits = |c: Claim| match c {
            Claim::Got { bits, .. } => bits,
            _ => 0,
        };
        assert_eq!(bits(mine) & bits(theirs), 0, "slot handed out twice");
        let total = (bits(mine) | bits(theirs)).count_ones();
        assert!((2..=3).contains(&total));
        assert_eq!(b.used_word(), b.taken_slots(class()), "INV(UA3)");
    });
}

/// A release of a full bin races a claim: the claim gets the freed slot or nothing, the
/// release reports the bin was full, and `used` matches the bitmap.
#[test]
fn release_of_full_bin_races_claim() {
    loom::model(|| {
        let b = bin(class().slots());
        let other = {
            let b = b.clone();
            thread::spawn(move || claim_one(&b))
        };
        let release = b.release(class(), 5);
        match (release, other.join().unwrap()) {
            // The claim took the freed slot after the release counted it: the bin went
            // not-full and full again, and both saw their crossing (INV(UA7)).
            (
                Release::Freed { was_full: true, .. },
                Claim::Got {
                    word: 0,
                    bits: 0b10_0000,
                    now_full: true,
                },
            ) => {}
            // The claim took and counted the slot between the release's two atomics: the
            // count never crossed `slots`, and neither reports a crossing.
            (
                Release::Freed {
                    was_full: false, ..
                },
                Claim::Got {
                    word: 0,
                    bits: 0b10_0000,
                    now_full: false,
                },
            ) => {}
            // The claim ran before the release, or missed the slot.
            (Release::Freed { was_full: true, .. }, Claim::NoneFree) => {
                assert_eq!(b.used_word(), class().slots() - 1)
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(b.used_word(), b.taken_slots(class()), "INV(UA3)");
    });
}

/// The last slot is released and the bin retired while a claimer takes a slot: either the
/// claim stands and the retirement fails, or the bin is retired and the claimer got nothing
/// (its bits given back). Never both (INV(UA4)).
#[test]
fn retirement_races_claim() {
    loom::model(|| {
        let b = bin(1);
        let other = {
            let b = b.clone();
            thread::spawn(move || claim_one(&b))
        };
        // Empty unless the claim was counted first.
        let release = b.release(class(), 0);
        let retired = match release {
            Release::Freed {
                was_full: false,
                now_empty,
            } => now_empty && b.try_retire(),
            other => panic!("unexpected {other:?}"),
        };
        let claim = other.join().unwrap();
        match claim {
            Claim::Got { .. } => {
                assert!(!retired, "a retired bin handed out a slot");
                assert_eq!(b.used_word(), 1);
            }
            Claim::Retired => {
                assert!(retired, "the claim gave up on a bin that was not retired");
            }
            Claim::NoneFree => panic!("31 free slots and none found"),
        }
        if retired {
            assert_eq!(b.used_word(), USED_RETIRED);
            assert_eq!(b.taken_slots(class()), 0, "retired bin with taken slots");
        } else {
            assert_eq!(b.used_word(), b.taken_slots(class()));
        }
    });
}

/// Two threads free the same slot: one frees it, the other sees a double free.
#[test]
fn double_free_is_reported_once() {
    loom::model(|| {
        let b = bin(2);
        let other = {
            let b = b.clone();
            thread::spawn(move || b.release(class(), 0))
        };
        let mine = b.release(class(), 0);
        let theirs = other.join().unwrap();
        let freed = [mine, theirs]
            .iter()
            .filter(|r| matches!(r, Release::Freed { .. }))
            .count();
        assert_eq!(freed, 1, "{mine:?} {theirs:?}");
        assert!([mine, theirs].contains(&Release::DoubleFree));
        assert_eq!(b.used_word(), 1);
        assert_eq!(b.taken_slots(class()), 1);
    });
}
