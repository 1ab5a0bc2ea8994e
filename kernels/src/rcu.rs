//! Sleepable RCU (SRCU) with delegation: the paper's conditional barrier.
//!
//! Many threads *read* a linked structure (UAlloc's bin lists) while a few *writers* unlink
//! nodes; a node's memory may be reused only once every reader that could still hold a
//! pointer to it has left. Classic RCU tracks that per thread; a GPU has 2^20 threads and no
//! registers to spare, so this is SRCU: one epoch word and two reader counters.
//!
//! ```text
//!   readers (most threads)                 writers (few)
//!   ───────────────────────                ───────────────────────────────────────────
//!   readers[0] += 1, readers[1] += 1,      unlink node (under the structure's own mutex)
//!     reading the epoch e (one RMW)        call_rcu(node)      → queue ─┐
//!   readers[!(e & 1)] -= 1 (not waited     barrier_conditional(run)     │
//!     for)                                   owner?  ── no: return (PENDING tells the owner)
//!   ... walk the structure ...               yes: take the queue ◄──────┘
//!   readers[e & 1] -= 1                           epoch += 1
//!                                                 wait until readers[old & 1] == 0
//!                                                 run the callbacks; again while PENDING
//! ```
//!
//! # Conditional barrier (delegation)
//! At most one thread (the *owner*) bumps the epoch and runs callbacks at a time. A writer
//! queues its callback, then tries to become the owner; if an owner is already running, the
//! writer returns at once and leaves its callback to that owner (the paper's conditional
//! barrier, up to 14× over classic RCU there). The `state` word makes that safe: queuing sets
//! `PENDING` with an RMW, and the owner clears `RUNNING` only with a CAS that fails while
//! `PENDING` is set, so no callback is ever left behind (INV(RCU3)).
//!
//! # One word for the epoch and both counts (INV(RCU1), INV(RCU2))
//! The epoch and the two reader counts share one 64-bit word (`state`, layout below), so a
//! reader enters with one acquire RMW that counts itself in *both* parities and reads the
//! epoch; it then takes itself out of the parity it does not belong to with an RMW whose
//! result nobody waits for. The owner bumps the epoch with an RMW on the same word. RMWs on one
//! word are totally ordered and each reads the newest value, so either the reader's add comes
//! first (the owner's bump then includes the count of the old parity, and its wait sees it) or
//! the owner's bump does (the reader's acquire reads the bump or later, so every unlink queued
//! before the bump is visible to it, and it belongs to the new parity). The extra count only
//! ever makes an owner wait longer, and it is taken back without waiting for anything. No
//! fence on the entry and one round trip to memory: a walk costs one MEMBAR fewer than with
//! separate words, and one load fewer than a guess of the parity before the RMW (which then
//! had to retry when the guess was stale). Callers that must also release their earlier
//! writes (`free`) enter with [`Srcu::read_lock_fenced`].
//!
//! ```text
//!   state: │ epoch (8 bits, wraps) │ readers, odd epochs (28) │ readers, even epochs (28) │
//!          63                    56 55                      28 27                        0
//! ```
//!
//! # Rules for callers
//! - Never call a barrier from inside a read section of the same `Srcu` (it would wait for
//!   itself). Never hold a lock across a barrier that a reader may need.
//! - Callbacks run on the owner's thread, with the owner's `run` closure: every caller of one
//!   `Srcu` must pass closures that do the same thing (UAlloc: "return this bin/chunk").
//! - Zeroed memory is a valid idle `Srcu` (epoch 0, no readers, empty queue).

use crate::platform::{self, Atomic32, Atomic64, Backoff};

/// `state` bit: an owner is running barriers.
const RUNNING: u32 = 1;
/// `state` bit: callbacks were queued since the owner last looked.
const PENDING: u32 = 2;

/// The link a deferred object embeds; its address is what the callback receives.
#[repr(C)]
pub struct RcuHead {
    /// Next queued head (address), written before the head is published to the queue.
    next: Atomic64,
}

impl RcuHead {
    /// An unqueued head (all-zero).
    pub fn new() -> Self {
        Self {
            next: Atomic64::new(0),
        }
    }
}

impl Default for RcuHead {
    fn default() -> Self {
        Self::new()
    }
}

/// Keeps a word on its own 128 B line: readers hammer the counters, writers the queue.
#[repr(C, align(128))]
struct Line<T>(T);

/// Writer-side words.
#[repr(C)]
struct Writers {
    /// `RUNNING | PENDING` (INV(RCU3)).
    state: Atomic32,
    /// Treiber stack of queued [`RcuHead`] addresses (0 = empty).
    queue: Atomic64,
}

/// What [`Srcu::barrier_conditional`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Barrier {
    /// This thread was the owner: it waited for readers and ran every queued callback.
    Ran,
    /// Another owner is running and will run this thread's callbacks.
    Delegated,
    /// Nothing was queued (someone else already ran it).
    Idle,
}

/// Bits of `state` per reader count.
const COUNT_BITS: u32 = 28;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
/// Where the epoch sits in `state`: the top 8 bits, so that a bump that wraps carries out of
/// the word and never into a count.
const EPOCH_SHIFT: u32 = 56;

// A count never carries into the next field: at most every thread resident on the GPU is
// inside (which the TBuddy semaphores' R field bounds, INV(SEM2)), plus one entry each in
// the other parity that is about to be taken back (`read_lock`).
const _: () = assert!(
    2 * crate::bulk_semaphore::Fields::<crate::bulk_semaphore::Global>::MAX_RESERVED as u64
        <= COUNT_MASK
);
const _: () = assert!(2 * COUNT_BITS <= EPOCH_SHIFT);

/// The `state` unit of one reader of `parity`.
#[inline(always)]
fn unit(parity: usize) -> u64 {
    1 << (COUNT_BITS * parity as u32)
}

/// An SRCU domain (see the module doc). 512 B; zeroed memory is a valid idle domain.
#[repr(C)]
pub struct Srcu {
    /// The epoch and the readers inside by the parity of the epoch they entered in (module
    /// doc); only the owner bumps the epoch (INV(RCU1), INV(RCU2)).
    state: Line<Atomic64>,
    writers: Line<Writers>,
    /// Unused: keeps the domain at the four lines it had with separate epoch and count words,
    /// so that an arena's layout, which the host computes, is the same for PTX built before
    /// and after (A/B runs load either under one host binary through `TOGA_PTX_FILE`).
    _spare: [Line<Atomic64>; 2],
}

/// A read section of an [`Srcu`]; leaving it (drop) ends the section.
#[must_use = "the read section ends when the guard is dropped"]
pub struct SrcuReader<'a> {
    srcu: &'a Srcu,
    parity: usize,
}

impl Drop for SrcuReader<'_> {
    #[inline]
    fn drop(&mut self) {
        // Release (fence form): everything this reader did in the section happens before the
        // owner's acquire load that sees the count fall (pairs with the acquire in
        // `wait_for_readers`). A fence rather than a release `fetch_sub` (on the GPU both are
        // one MEMBAR): it also releases the section's writes to whatever the thread writes
        // next, which `free` relies on for its count of an emptied bin (INV(UA17)).
        platform::fence_acq_rel();
        // Relaxed: ordered by the fence. Our own count is in the field, so no borrow.
        self.srcu.state.0.fetch_sub_relaxed(unit(self.parity));
    }
}

impl Srcu {
    /// An idle domain (all-zero).
    pub fn new() -> Self {
        Self {
            state: Line(Atomic64::new(0)),
            writers: Line(Writers {
                state: Atomic32::new(0),
                queue: Atomic64::new(0),
            }),
            _spare: [Line(Atomic64::new(0)), Line(Atomic64::new(0))],
        }
    }

    /// Enter a read section: until the guard drops, no callback queued after anything this
    /// section can still reach was unlinked runs (INV(RCU1)). One RMW waited for, one not, and
    /// no fence (module doc).
    #[inline]
    pub fn read_lock(&self) -> SrcuReader<'_> {
        // Acquire: the section's reads come after a bump this RMW reads (module doc). It counts
        // the reader in both parities and reads the epoch in one step, so the parity needs no
        // guess (a load of the hot word before the RMW was one round trip more per section).
        let now = self.state.0.fetch_add_acquire(unit(0) | unit(1)) >> EPOCH_SHIFT;
        let parity = (now & 1) as usize;
        // Relaxed, and not waited for: the count in the other parity guards nothing of ours.
        // Until it lands, an owner waiting on that parity only waits a little longer.
        self.state.0.fetch_sub_relaxed(unit(1 - parity));
        SrcuReader { srcu: self, parity }
    }

    /// [`read_lock`](Self::read_lock) after a full fence: everything this thread wrote before
    /// the section is also released to whatever the section then writes. `free` relies on it
    /// for the slots it gives back (`release_many_fenced`): a claimer that sees the slot free
    /// sees the block's last writes.
    #[inline]
    pub fn read_lock_fenced(&self) -> SrcuReader<'_> {
        platform::fence_acq_rel();
        self.read_lock()
    }

    /// Queue `head` for the next grace period and announce it (sets `PENDING`). The caller
    /// must then call [`barrier_conditional`](Self::barrier_conditional) (or be running as the
    /// owner, inside a callback), and must have unlinked the object first.
    ///
    /// # Safety
    /// `head` points at a live [`RcuHead`] that stays valid and is not queued again until its
    /// callback has run.
    pub unsafe fn call_rcu(&self, head: *const RcuHead) {
        // SAFETY: the caller keeps `head` valid until its callback runs.
        let node = unsafe { &*head };
        let queue = &self.writers.0.queue;
        let mut old = queue.load_relaxed();
        loop {
            node.next.store_relaxed(old);
            // Release: the caller's unlink and `node.next` happen before the owner's acquire
            // swap in `run_owner` that takes this node.
            match queue.compare_exchange_acq_rel(old, head as u64) {
                Ok(_) => break,
                Err(now) => old = now,
            }
        }
        // INV(RCU3): an RMW, ordered against the owner's final CAS on `state`.
        self.writers.0.state.fetch_or_acq_rel(PENDING);
    }

    /// The conditional barrier: if no owner is running, become it, wait for the readers of
    /// the current epoch and run every queued callback (repeating while more are queued);
    /// otherwise return at once and leave this thread's callbacks to the running owner.
    /// Must not be called inside a read section of `self`.
    pub fn barrier_conditional(&self, mut run: impl FnMut(*const RcuHead)) -> Barrier {
        let state = &self.writers.0.state;
        // Acquire: pairs with the owner's final CAS (a finished owner's callbacks happen before
        // our `Idle`).
        let mut s = state.load_acquire();
        loop {
            if s & RUNNING != 0 {
                // INV(RCU3): our PENDING is in `state`; the owner sees it before it stops.
                return Barrier::Delegated;
            }
            if s & PENDING == 0 {
                return Barrier::Idle;
            }
            // Acq_rel: the acquire half pairs with the `fetch_or` in `call_rcu` of every queued
            // callback.
            match state.compare_exchange_acq_rel(s, RUNNING) {
                Ok(_) => break,
                Err(now) => s = now,
            }
        }
        self.run_owner(&mut run);
        Barrier::Ran
    }

    /// The classic barrier: returns once every callback queued before the call has run
    /// (running them itself when no owner is). Must not be called inside a read section.
    pub fn barrier(&self, mut run: impl FnMut(*const RcuHead)) {
        let mut backoff = Backoff::new();
        while self.barrier_conditional(&mut run) == Barrier::Delegated {
            backoff.snooze();
        }
    }

    /// The owner's loop: batches until no `PENDING` is left.
    fn run_owner(&self, run: &mut impl FnMut(*const RcuHead)) {
        let w = &self.writers.0;
        loop {
            // Acquire: pairs with the release CAS in `call_rcu` of every node in the batch.
            let mut batch = w.queue.swap_acq_rel(0);
            if batch != 0 {
                self.wait_for_readers();
                while batch != 0 {
                    let head = batch as *const RcuHead;
                    // SAFETY: queued heads stay valid until their callback runs (`call_rcu`);
                    // read the link before the callback may reuse the memory.
                    batch = unsafe { &*head }.next.load_relaxed();
                    run(head);
                }
            }
            // INV(RCU3): stop only if nobody queued since we took the batch.
            match w.state.compare_exchange_acq_rel(RUNNING, 0) {
                Ok(_) => return,
                Err(_) => {
                    w.state.fetch_and_acq_rel(!PENDING);
                }
            }
        }
    }

    /// Start a new epoch and wait until no reader of the old one is inside (INV(RCU1)).
    fn wait_for_readers(&self) {
        // Acq_rel RMW: pairs with the readers' RMW in `read_lock` (module doc).
        let old = self.state.0.fetch_add_acq_rel(1 << EPOCH_SHIFT) >> EPOCH_SHIFT;
        let shift = COUNT_BITS * (old & 1) as u32;
        let mut backoff = Backoff::new();
        // Acquire: pairs with the release decrement in `SrcuReader::drop`.
        while self.state.0.load_acquire() >> shift & COUNT_MASK != 0 {
            backoff.snooze();
        }
    }

    /// The epoch, modulo 256 (tests and statistics).
    pub fn epoch(&self) -> u32 {
        (self.state.0.load_relaxed() >> EPOCH_SHIFT) as u32
    }

    /// Readers inside, by parity (tests and statistics).
    pub fn readers(&self) -> (u32, u32) {
        let s = self.state.0.load_relaxed();
        (
            (s & COUNT_MASK) as u32,
            (s >> COUNT_BITS & COUNT_MASK) as u32,
        )
    }

    /// No owner running, nothing queued (a quiescent check for tests).
    pub fn is_idle(&self) -> bool {
        self.writers.0.state.load_relaxed() == 0 && self.writers.0.queue.load_relaxed() == 0
    }
}

impl Default for Srcu {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(not(loom))]
const _: () = assert!(core::mem::size_of::<Srcu>() == 4 * 128);

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::boxed::Box;
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
    use std::vec::Vec;

    #[test]
    fn zeroed_is_idle() {
        // SAFETY: the platform atomics are plain integers on the host; all-zero is `new()`.
        let s: Srcu = unsafe { core::mem::zeroed() };
        assert!(s.is_idle());
        assert_eq!(s.readers(), (0, 0));
        assert_eq!(s.barrier_conditional(|_| unreachable!()), Barrier::Idle);
    }

    #[test]
    fn callbacks_run_after_readers_leave() {
        let s = Srcu::new();
        let heads: Vec<Box<RcuHead>> = (0..3).map(|_| Box::new(RcuHead::new())).collect();
        let ran = AtomicU32::new(0);
        let r = s.read_lock();
        assert_eq!(s.readers(), (1, 0));
        for h in &heads {
            // SAFETY: the heads outlive the barrier below.
            unsafe { s.call_rcu(&**h) };
        }
        drop(r);
        assert_eq!(
            s.barrier_conditional(|_| {
                ran.fetch_add(1, SeqCst);
            }),
            Barrier::Ran
        );
        assert_eq!(ran.load(SeqCst), 3);
        assert_eq!(s.epoch(), 1);
        assert!(s.is_idle());
    }

    #[test]
    fn concurrent_barriers_run_every_callback_once() {
        let s = Srcu::new();
        let ran = AtomicU32::new(0);
        const THREADS: usize = 4;
        const PER: usize = 200;
        let heads: Vec<RcuHead> = (0..THREADS * PER).map(|_| RcuHead::new()).collect();
        std::thread::scope(|sc| {
            for t in 0..THREADS {
                let (s, ran, heads) = (&s, &ran, &heads);
                sc.spawn(move || {
                    for i in 0..PER {
                        let r = s.read_lock();
                        drop(r);
                        // SAFETY: `heads` outlives the scope; each head is queued once.
                        unsafe { s.call_rcu(&heads[t * PER + i]) };
                        s.barrier_conditional(|_| {
                            ran.fetch_add(1, SeqCst);
                        });
                    }
                });
            }
        });
        assert_eq!(ran.load(SeqCst) as usize, THREADS * PER);
        assert!(s.is_idle());
        assert_eq!(s.readers(), (0, 0));
    }
}
