//! A bin: a run of same-size slots behind a 128 B header with the slot bitmap.
//!
//! ```text
//!  BinHeader (128 B, the bin's first block)
//!  ┌──────────────────────────────┬──────┬──────┬─────┬──────┬──────┬────────┬───────┬─────────┬───────┐
//!  │ bitmap: 8 × u64 (512 slots)  │ next │ prev │ rcu │ used │ info │ listed │ owner │ pending │ pnext │
//!  └──────────────────────────────┴──────┴──────┴─────┴──────┴──────┴────────┴───────┴─────────┴───────┘
//!   bit i of word w: slot 64w+i is taken, or does not exist (i ≥ slots: always set)
//! ```
//!
//! Claiming is two-stage (the bulk semaphore of the class already guaranteed that a free slot
//! exists somewhere in the arena's list): a claimer first counts what it wants in `used`, then
//! `fetch_or`s up to 32 free bits of one word (one atomic for a whole warp), and gives back the
//! count of bits another claimer won first (rare: one more atomic). Releasing clears the bits,
//! then decrements `used` by the bits it cleared. So a set bit is always counted before it is
//! set and uncounted after it is cleared:
//! INV(UA3): `count(used) >= popcount(taken slot bits)`, with equality whenever no claim or
//! release is between its atomics. A release therefore never drives the count below zero, and
//! `used == 0` means no slot is taken and no claim is under way. Because the count can run
//! ahead of the bitmap, "full" is detected as a crossing of the count (`old < slots <= new`
//! upwards, `new < slots <= old` downwards), and every crossing is reconciled under the list
//! mutex (INV(UA7)).
//!
//! A bin is retired (returned to its chunk) only through `used`: the CAS `0 → RETIRED`
//! (INV(UA4)). A claimer whose count finds `RETIRED` takes its count back and never touches
//! the bitmap; a release on a retired bin finds every bit clear and reports a double free.
//! The header is only touched with atomics, in place in the chunk's memory; zeroed memory is a
//! bin that is not carved (`info == 0`).
//!
//! A double free that comes after its slot was claimed again cannot be told from the new
//! owner's free (no allocator can): it frees the new owner's slot. The metadata stays
//! consistent (INV(UA3)); only the program that freed twice sees its block handed out twice.

use crate::platform::{Atomic32, Atomic64};
use crate::rcu::RcuHead;
use crate::size_class::SizeClass;
use crate::ualloc::layout::{BITMAP_WORDS, WORD_BITS};

/// `used` bits that count claimed slots. Wide enough for a bin's slots plus the counts that
/// claimers add for a moment before they give back what they did not get (`claim_from`):
/// every resident thread of the GPU may be one such claimer on the same bin. With 12 bits,
/// 116 claimers of 32 on a full bin of 400 slots carried into the flag bits: the bin then read
/// as retired, `sync_listing` unlinked it, and the give-backs' crossing test, made on the
/// masked count, missed its return below "full", so its free slots were never listed again.
pub const USED_COUNT_MASK: u32 = (1 << 20) - 1;
/// `used` flag: the bin is retired (INV(UA4)). Any bit outside [`USED_COUNT_MASK`] makes the
/// bin unclaimable: a release that races a retirement can transiently borrow into them.
pub const USED_RETIRED: u32 = 1 << 31;

/// Where the fresh cursor sits in `used` (INV(UA15)): the high half, so that a count that
/// carries or borrows never reaches it (counts stay far below 2^31 + 2^31), and a cursor that
/// wraps after 2^32 slots' worth of claims only costs collisions that `fetch_or` detects.
const CURSOR_SHIFT: u32 = 32;

/// Classes with fewer slots per bin than this look at `used` before they count (`claim_from`).
const FEW_SLOTS: u32 = WORD_BITS as u32;

// INV(UA3): the count never carries into the flags. It is at most a bin's slots plus what the
// claimers in flight have added, one unit per thread that may claim: every thread resident on
// the GPU, which the TBuddy semaphores' R field bounds too (INV(SEM2), below 2^19).
const _: () = assert!(
    crate::ualloc::layout::MAX_SLOTS as u32
        + crate::bulk_semaphore::Fields::<crate::bulk_semaphore::Global>::MAX_RESERVED
        <= USED_COUNT_MASK
);
const _: () = assert!(USED_RETIRED & USED_COUNT_MASK == 0);

/// On a bin's owner word: the bin was carved for a run of slots (`ualloc::run`, INV(UA19)).
/// Arena indices stay far below it.
pub const RUN_BIN: u32 = 1 << 31;

/// The header of a bin (see the module doc). Lives at the bin's first byte.
#[repr(C, align(128))]
pub struct BinHeader {
    /// Slot bitmap (module doc).
    bitmap: [Atomic64; BITMAP_WORDS],
    /// Next bin of the class list (address, 0 = end). Read by RCU readers, written under the
    /// class list's mutex; kept when the bin is unlinked, so readers standing on it go on.
    pub(crate) next: Atomic64,
    /// Previous bin of the class list (0 = head). Under the list's mutex only.
    pub(crate) prev: Atomic64,
    /// Link for the deferred return to the chunk.
    pub(crate) rcu: RcuHead,
    /// Low half: claimed slots plus [`USED_RETIRED`] (INV(UA3), INV(UA4)). High half: the
    /// fresh cursor (INV(UA15)): slots from it on have not been handed out since the bin was
    /// carved or last found empty. One `fetch_add` moves both.
    used: Atomic64,
    /// `class index + 1` while carved, 0 otherwise (INV(UA5)).
    info: Atomic32,
    /// 1 while linked into its class list (INV(UA7)). Under the list's mutex only.
    pub(crate) listed: Atomic32,
    /// Index of the arena that carved the bin: its class list, slot semaphore and SRCU domain
    /// hold the bin while carved (INV(UA12)); usually the arena of the bin's chunk, another
    /// one when the bin was taken from another arena's chunk (steal.rs). Set before the class
    /// is published. With [`RUN_BIN`] when the bin was carved for a run of slots
    /// (`ualloc::run`): a `free` into it asks the run whether it handed the slot out.
    owner: Atomic32,
    /// Crossings of "full" downwards not yet settled by a drain of the owner's
    /// [`PendingStack`](super::pending::PendingStack) for the class; non-zero exactly while
    /// the bin is on that stack (INV(UA13)). A bin whose count is non-zero is not returned to
    /// its chunk.
    pub(crate) pending: Atomic32,
    /// The next bin on the pending stack (address; `UNSET` while a push is linking it).
    pub(crate) pnext: Atomic64,
}

#[cfg(not(loom))]
const _: () = assert!(core::mem::size_of::<BinHeader>() == crate::ualloc::layout::BIN_HEADER_SIZE);

/// The class an `info` word names (INV(UA5): 0, not carved, names none).
#[inline(always)]
fn class_of(info: u32) -> Option<SizeClass> {
    SizeClass::from_index((info as usize).wrapping_sub(1))
}

/// What one [`BinHeader::claim`] got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Slots `64 * word + i` for each bit `i` of `bits` are the caller's. `resync`: the count
    /// crossed "full" (the caller must reconcile the bin's listing, INV(UA7)).
    Got { word: u32, bits: u64, resync: bool },
    /// No free bit was found in one pass over the words. `resync` as for `Got`. `emptied`:
    /// giving back the count left the bin with no slot taken (the caller counts it for the
    /// trims, INV(UA17)).
    NoneFree { resync: bool, emptied: bool },
    /// The bin is retired (or being); nothing was taken.
    Retired,
}

/// What one [`BinHeader::release`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// The slot was freed. `was_full`: the bin was full (the caller must relink it);
    /// `now_empty`: it was the last claimed slot (the caller may retire the bin).
    Freed { was_full: bool, now_empty: bool },
    /// The slot's bit was already clear (or the bin was retired): nothing changed.
    DoubleFree,
}

/// What one [`BinHeader::release_many`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    /// The bitmap word before the release: a slot of the request was freed by this call iff
    /// its bit is set here.
    pub old: u64,
    /// The bin was full before (the caller must relink it, INV(UA7)).
    pub was_full: bool,
    /// Slots still claimed after the release (a snapshot).
    pub left: u32,
}

/// The lowest `n` set bits of `bits`.
#[inline(always)]
pub fn lowest_bits(bits: u64, n: u32) -> u64 {
    if bits.count_ones() <= n {
        return bits;
    }
    let mut rest = bits;
    let mut out = 0;
    for _ in 0..n {
        let low = rest & rest.wrapping_neg();
        out |= low;
        rest ^= low;
    }
    out
}

/// The bitmap word `w` of a fresh bin of `slots` slots with its first `claimed` slots taken.
#[inline(always)]
fn initial_word(w: usize, slots: u32, claimed: u32) -> u64 {
    let lo = (w * WORD_BITS) as u32;
    let taken = |n: u32| -> u64 {
        // Bits `0..n - lo` of this word, clamped to the word.
        match n.saturating_sub(lo) {
            0 => 0,
            k if k >= WORD_BITS as u32 => u64::MAX,
            k => (1u64 << k) - 1,
        }
    };
    // Slots that do not exist are permanently taken.
    taken(claimed) | !taken(slots)
}

impl BinHeader {
    /// A header that is not carved (all-zero); for loom models and tests. In the allocator
    /// headers live in chunk memory and are used in place.
    pub fn new() -> Self {
        Self {
            bitmap: core::array::from_fn(|_| Atomic64::new(0)),
            next: Atomic64::new(0),
            prev: Atomic64::new(0),
            rcu: RcuHead::new(),
            used: Atomic64::new(0),
            info: Atomic32::new(0),
            listed: Atomic32::new(0),
            owner: Atomic32::new(0),
            pending: Atomic32::new(0),
            pnext: Atomic64::new(0),
        }
    }

    /// Carve the bin for `class` with its first `claimed` slots taken, for arena 0: see
    /// [`init_for`](Self::init_for).
    pub fn init(&self, class: SizeClass, claimed: u32) {
        self.init_for(0, class, claimed)
    }

    /// Carve the bin for `class` with its first `claimed` slots taken, owned by arena `owner`
    /// (INV(UA12)). The caller owns the bin exclusively (just taken from a chunk) and publishes
    /// it afterwards (list link, release).
    pub fn init_for(&self, owner: u32, class: SizeClass, claimed: u32) {
        self.prepare_for(owner, class, claimed);
        // Release: pairs with the acquire in `class` (a `free` validating a pointer sees a
        // fully initialized bin once it sees the class).
        self.info.store_release(class.index() as u32 + 1);
    }

    /// [`init_for`](Self::init_for) but for the class: every word but `info`, relaxed. The
    /// carver then makes one release fence for all the bins it prepared and
    /// [`publish_class`](Self::publish_class)es each: a refill that carves many bins pays
    /// one fence instead of one per bin.
    pub fn prepare_for(&self, owner: u32, class: SizeClass, claimed: u32) {
        debug_assert!(claimed <= class.slots());
        self.owner.store_relaxed(owner);
        for (w, word) in self.bitmap.iter().enumerate() {
            word.store_relaxed(initial_word(w, class.slots(), claimed));
        }
        // The cursor starts after the slots the carver keeps (INV(UA15)).
        self.used
            .store_relaxed(claimed as u64 | (claimed as u64) << CURSOR_SHIFT);
        self.next.store_relaxed(0);
        self.prev.store_relaxed(0);
        self.listed.store_relaxed(0);
        // INV(UA13): a bin goes back to its chunk only with a zero count, but a fresh chunk's
        // memory is arbitrary.
        self.pending.store_relaxed(0);
    }

    /// The class of a bin [`prepare_for`](Self::prepare_for) initialized, after a release
    /// fence that follows the preparation: the fence and this store pair with the acquire in
    /// [`class`](Self::class) as `init_for`'s release store does.
    pub fn publish_class(&self, class: SizeClass) {
        self.info.store_relaxed(class.index() as u32 + 1);
    }

    /// The class while carved (INV(UA5)).
    #[inline(always)]
    pub fn class(&self) -> Option<SizeClass> {
        // Acquire: pairs with the release in `init`.
        class_of(self.info.load_acquire())
    }

    /// The arena that carved the bin (INV(UA12)). Relaxed: read after [`class`](Self::class)
    /// (an acquire) it belongs to the carving whose class was seen, or a later one.
    #[inline(always)]
    pub fn owner(&self) -> u32 {
        self.owner.load_relaxed() & !RUN_BIN
    }

    /// `info` and the owner's word ([`owner`](Self::owner), with [`RUN_BIN`] when the bin
    /// was carved for a run), loaded back to back so that both are in flight at once.
    /// `ordered`: `info` with acquire, as [`class`](Self::class); otherwise hints.
    #[inline(always)]
    pub fn look(&self, ordered: bool) -> (Option<SizeClass>, u32) {
        let info = if ordered {
            self.info.load_acquire()
        } else {
            self.info.load_relaxed()
        };
        (class_of(info), self.owner.load_relaxed())
    }

    /// Crossings noted and not yet settled by a drain (INV(UA13)); 0 when the bin is on no
    /// pending stack. Acquire: pairs with the release CAS that ended the last drain of the
    /// bin, so a caller that sees 0 may give the bin back to its chunk.
    #[inline(always)]
    pub fn pending_count(&self) -> u32 {
        self.pending.load_acquire()
    }

    /// Mark the bin not carved (it goes back to its chunk; INV(UA5)).
    pub fn uncarve(&self) {
        self.info.store_release(0);
    }

    /// [`uncarve`](Self::uncarve) for a bin of a chunk that nobody can reach yet: the chunk's
    /// adoption publishes it with one release (its magic) after all its bins. A release per
    /// bin here was a MEMBAR per bin on the GPU: 124 in every small chunk's adoption, 127 per
    /// call in ncu of a fresh 16 B malloc, on the path of each arena's first refill.
    pub fn uncarve_unpublished(&self) {
        self.info.store_relaxed(0);
    }

    /// Claim up to `need` free slots in one word, trying the words from `start` on:
    /// [`claim_from`](Self::claim_from) without rotation.
    #[inline]
    pub fn claim(&self, class: SizeClass, start: usize, need: u32) -> Claim {
        self.claim_from(class, start as u32, 0, need)
    }

    /// Claim up to `need` (at most 64) free slots in one word. One `fetch_add` counts `need`
    /// (INV(UA3): count first) and moves the fresh cursor by `need` (INV(UA15)). While the
    /// cursor it read is below the slot count, the slots from it on (to the end of its word)
    /// are free unless another claimer picked them from a scan: no search, and claimers that
    /// come together get disjoint runs. Past the cursor, the words are scanned from `start`
    /// on and, in a word, the free bits from bit `rotate` upwards (wrapping), so that
    /// claimers that start at different words and rotations ask for different bits. Then one
    /// `fetch_or`; one `fetch_sub` gives back the count of the slots not got (fewer free, or
    /// taken first by another claimer).
    ///
    /// ncu of a fresh 16 B malloc before the cursor: 2.3 `fetch_or`s per claim, as warps of
    /// one SM picked the same free bits of the bin at the head of the list, and a load of
    /// `used` and of the word before each.
    #[inline]
    pub fn claim_from(&self, class: SizeClass, start: u32, rotate: u32, need: u32) -> Claim {
        debug_assert!(need > 0 && need as usize <= WORD_BITS);
        let slots = class.slots();
        let mut need = need;
        if slots < FEW_SLOTS {
            // A bin smaller than a word is often full, or has fewer free slots than a warp
            // asks for, when a walker reaches it: one load first spares the add and the
            // give-back of its count (the 4 KB class got 10% slower without it).
            let used = self.used.load_relaxed() as u32;
            if used & !USED_COUNT_MASK != 0 {
                return Claim::Retired;
            }
            if used >= slots {
                return Claim::NoneFree {
                    resync: false,
                    emptied: false,
                };
            }
            need = need.min(slots - used);
        }
        // INV(UA3): count first. Relaxed: `used` is one location, so either the CAS in
        // `try_retire` saw our count or we see its flag (INV(UA4)); the release half of the
        // `fetch_or` below keeps this count before our bits.
        let old = self
            .used
            .fetch_add_relaxed(need as u64 | (need as u64) << CURSOR_SHIFT);
        let count = old as u32;
        if count & !USED_COUNT_MASK != 0 {
            // Retired: nothing was set; take the count back (the cursor of a retired bin
            // means nothing; carving sets it again).
            self.used.fetch_sub_relaxed(need as u64);
            return Claim::Retired;
        }
        // The count may run ahead of the bitmap for a moment (INV(UA3)): crossings of "full"
        // are the caller's to reconcile (INV(UA7)).
        let mut resync = count < slots && count + need >= slots;
        let cursor = (old >> CURSOR_SHIFT) as u32;
        let mut got = (0, 0);
        if count < slots {
            got = if cursor < slots {
                // Fresh slots: from the cursor to the end of its word, or of the bin.
                let w = cursor / WORD_BITS as u32;
                let lo = cursor % WORD_BITS as u32;
                let len = need.min(WORD_BITS as u32 - lo).min(slots - cursor);
                let want = (u64::MAX >> (WORD_BITS as u32 - len)) << lo;
                (w, self.claim_bits(w, want))
            } else {
                self.claim_scan(class, start, rotate, need)
            };
        }
        let (word, bits) = got;
        let back = need - bits.count_ones();
        let mut emptied = false;
        if back > 0 {
            // The count of what we did not get goes back (its slots are someone else's or do
            // not exist); the cursor keeps its move, and slots it passed are found by scans.
            let was = self.used.fetch_sub_relaxed(back as u64) as u32 & USED_COUNT_MASK;
            resync |= was >= slots && was - back < slots;
            emptied = was == back;
        }
        if bits != 0 {
            Claim::Got { word, bits, resync }
        } else {
            Claim::NoneFree { resync, emptied }
        }
    }

    /// Set the bits of `want` in word `w`: the bits that were clear are ours.
    #[inline(always)]
    fn claim_bits(&self, w: u32, want: u64) -> u64 {
        // Acquire: pairs with the release in `release_many` by the slots' previous owners
        // (their writes happen before ours). No release half (it was a MEMBAR per claim on
        // the GPU, 5% of a warm 16 B malloc's stall samples in ncu): our count must come
        // before the `fetch_sub` of any release that clears these bits (INV(UA3)), and the
        // free of a block happens after the malloc that returned it, which is after our
        // count in program order. Only a bad free that races the claim of the same slot
        // (a double free of its previous life) is not ordered after it; on the GPU the
        // `fetch_or` is not even issued before the count's `fetch_add` has returned (it
        // depends on its value), and were the count to borrow for a moment, the two adds
        // still commute: the word comes back, and a claimer that reads a borrowed count sees
        // flag bits and takes its count back.
        let old = self.bitmap[w as usize].fetch_or_acquire(want);
        want & !old
    }

    /// Past the cursor: up to `need` free bits of the first word from `start` on that has
    /// any, claimed; a word whose bits were all taken first is passed. `(word, 0)`: none.
    #[inline(always)]
    fn claim_scan(&self, class: SizeClass, start: u32, rotate: u32, need: u32) -> (u32, u64) {
        let words = class.bitmap_words() as u32;
        // 32-bit arithmetic and no division in the loop (a 64-bit `%` here cost a division
        // sequence per word).
        let mut w = start % words;
        for _ in 0..words {
            let at = w;
            w = if w + 1 == words { 0 } else { w + 1 };
            let free = !self.bitmap[at as usize].load_relaxed();
            if free == 0 {
                continue;
            }
            let want = lowest_bits(free.rotate_right(rotate), need).rotate_left(rotate);
            let bits = self.claim_bits(at, want);
            if bits != 0 {
                return (at, bits);
            }
        }
        (0, 0)
    }

    /// Free slot `slot` (`< class.slots()`): [`release_many`](Self::release_many) of one bit.
    #[inline]
    pub fn release(&self, class: SizeClass, slot: u32) -> Release {
        let bit = 1u64 << (slot as usize % WORD_BITS);
        let r = self.release_many(class, slot / WORD_BITS as u32, bit);
        if r.old & bit != 0 {
            Release::Freed {
                was_full: r.was_full,
                now_empty: r.left == 0,
            }
        } else {
            Release::DoubleFree
        }
    }

    /// Free the slots of `bits` in bitmap word `word` with one `fetch_and` and one `fetch_sub`
    /// (a warp's group of frees). Bits that were already clear are double frees and change
    /// nothing; the caller tells them apart with [`Released::old`]. Never undone: every bit
    /// it clears was counted before it was set (INV(UA3)).
    #[inline]
    pub fn release_many(&self, class: SizeClass, word: u32, bits: u64) -> Released {
        self.release_bits(class, word, bits, false)
    }

    /// [`release_many`](Self::release_many) for a caller that has already issued a release
    /// fence after the slots' owners' last writes to them (`free` does: it enters a read
    /// section, whose entry is such a fence, after the owners' writes). The `fetch_and` is
    /// then an acquire only: the fence before it makes the pair a release, without a second
    /// MEMBAR on the GPU.
    #[inline]
    pub fn release_many_fenced(&self, class: SizeClass, word: u32, bits: u64) -> Released {
        self.release_bits(class, word, bits, true)
    }

    #[inline(always)]
    fn release_bits(&self, class: SizeClass, word: u32, bits: u64, fenced: bool) -> Released {
        let w = word as usize;
        debug_assert!(w < class.bitmap_words());
        // Release (here, or the caller's fence): the owners' writes to the slots happen before
        // the next claimer's acquire `fetch_or` (pairs with `claim`). Acquire: the claims of
        // the bits we clear (their counts) happen before our `fetch_sub` below, which
        // therefore never underflows.
        let old = if fenced {
            self.bitmap[w].fetch_and_acquire(!bits)
        } else {
            self.bitmap[w].fetch_and_acq_rel(!bits)
        };
        let n = (old & bits).count_ones();
        if n == 0 {
            return Released {
                old,
                was_full: false,
                left: self.used_count(),
            };
        }
        // Relaxed: the acquire above orders it after the counts it takes back. A retirement
        // that sees the count reach 0 before our clear lands is still right: these slots are
        // dead, and the bin goes back to its chunk only after a grace period, which our read
        // section's release ends after the clear.
        let used = self.used.fetch_sub_relaxed(n as u64);
        let count = used as u32 & USED_COUNT_MASK;
        debug_assert!(
            used as u32 & !USED_COUNT_MASK == 0 && count >= n,
            "INV(UA3): a set bit is counted"
        );
        if count == n {
            // Empty, as far as this release knows: every bit is clear and no claim is under
            // way (INV(UA3)) unless the word moved since. Then the whole bin is fresh again
            // (INV(UA15)): the cursor goes back to 0, only if nothing changed the word (a
            // claim's count would have). Relaxed: the bits are not touched.
            let now = used - n as u64;
            let _ = self
                .used
                .compare_exchange_relaxed(now, now & !(u64::MAX << CURSOR_SHIFT));
        }
        Released {
            old,
            // A crossing of "full" downwards (INV(UA3)).
            was_full: count >= class.slots() && count - n < class.slots(),
            left: count - n,
        }
    }

    /// Retire the bin if no slot is claimed: `used` 0 → RETIRED (INV(UA4)). After success no
    /// claim can succeed on this bin until it is carved again.
    #[inline]
    pub fn try_retire(&self) -> bool {
        // The cursor half is not part of the test: only the count must be 0. A CAS that
        // fails because the cursor moved saw a claim (its count), or a release that made the
        // bin fresh again: look again.
        let mut now = self.used.load_relaxed();
        while now as u32 == 0 {
            // Acq_rel: pairs with the fetch_add in `claim` and the fetch_sub in `release`.
            match self
                .used
                .compare_exchange_acq_rel(now, now | USED_RETIRED as u64)
            {
                Ok(_) => return true,
                Err(seen) => now = seen,
            }
        }
        false
    }

    /// `used` as a snapshot: claimed count plus flags.
    #[inline(always)]
    pub fn used_word(&self) -> u32 {
        self.used.load_relaxed() as u32
    }

    /// Claimed slots (a snapshot; `u32::MAX` when retired).
    #[inline(always)]
    pub fn used_count(&self) -> u32 {
        let u = self.used.load_relaxed() as u32;
        if u & !USED_COUNT_MASK != 0 {
            u32::MAX
        } else {
            u
        }
    }

    /// Whether the bin is retired (a snapshot).
    #[inline(always)]
    pub fn is_retired(&self) -> bool {
        self.used.load_relaxed() as u32 & !USED_COUNT_MASK != 0
    }

    /// Taken slot bits of the bitmap, counted (quiescent checks).
    pub fn taken_slots(&self, class: SizeClass) -> u32 {
        let mut n = 0;
        for w in 0..class.bitmap_words() {
            let valid = !initial_word(w, class.slots(), 0);
            n += (self.bitmap[w].load_relaxed() & valid).count_ones();
        }
        n
    }

    /// Whether slot `slot`'s bit is set (tests).
    pub fn is_taken(&self, slot: u32) -> bool {
        let w = slot as usize / WORD_BITS;
        self.bitmap[w].load_relaxed() & (1 << (slot as usize % WORD_BITS)) != 0
    }
}

impl Default for BinHeader {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn c(size: usize) -> SizeClass {
        SizeClass::from_size(size)
    }

    #[test]
    fn initial_words_mark_missing_slots() {
        // 408 slots: words 0..6 free, word 6 has 24 slots.
        assert_eq!(initial_word(0, 408, 0), 0);
        assert_eq!(initial_word(6, 408, 0), !((1u64 << 24) - 1));
        assert_eq!(initial_word(7, 408, 0), u64::MAX);
        assert_eq!(initial_word(0, 408, 3), 0b111);
        assert_eq!(initial_word(1, 408, 70), 0b11_1111);
        assert_eq!(lowest_bits(0b1011_0100, 2), 0b0001_0100);
        assert_eq!(lowest_bits(0b101, 5), 0b101);
    }

    #[test]
    fn claim_until_full_then_release_until_empty() {
        let b = BinHeader::new();
        let class = c(128);
        b.init(class, 1);
        assert_eq!(b.class(), Some(class));
        let mut got = 1;
        loop {
            match b.claim(class, 0, 7) {
                Claim::Got { bits, resync, .. } => {
                    got += bits.count_ones();
                    assert_eq!(resync, got == class.slots());
                }
                Claim::NoneFree { resync, emptied } => {
                    assert!(!resync && !emptied);
                    break;
                }
                Claim::Retired => unreachable!(),
            }
        }
        assert_eq!(got, 32);
        assert_eq!(b.taken_slots(class), 32);
        assert_eq!(
            b.release(class, 31),
            Release::Freed {
                was_full: true,
                now_empty: false
            }
        );
        assert_eq!(b.release(class, 31), Release::DoubleFree);
        for s in 1..31 {
            assert!(matches!(
                b.release(class, s),
                Release::Freed {
                    now_empty: false,
                    ..
                }
            ));
        }
        assert!(!b.try_retire());
        assert_eq!(
            b.release(class, 0),
            Release::Freed {
                was_full: false,
                now_empty: true
            }
        );
        assert!(b.try_retire());
        assert_eq!(b.claim(class, 0, 1), Claim::Retired);
        assert_eq!(b.release(class, 0), Release::DoubleFree);
        assert_eq!(b.used_word(), USED_RETIRED);
        b.uncarve();
        assert_eq!(b.class(), None);
    }

    #[test]
    fn fresh_claims_follow_the_cursor_then_scans_rotate_and_wrap() {
        let b = BinHeader::new();
        let class = c(16);
        b.init(class, 0);
        let got = |c: Claim| match c {
            Claim::Got { word, bits, .. } => (word, bits),
            other => panic!("{other:?}"),
        };
        // Fresh (INV(UA15)): runs from the cursor, whatever the start word and rotation.
        assert_eq!(got(b.claim_from(class, 3, 32, 32)), (0, 0xFFFF_FFFF));
        assert_eq!(got(b.claim_from(class, 1, 0, 32)), (0, 0xFFFF_FFFF << 32));
        assert_eq!(got(b.claim_from(class, 2, 0, 20)), (1, 0xF_FFFF));
        // A run ends at its word: 44 of 64 here, and the other 20 are counted back.
        assert_eq!(got(b.claim_from(class, 0, 0, 64)), (1, u64::MAX << 20));
        assert_eq!(b.used_word(), 128);
        // The cursor is at 148: words 2 and 3 from bit 20 on, then it is past the end.
        assert_eq!(got(b.claim_from(class, 0, 0, 64)), (2, u64::MAX << 20));
        assert_eq!(got(b.claim_from(class, 0, 0, 64)), (3, u64::MAX << 20));
        // Past the cursor, scans: from bit 16 of word 2, 8 slots are bits 16..19 and 0..3.
        assert_eq!(got(b.claim_from(class, 2, 16, 8)), (2, 0xF << 16 | 0xF));
        assert_eq!(got(b.claim_from(class, 3, 0, 64)), (3, 0xF_FFFF));
        assert_eq!(got(b.claim_from(class, 0, 0, 64)), (2, 0xFFF << 4));
        assert_eq!(
            b.claim_from(class, 0, 0, 1),
            Claim::NoneFree {
                resync: false,
                emptied: false
            }
        );
        assert_eq!(b.used_word(), 256);
        assert_eq!(b.taken_slots(class), 256);
        // Empty again: the next claims are fresh from slot 0.
        for w in 0..4 {
            let r = b.release_many(class, w, u64::MAX);
            assert_eq!(r.old, u64::MAX);
        }
        assert_eq!(b.used_word(), 0);
        assert_eq!(got(b.claim_from(class, 2, 32, 16)), (0, 0xFFFF));
    }

    /// INV(UA3): counts that claimers add for a moment on a full bin stay in the count field,
    /// however many claim at once: the bin never reads as retired and a claim finds it full.
    /// With a 12-bit count, 116 claimers of 32 on this 400-slot bin made it read as retired.
    #[test]
    fn claimers_in_flight_never_make_a_full_bin_read_as_retired() {
        let b = BinHeader::new();
        let class = c(256);
        b.init(class, class.slots());
        // Every warp an H100 can hold (132 SMs × 64), each a claimer of 32 between its count
        // and its give-back.
        let in_flight = 132 * 64 * 32;
        b.used.fetch_add_relaxed(in_flight);
        assert!(!b.is_retired());
        assert_eq!(b.used_count(), class.slots() + in_flight as u32);
        assert_eq!(
            b.claim(class, 0, 32),
            Claim::NoneFree {
                resync: false,
                emptied: false
            }
        );
        b.used.fetch_sub_relaxed(in_flight);
        assert_eq!(b.used_count(), class.slots());
        assert!(!b.try_retire());
    }

    #[test]
    fn zeroed_header_is_not_carved() {
        // SAFETY: host atomics are plain integers; all-zero is `new()`.
        let b: BinHeader = unsafe { core::mem::zeroed() };
        assert_eq!(b.class(), None);
    }
}

/// The bin at address `addr` (non-zero, a bin header of a live chunk).
///
/// # Safety
/// `addr` is the header address of a bin in a chunk UAlloc owns, readable for `'a`.
#[inline(always)]
pub(crate) unsafe fn bin_at<'a>(addr: u64) -> &'a BinHeader {
    // SAFETY: caller; headers are only accessed atomically.
    unsafe { &*(addr as usize as *const BinHeader) }
}
