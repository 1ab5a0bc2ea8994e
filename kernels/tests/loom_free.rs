//! Loom models of UAlloc's free path as production runs it (`ualloc/free.rs`): a group of two
//! lanes of one warp (`platform::ModelWarp`) frees two slots of one bitmap word the way
//! `free_group` does, step for step, with the real bin (`BinHeader::release_many_fenced`), the
//! arena's read section (`Srcu::read_lock_fenced`), the class's semaphore and the harvest
//! count (`give_units`: `release_relaxed` after the section, `note_fenced` for an emptied
//! bin):
//!
//! ```text
//! each lane: write its block, broadcast the arena, bar.warp.sync
//! leader:    read_lock_fenced                     (the fence releases both lanes' writes)
//! each lane: bar.warp.sync, locate, ballot/match (the group is valid), gather the bits
//! leader:    release_many_fenced(bits) → old; drop the section; give_units(old, bits)
//! each lane: broadcast old, bar.warp.sync, its outcome from its bit of old
//! ```
//!
//! Against it, a lane of another warp (SM 1) allocates as `alloc` does: the semaphore's units,
//! a read section, a claim of the bin's word; and reads the block it got. Run with
//! `RUSTFLAGS="--cfg loom -C debug-assertions=on" LOOM_MAX_PREEMPTIONS=3 cargo test -p toga-kernels --release --test loom_free`.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

use toga_kernels::bulk_semaphore::{BulkSemaphore, PerSm};
use toga_kernels::collective::Group;
use toga_kernels::platform::{self, ModelWarp};
use toga_kernels::rcu::Srcu;
use toga_kernels::size_class::SizeClass;
use toga_kernels::ualloc::bin::{BinHeader, Claim, Release};
use toga_kernels::ualloc::{HarvestCount, TrimGate};

fn class() -> SizeClass {
    SizeClass::from_size(128)
}

/// One arena's words that a free of a 128 B slot touches, and the slots' contents.
struct Arena {
    rcu: Srcu,
    bin: BinHeader,
    units: BulkSemaphore<PerSm>,
    harvest: HarvestCount,
    /// Slot `i`'s block.
    blocks: Vec<UnsafeCell<u32>>,
}

// SAFETY: every access to the blocks is one loom checks for races.
unsafe impl Sync for Arena {}

/// A 128 B bin with `claimed` of its slots taken (slots `0..claimed`), their units taken.
fn arena(claimed: u32) -> Arc<Arena> {
    let a = Arena {
        rcu: Srcu::new(),
        bin: BinHeader::new(),
        units: BulkSemaphore::new(class().slots() - claimed),
        harvest: HarvestCount::new(),
        blocks: (0..class().slots()).map(|_| UnsafeCell::new(0)).collect(),
    };
    a.bin.init(class(), claimed);
    Arc::new(a)
}

/// `free_group`'s steps for this lane, freeing slot `slot` (module doc). Returns whether this
/// lane's free freed its slot (not a double free).
fn free_group(a: &Arena, slot: u32) -> bool {
    // The block's last write by its owner.
    // SAFETY: the lane's live block (what loom checks).
    a.blocks[slot as usize].with_mut(|v| unsafe { *v = 100 + slot });
    let group = Group::of(0);
    let _arena = group.broadcast_u32(0);
    // The barrier orders the members' writes before the leader's entry.
    group.sync();
    let reader = group.is_leader().then(|| a.rcu.read_lock_fenced());
    group.sync();
    let valid = platform::ballot(group.mask(), true) == group.mask()
        && platform::match_any(group.mask(), 0) == group.mask();
    assert!(valid, "both lanes free into one word");
    let mut bits = 0u64;
    let mut rest = group.mask();
    while rest != 0 {
        let src = rest.trailing_zeros();
        bits |= 1u64 << platform::shfl_idx_u32(group.mask(), slot, src);
        rest &= rest - 1;
    }
    let (old, emptied) = if reader.is_some() {
        let r = a.bin.release_many_fenced(class(), 0, bits);
        (r.old, r.left == 0 && r.old & bits != 0)
    } else {
        (0, false)
    };
    let leader = reader.is_some();
    drop(reader);
    if leader {
        // give_units: after the section's closing fence.
        let n = (old & bits).count_ones();
        if n > 0 {
            a.units.release_relaxed(n);
        }
        if emptied {
            a.harvest.note_fenced();
        }
    }
    let old = group.broadcast_u64(old);
    group.sync();
    old >> slot & 1 != 0
}

/// A lone lane's small `malloc` from the bin: a unit of the semaphore, then a claim inside a
/// read section. Returns the slot it got and what the block held (`None`: no unit yet).
fn alloc_one(a: &Arena) -> Option<(u32, u32)> {
    if !a.units.try_wait(1) {
        return None;
    }
    let reader = a.rcu.read_lock();
    let claim = a.bin.claim(class(), 0, 1);
    drop(reader);
    let Claim::Got { bits, .. } = claim else {
        panic!("a unit without a free slot (INV(UA2)): {claim:?}");
    };
    let slot = bits.trailing_zeros();
    // SAFETY: the claim made the block ours (what loom checks).
    Some((slot, a.blocks[slot as usize].with(|v| unsafe { *v })))
}

/// Two lanes free slots 1 and 2 of a bin whose only other free slot is its last, while a
/// lane of another warp allocates with that slot's unit (so its unit is not one the group
/// gives back, whose release would order the blocks by itself): both frees succeed once, the
/// units match the slots freed, an allocation that finds a freed slot's bit clear reads the
/// last write of the lane that freed it, the member's as well as the leader's (the barrier
/// and the leader's fenced entry release them; the bitmap's `fetch_and` is only an acquire).
#[test]
fn a_group_free_releases_both_lanes_blocks_to_the_next_claimer() {
    loom::model(|| {
        let last = class().slots() - 1;
        // Every slot handed out (the fresh cursor at the end: claims scan the bitmap), then
        // the last one freed, with its unit.
        let a = arena(class().slots());
        assert!(matches!(
            a.bin.release(class(), last),
            Release::Freed { .. }
        ));
        a.units.release(1);
        let warp = ModelWarp::new(0b11, 0);
        let lanes: Vec<_> = [1u32, 2]
            .into_iter()
            .enumerate()
            .map(|(lane, slot)| {
                let (a, warp) = (a.clone(), warp.clone());
                thread::spawn(move || {
                    ModelWarp::enter(&warp, lane as u32);
                    free_group(&a, slot)
                })
            })
            .collect();
        let other = {
            let a = a.clone();
            thread::spawn(move || {
                ModelWarp::enter(&ModelWarp::new(0b1, 1), 0);
                alloc_one(&a)
            })
        };
        for l in lanes {
            assert!(
                l.join().unwrap(),
                "a live block's free is not a double free"
            );
        }
        let got = other.join().unwrap();
        match got {
            Some((slot @ (1 | 2), value)) => assert_eq!(value, 100 + slot, "the freer's write"),
            Some((slot, _)) => assert_eq!(slot, last, "only a free slot is handed out"),
            None => {}
        }
        let taken = class().slots() - 3 + got.is_some() as u32;
        assert_eq!(a.bin.used_word(), taken);
        assert_eq!(a.bin.taken_slots(class()), taken, "INV(UA3)");
        assert_eq!(a.units.available(), class().slots() - taken, "INV(UA2)");
    });
}

/// INV(UA17) with the group path: a group frees the bin's last two blocks (the release
/// empties it; the leader counts it with `note_fenced` after the section) while a refill
/// reads the harvest epoch, trims (retires the bin if it finds it empty) and records the
/// epoch. A refill that then finds its epoch recorded, and would skip its trim, must find the
/// bin retired.
#[test]
fn a_skipped_trim_never_leaves_a_bin_a_group_emptied() {
    loom::model(|| {
        let a = arena(2);
        let gate = TrimGate::new();
        // Blocking collectives: the trim must see the whole group's free land between its
        // steps, which spinning lanes would spend the preemption bound on.
        let warp = ModelWarp::blocking(0b11, 0);
        let lanes: Vec<_> = [0u32, 1]
            .into_iter()
            .enumerate()
            .map(|(lane, slot)| {
                let (a, warp) = (a.clone(), warp.clone());
                thread::spawn(move || {
                    ModelWarp::enter(&warp, lane as u32);
                    free_group(&a, slot)
                })
            })
            .collect();
        let (epoch, futile) = gate.epoch(core::iter::once(&a.harvest));
        assert!(!futile, "nothing was recorded yet");
        if a.bin.used_word() == 0 {
            assert!(a.bin.try_retire());
        }
        gate.record(epoch);
        for l in lanes {
            assert!(l.join().unwrap());
        }
        let (_, futile) = gate.epoch(core::iter::once(&a.harvest));
        if futile {
            assert!(
                a.bin.is_retired(),
                "a skipped trim left an empty bin behind"
            );
        }
    });
}
