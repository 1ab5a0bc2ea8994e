//! Growable heaps on a real GPU (ignored without `--include-ignored`): growth while a kernel runs, host-side
//! growth and trim, out of memory at the maximum, misuse, one heap per device.

mod common;

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use toga::{Error, Gpu, Heap};
use toga_harness::{Workloads, block_bytes, uniform_sizes};

const MIB: u64 = 1 << 20;

/// Fill `sizes.len()` blocks (thread i asks `sizes[i]`), then check every pattern and that the
/// blocks are disjoint and inside the mapped heap. Returns the pointers (0 for a null).
fn fill_and_check(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    heap: &Heap,
    sizes: &[u32],
    tag: u32,
) -> (CudaSlice<u64>, CudaSlice<u32>, Vec<u64>) {
    let w = Workloads::new(gpu).unwrap();
    let d_sizes = stream.clone_htod(sizes).unwrap();
    let mut ptrs = stream.alloc_zeros::<u64>(sizes.len()).unwrap();
    w.alloc_fill(stream, heap, &mut ptrs, &d_sizes, tag)
        .unwrap();
    let mut errors = stream.alloc_zeros::<u64>(2).unwrap();
    w.check_free(stream, heap, &ptrs, &d_sizes, tag, false, &mut errors)
        .unwrap();
    assert_eq!(stream.clone_dtoh(&errors).unwrap()[0], 0, "pattern errors");
    let host = stream.clone_dtoh(&ptrs).unwrap();
    let data = heap.base() + heap.geometry().data_offset;
    let mut spans: Vec<(u64, u64)> = host
        .iter()
        .zip(sizes)
        .filter(|(p, _)| **p != 0)
        .map(|(&p, &s)| (p, block_bytes(s)))
        .collect();
    spans.sort();
    for pair in spans.windows(2) {
        assert!(
            pair[0].0 + pair[0].1 <= pair[1].0,
            "blocks overlap: {pair:x?}"
        );
    }
    for (p, len) in &spans {
        assert!(*p >= data && p + len <= data + heap.capacity());
    }
    (ptrs, d_sizes, host)
}

fn free_all(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    heap: &Heap,
    ptrs: &CudaSlice<u64>,
    sizes: &CudaSlice<u32>,
    tag: u32,
) {
    let w = Workloads::new(gpu).unwrap();
    let mut errors = stream.alloc_zeros::<u64>(2).unwrap();
    w.check_free(stream, heap, ptrs, sizes, tag, true, &mut errors)
        .unwrap();
    assert_eq!(stream.clone_dtoh(&errors).unwrap()[0], 0, "pattern errors");
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn in_kernel_growth_serves_four_times_the_initial_memory() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let heap = Heap::growable()
        .initial_bytes(8 * MIB)
        .max_bytes(1 << 30)
        .create(&gpu, &stream)
        .unwrap();
    assert!(heap.is_growable());
    let before = heap.stats(&stream).unwrap();
    assert_eq!(before.mapped_bytes, 8 * MIB);
    assert_eq!(before.max_bytes, 1 << 30);
    // 2^18 × 16–256 B, about 35 MiB of blocks: over four times the mapped 8 MiB.
    let sizes = uniform_sizes(1 << 18, 16, 256, 7);
    let asked: u64 = sizes.iter().map(|&s| block_bytes(s)).sum();
    assert!(asked >= 4 * 8 * MIB);
    let (ptrs, d_sizes, host) = fill_and_check(&gpu, &stream, &heap, &sizes, 1);
    let s = heap.stats(&stream).unwrap();
    let nulls = host.iter().filter(|&&p| p == 0).count();
    assert_eq!(nulls, 0, "{s:?}");
    assert_eq!(s.mallocs, sizes.len() as u64);
    assert_eq!(s.failed_allocations, 0);
    assert_eq!(s.used_bytes, asked);
    assert!(s.kernel_grows >= 1, "{s:?}");
    assert_eq!(s.kernel_grow_failures, 0, "{s:?}");
    assert!(s.mapped_bytes >= asked, "{s:?}");
    free_all(&gpu, &stream, &heap, &ptrs, &d_sizes, 1);
    // Everything is free: trimming to the release threshold (the initial 8 MiB) gives back
    // every granule above it.
    heap.synchronize(&stream).unwrap();
    let after = heap.stats(&stream).unwrap();
    assert_eq!(after.used_bytes, 0);
    assert_eq!(after.live_blocks(), 0);
    assert_eq!(after.mapped_bytes, 8 * MIB, "{after:?}");
    assert_eq!(after.mapped_high, s.mapped_high);
    // And the heap still works, growing again.
    let (ptrs, d_sizes, host) = fill_and_check(&gpu, &stream, &heap, &sizes, 2);
    assert!(host.iter().all(|&p| p != 0));
    free_all(&gpu, &stream, &heap, &ptrs, &d_sizes, 2);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn in_kernel_growth_maps_large_blocks_in_aligned_runs() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let heap = Heap::growable()
        .initial_bytes(2 * MIB)
        .max_bytes(2 << 30)
        .create(&gpu, &stream)
        .unwrap();
    // 1 KiB – 4 MiB blocks, 8 threads of every size: small and large ones, 200 MiB in all.
    let sizes: Vec<u32> = (0..=12)
        .flat_map(|o| std::iter::repeat_n(1024u32 << o, 32))
        .collect();
    let asked: u64 = sizes.iter().map(|&s| block_bytes(s)).sum();
    let (ptrs, d_sizes, host) = fill_and_check(&gpu, &stream, &heap, &sizes, 3);
    let s = heap.stats(&stream).unwrap();
    assert!(host.iter().all(|&p| p != 0), "{s:?}");
    assert_eq!(s.used_bytes, asked);
    assert!(s.mapped_bytes >= asked);
    free_all(&gpu, &stream, &heap, &ptrs, &d_sizes, 3);
    // All free: a trim to nothing takes every granule back.
    let released = heap.trim_to(&stream, 0).unwrap();
    let t = heap.stats(&stream).unwrap();
    assert_eq!(released, s.mapped_bytes);
    assert_eq!(t.mapped_bytes, 0, "{t:?}");
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn in_kernel_growth_stops_at_the_maximum_with_null_and_exact_counts() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let max = 32 * MIB;
    let heap = Heap::growable()
        .initial_bytes(4 * MIB)
        .max_bytes(max)
        .create(&gpu, &stream)
        .unwrap();
    // 2^20 × 64 B = 64 MiB of requests: twice the maximum.
    let sizes = vec![64u32; 1 << 20];
    let (ptrs, d_sizes, host) = fill_and_check(&gpu, &stream, &heap, &sizes, 4);
    let s = heap.stats(&stream).unwrap();
    let served = host.iter().filter(|&&p| p != 0).count() as u64;
    assert_eq!(s.mallocs, served);
    assert_eq!(s.failed_allocations, sizes.len() as u64 - served);
    assert_eq!(s.used_bytes, served * 64);
    assert_eq!(s.mapped_bytes, max, "{s:?}");
    assert!(s.kernel_grow_failures >= 1, "{s:?}");
    // Served at least 95% of the maximum.
    assert!(
        served * 64 >= max / 100 * 95,
        "served {served} × 64 B of {max}"
    );
    // Past the maximum: a clear error and nothing changes.
    match heap.grow(&stream, MIB) {
        Err(Error::HeapTooLarge { limit, .. }) => assert_eq!(limit, max),
        other => panic!("grow past the maximum gave {other:?}"),
    }
    assert_eq!(heap.stats(&stream).unwrap().mapped_bytes, max);
    free_all(&gpu, &stream, &heap, &ptrs, &d_sizes, 4);
    heap.trim(&stream).unwrap();
    let w = Workloads::new(&gpu).unwrap();
    let probe = w.probe(&stream, &heap).unwrap();
    assert!(probe.whole_heap_block, "{probe:?}");
    let end = heap.stats(&stream).unwrap();
    assert_eq!(end.live_blocks(), 0);
    assert_eq!(end.used_bytes, 0);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn host_side_growth_and_a_trim_that_keeps_live_blocks() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let heap = Heap::growable()
        .initial_bytes(4 * MIB)
        .max_bytes(256 * MIB)
        .grow_in_kernel(false)
        .create(&gpu, &stream)
        .unwrap();
    let w = Workloads::new(&gpu).unwrap();
    // Without growth in kernels, 16 MiB of 4 KiB blocks do not fit in 4 MiB.
    let sizes = vec![4096u32; 4096];
    let (ptrs, d_sizes, host) = fill_and_check(&gpu, &stream, &heap, &sizes, 5);
    let served = host.iter().filter(|&&p| p != 0).count();
    assert!(served < sizes.len());
    assert_eq!(heap.stats(&stream).unwrap().kernel_grows, 0);
    free_all(&gpu, &stream, &heap, &ptrs, &d_sizes, 5);
    // Grow on the host, then they do.
    let mapped = heap.grow(&stream, 28 * MIB).unwrap();
    assert!(mapped >= 32 * MIB, "{mapped}");
    let (ptrs, d_sizes, host) = fill_and_check(&gpu, &stream, &heap, &sizes, 6);
    assert!(host.iter().all(|&p| p != 0));
    // Free every other block: the trim may release only granules with nothing live.
    let odd: Vec<u64> = host
        .iter()
        .enumerate()
        .map(|(i, &p)| if i % 2 == 1 { p } else { 0 })
        .collect();
    let d_odd = stream.clone_htod(&odd).unwrap();
    w.free(&stream, Some(&heap), &d_odd).unwrap();
    let before = heap.stats(&stream).unwrap();
    let released = heap.trim_to(&stream, 0).unwrap();
    let after = heap.stats(&stream).unwrap();
    assert_eq!(after.mapped_bytes, before.mapped_bytes - released);
    assert!(after.mapped_bytes >= after.used_bytes);
    // The live half is intact: check it (the freed half reads as nulls).
    let even: Vec<u64> = host
        .iter()
        .enumerate()
        .map(|(i, &p)| if i % 2 == 0 { p } else { 0 })
        .collect();
    let d_even = stream.clone_htod(&even).unwrap();
    let mut errors = stream.alloc_zeros::<u64>(2).unwrap();
    w.check_free(&stream, &heap, &d_even, &d_sizes, 6, true, &mut errors)
        .unwrap();
    assert_eq!(stream.clone_dtoh(&errors).unwrap()[0], 0);
    drop(ptrs);
    let end = heap.stats(&stream).unwrap();
    assert_eq!(end.live_blocks(), 0);
    assert_eq!(end.double_frees + end.invalid_frees, 0);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn a_free_into_an_unmapped_granule_is_counted_and_harmless() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let heap = Heap::growable()
        .initial_bytes(2 * MIB)
        .max_bytes(64 * MIB)
        .create(&gpu, &stream)
        .unwrap();
    let w = Workloads::new(&gpu).unwrap();
    let data = heap.base() + heap.geometry().data_offset;
    // Inside the data region, beyond the mapped granule: small and page-aligned pointers.
    let bad = vec![
        data + 40 * MIB + 16,
        data + 40 * MIB + 4096,
        data + 63 * MIB + 48,
    ];
    let d_bad = stream.clone_htod(&bad).unwrap();
    w.free(&stream, Some(&heap), &d_bad).unwrap();
    let s = heap.stats(&stream).unwrap();
    assert_eq!(s.invalid_frees + s.double_frees, bad.len() as u64, "{s:?}");
    assert_eq!(s.mapped_bytes, 2 * MIB);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn in_kernel_growth_on_every_device_with_a_heap_of_its_own() {
    let first = common::gpu();
    let count = toga::device_count().unwrap();
    if count < 2 {
        // One device is what every other test here covers: this test is about several.
        println!("SKIP: in_kernel_growth_on_every_device needs 2 GPUs; this machine has {count}");
        return;
    }
    let mut gpus = vec![first];
    for ordinal in 1..count {
        gpus.push(toga_harness::open(ordinal).unwrap());
    }
    // All heaps exist at once; each device's kernels use its own.
    let heaps: Vec<(Arc<CudaStream>, Heap)> = gpus
        .iter()
        .map(|g| {
            let s = g.default_stream();
            let h = Heap::growable()
                .initial_bytes(2 * MIB)
                .max_bytes(256 * MIB)
                .create(g, &s)
                .unwrap();
            (s, h)
        })
        .collect();
    let sizes = uniform_sizes(1 << 16, 16, 2048, 11);
    for (g, (s, h)) in gpus.iter().zip(&heaps) {
        let (ptrs, d_sizes, host) = fill_and_check(g, s, h, &sizes, 7);
        assert!(host.iter().all(|&p| p != 0));
        free_all(g, s, h, &ptrs, &d_sizes, 7);
        let st = h.stats(s).unwrap();
        assert_eq!(st.live_blocks(), 0);
        assert!(st.kernel_grows >= 1);
    }
    eprintln!("{} device(s) checked", gpus.len());
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn a_fixed_heap_cannot_grow() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let heap = Heap::new(&gpu, &stream, 8 * MIB).unwrap();
    assert!(!heap.is_growable());
    assert!(matches!(heap.grow(&stream, MIB), Err(Error::NotGrowable)));
    assert_eq!(heap.trim_to(&stream, 0).unwrap(), 0);
    let s = heap.stats(&stream).unwrap();
    assert_eq!(s.mapped_bytes, s.capacity_bytes);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn bad_growable_sizes_are_clear_errors() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let too_big = Heap::growable().max_bytes(1 << 40).create(&gpu, &stream);
    assert!(
        matches!(too_big, Err(Error::HeapTooLarge { .. })),
        "{:?}",
        too_big.err()
    );
    let initial_above_max = Heap::growable()
        .initial_bytes(64 * MIB)
        .max_bytes(32 * MIB)
        .create(&gpu, &stream);
    assert!(matches!(initial_above_max, Err(Error::HeapTooLarge { .. })));
    let tiny = Heap::growable()
        .initial_bytes(MIB)
        .max_bytes(MIB)
        .create(&gpu, &stream);
    assert!(
        matches!(tiny, Err(Error::HeapTooSmall { .. })),
        "{:?}",
        tiny.err()
    );
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn in_kernel_growth_and_grow_stop_cleanly_when_the_device_is_out_of_memory() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let heap = Heap::growable()
        .initial_bytes(4 * MIB)
        .max_bytes(16 << 30)
        .create(&gpu, &stream)
        .unwrap();
    // The kernels below first, once: CUDA reserves their local memory (stack frame × resident
    // threads, some 300 MB on an H100) at their first launch, which would fail for that
    // reason alone once the device is full.
    let (ptrs, d_sizes, _) = fill_and_check(&gpu, &stream, &heap, &[16], 7);
    free_all(&gpu, &stream, &heap, &ptrs, &d_sizes, 7);
    let before = heap.stats(&stream).unwrap();
    // Take all but 64 MiB of the device's free memory.
    let free = gpu.free_memory().unwrap();
    let hog = stream
        .alloc_zeros::<u8>((free - 64 * MIB) as usize)
        .unwrap();
    let mapped = heap.stats(&stream).unwrap().mapped_bytes;
    match heap.grow(&stream, 1 << 30) {
        Err(Error::HeapTooLarge { why, limit, .. }) => {
            assert_eq!(why, "free device memory");
            assert!(limit < mapped + (1 << 30));
        }
        other => panic!("growing past the device's memory gave {other:?}"),
    }
    assert_eq!(heap.stats(&stream).unwrap().mapped_bytes, mapped);
    // A kernel that wants 256 MiB gets what the device can still map, then nulls, counted.
    let sizes = vec![256u32; 1 << 20];
    let (ptrs, d_sizes, host) = fill_and_check(&gpu, &stream, &heap, &sizes, 8);
    let s = heap.stats(&stream).unwrap();
    let served = host.iter().filter(|&&p| p != 0).count() as u64;
    assert!(served > 0 && served < sizes.len() as u64, "{s:?}");
    assert_eq!(s.mallocs - before.mallocs, served);
    assert_eq!(
        s.failed_allocations - before.failed_allocations,
        sizes.len() as u64 - served
    );
    assert!(s.kernel_grow_failures >= 1, "{s:?}");
    assert!(s.mapped_bytes < 256 * MIB, "{s:?}");
    free_all(&gpu, &stream, &heap, &ptrs, &d_sizes, 8);
    // cudarc frees in stream order, into the stream's pool, which gives the memory back to the
    // device at the next synchronization.
    drop(hog);
    stream.synchronize().unwrap();
    // With memory back, growing works again (and lets kernels ask again).
    heap.grow(&stream, 64 * MIB).unwrap();
    let (ptrs, d_sizes, host) = fill_and_check(&gpu, &stream, &heap, &sizes, 9);
    assert!(host.iter().all(|&p| p != 0));
    free_all(&gpu, &stream, &heap, &ptrs, &d_sizes, 9);
}
