//! A stash: freed blocks of one order, set aside for the next `malloc` of that order instead
//! of going back into the buddy tree (lazy coalescing).
//!
//! A large `free` that climbs the tree is a chain of dependent atomics and fences: a pair
//! lock, the buddy's state, a semaphore, a merge, once per level (ncu of 2^17 frees of 8 KiB:
//! 11.4 atomics and 10.7 L1 invalidations per call, `docs/benchmarks.md`). Into a stash it
//! costs a warp two adds and one store per lane; the climb is paid later, by a trim, for the
//! blocks that no `malloc` of their order took back first.
//!
//! ```text
//!  slots (a ring of 2^c words, 0: empty)    counters (each on its own line)
//!  ┌────┬────┬────┬────┬────┬────┐         fill:  tickets handed to givers
//!  │ 0  │ v  │ v  │ v  │ 0  │ 0  │         drain: tickets handed to takers
//!  └────┴────┴────┴────┴────┴────┘         items: values put and not yet counted by a taker
//!          ▲ drain        ▲ fill
//!  put (a group of n):  fill += n → tickets t..t+n; lane r: CAS slot[(t+r) mod 2^c] 0 → v
//!                       (waiting while the slot's last value is still there); then items += n.
//!  take (a group of n): items -= n (what was short goes back) → got; drain += got → tickets;
//!                       lane r < got: swap slot[(d+r) mod 2^c] ← 0 until it gives a value.
//! ```
//!
//! A value is put once and taken once: a put writes only into an empty slot (CAS), a take
//! empties it (swap). Neither side waits for long: a put waits only for the taker that holds
//! the ticket of its slot's previous value, and a take for the giver that holds the ticket of
//! a value that `items` already counted. Both hold their tickets while they run, so the wait
//! ends once they are scheduled.
//!
//! Invariants (`docs/invariants.md`):
//! - ST1: every value put is taken exactly once, or stays in the ring; `items` (once every
//!   taker's subtraction is settled) equals the values put whose giver has counted them, less
//!   the values handed to takers.
//! - ST2: the ring holds at least as many slots as the stash can ever hold values (the
//!   caller's bound: distinct blocks of one order in the heap), so a put never waits for a
//!   slot that no taker will empty.

use crate::collective::Group;
use crate::platform::{self, Atomic32, Atomic64, Backoff};

/// One counter alone on its cache line: givers and takers of one stash hit different words.
#[repr(C, align(128))]
pub struct StashLine(pub Atomic64);

/// The counters of one stash. All-zero: an empty stash.
#[repr(C)]
pub struct StashHeader {
    /// Values counted and not taken (a signed count in a `u64`: a taker's subtraction may
    /// take it below zero until the taker gives back what it did not get).
    pub items: StashLine,
    /// Tickets handed to givers: ticket `t` writes slot `t mod 2^c`.
    pub fill: StashLine,
    /// Tickets handed to takers.
    pub drain: StashLine,
}

impl StashHeader {
    /// An empty stash (equal to all-zero memory).
    pub fn new() -> Self {
        Self {
            items: StashLine(Atomic64::new(0)),
            fill: StashLine(Atomic64::new(0)),
            drain: StashLine(Atomic64::new(0)),
        }
    }
}

impl Default for StashHeader {
    fn default() -> Self {
        Self::new()
    }
}

/// Bits of a take's broadcast that hold how many lanes got a value (at most 32).
const GOT_BITS: u32 = 6;

/// A stash's counters and its ring of slots.
#[derive(Clone, Copy)]
pub struct Stash<'a> {
    header: &'a StashHeader,
    /// A power of two of them (INV(ST2): at least the values the stash can ever hold).
    slots: &'a [Atomic32],
}

impl<'a> Stash<'a> {
    /// The stash of `header` over `slots`, whose length is a power of two no smaller than the
    /// number of values that can ever be in it at once (INV(ST2)).
    #[inline(always)]
    pub fn new(header: &'a StashHeader, slots: &'a [Atomic32]) -> Self {
        debug_assert!(slots.len().is_power_of_two());
        Self { header, slots }
    }

    #[inline(always)]
    fn slot(&self, ticket: u64) -> &'a Atomic32 {
        // The length is a power of two: the mask keeps the index in bounds.
        &self.slots[ticket as usize & (self.slots.len() - 1)]
    }

    /// Put `value` (non-zero) into the stash, for every lane of `group` at once (collective:
    /// `collective.rs` rules). The leader returns whether the stash had no value counted
    /// before (for the caller's harvest note); the other lanes return `false`.
    ///
    /// The caller hands over what `value` stands for: the writes this lane made to it before
    /// the put happen before those of the lane that takes it.
    pub fn put(&self, group: &Group, value: u32) -> bool {
        debug_assert_ne!(value, 0);
        let n = group.size() as u64;
        // Relaxed: a ticket only; the value is published by its slot (below).
        let first = if group.is_leader() {
            self.header.fill.0.fetch_add_relaxed(n)
        } else {
            0
        };
        let slot = self.slot(group.broadcast_u64(first) + group.rank() as u64);
        // Release (fence form, with the relaxed CAS after it): what we did with the block
        // before it is in the slot; pairs with the acquire swap in `take`.
        platform::fence_acq_rel();
        let mut backoff = Backoff::new();
        // INV(ST2): a full slot holds the previous value of its ticket's slot, whose taker
        // holds its ticket and is about to empty it.
        while slot.compare_exchange_relaxed(0, value).is_err() {
            backoff.snooze();
        }
        // Every lane's value is in its slot before the leader counts them, so a taker rarely
        // finds its slot still empty. Relaxed count: the slots carry the values (a taker that
        // sees the count first waits on its slot).
        group.sync();
        if group.is_leader() {
            let before = self.header.items.0.fetch_add_relaxed(n) as i64;
            return before <= 0;
        }
        false
    }

    /// Take up to `group.size()` values, one for each lane of the lowest ranks (collective:
    /// `collective.rs` rules). Returns this lane's value (`None`: none for it) and how many
    /// lanes got one, the same on every lane: the lanes of rank `got` and above got none.
    pub fn take(&self, group: &Group) -> (Option<u32>, u32) {
        let n = group.size();
        let mut packed = 0u64;
        // A load first: an empty stash costs the leader one load, not two adds.
        if group.is_leader() && self.header.items.0.load_relaxed() as i64 > 0 {
            let items = &self.header.items.0;
            // Relaxed: a count only (INV(ST1)); the values come through their slots.
            let before = items.fetch_sub_relaxed(n as u64) as i64;
            let got = before.clamp(0, n as i64) as u32;
            if got < n {
                items.fetch_add_relaxed((n - got) as u64);
            }
            if got > 0 {
                let first = self.header.drain.0.fetch_add_relaxed(got as u64);
                packed = first << GOT_BITS | got as u64;
            }
        }
        let packed = group.broadcast_u64(packed);
        let got = (packed & ((1 << GOT_BITS) - 1)) as u32;
        let rank = group.rank();
        if rank >= got {
            return (None, got);
        }
        let slot = self.slot((packed >> GOT_BITS) + rank as u64);
        let mut backoff = Backoff::new();
        loop {
            // Acquire: pairs with the release of the put that wrote the value (its fence).
            // INV(ST1): the count promised a value to every ticket handed out; its giver holds
            // the ticket of this slot and is about to write.
            let value = slot.swap_acquire(0);
            if value != 0 {
                return (Some(value), got);
            }
            backoff.snooze();
        }
    }

    /// [`take`](Self::take) for one lane alone.
    pub fn take_one(&self) -> Option<u32> {
        self.take(&Group::single()).0
    }

    /// Values in the stash, counted (a snapshot; exact at quiescence).
    pub fn len(&self) -> u64 {
        (self.header.items.0.load_relaxed() as i64).max(0) as u64
    }

    /// Whether the stash holds no counted value (a snapshot).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn ring(words: usize) -> std::vec::Vec<Atomic32> {
        (0..words).map(|_| Atomic32::new(0)).collect()
    }

    #[test]
    fn values_come_back_in_the_order_they_were_put() {
        let header = StashHeader::new();
        let slots = ring(4);
        let stash = Stash::new(&header, &slots);
        assert_eq!(stash.take_one(), None);
        for round in 0..3u32 {
            for v in 1..=4 {
                assert!(stash.put(&Group::single(), round * 10 + v) == (v == 1));
            }
            assert_eq!(stash.len(), 4);
            for v in 1..=4 {
                assert_eq!(stash.take_one(), Some(round * 10 + v));
            }
            assert!(stash.is_empty());
            assert_eq!(stash.take_one(), None);
        }
        // A failed take gives back its subtraction.
        assert_eq!(header.items.0.load_relaxed(), 0);
    }
}
