//! A deep tree (max order 18: a four-layer availability index, as a 1 GiB heap has on the GPU):
//! many one-page allocations from threads at once, every page handed out once, and back.
use std::collections::HashSet;
use std::sync::{Arc, Barrier};
use std::thread;

use toga_kernels::platform::Atomic32;
use toga_kernels::tbuddy::{TBuddy, TBuddyHeader};

mod common;

const MAX_ORDER: u32 = 18;

#[test]
fn deep_tree_pages_from_many_threads() {
    common::with_deadline(|| {
        let header = Arc::new(TBuddyHeader::new());
        let nodes: Arc<Vec<Atomic32>> = Arc::new(
            (0..TBuddy::node_words(MAX_ORDER))
                .map(|_| Atomic32::new(0))
                .collect(),
        );
        TBuddy::new(&header, &nodes).init(1 << MAX_ORDER);
        const THREADS: usize = 16;
        const PER_THREAD: usize = 2048;
        let barrier = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (header, nodes, barrier) = (header.clone(), nodes.clone(), barrier.clone());
                thread::spawn(move || {
                    let tree = TBuddy::new(&header, &nodes);
                    barrier.wait();
                    (0..PER_THREAD)
                        .map(|i| {
                            let order = ((t + i) % 3) as u32;
                            (tree.alloc(order).expect("the heap has room"), order)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let blocks: Vec<(u64, u32)> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        let mut pages = HashSet::new();
        for &(offset, order) in &blocks {
            for p in 0..1u64 << order {
                assert!(pages.insert((offset >> 12) + p), "page handed out twice");
            }
        }
        let tree = TBuddy::new(&header, &nodes);
        for &(offset, order) in &blocks {
            tree.free(offset, order);
        }
        tree.assert_valid();
        assert_eq!(tree.alloc(MAX_ORDER), Some(0), "the whole heap again");
    });
}
