//! Stray frees on a real GPU (ignored without `--include-ignored`): a free of a pointer that
//! `malloc` never handed out, next to live blocks, is counted as invalid, changes no count of
//! live blocks, and never lets two live blocks overlap, whether the pointer names a slot that a
//! run of slots still holds (which another warp then allocates), a slot past a bin's end, or a
//! large block that a run of large blocks holds. Each case runs on a fresh heap; the blocks
//! allocated after it are pattern-checked and checked for overlap.

mod common;

use std::sync::Arc;

use cudarc::driver::CudaStream;
use toga::{Heap, HeapStats};
use toga_harness::{Workloads, block_bytes};

/// One thread mallocs `size` (a lone lane: from its SM's run), and that block's pointer comes
/// back.
fn lone_malloc(w: &Workloads, stream: &Arc<CudaStream>, heap: &Heap, size: u32) -> u64 {
    let mut ptrs = stream.alloc_zeros::<u64>(1).unwrap();
    w.malloc(stream, Some(heap), &mut ptrs, size).unwrap();
    let q = stream.clone_dtoh(&ptrs).unwrap()[0];
    assert_ne!(q, 0, "malloc({size}) on a fresh heap");
    q
}

/// One thread frees `p`.
fn free_one(w: &Workloads, stream: &Arc<CudaStream>, heap: &Heap, p: u64) {
    let ptrs = stream.clone_htod(&[p]).unwrap();
    w.free(stream, Some(heap), &ptrs).unwrap();
    stream.synchronize().unwrap();
}

/// `threads` threads allocate `size` each and keep it, with a pattern; returns the pointers
/// (all non-null) after checking every pattern and that no two blocks overlap.
fn fill_and_check(
    w: &Workloads,
    stream: &Arc<CudaStream>,
    heap: &Heap,
    size: u32,
    threads: usize,
    tag: u32,
) -> (cudarc::driver::CudaSlice<u64>, Vec<u64>) {
    let sizes = stream.clone_htod(&vec![size; threads]).unwrap();
    let mut ptrs = stream.alloc_zeros::<u64>(threads).unwrap();
    w.alloc_fill(stream, heap, &mut ptrs, &sizes, tag).unwrap();
    let mut errors = stream.alloc_zeros::<u64>(2).unwrap();
    w.check_free(stream, heap, &ptrs, &sizes, tag, false, &mut errors)
        .unwrap();
    assert_eq!(stream.clone_dtoh(&errors).unwrap()[0], 0, "pattern errors");
    let host = stream.clone_dtoh(&ptrs).unwrap();
    assert!(host.iter().all(|&p| p != 0), "{threads} × {size} B");
    let mut sorted = host.clone();
    sorted.sort_unstable();
    let bytes = block_bytes(size);
    for pair in sorted.windows(2) {
        assert!(
            pair[0] + bytes <= pair[1],
            "{size} B blocks overlap: {pair:x?}"
        );
    }
    (ptrs, host)
}

fn stats(heap: &Heap, stream: &Arc<CudaStream>) -> HeapStats {
    heap.stats(stream).unwrap()
}

/// The case of the report: `q = malloc(size); free(stray); free(q)` on a fresh heap, then
/// `later` threads each `malloc(size)` and keep it. `stray` is `q + offset`.
fn stray_then_fill(size: u32, offset: u64, later: usize) {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let w = Workloads::new(&gpu).unwrap();
    let heap = Heap::new(&gpu, &stream, 1 << 30).unwrap();
    let q = lone_malloc(&w, &stream, &heap, size);
    free_one(&w, &stream, &heap, q + offset);
    let s = stats(&heap, &stream);
    assert_eq!(
        (s.invalid_frees, s.double_frees),
        (1, 0),
        "{size} B, q + {offset}: {s:?}"
    );
    assert_eq!(s.live_blocks(), 1, "{size} B, q + {offset}: {s:?}");
    free_one(&w, &stream, &heap, q);
    let s = stats(&heap, &stream);
    assert_eq!(s.live_blocks(), 0, "{size} B, q + {offset}: {s:?}");
    assert_eq!((s.mallocs, s.frees), (1, 1), "{s:?}");
    let (ptrs, host) = fill_and_check(&w, &stream, &heap, size, later, 1);
    assert!(
        host.iter().filter(|&&p| p == q + offset).count() <= 1,
        "the stray slot handed out twice"
    );
    let s = stats(&heap, &stream);
    assert_eq!(s.live_blocks(), later as u64, "{s:?}");
    assert_eq!((s.invalid_frees, s.double_frees), (1, 0), "{s:?}");
    w.free(&stream, Some(&heap), &ptrs).unwrap();
    let s = stats(&heap, &stream);
    assert_eq!(s.live_blocks(), 0, "{s:?}");
    assert_eq!(s.frees, later as u64 + 1, "{s:?}");
    assert_eq!((s.invalid_frees, s.double_frees), (1, 0), "{s:?}");
    println!(
        "{size} B, stray q + {offset}: counted invalid, {later} blocks after it intact and disjoint"
    );
}

/// The next slot after a lone lane's block is its run's next item: never handed out.
#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn a_stray_free_of_the_next_slot_of_a_run_is_counted_and_refused() {
    for size in [16u32, 64, 256, 1024] {
        stray_then_fill(size, size as u64, 1 << 16);
    }
}

/// The report's worst case: at 64 B the slot came back out of the run a second time, and
/// among 2^20 blocks two overlapped.
#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn a_stray_free_at_64_b_then_a_million_mallocs_stay_disjoint() {
    stray_then_fill(64, 64, 1 << 20);
}

/// Slots further into the run (another bin of it), and an interior pointer.
#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn stray_frees_deeper_in_a_run_and_inside_a_block_are_counted() {
    // 16 B: a run spans 16 bins; 5 pages on is a slot of the run's sixth bin.
    stray_then_fill(16, 5 * 4096, 1 << 16);
    stray_then_fill(32, 8, 1 << 16);
}

/// A large block that a run of large blocks holds (8 KiB: the SM's run of its order) is not
/// live: its free is counted as invalid (its table entry was never set, INV(HP1)), and the run
/// still hands it out once.
#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn a_stray_free_of_a_large_block_a_run_holds_is_counted() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let w = Workloads::new(&gpu).unwrap();
    let heap = Heap::new(&gpu, &stream, 1 << 30).unwrap();
    let size = 8192u32;
    let q = lone_malloc(&w, &stream, &heap, size);
    free_one(&w, &stream, &heap, q + size as u64);
    let s = stats(&heap, &stream);
    assert_eq!((s.invalid_frees, s.double_frees), (1, 0), "{s:?}");
    assert_eq!(s.live_blocks(), 1, "{s:?}");
    free_one(&w, &stream, &heap, q);
    assert_eq!(stats(&heap, &stream).live_blocks(), 0);
    let (ptrs, _) = fill_and_check(&w, &stream, &heap, size, 1 << 16, 2);
    w.free(&stream, Some(&heap), &ptrs).unwrap();
    let s = stats(&heap, &stream);
    assert_eq!(s.live_blocks(), 0, "{s:?}");
    assert_eq!((s.invalid_frees, s.double_frees), (1, 0), "{s:?}");
}
