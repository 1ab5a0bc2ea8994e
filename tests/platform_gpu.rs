//! Litmus tests of the platform layer on a real GPU (ignored without `--include-ignored`).

mod common;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use toga::launch_config;

const GRID_THREADS: u64 = 1 << 20;

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn smoke_kernel_writes_every_element() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let n = 100_003u32;
    let mut out = stream.alloc_zeros::<u32>(n as usize).unwrap();
    let mut count = stream.alloc_zeros::<u32>(1).unwrap();
    let f = gpu.function("toga_smoke").unwrap();
    // SAFETY: `out` has `n` elements, `count` one (toga_smoke's contract).
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&mut out)
            .arg(&mut count)
            .arg(&n)
            .launch(launch_config(n as u64))
            .unwrap();
    }
    let out = stream.clone_dtoh(&out).unwrap();
    let count = stream.clone_dtoh(&count).unwrap();
    assert_eq!(count[0], n);
    for (i, v) in out.iter().enumerate() {
        assert_eq!(*v, i as u32 * 3 + 1, "element {i}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn message_passing_release_acquire_has_no_stale_reads() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let blocks = 2 * gpu.info().sm_count * 2; // writer and reader blocks interleaved
    let block = 256u32;
    let slots = (blocks / 2 * block) as usize;
    let rounds = 2_000u32;
    let f = gpu.function("toga_litmus_message_passing").unwrap();
    let mut total_trials = 0u64;
    let mut total_stale = 0u64;
    // Repeat until at least 10^7 reader trials saw a published flag.
    while total_trials < 10_000_000 {
        let mut data = stream.alloc_zeros::<u32>(slots).unwrap();
        let mut flag = stream.alloc_zeros::<u32>(slots).unwrap();
        let mut result = stream.alloc_zeros::<u64>(2).unwrap();
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: data/flag have blocks/2*block slots, result two (kernel contract).
        unsafe {
            stream
                .launch_builder(&f)
                .arg(&mut data)
                .arg(&mut flag)
                .arg(&mut result)
                .arg(&rounds)
                .launch(cfg)
                .unwrap();
        }
        let r = stream.clone_dtoh(&result).unwrap();
        total_stale += r[0];
        total_trials += r[1];
        assert!(
            r[1] > 0,
            "readers never saw a flag: the test would prove nothing"
        );
    }
    eprintln!("message passing: {total_trials} trials, {total_stale} stale reads");
    assert_eq!(total_stale, 0, "stale reads after acquire");
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn atomics_are_exact_under_full_grid_contention() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let n = GRID_THREADS;
    let mut words = stream.clone_htod(&[0u64, 0, u64::MAX, 0, 0, 0]).unwrap();
    let mut words32 = stream.alloc_zeros::<u32>(1).unwrap();
    let mut exch = stream.alloc_zeros::<u64>(n as usize).unwrap();
    let bit_words = n.div_ceil(64) as usize;
    let mut bits_or = stream.alloc_zeros::<u64>(bit_words).unwrap();
    let mut bits_and = stream.clone_htod(&vec![u64::MAX; bit_words]).unwrap();
    let f = gpu.function("toga_litmus_atomics").unwrap();
    // SAFETY: sizes per toga_litmus_atomics' contract.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&mut words)
            .arg(&mut words32)
            .arg(&mut exch)
            .arg(&mut bits_or)
            .arg(&mut bits_and)
            .arg(&n)
            .launch(launch_config(n))
            .unwrap();
    }
    let w = stream.clone_dtoh(&words).unwrap();
    let w32 = stream.clone_dtoh(&words32).unwrap();
    let exch = stream.clone_dtoh(&exch).unwrap();
    let or = stream.clone_dtoh(&bits_or).unwrap();
    let and = stream.clone_dtoh(&bits_and).unwrap();
    let key = |i: u64| ((i * 2_654_435_761) & 0xffff_ffff) + 1;
    assert_eq!(w[0], n * (n + 1) / 2, "atom.add");
    assert_eq!(w[1], n, "CAS-loop increments");
    assert_eq!(w[2], (0..n).map(key).min().unwrap(), "atom.min");
    assert_eq!(w[3], (0..n).map(key).max().unwrap(), "atom.max");
    assert_eq!(
        w[5], 0,
        "fetch_or/fetch_and returned a bit in the wrong state"
    );
    assert_eq!(w32[0] as u64, n, "32-bit atom.add");
    assert!(or.iter().all(|&x| x == u64::MAX), "atom.or lost a bit");
    assert!(and.iter().all(|&x| x == 0), "atom.and lost a bit");
    // exch: the values swapped out plus the final value are each of 0..=n exactly once.
    let mut seen = vec![false; n as usize + 1];
    for v in exch.iter().copied().chain([w[4]]) {
        assert!(!seen[v as usize], "exch returned {v} twice");
        seen[v as usize] = true;
    }
    assert!(seen.iter().all(|&s| s));
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn warp_collectives_match_cpu_expectation_on_divergent_masks() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let n = GRID_THREADS as usize;
    let mut out = stream.alloc_zeros::<u32>(6 * n).unwrap();
    let f = gpu.function("toga_litmus_warp").unwrap();
    // SAFETY: six slots per thread; the grid is a multiple of 32.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&mut out)
            .launch(launch_config(n as u64))
            .unwrap();
    }
    let out = stream.clone_dtoh(&out).unwrap();
    let pred = |i: usize| ((i as u32).wrapping_mul(0x9E37_79B9) >> 29) != 0;
    let mut checked_lanes = 0u64;
    for warp in 0..n / 32 {
        let mask: u32 = (0..32)
            .filter(|&l| pred(warp * 32 + l))
            .fold(0, |m, l| m | 1 << l);
        let leader = mask.trailing_zeros();
        for lane in 0..32u32 {
            let i = warp * 32 + lane as usize;
            let got = &out[6 * i..6 * i + 6];
            if mask & (1 << lane) == 0 {
                assert!(
                    got.iter().all(|&v| v == u32::MAX),
                    "lane {i} did not take part"
                );
                continue;
            }
            checked_lanes += 1;
            assert_eq!(got[5], mask, "ballot mask, thread {i}");
            assert_ne!(
                got[0] & (1 << lane),
                0,
                "activemask lacks own lane, thread {i}"
            );
            assert_eq!(
                got[0] & !mask,
                0,
                "activemask has lanes outside the branch, thread {i}"
            );
            let ballot = (0..32)
                .filter(|l| mask & (1 << l) != 0 && l % 3 == 0)
                .fold(0, |m, l| m | 1 << l);
            assert_eq!(got[1], ballot, "ballot, thread {i}");
            let matched = (0..32)
                .filter(|l| mask & (1 << l) != 0 && l % 5 == lane % 5)
                .fold(0, |m, l| m | 1 << l);
            assert_eq!(got[2], matched, "match.any, thread {i}");
            assert_eq!(
                got[3],
                leader * 10 + 7,
                "shfl.idx from the leader, thread {i}"
            );
            if lane < 31 && mask & (1 << (lane + 1)) != 0 {
                assert_eq!(got[4], (lane + 1) * 10 + 7, "shfl.down, thread {i}");
            } else if lane == 31 {
                assert_eq!(
                    got[4],
                    lane * 10 + 7,
                    "shfl.down past lane 31 keeps own value"
                );
            }
        }
    }
    assert!(checked_lanes > n as u64 / 2);
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn smid_is_in_range() {
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let n = GRID_THREADS as usize;
    let mut out = stream.alloc_zeros::<u32>(2 * n).unwrap();
    let f = gpu.function("toga_litmus_smid").unwrap();
    // SAFETY: two slots per thread.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&mut out)
            .launch(launch_config(n as u64))
            .unwrap();
    }
    let out = stream.clone_dtoh(&out).unwrap();
    let sms = gpu.info().sm_count;
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..n {
        let (smid, nsmid) = (out[2 * i], out[2 * i + 1]);
        assert!(nsmid >= sms, "%nsmid {nsmid} below the SM count {sms}");
        assert!(smid < nsmid, "%smid {smid} >= %nsmid {nsmid}");
        seen.insert(smid);
    }
    assert!(
        seen.len() as u32 <= sms,
        "{} distinct SM ids on {sms} SMs",
        seen.len()
    );
    assert!(seen.len() > 1, "a 2^20-thread grid ran on one SM");
}
