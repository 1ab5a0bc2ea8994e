//! Shared by the CPU stress tests: a deadline that turns a hang into a failure, and a small
//! seeded generator so every run is reproducible.
#![allow(dead_code)]

use std::sync::mpsc;
use std::time::Duration;

/// A test that takes longer than this has hung (each suite takes a few seconds).
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Runs `f` on a helper thread and fails the test if it does not finish by [`DEADLINE`].
pub fn with_deadline<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let v = f();
        let _ = tx.send(());
        v
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(()) => handle.join().expect("test thread panicked"),
        Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Ok(_) => unreachable!("sender dropped without sending"),
            Err(e) => std::panic::resume_unwind(e),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("hung: not finished after {DEADLINE:?}"),
    }
}

/// SplitMix64: a small seeded generator, so runs are reproducible per thread.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
