//! Loom models of UAlloc's runs of slots (`ualloc/run.rs` over `run.rs`) with a real bin: a
//! run's bin is carved full (`BinHeader::init` with every slot claimed), its word names it
//! (a guarded swap, `Run::replace`), lanes take its slots with one add (`Run::take`), a trim
//! flushes it (`replace(Next::Empty)`, whose give-back frees the slots nobody was handed inside
//! a read section, as `give_back_slots` does), and `free` asks the word whether the run still
//! holds a slot before it clears the slot's bit, with the production check
//! (`ualloc::run_holds`, INV(UA19)) acted on as `free_single` does:
//!
//! ```text
//! free(slot): read_lock_fenced; run_holds(run.look(), class, bin, slot)
//!             Swapping(look) → leave the section, wait_while_draining, look again
//!             Yes (the run holds it) → refused (a stray free), nothing changes
//!             No → release_many_fenced(bit), leave, give the unit back
//! ```
//!
//! The word names the run by its bin's real address in 128 B blocks, as a stock names its
//! first bin, so that `run_holds` finds the bin in the run.
//!
//! The oracles are INV(TB14) and INV(UA19): every slot of the run is handed out once or given
//! back once, never both; a free never clears the bit of a slot the run holds; the bin's count
//! matches its bitmap (INV(UA3)). Run with
//! `RUSTFLAGS="--cfg loom -C debug-assertions=on" LOOM_MAX_PREEMPTIONS=3 cargo test -p toga-kernels --release --test loom_slot_run`.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;

use toga_kernels::bulk_semaphore::{BulkSemaphore, PerSm};
use toga_kernels::rcu::Srcu;
use toga_kernels::run::{Leftover, MAX_BASE, Next, Run, Take};
use toga_kernels::size_class::SizeClass;
use toga_kernels::ualloc::bin::BinHeader;
use toga_kernels::ualloc::layout::BLOCK_SHIFT;
use toga_kernels::ualloc::{Held, run_holds};

fn class() -> SizeClass {
    SizeClass::from_size(128)
}

/// A run of one 128 B bin: 32 items, item `i` is slot `i`.
const ITEMS: u32 = 32;

struct Arena {
    rcu: Srcu,
    bin: BinHeader,
    run: Run,
    units: BulkSemaphore<PerSm>,
}

/// The run's base in the word: its bin's address in 128 B blocks (`BinHeader` is
/// 128-aligned), as a stock names its first bin.
fn base(a: &Arena) -> u64 {
    let base = &a.bin as *const BinHeader as u64 >> BLOCK_SHIFT;
    assert!(base <= MAX_BASE, "the bin's address fits the word's base");
    base
}

/// A run's bin carved full and named by the word, its first `kept` slots the stocker's.
fn arena(kept: u32) -> Arc<Arena> {
    // In its `Arc` first: the word names the bin by its address.
    let a = Arc::new(Arena {
        rcu: Srcu::new(),
        bin: BinHeader::new(),
        run: Run::new(),
        units: BulkSemaphore::new(0),
    });
    a.bin.init(class(), class().slots());
    assert!(a.run.replace(
        Next::Run {
            base: base(&a),
            kept
        },
        ITEMS,
        true,
        |_| panic!("an empty word has no leftover"),
        || {}
    ));
    a
}

/// Give back a swap's leftover as `give_back_slots` does: its bits freed inside a read
/// section, their units given to the semaphore after it. Returns the bits given back.
fn give_back(a: &Arena, left: Leftover) -> u64 {
    assert_eq!(left.base, base(a));
    let bits = (u64::MAX >> (64 - left.count)) << left.first;
    let reader = a.rcu.read_lock_fenced();
    let r = a.bin.release_many_fenced(class(), 0, bits);
    drop(reader);
    assert_eq!(
        r.old & bits,
        bits,
        "a run's slots stay claimed until given back"
    );
    a.units.release_relaxed(bits.count_ones());
    bits
}

/// What a `free` of a slot of the run's bin did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Freed,
    /// The run holds the slot (nobody was handed it): refused, counted as invalid.
    Stray,
    /// The bit was clear already.
    Double,
}

/// `free_single`'s steps for a slot of the run's bin, a bin carved for a run (module doc).
fn free(a: &Arena, slot: u32) -> Outcome {
    let reader = loop {
        let reader = a.rcu.read_lock_fenced();
        // INV(UA19): the production check, acted on as `free_single` does.
        match run_holds(a.run.look(), class(), &a.bin, slot) {
            Held::No => break reader,
            Held::Yes => return Outcome::Stray,
            Held::Swapping(seen) => {
                drop(reader);
                a.run.wait_while_draining(&seen);
            }
        }
    };
    let r = a.bin.release_many_fenced(class(), 0, 1 << slot);
    drop(reader);
    if r.old >> slot & 1 == 0 {
        return Outcome::Double;
    }
    a.units.release_relaxed(1);
    Outcome::Freed
}

/// A lane takes a slot from the run (the stocker kept slot 0) and frees it later; a stray
/// free of slot 1, which the run holds until a take hands it out, races the take; a trim
/// flushes the run. The stray free is refused unless its look saw slot 1 handed out (then it
/// freed the taker's block, which a stray free of a live block does, and the taker's own
/// free is the double); the taker's slot is never given back; every slot is handed out or
/// given back once; in the end the bin holds only the stocker's slot 0, and the units are the
/// slots freed.
#[test]
fn a_stray_free_of_a_held_slot_races_a_take_and_a_flush() {
    loom::model(|| {
        let a = arena(1);
        let taker = {
            let a = a.clone();
            thread::spawn(move || match a.run.take(ITEMS) {
                Take::Item { base: at, index } => {
                    assert_eq!(at, base(&a));
                    Some((index, free(&a, index)))
                }
                // After the flush: the word is empty and this lane would stock the next run
                // (outside this model).
                Take::Stock | Take::Elsewhere => None,
            })
        };
        let stray = {
            let a = a.clone();
            thread::spawn(move || free(&a, 1))
        };
        let mut given_back = 0u64;
        a.run.replace(
            Next::Empty,
            ITEMS,
            true,
            |left| given_back = give_back(&a, left),
            || {},
        );
        let took = taker.join().unwrap();
        let stray = stray.join().unwrap();
        if let Some((index, _)) = took {
            assert_eq!(index, 1, "the stocker kept slot 0");
            assert_eq!(given_back >> 1 & 1, 0, "slot 1 handed out and given back");
        } else {
            assert_eq!(
                given_back >> 1 & 1,
                1,
                "slot 1 neither handed out nor given back"
            );
        }
        match (took, stray) {
            // The stray free found slot 1 held, or already given back (a double free).
            (_, Outcome::Stray) | (None, Outcome::Double) => {}
            (Some((_, mine)), Outcome::Freed) => assert_eq!(mine, Outcome::Double),
            (Some((_, mine)), Outcome::Double) => assert_eq!(mine, Outcome::Freed),
            other => panic!("slot 1 freed while the run held it: {other:?}"),
        }
        if let Some((_, mine)) = took {
            assert_ne!(mine, Outcome::Stray, "a taker's own slot is not the run's");
        }
        assert_eq!(a.bin.used_word(), 1, "only the stocker's slot is taken");
        assert_eq!(a.bin.taken_slots(class()), 1, "INV(UA3)");
        assert_eq!(
            a.units.available(),
            ITEMS - 1,
            "a unit for every slot freed"
        );
    });
}

/// Two lanes take from the run while a trim flushes it: each slot handed out is not given
/// back, and the slots nobody was handed are (INV(TB14)); the takers' slots stay claimed.
#[test]
fn takes_and_a_flush_hand_out_or_give_back_every_slot_once() {
    loom::model(|| {
        let a = arena(1);
        let takers: Vec<_> = (0..2)
            .map(|_| {
                let a = a.clone();
                thread::spawn(move || match a.run.take(ITEMS) {
                    Take::Item { index, .. } => 1u64 << index,
                    _ => 0,
                })
            })
            .collect();
        let mut given_back = 0u64;
        a.run.replace(
            Next::Empty,
            ITEMS,
            true,
            |left| given_back = give_back(&a, left),
            || {},
        );
        let handed: u64 = takers
            .into_iter()
            .map(|h| h.join().unwrap())
            .fold(0, |m, b| {
                assert_eq!(m & b, 0, "a slot handed out twice");
                m | b
            });
        assert_eq!(handed & given_back, 0, "a slot handed out and given back");
        assert_eq!(1 | handed | given_back, u32::MAX as u64, "a slot lost");
        assert_eq!(a.bin.taken_slots(class()), 1 + handed.count_ones());
    });
}
