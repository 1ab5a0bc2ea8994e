//! How much of a heap malloc serves before it returns null (issue 13), on a real GPU (ignored
//! without one). Each round asks for twice the heap in one kernel, lanes of every warp asking
//! for different sizes, checks every block's pattern and that no two blocks overlap, and frees
//! everything; 20 rounds with no trim in between, so memory must flow back between classes,
//! kinds and SMs by itself. After the last round a whole-heap block must be allocatable.

mod common;

use toga::Heap;
use toga_harness::{Workloads, block_bytes, uniform_sizes};
use toga_kernels::size_class::MAX_SMALL_SIZE;
use toga_kernels::ualloc::CHUNK_SIZE;

const ROUNDS: u32 = 20;

/// Requests of `lo..=hi` bytes whose blocks add up to twice `capacity`.
fn twice_the_heap(capacity: u64, lo: u32, hi: u32, seed: u64) -> Vec<u32> {
    let mean = (lo as u64 + hi as u64) / 2;
    let mut sizes = uniform_sizes(4 * capacity / mean + 64, lo, hi, seed);
    let mut total = 0;
    let n = sizes
        .iter()
        .position(|&s| {
            total += block_bytes(s);
            total >= 2 * capacity
        })
        .map_or(sizes.len(), |i| i + 1);
    sizes.truncate(n);
    sizes
}

/// Fill `heap_bytes` with requests of `lo..=hi` bytes for [`ROUNDS`] rounds; every round must
/// serve at least `floor` of the heap (in block bytes), and no round less than the first by more
/// than 2% of the heap and one block of the largest size, plus `decay` of the heap: a bound
/// measured for the sizes whose chunks stay in their arenas between rounds (issue 13's
/// stranding), 0 elsewhere. What the chunks hold beyond their live blocks is printed, not
/// added back (it would excuse any decay it caused). Utilization is also printed in requested
/// bytes (what the served requests asked for); where
/// `lo..=hi` has small sizes, a round that serves no small block must have left less than a
/// chunk unused (their nulls are then true out-of-memory answers). Returns the fraction served
/// per round.
fn rounds(heap_bytes: u64, lo: u32, hi: u32, floor: f64, decay: f64) -> Vec<f64> {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let heap = Heap::new(&gpu, &stream, heap_bytes).unwrap();
    let w = Workloads::new(&gpu).unwrap();
    let capacity = heap.capacity();
    let sizes = twice_the_heap(capacity, lo, hi, heap_bytes ^ lo as u64 ^ (hi as u64) << 20);
    let d_sizes = stream.clone_htod(&sizes).unwrap();
    let mut served = Vec::new();
    let mut held = Vec::new();
    let mut requested = Vec::new();
    for round in 0..ROUNDS {
        let mut ptrs = stream.alloc_zeros::<u64>(sizes.len()).unwrap();
        w.alloc_fill(&stream, &heap, &mut ptrs, &d_sizes, round)
            .unwrap();
        let host = stream.clone_dtoh(&ptrs).unwrap();
        let mut blocks: Vec<(u64, u64)> = host
            .iter()
            .zip(&sizes)
            .filter(|&(&p, _)| p != 0)
            .map(|(&p, &s)| (p, block_bytes(s)))
            .collect();
        let bytes: u64 = blocks.iter().map(|b| b.1).sum();
        // What the served requests asked for: the utilization a user sees.
        let asked: u64 = host
            .iter()
            .zip(&sizes)
            .filter(|&(&p, _)| p != 0)
            .map(|(_, &s)| s as u64)
            .sum();
        assert!(
            asked <= bytes,
            "round {round}: {asked} B asked, {bytes} B in blocks"
        );
        requested.push(asked as f64 / capacity as f64);
        let s = heap.stats(&stream).unwrap();
        assert_eq!(
            s.used_bytes, bytes,
            "round {round}: used bytes = blocks handed out"
        );
        assert_eq!(s.live_blocks(), blocks.len() as u64);
        let small: u64 = s
            .live_per_class
            .iter()
            .map(|&(size, n)| size as u64 * n)
            .sum();
        eprintln!(
            "round {round}: small blocks {small} B, large blocks {}, reserved {} B; {}",
            s.live_large,
            s.reserved_bytes,
            toga_harness::census(&stream, &heap).unwrap().line()
        );
        // A small request needs a chunk (or a bin of one): with none served, the large blocks
        // must have left less than a chunk of the heap unused, or UAlloc answered null while
        // the heap had the memory.
        if lo as usize <= MAX_SMALL_SIZE {
            assert!(
                small > 0 || bytes + CHUNK_SIZE as u64 > capacity,
                "round {round}: no small request served with {} B of {capacity} unused",
                capacity - bytes
            );
        }
        // Chunk bytes not in live small blocks: reserved = chunks + large blocks.
        let large = s.used_bytes - small;
        held.push((s.reserved_bytes - large - small) as f64 / capacity as f64);
        blocks.sort_unstable();
        for pair in blocks.windows(2) {
            assert!(
                pair[0].0 + pair[0].1 <= pair[1].0,
                "round {round}: blocks {:#x}+{} and {:#x} overlap",
                pair[0].0,
                pair[0].1,
                pair[1].0
            );
        }
        let mut errors = stream.alloc_zeros::<u64>(2).unwrap();
        w.check_free(&stream, &heap, &ptrs, &d_sizes, round, true, &mut errors)
            .unwrap();
        assert_eq!(
            stream.clone_dtoh(&errors).unwrap()[0],
            0,
            "round {round}: corrupted patterns"
        );
        let s = heap.stats(&stream).unwrap();
        assert_eq!(
            (s.live_blocks(), s.used_bytes),
            (0, 0),
            "round {round}: {s:?}"
        );
        assert_eq!((s.double_frees, s.invalid_frees), (0, 0));
        served.push(bytes as f64 / capacity as f64);
    }
    let percents = |v: &[f64]| {
        v.iter()
            .map(|f| format!("{:.1}%", f * 100.0))
            .collect::<Vec<_>>()
            .join(" ")
    };
    eprintln!(
        "{} MiB heap, {lo}..={hi} B, {} requests: served {} in blocks, {} requested, {} in \
         chunks but not in blocks",
        heap_bytes >> 20,
        sizes.len(),
        percents(&served),
        percents(&requested),
        percents(&held)
    );
    // Rounds differ by a block or two of the largest size (1 MiB is 1.6% of 64 MiB).
    let slack = 0.02 + block_bytes(hi) as f64 / capacity as f64 + decay;
    for (round, &f) in served.iter().enumerate() {
        assert!(
            f >= floor,
            "round {round}: {:.1}% of the heap served, below {:.0}%",
            f * 100.0,
            floor * 100.0
        );
        // No decay: memory left in chunks after a round's frees does not excuse a later
        // round's serving less (held is printed, to see where the bytes went).
        assert!(
            f + slack >= served[0],
            "round {round}: {:.1}% served after {:.1}% in round 0, with {:.1}% in chunks (decay)",
            f * 100.0,
            served[0] * 100.0,
            held[round] * 100.0
        );
    }
    // Empty bins stay with their class until a trim (docs/ualloc.md).
    heap.trim(&stream).unwrap();
    let probe = w.probe(&stream, &heap).unwrap();
    assert_eq!(probe.free_bytes, capacity);
    assert!(
        probe.whole_heap_block,
        "no whole-heap block after the last round"
    );
    served
}

// Mixed 16 B – 4 KB: issue 13's targets are ≥ 80% at 8 MiB and ≥ 90% at 64 MiB, and the floors
// below are those targets. Before the homes (INV(UA16)), each of 132 arenas kept a partly used
// bin of up to 104 KB per class, and SMs that ran out together each adopted a chunk: on an H100
// runs served 60–69% (8 MiB) and 58–64% (64 MiB). With refills at a class's home and one chunk
// adoption of a kind at a time while chunks are scarce, the same H100 served 91.6% and 96.5% in
// every round (docs/ualloc.md).

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn mixed_16b_to_4k_in_8mib() {
    rounds(8 << 20, 16, 4096, 0.80, 0.0);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn mixed_16b_to_4k_in_64mib() {
    rounds(64 << 20, 16, 4096, 0.90, 0.0);
}

// Mixed 16 B – 64 KiB served 100% of a 64 MiB heap in every round until 2026-11-25, but only
// because no request of 4 KiB or less was ever served: the large requests reserved every page
// first. Since large requests of a warp take their blocks together (`TBuddy::alloc_together`),
// small ones get chunks too, and those chunks stay in their arenas between rounds (issue 13's
// stranding): on an H100, runs served 94–100% in their first round and 86–96% later, at both
// heap sizes; in an 8 MiB heap two chunks are 12.5%. The floors follow what was measured, and
// so does the decay allowed: from 100% in a first round to 86% in a later one.

/// The most a later round of mixed 16 B – 64 KiB served below the first on an H100 (100% and
/// 86% of the heap, above), beyond the 2% and one block every cell is allowed.
const STRANDING_DECAY: f64 = 0.14;

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn mixed_16b_to_64k_in_8mib() {
    rounds(8 << 20, 16, 65536, 0.80, STRANDING_DECAY);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn mixed_16b_to_64k_in_64mib() {
    rounds(64 << 20, 16, 65536, 0.85, STRANDING_DECAY);
}

/// Large sizes in divergent warps: every lane of a warp asks for a different size of 4 KiB to
/// 1 MiB (TBuddy), so lanes of one warp take different orders at once.
#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn divergent_large_sizes_in_64mib() {
    rounds(64 << 20, 4097, 1 << 20, 0.90, 0.0);
}
