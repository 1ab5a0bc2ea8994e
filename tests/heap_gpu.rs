//! The allocator on a real GPU at 2^20 threads (ignored without `--include-ignored`): TBuddy, UAlloc, routing,
//! misuse, streams, statistics, `Vec` in kernels.

mod common;

use cudarc::driver::PushKernelArg;
use toga::{Heap, launch_config};
use toga_harness::{Workloads, block_bytes, uniform_sizes};
use toga_kernels::ualloc::MAX_SMALL_SIZE;

const THREADS: u64 = 1 << 20;

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn device_and_host_agree_on_the_layout() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let mut out = stream.alloc_zeros::<u64>(4).unwrap();
    let f = gpu.function("toga_layout").unwrap();
    // SAFETY: four words.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&mut out)
            .launch(launch_config(1))
            .unwrap()
    };
    let out = stream.clone_dtoh(&out).unwrap();
    let host = [
        size_of::<toga_kernels::heap::HeapHeader>(),
        size_of::<toga_kernels::heap::StatsShard>(),
        size_of::<toga_kernels::ualloc::Arena>(),
        size_of::<toga_kernels::heap::Geometry>(),
    ]
    .map(|s| s as u64);
    assert_eq!(out, host);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn tbuddy_random_orders_fill_check_free_on_another_stream() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    // 4 KiB – 1 MiB blocks for 2^20 threads need far more than 1 GiB: some requests fail.
    // Every size but 4 KiB is a TBuddy block.
    let heap = Heap::new(&gpu, &stream, 1 << 30).unwrap();
    let w = Workloads::new(&gpu).unwrap();
    let orders = uniform_sizes(THREADS, 0, 8, 42);
    let sizes: Vec<u32> = orders.iter().map(|&o| 4096u32 << o).collect();
    let d_sizes = stream.clone_htod(&sizes).unwrap();
    let mut ptrs = stream.alloc_zeros::<u64>(THREADS as usize).unwrap();
    w.alloc_fill(&stream, &heap, &mut ptrs, &d_sizes, 3)
        .unwrap();
    let host_ptrs = stream.clone_dtoh(&ptrs).unwrap();
    let ok: Vec<usize> = (0..THREADS as usize)
        .filter(|&i| host_ptrs[i] != 0)
        .collect();
    let bytes: u64 = ok.iter().map(|&i| sizes[i] as u64).sum();
    assert!(
        !ok.is_empty() && ok.len() < THREADS as usize,
        "the heap should serve some, not all"
    );
    assert!(
        bytes <= heap.capacity(),
        "{bytes} bytes handed out from {}",
        heap.capacity()
    );
    // Blocks are inside the heap, TBuddy's aligned to their size (4 KiB blocks come from
    // UAlloc's largest class and are aligned to 128 B), and disjoint.
    let data = heap.base() + heap.geometry().data_offset;
    let mut spans: Vec<(u64, u64)> = ok
        .iter()
        .map(|&i| (host_ptrs[i], sizes[i] as u64))
        .collect();
    spans.sort();
    for (p, len) in &spans {
        assert!(*p >= data && p + len <= data + heap.capacity());
        let align = if *len as usize > MAX_SMALL_SIZE {
            *len
        } else {
            128
        };
        assert_eq!(
            (p - data) % align,
            0,
            "block at {p:#x} not aligned to {align}"
        );
    }
    for pair in spans.windows(2) {
        assert!(
            pair[0].0 + pair[0].1 <= pair[1].0,
            "overlap at {:#x}",
            pair[1].0
        );
    }
    // Free on a different stream, ordered after the allocation by an event.
    let other = gpu.new_stream().unwrap();
    other.wait(&stream.record_event(None).unwrap()).unwrap();
    let mut errors = other.alloc_zeros::<u64>(2).unwrap();
    w.check_free(&other, &heap, &ptrs, &d_sizes, 3, true, &mut errors)
        .unwrap();
    assert_eq!(
        other.clone_dtoh(&errors).unwrap()[0],
        0,
        "corrupted patterns"
    );
    stream.wait(&other.record_event(None).unwrap()).unwrap();
    // Empty bins stay with their class until a trim (docs/ualloc.md).
    heap.trim(&stream).unwrap();
    let probe = w.probe(&stream, &heap).unwrap();
    assert_eq!(
        probe.free_bytes,
        heap.capacity(),
        "every page is free again"
    );
    assert!(probe.whole_heap_block, "the root is Available again");
    let s = heap.stats(&stream).unwrap();
    assert_eq!((s.live_blocks(), s.used_bytes, s.reserved_bytes), (0, 0, 0));
    assert_eq!(s.mallocs, ok.len() as u64);
    assert_eq!(s.failed_allocations, THREADS - ok.len() as u64);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn exactly_k_large_blocks_fit_and_the_rest_fail() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let capacity = 64u64 << 20;
    let heap = Heap::new(&gpu, &stream, capacity).unwrap();
    let w = Workloads::new(&gpu).unwrap();
    // The smallest size that surely goes to TBuddy.
    let size = (MAX_SMALL_SIZE as u32 + 1).next_power_of_two().max(4096);
    let k = capacity / size as u64;
    let d_sizes = stream.clone_htod(&vec![size; 2 * k as usize]).unwrap();
    for round in 0..2 {
        let mut ptrs = stream.alloc_zeros::<u64>(2 * k as usize).unwrap();
        w.alloc_fill(&stream, &heap, &mut ptrs, &d_sizes, round)
            .unwrap();
        let got = stream
            .clone_dtoh(&ptrs)
            .unwrap()
            .iter()
            .filter(|&&p| p != 0)
            .count() as u64;
        assert_eq!(got, k, "round {round}: {k} blocks of {size} B fit");
        let mut errors = stream.alloc_zeros::<u64>(2).unwrap();
        w.check_free(&stream, &heap, &ptrs, &d_sizes, round, true, &mut errors)
            .unwrap();
        assert_eq!(stream.clone_dtoh(&errors).unwrap()[0], 0);
    }
    // Empty bins stay with their class until a trim (docs/ualloc.md).
    heap.trim(&stream).unwrap();
    assert_eq!(w.probe(&stream, &heap).unwrap().free_bytes, capacity);
}

/// A heap has one arena per SM id (`%nsmid`), and fewer are refused: an arena's semaphores
/// are sized for the threads of one SM (INV(SEM2)).
#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn a_heap_has_one_arena_per_sm_id() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let info = gpu.info().clone();
    eprintln!("SMs {}, SM-id bound {}", info.sm_count, info.sm_id_bound);
    assert!(info.sm_id_bound >= info.sm_count);
    let heap = Heap::new(&gpu, &stream, 64 << 20).unwrap();
    assert_eq!(heap.geometry().arenas, info.sm_id_bound as u64);
    let few = Heap::builder(64 << 20)
        .arenas(info.sm_id_bound - 1)
        .create(&gpu, &stream);
    assert!(
        matches!(few, Err(toga::Error::TooFewArenas { .. })),
        "fewer arenas than SM ids must be refused"
    );
    let more = Heap::builder(64 << 20)
        .arenas(info.sm_id_bound + 3)
        .create(&gpu, &stream)
        .unwrap();
    assert_eq!(more.geometry().arenas, info.sm_id_bound as u64 + 3);
}

/// One SM holds more free 16 B slots than a 24-bit count can (issue 13, item 3). A single block
/// of 1024 threads (so one SM, one arena) allocates 2^23 + 2^18 blocks of 16 B, checks and frees
/// them, and must then get them all again; after a trim the heap is one whole block again.
/// With the arena semaphores' old 24-bit count, C wrapped below zero after the frees: the
/// second round found no units, and no trim could take an empty bin back.
#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn one_sm_frees_more_slots_than_a_24_bit_count_holds() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let heap = Heap::new(&gpu, &stream, 256 << 20).unwrap();
    let n = (1usize << 23) + (1 << 18);
    let d_sizes = stream.clone_htod(&vec![16u32; n]).unwrap();
    let one_block = cudarc::driver::LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1024, 1, 1),
        shared_mem_bytes: 0,
    };
    let w = Workloads::new(&gpu).unwrap().on_grid(one_block);
    for round in 0..2 {
        let mut ptrs = stream.alloc_zeros::<u64>(n).unwrap();
        w.alloc_fill(&stream, &heap, &mut ptrs, &d_sizes, round)
            .unwrap();
        let mut host = stream.clone_dtoh(&ptrs).unwrap();
        let got = host.iter().filter(|&&p| p != 0).count();
        assert_eq!(got, n, "round {round}: every 16 B request served on one SM");
        host.sort_unstable();
        host.dedup();
        assert_eq!(host.len(), n, "round {round}: a block was handed out twice");
        let mut errors = stream.alloc_zeros::<u64>(2).unwrap();
        w.check_free(&stream, &heap, &ptrs, &d_sizes, round, true, &mut errors)
            .unwrap();
        assert_eq!(
            stream.clone_dtoh(&errors).unwrap()[0],
            0,
            "corrupted patterns"
        );
        let s = heap.stats(&stream).unwrap();
        assert_eq!(s.live_blocks(), 0, "{s:?}");
        assert_eq!(
            (s.frees, s.double_frees, s.invalid_frees),
            ((round as u64 + 1) * n as u64, 0, 0)
        );
    }
    heap.trim(&stream).unwrap();
    let probe = w.probe(&stream, &heap).unwrap();
    assert_eq!(probe.free_bytes, heap.capacity());
    assert!(probe.whole_heap_block);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn mixed_sizes_8b_to_64k_across_streams_and_back_to_empty() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let heap = Heap::new(&gpu, &stream, 2 << 30).unwrap();
    let w = Workloads::new(&gpu).unwrap();
    let sizes = uniform_sizes(THREADS, 8, 65536, 7);
    let d_sizes = stream.clone_htod(&sizes).unwrap();
    let mut ptrs = stream.alloc_zeros::<u64>(THREADS as usize).unwrap();
    w.alloc_fill(&stream, &heap, &mut ptrs, &d_sizes, 9)
        .unwrap();
    let host_ptrs = stream.clone_dtoh(&ptrs).unwrap();
    let got = host_ptrs.iter().filter(|&&p| p != 0).count() as u64;
    let s = heap.stats(&stream).unwrap();
    assert_eq!(s.mallocs, got);
    assert_eq!(s.live_blocks(), got);
    let expected_used: u64 = (0..THREADS as usize)
        .filter(|&i| host_ptrs[i] != 0)
        .map(|i| block_bytes(sizes[i]))
        .sum();
    assert_eq!(
        s.used_bytes, expected_used,
        "used bytes = the blocks handed out"
    );
    assert!(s.used_bytes <= heap.capacity());
    let other = gpu.new_stream().unwrap();
    other.wait(&stream.record_event(None).unwrap()).unwrap();
    let mut errors = other.alloc_zeros::<u64>(2).unwrap();
    w.check_free(&other, &heap, &ptrs, &d_sizes, 9, true, &mut errors)
        .unwrap();
    assert_eq!(
        other.clone_dtoh(&errors).unwrap()[0],
        0,
        "corrupted patterns"
    );
    stream.wait(&other.record_event(None).unwrap()).unwrap();
    let s = heap.stats(&stream).unwrap();
    assert_eq!((s.live_blocks(), s.used_bytes), (0, 0), "{s:?}");
    // INV(HP3): the high-water mark is kept in steps of the heap's quantum per SM.
    let slack = heap.geometry().arenas << heap.geometry().used_quantum_shift();
    assert!(
        s.used_high <= expected_used && s.used_high + slack >= expected_used,
        "high water {} for {expected_used} B used",
        s.used_high
    );
    // Empty bins stay with their class until a trim (docs/ualloc.md): the chunks of the small
    // blocks are reserved until then. (Until 2026-11-25 this fill served no small request at
    // all, so `reserved_bytes` was 0 here already.)
    heap.trim(&stream).unwrap();
    assert_eq!(heap.stats(&stream).unwrap().reserved_bytes, 0);
    let probe = w.probe(&stream, &heap).unwrap();
    assert_eq!(probe.free_bytes, heap.capacity());
    assert!(probe.whole_heap_block);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn two_streams_churn_concurrently_on_one_heap() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let heap = Heap::new(&gpu, &stream, 1 << 30).unwrap();
    let w = Workloads::new(&gpu).unwrap();
    let ready = stream.record_event(None).unwrap();
    let a = gpu.new_stream().unwrap();
    let b = gpu.new_stream().unwrap();
    a.wait(&ready).unwrap();
    b.wait(&ready).unwrap();
    let mut ea = a.alloc_zeros::<u64>(2).unwrap();
    let mut eb = b.alloc_zeros::<u64>(2).unwrap();
    let n = THREADS / 2;
    w.churn(&a, &heap, n, 32, 1, (8, 4096), &mut ea).unwrap();
    w.churn(&b, &heap, n, 32, 2, (8, 65536), &mut eb).unwrap();
    let (ra, rb) = (a.clone_dtoh(&ea).unwrap(), b.clone_dtoh(&eb).unwrap());
    assert_eq!((ra[0], rb[0]), (0, 0), "corrupted patterns");
    stream.wait(&a.record_event(None).unwrap()).unwrap();
    stream.wait(&b.record_event(None).unwrap()).unwrap();
    let s = heap.stats(&stream).unwrap();
    assert_eq!((s.live_blocks(), s.used_bytes), (0, 0), "{s:?}");
    assert_eq!(s.mallocs, s.frees);
    assert_eq!(s.failed_allocations, ra[1] + rb[1]);
    // Empty bins stay with their class until a trim (docs/ualloc.md).
    heap.trim(&stream).unwrap();
    assert_eq!(w.probe(&stream, &heap).unwrap().free_bytes, heap.capacity());
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn double_and_foreign_frees_are_counted_and_harmless() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    // 2^15 blocks of 8 KiB fill 256 MiB; the 48 B blocks need chunks of their own.
    let heap = Heap::new(&gpu, &stream, 512 << 20).unwrap();
    let w = Workloads::new(&gpu).unwrap();
    let n = 1 << 16;
    let sizes: Vec<u32> = (0..n).map(|i| if i % 2 == 0 { 48 } else { 8192 }).collect();
    let d_sizes = stream.clone_htod(&sizes).unwrap();
    let mut ptrs = stream.alloc_zeros::<u64>(n).unwrap();
    w.alloc_fill(&stream, &heap, &mut ptrs, &d_sizes, 5)
        .unwrap();
    let host_ptrs = stream.clone_dtoh(&ptrs).unwrap();
    assert!(host_ptrs.iter().all(|&p| p != 0));
    // Half of the blocks, of both sizes (pairs 0-1, 4-5, ...), are freed and then freed again;
    // the other half stay live next to them, and to the foreign frees below. A null entry is
    // skipped by the kernels (free(null) is no free at all).
    let freed_here = |i: usize| (i / 2).is_multiple_of(2);
    let pick = |keep: bool| -> Vec<u64> {
        (0..n)
            .map(|i| {
                if freed_here(i) == keep {
                    host_ptrs[i]
                } else {
                    0
                }
            })
            .collect()
    };
    let (freed, live) = (pick(true), pick(false));
    let n_freed = freed.iter().filter(|&&p| p != 0).count() as u64;
    let d_freed = stream.clone_htod(&freed).unwrap();
    w.free(&stream, Some(&heap), &d_freed).unwrap();
    let before = heap.stats(&stream).unwrap();
    assert_eq!(
        (before.double_frees, before.invalid_frees),
        (0, 0),
        "{before:?}"
    );
    assert_eq!(before.live_blocks(), n as u64 - n_freed, "{before:?}");
    // The second free of each freed block: a double free, every one (nothing was allocated
    // since, so every slot's bit and every large block's table entry is still clear).
    w.free(&stream, Some(&heap), &d_freed).unwrap();
    let doubles = heap.stats(&stream).unwrap();
    assert_eq!(
        (doubles.double_frees, doubles.invalid_frees),
        (n_freed, 0),
        "{doubles:?}"
    );
    // Foreign pointers: outside the heap, inside the metadata, inside a live block of each
    // size, past the data region; and null (not counted).
    let data = heap.base() + heap.geometry().data_offset;
    let foreign = [
        0x1000u64,
        data - 64,
        host_ptrs[2] + 8,
        host_ptrs[3] + 4096,
        data + heap.capacity(),
        0,
    ];
    assert!(
        !freed_here(2) && !freed_here(3),
        "the interior pointers are into live blocks"
    );
    let invalid = foreign.iter().filter(|&&p| p != 0).count() as u64;
    w.free(&stream, Some(&heap), &stream.clone_htod(&foreign).unwrap())
        .unwrap();
    let s = heap.stats(&stream).unwrap();
    assert_eq!(
        (s.double_frees, s.invalid_frees),
        (n_freed, invalid),
        "each bad free counted once, in its own category: {s:?}"
    );
    assert_eq!(
        s.live_blocks(),
        n as u64 - n_freed,
        "bad frees freed nothing: {s:?}"
    );
    // The live blocks still hold their patterns (no bad free touched them), and free cleanly.
    let d_live = stream.clone_htod(&live).unwrap();
    let mut errors = stream.alloc_zeros::<u64>(2).unwrap();
    w.check_free(&stream, &heap, &d_live, &d_sizes, 5, true, &mut errors)
        .unwrap();
    assert_eq!(
        stream.clone_dtoh(&errors).unwrap()[0],
        0,
        "a live block's pattern changed"
    );
    let s = heap.stats(&stream).unwrap();
    assert_eq!((s.live_blocks(), s.used_bytes), (0, 0), "{s:?}");
    assert_eq!((s.double_frees, s.invalid_frees), (n_freed, invalid));
    // The heap still works, completely.
    w.alloc_fill(&stream, &heap, &mut ptrs, &d_sizes, 6)
        .unwrap();
    let mut errors = stream.alloc_zeros::<u64>(2).unwrap();
    w.check_free(&stream, &heap, &ptrs, &d_sizes, 6, true, &mut errors)
        .unwrap();
    assert_eq!(stream.clone_dtoh(&errors).unwrap()[0], 0);
    // Empty bins stay with their class until a trim (docs/ualloc.md).
    heap.trim(&stream).unwrap();
    assert_eq!(w.probe(&stream, &heap).unwrap().free_bytes, heap.capacity());
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn vec_grows_in_every_thread() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let heap = Heap::new(&gpu, &stream, 1 << 30).unwrap();
    let w = Workloads::new(&gpu).unwrap();
    let len = 100u32;
    let mut out = stream.alloc_zeros::<u64>(THREADS as usize).unwrap();
    w.vec_push(&stream, &mut out, len).unwrap();
    let out = stream.clone_dtoh(&out).unwrap();
    for (i, &sum) in out.iter().enumerate() {
        let expect: u64 = (0..len as u64).map(|k| i as u64 * 1000 + k).sum();
        assert_eq!(sum, expect, "thread {i}");
    }
    let s = heap.stats(&stream).unwrap();
    assert_eq!((s.live_blocks(), s.used_bytes), (0, 0));
    assert!(s.mallocs >= THREADS);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn zero_and_oversized_requests_return_null() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let heap = Heap::new(&gpu, &stream, 64 << 20).unwrap();
    let w = Workloads::new(&gpu).unwrap();
    let d_sizes = stream
        .clone_htod(&[0u32, (128 << 20) + 1, u32::MAX])
        .unwrap();
    let mut ptrs = stream.alloc_zeros::<u64>(3).unwrap();
    w.alloc_fill(&stream, &heap, &mut ptrs, &d_sizes, 0)
        .unwrap();
    assert_eq!(stream.clone_dtoh(&ptrs).unwrap(), [0, 0, 0]);
    let s = heap.stats(&stream).unwrap();
    assert_eq!(
        s.failed_allocations, 2,
        "malloc(0) is not a failure; the two oversized are"
    );
}

/// A warp's large blocks freed together merge without the pair lock (`TBuddy::free_together`,
/// INV(TB12)): per warp, lanes of three orders (512 KiB, 1 and 2 MiB: above the stashes'
/// orders) allocate together and free together, by their own warp and then in reverse thread
/// order (each warp frees another warp's blocks). After every free, with no trim, every page
/// is free, a whole-heap block can be taken, and the heap's counters are back to zero; a lost
/// merge or a block freed twice by a merge fails here.
#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn a_warps_large_blocks_freed_together_merge_back_to_the_root() {
    // 512 KiB, 1, 2 MiB by lane: 3.5 MiB per three threads; half the heap asked for.
    let sizes = |i| (512u32 << 10) << (i % 3);
    large_blocks_freed_together_merge_back(1 << 30, 7 << 19, 3, sizes, false);
}

/// As above with 8 KiB in every lane, the free of `f_large`, whose group's one subtraction
/// of the reserved bytes the counters check here too. The freed blocks wait in the 8 KiB
/// stash (INV(HP6)), in reverse thread order too: every page but theirs is free. A trim then
/// gives them back, they merge to the root, and the whole heap is one free block again.
#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn a_warps_8kib_blocks_freed_together_merge_back_to_the_root() {
    large_blocks_freed_together_merge_back(256 << 20, 8 << 10, 1, |_| 8192, true);
}

/// Half of a heap of `capacity` bytes in blocks of `size(i)` for thread `i` (`per` threads
/// ask for `bytes_per` bytes in all), allocated and freed by warps in four rounds, the odd
/// ones in reverse thread order; every page comes back, without a trim unless `stashed`
/// (then every page but the freed blocks' is free before it).
fn large_blocks_freed_together_merge_back(
    capacity: u64,
    bytes_per: u64,
    per: u64,
    size: impl Fn(usize) -> u32,
    stashed: bool,
) {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let heap = Heap::new(&gpu, &stream, capacity).unwrap();
    let w = Workloads::new(&gpu).unwrap();
    let n = (capacity / 2 / bytes_per * per) as usize;
    let sizes: Vec<u32> = (0..n).map(size).collect();
    let asked: u64 = sizes.iter().map(|&s| s as u64).sum();
    let d_sizes = stream.clone_htod(&sizes).unwrap();
    for round in 0..4u32 {
        let reverse = round % 2 == 1;
        let mut ptrs = stream.alloc_zeros::<u64>(n).unwrap();
        w.alloc_fill(&stream, &heap, &mut ptrs, &d_sizes, round)
            .unwrap();
        let mut host_ptrs = stream.clone_dtoh(&ptrs).unwrap();
        assert!(
            host_ptrs.iter().all(|&p| p != 0),
            "round {round}: every block of half the heap is served"
        );
        assert_eq!(
            heap.stats(&stream).unwrap().used_bytes,
            asked,
            "round {round}"
        );
        let mut errors = stream.alloc_zeros::<u64>(2).unwrap();
        w.check_free(&stream, &heap, &ptrs, &d_sizes, round, false, &mut errors)
            .unwrap();
        assert_eq!(
            stream.clone_dtoh(&errors).unwrap()[0],
            0,
            "round {round}: patterns"
        );
        if reverse {
            host_ptrs.reverse();
            ptrs = stream.clone_htod(&host_ptrs).unwrap();
        }
        w.free(&stream, Some(&heap), &ptrs).unwrap();
        let mut probe = w.probe(&stream, &heap).unwrap();
        if stashed {
            assert_eq!(
                probe.free_bytes,
                capacity - asked,
                "round {round} (reverse: {reverse}): the freed blocks wait in their stash"
            );
            heap.trim(&stream).unwrap();
            probe = w.probe(&stream, &heap).unwrap();
        }
        assert_eq!(
            probe.free_bytes, capacity,
            "round {round} (reverse: {reverse}): every page is free (stashed: {stashed})"
        );
        assert!(
            probe.whole_heap_block,
            "round {round}: the root is Available"
        );
        let s = heap.stats(&stream).unwrap();
        assert_eq!(
            (s.live_blocks(), s.used_bytes, s.reserved_bytes),
            (0, 0, 0),
            "round {round}"
        );
        assert_eq!((s.double_frees, s.invalid_frees), (0, 0), "round {round}");
    }
}

/// Freed 8 KiB blocks wait in their stash (INV(HP6)) until a trim: three quarters of a 256 MiB
/// heap in 8 KiB blocks are allocated and freed, then 2,048 threads ask for 64 KiB each (half
/// the heap, not a stashed order's 8 KiB). The tree holds a quarter: most requests find it
/// short, trim, and the threads that trim give the stashed blocks back side by side, where
/// they merge. Every request must be served and pattern-checked, twice (the second round's
/// 64 KiB blocks wait in their own stash in between), and then the whole heap is one block.
#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn stashed_blocks_serve_other_sizes_after_a_shared_trim() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let capacity = 256u64 << 20;
    let heap = Heap::new(&gpu, &stream, capacity).unwrap();
    let w = Workloads::new(&gpu).unwrap();
    let phases: [(u32, u64); 2] = [(8 << 10, capacity / 4 * 3), (64 << 10, capacity / 2)];
    for round in 0..2u32 {
        for (phase, &(size, bytes)) in phases.iter().enumerate() {
            let tag = round * 2 + phase as u32;
            let n = (bytes / size as u64) as usize;
            let d_sizes = stream.clone_htod(&vec![size; n]).unwrap();
            let mut ptrs = stream.alloc_zeros::<u64>(n).unwrap();
            w.alloc_fill(&stream, &heap, &mut ptrs, &d_sizes, tag)
                .unwrap();
            let host_ptrs = stream.clone_dtoh(&ptrs).unwrap();
            let served = host_ptrs.iter().filter(|&&p| p != 0).count();
            assert_eq!(
                served, n,
                "round {round}: {served} of {n} blocks of {size} B"
            );
            let mut errors = stream.alloc_zeros::<u64>(2).unwrap();
            w.check_free(&stream, &heap, &ptrs, &d_sizes, tag, false, &mut errors)
                .unwrap();
            assert_eq!(
                stream.clone_dtoh(&errors).unwrap()[0],
                0,
                "round {round}: patterns"
            );
            w.free(&stream, Some(&heap), &ptrs).unwrap();
        }
    }
    heap.trim(&stream).unwrap();
    let probe = w.probe(&stream, &heap).unwrap();
    assert_eq!(
        probe.free_bytes, capacity,
        "every page is back after a trim"
    );
    assert!(probe.whole_heap_block, "the root is Available");
    let s = heap.stats(&stream).unwrap();
    assert_eq!((s.live_blocks(), s.used_bytes, s.reserved_bytes), (0, 0, 0));
    assert_eq!(
        (s.double_frees, s.invalid_frees, s.failed_allocations),
        (0, 0, 0)
    );
}

/// One lane per warp asks for 4–16 KiB, the others for nothing: 32,768 lone lanes on every SM
/// at once take their blocks from their SMs' runs (`tbuddy::run`), stocking them as they run
/// out. Every block is pattern-checked and freed on another stream; a trim then gives back
/// what the runs hold, and the whole heap is one free block again.
#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn lone_lanes_large_blocks_come_from_runs_and_go_back() {
    lone_lanes_come_from_runs_and_go_back(MAX_SMALL_SIZE as u32 + 1, 16 << 10, 11);
}

/// As above for 1 B – 4 KiB: the lone lanes take their slots from their SMs' runs of slots
/// (`ualloc::run`), one bin per SM and class, and a trim frees what the runs hold.
#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn lone_lanes_small_blocks_come_from_runs_and_go_back() {
    lone_lanes_come_from_runs_and_go_back(1, MAX_SMALL_SIZE as u32, 12);
}

/// One lane per warp asks for `lo..=hi` bytes, the others for nothing, three rounds; see the
/// tests above.
fn lone_lanes_come_from_runs_and_go_back(lo: u32, hi: u32, seed: u64) {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let capacity = 1u64 << 30;
    let heap = Heap::new(&gpu, &stream, capacity).unwrap();
    let w = Workloads::new(&gpu).unwrap();
    let asks = uniform_sizes(THREADS, lo, hi, seed);
    let sizes: Vec<u32> = (0..THREADS as usize)
        .map(|i| if i % 32 == 0 { asks[i] } else { 0 })
        .collect();
    let lone = THREADS / 32;
    let asked: u64 = sizes
        .iter()
        .filter(|&&s| s > 0)
        .map(|&s| block_bytes(s))
        .sum();
    let d_sizes = stream.clone_htod(&sizes).unwrap();
    for round in 0..3u32 {
        let mut ptrs = stream.alloc_zeros::<u64>(THREADS as usize).unwrap();
        w.alloc_fill(&stream, &heap, &mut ptrs, &d_sizes, round)
            .unwrap();
        let host_ptrs = stream.clone_dtoh(&ptrs).unwrap();
        let served = host_ptrs.iter().filter(|&&p| p != 0).count() as u64;
        assert_eq!(served, lone, "round {round}: every lone lane is served");
        let s = heap.stats(&stream).unwrap();
        assert_eq!(
            (s.live_blocks(), s.used_bytes),
            (lone, asked),
            "round {round}"
        );
        let other = gpu.new_stream().unwrap();
        other.wait(&stream.record_event(None).unwrap()).unwrap();
        let mut errors = other.alloc_zeros::<u64>(2).unwrap();
        w.check_free(&other, &heap, &ptrs, &d_sizes, round, true, &mut errors)
            .unwrap();
        assert_eq!(
            other.clone_dtoh(&errors).unwrap()[0],
            0,
            "round {round}: corrupted patterns"
        );
        stream.wait(&other.record_event(None).unwrap()).unwrap();
        let s = heap.stats(&stream).unwrap();
        assert_eq!((s.live_blocks(), s.used_bytes), (0, 0), "round {round}");
        assert_eq!((s.double_frees, s.invalid_frees), (0, 0), "round {round}");
    }
    heap.trim(&stream).unwrap();
    assert_eq!(heap.stats(&stream).unwrap().reserved_bytes, 0);
    let probe = w.probe(&stream, &heap).unwrap();
    assert_eq!(probe.free_bytes, capacity);
    assert!(probe.whole_heap_block);
}
