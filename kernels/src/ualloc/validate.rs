//! `assert_valid`: a quiescent consistency check of every arena (tests call it between
//! steps). Walks every chunk, bin and list and checks the UA/RCU invariants.

use crate::size_class::{BinKind, NUM_CLASSES, SizeClass};
use crate::ualloc::bin::USED_COUNT_MASK;
use crate::ualloc::bin::bin_at;
use crate::ualloc::chunk::bins_per_chunk;
use crate::ualloc::chunk::chunk_at;
use crate::ualloc::layout::WORD_BITS;
use crate::ualloc::{ChunkSource, UAlloc};

impl<S: ChunkSource> UAlloc<'_, S> {
    /// Check every invariant that holds when no operation is in flight; panics on the first
    /// violation. Quiescent use only (tests, between kernels).
    pub fn assert_valid(&self) {
        for (ai, arena) in self.arenas.iter().enumerate() {
            // INV(RCU3): nothing left queued, no owner, no reader.
            assert!(arena.rcu.is_idle(), "arena {ai}: RCU callbacks left queued");
            assert_eq!(arena.rcu.readers(), (0, 0), "arena {ai}: readers inside");
            let [free_slots, listed_bins, pending_bins] = self.owned_free_slots(ai);
            for kind in BinKind::ALL {
                let ks = arena.kind(kind);
                let list = &ks.chunks.0;
                assert!(!list.lock.is_locked(), "arena {ai}: chunk list locked");
                let per = bins_per_chunk(kind);
                let (mut chunks, mut partial_free, mut listed_chunks) = (0, 0, 0);
                let mut at = list.all.load_relaxed();
                let mut prev = 0;
                while at != 0 {
                    // SAFETY: chunks on `all` are live (checked just below).
                    let chunk = unsafe { chunk_at(at) };
                    assert!(
                        chunk.is_live(),
                        "INV(UA8): chunk {at:#x} on a list without magic"
                    );
                    assert_eq!(chunk.arena.load_relaxed() as usize, ai);
                    assert_eq!(chunk.kind(), kind);
                    assert_eq!(chunk.all_prev.load_relaxed(), prev);
                    let mut n_free = 0;
                    for (w, word) in chunk.free_bins.iter().enumerate() {
                        let bits = word.load_relaxed();
                        n_free += bits.count_ones();
                        for b in 0..WORD_BITS {
                            if bits & (1 << b) != 0 {
                                assert!(
                                    ((w * WORD_BITS + b) as u32) < per,
                                    "free bit past the last bin"
                                );
                            }
                        }
                    }
                    assert_eq!(chunk.n_free.load_relaxed(), n_free, "INV(UA9)");
                    // INV(UA11): a chunk with no carved bin (an extra chunk never used, or
                    // one whose bins' units were out when its last bin came back) waits for
                    // the next trim; the tests check that a trim leaves none.
                    assert!(n_free <= per, "INV(UA9): chunk {at:#x}");
                    let listed = chunk.listed.load_relaxed() != 0;
                    assert_eq!(listed, n_free > 0, "INV(UA10)");
                    if listed {
                        partial_free += n_free;
                        listed_chunks += 1;
                    }
                    for b in 0..per as usize {
                        let bin = chunk.bin(b);
                        if chunk.is_bin_free(b) {
                            assert_eq!(bin.class(), None, "INV(UA5): free bin carved");
                            continue;
                        }
                        let class = bin.class().expect("INV(UA5): taken bin not carved");
                        assert_eq!(class.kind(), kind);
                        let used = bin.used_word();
                        assert_eq!(
                            used & !USED_COUNT_MASK,
                            0,
                            "INV(UA4): retired bin not returned"
                        );
                        assert_eq!(used, bin.taken_slots(class), "INV(UA3)");
                        // INV(UA4): an empty bin may stay carved and listed until a trim.
                        // INV(UA7): a bin with a free slot is listed or pending (INV(UA13)).
                        let listed = bin.listed.load_relaxed() != 0;
                        let pending = bin.pending.load_relaxed() != 0;
                        assert!(
                            listed || pending || used >= class.slots(),
                            "INV(UA7): arena {ai} {class:?}: a bin with free slots is unlisted"
                        );
                        assert!(
                            !listed || used < class.slots(),
                            "INV(UA7): a full bin listed"
                        );
                        // INV(UA12): carved by an arena of this UAlloc.
                        assert!((bin.owner() as usize) < self.arenas.len());
                    }
                    chunks += 1;
                    prev = at;
                    at = chunk.all_next.load_relaxed();
                }
                assert_eq!(list.count.load_relaxed(), chunks);
                // The partial list holds exactly the listed chunks.
                let (mut walked, mut prev) = (0, 0);
                let mut at = list.partial.load_relaxed();
                while at != 0 {
                    // SAFETY: partial chunks are live.
                    let chunk = unsafe { chunk_at(at) };
                    assert!(chunk.listed.load_relaxed() != 0 && chunk.kind() == kind);
                    assert_eq!(chunk.prev.load_relaxed(), prev);
                    walked += 1;
                    prev = at;
                    at = chunk.next.load_relaxed();
                }
                assert_eq!(walked, listed_chunks, "INV(UA10): partial list");
                // INV(UA9): the bins semaphore counts exactly the free bins.
                assert_eq!(
                    ks.bins.0.counters(),
                    (partial_free, 0, 0),
                    "INV(UA9): arena {ai} {kind:?}"
                );
            }
            for class in SizeClass::ALL {
                let cs = arena.class(class);
                assert!(!cs.list.0.lock.is_locked());
                let (mut walked, mut prev) = (0, 0);
                let mut at = cs.list.0.head.load_relaxed();
                while at != 0 {
                    // SAFETY: listed bins are live.
                    let bin = unsafe { bin_at(at) };
                    assert_eq!(bin.class(), Some(class), "INV(UA7): bin on the wrong list");
                    assert_eq!(bin.owner() as usize, ai, "INV(UA12): bin on another's list");
                    assert!(bin.listed.load_relaxed() != 0);
                    assert_eq!(bin.prev.load_relaxed(), prev);
                    walked += 1;
                    prev = at;
                    at = bin.next.load_relaxed();
                }
                assert_eq!(
                    walked,
                    listed_bins[class.index()],
                    "INV(UA7): {class:?} list"
                );
                // INV(UA13): the pending stack holds exactly the bins with a non-zero count.
                let on_stack = cs.list.0.pending.for_each_quiescent(|bin| {
                    assert_eq!(
                        bin.class(),
                        Some(class),
                        "INV(UA13): bin on the wrong stack"
                    );
                    assert_eq!(
                        bin.owner() as usize,
                        ai,
                        "INV(UA13): bin on another's stack"
                    );
                    assert!(
                        bin.pending.load_relaxed() != 0,
                        "INV(UA13): count 0 on the stack"
                    );
                });
                assert_eq!(
                    on_stack,
                    pending_bins[class.index()],
                    "INV(UA13): {class:?} stack"
                );
                // INV(UA2): the slots semaphore counts exactly the free slots of the bins
                // listed or waiting for a drain (every bin with a free slot, INV(UA7)).
                assert_eq!(
                    cs.slots.0.counters(),
                    (free_slots[class.index()], 0, 0),
                    "INV(UA2): arena {ai} {class:?}"
                );
            }
        }
    }

    /// Free slots (listed or not), listed bins and pending bins per class of the bins that
    /// arena `owner` carved, in every arena's chunks (INV(UA12)). Quiescent use only.
    fn owned_free_slots(&self, owner: usize) -> [[u32; NUM_CLASSES]; 3] {
        let [mut free_slots, mut listed_bins, mut pending_bins] = [[0u32; NUM_CLASSES]; 3];
        for arena in self.arenas {
            for kind in BinKind::ALL {
                let mut at = arena.kind(kind).chunks.0.all.load_relaxed();
                while at != 0 {
                    // SAFETY: chunks on `all` are live (checked by the caller's walk).
                    let chunk = unsafe { chunk_at(at) };
                    for b in 0..bins_per_chunk(kind) as usize {
                        let bin = chunk.bin(b);
                        if chunk.is_bin_free(b) || bin.owner() as usize != owner {
                            continue;
                        }
                        let Some(class) = bin.class() else { continue };
                        free_slots[class.index()] += class.slots() - bin.used_word();
                        if bin.listed.load_relaxed() != 0 {
                            listed_bins[class.index()] += 1;
                        }
                        if bin.pending.load_relaxed() != 0 {
                            pending_bins[class.index()] += 1;
                        }
                    }
                    at = chunk.all_next.load_relaxed();
                }
            }
        }
        [free_slots, listed_bins, pending_bins]
    }
}
