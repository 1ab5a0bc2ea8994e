//! The bulk semaphore: a counting semaphore that lets exactly as many threads refill a pool as
//! the demand needs (Gelado & Garland, PPoPP 2019, Algorithm 1), with its hot path on one
//! `fetch_add`.
//!
//! Three counters live in one 64-bit word (INV(SEM1)):
//!
//! ```text
//!  63               40 39                19 18                0
//! ┌───────────────────┬────────────────────┬───────────────────┐
//! │ C: available (24 b,│ E: expected (21 b) │ R: reserved (19 b) │
//! │  two's complement) │ promised refills   │ spinning waiters   │
//! └───────────────────┴────────────────────┴───────────────────┘
//!  fast path: fetch_add(-(n << C_SHIFT))  — a borrow out of bit 63 is simply lost
//! ```
//!
//! All-zero is a valid empty semaphore (`new(0)`), so zeroed device memory needs no init.
//!
//! # Every update is one `fetch_add`
//! Under contention a CAS loop on one word costs thousands of times an add (PERFORMANCE.md;
//! on the GPU an earlier CAS-based slow path failed about 5,500 CAS per TBuddy allocation at
//! 2^16 threads). So no operation here is a CAS: each one adds to the word, reads the exact
//! state its add replaced, and, where that state shows the add was wrong, undoes it with a
//! second add. Decisions are therefore made on exact snapshots, one per add.
//!
//! # `wait(n, batch)`
//! 1. Fast path: subtract `n` from C. If the old C was `>= n` the units are ours.
//! 2. Otherwise give `n` back to C and reserve it (`C += n, R += n`, one add). From here the waiter holds a reservation until ONE add turns it
//!    into units (`C -= n, R -= n`) or into a refill promise (`R -= n, E += batch - n`):
//!    - units there (`C >= n`): take them; when the old value shows another waiter was
//!      first, add them back (INV(SEM3)).
//!    - reservations uncovered (`R > C + E`, ours counted: demand exceeds supply plus
//!      promised refills): convert the reservation into a promise. If the state that add
//!      replaced was still uncovered the promise stands and the caller must refill
//!      ([`Wait::MustRefill`]): it creates `batch` units, keeps `n`, and calls
//!      `signal(batch - n, batch - n)`, or `retract(batch - n)` if it could not (INV(SEM4)).
//!      Otherwise another waiter's promise came first and ours is undone (one more add).
//!    - otherwise spin (with back-off) and look again.
//!
//! This is Gelado & Garland's Algorithm 1 (`C + E - R < n` → refill; `C >= n` → take; else
//! reserve and spin while `C < n && R <= C + E`) with the order of its steps changed so that
//! every step is one add: the reservation comes first and the refill decision is taken on the
//! state with it. The paper prints "C ≥ I" for the second test (a typo for N).
//!
//! Out of memory never hangs: a waiter spins only while promised refills cover every
//! reservation; once a refill is retracted (or none is in flight, `E == 0`) the reservations
//! exceed the supply, every spinning waiter sees it at its next look, and the first
//! conversion to land becomes a refill, which fails and returns `None` to its caller; that
//! repeats until the waiters left are covered.
//!
//! # Invariants (`docs/invariants.md`)
//! - SEM1: C, E, R live in one word as drawn; all-zero is the empty semaphore.
//! - SEM2: `E <= MAX_EXPECTED`, `R <= MAX_RESERVED`, `0 <= C <= MAX_AVAILABLE` (real count).
//!   The bounds are physical, not checked on the hot path: R is at most one unit per thread
//!   resident on the GPU (a group's leader reserves for its lanes), and the GPUs toga runs on
//!   hold far fewer than 2^19 threads at once (H100/H200: 132 SMs × 2,048 = 270,336). E is
//!   the standing promises (at most R + batch, since a promise stands only where it covered
//!   uncovered reservations, INV(SEM6)) plus conversions being undone, at most one per waiter
//!   of batch - n each: TBuddy's batch - n is 1, and UAlloc's semaphores are per SM
//!   (2,048 threads × 511 < 2^21). C's bound is the pool's duty.
//!   Every field shrinks only by amounts the same thread added, so no add borrows or
//!   carries between fields.
//! - SEM3: the C field may read below the real count by the deductions of fast paths and
//!   takes that failed and have not rolled back yet (at most the sum of their n), even below
//!   zero. Decisions read C as `max(C, 0)` (the real C is never less); a transient deduction
//!   can only make a state look uncovered, which costs at most an extra refill.
//! - SEM4: every [`Wait::MustRefill`] added `batch - n` to E and is answered by exactly one
//!   `signal(batch - n, batch - n)` or `retract(batch - n)`; so is every `promise(e)` (with
//!   `e`): E is the sum of open promises (plus conversions about to be undone).
//! - SEM5: R is the sum of n over waiters holding a reservation; a waiter's n leaves R in the
//!   same add that gives it units or makes it a refiller.
//! - SEM6: a waiter spins only while its last look saw `C < n && R <= C + E`; promises in
//!   flight then cover all reservations, and every promise ends (signal or retract) without
//!   waiting on this semaphore (a refiller must not wait on the semaphore it promised to), so
//!   every spin ends. A promise stands only if the add that made it replaced an uncovered
//!   state.
//! - SEM7: units are published with release (`signal`, `release`) and taken with acquire
//!   (`wait`, `try_wait`): what a producer wrote before signalling is visible to the taker.
//!
//! No false starvation: with equal n for all waiters of a semaphore, a waiter gives up (refills
//! and fails) only when every unit and every promise is spoken for by other waiters, so with K
//! units and 2K one-unit requests exactly K succeed.

use crate::platform::{self, Atomic64, Backoff};

/// Bit position of R (units reserved by spinning waiters).
pub const R_SHIFT: u32 = 0;
/// Width of R: more than the threads resident on any GPU at once (INV(SEM2)).
pub const R_BITS: u32 = 19;
/// Bit position of E (units promised by refilling threads).
pub const E_SHIFT: u32 = R_SHIFT + R_BITS;
/// Width of E (INV(SEM2)).
pub const E_BITS: u32 = 21;
/// Bit position of C (available units): the top of the word, so that a fast-path subtraction
/// that goes below zero borrows out of bit 63 and disturbs neither E nor R.
pub const C_SHIFT: u32 = E_SHIFT + E_BITS;
/// Width of C, sign bit included.
pub const C_BITS: u32 = 64 - C_SHIFT;

/// Largest R (the largest total of reservations, INV(SEM2)).
pub const MAX_RESERVED: u32 = (1 << R_BITS) - 1;
/// Largest E (INV(SEM2)).
pub const MAX_EXPECTED: u32 = (1 << E_BITS) - 1;
/// Largest number of units C may hold. The sign bit keeps the room for transient fast-path
/// deductions (INV(SEM3)); the pool that uses a semaphore must never hold more than this.
pub const MAX_AVAILABLE: u32 = (1 << (C_BITS - 1)) - 1;

const R_MASK: u64 = (MAX_RESERVED as u64) << R_SHIFT;
const E_MASK: u64 = (MAX_EXPECTED as u64) << E_SHIFT;

const _: () = assert!(R_SHIFT + R_BITS == E_SHIFT && E_SHIFT + E_BITS == C_SHIFT);
const _: () = assert!(C_SHIFT + C_BITS == 64 && C_BITS >= 2);
const _: () = assert!(R_MASK & E_MASK == 0);
// INV(SEM3): transient deductions are bounded like reservations (waiters in flight times their
// n); C's negative half must hold them next to a full C without wrapping.
const _: () = assert!(MAX_AVAILABLE as u64 >= 2 * MAX_RESERVED as u64);

/// Pause per reserved waiter between two polls of a spinning waiter (see `spin_reserved`).
pub const SPIN_NS_PER_WAITER: u32 = 8;
/// The longest pause between two polls of a spinning waiter. A refill that lands waits for a
/// waiter's next poll: 1 µs was several times faster than 100 µs on an H100 at 2^10–2^16
/// TBuddy allocations, and no slower at 2^18 (docs/benchmarks.md).
pub const SPIN_MAX_NS: u32 = 1_000;

/// What [`BulkSemaphore::wait`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// `n` units were taken from C.
    Acquired,
    /// The caller promised a refill (`E += batch - n` was done): it must create `batch` units,
    /// keep `n`, and then call `signal(batch - n, batch - n)`, or `retract(batch - n)` when the
    /// refill fails (INV(SEM4)).
    MustRefill,
}

/// A snapshot of the word, with C sign-extended (INV(SEM1)).
#[derive(Clone, Copy, Debug)]
struct Counters {
    c: i64,
    e: i64,
    r: i64,
}

impl Counters {
    #[inline(always)]
    fn unpack(word: u64) -> Self {
        Self {
            // Arithmetic shift: C is the signed top field.
            c: (word as i64) >> C_SHIFT,
            e: ((word & E_MASK) >> E_SHIFT) as i64,
            r: ((word & R_MASK) >> R_SHIFT) as i64,
        }
    }
}

#[inline(always)]
const fn c_units(n: u32) -> u64 {
    (n as u64) << C_SHIFT
}
#[inline(always)]
const fn e_units(n: u32) -> u64 {
    (n as u64) << E_SHIFT
}
#[inline(always)]
const fn r_units(n: u32) -> u64 {
    (n as u64) << R_SHIFT
}

/// A bulk semaphore (see the module doc). 8 bytes; zeroed memory is `new(0)`.
#[repr(C)]
pub struct BulkSemaphore {
    /// C, E and R packed as in the module diagram. INV(SEM1): every update is one atomic
    /// operation on this word; INV(SEM2): no update carries or borrows from one field into the
    /// next, except a borrow out of C (bit 63), which is lost.
    word: Atomic64,
}

impl BulkSemaphore {
    /// A semaphore holding `available` units (`available <= MAX_AVAILABLE`).
    pub fn new(available: u32) -> Self {
        debug_assert!(available <= MAX_AVAILABLE);
        Self {
            word: Atomic64::new(c_units(available)),
        }
    }

    /// Take `n` units, or become the refiller of a batch of `batch` units (`batch >= n`).
    /// See [`Wait`]. Spins (with back-off) only while refills in flight cover the demand, so it
    /// never hangs when a refill fails (INV(SEM6)).
    #[inline]
    pub fn wait(&self, n: u32, batch: u32) -> Wait {
        debug_assert!(n <= batch && n <= MAX_RESERVED && batch - n <= MAX_EXPECTED);
        if n == 0 {
            return Wait::Acquired;
        }
        // INV(SEM7): acquire pairs with the release in `signal`/`release` that published the units.
        let old = self.word.fetch_add_acquire(c_units(n).wrapping_neg());
        if Counters::unpack(old).c >= n as i64 {
            return Wait::Acquired;
        }
        // INV(SEM3): C was short; give the units back and reserve them in the same add.
        let reserve = c_units(n) + r_units(n);
        let old = self.word.fetch_add_relaxed(reserve);
        self.spin_reserved(n, batch, old.wrapping_add(reserve))
    }

    /// The slow path of `wait`: reserve, then take or refill (module doc).
    #[cold]
    fn wait_slow(&self, n: u32, batch: u32) -> Wait {
        // Relaxed: a reservation publishes nothing; the take that ends it is an acquire.
        let old = self.word.fetch_add_relaxed(r_units(n));
        debug_assert!(Counters::unpack(old).r + (n as i64) <= MAX_RESERVED as i64);
        self.spin_reserved(n, batch, old.wrapping_add(r_units(n)))
    }

    /// Hold a reservation of `n` (in R) until units or a refill duty end it; `word` is the
    /// state after our reservation, to decide on first. Spins only while promised refills
    /// cover every reservation, ours included (INV(SEM6)). The reservation is never dropped
    /// and retaken, so a refill that lands moves one waiter and not the whole crowd.
    #[cold]
    #[inline(never)]
    fn spin_reserved(&self, n: u32, batch: u32, mut word: u64) -> Wait {
        let need = n as i64;
        let take = c_units(n) + r_units(n);
        let promise = e_units(batch - n).wrapping_sub(r_units(n));
        let mut backoff = Backoff::new();
        loop {
            let s = Counters::unpack(word);
            if s.c >= need {
                // INV(SEM7): acquire pairs with the release in `signal`/`release`. C and R move
                // together, so the transient leaves `R - C` (what other waiters decide on)
                // unchanged.
                let old = self.word.fetch_add_acquire(take.wrapping_neg());
                if Counters::unpack(old).c >= need {
                    return Wait::Acquired;
                }
                // INV(SEM3): another waiter took them first; put back C and our reservation.
                self.word.fetch_add_relaxed(take);
            } else if s.r > s.c.max(0) + s.e {
                // Uncovered: turn our reservation into a refill promise (INV(SEM4)). Acquire:
                // the decision stays after the loads that led to it.
                let old = Counters::unpack(self.word.fetch_add_acquire(promise));
                debug_assert!(old.e + ((batch - n) as i64) <= MAX_EXPECTED as i64);
                if old.r > old.c.max(0) + old.e {
                    // INV(SEM6): the state our add replaced was uncovered; the promise stands.
                    return Wait::MustRefill;
                }
                // Another promise (or units) covered us first: back to a reservation.
                self.word.fetch_sub_relaxed(promise);
            }
            // Every waiter polls this one word. Thousands of them polling at the plain back-off
            // rate would keep its cache line busy with loads and slow down the very adds that
            // bring the units; so the pause grows with the number of waiters (R), which keeps
            // the polls on the word to about one per `SPIN_NS_PER_WAITER`.
            let crowd = (s.r as u32).saturating_mul(SPIN_NS_PER_WAITER);
            platform::nanosleep(crowd.clamp(backoff.current_ns(), SPIN_MAX_NS));
            backoff.grow();
            word = self.word.load_relaxed();
        }
    }

    /// Add `n` units and settle a promise of `expected` (`E -= expected`): the end of a
    /// successful refill (`signal(batch - n, batch - n)` after [`Wait::MustRefill`]).
    #[inline]
    pub fn signal(&self, n: u32, expected: u32) {
        debug_assert!(Counters::unpack(self.word.load_relaxed()).e >= expected as i64);
        // INV(SEM2): E >= expected (this thread added it), so the E subtraction never borrows.
        // INV(SEM7): release pairs with the acquire in `wait`/`try_wait` of whoever takes them.
        self.word
            .fetch_add_release(c_units(n).wrapping_sub(e_units(expected)));
    }

    /// Withdraw a promise of `expected` units (`E -= expected`): a refill that failed. Waiters
    /// that counted on it notice and retry (INV(SEM6)).
    #[inline]
    pub fn retract(&self, expected: u32) {
        debug_assert!(Counters::unpack(self.word.load_relaxed()).e >= expected as i64);
        // Relaxed: no units are published; spinners see the new E eventually.
        self.word.fetch_sub_relaxed(e_units(expected));
    }

    /// Promise `expected` units without waiting (`E += expected`): for a producer that decided
    /// on its own to make units (TBuddy's merge announces the merged block one order up, so the
    /// pages in transit are never invisible to a waiter). Answered, like a `MustRefill`, by one
    /// `signal(_, expected)` or `retract(expected)` (INV(SEM4)). The caller keeps E within
    /// `MAX_EXPECTED` (one open promise per thread and semaphore is always within it).
    #[inline]
    pub fn promise(&self, expected: u32) {
        debug_assert!(
            Counters::unpack(self.word.load_relaxed()).e + expected as i64 <= MAX_EXPECTED as i64
        );
        // Relaxed: publishes nothing; waiters that see it spin for the units instead of failing.
        self.word.fetch_add_relaxed(e_units(expected));
    }

    /// Return `n` units (`C += n`): `signal(n, 0)`.
    #[inline]
    pub fn release(&self, n: u32) {
        self.signal(n, 0)
    }

    /// `release` without ordering: for callers that publish what the units stand for through
    /// another release that the taker acquires anyway (UAlloc's freed slot bits, cleared with
    /// a release `fetch_and` and claimed with an acquire `fetch_or`). A taker that gets a unit
    /// before it can see that publication only looks again. Saves a fence (a MEMBAR on the
    /// GPU) per call.
    #[inline]
    pub fn release_relaxed(&self, n: u32) {
        self.word.fetch_add_relaxed(c_units(n));
    }

    /// Take `n` units only if C holds them now; never refills, never spins.
    ///
    /// One add, rolled back when C was short: like the fast path of `wait` it makes a
    /// transient deduction (INV(SEM3)), and it can fail while another thread's deduction is
    /// in flight although the units exist. Callers that must know (the TBuddy merge) re-check.
    #[inline]
    pub fn try_wait(&self, n: u32) -> bool {
        // INV(SEM7): acquire pairs with the release in `signal`/`release`.
        let old = self.word.fetch_add_acquire(c_units(n).wrapping_neg());
        if Counters::unpack(old).c >= n as i64 {
            return true;
        }
        // INV(SEM3): give the units back.
        self.word.fetch_add_relaxed(c_units(n));
        false
    }

    /// [`wait`](Self::wait) for a warp: the lanes that call it on the same semaphore (grouped
    /// with `match.any` on its address) take their units with ONE fast-path add made by the
    /// group's leader; lanes the fast path could not serve fall back to the slow path each on
    /// its own, so the group may end up part `Acquired`, part `MustRefill`.
    ///
    /// Rules: every lane of a group passes the same `n` and `batch` (checked in debug builds).
    /// Convergence: call it from straight-line code that every currently active lane reaches
    /// (it takes `active_mask()` and then `match_any`/`shfl` over subsets of it, so a lane that
    /// branched away between the mask and the collectives is undefined behaviour). Lanes that
    /// are not active when it is called simply form other groups. On the host and under loom a
    /// warp is one lane and this is `wait`.
    pub fn wait_collective(&self, n: u32, batch: u32) -> Wait {
        let mask = platform::active_mask();
        let group = platform::match_any(mask, self as *const Self as u64);
        let leader = platform::leader_of(group);
        let lane = platform::lane_id();
        debug_assert_eq!(platform::shfl_idx_u32(group, n, leader), n);
        let mut served = 0;
        if lane == leader {
            served = self.take_up_to(n, group.count_ones());
        }
        served = platform::shfl_idx_u32(group, served, leader);
        if platform::rank_in(group, lane) < served {
            Wait::Acquired
        } else {
            self.wait_slow(n, batch)
        }
    }

    /// The group fast path: take `n` units for as many of `lanes` lanes as C covers, with one
    /// add and at most one roll-back. Returns the number of lanes served.
    fn take_up_to(&self, n: u32, lanes: u32) -> u32 {
        if n == 0 {
            return lanes;
        }
        let total = n * lanes;
        // INV(SEM7): acquire pairs with the release in `signal`/`release`.
        let old = self.word.fetch_add_acquire(c_units(total).wrapping_neg());
        let c = Counters::unpack(old).c;
        let served = if c <= 0 {
            0
        } else {
            (c / n as i64).min(lanes as i64) as u32
        };
        let unused = total - served * n;
        if unused > 0 {
            // INV(SEM3): give back what the lanes that were not served deducted.
            self.word.fetch_add_relaxed(c_units(unused));
        }
        served
    }

    /// C as a relaxed snapshot (0 while transient deductions exceed it).
    pub fn available(&self) -> u32 {
        self.counters().0
    }

    /// `(C, E, R)` as a relaxed snapshot, for tests and statistics (C clamped at 0).
    pub fn counters(&self) -> (u32, u32, u32) {
        let s = Counters::unpack(self.word.load_relaxed());
        (s.c.max(0) as u32, s.e as u32, s.r as u32)
    }
}

impl Default for BulkSemaphore {
    fn default() -> Self {
        Self::new(0)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn zeroed_word_is_empty() {
        let s = BulkSemaphore::new(0);
        assert_eq!(s.counters(), (0, 0, 0));
        assert_eq!(s.word.load_relaxed(), 0);
    }

    #[test]
    fn wait_refill_signal_single_thread() {
        let s = BulkSemaphore::new(0);
        assert_eq!(s.wait(1, 4), Wait::MustRefill);
        assert_eq!(s.counters(), (0, 3, 0));
        s.signal(3, 3);
        assert_eq!(s.counters(), (3, 0, 0));
        for _ in 0..3 {
            assert_eq!(s.wait(1, 4), Wait::Acquired);
        }
        assert_eq!(s.counters(), (0, 0, 0));
        assert_eq!(s.wait(2, 2), Wait::MustRefill);
        s.retract(0);
        assert_eq!(s.counters(), (0, 0, 0));
    }

    #[test]
    fn try_wait_and_release() {
        let s = BulkSemaphore::new(2);
        assert!(s.try_wait(2));
        assert!(!s.try_wait(1));
        s.release(1);
        assert!(!s.try_wait(2));
        assert!(s.try_wait(1));
        assert_eq!(s.available(), 0);
    }

    #[test]
    fn fast_path_failure_rolls_back() {
        let s = BulkSemaphore::new(1);
        assert_eq!(s.wait(2, 2), Wait::MustRefill);
        assert_eq!(s.counters(), (1, 0, 0));
        s.retract(0);
        assert_eq!(s.wait(1, 2), Wait::Acquired);
        assert_eq!(s.counters(), (0, 0, 0));
    }

    #[test]
    fn collective_on_one_lane_is_wait() {
        let s = BulkSemaphore::new(1);
        assert_eq!(s.wait_collective(1, 2), Wait::Acquired);
        assert_eq!(s.wait_collective(1, 2), Wait::MustRefill);
        assert_eq!(s.counters(), (0, 1, 0));
        s.signal(1, 1);
        assert_eq!(s.counters(), (1, 0, 0));
    }

    #[test]
    fn fields_do_not_interfere_at_their_bounds() {
        let s = BulkSemaphore::new(MAX_AVAILABLE);
        assert_eq!(s.counters(), (MAX_AVAILABLE, 0, 0));
        assert_eq!(s.wait(MAX_RESERVED, MAX_RESERVED), Wait::Acquired);
        assert!(s.try_wait(MAX_AVAILABLE - MAX_RESERVED));
        assert_eq!(s.counters(), (0, 0, 0));
        // A refiller promising the most E can hold.
        assert_eq!(s.wait(1, MAX_EXPECTED + 1), Wait::MustRefill);
        assert_eq!(s.counters(), (0, MAX_EXPECTED, 0));
        s.signal(MAX_EXPECTED, MAX_EXPECTED);
        assert_eq!(s.counters(), (MAX_EXPECTED, 0, 0));
    }
}
