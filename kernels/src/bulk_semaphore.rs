//! The bulk semaphore: a counting semaphore that lets exactly as many threads refill a pool as
//! the demand needs (Gelado & Garland, PPoPP 2019, Algorithm 1), with its hot path on one
//! `fetch_add`.
//!
//! Three counters live in one 64-bit word (INV(SEM1)), cut by a [`Layout`]:
//!
//! ```text
//!  63          C_SHIFT            E_SHIFT               0
//! ┌──────────────────┬──────────────────┬──────────────────┐
//! │ C: available     │ E: expected      │ R: reserved      │
//! │ (two's compl.)   │ promised refills │ spinning waiters │
//! └──────────────────┴──────────────────┴──────────────────┘
//!  Global (TBuddy's orders):      C 24 b │ E 21 b │ R 19 b
//!  PerSm  (UAlloc's arena words): C 32 b │ E 20 b │ R 12 b
//!  fast path: fetch_add(-(n << C_SHIFT))  — a borrow out of bit 63 is simply lost
//! ```
//!
//! The widths follow who may wait: every thread on the GPU for a [`Global`] semaphore (R must
//! hold 2^19 - 1), the threads of one SM for a [`PerSm`] one, which frees 8 bits for C so that
//! an arena's free slots cannot overflow it in any heap toga can lay out (INV(SEM2)).
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
//! `wait` split at the miss: [`wait_fast`](BulkSemaphore::wait_fast) is step 1 alone, and
//! [`wait_after`](BulkSemaphore::wait_after) the rest, for a caller that handles the miss out of
//! line. With `look`, a miss that saw no promise (E = 0) gives its `n` back (one add) and looks
//! elsewhere before it reserves (UAlloc's class homes, INV(UA16)), unless that add shows the
//! units here after all.
//!
//! Out of memory never hangs: a waiter spins only while promised refills cover every
//! reservation; once a refill is retracted (or none is in flight, `E == 0`) the reservations
//! exceed the supply, every spinning waiter sees it at its next look, and the first
//! conversion to land becomes a refill, which fails and returns `None` to its caller; that
//! repeats until the waiters left are covered.
//!
//! # Invariants (`docs/invariants.md`)
//! - SEM1: C, E, R live in one word as drawn; all-zero is the empty semaphore.
//! - SEM2: `E <= MAX_EXPECTED`, `R <= MAX_RESERVED`, `0 <= C <= MAX_AVAILABLE` (real count),
//!   each per [`Layout`]. The bounds are physical, not checked on the hot path. R is at most
//!   one unit per thread that may wait (a group's leader reserves for its lanes): for a
//!   [`Global`] semaphore every thread resident on the GPU, far fewer than 2^19 on the GPUs
//!   toga runs on (H100/H200: 132 SMs × 2,048 = 270,336); for a [`PerSm`] one the threads of
//!   one SM (at most 2,048; the heap gives every SM id an arena of its own). E is the standing
//!   promises (at most R + batch, since a promise stands only where it covered uncovered
//!   reservations, INV(SEM6)) plus conversions being undone, at most one per waiter of
//!   batch - n each: TBuddy's batch - n is 1, and UAlloc's batches are at most 510 slots
//!   (a bin's slots, or a refill's promise: 2,048 + 510 + 2,048 × 509 < 2^20). C's bound is
//!   the pool's: a TBuddy order holds fewer than 2^23 blocks, and an arena's free slots of
//!   one class are fewer than the slots of the largest heap, < 2^31 (asserted in
//!   `ualloc/arena.rs`).
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

use core::marker::PhantomData;

use crate::collective::SingleFlight;
use crate::platform::{self, Atomic64, Backoff};

/// How a semaphore's word is cut: R at the bottom, then E, then C to the top, so that a
/// fast-path subtraction that goes below zero borrows out of bit 63 and disturbs neither E nor
/// R (INV(SEM1)). Each layout's widths hold the bounds of INV(SEM2) for its waiters.
pub trait Layout {
    /// Width of R (units reserved by spinning waiters).
    const R_BITS: u32;
    /// Width of E (units promised by refilling threads).
    const E_BITS: u32;
}

/// For a semaphore any thread of the GPU may wait on (TBuddy's orders): R 19, E 21, C 24 bits.
pub struct Global;

impl Layout for Global {
    const R_BITS: u32 = 19;
    const E_BITS: u32 = 21;
}

/// For a semaphore only the threads of one SM wait on (UAlloc's arena semaphores): R 12,
/// E 20, C 32 bits, so that C holds every slot of the largest heap.
pub struct PerSm;

impl Layout for PerSm {
    const R_BITS: u32 = 12;
    const E_BITS: u32 = 20;
}

/// The fields of layout `L`: shifts and bounds.
pub struct Fields<L>(PhantomData<L>);

impl<L: Layout> Fields<L> {
    /// Bit position of R.
    pub const R_SHIFT: u32 = 0;
    /// Bit position of E.
    pub const E_SHIFT: u32 = L::R_BITS;
    /// Bit position of C: the top of the word.
    pub const C_SHIFT: u32 = L::R_BITS + L::E_BITS;
    /// Width of C, sign bit included.
    pub const C_BITS: u32 = 64 - Self::C_SHIFT;
    /// Largest R (the largest total of reservations, INV(SEM2)).
    pub const MAX_RESERVED: u32 = (1 << L::R_BITS) - 1;
    /// Largest E (INV(SEM2)).
    pub const MAX_EXPECTED: u32 = (1 << L::E_BITS) - 1;
    /// Largest number of units C may hold. The sign bit keeps the room for transient
    /// fast-path deductions (INV(SEM3)); the pool that uses a semaphore must never hold more.
    pub const MAX_AVAILABLE: u32 = ((1u64 << (Self::C_BITS - 1)) - 1) as u32;
    const R_MASK: u64 = (Self::MAX_RESERVED as u64) << Self::R_SHIFT;
    const E_MASK: u64 = (Self::MAX_EXPECTED as u64) << Self::E_SHIFT;
    /// Checked where a semaphore is made.
    const VALID: () = {
        assert!(L::R_BITS >= 1 && L::E_BITS >= 1 && Self::C_SHIFT <= 62);
        assert!(Self::C_BITS <= 33, "C must fit a u32 count");
        // INV(SEM3): transient deductions are bounded like reservations (waiters in flight
        // times their n); C's negative half must hold them next to a full C without wrapping.
        assert!(Self::MAX_AVAILABLE as u64 >= 2 * Self::MAX_RESERVED as u64);
    };

    /// `(C, E, R)` of a raw semaphore word, C sign-extended (for tools that read a copy of
    /// device memory).
    pub const fn decode(word: u64) -> (i64, u64, u64) {
        (
            (word as i64) >> Self::C_SHIFT,
            (word & Self::E_MASK) >> Self::E_SHIFT,
            (word & Self::R_MASK) >> Self::R_SHIFT,
        )
    }

    #[inline(always)]
    const fn c_units(n: u32) -> u64 {
        (n as u64) << Self::C_SHIFT
    }
    #[inline(always)]
    const fn e_units(n: u32) -> u64 {
        (n as u64) << Self::E_SHIFT
    }
    #[inline(always)]
    const fn r_units(n: u32) -> u64 {
        (n as u64) << Self::R_SHIFT
    }
}

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

/// A [`wait_fast`](BulkSemaphore::wait_fast) that found C short: the word its add replaced.
/// Its deduction stays in C until [`wait_after`](BulkSemaphore::wait_after) takes the miss.
#[must_use = "a miss holds a deduction of C that only `wait_after` ends"]
#[derive(Debug)]
pub struct Miss(u64);

/// A snapshot of the word, with C sign-extended (INV(SEM1)).
#[derive(Clone, Copy, Debug)]
struct Counters {
    c: i64,
    e: i64,
    r: i64,
}

impl Counters {
    #[inline(always)]
    fn unpack<L: Layout>(word: u64) -> Self {
        let (c, e, r) = Fields::<L>::decode(word);
        Self {
            c,
            e: e as i64,
            r: r as i64,
        }
    }
}

/// What [`BulkSemaphore::take_shared`] got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shared {
    /// `n` units, taken from the semaphore.
    Taken,
    /// This thread refilled: `refill`'s token; it kept `n` of the units it made.
    Refilled(u64),
    /// A refill (this thread's or the one it waited for) made nothing.
    Exhausted,
    /// Refills succeeded, but others took their units first, `tries` times.
    Busy,
}

/// A bulk semaphore (see the module doc) whose word is cut by layout `L`. 8 bytes; zeroed
/// memory is `new(0)`.
#[repr(C)]
pub struct BulkSemaphore<L: Layout = Global> {
    /// C, E and R packed as in the module diagram. INV(SEM1): every update is one atomic
    /// operation on this word; INV(SEM2): no update carries or borrows from one field into the
    /// next, except a borrow out of C (bit 63), which is lost.
    word: Atomic64,
    layout: PhantomData<L>,
}

impl<L: Layout> BulkSemaphore<L> {
    /// A semaphore holding `available` units (`available <= MAX_AVAILABLE`).
    pub fn new(available: u32) -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Fields::<L>::VALID;
        debug_assert!(available <= Fields::<L>::MAX_AVAILABLE);
        Self {
            word: Atomic64::new(Fields::<L>::c_units(available)),
            layout: PhantomData,
        }
    }

    /// Take `n` units, or become the refiller of a batch of `batch` units (`batch >= n`).
    /// See [`Wait`]. Spins (with back-off) only while refills in flight cover the demand, so it
    /// never hangs when a refill fails (INV(SEM6)).
    #[inline]
    pub fn wait(&self, n: u32, batch: u32) -> Wait {
        debug_assert!(
            n <= batch && n <= Fields::<L>::MAX_RESERVED && batch - n <= Fields::<L>::MAX_EXPECTED
        );
        if n == 0 {
            return Wait::Acquired;
        }
        // INV(SEM7): acquire pairs with the release in `signal`/`release` that published the units.
        let old = self
            .word
            .fetch_add_acquire(Fields::<L>::c_units(n).wrapping_neg());
        if Counters::unpack::<L>(old).c >= n as i64 {
            return Wait::Acquired;
        }
        // INV(SEM3): C was short; give the units back and reserve them in the same add.
        let reserve = Fields::<L>::c_units(n) + Fields::<L>::r_units(n);
        let old = self.word.fetch_add_relaxed(reserve);
        self.spin_reserved(n, batch, old.wrapping_add(reserve))
    }

    /// The fast path of [`wait`](Self::wait) alone: one add that takes `n` units
    /// (`Ok`), or a [`Miss`] when C was short, whose deduction of `n` is still in C until
    /// [`wait_after`](Self::wait_after) ends it. For a caller that handles the miss out of
    /// line, so that the fast path carries nothing the miss needs (UAlloc's `find_slots`: a
    /// closure built for the miss put seven local-memory stores before every malloc's add,
    /// and made 2^20 fresh mallocs of 16 B 10% slower on the H100).
    #[inline(always)]
    pub fn wait_fast(&self, n: u32) -> Result<(), Miss> {
        debug_assert!(n >= 1);
        // INV(SEM7): acquire pairs with the release in `signal`/`release`.
        let old = self
            .word
            .fetch_add_acquire(Fields::<L>::c_units(n).wrapping_neg());
        if Counters::unpack::<L>(old).c >= n as i64 {
            Ok(())
        } else {
            Err(Miss(old))
        }
    }

    /// The rest of [`wait`](Self::wait) after [`wait_fast`](Self::wait_fast) missed; but with
    /// `look`, a miss that saw no refill promised (E = 0) first looks `elsewhere` (once,
    /// before it reserves): `Err(t)` when that found what it needed, and the semaphore is
    /// left as it was. For UAlloc's arenas in a small heap, whose slots of a class live at
    /// the class's home (INV(UA16)): without it each SM's warps queued behind one refill of
    /// their own arena to reach the home one after another. A miss while a refill is
    /// promised waits for it, as `wait` does, with the same adds.
    ///
    /// The look gives the units back first (one more add), so that no transient deduction
    /// (INV(SEM3)) stays in C while `elsewhere` runs; then it reserves as `wait` does. When the
    /// state that add replaced shows `n` units here after all (a refill landed while our
    /// deduction hid it), it does not look: it waits here as `wait` would. Otherwise a waiter
    /// that our deduction made see an uncovered state could refill, fail and give up, while we
    /// took a unit elsewhere and left this one in C, unclaimed (the loom model
    /// `a_miss_looks_at_the_home_before_it_reserves`, found at preemption bound 3).
    /// `elsewhere` must not wait on this semaphore.
    #[inline(always)]
    pub fn wait_after<T>(
        &self,
        miss: Miss,
        n: u32,
        batch: u32,
        look: bool,
        elsewhere: impl FnOnce() -> Option<T>,
    ) -> Result<Wait, T> {
        if !look || Counters::unpack::<L>(miss.0).e != 0 {
            // As `wait`: give the units back and reserve them in one add (INV(SEM3)).
            let reserve = Fields::<L>::c_units(n) + Fields::<L>::r_units(n);
            let old = self.word.fetch_add_relaxed(reserve);
            return Ok(self.spin_reserved(n, batch, old.wrapping_add(reserve)));
        }
        // INV(SEM3): give the units back. C in the word this add replaced is at most the real
        // count less our `n`, so `>= 0` means `n` units are here now: wait for them here.
        let old = self.word.fetch_add_relaxed(Fields::<L>::c_units(n));
        if Counters::unpack::<L>(old).c >= 0 {
            return Ok(self.wait_slow(n, batch));
        }
        match elsewhere() {
            Some(t) => Err(t),
            None => Ok(self.wait_slow(n, batch)),
        }
    }

    /// End a [`Miss`] of `wait_fast(n)` without waiting: its deduction of `n` goes back to C
    /// (INV(SEM3)), with one add nobody waits for. For a caller that takes its units' worth
    /// elsewhere (UAlloc's runs of slots).
    #[inline(always)]
    pub fn cancel(&self, miss: Miss, n: u32) {
        let _ = miss;
        self.word.fetch_add_relaxed(Fields::<L>::c_units(n));
    }

    /// The slow path of `wait`: reserve, then take or refill (module doc).
    #[cold]
    fn wait_slow(&self, n: u32, batch: u32) -> Wait {
        // Relaxed: a reservation publishes nothing; the take that ends it is an acquire.
        let old = self.word.fetch_add_relaxed(Fields::<L>::r_units(n));
        debug_assert!(
            Counters::unpack::<L>(old).r + (n as i64) <= Fields::<L>::MAX_RESERVED as i64
        );
        self.spin_reserved(n, batch, old.wrapping_add(Fields::<L>::r_units(n)))
    }

    /// Hold a reservation of `n` (in R) until units or a refill duty end it; `word` is the
    /// state after our reservation, to decide on first. Spins only while promised refills
    /// cover every reservation, ours included (INV(SEM6)). The reservation is never dropped
    /// and retaken, so a refill that lands moves one waiter and not the whole crowd.
    #[cold]
    #[inline(never)]
    fn spin_reserved(&self, n: u32, batch: u32, mut word: u64) -> Wait {
        let need = n as i64;
        let take = Fields::<L>::c_units(n) + Fields::<L>::r_units(n);
        let promise = Fields::<L>::e_units(batch - n).wrapping_sub(Fields::<L>::r_units(n));
        let mut backoff = Backoff::new();
        loop {
            let s = Counters::unpack::<L>(word);
            if s.c >= need {
                // INV(SEM7): acquire pairs with the release in `signal`/`release`. C and R move
                // together, so the transient leaves `R - C` (what other waiters decide on)
                // unchanged.
                let old = self.word.fetch_add_acquire(take.wrapping_neg());
                if Counters::unpack::<L>(old).c >= need {
                    return Wait::Acquired;
                }
                // INV(SEM3): another waiter took them first; put back C and our reservation.
                self.word.fetch_add_relaxed(take);
            } else if s.r > s.c.max(0) + s.e {
                // Uncovered: turn our reservation into a refill promise (INV(SEM4)). Acquire:
                // the decision stays after the loads that led to it.
                let old = Counters::unpack::<L>(self.word.fetch_add_acquire(promise));
                debug_assert!(old.e + ((batch - n) as i64) <= Fields::<L>::MAX_EXPECTED as i64);
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
        debug_assert!(Counters::unpack::<L>(self.word.load_relaxed()).e >= expected as i64);
        // INV(SEM2): E >= expected (this thread added it), so the E subtraction never borrows.
        // INV(SEM7): release pairs with the acquire in `wait`/`try_wait` of whoever takes them.
        self.word.fetch_add_release(
            Fields::<L>::c_units(n).wrapping_sub(Fields::<L>::e_units(expected)),
        );
    }

    /// [`signal`](Self::signal) for a caller that issued an acq_rel fence after what the units
    /// stand for (`platform::fence_acq_rel`): the fence and this relaxed add are the release
    /// (INV(SEM7)), and the same fence also orders the caller's next relaxed store (TBuddy's
    /// unlock after `make_available`), one MEMBAR on the GPU for both.
    #[inline]
    pub fn signal_fenced(&self, n: u32, expected: u32) {
        debug_assert!(Counters::unpack::<L>(self.word.load_relaxed()).e >= expected as i64);
        self.word.fetch_add_relaxed(
            Fields::<L>::c_units(n).wrapping_sub(Fields::<L>::e_units(expected)),
        );
    }

    /// Withdraw a promise of `expected` units (`E -= expected`): a refill that failed. Waiters
    /// that counted on it notice and retry (INV(SEM6)).
    #[inline]
    pub fn retract(&self, expected: u32) {
        debug_assert!(Counters::unpack::<L>(self.word.load_relaxed()).e >= expected as i64);
        // Relaxed: no units are published; spinners see the new E eventually.
        self.word.fetch_sub_relaxed(Fields::<L>::e_units(expected));
    }

    /// Promise `expected` units without waiting (`E += expected`): for a producer that decided
    /// on its own to make units (TBuddy's merge announces the merged block one order up, so the
    /// pages in transit are never invisible to a waiter). Answered, like a `MustRefill`, by one
    /// `signal(_, expected)` or `retract(expected)` (INV(SEM4)). The caller keeps E within
    /// `MAX_EXPECTED` (one open promise per thread and semaphore is always within it).
    #[inline]
    pub fn promise(&self, expected: u32) {
        debug_assert!(
            Counters::unpack::<L>(self.word.load_relaxed()).e + expected as i64
                <= Fields::<L>::MAX_EXPECTED as i64
        );
        // Relaxed: publishes nothing; waiters that see it spin for the units instead of failing.
        self.word.fetch_add_relaxed(Fields::<L>::e_units(expected));
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
        self.word.fetch_add_relaxed(Fields::<L>::c_units(n));
    }

    /// Take `n` units only if C holds them now; never refills, never spins.
    ///
    /// One add, rolled back when C was short: like the fast path of `wait` it makes a
    /// transient deduction (INV(SEM3)), and it can fail while another thread's deduction is
    /// in flight although the units exist. Callers that must know (the TBuddy merge) re-check.
    #[inline]
    pub fn try_wait(&self, n: u32) -> bool {
        // INV(SEM7): acquire pairs with the release in `signal`/`release`.
        let old = self
            .word
            .fetch_add_acquire(Fields::<L>::c_units(n).wrapping_neg());
        if Counters::unpack::<L>(old).c >= n as i64 {
            return true;
        }
        // INV(SEM3): give the units back.
        self.word.fetch_add_relaxed(Fields::<L>::c_units(n));
        false
    }

    /// `n` units for a thread that must not [`wait`](Self::wait) here, because R and E are
    /// sized for other threads (an arena's semaphores and another SM, INV(SEM2)): a
    /// [`try_wait`](Self::try_wait), or else ONE refill at a time through `gate`, which other
    /// such threads join instead of refilling too (INV(UA16)).
    ///
    /// A refill promises `batch - n` units and calls `refill`, which must answer the promise
    /// with `signal(_, batch - n)` or `retract(batch - n)` (INV(SEM4)) and return
    /// `Some(token)` when it made units and kept `n` of them for the caller. A thread that
    /// joins a refill that succeeded looks for units again, `tries` times in all.
    pub fn take_shared(
        &self,
        gate: &SingleFlight,
        n: u32,
        batch: u32,
        tries: u32,
        refill: impl Fn() -> Option<u64>,
    ) -> Shared {
        for _ in 0..tries {
            // A plain load first: a failed `try_wait` is two atomics on a shared line.
            if self.available() >= n && self.try_wait(n) {
                return Shared::Taken;
            }
            let mut token = 0;
            let run = gate.try_run(|| {
                // Another refill may have ended just before this one started.
                if self.try_wait(n) {
                    return 1;
                }
                self.promise(batch - n);
                match refill() {
                    Some(t) => {
                        token = t;
                        2
                    }
                    None => 0,
                }
            });
            match run {
                Ok(0) => return Shared::Exhausted,
                Ok(1) => return Shared::Taken,
                Ok(_) => return Shared::Refilled(token),
                Err(running) => {
                    // The refill in flight found nothing, after its trims: neither would ours.
                    // (Refilling alone instead let every waiter of a failed refill carve a bin
                    // of its own from the last free bins: on the H100 a mixed fill of 64 MiB
                    // then served 84.6% instead of 96.6%.)
                    if gate.join(running) == 0 {
                        return Shared::Exhausted;
                    }
                }
            }
        }
        Shared::Busy
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
    /// are not active when it is called simply form other groups. On the host a warp is one
    /// lane and this is `wait`; under loom too, but for the lanes of a `ModelWarp`
    /// (`loom_warp.rs`).
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
        let old = self
            .word
            .fetch_add_acquire(Fields::<L>::c_units(total).wrapping_neg());
        let c = Counters::unpack::<L>(old).c;
        let served = if c <= 0 {
            0
        } else {
            (c / n as i64).min(lanes as i64) as u32
        };
        let unused = total - served * n;
        if unused > 0 {
            // INV(SEM3): give back what the lanes that were not served deducted.
            self.word.fetch_add_relaxed(Fields::<L>::c_units(unused));
        }
        served
    }

    /// Take up to `max` units that no reserved waiter is owed (C beyond R), without waiting:
    /// the number taken. A load first, so that a semaphore with nothing spare costs no atomic;
    /// then one add, decided on the state it replaced, and a second that gives back what was
    /// not spare (a transient deduction, INV(SEM3)). Waiters that hold a reservation keep
    /// their units, so a taker outside the semaphore's protocol (TBuddy's group path) cannot
    /// turn a covered waiter into a refiller that finds nothing.
    #[inline]
    pub fn take_spare(&self, max: u32) -> u32 {
        let now = Counters::unpack::<L>(self.word.load_relaxed());
        if max == 0 || now.c - now.r <= 0 {
            return 0;
        }
        // INV(SEM7): acquire pairs with the release in `signal`/`release`.
        let old = Counters::unpack::<L>(
            self.word
                .fetch_add_acquire(Fields::<L>::c_units(max).wrapping_neg()),
        );
        let got = (old.c - old.r).clamp(0, max as i64) as u32;
        if got < max {
            // INV(SEM3): give back what was not spare.
            self.word.fetch_add_relaxed(Fields::<L>::c_units(max - got));
        }
        got
    }

    /// C as a relaxed snapshot (0 while transient deductions exceed it).
    pub fn available(&self) -> u32 {
        self.counters().0
    }

    /// `(C, E, R)` as a relaxed snapshot, for tests and statistics (C clamped at 0).
    pub fn counters(&self) -> (u32, u32, u32) {
        let s = Counters::unpack::<L>(self.word.load_relaxed());
        (s.c.max(0) as u32, s.e as u32, s.r as u32)
    }
}

impl<L: Layout> Default for BulkSemaphore<L> {
    fn default() -> Self {
        Self::new(0)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn zeroed_word_is_empty() {
        let s = BulkSemaphore::<Global>::new(0);
        assert_eq!(s.counters(), (0, 0, 0));
        assert_eq!(s.word.load_relaxed(), 0);
    }

    #[test]
    fn wait_refill_signal_single_thread() {
        let s = BulkSemaphore::<Global>::new(0);
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
        let s = BulkSemaphore::<Global>::new(2);
        assert!(s.try_wait(2));
        assert!(!s.try_wait(1));
        s.release(1);
        assert!(!s.try_wait(2));
        assert!(s.try_wait(1));
        assert_eq!(s.available(), 0);
    }

    #[test]
    fn take_spare_leaves_the_units_of_reserved_waiters() {
        let s = BulkSemaphore::<Global>::new(5);
        // Two waiters hold reservations.
        s.word.fetch_add_relaxed(Fields::<Global>::r_units(2));
        assert_eq!(s.take_spare(10), 3);
        assert_eq!(s.counters(), (2, 0, 2));
        assert_eq!(s.take_spare(1), 0);
        assert_eq!(s.counters(), (2, 0, 2));
        s.release(1);
        assert_eq!(s.take_spare(1), 1);
        assert_eq!(s.counters(), (2, 0, 2));
    }

    #[test]
    fn fast_path_failure_rolls_back() {
        let s = BulkSemaphore::<Global>::new(1);
        assert_eq!(s.wait(2, 2), Wait::MustRefill);
        assert_eq!(s.counters(), (1, 0, 0));
        s.retract(0);
        assert_eq!(s.wait(1, 2), Wait::Acquired);
        assert_eq!(s.counters(), (0, 0, 0));
    }

    #[test]
    fn collective_on_one_lane_is_wait() {
        let s = BulkSemaphore::<Global>::new(1);
        assert_eq!(s.wait_collective(1, 2), Wait::Acquired);
        assert_eq!(s.wait_collective(1, 2), Wait::MustRefill);
        assert_eq!(s.counters(), (0, 1, 0));
        s.signal(1, 1);
        assert_eq!(s.counters(), (1, 0, 0));
    }

    #[test]
    fn fields_do_not_interfere_at_their_bounds() {
        at_bounds::<Global>();
        at_bounds::<PerSm>();
    }

    fn at_bounds<L: Layout>() {
        let (max_available, max_reserved, max_expected) = (
            Fields::<L>::MAX_AVAILABLE,
            Fields::<L>::MAX_RESERVED,
            Fields::<L>::MAX_EXPECTED,
        );
        let s = BulkSemaphore::<L>::new(max_available);
        assert_eq!(s.counters(), (max_available, 0, 0));
        assert_eq!(s.wait(max_reserved, max_reserved), Wait::Acquired);
        assert!(s.try_wait(max_available - max_reserved));
        assert_eq!(s.counters(), (0, 0, 0));
        // A refiller promising the most E can hold.
        assert_eq!(s.wait(1, max_expected + 1), Wait::MustRefill);
        assert_eq!(s.counters(), (0, max_expected, 0));
        s.signal(max_expected, max_expected);
        assert_eq!(s.counters(), (max_expected, 0, 0));
        // C just below and above the 24 bits of the global layout: a count the arena words
        // must hold (an arena's free 16 B slots in a heap over 128 MiB).
        let s = BulkSemaphore::<L>::new(0);
        let big = (1u32 << 23) + 5;
        if big <= max_available {
            s.release(big);
            assert_eq!(s.counters(), (big, 0, 0));
            assert!(s.try_wait(big - 1));
            assert!(!s.try_wait(2));
            assert_eq!(s.counters(), (1, 0, 0));
        }
    }

    #[test]
    fn per_sm_layout_holds_a_count_the_global_one_cannot() {
        const {
            assert!(Fields::<PerSm>::MAX_AVAILABLE as u64 >= (1 << 31) - 1);
            assert!(Fields::<Global>::MAX_AVAILABLE < (1 << 23) + 5);
            // Every thread of an SM waiting, one unit each, with the largest batch UAlloc uses.
            assert!(Fields::<PerSm>::MAX_RESERVED >= 2048);
            assert!(Fields::<PerSm>::MAX_EXPECTED >= 2048 + 256 + 2048 * 255);
            assert!(Fields::<Global>::MAX_RESERVED >= 132 * 2048);
        }
    }
}
