//! toga's device API in kernels launched the way users launch theirs: blocks of 1024 threads,
//! CUDA's largest, which leave a thread at most 64 registers (`tests/ptxas.rs` checks the counts
//! without a GPU). The kernels are `kernels/src/entry/fit.rs`; each test runs 2^22 threads over a
//! heap that holds about half of what they ask for, and checks that
//! - the kernel launches at all (one over the register budget fails with
//!   `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`),
//! - every block handed out is inside the heap, apart from every other live block, and keeps
//!   its pattern until it is freed,
//! - the statistics count exactly the blocks handed out, and out of memory is a null,
//! - once everything is freed and the heap trimmed, the whole data region is one free block.
//!
//! Skipped without a GPU.

mod common;

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};
use toga::{Gpu, Heap};
use toga_harness::{Workloads, uniform_sizes};
use toga_kernels::heap::MIN_HEAP_BYTES;

/// Threads per test.
const THREADS: u64 = 1 << 22;
/// The block size users launch: CUDA's largest.
const BLOCK_THREADS: u32 = 1024;
/// Lanes in a warp.
const WARP_SIZE: u64 = 32;
/// A heap for half the requests gets this much more, in percent, for the metadata and the
/// partly used bins of each SM's arena.
const HEADROOM_PERCENT: u64 = 110;
/// Words of the kernels' `errors` argument, and what each counts (as in `fit.rs`).
const ERROR_WORDS: usize = 2;
const PATTERN_ERRORS: usize = 0;
const OTHER_ERRORS: usize = 1;
/// The alignments `toga_fit_aligned` asks for, thread `i` taking `ALIGNS[i % 4]`.
const ALIGNS: [u32; 4] = [16, 64, 256, 4096];
/// `toga_fit_vec`'s result for a thread whose `Vec` could not grow.
const VEC_FAILED: u64 = u64::MAX;
/// `toga_fit_vec`'s elements carry their thread's id above this bit, their index below.
const VEC_OWNER_SHIFT: u32 = 32;

/// A 1-D launch of `threads` threads in [`BLOCK_THREADS`]-thread blocks.
fn user_config(threads: u64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (threads.div_ceil(BLOCK_THREADS as u64) as u32, 1, 1),
        block_dim: (BLOCK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Kernel `name` of toga's module, after checking that the driver lets it run
/// [`BLOCK_THREADS`]-thread blocks.
fn user_kernel(gpu: &Gpu, name: &str) -> CudaFunction {
    let f = gpu.function(name).unwrap();
    let max = f.max_threads_per_block().unwrap();
    assert!(
        max >= BLOCK_THREADS as i32,
        "{name} runs at most {max} threads per block, not {BLOCK_THREADS}: it needs {} registers \
         per thread, so a launch in {BLOCK_THREADS}-thread blocks fails with \
         CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
        f.num_regs().unwrap()
    );
    f
}

/// The result of launching `name`, which must have worked.
fn launched<T>(name: &str, r: Result<T, DriverError>) -> T {
    r.unwrap_or_else(|e| panic!("launching {name} in {BLOCK_THREADS}-thread blocks: {e}"))
}

/// The data bytes of a heap that holds about half of `requested` bytes (at least the smallest
/// heap), rounded down to a power of two so that the whole data region is one buddy block.
fn half_heap(requested: u64) -> u64 {
    let bytes = (requested / 2 * HEADROOM_PERCENT / 100).max(MIN_HEAP_BYTES);
    1 << bytes.ilog2()
}

/// The non-null blocks of `ptrs` (block `i` has `size(i)` bytes): each inside the heap's data
/// region, no two overlapping. Returns how many there are.
fn check_live_blocks(heap: &Heap, ptrs: &[u64], size: impl Fn(usize) -> u64) -> u64 {
    let data = heap.base() + heap.geometry().data_offset;
    let mut spans: Vec<(u64, u64)> = (0..ptrs.len())
        .filter(|&i| ptrs[i] != 0)
        .map(|i| (ptrs[i], size(i)))
        .collect();
    spans.sort_unstable();
    for &(p, len) in &spans {
        assert!(
            p >= data && p + len <= data + heap.capacity(),
            "block {p:#x} of {len} B outside the data region"
        );
    }
    for pair in spans.windows(2) {
        let ((p, len), (q, _)) = (pair[0], pair[1]);
        assert!(p + len <= q, "blocks {p:#x} ({len} B) and {q:#x} overlap");
    }
    spans.len() as u64
}

/// Neither a corrupted pattern nor anything else wrong in a kernel's `errors`.
fn check_no_errors(stream: &Arc<CudaStream>, errors: &CudaSlice<u64>) {
    let e = stream.clone_dtoh(errors).unwrap();
    assert_eq!(e[PATTERN_ERRORS], 0, "pattern words or bytes found wrong");
    assert_eq!(e[OTHER_ERRORS], 0, "other errors (a misaligned block)");
}

/// Nothing is live, and after a trim every page is free and the whole data region can be taken
/// as one block.
fn check_all_memory_back(gpu: &Gpu, heap: &Heap) {
    let stream = gpu.default_stream();
    let s = heap.stats(&stream).unwrap();
    assert_eq!((s.live_blocks(), s.used_bytes), (0, 0), "{s:?}");
    assert_eq!(s.mallocs, s.frees, "{s:?}");
    heap.trim(&stream).unwrap();
    let s = heap.stats(&stream).unwrap();
    assert_eq!(s.reserved_bytes, 0, "trimmed, nothing is reserved: {s:?}");
    let probe = Workloads::new(gpu).unwrap().probe(&stream, heap).unwrap();
    assert_eq!(probe.free_bytes, heap.capacity(), "every page is free");
    assert!(probe.whole_heap_block, "the whole data region is one block");
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn malloc_fill_check_free_in_1024_thread_blocks() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let size = 64u32;
    let heap = Heap::new(&gpu, &stream, half_heap(THREADS * size as u64)).unwrap();
    let name = "toga_fit_malloc_free";
    let f = user_kernel(&gpu, name);
    let mut ptrs = stream.alloc_zeros::<u64>(THREADS as usize).unwrap();
    let mut errors = stream.alloc_zeros::<u64>(ERROR_WORDS).unwrap();
    let tag = 1u32;
    let run = |ptrs: &mut CudaSlice<u64>, errors: &mut CudaSlice<u64>, free: bool| {
        let free = free as u32;
        // SAFETY: `ptrs` has THREADS elements, zeroed or as the allocating launch left them;
        // `errors` has two words.
        launched(name, unsafe {
            stream
                .launch_builder(&f)
                .arg(&heap.base())
                .arg(ptrs)
                .arg(&THREADS)
                .arg(&size)
                .arg(&tag)
                .arg(&free)
                .arg(errors)
                .launch(user_config(THREADS))
        });
    };
    run(&mut ptrs, &mut errors, false);
    let host_ptrs = stream.clone_dtoh(&ptrs).unwrap();
    let got = check_live_blocks(&heap, &host_ptrs, |_| size as u64);
    assert!(
        got > 0 && got < THREADS,
        "{got} of {THREADS}: the heap holds about half"
    );
    let s = heap.stats(&stream).unwrap();
    assert_eq!(s.mallocs, got, "{s:?}");
    assert_eq!(
        s.failed_allocations,
        THREADS - got,
        "every null is out of memory"
    );
    assert_eq!(s.live_blocks(), got, "{s:?}");
    assert_eq!(
        s.used_bytes,
        got * size as u64,
        "64 B is a size class: {s:?}"
    );
    run(&mut ptrs, &mut errors, true);
    check_no_errors(&stream, &errors);
    assert!(stream.clone_dtoh(&ptrs).unwrap().iter().all(|&p| p == 0));
    assert_eq!(heap.stats(&stream).unwrap().frees, got);
    check_all_memory_back(&gpu, &heap);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn aligned_blocks_in_1024_thread_blocks() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let size = 64u32;
    // The least any allocator can give a request: the larger of its size and its alignment.
    let requested: u64 =
        ALIGNS.iter().map(|&a| a.max(size) as u64).sum::<u64>() * THREADS / ALIGNS.len() as u64;
    let heap = Heap::new(&gpu, &stream, half_heap(requested)).unwrap();
    let name = "toga_fit_aligned";
    let f = user_kernel(&gpu, name);
    let aligns = stream.clone_htod(&ALIGNS).unwrap();
    let count = ALIGNS.len() as u32;
    let mut ptrs = stream.alloc_zeros::<u64>(THREADS as usize).unwrap();
    let mut errors = stream.alloc_zeros::<u64>(ERROR_WORDS).unwrap();
    let tag = 2u32;
    // SAFETY: `ptrs` has THREADS elements, `aligns` `count` powers of two, `errors` two words.
    launched(name, unsafe {
        stream
            .launch_builder(&f)
            .arg(&heap.base())
            .arg(&mut ptrs)
            .arg(&THREADS)
            .arg(&size)
            .arg(&aligns)
            .arg(&count)
            .arg(&tag)
            .arg(&mut errors)
            .launch(user_config(THREADS))
    });
    let host_ptrs = stream.clone_dtoh(&ptrs).unwrap();
    let got = check_live_blocks(&heap, &host_ptrs, |_| size as u64);
    assert!(
        got > 0 && got < THREADS,
        "{got} of {THREADS}: the heap holds about half"
    );
    for (k, &align) in ALIGNS.iter().enumerate() {
        let served = (k..THREADS as usize)
            .step_by(ALIGNS.len())
            .filter(|&i| host_ptrs[i] != 0)
            .inspect(|&i| {
                assert_eq!(
                    host_ptrs[i] % align as u64,
                    0,
                    "thread {i}: {:#x} not aligned to {align}",
                    host_ptrs[i]
                )
            })
            .count();
        assert!(served > 0, "no block aligned to {align} was served");
    }
    let s = heap.stats(&stream).unwrap();
    assert_eq!(s.mallocs, got, "{s:?}");
    assert_eq!(
        s.failed_allocations,
        THREADS - got,
        "every null is out of memory"
    );
    assert_eq!(s.live_blocks(), got, "{s:?}");
    // Check and free with the plain kernel: same size, same tag.
    let name = "toga_fit_malloc_free";
    let f = user_kernel(&gpu, name);
    let free = true as u32;
    // SAFETY: `ptrs` as `toga_fit_aligned` left them for `(size, tag)`; `errors` two words.
    launched(name, unsafe {
        stream
            .launch_builder(&f)
            .arg(&heap.base())
            .arg(&mut ptrs)
            .arg(&THREADS)
            .arg(&size)
            .arg(&tag)
            .arg(&free)
            .arg(&mut errors)
            .launch(user_config(THREADS))
    });
    check_no_errors(&stream, &errors);
    check_all_memory_back(&gpu, &heap);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn vec_push_through_global_alloc_in_1024_thread_blocks() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let len = 32u32;
    // `Heap::new` binds the heap to toga's module, whose `GlobalAlloc` the kernel uses.
    let final_bytes = len as u64 * size_of::<u64>() as u64;
    let heap = Heap::new(&gpu, &stream, half_heap(THREADS * final_bytes)).unwrap();
    let name = "toga_fit_vec";
    let f = user_kernel(&gpu, name);
    let mut out = stream.alloc_zeros::<u64>(THREADS as usize).unwrap();
    // SAFETY: `out` has THREADS elements; the heap is bound.
    launched(name, unsafe {
        stream
            .launch_builder(&f)
            .arg(&mut out)
            .arg(&THREADS)
            .arg(&len)
            .launch(user_config(THREADS))
    });
    let out = stream.clone_dtoh(&out).unwrap();
    // Element `k` of thread `i` is `i << VEC_OWNER_SHIFT | k`.
    let indices = len as u64 * (len as u64 - 1) / 2;
    let mut failed = 0;
    for (i, &sum) in out.iter().enumerate() {
        if sum == VEC_FAILED {
            failed += 1;
        } else {
            assert_eq!(
                sum,
                ((i as u64) << VEC_OWNER_SHIFT) * len as u64 + indices,
                "thread {i}"
            );
        }
    }
    let grown = THREADS - failed;
    assert!(grown > 0, "{grown} of {THREADS} Vecs grew");
    let s = heap.stats(&stream).unwrap();
    assert_eq!(
        s.failed_allocations, failed,
        "a Vec stops at its first failed allocation: {s:?}"
    );
    assert!(s.mallocs >= grown, "{s:?}");
    check_all_memory_back(&gpu, &heap);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn cross_warp_frees_in_1024_thread_blocks() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let (min_size, max_size, seed) = (16, 1024, 12);
    let sizes = uniform_sizes(THREADS, min_size, max_size, seed);
    let requested: u64 = sizes.iter().map(|&s| (s as u64).next_power_of_two()).sum();
    let heap = Heap::new(&gpu, &stream, half_heap(requested)).unwrap();
    let name = "toga_fit_cross_free";
    let f = user_kernel(&gpu, name);
    let d_sizes = stream.clone_htod(&sizes).unwrap();
    let mut prev = stream.alloc_zeros::<u64>(THREADS as usize).unwrap();
    let mut next = stream.alloc_zeros::<u64>(THREADS as usize).unwrap();
    let mut errors = stream.alloc_zeros::<u64>(ERROR_WORDS).unwrap();
    // How far, in warps, the freeing thread is from the one that allocated: the next warp, the
    // same lane of the next block, and half the grid away (another SM).
    let warps_per_block = BLOCK_THREADS as u64 / WARP_SIZE;
    let distances = [1, warps_per_block, THREADS / WARP_SIZE / 2 + 1];
    let mut round = 0u32;
    let mut run =
        |prev: &mut CudaSlice<u64>, next: &mut CudaSlice<u64>, warps: u64, alloc: bool| {
            let alloc = alloc as u32;
            // SAFETY: `prev`, `next` and `d_sizes` have THREADS elements, `prev` as the previous
            // round left it; `warps < THREADS`; `errors` has two words.
            launched(name, unsafe {
                stream
                    .launch_builder(&f)
                    .arg(&heap.base())
                    .arg(prev)
                    .arg(next)
                    .arg(&d_sizes)
                    .arg(&THREADS)
                    .arg(&round)
                    .arg(&warps)
                    .arg(&alloc)
                    .arg(&mut errors)
                    .launch(user_config(THREADS))
            });
            round += 1;
        };
    let mut handed_out = 0;
    for (k, warps) in distances.into_iter().enumerate() {
        run(&mut prev, &mut next, warps, true);
        // Live now: what this round took (the last round's blocks were all freed).
        let got = check_live_blocks(&heap, &stream.clone_dtoh(&next).unwrap(), |i| {
            sizes[i] as u64
        });
        assert!(got > 0, "round {k}: nothing fit");
        assert_eq!(heap.stats(&stream).unwrap().live_blocks(), got, "round {k}");
        handed_out += got;
        std::mem::swap(&mut prev, &mut next);
    }
    run(&mut prev, &mut next, distances[0], false);
    let rounds = distances.len() as u64;
    assert!(
        handed_out < rounds * THREADS,
        "the heap holds about half: some requests fail"
    );
    check_no_errors(&stream, &errors);
    assert!(stream.clone_dtoh(&prev).unwrap().iter().all(|&p| p == 0));
    let s = heap.stats(&stream).unwrap();
    assert_eq!(s.mallocs, handed_out, "{s:?}");
    assert_eq!(s.failed_allocations, rounds * THREADS - handed_out, "{s:?}");
    check_all_memory_back(&gpu, &heap);
}
