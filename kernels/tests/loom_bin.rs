//! Loom models of one UAlloc bin under concurrent claims, releases and retirement
//! (`ualloc/bin.rs`). Run with
//! `RUSTFLAGS="--cfg loom -C debug-assertions=on" LOOM_MAX_PREEMPTIONS=2 cargo test -p toga-kernels --release --test loom_bin`
//! (each model explores every interleaving of its few atomics in well under a second, also at
//! 3 to 5 preemptions).
//!
//! The bin is a 128 B class bin (32 slots, one bitmap word), so every claim and release hits
//! the same words. Checked: no slot is handed out twice, `used` matches the bitmap when the
//! threads are done (INV(UA3)), a retired bin hands out nothing (INV(UA4)), a double free is
//! reported once, and the group release (`release_many`, one `fetch_and` and one `fetch_sub`
//! for a warp's slots of one word) against claims, single releases and retirement, the
//! fresh cursor (INV(UA15)) against a release that empties the bin, and the pending stack
//! (INV(UA13)): notes racing drains, and a drain never following a link of an earlier push;
//! and the harvest epoch (INV(UA17)): a trim skipped in a recorded epoch leaves no empty bin.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::{Arc, Mutex};
use loom::thread;

use toga_kernels::rcu::Srcu;
use toga_kernels::size_class::SizeClass;
use toga_kernels::ualloc::bin::{BinHeader, Claim, Release, USED_COUNT_MASK, USED_RETIRED};
use toga_kernels::ualloc::pending::PendingStack;
use toga_kernels::ualloc::{HarvestCount, TrimGate};

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

/// 1 if the claim reported a crossing of "full".
fn resyncs(c: Claim) -> u32 {
    match c {
        Claim::Got { resync, .. } | Claim::NoneFree { resync, .. } => resync as u32,
        Claim::Retired => 0,
    }
}

/// Two claimers race for the last free slot: exactly one gets it, and exactly one of the two
/// counts crosses "full" (the one that must reconcile the listing, INV(UA7)).
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
        assert_eq!(
            resyncs(mine) + resyncs(theirs),
            1,
            "one crossing: {mine:?} {theirs:?}"
        );
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

/// The fresh cursor (INV(UA15)): two claimers race a release that empties the bin and puts
/// the cursor back to 0. Whatever the order, no slot goes to two claimers, the count matches
/// the bitmap, and claiming until nothing is left hands out exactly the free slots, the ones
/// a cursor passed over included (scans find them). For a class that looks at `used` before
/// it counts (128 B, 32 slots) and one that counts at once (16 B, 256 slots).
#[test]
fn an_emptying_release_races_fresh_claims() {
    for size in [128, 16] {
        loom::model(move || emptying_release_races_fresh_claims(SizeClass::from_size(size)));
    }
}

fn emptying_release_races_fresh_claims(class: SizeClass) {
    let b = Arc::new(BinHeader::new());
    b.init(class, 1);
    let claimer = {
        let b = b.clone();
        thread::spawn(move || b.claim(class, 0, 1))
    };
    let releaser = {
        let b = b.clone();
        thread::spawn(move || b.release(class, 0))
    };
    let mine = b.claim(class, 0, 1);
    let theirs = claimer.join().unwrap();
    assert!(matches!(releaser.join().unwrap(), Release::Freed { .. }));
    let slot = |c: Claim| match c {
        Claim::Got { word, bits, .. } => {
            assert_eq!(bits.count_ones(), 1);
            word * 64 + bits.trailing_zeros()
        }
        other => panic!("a claim with free slots got {other:?}"),
    };
    let (mine, theirs) = (slot(mine), slot(theirs));
    assert_ne!(mine, theirs, "slot handed out twice");
    assert_eq!(b.used_word(), 2);
    assert_eq!(b.taken_slots(class), 2, "INV(UA3)");
    let mut taken = vec![false; class.slots() as usize];
    taken[mine as usize] = true;
    taken[theirs as usize] = true;
    loop {
        match b.claim(class, 0, 32) {
            Claim::Got { word, mut bits, .. } => {
                while bits != 0 {
                    let s = (word * 64 + bits.trailing_zeros()) as usize;
                    assert!(!taken[s], "slot {s} handed out twice");
                    taken[s] = true;
                    bits &= bits - 1;
                }
            }
            Claim::NoneFree { .. } => break,
            Claim::Retired => unreachable!(),
        }
    }
    assert!(taken.iter().all(|&t| t), "a free slot was never handed out");
    assert_eq!(b.used_word(), class.slots());
}

/// A release of a full bin races a claim: the claim gets the freed slot or nothing, `used`
/// matches the bitmap, and the crossings the two report leave the bin listed exactly when it
/// is not full (INV(UA7)).
#[test]
fn release_of_full_bin_races_claim() {
    loom::model(|| {
        let b = bin(class().slots());
        let listing = Arc::new(Listing(Mutex::new(false)));
        let other = {
            let (b, listing) = (b.clone(), listing.clone());
            thread::spawn(move || {
                let c = claim_one(&b);
                if resyncs(c) == 1 {
                    listing.sync(&b);
                }
                c
            })
        };
        let release = b.release(class(), 5);
        if let Release::Freed { was_full: true, .. } = release {
            listing.sync(&b);
        }
        let claim = other.join().unwrap();
        assert!(matches!(release, Release::Freed { .. }), "{release:?}");
        assert!(
            matches!(
                claim,
                Claim::Got {
                    word: 0,
                    bits: 0b10_0000,
                    ..
                } | Claim::NoneFree { .. }
            ),
            "{claim:?}"
        );
        let used = class().slots() - 1 + got(claim).count_ones();
        assert_eq!(b.used_word(), used);
        assert_eq!(b.taken_slots(class()), used, "INV(UA3)");
        assert_eq!(
            *listing.0.lock().unwrap(),
            used < class().slots(),
            "INV(UA7): listed iff not full ({release:?}, {claim:?})"
        );
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
            Claim::NoneFree { .. } => panic!("31 free slots and none found"),
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

// ---------------------------------------------------------------------------------------------
// Group releases (`release_many`): one `fetch_and` and one `fetch_sub` for several slots of a
// word, as `free_group` (a warp) and `free_bulk` (the host) issue them.

/// The slots a claim took (0 for none).
fn got(c: Claim) -> u64 {
    match c {
        Claim::Got { bits, .. } => bits,
        _ => 0,
    }
}

/// What `free_group`/`free_bulk` do with a group of slots of word 0: one `release_many`.
/// Returns the slots this group freed.
fn free_group(b: &BinHeader, bits: u64) -> u64 {
    b.release_many(class(), 0, bits).old & bits
}

/// The bin's list membership, reconciled as `sync_listing` and a drain do it (under a mutex, from the
/// count it reads there) after every crossing of "full" that a claim or release reports.
struct Listing(Mutex<bool>);

impl Listing {
    fn sync(&self, b: &BinHeader) {
        Self::reconcile(&mut self.0.lock().unwrap(), b);
    }

    /// `sync` only if the mutex is free, as `resync_listing` tries it; whether it was.
    fn try_sync(&self, b: &BinHeader) -> bool {
        self.0
            .try_lock()
            .map(|mut listed| Self::reconcile(&mut listed, b))
            .is_ok()
    }

    fn reconcile(listed: &mut bool, b: &BinHeader) {
        let used = b.used_word();
        *listed = used & !USED_COUNT_MASK == 0 && used < class().slots();
    }
}

/// `free` clears its bits with an acquire `fetch_and` only (`release_many_fenced`): the fence
/// of its read-section entry (`read_lock_fenced`) releases the owner's writes to the block.
/// The next claimer of the slot reads what the owner wrote, with no race (a loom `UnsafeCell`
/// stands for the block; with `read_lock`, which has no fence, loom reports the race).
#[test]
fn a_freed_block_s_writes_reach_its_next_claimer() {
    loom::model(|| {
        let b = bin(class().slots());
        let srcu = Arc::new(Srcu::new());
        let block = Arc::new(UnsafeCell::new(0u32));
        let owner = {
            let (b, srcu, block) = (b.clone(), srcu.clone(), block.clone());
            thread::spawn(move || {
                // SAFETY: the owner's block: no one else touches it until it is freed.
                block.with_mut(|v| unsafe { *v = 7 });
                let section = srcu.read_lock_fenced();
                let r = b.release_many_fenced(class(), 0, 1 << 3);
                drop(section);
                assert_ne!(r.old & 1 << 3, 0, "the block was live");
            })
        };
        if let Claim::Got { bits, .. } = b.claim(class(), 0, 1) {
            assert_eq!(bits, 1 << 3, "only slot 3 was freed");
            // SAFETY: the claim made the block ours (what loom checks).
            assert_eq!(block.with(|v| unsafe { *v }), 7);
        }
        owner.join().unwrap();
    });
}

/// A group release of two slots of a full bin races a claim of up to two slots of the same
/// word: both freed slots are counted once, the claim takes only freed slots, and the
/// crossings the two report leave the bin listed exactly when it is not full (INV(UA7)).
#[test]
fn release_many_of_two_bits_races_claim() {
    loom::model(|| {
        let b = bin(class().slots());
        let listing = Arc::new(Listing(Mutex::new(false)));
        let other = {
            let (b, listing) = (b.clone(), listing.clone());
            thread::spawn(move || {
                let c = b.claim(class(), 0, 2);
                if resyncs(c) == 1 {
                    listing.sync(&b);
                }
                c
            })
        };
        let bits = 1 << 3 | 1 << 7;
        let r = b.release_many(class(), 0, bits);
        if r.was_full {
            listing.sync(&b);
        }
        let claim = other.join().unwrap();
        assert_eq!(r.old & bits, bits, "a live slot seen free");
        assert_eq!(got(claim) & !bits, 0, "claimed a slot that was not freed");
        let used = class().slots() - 2 + got(claim).count_ones();
        assert_eq!(b.used_word(), used);
        assert_eq!(b.taken_slots(class()), used, "INV(UA3)");
        assert_eq!(
            *listing.0.lock().unwrap(),
            used < class().slots(),
            "INV(UA7): listed iff not full ({r:?}, {claim:?})"
        );
    });
}

/// A group frees slots 0 and 1 while another thread frees slot 1 alone (a double free across
/// threads): slot 1 is freed exactly once, slot 0 once, and the count stays exact.
#[test]
fn release_many_and_release_free_a_shared_slot_once() {
    loom::model(|| {
        let b = bin(3);
        let other = {
            let b = b.clone();
            thread::spawn(move || b.release(class(), 1))
        };
        let r = b.release_many(class(), 0, 0b11);
        let single = other.join().unwrap();
        assert_ne!(r.old & 0b01, 0, "slot 0 was live");
        let by_group = r.old & 0b10 != 0;
        let by_single = matches!(single, Release::Freed { .. });
        assert!(by_group ^ by_single, "slot 1: {r:?} {single:?}");
        assert!(!matches!(
            single,
            Release::Freed {
                now_empty: true,
                ..
            }
        ));
        // A snapshot: slot 2, plus slot 1 while the other release has not counted yet.
        assert!((1..=2).contains(&r.left), "{r:?}");
        assert_eq!(b.used_word(), 1, "only slot 2 is left");
        assert_eq!(b.taken_slots(class()), 1, "INV(UA3)");
        assert!(b.is_taken(2) && !b.is_taken(0) && !b.is_taken(1));
    });
}

/// A group empties the bin while the other thread frees one of its slots again and each then
/// tries to retire the bin (as `trim` does): exactly one retirement succeeds, only after the
/// count reached 0, and a release after it reports a double free and changes nothing
/// (INV(UA4)).
#[test]
fn release_many_races_retirement() {
    loom::model(|| {
        let b = bin(2);
        let other = {
            let b = b.clone();
            thread::spawn(move || {
                let freed = b.release(class(), 1);
                (freed, b.try_retire())
            })
        };
        let r = b.release_many(class(), 0, 0b11);
        let mine = b.try_retire();
        // A double free of slot 0, on a bin that may be retired by now.
        let again = b.release(class(), 0);
        let (single, theirs) = other.join().unwrap();
        let by_group = r.old & 0b10 != 0;
        assert!(
            by_group ^ matches!(single, Release::Freed { .. }),
            "slot 1: {r:?} {single:?}"
        );
        assert_eq!(again, Release::DoubleFree);
        // Whoever released last sees the count at 0 when it tries: one retirement, never two.
        assert!(
            mine ^ theirs,
            "retired by group: {mine}, by single: {theirs}"
        );
        assert_eq!(b.used_word(), USED_RETIRED);
        assert_eq!(b.taken_slots(class()), 0);
        assert_eq!(b.claim(class(), 0, 1), Claim::Retired);
    });
}

/// A group empties the bin while a trim tries to retire it and a claimer takes a slot: the
/// retirement succeeds only if the claim did not (its count keeps the bin), a claim never
/// stands on a retired bin, and a claim is refused only by a real retirement (INV(UA4)).
#[test]
fn trim_races_a_group_release_and_a_claim() {
    loom::model(|| {
        let b = bin(2);
        let trim = {
            let b = b.clone();
            thread::spawn(move || b.try_retire())
        };
        let claimer = {
            let b = b.clone();
            thread::spawn(move || claim_one(&b))
        };
        let r = b.release_many(class(), 0, 0b11);
        let retired = trim.join().unwrap();
        let claim = claimer.join().unwrap();
        assert_eq!(r.old & 0b11, 0b11, "both slots were live");
        match claim {
            Claim::Got { .. } => assert!(!retired, "a retired bin handed out a slot"),
            Claim::Retired => assert!(retired, "a claim refused by a bin that is not retired"),
            Claim::NoneFree { .. } => panic!("31 free slots and none found"),
        }
        if retired {
            assert_eq!(b.used_word(), USED_RETIRED);
            assert_eq!(b.taken_slots(class()), 0, "retired bin with taken slots");
        } else {
            assert_eq!(b.used_word(), b.taken_slots(class()), "INV(UA3)");
        }
    });
}

// ---------------------------------------------------------------------------------------------
// A double free racing a claim of the same slot. These failed on 8ceb2b2, whose release was
// undone (`used += n`, then `bitmap |= freed`) when it found a bit set but not yet counted:
// the undo could leave a bit set with nobody counting it, or free a slot again under its next
// owner. Claims now count before they set bits (INV(UA3)), so a release is never undone.

/// Whether every slot of `bits` (word 0) is taken in the bitmap.
fn all_taken(b: &BinHeader, bits: u64) -> bool {
    (0..64).all(|slot| bits & 1 << slot == 0 || b.is_taken(slot))
}

/// Run `f` under loom with at least `bound` preemptions: the interleavings below need three.
fn model_with_preemptions(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(builder.preemption_bound.unwrap_or(0).max(bound));
    builder.check(f);
}

/// A double free of slot 0 races a claim of it on a bin whose count is 0 (one bit, as
/// `free_single` issues it): whatever the order, `used` matches the bitmap afterwards
/// (INV(UA3)), and the claimed slot is still taken unless the free said it freed it.
#[test]
fn double_free_racing_a_claim_of_the_slot_keeps_the_count() {
    model_with_preemptions(3, || {
        let b = bin(0);
        let other = {
            let b = b.clone();
            thread::spawn(move || claim_one(&b))
        };
        let freed = free_group(&b, 0b01);
        let claim = other.join().unwrap();
        if freed == 0 {
            assert!(
                all_taken(&b, got(claim)),
                "the claimed slot is free: {claim:?}"
            );
        }
        assert_eq!(b.used_word(), b.taken_slots(class()), "INV(UA3): {claim:?}");
    });
}

/// A group frees its live slot 0 together with slot 1, which is already free (a double free
/// in the group), while a claim takes slot 1: slot 0 is freed exactly once, the claimed slot
/// stays taken unless the group reported freeing it, and `used` matches the bitmap
/// (INV(UA3)).
#[test]
fn group_with_a_double_free_races_a_claim() {
    model_with_preemptions(3, || {
        let b = bin(1);
        let other = {
            let b = b.clone();
            thread::spawn(move || claim_one(&b))
        };
        let freed = free_group(&b, 0b11);
        let claim = other.join().unwrap();
        assert_ne!(freed & 0b01, 0, "the live slot was not freed");
        assert!(
            all_taken(&b, got(claim) & !freed),
            "a claimed slot is free: {claim:?}, group freed {freed:#b}"
        );
        assert_eq!(b.used_word(), b.taken_slots(class()), "INV(UA3): {claim:?}");
    });
}

/// As above, with a second claimer that may take the group's live slot 0 while the group's
/// release is under way: a slot freed once must not be freed again under its next owner.
/// Only the innocent slot is checked (slot 1 is the misuse's own).
#[test]
fn group_with_a_double_free_leaves_other_claims_alone() {
    model_with_preemptions(3, || {
        let b = bin(1);
        let claimers: Vec<_> = (0..2)
            .map(|_| {
                let b = b.clone();
                thread::spawn(move || claim_one(&b))
            })
            .collect();
        let freed = free_group(&b, 0b11);
        let claims: Vec<Claim> = claimers.into_iter().map(|h| h.join().unwrap()).collect();
        assert_ne!(freed & 0b01, 0, "the live slot was not freed");
        for c in &claims {
            // Slot 0 was the group's own block, freed once: whoever got it afterwards owns it.
            // Slot 1 was already free; a claim of it may be lost only if the group said it
            // freed it (a double free racing a claim of the same slot cannot be told apart).
            let keep = got(*c) & !(freed & 0b10);
            assert!(
                all_taken(&b, keep),
                "{c:?} lost its slot, group freed {freed:#b}"
            );
        }
    });
}

// Lazy listing (`ualloc/alloc.rs`, `ualloc/pending.rs`): a release that makes a full bin
// non-full never takes the list's mutex; it notes the bin on the list's pending stack (a
// `fetch_add` on the bin's count, and a `swap` on the stack for the first crossing). The next
// walker whose pass finds nothing, or a trim, drains the stack: reconciles each bin under the
// mutex until its count holds still. A claim that fills a bin unlinks it under the mutex, or,
// for a small bin, notes it when another thread holds the mutex.

/// Call `f` on each bin of a drain's batch (bin addresses).
fn each(bins: &[u64], mut f: impl FnMut(&BinHeader)) {
    for &at in bins {
        // SAFETY: the drain hands out bins it pinned; the models keep them alive in `Arc`s.
        f(unsafe { &*(at as usize as *const BinHeader) });
    }
}

/// A release of a full bin (notes it, no mutex) races a claim that may take the freed slot and
/// fill the bin again (unlinks under the mutex) and a drain. After one more drain the bin is
/// listed whenever it has a free slot (INV(UA7)), its count is 0 and the stack is empty
/// (INV(UA13)), from either starting membership.
#[test]
fn pending_stack_keeps_a_bin_with_free_slots_findable() {
    for start_listed in [false, true] {
        loom::model(move || {
            let b = bin(class().slots());
            let listing = Arc::new(Listing(Mutex::new(start_listed)));
            let stack = Arc::new(PendingStack::new());
            let claimer = {
                let (b, listing) = (b.clone(), listing.clone());
                thread::spawn(move || {
                    let c = b.claim(class(), 0, 1);
                    if resyncs(c) == 1 {
                        listing.sync(&b);
                    }
                    c
                })
            };
            let drainer = {
                let (listing, stack) = (listing.clone(), stack.clone());
                thread::spawn(move || stack.drain(|bins| each(bins, |b| listing.sync(b))))
            };
            let r = b.release_many(class(), 0, 1 << 3);
            if r.was_full {
                stack.note(&b);
            }
            let claim = claimer.join().unwrap();
            drainer.join().unwrap();
            // The next walker that finds nothing drains once more.
            stack.drain(|bins| each(bins, |b| listing.sync(b)));
            let used = class().slots() - 1 + got(claim).count_ones();
            assert_eq!(b.used_word(), used);
            assert!(
                *listing.0.lock().unwrap() || used >= class().slots(),
                "INV(UA7): a bin with a free slot is unlisted ({r:?}, {claim:?})"
            );
            assert_eq!(b.pending_count(), 0, "INV(UA13)");
            assert!(stack.is_empty_hint(), "INV(UA13)");
        });
    }
}

/// A claim that fills a small bin while another thread holds the list's mutex does not wait
/// for it (`resync_listing`): it notes the bin on the pending stack. A claimer that gets the
/// mutex reconciles its bin, unlocks, and drains the stack. Here the claimer tries the mutex
/// once, a third thread holds the mutex for a moment (a refill, another claimer), and in one of
/// the two runs a release of the filled bin notes it. After one more drain (the next walker
/// that finds nothing, or
/// the next claimer that gets the mutex) the bin is listed iff it has a free slot (INV(UA7)),
/// its count is 0 and the stack is empty (INV(UA13)).
#[test]
fn a_claim_that_fills_a_bin_under_a_held_mutex_notes_it() {
    // Without the release, only the claimer's note gets the full bin unlinked.
    for release in [false, true] {
        loom::model(move || {
            let b = bin(class().slots() - 1);
            let listing = Arc::new(Listing(Mutex::new(true)));
            let stack = Arc::new(PendingStack::new());
            let claimer = {
                let (b, listing, stack) = (b.clone(), listing.clone(), stack.clone());
                thread::spawn(move || {
                    let c = b.claim(class(), 0, 1);
                    if resyncs(c) == 1 {
                        if listing.try_sync(&b) {
                            stack.drain(|bins| each(bins, |b| listing.sync(b)));
                        } else {
                            stack.note(&b);
                        }
                    }
                    c
                })
            };
            let holder = {
                let (listing, b) = (listing.clone(), b.clone());
                thread::spawn(move || {
                    // Holds the mutex across a look at the bin (loom switches threads there).
                    let _held = listing.0.lock().unwrap();
                    b.used_word()
                })
            };
            let r = release.then(|| b.release_many(class(), 0, 1 << 3));
            if r.is_some_and(|r| r.was_full) {
                stack.note(&b);
            }
            let claim = claimer.join().unwrap();
            holder.join().unwrap();
            stack.drain(|bins| each(bins, |b| listing.sync(b)));
            let used = class().slots() - 1 - release as u32 + got(claim).count_ones();
            assert_eq!(b.used_word(), used);
            assert_eq!(
                *listing.0.lock().unwrap(),
                used < class().slots(),
                "INV(UA7) ({r:?}, {claim:?})"
            );
            assert_eq!(b.pending_count(), 0, "INV(UA13)");
            assert!(stack.is_empty_hint(), "INV(UA13)");
        });
    }
}

/// Two bins are noted at once (two pushes race on the head) while a drain runs: every crossing
/// is settled by some drain, and a drain never follows a link that is not written yet.
#[test]
fn concurrent_notes_and_a_drain_lose_no_bin() {
    loom::model(|| {
        let (a, c) = (bin(class().slots() - 1), bin(class().slots() - 1));
        let stack = Arc::new(PendingStack::new());
        let settled = Arc::new(Mutex::new(Vec::new()));
        let settle = |settled: &Mutex<Vec<usize>>, b: &BinHeader| {
            settled.lock().unwrap().push(b as *const BinHeader as usize)
        };
        let pushers: Vec<_> = [a.clone(), c.clone()]
            .into_iter()
            .map(|b| {
                let stack = stack.clone();
                thread::spawn(move || stack.note(&b))
            })
            .collect();
        let drainer = {
            let (stack, settled) = (stack.clone(), settled.clone());
            thread::spawn(move || stack.drain(|bins| each(bins, |b| settle(&settled, b))))
        };
        for p in pushers {
            assert!(p.join().unwrap(), "the first note of a bin pushes it");
        }
        drainer.join().unwrap();
        stack.drain(|bins| each(bins, |b| settle(&settled, b)));
        let settled = settled.lock().unwrap();
        for b in [&a, &c] {
            let addr = &**b as *const BinHeader as usize;
            assert!(settled.contains(&addr), "a noted bin was never settled");
            assert_eq!(b.pending_count(), 0, "INV(UA13)");
        }
    });
}

/// The return of a retired bin (`UAlloc::run_callback`) races a drain that holds it: the
/// return waits (drains or defers) until the drain is done with the bin, so no drain reads a
/// bin after it went back to its chunk (INV(UA13)).
#[test]
fn a_pinned_bin_is_not_returned_under_a_drain() {
    loom::model(|| {
        let b = bin(class().slots() - 1);
        let stack = Arc::new(PendingStack::new());
        let returned = Arc::new(loom::sync::atomic::AtomicBool::new(false));
        assert!(stack.note(&b));
        let drainer = {
            let (stack, returned) = (stack.clone(), returned.clone());
            thread::spawn(move || {
                stack.drain(|_bins| {
                    assert!(
                        !returned.load(loom::sync::atomic::Ordering::Relaxed),
                        "a drain reads a returned bin"
                    )
                })
            })
        };
        // The callback: return only an unpinned bin; otherwise drain, and else defer (here:
        // yield and ask again, as the next grace period would).
        loop {
            let free = b.pending_count() == 0 || {
                stack.drain(|_| {});
                b.pending_count() == 0
            };
            if free {
                returned.store(true, loom::sync::atomic::Ordering::Relaxed);
                break;
            }
            thread::yield_now();
        }
        drainer.join().unwrap();
    });
}

/// A second crossing of a bin already on the stack (its count goes 1 → 2, no push) races the
/// drain that holds it: the drain settles again when the count moved, and reads the crossing's
/// release when it saw the new count, so the bin ends listed with its free slot.
#[test]
fn a_crossing_during_the_drain_is_settled() {
    loom::model(|| {
        let b = bin(class().slots());
        let listing = Arc::new(Listing(Mutex::new(false)));
        let stack = Arc::new(PendingStack::new());
        // First crossing, noted; the slot is claimed again, so the bin is full once more.
        assert!(b.release_many(class(), 0, 1 << 3).was_full);
        assert!(stack.note(&b));
        assert_eq!(got(b.claim(class(), 3, 1)), 1 << 3);
        let freer = {
            let (b, stack) = (b.clone(), stack.clone());
            thread::spawn(move || {
                if b.release_many(class(), 0, 1 << 5).was_full {
                    stack.note(&b);
                }
            })
        };
        stack.drain(|bins| each(bins, |b| listing.sync(b)));
        freer.join().unwrap();
        stack.drain(|bins| each(bins, |b| listing.sync(b)));
        assert!(
            *listing.0.lock().unwrap(),
            "INV(UA7): the freed slot's bin is unlisted"
        );
        assert_eq!(b.pending_count(), 0, "INV(UA13)");
    });
}

/// A bin pushed again after a drain races the next drain, while its `pnext` still holds the
/// link of its earlier push: the drain reaches it through the head, so it reads the new
/// push's `UNSET` or its final link, never the old link (`note` links with a relaxed store
/// and pushes with a release swap without an acquire half; the drain's acquire swap
/// synchronizes with every push before it). A drain that followed the old link would settle
/// a bin that nobody noted this time.
#[test]
fn a_drain_never_follows_a_link_of_an_earlier_push() {
    loom::model(|| {
        let (a, c) = (bin(class().slots() - 1), bin(class().slots() - 1));
        let stack = Arc::new(PendingStack::new());
        // Earlier pushes: c on a, both drained (c's link still names a).
        assert!(stack.note(&a));
        assert!(stack.note(&c));
        assert_eq!(stack.drain(|_| {}), 2);
        let pusher = {
            let (c, stack) = (c.clone(), stack.clone());
            thread::spawn(move || stack.note(&c))
        };
        let a_addr = &*a as *const BinHeader as u64;
        let mut settled = Vec::new();
        stack.drain(|bins| settled.extend_from_slice(bins));
        assert!(
            pusher.join().unwrap(),
            "the first note since the drain pushes"
        );
        stack.drain(|bins| settled.extend_from_slice(bins));
        assert!(
            !settled.contains(&a_addr),
            "a drain followed the link of an earlier push"
        );
        assert_eq!(settled, [&*c as *const BinHeader as u64], "c settled once");
        assert_eq!(a.pending_count() + c.pending_count(), 0, "INV(UA13)");
    });
}

/// INV(UA17): a refill that skips its trim never leaves behind a bin that a free had left
/// empty. The free of a bin's last block (inside a read section, counted after the section's
/// exit fence) races a refill that reads the harvest epoch, trims (retires the bin if it finds
/// it empty) and records the epoch. After both, a refill that finds its epoch recorded, and
/// would skip its trim, must find the bin retired. Fails if the count is an `add` after a
/// release `fetch_sub` of the reader count instead of after a fence (checked).
#[test]
fn a_skipped_trim_never_leaves_an_emptied_bin() {
    loom::model(|| {
        let b = bin(1);
        let srcu = Arc::new(Srcu::new());
        let count = Arc::new(HarvestCount::new());
        let gate = Arc::new(TrimGate::new());
        let freer = {
            let (b, srcu, count) = (b.clone(), srcu.clone(), count.clone());
            thread::spawn(move || {
                let reader = srcu.read_lock_fenced();
                let r = b.release_many_fenced(class(), 0, 1);
                drop(reader);
                if r.left == 0 {
                    count.note_fenced();
                }
            })
        };
        let (epoch, futile) = gate.epoch(core::iter::once(&*count));
        assert!(!futile, "nothing was recorded yet");
        // The trim: retire the bin if it is empty.
        if b.used_word() == 0 {
            assert!(b.try_retire());
        }
        gate.record(epoch);
        freer.join().unwrap();
        let (_, futile) = gate.epoch(core::iter::once(&*count));
        if futile {
            assert!(b.is_retired(), "a skipped trim left an empty bin behind");
        }
    });
}
