//! Stray frees on the whole heap (host threads, a heap in host memory): a free of a slot that a
//! run of slots still holds (never handed out) is refused and counted as invalid, changes no
//! count of live blocks, and never lets the run hand the slot out twice (INV(UA19)). Every
//! block handed out afterwards is pattern-checked against every other.
#![cfg(not(loom))]

mod common;

use common::with_deadline;

use std::sync::{Arc, Barrier};

#[path = "common/host_heap.rs"]
mod host_heap;

use host_heap::HostHeap;
use toga_kernels::heap::stat;
use toga_kernels::pattern;

/// Fill `p` (a block of `size` bytes) with `tag`'s pattern.
fn fill(p: *mut u8, size: usize, tag: u64) {
    // SAFETY: a live block of `size` bytes, ours.
    unsafe { pattern::fill(p, size, tag, 0) };
}

/// Whether `p` still holds `tag`'s pattern.
fn intact(p: *mut u8, size: usize, tag: u64) -> bool {
    // SAFETY: a live block of `size` bytes, ours.
    unsafe { pattern::check(p, size, tag, 0) == 0 }
}

/// Sorts `blocks` (address, size) and panics if two overlap.
fn assert_disjoint(blocks: &mut [(usize, usize)]) {
    blocks.sort_unstable();
    for w in blocks.windows(2) {
        assert!(
            w[0].0 + w[0].1 <= w[1].0,
            "blocks {:#x}+{} and {:#x}+{} overlap",
            w[0].0,
            w[0].1,
            w[1].0,
            w[1].1
        );
    }
}

/// The sequence on a fresh heap, for one size: `q = malloc(size); free(q + size);
/// free(q)`, then `later` mallocs of that size, kept and pattern-checked. The stray free is
/// refused and counted as invalid, `q`'s free is a real one, and the later blocks (the slot
/// the stray free named among them, handed out once) are disjoint.
fn stray_free_of_the_next_slot(size: usize, later: usize) {
    let h = HostHeap::new(64 << 20, 2);
    let heap = h.heap();
    toga_kernels::platform::set_sm_id(0);
    let q = heap.malloc(size);
    assert!(!q.is_null());
    // SAFETY: deliberate misuse: the slot after `q`, which the run holds.
    unsafe { heap.free(q.wrapping_add(size)) };
    assert_eq!(h.stat(stat::INVALID_FREES), 1, "{size} B: the stray free");
    assert_eq!(h.stat(stat::DOUBLE_FREES), 0, "{size} B");
    assert_eq!(h.live_blocks(), 1, "{size} B: q alone is live");
    // SAFETY: q is live.
    unsafe { heap.free(q) };
    assert_eq!(h.live_blocks(), 0, "{size} B");
    assert_eq!(h.stat(stat::INVALID_FREES), 1, "{size} B");
    let mut blocks = Vec::with_capacity(later);
    for i in 0..later {
        let p = heap.malloc(size);
        assert!(!p.is_null(), "{size} B: malloc {i}");
        fill(p, size, i as u64);
        blocks.push(p);
    }
    let mut spans: Vec<(usize, usize)> = blocks.iter().map(|&p| (p as usize, size)).collect();
    assert_disjoint(&mut spans);
    for (i, &p) in blocks.iter().enumerate() {
        assert!(intact(p, size, i as u64), "{size} B: block {i} overwritten");
    }
    assert_eq!(h.live_blocks(), later as u64);
    for &p in &blocks {
        // SAFETY: live blocks, freed once.
        unsafe { heap.free(p) };
    }
    assert_eq!(h.live_blocks(), 0);
    assert_eq!(h.stat(stat::INVALID_FREES), 1);
    assert_eq!(h.stat(stat::DOUBLE_FREES), 0);
    heap.trim();
    heap.buddy().assert_valid();
    assert_eq!(heap.buddy().available_pages(), h.geometry.pages);
}

#[test]
fn a_stray_free_of_a_slot_the_run_holds_is_counted_and_refused() {
    with_deadline(|| {
        for size in [16, 32, 64, 128, 256, 1024, 2048] {
            stray_free_of_the_next_slot(size, 1 << 12);
        }
    });
}

/// Stray frees of every slot that a run holds ahead of its count, then threads that use the
/// run up and the next ones: every stray free is refused, and no block is handed out twice.
/// A trim in between gives the run's leftovers back; the same addresses freed after that
/// (bits clear) are counted as double frees.
#[test]
fn stray_frees_ahead_of_a_run_then_concurrent_mallocs_stay_disjoint() {
    with_deadline(|| {
        const THREADS: usize = 4;
        const PER: usize = 3000;
        for size in [16usize, 64, 256] {
            let h = Arc::new(HostHeap::new(64 << 20, 1));
            let heap = h.heap();
            toga_kernels::platform::set_sm_id(0);
            let q = heap.malloc(size);
            assert!(!q.is_null());
            // The run's next slots in q's bin (its body: 4 KB less the 128 B header): held,
            // never handed out.
            let in_body = (4096 - 128) / size;
            let strays: Vec<usize> = (1..in_body.min(101))
                .map(|i| q as usize + i * size)
                .collect();
            let n = strays.len() as u64;
            for &s in &strays {
                // SAFETY: deliberate misuse.
                unsafe { heap.free(s as *mut u8) };
            }
            assert_eq!(h.stat(stat::INVALID_FREES), n, "{size} B");
            assert_eq!(h.live_blocks(), 1, "{size} B");
            let start = Arc::new(Barrier::new(THREADS));
            let got: Vec<Vec<usize>> = (0..THREADS)
                .map(|t| {
                    let (h, start) = (h.clone(), start.clone());
                    std::thread::spawn(move || {
                        toga_kernels::platform::set_sm_id(0);
                        let heap = h.heap();
                        start.wait();
                        (0..PER)
                            .map(|i| {
                                let p = heap.malloc(size);
                                assert!(!p.is_null());
                                fill(p, size, (t * PER + i) as u64);
                                p as usize
                            })
                            .collect()
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|j| j.join().unwrap())
                .collect();
            let mut spans: Vec<(usize, usize)> = got
                .iter()
                .flatten()
                .map(|&p| (p, size))
                .chain([(q as usize, size)])
                .collect();
            assert_disjoint(&mut spans);
            for (t, blocks) in got.iter().enumerate() {
                for (i, &p) in blocks.iter().enumerate() {
                    assert!(intact(p as *mut u8, size, (t * PER + i) as u64));
                }
            }
            // Every stray slot was handed out once since (the threads used the run up).
            let handed: std::collections::HashSet<usize> = got.iter().flatten().copied().collect();
            assert!(strays.iter().all(|s| handed.contains(s)), "{size} B");
            assert_eq!(h.live_blocks(), (THREADS * PER + 1) as u64);
            for &p in got.iter().flatten().chain([&(q as usize)]) {
                // SAFETY: live blocks, freed once.
                unsafe { heap.free(p as *mut u8) };
            }
            // The run that held them is used up; the stray addresses are free slots of
            // carved bins now: double frees.
            for &s in &strays[..10] {
                // SAFETY: deliberate misuse.
                unsafe { heap.free(s as *mut u8) };
            }
            assert_eq!(h.live_blocks(), 0, "{size} B");
            assert_eq!(h.stat(stat::INVALID_FREES), n, "{size} B");
            assert_eq!(h.stat(stat::DOUBLE_FREES), 10, "{size} B");
            heap.trim();
            heap.buddy().assert_valid();
            assert_eq!(heap.buddy().available_pages(), h.geometry.pages);
        }
    });
}

/// Threads free stray slots of the run ahead of its count while others take from it, again
/// and again: each stray free either is refused (the run held the slot) or finds the slot
/// handed out. The stray addresses are only ever ones a taker will get, so a free that
/// succeeded would free a taker's block: the takers' patterns and the counts catch it.
#[test]
fn stray_frees_racing_takes_never_free_a_slot_twice() {
    with_deadline(|| {
        const ROUNDS: usize = 20;
        let size = 32usize;
        for round in 0..ROUNDS {
            // A fresh heap each round: q is its run's first item, the slots ahead of it in
            // its bin the run's next.
            let h = Arc::new(HostHeap::new(16 << 20, 1));
            let heap = h.heap();
            toga_kernels::platform::set_sm_id(0);
            let q = heap.malloc(size);
            assert!(!q.is_null());
            let invalid_before = h.stat(stat::INVALID_FREES);
            // The slots ahead of q in its bin and the next: the run's next items.
            let ahead: Vec<usize> = (1..64).map(|i| q as usize + i * size).collect();
            let start = Arc::new(Barrier::new(2));
            let taker = {
                let (h, start) = (h.clone(), start.clone());
                std::thread::spawn(move || {
                    toga_kernels::platform::set_sm_id(0);
                    let heap = h.heap();
                    start.wait();
                    (0..63)
                        .map(|i| {
                            let p = heap.malloc(size);
                            assert!(!p.is_null());
                            fill(p, size, i);
                            p as usize
                        })
                        .collect::<Vec<_>>()
                })
            };
            let straying = {
                let (h, start, ahead) = (h.clone(), start.clone(), ahead.clone());
                std::thread::spawn(move || {
                    toga_kernels::platform::set_sm_id(0);
                    let heap = h.heap();
                    start.wait();
                    // Backwards: the farthest slots first, so some are still held.
                    for &s in ahead.iter().rev() {
                        let invalid = h.stat(stat::INVALID_FREES);
                        // SAFETY: deliberate misuse, refused while the run holds the slot.
                        unsafe { heap.free(s as *mut u8) };
                        if h.stat(stat::INVALID_FREES) == invalid {
                            // The slot was handed out already: this free took a taker's
                            // block; stop here, the test counts what it did below.
                            return Some(s);
                        }
                    }
                    None
                })
            };
            let taken = taker.join().unwrap();
            let freed_live = straying.join().unwrap();
            let refused = h.stat(stat::INVALID_FREES) - invalid_before;
            let mut spans: Vec<(usize, usize)> = taken.iter().map(|&p| (p, size)).collect();
            spans.push((q as usize, size));
            assert_disjoint(&mut spans);
            for (i, &p) in taken.iter().enumerate() {
                if Some(p) != freed_live {
                    assert!(intact(p as *mut u8, size, i as u64), "round {round}");
                }
            }
            let expect_live = 64 - freed_live.is_some() as u64;
            assert_eq!(
                h.live_blocks(),
                expect_live,
                "round {round}: {refused} refused"
            );
            for &p in taken.iter().chain([&(q as usize)]) {
                if Some(p) != freed_live {
                    // SAFETY: live blocks, freed once.
                    unsafe { heap.free(p as *mut u8) };
                }
            }
            assert_eq!(h.live_blocks(), 0, "round {round}");
            assert_eq!(h.stat(stat::DOUBLE_FREES), 0, "round {round}");
            heap.trim();
            heap.buddy().assert_valid();
            assert_eq!(heap.buddy().available_pages(), h.geometry.pages);
        }
    });
}
