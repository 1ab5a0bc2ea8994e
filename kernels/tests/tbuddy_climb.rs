//! Many threads climbing a large fresh tree at once: the GPU's first chunk requests.
#![cfg(not(loom))]

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use toga_kernels::platform::Atomic32;
use toga_kernels::tbuddy::{TBuddy, TBuddyHeader};

fn tree(max_order: u32) -> (Box<TBuddyHeader>, Vec<Atomic32>) {
    let header = Box::new(TBuddyHeader::new());
    let nodes = (0..TBuddy::node_words(max_order))
        .map(|_| Atomic32::new(0))
        .collect();
    (header, nodes)
}

#[test]
fn many_threads_climb_a_fresh_large_tree_at_once() {
    const THREADS: usize = 48;
    let max_order = 18;
    let (header, nodes) = tree(max_order);
    let (header, nodes): (&'static TBuddyHeader, &'static [Atomic32]) =
        (Box::leak(header), nodes.leak());
    TBuddy::new(header, nodes).init(1 << max_order);
    for round in 0..20 {
        let start = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let start = start.clone();
                std::thread::spawn(move || {
                    let b = TBuddy::new(header, nodes);
                    start.wait();
                    let order = [7, 7, 0, 3, 7, 12][(t + round) % 6];
                    let deadline = Instant::now() + Duration::from_secs(20);
                    let got = b.alloc(order);
                    assert!(Instant::now() < deadline, "alloc({order}) took over 20 s");
                    (got.expect("plenty of memory"), order)
                })
            })
            .collect();
        let blocks: Vec<(u64, u32)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let b = TBuddy::new(header, nodes);
        for (off, order) in blocks {
            b.free(off, order);
        }
        b.assert_valid();
        assert_eq!(b.available_pages(), 1 << max_order, "round {round}");
    }
}
