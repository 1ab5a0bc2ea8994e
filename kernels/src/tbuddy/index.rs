//! The availability index: a 32-ary hierarchy of bitmaps over the node index space, so that an
//! allocator finds an Available node of order k in a few loads instead of scanning the level.
//!
//! ```text
//!  layer 2 (top, 1 word)      [b0 b1 ...]                 bit j: layer-1 word j may be non-zero
//!  layer 1                 [w0][w1] ... [w31]             bit j of word w: layer-0 word 32w+j ...
//!  layer 0   [n0..n31][n32..n63] ...   one bit per tree node (heap order: root = node 1)
//! ```
//! Layer 0 has one bit per node index in `0..2^(max_order+1)`. The nodes of one order are a
//! contiguous, power-of-two-aligned run of indices, so the search for order k is a search for a
//! set bit inside one aligned range, which the upper layers narrow down.
//!
//! The index is a hint; the node words decide (a claim is a CAS on the node word).
//! - INV(TB6) (quiescent): layer-0 bit n is set iff node n is Available, and a bit of an upper
//!   layer is set iff the word below it is non-zero.
//! - Stale positives (a summary bit over an empty word) can outlive a race of clears and sets
//!   (see `clear_from`, phase 2); the first [`AvailIndex::find`] that lands on one takes it
//!   away, as a clear would, and searches the word's other bits.
//! - At all times the summaries are never stale-negative for long: [`AvailIndex::clear`] clears
//!   a summary bit only after the word below became empty, then re-reads, bottom-up, every word
//!   whose summary it cleared and sets the bit again where a concurrent [`AvailIndex::set`]
//!   refilled it (a setter stops climbing at the first word that was not empty, which may be
//!   one whose summary the clear removes after). A set's RMWs on summary words are releases
//!   and a clear's RMWs are acq_rel, so of a clear and a set that race on one summary bit, the
//!   later one sees the other's word. A set's RMW on a layer-0 word is relaxed: nothing reads
//!   through a layer-0 bit (the node word decides), and the release of the summary above it,
//!   when there is one, orders it. Until 2026-11-26 that RMW was acq_rel too: a MEMBAR on the
//!   GPU in every split, every make-Available and every free of the tree. (A clear with a
//!   relaxed layer-0 RMW and acquire summaries passed the loom models as well and made one
//!   thread's mallocs 8% faster, but a fresh fill of 2^20 × 4 KiB 9% slower, on an H100; not
//!   kept, `docs/benchmarks.md`. A free's merge clears with it since 2026-11-26k,
//!   [`AvailIndex::clear_merged`]: with the buddy's state read before the pair lock, the large
//!   frees were 4–9% faster.)
//!   `tests/loom_index.rs` models the race; an earlier version that stopped re-checking at
//!   the first refilled word lost a top-level summary there, and on the GPU that hid free
//!   blocks from every search.

use crate::platform::Atomic32;

/// log2 of the fan-out: one index word summarizes 32 words (or nodes) below.
pub const FANOUT_SHIFT: u32 = 5;
/// Bits per index word.
pub const FANOUT: u32 = 1 << FANOUT_SHIFT;
const _: () = assert!(FANOUT == u32::BITS);

/// Most layers any tree needs: `ceil(MAX_LEVELS / FANOUT_SHIFT)` (the node index space of a
/// tree with `MAX_LEVELS` levels has `2^MAX_LEVELS` indices).
pub const MAX_LAYERS: usize = (super::MAX_LEVELS as usize).div_ceil(FANOUT_SHIFT as usize);

/// Words of each layer for a node index space of `2^index_bits` indices: the layer sizes and
/// their total.
pub const fn layer_words(index_bits: u32) -> ([u32; MAX_LAYERS], usize) {
    let mut words = [0u32; MAX_LAYERS];
    let mut total = 0usize;
    let mut bits = index_bits;
    let mut layer = 0;
    loop {
        let w = if bits > FANOUT_SHIFT {
            1u32 << (bits - FANOUT_SHIFT)
        } else {
            1
        };
        words[layer] = w;
        total += w as usize;
        if w == 1 {
            return (words, total);
        }
        bits -= FANOUT_SHIFT;
        layer += 1;
    }
}

/// Words before layer `layer` (at most the top layer) of an index of `2^index_bits` bits: the
/// layers below it hold `2^(index_bits − 5)`, `2^(index_bits − 10)`, … words, a geometric sum,
/// `(2^index_bits − 2^(index_bits − 5·layer)) / 31`. A closed form, so that a view of the tree
/// costs no loop (every large `malloc` and `free` builds one).
#[inline(always)]
pub const fn layer_offset(index_bits: u32, layer: u32) -> u32 {
    ((1u32 << index_bits) - (1u32 << (index_bits - FANOUT_SHIFT * layer))) / (FANOUT - 1)
}

/// The top layer (one word) of an index of `2^index_bits` bits (`index_bits ≥ 1`).
#[inline(always)]
pub const fn top_layer(index_bits: u32) -> u32 {
    (index_bits - 1) / FANOUT_SHIFT
}

/// Words of an index of `2^index_bits` bits: [`layer_words`]' total, in closed form.
#[inline(always)]
pub const fn index_words(index_bits: u32) -> usize {
    layer_offset(index_bits, top_layer(index_bits)) as usize + 1
}

/// A view of the index words of one tree.
#[derive(Clone, Copy)]
pub struct AvailIndex<'a> {
    words: &'a [Atomic32],
    /// Start of each layer in `words` ([`layer_offset`]; the top's repeated above it).
    offset: [u32; MAX_LAYERS],
    /// The top layer (one word).
    top: u32,
}

/// Splits a bit position of some layer into (word, mask).
#[inline(always)]
fn word_bit(pos: u32) -> (u32, u32) {
    (pos >> FANOUT_SHIFT, 1 << (pos & (FANOUT - 1)))
}

impl<'a> AvailIndex<'a> {
    /// The index of a tree whose node indices are `0..2^index_bits`, in the first
    /// `index_words(index_bits)` of `words` (the rest are not the index's). No loop and no
    /// branch: every large `malloc` and `free` builds one.
    #[inline]
    pub fn new(words: &'a [Atomic32], index_bits: u32) -> Self {
        debug_assert!(index_bits >= 1 && words.len() >= index_words(index_bits));
        let top = top_layer(index_bits);
        let offset =
            core::array::from_fn(|layer| layer_offset(index_bits, (layer as u32).min(top)));
        Self { words, offset, top }
    }

    /// The top layer (one word).
    #[inline(always)]
    fn top(&self) -> u32 {
        self.top
    }

    /// Where `layer` starts in `words`.
    #[inline(always)]
    fn offset(&self, layer: u32) -> u32 {
        self.offset[layer as usize]
    }

    #[inline(always)]
    fn word(&self, layer: u32, w: u32) -> &'a Atomic32 {
        &self.words[(self.offset(layer) + w) as usize]
    }

    /// Mark node `n` Available in the index (after its node word says so).
    pub fn set(&self, n: u32) {
        self.set_from(0, n);
    }

    /// Set bit `pos` of `layer`, and the summaries above it that were empty.
    fn set_from(&self, mut layer: u32, mut pos: u32) {
        loop {
            let (w, bit) = word_bit(pos);
            let word = self.word(layer, w);
            // A summary bit (layer > 0) with release: the word below that it summarizes (our
            // own bit there, or a racing setter's that the re-check in `clear` saw) happens
            // before whoever acquires this summary (`find`'s loads, and a clear whose acq_rel
            // `fetch_and` of it reads our bit, whose re-check then sees the word non-empty;
            // module doc). A layer-0 bit summarizes nothing: relaxed. Each release is a MEMBAR
            // on the GPU; the common set, into a word that was not empty, has none.
            let old = if layer == 0 {
                word.fetch_or_relaxed(bit)
            } else {
                word.fetch_or_release(bit)
            };
            if old != 0 || layer == self.top() {
                return;
            }
            layer += 1;
            pos = w;
        }
    }

    /// Remove node `n` from the index (after its node word left Available).
    pub fn clear(&self, n: u32) {
        self.clear_from(n, false);
    }

    /// [`clear`](Self::clear) whose RMW on the layer-0 word is relaxed: for a free's merge,
    /// which took the node with an acquire CAS under the pair lock and publishes nothing
    /// through the index (module doc: a relaxed layer-0 clear passed the loom models; the
    /// summary RMWs stay acq_rel). A MEMBAR less on each merged level of a free's climb.
    pub fn clear_merged(&self, n: u32) {
        self.clear_from(n, true);
    }

    #[inline(always)]
    fn clear_from(&self, n: u32, relaxed_leaf: bool) {
        // Phase 1: clear upwards while words become empty.
        let mut layer = 0;
        let mut pos = n;
        loop {
            let (w, bit) = word_bit(pos);
            let word = self.word(layer, w);
            // Acq_rel: pairs with the acq_rel `fetch_or` of a racing `set_from` (see module
            // doc); relaxed on layer 0 for a merge (`clear_merged`).
            let old = if relaxed_leaf && layer == 0 {
                word.fetch_and_relaxed(!bit)
            } else {
                word.fetch_and_acq_rel(!bit)
            };
            if old != bit || layer == self.top() {
                break;
            }
            layer += 1;
            pos = w;
        }
        // Phase 2: every word this call emptied below `layer` had its summary bit cleared; a
        // racing `set` may have refilled it meanwhile, and that setter may have stopped
        // climbing at a word that was not empty yet (whose summary we cleared after). So
        // re-check every layer we emptied, bottom-up, and give each refilled word its summary
        // back the way `set` does: climbing while the words above were empty, since another
        // clear may have emptied those in the meantime. A bit put back over a word that
        // empties again is a stale positive; the first `find` that lands on it takes it away
        // (`repair`).
        let mut pos = n;
        for below in 0..layer {
            let w = pos >> FANOUT_SHIFT;
            // Acquire: pairs with the release half of the refilling `fetch_or`.
            if self.word(below, w).load_acquire() != 0 {
                self.set_from(below + 1, w);
            }
            pos = w;
        }
    }

    /// Look for a node index with its bit set in the aligned range `[2^a, 2^(a+1))` (the nodes of
    /// one order), choosing among set bits by `seed`. A summary bit over an empty word (stale)
    /// is repaired and passed over for the word's other bits. `None` when the hint says there
    /// is none (or every bit of a word was stale: the caller retries).
    pub fn find(&self, a: u32, mut seed: u64) -> Option<u32> {
        let lo = 1u32 << a;
        let hi = (lo << 1) - 1;
        // The lowest layer at which the whole range lies inside one word.
        let mut layer = 0;
        while (lo >> (FANOUT_SHIFT * (layer + 1))) != (hi >> (FANOUT_SHIFT * (layer + 1))) {
            layer += 1;
        }
        debug_assert!(layer <= self.top());
        let shift = FANOUT_SHIFT * layer;
        let (mut w, _) = word_bit(lo >> shift);
        let first = (lo >> shift) & (FANOUT - 1);
        let last = (hi >> shift) & (FANOUT - 1);
        let mask = (u32::MAX >> (FANOUT - 1 - last)) & (u32::MAX << first);
        // Acquire: pairs with the release half of `set_from`'s `fetch_or`.
        let mut bits = self.word(layer, w).load_acquire() & mask;
        loop {
            if bits == 0 {
                return None;
            }
            let rot = (seed as u32) & (FANOUT - 1);
            let b = (bits.rotate_right(rot).trailing_zeros() + rot) & (FANOUT - 1);
            let pos = (w << FANOUT_SHIFT) | b;
            if layer == 0 {
                return Some(pos);
            }
            // Acquire: as above.
            let below = self.word(layer - 1, pos).load_acquire();
            if below == 0 {
                // A stale summary over an empty word: take it away (so that later searches do
                // not land on it either), and look at this word's other bits.
                self.repair(layer, pos);
                bits &= !(1 << b);
                continue;
            }
            layer -= 1;
            w = pos;
            bits = below;
            seed >>= FANOUT_SHIFT;
        }
    }

    /// Clear summary bit `pos` of `layer` (> 0), which a search found set over an empty word,
    /// the way a clear takes a summary away: an acq_rel `fetch_and`, then a re-check of the
    /// word below, whose summary goes back (as `set` puts it) if a racing set refilled it
    /// (module doc). A clear that puts a summary back after another clear emptied the word
    /// again leaves such a bit behind; nothing else takes it away, and before this repair
    /// every search that landed on one came back empty: its caller slept and looked again.
    /// In fresh fills of 2^20 × 1 KiB or 4 KiB, runs with many of them were the slow ones
    /// (H200, `docs/benchmarks.md`, v_variance). The summary above is left as it is: if this
    /// emptied its word, a later search repairs that one too.
    #[cold]
    fn repair(&self, layer: u32, pos: u32) {
        let (w, bit) = word_bit(pos);
        // Acq_rel: as a clear's (module doc).
        self.word(layer, w).fetch_and_acq_rel(!bit);
        // Acquire: pairs with the release half of a refilling set's `fetch_or`.
        if self.word(layer - 1, pos).load_acquire() != 0 {
            self.set_from(layer, pos);
        }
    }

    /// The value index word `i` (counted across all layers) must hold when exactly the nodes
    /// `available` are Available: for the parallel init.
    pub fn initial_word(&self, i: usize, available: impl Iterator<Item = u32>) -> u32 {
        let mut layer = 0;
        while layer < self.top() && i >= self.offset(layer + 1) as usize {
            layer += 1;
        }
        let w = (i - self.offset(layer) as usize) as u32;
        let mut value = 0;
        for n in available {
            let (word, bit) = word_bit(n >> (FANOUT_SHIFT * layer));
            if word == w {
                value |= bit;
            }
        }
        value
    }

    /// Write index word `i` (counted across all layers); init only.
    pub fn store_word(&self, i: usize, value: u32) {
        self.words[i].store_relaxed(value);
    }

    /// Host diagnosis of a snapshot (maybe not quiescent): the number of set layer-0 bits in
    /// `nodes`, and of stale-negative summaries (a non-empty word whose summary bit is clear).
    #[cfg(not(target_arch = "nvptx64"))]
    pub fn census(&self, nodes: core::ops::Range<u32>) -> (u32, u32) {
        let set = nodes
            .filter(|&n| {
                let (w, bit) = word_bit(n);
                self.word(0, w).load_relaxed() & bit != 0
            })
            .count() as u32;
        let mut stale = 0;
        for layer in 1..=self.top() {
            let below = self.offset(layer) - self.offset(layer - 1);
            for pos in 0..below {
                let (w, bit) = word_bit(pos);
                let summary = self.word(layer, w).load_relaxed() & bit != 0;
                if !summary && self.word(layer - 1, pos).load_relaxed() != 0 {
                    stale += 1;
                }
            }
        }
        (set, stale)
    }

    /// Host check of INV(TB6) against `is_available(node)`, at quiescence.
    #[cfg(not(target_arch = "nvptx64"))]
    pub fn assert_consistent(&self, nodes: u32, is_available: impl Fn(u32) -> bool) {
        for n in 0..nodes {
            let (w, bit) = word_bit(n);
            let set = self.word(0, w).load_relaxed() & bit != 0;
            assert_eq!(
                set,
                is_available(n),
                "TB6: index bit of node {n} disagrees with its state"
            );
        }
        for layer in 1..=self.top() {
            let below = self.offset(layer) - self.offset(layer - 1);
            for pos in 0..below {
                let (w, bit) = word_bit(pos);
                let set = self.word(layer, w).load_relaxed() & bit != 0;
                let nonzero = self.word(layer - 1, pos).load_relaxed() != 0;
                assert_eq!(
                    set, nonzero,
                    "TB6: summary bit {pos} of layer {layer} is stale"
                );
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::vec::Vec;

    fn words(index_bits: u32) -> Vec<Atomic32> {
        (0..layer_words(index_bits).1)
            .map(|_| Atomic32::new(0))
            .collect()
    }

    #[test]
    fn layer_sizes() {
        assert_eq!(layer_words(1).1, 1);
        assert_eq!(layer_words(5).1, 1);
        assert_eq!(layer_words(6).0[..2], [2, 1]);
        let (sizes, total) = layer_words(super::super::MAX_LEVELS);
        assert_eq!(sizes, [1 << 19, 1 << 14, 1 << 9, 1 << 4, 1]);
        assert_eq!(total, sizes.iter().map(|&w| w as usize).sum::<usize>());
    }

    /// The closed forms the views use agree with the layer sizes, for every tree size.
    #[test]
    fn closed_forms_match_the_layer_sizes() {
        for bits in 1..=super::super::MAX_LEVELS {
            let (sizes, total) = layer_words(bits);
            assert_eq!(index_words(bits), total, "{bits} bits");
            let top = top_layer(bits);
            assert_eq!(sizes[top as usize], 1, "{bits} bits: the top is one word");
            let mut at = 0;
            for layer in 0..=top {
                assert_eq!(layer_offset(bits, layer), at, "{bits} bits, layer {layer}");
                assert!(layer == top || sizes[layer as usize] > 1);
                at += sizes[layer as usize];
            }
        }
    }

    /// A summary bit over an empty word (left by a clear's re-check that came after another
    /// clear) is passed over and taken away by the first search that lands on it: every seed
    /// finds the one Available node, and the summaries are exact afterwards.
    #[test]
    fn find_repairs_a_stale_summary() {
        let words = words(10);
        let index = AvailIndex::new(&words, 10);
        // Order 9's nodes are 512..1024: layer-0 words 16..32, summarized by bits 16..31 of
        // the top word. Node 900 (word 28) is Available; word 18 is empty under a set bit.
        index.set(600);
        index.set(900);
        index.clear(600);
        index.word(1, 0).fetch_or_relaxed(1 << 18);
        for seed in 0..64 {
            assert_eq!(index.find(9, seed), Some(900), "seed {seed}");
        }
        index.assert_consistent(1 << 10, |n| n == 900);
    }

    /// Every order's range, every node: set → found (whatever the seed), clear → gone, and the
    /// summaries are exact afterwards.
    #[test]
    fn set_find_clear_every_node() {
        const BITS: u32 = 12;
        let w = words(BITS);
        let index = AvailIndex::new(&w, BITS);
        for a in 0..BITS {
            for n in (1u32 << a)..(2u32 << a) {
                index.set(n);
                for seed in [0, 7, 0xdead_beef] {
                    assert_eq!(index.find(a, seed), Some(n), "order range {a}, node {n}");
                }
                if a > 0 {
                    assert_eq!(index.find(a - 1, 0), None);
                }
                index.clear(n);
                assert_eq!(index.find(a, 0), None);
                index.assert_consistent(1 << BITS, |_| false);
            }
        }
    }

    /// Many set bits: the seed spreads the picks, and removing them one by one leaves the
    /// summaries exact.
    #[test]
    fn seeds_scatter_and_summaries_shrink() {
        const BITS: u32 = 11;
        let w = words(BITS);
        let index = AvailIndex::new(&w, BITS);
        let a = BITS - 1;
        let nodes: Vec<u32> = ((1u32 << a)..(2u32 << a)).step_by(37).collect();
        nodes.iter().for_each(|&n| index.set(n));
        let picks: std::collections::BTreeSet<u32> = (0..64u64)
            .map(|s| {
                index
                    .find(a, s.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                    .unwrap()
            })
            .collect();
        assert!(picks.len() > 4, "the seed does not scatter: {picks:?}");
        assert!(picks.iter().all(|p| nodes.contains(p)));
        for (i, &n) in nodes.iter().enumerate() {
            index.clear(n);
            index.assert_consistent(1 << BITS, |m| nodes[i + 1..].contains(&m));
        }
    }
}
