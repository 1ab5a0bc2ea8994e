//! Stream-ordered host allocation from a toga heap (`Heap::alloc_async`, `free_async` and the
//! batched forms) on a real GPU; ignored without `--include-ignored`. Blocks from either side
//! are freed by the other, every block is pattern-checked, and the statistics must count both
//! sides. The last test measures one `alloc_async` and the batched forms against
//! `cuMemAllocFromPoolAsync` from a pool on the same stream, and prints the numbers.

mod common;

use std::time::Instant;

use cudarc::driver::sys;
use toga::{Error, Gpu, Heap, HostBlock};
use toga_harness::{Workloads, uniform_sizes};

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn host_blocks_are_used_by_kernels_and_freed_by_the_host_without_a_sync() {
    let gpu = common::gpu();
    let stream = gpu.new_stream().unwrap();
    let heap = Heap::new(&gpu, &stream, 256 << 20).unwrap();
    let before = heap.stats(&stream).unwrap();
    // Small and large blocks: 16 B – 1 MiB.
    let sizes: Vec<u64> = (0..64u64).map(|i| 16 << (i % 17)).collect();
    let blocks: Vec<HostBlock> = sizes
        .iter()
        .map(|&b| heap.alloc_async(b, &stream).unwrap())
        .collect();
    // No synchronization between here and the stats: the kernels read the slots.
    let slots = stream
        .clone_htod(&blocks.iter().map(HostBlock::slot).collect::<Vec<_>>())
        .unwrap();
    let d_sizes = stream.clone_htod(&sizes).unwrap();
    assert_eq!(
        common::host_pattern(&gpu, &stream, &slots, true, &d_sizes, 7, false),
        [0, 0]
    );
    assert_eq!(
        common::host_pattern(&gpu, &stream, &slots, true, &d_sizes, 7, true),
        [0, 0]
    );
    let addresses: Vec<u64> = blocks.iter().map(|b| b.address(&stream).unwrap()).collect();
    let data = heap.base() + heap.geometry().data_offset;
    for (&p, &len) in addresses.iter().zip(&sizes) {
        assert!(
            p >= data && p + len <= data + heap.capacity(),
            "{p:#x} outside the heap"
        );
    }
    let during = heap.stats(&stream).unwrap();
    assert_eq!(during.mallocs - before.mallocs, sizes.len() as u64);
    assert_eq!(during.live_blocks(), sizes.len() as u64);
    for b in blocks {
        heap.free_async(b, &stream).unwrap();
    }
    let after = heap.stats(&stream).unwrap();
    assert_eq!(after.frees - before.frees, sizes.len() as u64);
    assert_eq!(after.live_blocks(), 0);
    assert_eq!(after.used_bytes, 0);
    assert_eq!((after.invalid_frees, after.double_frees), (0, 0));
    println!(
        "{} host blocks of 16 B – 1 MiB: filled and checked by kernels through their slots, freed by the host",
        sizes.len()
    );
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn each_side_frees_the_others_blocks_and_the_stats_count_both() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let heap = Heap::new(&gpu, &stream, 512 << 20).unwrap();
    let w = Workloads::new(&gpu).unwrap();
    let n = 1u64 << 16;

    // Kernel mallocs, host frees (the batched form, then single pointers).
    let sizes32 = uniform_sizes(n, 16, 8192, 3);
    let d_sizes32 = stream.clone_htod(&sizes32).unwrap();
    let mut kernel_ptrs = stream.alloc_zeros::<u64>(n as usize).unwrap();
    w.alloc_fill(&stream, &heap, &mut kernel_ptrs, &d_sizes32, 1)
        .unwrap();
    let mut errors = stream.alloc_zeros::<u64>(2).unwrap();
    w.check_free(
        &stream,
        &heap,
        &kernel_ptrs,
        &d_sizes32,
        1,
        false,
        &mut errors,
    )
    .unwrap();
    assert_eq!(stream.clone_dtoh(&errors).unwrap(), [0, 0]);
    let live = stream
        .clone_dtoh(&kernel_ptrs)
        .unwrap()
        .iter()
        .filter(|&&p| p != 0)
        .count() as u64;
    assert_eq!(
        live, n,
        "a 512 MiB heap serves 2^16 blocks of at most 8 KiB"
    );
    let singles = stream.clone_dtoh(&kernel_ptrs.slice(0..16)).unwrap();
    for &p in &singles {
        heap.free_async(p, &stream).unwrap();
    }
    let mut rest = stream.clone_dtoh(&kernel_ptrs).unwrap();
    rest[..16].fill(0);
    let mut d_rest = stream.clone_htod(&rest).unwrap();
    heap.free_async_batch(&mut d_rest, &stream).unwrap();
    assert!(stream.clone_dtoh(&d_rest).unwrap().iter().all(|&p| p == 0));
    let s = heap.stats(&stream).unwrap();
    assert_eq!((s.mallocs, s.frees, s.live_blocks()), (n, n, 0));

    // Host mallocs (batched, mixed sizes), kernel frees.
    let sizes: Vec<u64> = sizes32.iter().map(|&s| s as u64).collect();
    let d_sizes = stream.clone_htod(&sizes).unwrap();
    let mut host_ptrs = stream.alloc_zeros::<u64>(n as usize).unwrap();
    heap.alloc_async_batch(&d_sizes, &mut host_ptrs, &stream)
        .unwrap();
    assert_eq!(
        common::host_pattern(&gpu, &stream, &host_ptrs, false, &d_sizes, 2, false),
        [0, 0]
    );
    assert_eq!(
        common::host_pattern(&gpu, &stream, &host_ptrs, false, &d_sizes, 2, true),
        [0, 0]
    );
    w.free(&stream, Some(&heap), &host_ptrs).unwrap();
    // And a uniform batch, freed by the host.
    let mut uniform = stream.alloc_zeros::<u64>(n as usize).unwrap();
    heap.alloc_async_uniform(64, &mut uniform, &stream).unwrap();
    let d64 = stream.clone_htod(&vec![64u64; n as usize]).unwrap();
    assert_eq!(
        common::host_pattern(&gpu, &stream, &uniform, false, &d64, 3, false),
        [0, 0]
    );
    assert_eq!(
        common::host_pattern(&gpu, &stream, &uniform, false, &d64, 3, true),
        [0, 0]
    );
    let during = heap.stats(&stream).unwrap();
    assert_eq!(during.live_blocks(), n);
    heap.free_async_batch(&mut uniform, &stream).unwrap();
    let s = heap.stats(&stream).unwrap();
    assert_eq!((s.mallocs, s.frees, s.live_blocks()), (3 * n, 3 * n, 0));
    assert_eq!((s.invalid_frees, s.double_frees), (0, 0));
    println!(
        "2^16 blocks each way: kernel→host frees, host→kernel frees, host→host batch; mallocs {} frees {}",
        s.mallocs, s.frees
    );
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn bad_host_calls_get_clear_errors_and_are_counted() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let heap = Heap::new(&gpu, &stream, 8 << 20).unwrap();
    assert!(matches!(
        heap.alloc_async(0, &stream),
        Err(Error::ZeroSizeAllocation)
    ));
    let too_large = heap.capacity() + 1;
    match heap.alloc_async(too_large, &stream) {
        Err(e @ Error::AllocationTooLarge { .. }) => println!("{e}"),
        other => panic!("alloc_async({too_large}): {other:?}"),
    }
    // A pointer outside the heap: refused at once, and counted.
    let foreign = heap.base() - 4096;
    match heap.free_async(foreign, &stream) {
        Err(e @ Error::ForeignPointer { .. }) => println!("{e}"),
        other => panic!("free_async of a foreign pointer: {other:?}"),
    }
    // A block freed twice by pointer: the device tells, and counts it.
    let b = heap.alloc_async(100, &stream).unwrap();
    let p = b.address(&stream).unwrap();
    heap.free_async(p, &stream).unwrap();
    heap.free_async(p, &stream).unwrap();
    // The handle's slot still holds the pointer (it was freed by address, not through the
    // handle): freeing the handle too is a third free of the block.
    heap.free_async(b, &stream).unwrap();
    let s = heap.stats(&stream).unwrap();
    // The second and third frees are double frees, or foreign ones when the block's bin went
    // back to its chunk in between: either way counted, and nothing else changed.
    assert_eq!(s.invalid_frees + s.double_frees, 3, "{s:?}");
    assert!(s.invalid_frees >= 1, "the foreign pointer");
    assert_eq!(s.live_blocks(), 0);

    // Out of memory: null in the slot, a clear error from `address`, counted as failed.
    let half = heap.capacity() / 2;
    let blocks: Vec<HostBlock> = (0..3)
        .map(|_| heap.alloc_async(half, &stream).unwrap())
        .collect();
    let results: Vec<_> = blocks.iter().map(|b| b.address(&stream)).collect();
    let oom = results
        .iter()
        .filter(|r| matches!(r, Err(Error::OutOfMemory { .. })))
        .count();
    assert!(oom >= 1, "three halves of the heap: {results:?}");
    println!("{}", results.iter().find_map(|r| r.as_ref().err()).unwrap());
    assert!(heap.stats(&stream).unwrap().failed_allocations >= oom as u64);
    for b in blocks {
        // Freeing a null slot is a no-op.
        heap.free_async(b, &stream).unwrap();
    }

    // A block of one heap given to another.
    let other = Heap::new(&gpu, &stream, 8 << 20).unwrap();
    let b = heap.alloc_async(64, &stream).unwrap();
    match other.free_async(b, &stream) {
        Err(e @ Error::WrongHeap { .. }) => println!("{e}"),
        other => panic!("a block given to the wrong heap: {other:?}"),
    }
    // A handle that outlives its heap.
    let b = other.alloc_async(64, &stream).unwrap();
    other.destroy(&stream).unwrap();
    match b.address(&stream) {
        Err(e @ Error::HeapDestroyed) => println!("{e}"),
        other => panic!("address after destroy: {other:?}"),
    }
    let s = heap.stats(&stream).unwrap();
    assert_eq!(
        s.live_blocks(),
        1,
        "the block given to the wrong heap is still live"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn a_growable_heap_grows_for_a_host_allocation() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let heap = Heap::growable()
        .initial_bytes(8 << 20)
        .max_bytes(1 << 30)
        .create(&gpu, &stream)
        .unwrap();
    if !heap.is_growable() {
        println!("SKIP: no virtual memory management on this device");
        return;
    }
    let b = heap.alloc_async(64 << 20, &stream).unwrap();
    let p = b.address(&stream).unwrap();
    let s = heap.stats(&stream).unwrap();
    assert!(s.mapped_bytes >= 64 << 20, "{s:?}");
    assert!(s.kernel_grows >= 1);
    let ptrs = stream.clone_htod(&[p]).unwrap();
    let sizes = stream.clone_htod(&[64u64 << 20]).unwrap();
    assert_eq!(
        common::host_pattern(&gpu, &stream, &ptrs, false, &sizes, 9, false),
        [0, 0]
    );
    assert_eq!(
        common::host_pattern(&gpu, &stream, &ptrs, false, &sizes, 9, true),
        [0, 0]
    );
    heap.free_async(b, &stream).unwrap();
    heap.synchronize(&stream).unwrap();
    let s = heap.stats(&stream).unwrap();
    assert_eq!(s.live_blocks(), 0);
    println!(
        "64 MiB alloc_async on an 8 MiB growable heap: grew to {} MiB, back to {} MiB after the free",
        s.mapped_high >> 20,
        s.mapped_bytes >> 20
    );
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn host_and_kernel_blocks_on_several_streams() {
    let gpu = common::gpu();
    let creator = gpu.default_stream();
    let heap = Heap::new(&gpu, &creator, 256 << 20).unwrap();
    creator.synchronize().unwrap();
    let w = Workloads::new(&gpu).unwrap();
    let streams: Vec<_> = (0..4).map(|_| gpu.new_stream().unwrap()).collect();
    let n = 1u64 << 12;
    let mut kept = Vec::new();
    for (k, s) in streams.iter().enumerate() {
        let sizes = uniform_sizes(n, 16, 4096, k as u64);
        let d32 = s.clone_htod(&sizes).unwrap();
        let d64 = s
            .clone_htod(&sizes.iter().map(|&x| x as u64).collect::<Vec<_>>())
            .unwrap();
        let mut from_kernel = s.alloc_zeros::<u64>(n as usize).unwrap();
        w.alloc_fill(s, &heap, &mut from_kernel, &d32, k as u32)
            .unwrap();
        let mut from_host = s.alloc_zeros::<u64>(n as usize).unwrap();
        heap.alloc_async_batch(&d64, &mut from_host, s).unwrap();
        assert_eq!(
            common::host_pattern(&gpu, s, &from_host, false, &d64, 100 + k as u32, false),
            [0, 0]
        );
        kept.push((from_kernel, from_host, d32, d64));
    }
    for ((from_kernel, from_host, d32, d64), (k, s)) in
        kept.iter_mut().zip(streams.iter().enumerate())
    {
        let mut errors = s.alloc_zeros::<u64>(2).unwrap();
        w.check_free(s, &heap, from_kernel, d32, k as u32, false, &mut errors)
            .unwrap();
        assert_eq!(s.clone_dtoh(&errors).unwrap(), [0, 0]);
        assert_eq!(
            common::host_pattern(&gpu, s, from_host, false, d64, 100 + k as u32, true),
            [0, 0]
        );
        heap.free_async_batch(from_kernel, s).unwrap();
        w.free(s, Some(&heap), from_host).unwrap();
    }
    for s in &streams {
        s.synchronize().unwrap();
    }
    let s = heap.stats(&creator).unwrap();
    assert_eq!(s.live_blocks(), 0);
    assert_eq!(s.mallocs, 2 * 4 * n);
    assert_eq!(s.frees, 2 * 4 * n);
    println!(
        "4 streams × (2^12 kernel blocks freed by the host + 2^12 host blocks freed by kernels)"
    );
}

/// Median of `v` (sorted in place).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A CUDA memory pool on the heap's device, with a release threshold that keeps its memory.
fn cuda_pool(gpu: &Gpu) -> sys::CUmemoryPool {
    gpu.context().bind_to_thread().unwrap();
    // SAFETY: a zeroed descriptor, then the fields a device pool needs.
    let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
    props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = gpu.info().ordinal as i32;
    let mut pool = std::ptr::null_mut();
    // SAFETY: writes one handle.
    unsafe { sys::cuMemPoolCreate(&mut pool, &props) }
        .result()
        .unwrap();
    let mut keep = u64::MAX;
    // SAFETY: the attribute is a u64.
    unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &mut keep as *mut u64 as *mut _,
        )
    }
    .result()
    .unwrap();
    pool
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored --nocapture"]
fn latency_and_throughput_against_cuda_mem_alloc_from_pool_async() {
    let gpu = common::gpu();
    let stream = gpu.new_stream().unwrap();
    let heap = Heap::new(&gpu, &stream, 1 << 30).unwrap();
    let pool = cuda_pool(&gpu);
    let cu = stream.cu_stream();
    let rounds = 2000;
    let bytes = 256u64;

    // One allocation and its free, each waited for: the round trip a host caller sees when it
    // needs the address (toga: alloc_async + address; CUDA: cuMemAllocFromPoolAsync +
    // cuStreamSynchronize), and the time to enqueue the pair without waiting.
    let (mut toga_rt, mut cuda_rt, mut toga_enq, mut cuda_enq) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds + 100 {
        let t = Instant::now();
        let b = heap.alloc_async(bytes, &stream).unwrap();
        b.address(&stream).unwrap();
        let rt = t.elapsed().as_secs_f64();
        heap.free_async(b, &stream).unwrap();
        stream.synchronize().unwrap();

        let t = Instant::now();
        let mut p = 0;
        // SAFETY: writes one pointer; freed below on the same stream.
        unsafe { sys::cuMemAllocFromPoolAsync(&mut p, bytes as usize, pool, cu) }
            .result()
            .unwrap();
        stream.synchronize().unwrap();
        let crt = t.elapsed().as_secs_f64();
        // SAFETY: ours, on the same stream.
        unsafe { sys::cuMemFreeAsync(p, cu) }.result().unwrap();
        stream.synchronize().unwrap();

        let t = Instant::now();
        let b = heap.alloc_async(bytes, &stream).unwrap();
        heap.free_async(b, &stream).unwrap();
        let enq = t.elapsed().as_secs_f64();
        stream.synchronize().unwrap();

        let t = Instant::now();
        // SAFETY: as above.
        unsafe {
            sys::cuMemAllocFromPoolAsync(&mut p, bytes as usize, pool, cu)
                .result()
                .unwrap();
            sys::cuMemFreeAsync(p, cu).result().unwrap();
        }
        let cenq = t.elapsed().as_secs_f64();
        stream.synchronize().unwrap();
        if round >= 100 {
            toga_rt.push(rt);
            cuda_rt.push(crt);
            toga_enq.push(enq);
            cuda_enq.push(cenq);
        }
    }
    println!(
        "one {bytes} B allocation, median of {rounds}: alloc + wait for the address: toga alloc_async {:.2} µs, cuMemAllocFromPoolAsync {:.2} µs; enqueue alloc + free: toga {:.2} µs, CUDA {:.2} µs",
        median(&mut toga_rt) * 1e6,
        median(&mut cuda_rt) * 1e6,
        median(&mut toga_enq) * 1e6,
        median(&mut cuda_enq) * 1e6,
    );

    // Batched: n blocks allocated and freed on the stream. toga: one alloc_async_uniform and
    // one free_async_batch; CUDA has no batched form: n cuMemAllocFromPoolAsync calls, then n
    // cuMemFreeAsync. Wall time from the first call until the stream is done.
    for n in [1usize << 10, 1 << 14, 1 << 17] {
        let mut ptrs = stream.alloc_zeros::<u64>(n).unwrap();
        let mut toga_t = Vec::new();
        let mut cuda_t = Vec::new();
        let mut cptrs = vec![0u64; n];
        for round in 0..6 {
            stream.synchronize().unwrap();
            let t = Instant::now();
            heap.alloc_async_uniform(bytes, &mut ptrs, &stream).unwrap();
            heap.free_async_batch(&mut ptrs, &stream).unwrap();
            stream.synchronize().unwrap();
            let tt = t.elapsed().as_secs_f64();

            let t = Instant::now();
            for p in cptrs.iter_mut() {
                // SAFETY: writes one pointer; freed below.
                unsafe { sys::cuMemAllocFromPoolAsync(p, bytes as usize, pool, cu) }
                    .result()
                    .unwrap();
            }
            for &p in &cptrs {
                // SAFETY: ours, on the same stream.
                unsafe { sys::cuMemFreeAsync(p, cu) }.result().unwrap();
            }
            stream.synchronize().unwrap();
            let ct = t.elapsed().as_secs_f64();
            if round > 0 {
                toga_t.push(tt);
                cuda_t.push(ct);
            }
        }
        let (tt, ct) = (median(&mut toga_t), median(&mut cuda_t));
        println!(
            "{n} blocks of {bytes} B allocated and freed in stream order: toga batched {:.3} ms ({:.1} M blocks/s), cuMemAllocFromPoolAsync/cuMemFreeAsync {:.3} ms ({:.1} M blocks/s)",
            tt * 1e3,
            n as f64 / tt / 1e6,
            ct * 1e3,
            n as f64 / ct / 1e6
        );
    }
    let s = heap.stats(&stream).unwrap();
    assert_eq!(s.live_blocks(), 0);
    assert_eq!(s.failed_allocations, 0);
    // SAFETY: every allocation went back; the stream is idle.
    unsafe { sys::cuMemPoolDestroy(pool) }.result().unwrap();
}
