//! Loom model of a run of large blocks (`tbuddy::run`): lanes that take blocks, stock the
//! next run and flush it at once. Run with
//! `RUSTFLAGS="--cfg loom -C debug-assertions=on" LOOM_MAX_PREEMPTIONS=2 cargo test -p toga-kernels --release --test loom_run`.
//!
//! The oracle is INV(TB14): every block of every run installed is handed out once or given
//! back once by the swap that took its run out, never both, never neither.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;

use toga_kernels::tbuddy::PAGE_SHIFT;
use toga_kernels::tbuddy::run::{BlockRun, Leftover, Take};

const SHIFT: u32 = PAGE_SHIFT + 1;
/// log2 of the blocks in a run of these models (a heap's runs hold 4 to 128).
const L: u32 = 4;
const RUN_BLOCKS: u32 = 1 << L;
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
                let left = run.stock(next_run, SHIFT, L);
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
        assert_eq!(run.stock(Some(0), SHIFT, L), None);
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

mod groups {
    use loom::sync::Arc;
    use loom::thread;

    use toga_kernels::run::{Leftover, Run, Takes};

    /// Items per run.
    const ITEMS: u32 = 4;

    /// What one group saw: items handed to it (base × 100 + index) and items its swaps gave
    /// back.
    #[derive(Default)]
    struct Seen {
        items: Vec<u64>,
        given_back: Vec<u64>,
    }

    impl Seen {
        fn give_back(&mut self, left: Option<Leftover>) {
            if let Some(left) = left {
                let first = left.first as u64;
                self.given_back
                    .extend((first..first + left.count as u64).map(|i| left.base * 100 + i));
            }
        }

        /// This group stocks: installs run `next` and keeps its first `k` items, or (`None`:
        /// its bins were not fit for a run) empties the word and goes elsewhere.
        fn stock(&mut self, run: &Run, k: u32, next: Option<u64>) {
            match next {
                Some(base) => {
                    let left = run.stock(Some(base), k, ITEMS);
                    self.give_back(left);
                    self.items.extend((0..k as u64).map(|i| base * 100 + i));
                }
                None => {
                    let left = run.clear(ITEMS);
                    self.give_back(left);
                }
            }
        }

        /// A group of `k` lanes takes its items; a busy word is waited for.
        fn take(&mut self, run: &Run, k: u32, next: Option<u64>) {
            loop {
                match run.take_many(k, ITEMS) {
                    Takes::Items {
                        base,
                        first,
                        n,
                        stock,
                    } => {
                        let first = first as u64;
                        self.items
                            .extend((first..first + n as u64).map(|i| base * 100 + i));
                        if stock {
                            self.stock(run, k, next);
                        }
                        return;
                    }
                    Takes::Stock => return self.stock(run, k, next),
                    Takes::Busy(seen) => run.wait_for_stock(seen),
                    Takes::Parked => return,
                }
            }
        }
    }

    /// Two groups of two take from `run` side by side: thread 1 empties the word when it
    /// stocks, thread 2 installs run 20. Then a trim flushes. Returns every item handed out
    /// or given back, sorted.
    fn two_groups_take(run: &Arc<Run>) -> Vec<u64> {
        let handles: Vec<_> = [None, Some(20u64)]
            .into_iter()
            .map(|next| {
                let run = run.clone();
                thread::spawn(move || {
                    let mut seen = Seen::default();
                    seen.take(&run, 2, next);
                    seen
                })
            })
            .collect();
        let mut all: Vec<Seen> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let mut last = Seen::default();
        last.give_back(run.flush(ITEMS));
        all.push(last);
        let mut out: Vec<u64> = Vec::new();
        for seen in &all {
            out.extend(&seen.items);
            out.extend(&seen.given_back);
        }
        out.sort_unstable();
        out
    }

    /// A run with one item left; two groups of two take side by side. Thread 1's add, if it
    /// crosses the end or finds the word empty, empties the word (its bins were not fit for a
    /// run); thread 2 installs run 20. Whoever waits for the other's stock must see the swap,
    /// also the emptying of an empty word, which changes only the count (waiters that watched
    /// the upper bits alone never woke). In the end every item of every run installed was
    /// handed out or given back exactly once.
    #[test]
    fn groups_cross_the_end_and_waiters_see_every_swap() {
        loom::model(|| {
            let run = Arc::new(Run::new());
            assert_eq!(run.take_many(3, ITEMS), Takes::Stock);
            assert_eq!(run.stock(Some(10), 3, ITEMS), None);
            let mut out = two_groups_take(&run);
            let mut runs = vec![10u64];
            if out.contains(&2000) {
                runs.push(20);
            }
            out.extend((0..3).map(|i| 1000 + i));
            out.sort_unstable();
            let mut want: Vec<u64> = runs
                .iter()
                .flat_map(|&r| (0..ITEMS as u64).map(move |i| r * 100 + i))
                .collect();
            want.sort_unstable();
            assert_eq!(out, want, "each item handed out or given back exactly once");
        });
    }

    /// An empty word; two groups of two take side by side. The first add stocks: thread 1's
    /// bins are not fit for a run, so it empties the word again, which changes only the
    /// count; thread 2 installs run 20. A group that waits for thread 1's stock must see the
    /// emptying (waiters that watched the upper bits alone never woke, and this model then
    /// does not end), and its next add stocks.
    #[test]
    fn a_waiter_sees_an_empty_word_emptied_again() {
        loom::model(|| {
            let run = Arc::new(Run::new());
            let out = two_groups_take(&run);
            // Thread 2 always installs run 20 (thread 1 never takes items): all of its items
            // are accounted for once.
            let want: Vec<u64> = (0..ITEMS as u64).map(|i| 2000 + i).collect();
            assert_eq!(out, want, "each item handed out or given back exactly once");
        });
    }
}
