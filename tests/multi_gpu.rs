//! Heaps on every GPU of the machine and peer access between them (ignored without
//! `--include-ignored`). Tests that need two GPUs print a line that starts with `SKIP:` and
//! return on a machine with one.

mod common;

use cudarc::driver::PushKernelArg;
use toga::{Error, Gpu, Heap, device_count, launch_config};
use toga_harness::{Workloads, uniform_sizes};

/// Two GPUs with toga's harness PTX, or `None` (after a `SKIP:` line) on a machine with fewer.
fn two_gpus(test: &str) -> Option<(Gpu, Gpu)> {
    let n = device_count().expect("GPU test without a CUDA driver");
    if n < 2 {
        println!("SKIP: {test} needs 2 GPUs; this machine has {n}");
        return None;
    }
    Some((
        toga_harness::open(0).unwrap(),
        toga_harness::open(1).unwrap(),
    ))
}

/// Whether kernels on `peer` can access memory of `device`.
fn can_access(device: usize, peer: usize) -> bool {
    use cudarc::driver::sys;
    let (mut d, mut p, mut can) = (0, 0, 0);
    // SAFETY: each call writes one int.
    unsafe {
        sys::cuDeviceGet(&mut d, device as i32).result().unwrap();
        sys::cuDeviceGet(&mut p, peer as i32).result().unwrap();
        sys::cuDeviceCanAccessPeer(&mut can, p, d).result().unwrap();
    }
    can != 0
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn a_heap_on_every_gpu_and_kernels_allocating_on_all_at_once() {
    let n_gpus = device_count().expect("GPU test without a CUDA driver");
    assert!(n_gpus >= 1, "GPU test without a GPU");
    let n = 1u64 << 18;
    let sizes = uniform_sizes(n, 16, 4096, 11);
    let mut runs = Vec::new();
    // Every launch is enqueued before any stream is waited for: the GPUs run together.
    for d in 0..n_gpus {
        let gpu = toga_harness::open(d).unwrap();
        let stream = gpu.new_stream().unwrap();
        let heap = Heap::new(&gpu, &stream, 1 << 30).unwrap();
        let w = Workloads::new(&gpu).unwrap();
        let d_sizes = stream.clone_htod(&sizes).unwrap();
        let mut ptrs = stream.alloc_zeros::<u64>(n as usize).unwrap();
        w.alloc_fill(&stream, &heap, &mut ptrs, &d_sizes, d as u32)
            .unwrap();
        let mut errors = stream.alloc_zeros::<u64>(2).unwrap();
        w.check_free(&stream, &heap, &ptrs, &d_sizes, d as u32, true, &mut errors)
            .unwrap();
        runs.push((gpu, stream, heap, errors));
    }
    for (gpu, stream, heap, errors) in &runs {
        assert_eq!(stream.clone_dtoh(errors).unwrap(), [0, 0]);
        let s = heap.stats(stream).unwrap();
        assert_eq!((s.mallocs, s.frees, s.live_blocks()), (n, n, 0));
        assert_eq!(heap.device(), gpu.info().ordinal);
        println!(
            "device {} ({}): 2^18 mallocs of 16–4096 B, checked and freed",
            gpu.info().ordinal,
            gpu.info().name
        );
    }
    println!("{n_gpus} GPU(s), one heap each, all at once");
}

/// A kernel on GPU 1 reads the pattern GPU 0 wrote into blocks of GPU 0's heap, writes its
/// own, and GPU 0 checks that and frees the blocks.
fn peer_round_trip(heap: &Heap, g0: &Gpu, g1: &Gpu, n: u64) {
    let (s0, s1) = (g0.new_stream().unwrap(), g1.new_stream().unwrap());
    g0.default_stream().synchronize().unwrap();
    let w0 = Workloads::new(g0).unwrap();
    let sizes32 = uniform_sizes(n, 16, 16 << 10, 5);
    let sizes: Vec<u64> = sizes32.iter().map(|&s| s as u64).collect();
    let d32 = s0.clone_htod(&sizes32).unwrap();
    let mut ptrs = s0.alloc_zeros::<u64>(n as usize).unwrap();
    w0.alloc_fill(&s0, heap, &mut ptrs, &d32, 1).unwrap();
    let host_ptrs = s0.clone_dtoh(&ptrs).unwrap();
    assert!(
        host_ptrs.iter().all(|&p| p != 0),
        "the heap serves every block"
    );
    let (p1, sz1) = (
        s1.clone_htod(&host_ptrs).unwrap(),
        s1.clone_htod(&sizes).unwrap(),
    );
    assert_eq!(
        common::host_pattern(g1, &s1, &p1, false, &sz1, 1, true),
        [0, 0],
        "GPU 1 reads"
    );
    assert_eq!(
        common::host_pattern(g1, &s1, &p1, false, &sz1, 2, false),
        [0, 0]
    );
    s1.synchronize().unwrap();
    let mut errors = s0.alloc_zeros::<u64>(2).unwrap();
    w0.check_free(&s0, heap, &ptrs, &d32, 2, true, &mut errors)
        .unwrap();
    assert_eq!(
        s0.clone_dtoh(&errors).unwrap(),
        [0, 0],
        "GPU 0 reads what GPU 1 wrote"
    );
    let s = heap.stats(&s0).unwrap();
    assert_eq!(s.live_blocks(), 0);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn a_peer_reads_and_writes_blocks_of_fixed_and_growable_heaps() {
    let Some((g0, g1)) = two_gpus("peer access") else {
        return;
    };
    let stream = g0.default_stream();
    if !can_access(0, 1) {
        match Heap::builder(64 << 20)
            .peer_access(&[1])
            .create(&g0, &stream)
        {
            Err(e @ Error::PeerAccess { .. }) => println!("SKIP: {e}"),
            Err(e) => panic!("peer access without peer support: {e}"),
            Ok(_) => panic!("peer access granted without peer support"),
        }
        return;
    }
    let fixed = Heap::builder(512 << 20)
        .peer_access(&[1])
        .create(&g0, &stream)
        .unwrap();
    peer_round_trip(&fixed, &g0, &g1, 1 << 14);
    println!("fixed heap on device 0: device 1 read and wrote 2^14 blocks of 16 B – 16 KiB");
    drop(fixed);

    // Granules mapped after the grant are granted too: the heap starts at 8 MiB and grows.
    let growable = Heap::growable()
        .initial_bytes(8 << 20)
        .max_bytes(2 << 30)
        .peer_access(&[1])
        .create(&g0, &stream)
        .unwrap();
    if !growable.is_growable() {
        println!("SKIP: the growable half: no virtual memory management on device 0");
        return;
    }
    peer_round_trip(&growable, &g0, &g1, 1 << 14);
    let s = growable.stats(&stream).unwrap();
    assert!(s.mapped_high > 8 << 20, "the heap grew: {s:?}");
    println!(
        "growable heap on device 0 grew to {} MiB: device 1 read and wrote every block",
        s.mapped_high >> 20
    );
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn a_free_from_another_gpu_is_refused_and_counted() {
    let Some((g0, g1)) = two_gpus("frees from another GPU") else {
        return;
    };
    let (s0, s1) = (g0.default_stream(), g1.default_stream());
    let heap0 = Heap::new(&g0, &s0, 256 << 20).unwrap();
    let heap1 = Heap::new(&g1, &s1, 64 << 20).unwrap();
    if can_access(0, 1) {
        heap0.set_peer_access(&[1]).unwrap();
    }
    // The host side refuses at once.
    match heap0.bind(g1.module(), &s1) {
        Err(e @ Error::WrongDevice { .. }) => println!("{e}"),
        other => panic!("bind to another device's module: {other:?}"),
    }
    assert!(matches!(
        heap0.alloc_async(64, &s1),
        Err(Error::WrongDevice { .. })
    ));

    // A kernel on GPU 1 frees GPU 0's blocks with `free`: that reaches heap1, bound on GPU 1,
    // which does not hold them. heap1 counts them; heap0 does not change.
    let n = 1u64 << 12;
    let w0 = Workloads::new(&g0).unwrap();
    let sizes = uniform_sizes(n, 16, 8192, 9);
    let d32 = s0.clone_htod(&sizes).unwrap();
    let mut ptrs = s0.alloc_zeros::<u64>(n as usize).unwrap();
    w0.alloc_fill(&s0, &heap0, &mut ptrs, &d32, 4).unwrap();
    let before = heap0.stats(&s0).unwrap();
    let on1 = s1.clone_htod(&s0.clone_dtoh(&ptrs).unwrap()).unwrap();
    let f = g1.function("toga_bound_free").unwrap();
    // SAFETY: `on1` holds `n` words.
    unsafe {
        s1.launch_builder(&f)
            .arg(&on1)
            .arg(&n)
            .launch(launch_config(n))
            .unwrap();
    }
    let s = heap1.stats(&s1).unwrap();
    assert_eq!(
        s.invalid_frees, n,
        "GPU 1's heap counts the frees it was given"
    );
    assert_eq!(s.frees, 0);
    let after = heap0.stats(&s0).unwrap();
    assert_eq!(after, before, "GPU 0's heap is untouched");
    let mut errors = s0.alloc_zeros::<u64>(2).unwrap();
    w0.check_free(&s0, &heap0, &ptrs, &d32, 4, true, &mut errors)
        .unwrap();
    assert_eq!(
        s0.clone_dtoh(&errors).unwrap(),
        [0, 0],
        "the blocks are intact"
    );
    let s = heap0.stats(&s0).unwrap();
    assert_eq!(s.live_blocks(), 0);
    println!(
        "2^12 frees from device 1 of device 0's blocks: counted by device 1's heap, device 0's heap untouched"
    );
}
