//! Loom model of TBuddy's availability index: a clear racing two sets on a three-layer index,
//! every interleaving up to the preemption bound. Run with
//! `RUSTFLAGS="--cfg loom -C debug-assertions=on" LOOM_MAX_PREEMPTIONS=2 cargo test -p toga-kernels --release --test loom_index`.
//!
//! The clear empties a layer-0 word and, climbing, the summaries above it, while one set
//! refills that word and another fills its neighbour under the same summary. At the end every
//! summary bit must be set exactly where the word below is non-empty (INV(TB6)): a summary
//! cleared over a non-empty word hides Available nodes from every search.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;

use toga_kernels::platform::Atomic32;
use toga_kernels::tbuddy::index::{AvailIndex, layer_words};

/// 2^11 node indices: layers of 64, 2 and 1 words.
const INDEX_BITS: u32 = 11;

/// The words of an empty index of [`INDEX_BITS`] bits, to share between the model's threads.
fn zeroed_index() -> Arc<Vec<Atomic32>> {
    Arc::new(
        (0..layer_words(INDEX_BITS).1)
            .map(|_| Atomic32::new(0))
            .collect(),
    )
}

#[test]
fn clear_racing_sets_keeps_summaries() {
    loom::model(|| {
        let words = zeroed_index();
        // Node 1 (layer-0 word 0) is the only one set.
        AvailIndex::new(&words, INDEX_BITS).set(1);
        let spawn = |f: fn(AvailIndex<'_>)| {
            let words = words.clone();
            thread::spawn(move || f(AvailIndex::new(&words, INDEX_BITS)))
        };
        let clear = spawn(|index| index.clear(1));
        // Refills word 0 after the clear may have emptied it.
        let refill = spawn(|index| index.set(2));
        // Fills word 1, whose summary shares a layer-1 word with word 0's.
        let neighbour = spawn(|index| index.set(33));
        for t in [clear, refill, neighbour] {
            t.join().unwrap();
        }
        // Layer 0 (words 0..64): node 2 in word 0, node 33 in word 1; layer 1 (words 64, 65):
        // both words under bits 0 and 1 of word 64; layer 2 (word 66): word 64 under bit 0.
        // (Checked word by word: a full `assert_consistent` is too many loads for loom.)
        let word = |i: usize| words[i].load_relaxed();
        assert_eq!((word(0), word(1)), (1 << 2, 1 << 1), "layer 0");
        assert_eq!((word(64), word(65)), (0b11, 0), "TB6: layer-1 summaries");
        assert_eq!(word(66), 0b1, "TB6: the top summary");
    });
}

/// The clear's re-check puts back a summary bit over a word that a second clear has emptied
/// the summary of, one layer up, in the meantime: the re-check must climb like a `set`.
#[test]
fn clear_refill_and_a_second_clear_keep_summaries() {
    loom::model(|| {
        let words = zeroed_index();
        {
            let index = AvailIndex::new(&words, INDEX_BITS);
            index.set(1);
            index.set(33);
        }
        let spawn = |f: fn(AvailIndex<'_>)| {
            let words = words.clone();
            thread::spawn(move || f(AvailIndex::new(&words, INDEX_BITS)))
        };
        let clear = spawn(|index| index.clear(1));
        let refill = spawn(|index| index.set(2));
        let other = spawn(|index| index.clear(33));
        for t in [clear, refill, other] {
            t.join().unwrap();
        }
        let word = |i: usize| words[i].load_relaxed();
        assert_eq!((word(0), word(1)), (1 << 2, 0), "layer 0");
        assert_eq!((word(64), word(65)), (0b1, 0), "TB6: layer-1 summaries");
        assert_eq!(word(66), 0b1, "TB6: the top summary");
    });
}

/// A search that lands on a stale summary repairs it (`AvailIndex::find`) while a set refills
/// the word under it: the repair must not take away a summary the set needs (INV(TB6)), and
/// the search still finds a node.
#[test]
fn search_repairs_a_stale_summary_racing_a_refill() {
    loom::model(|| {
        let words = zeroed_index();
        {
            // Order 10's nodes are 1024..2048: layer-0 words 32..64, summarized by bits of
            // layer-1 word 65, which is bit 1 of the top word (66). Node 1064 (word 33) is
            // Available; word 32 is empty, but its summary (bit 0 of word 65) is set: stale.
            let index = AvailIndex::new(&words, INDEX_BITS);
            index.set(1064);
            words[65].fetch_or_relaxed(1);
        }
        let search = {
            let words = words.clone();
            // Seed 0 tries bit 0 of word 65 (the stale one) first.
            thread::spawn(move || AvailIndex::new(&words, INDEX_BITS).find(10, 0))
        };
        let refill = {
            let words = words.clone();
            thread::spawn(move || AvailIndex::new(&words, INDEX_BITS).set(1029))
        };
        let found = search.join().unwrap();
        refill.join().unwrap();
        assert!(
            matches!(found, Some(1029) | Some(1064)),
            "the search found {found:?}"
        );
        let word = |i: usize| words[i].load_relaxed();
        assert_eq!((word(32), word(33)), (1 << 5, 1 << 8), "layer 0");
        assert_eq!(word(65), 0b11, "TB6: layer-1 summaries");
        assert_eq!(word(66), 0b10, "TB6: the top summary");
    });
}
