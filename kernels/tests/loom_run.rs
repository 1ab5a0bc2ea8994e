//! Loom model of a run of large blocks (`tbuddy::run`): lanes that take blocks, stock the
//! next run and flush it at once. Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p toga-kernels --release --test loom_run`.
//!
//! The oracle is INV(TB14): every block of every run installed is handed out once or given
//! back once by the swap that took its run out, never both, never neither.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;

use toga_kernels::tbuddy::PAGE_SHIFT;
use toga_kernels::tbuddy::run::{BlockRun, Leftover, RUN_BLOCKS, Take};

const SHIFT: u32 = PAGE_SHIFT + 1;
const RUN_BYTES: u64 = (RUN_BLOCKS as u64) << SHIFT;

/// What one thread saw: blocks handed to it and blocks its swaps gave back.
#[derive(Default)]
struct Seen {
    blocks: Vec<u64>,
    given_back: Vec<u64>,
}

impl Seen {
    fn give_back(&mut self, left: Option<Leftover>) {
        if let Some(left) = left {
            for i in 0..left.count as u64 {
                self.given_back.push(left.first + (i << SHIFT));
            }
        }
    }

    /// One large `malloc` of a lone lane; `next_run`: where a run this lane stocks starts
    /// (`None`: it finds no memory and parks the word).
    fn take(&mut self, run: &BlockRun, next_run: Option<u64>) {
        match run.take(SHIFT) {
            Take::Block(b) => self.blocks.push(b),
            Take::Stock => {
                let left = run.stock(next_run, SHIFT);
                self.give_back(left);
                // The stocker keeps the run's first block.
                self.blocks.extend(next_run);
            }
            Take::Elsewhere => {}
        }
    }
}

/// A run with one block left; two lanes take (one of them stocks the next run, each stock at
/// its own address; thread 1's first stock finds no memory and parks the word) while a trim
/// flushes. In the end every block of every run that was
/// installed is accounted for exactly once.
#[test]
fn takes_stocks_and_a_flush_hand_out_or_give_back_every_block_once() {
    loom::model(|| {
        let run = Arc::new(BlockRun::new());
        // Setup: run 0 installed, all but its last block handed out.
        assert_eq!(run.take(SHIFT), Take::Stock);
        assert_eq!(run.stock(Some(0), SHIFT), None);
        for _ in 2..RUN_BLOCKS {
            assert!(matches!(run.take(SHIFT), Take::Block(_)));
        }
        let mut handles = Vec::new();
        for t in 1..=2u64 {
            let run = run.clone();
            handles.push(thread::spawn(move || {
                let mut seen = Seen::default();
                // Thread 1 finds no memory for its first run and parks the word.
                seen.take(&run, (t == 2).then_some(t * RUN_BYTES));
                seen.take(&run, Some(t * RUN_BYTES + 16 * RUN_BYTES));
                seen
            }));
        }
        let flusher = {
            let run = run.clone();
            thread::spawn(move || {
                let mut seen = Seen::default();
                seen.give_back(run.flush(SHIFT));
                seen
            })
        };
        let mut all: Vec<Seen> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        all.push(flusher.join().unwrap());
        // The last trim.
        let mut last = Seen::default();
        last.give_back(run.flush(SHIFT));
        all.push(last);

        // Every run that was installed: run 0, and each stocker's (its first block).
        let mut runs = vec![0u64];
        let mut out: Vec<u64> = (0..RUN_BLOCKS as u64 - 1).map(|i| i << SHIFT).collect();
        for seen in &all {
            for &b in &seen.blocks {
                if b % RUN_BYTES == 0 && b != 0 {
                    runs.push(b);
                }
            }
            out.extend(&seen.blocks);
            out.extend(&seen.given_back);
        }
        out.sort_unstable();
        let mut want: Vec<u64> = runs
            .iter()
            .flat_map(|&r| (0..RUN_BLOCKS as u64).map(move |i| r + (i << SHIFT)))
            .collect();
        want.sort_unstable();
        assert_eq!(
            out, want,
            "each block handed out or given back exactly once"
        );
    });
}
