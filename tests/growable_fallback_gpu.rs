//! A growable heap where the driver lacks virtual memory management (forced with
//! `TOGA_NO_VMM`): a fixed heap of the maximum, with a notice, and no panic. Its own test
//! binary, because the variable is process-wide.

mod common;

use toga::{Error, Heap};

#[test]
#[ignore = "needs a CUDA GPU: cargo test -- --include-ignored"]
fn without_vmm_a_growable_heap_is_a_fixed_heap_of_its_maximum() {
    // SAFETY: the only test in this binary, set before any thread reads the environment.
    unsafe { std::env::set_var("TOGA_NO_VMM", "1") };
    let gpu = common::gpu();
    let stream = gpu.default_stream();
    let heap = Heap::growable()
        .max_bytes(64 << 20)
        .create(&gpu, &stream)
        .unwrap();
    assert!(!heap.is_growable());
    assert_eq!(heap.capacity(), 64 << 20);
    assert!(matches!(
        heap.grow(&stream, 1 << 20),
        Err(Error::NotGrowable)
    ));
    let w = toga_harness::Workloads::new(&gpu).unwrap();
    let mut ptrs = stream.alloc_zeros::<u64>(1 << 16).unwrap();
    w.malloc(&stream, Some(&heap), &mut ptrs, 256).unwrap();
    let host = stream.clone_dtoh(&ptrs).unwrap();
    assert!(host.iter().all(|&p| p != 0));
    w.free(&stream, Some(&heap), &ptrs).unwrap();
    assert_eq!(heap.stats(&stream).unwrap().live_blocks(), 0);
}
