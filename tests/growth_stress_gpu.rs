//! Growable heaps under stress on a real GPU (ignored without `--include-ignored`): a heap at its
//! maximum against a fixed heap of that size, and four kernels on four streams growing one heap
//! for many rounds of grow, free and trim, one of them while another host thread maps and
//! unmaps device memory of its own. Every round has a deadline, every block is
//! pattern-checked, and the counts are exact.
//!
//! `TOGA_STRESS_ROUNDS` lowers the rounds (under compute-sanitizer, which runs every kernel
//! far slower).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use toga::{Gpu, Heap, HeapStats};
use toga_harness::{Workloads, block_bytes, time_ms, uniform_sizes};

const MIB: u64 = 1 << 20;

/// A round that takes longer than this has hung (a round takes well under a second).
const ROUND_DEADLINE: Duration = Duration::from_secs(60);

/// Run `f` on a helper thread; panic if it does not finish by [`ROUND_DEADLINE`].
fn within_deadline<T: Send + 'static>(what: String, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let v = f();
        let _ = tx.send(());
        v
    });
    match rx.recv_timeout(ROUND_DEADLINE) {
        Ok(()) => handle.join().expect("round thread panicked"),
        Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Ok(_) => unreachable!("sender dropped without sending"),
            Err(e) => std::panic::resume_unwind(e),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: hung for {ROUND_DEADLINE:?}"),
    }
}

fn rounds(default: usize) -> usize {
    std::env::var("TOGA_STRESS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Blocks `(address, bytes)` of the non-null pointers, sorted; panics if two overlap.
fn assert_disjoint(mut spans: Vec<(u64, u64)>) {
    spans.sort_unstable();
    for pair in spans.windows(2) {
        assert!(
            pair[0].0 + pair[0].1 <= pair[1].0,
            "blocks overlap: {pair:x?}"
        );
    }
}

/// One fill of `sizes` on `heap`: the malloc kernel's GPU time (ms), the pointers, and the
/// bytes served (rounded block sizes, and requested sizes).
struct Fill {
    ms: f32,
    ptrs: CudaSlice<u64>,
    host: Vec<u64>,
    served_blocks: u64,
    served_requested: u64,
}

fn fill(w: &Workloads, stream: &Arc<CudaStream>, heap: &Heap, sizes: &[u32], tag: u32) -> Fill {
    let d_sizes = stream.clone_htod(sizes).unwrap();
    let mut ptrs = stream.alloc_zeros::<u64>(sizes.len()).unwrap();
    let ms = time_ms(stream, || {
        w.alloc_fill(stream, heap, &mut ptrs, &d_sizes, tag)
    })
    .unwrap();
    let host = stream.clone_dtoh(&ptrs).unwrap();
    let served = host.iter().zip(sizes).filter(|(p, _)| **p != 0);
    let served_blocks = served.clone().map(|(_, &s)| block_bytes(s)).sum();
    let served_requested = served.map(|(_, &s)| s as u64).sum();
    Fill {
        ms,
        ptrs,
        host,
        served_blocks,
        served_requested,
    }
}

/// Where a quiescent heap's memory is (`toga_heap_census`, one thread), printed with `what`.
fn census(gpu: &Gpu, stream: &Arc<CudaStream>, heap: &Heap, what: &str) {
    let f = gpu.function("toga_heap_census").unwrap();
    let mut out = stream.alloc_zeros::<u64>(24).unwrap();
    let base = heap.base();
    // SAFETY: the heap is quiescent and `out` holds a `HeapCensus` (24 words).
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&base)
            .arg(&mut out)
            .launch(LaunchConfig::for_num_elems(1))
            .unwrap();
    }
    let c = stream.clone_dtoh(&out).unwrap();
    let s = heap.stats(stream).unwrap();
    let mb = |b: u64| b as f64 / 1e6;
    println!(
        "census {what}: tree free {:.1} MB, {} chunks ({:.1} MB, {} free bins), {} large blocks \
         ({:.1} MB), stashed {:.1} MB; reserved {:.1} MB, used {:.1} MB; bins: {} carved, {} empty \
         ({} listed), {} of runs; {} free slots, {} semaphore units; chunks by carved bins: small {:?}, \
         large {:?}",
        mb(c[0]),
        c[1],
        mb(c[1] << 19),
        c[2],
        c[3],
        mb(c[4]),
        mb(c[5]),
        mb(s.reserved_bytes),
        mb(s.used_bytes),
        c[6],
        c[7],
        c[8],
        c[9],
        c[10],
        c[11],
        &c[12..18],
        &c[18..24]
    );
}

/// Check every block's pattern and free it; panics on a wrong word.
fn check_and_free(
    w: &Workloads,
    stream: &Arc<CudaStream>,
    heap: &Heap,
    f: &Fill,
    sizes: &[u32],
    tag: u32,
) {
    let d_sizes = stream.clone_htod(sizes).unwrap();
    let mut errors = stream.alloc_zeros::<u64>(2).unwrap();
    w.check_free(stream, heap, &f.ptrs, &d_sizes, tag, true, &mut errors)
        .unwrap();
    assert_eq!(stream.clone_dtoh(&errors).unwrap()[0], 0, "pattern errors");
}

/// The counts a fill must leave: one malloc per block, one failure per null, and the blocks'
/// bytes in use.
fn assert_counts(s: &HeapStats, f: &Fill, sizes: &[u32]) {
    let served = f.host.iter().filter(|&&p| p != 0).count() as u64;
    assert_eq!(s.mallocs, served, "{s:?}");
    assert_eq!(s.failed_allocations, sizes.len() as u64 - served, "{s:?}");
    assert_eq!(s.live_blocks(), served, "{s:?}");
    assert_eq!(s.used_bytes, f.served_blocks, "{s:?}");
    assert_eq!(s.invalid_frees + s.double_frees, 0, "{s:?}");
}

/// 2^17 threads ask for mixed 16 B – 64 KiB, about twice the maximum (2 GiB): a growable heap
/// that starts at 8 MiB grows inside the kernel up to its maximum and then serves at least 95%
/// of it, with exact counts and no two blocks overlapping, like a fixed heap of that size. The
/// kernels' times are printed for `docs/benchmarks.md` (the medians of five fills each); they
/// are not asserted here.
#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn a_growable_heap_at_its_maximum_serves_what_a_fixed_heap_does() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let w = Workloads::new(&gpu).unwrap();
    let max = 2u64 << 30;
    let sizes = uniform_sizes(1 << 17, 16, 65536, 11);
    let asked: u64 = sizes.iter().map(|&s| block_bytes(s)).sum();
    assert!(asked >= 2 * max - max / 8, "asks about twice the maximum");
    const RUNS: usize = 5;
    let mut times = (Vec::new(), Vec::new());
    let mut served = (Vec::new(), Vec::new());
    for run in 0..RUNS {
        // The fixed heap of the maximum's size.
        let fixed = Heap::new(&gpu, &stream, max).unwrap();
        let f = fill(&w, &stream, &fixed, &sizes, 1);
        if run == 0 {
            census(&gpu, &stream, &fixed, "fixed after the fill");
        }
        let fs = fixed.stats(&stream).unwrap();
        assert_counts(&fs, &f, &sizes);
        println!(
            "at-max run {run}: fixed    served {:.1}%, {fs:?}",
            f.served_blocks as f64 * 100.0 / max as f64
        );
        check_and_free(&w, &stream, &fixed, &f, &sizes, 1);
        times.0.push(f.ms);
        served.0.push((f.served_blocks, f.served_requested));
        fixed.destroy(&stream).unwrap();
        // The growable heap, from 8 MiB.
        let heap = Arc::new(
            Heap::growable()
                .initial_bytes(8 * MIB)
                .max_bytes(max)
                .create(&gpu, &stream)
                .unwrap(),
        );
        let g = within_deadline(format!("growable fill {run}"), {
            let (w, stream, sizes, heap) = (
                Workloads::new(&gpu).unwrap(),
                stream.clone(),
                sizes.clone(),
                heap.clone(),
            );
            move || fill(&w, &stream, &heap, &sizes, 2)
        });
        if run == 0 {
            census(&gpu, &stream, &heap, "growable after the fill");
            heap.trim(&stream).unwrap();
            census(&gpu, &stream, &heap, "growable after a trim");
        }
        let s = heap.stats(&stream).unwrap();
        println!(
            "at-max run {run}: growable served {:.1}%, {s:?}",
            g.served_blocks as f64 * 100.0 / max as f64
        );
        assert_counts(&s, &g, &sizes);
        assert_eq!(s.mapped_bytes, max, "grew to its maximum: {s:?}");
        assert!(s.kernel_grow_failures >= 1, "{s:?}");
        assert_disjoint(
            g.host
                .iter()
                .zip(&sizes)
                .filter(|(p, _)| **p != 0)
                .map(|(&p, &s)| (p, block_bytes(s)))
                .collect(),
        );
        check_and_free(&w, &stream, &heap, &g, &sizes, 2);
        times.1.push(g.ms);
        served.1.push((g.served_blocks, g.served_requested));
        let heap = Arc::try_unwrap(heap).unwrap_or_else(|_| panic!("the fill's thread is done"));
        heap.destroy(&stream).unwrap();
    }
    // Diagnostic: the same fill on a growable heap grown to its maximum by the host first.
    {
        let heap = Heap::growable()
            .initial_bytes(8 * MIB)
            .max_bytes(max)
            .create(&gpu, &stream)
            .unwrap();
        heap.grow(&stream, max - 8 * MIB).unwrap();
        let g = fill(&w, &stream, &heap, &sizes, 3);
        census(&gpu, &stream, &heap, "growable grown first, after the fill");
        println!(
            "at-max: growable grown by the host first: served {:.1}%, {:.3} ms, {:?}",
            g.served_blocks as f64 * 100.0 / max as f64,
            g.ms,
            heap.stats(&stream).unwrap()
        );
        check_and_free(&w, &stream, &heap, &g, &sizes, 3);
        heap.destroy(&stream).unwrap();
    }
    let median = |v: &mut Vec<f32>| {
        v.sort_by(f32::total_cmp);
        v[v.len() / 2]
    };
    let (fixed_ms, growable_ms) = (median(&mut times.0), median(&mut times.1));
    let pct = |(b, r): (u64, u64)| (b as f64 * 100.0 / max as f64, r as f64 * 100.0 / max as f64);
    let (fb, fr) = pct(served.0[0]);
    let (gb, gr) = pct(served.1[0]);
    println!(
        "at-max: 2^17 threads, 16 B - 64 KiB, {:.2} GiB asked of a {} GiB maximum, {RUNS} runs",
        asked as f64 / (1u64 << 30) as f64,
        max >> 30
    );
    println!(
        "at-max: fixed    malloc kernel median {fixed_ms:.3} ms (all {:?}), served {fb:.1}% in blocks, {fr:.1}% requested",
        times.0
    );
    println!(
        "at-max: growable malloc kernel median {growable_ms:.3} ms (all {:?}), served {gb:.1}% in blocks, {gr:.1}% requested, {:.2}x the fixed heap's time",
        times.1,
        growable_ms / fixed_ms
    );
    for (run, &(blocks, _)) in served.1.iter().enumerate() {
        assert!(
            blocks >= max / 100 * 95,
            "run {run}: the growable heap served {:.1}% of its maximum",
            blocks as f64 * 100.0 / max as f64
        );
    }
}

/// A host thread that maps and unmaps device memory of its own until told to stop: the
/// driver's page tables change while the heap's kernels run and grow.
fn churn_device_memory(gpu: &Gpu, stop: Arc<AtomicBool>, cycles: Arc<AtomicU64>) {
    let ctx = gpu.context().clone();
    std::thread::spawn(move || {
        ctx.bind_to_thread().unwrap();
        let stream = ctx.new_stream().unwrap();
        while !stop.load(Ordering::Relaxed) {
            let buf = stream.alloc_zeros::<u8>(64 << 20).unwrap();
            stream.synchronize().unwrap();
            drop(buf);
            cycles.fetch_add(1, Ordering::Relaxed);
        }
    });
}

/// Four kernels on four streams fill one growable heap at once (2^15 threads each, mixed
/// 16 B – 4 KiB), each round: check and free on the same streams, then `synchronize` trims the
/// heap back to its release threshold. `in_kernel`: the kernels grow the heap themselves;
/// otherwise the host grows it before each round (the form compute-sanitizer's memcheck can
/// follow). Round `rounds / 2` runs while another host thread maps and unmaps its own device
/// memory. Every round: no null, exact counts, no overlap across the streams, patterns intact,
/// and the heap back at its threshold.
fn four_streams_grow_one_heap(in_kernel: bool) {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let initial = 8 * MIB;
    let heap = Arc::new(
        Heap::growable()
            .initial_bytes(initial)
            .max_bytes(1 << 30)
            .grow_in_kernel(in_kernel)
            .create(&gpu, &stream)
            .unwrap(),
    );
    let streams: Vec<Arc<CudaStream>> = (0..4).map(|_| gpu.new_stream().unwrap()).collect();
    let sizes: Vec<Vec<u32>> = (0..4)
        .map(|i| uniform_sizes(1 << 15, 16, 4096, 100 + i))
        .collect();
    let asked: u64 = sizes.iter().flatten().map(|&s| block_bytes(s)).sum();
    let total = rounds(50);
    let mut grows = 0;
    for round in 0..total {
        let churn = round == total / 2;
        let stop = Arc::new(AtomicBool::new(false));
        let cycles = Arc::new(AtomicU64::new(0));
        if churn {
            churn_device_memory(&gpu, stop.clone(), cycles.clone());
        }
        if !in_kernel {
            heap.grow(&stream, asked + asked / 2).unwrap();
        }
        let before = heap.stats(&stream).unwrap();
        let fills = within_deadline(format!("round {round}: fills"), {
            let (heap, streams, sizes) = (heap.clone(), streams.clone(), sizes.clone());
            let w = Workloads::new(&gpu).unwrap();
            move || {
                let tag = |i: usize| (round * 4 + i) as u32;
                // Enqueue all four fills before reading any back: they run together.
                let mut pending = Vec::new();
                for (i, s) in streams.iter().enumerate() {
                    let d_sizes = s.clone_htod(&sizes[i]).unwrap();
                    let mut ptrs = s.alloc_zeros::<u64>(sizes[i].len()).unwrap();
                    w.alloc_fill(s, &heap, &mut ptrs, &d_sizes, tag(i)).unwrap();
                    pending.push((ptrs, d_sizes));
                }
                let hosts: Vec<Vec<u64>> = pending
                    .iter()
                    .zip(&streams)
                    .map(|((p, _), s)| s.clone_dtoh(p).unwrap())
                    .collect();
                (pending, hosts)
            }
        });
        let (pending, hosts) = fills;
        let mut spans = Vec::new();
        for (i, host) in hosts.iter().enumerate() {
            let nulls = host.iter().filter(|&&p| p == 0).count();
            assert_eq!(nulls, 0, "round {round}, stream {i}");
            spans.extend(
                host.iter()
                    .zip(&sizes[i])
                    .map(|(&p, &s)| (p, block_bytes(s))),
            );
        }
        assert_disjoint(spans);
        let s = heap.stats(&stream).unwrap();
        let n: u64 = sizes.iter().map(|v| v.len() as u64).sum();
        assert_eq!(s.mallocs - before.mallocs, n, "round {round}: {s:?}");
        assert_eq!(s.live_blocks(), n, "round {round}: {s:?}");
        assert_eq!(s.used_bytes, asked, "round {round}: {s:?}");
        assert_eq!(s.failed_allocations, 0, "round {round}: {s:?}");
        assert_eq!(s.kernel_grow_failures, 0, "round {round}: {s:?}");
        assert_eq!(s.invalid_frees + s.double_frees, 0, "round {round}: {s:?}");
        grows += s.kernel_grows - before.kernel_grows;
        within_deadline(format!("round {round}: frees and trim"), {
            let (heap, streams, stream) = (heap.clone(), streams.clone(), stream.clone());
            let w = Workloads::new(&gpu).unwrap();
            move || {
                let mut errors = Vec::new();
                for (i, s) in streams.iter().enumerate() {
                    let mut e = s.alloc_zeros::<u64>(2).unwrap();
                    let (ptrs, d_sizes) = &pending[i];
                    w.check_free(
                        s,
                        &heap,
                        ptrs,
                        d_sizes,
                        (round * 4 + i) as u32,
                        true,
                        &mut e,
                    )
                    .unwrap();
                    errors.push(e);
                }
                for (i, s) in streams.iter().enumerate() {
                    let e = s.clone_dtoh(&errors[i]).unwrap();
                    assert_eq!(e[0], 0, "round {round}, stream {i}: pattern errors");
                    s.synchronize().unwrap();
                }
                heap.synchronize(&stream).unwrap();
            }
        });
        stop.store(true, Ordering::Relaxed);
        let after = heap.stats(&stream).unwrap();
        assert_eq!(after.live_blocks(), 0, "round {round}: {after:?}");
        assert_eq!(after.used_bytes, 0, "round {round}: {after:?}");
        assert_eq!(after.frees, after.mallocs, "round {round}: {after:?}");
        assert_eq!(
            after.mapped_bytes, initial,
            "round {round}: back at the threshold"
        );
        if churn {
            println!(
                "round {round}: another thread mapped and unmapped 64 MiB {} times meanwhile",
                cycles.load(Ordering::Relaxed)
            );
        }
    }
    if in_kernel {
        assert!(
            grows >= total as u64,
            "every round grew in the kernel: {grows}"
        );
    }
    println!("{total} rounds, {grows} growths inside the kernels");
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn four_streams_grow_one_heap_in_their_kernels() {
    four_streams_grow_one_heap(true);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn four_streams_share_one_heap_grown_from_the_host() {
    four_streams_grow_one_heap(false);
}
