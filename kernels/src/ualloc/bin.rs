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

/// `used` bits that count claimed slots.
pub const USED_COUNT_MASK: u32 = (1 << 12) - 1;
/// `used` flag: the bin is retired (INV(UA4)). Any bit outside [`USED_COUNT_MASK`] makes the
/// bin unclaimable: a release that races a retirement can transiently borrow into them.
pub const USED_RETIRED: u32 = 1 << 31;

const _: () = assert!(crate::ualloc::layout::MAX_SLOTS as u32 <= USED_COUNT_MASK);
const _: () = assert!(USED_RETIRED & USED_COUNT_MASK == 0);

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
    /// Claimed slots plus [`USED_RETIRED`] (INV(UA3), INV(UA4)).
    used: Atomic32,
    /// `class index + 1` while carved, 0 otherwise (INV(UA5)).
    info: Atomic32,
    /// 1 while linked into its class list (INV(UA7)). Under the list's mutex only.
    pub(crate) listed: Atomic32,
    /// Index of the arena that carved the bin: its class list, slot semaphore and SRCU domain
    /// hold the bin while carved (INV(UA12)); usually the arena of the bin's chunk, another
    /// one when the bin was taken from another arena's chunk (steal.rs). Set before the class
    /// is published.
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
    /// No free bit was found in one pass over the words. `resync` as for `Got`.
    NoneFree { resync: bool },
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
            used: Atomic32::new(0),
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
        debug_assert!(claimed <= class.slots());
        self.owner.store_relaxed(owner);
        for (w, word) in self.bitmap.iter().enumerate() {
            word.store_relaxed(initial_word(w, class.slots(), claimed));
        }
        self.used.store_relaxed(claimed);
        self.next.store_relaxed(0);
        self.prev.store_relaxed(0);
        self.listed.store_relaxed(0);
        // INV(UA13): a bin goes back to its chunk only with a zero count, but a fresh chunk's
        // memory is arbitrary.
        self.pending.store_relaxed(0);
        // Release: pairs with the acquire in `class` (a `free` validating a pointer sees a
        // fully initialized bin once it sees the class).
        self.info.store_release(class.index() as u32 + 1);
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
        self.owner.load_relaxed()
    }

    /// `info` and [`owner`](Self::owner), loaded back to back so that both are in flight at
    /// once. `ordered`: `info` with acquire, as [`class`](Self::class); otherwise hints.
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

    /// Claim up to `need` free slots in one word, trying the words from `start` on and, in a
    /// word, the free bits from bit `rotate` upwards (wrapping). Claimers that start at
    /// different words and rotations ask for different bits, so fewer of them collide. One
    /// `fetch_add` and one `fetch_or` when it succeeds; one `fetch_sub` more for bits that
    /// another claimer took first.
    #[inline]
    pub fn claim_from(&self, class: SizeClass, start: u32, rotate: u32, need: u32) -> Claim {
        debug_assert!(need > 0);
        let used = self.used.load_relaxed();
        if used & !USED_COUNT_MASK != 0 {
            return Claim::Retired;
        }
        let slots = class.slots();
        if used >= slots {
            // Full (or counted ahead of its bits for a moment, INV(UA3)): one load instead of
            // a scan of every word. A bin that fills stays listed until its claimer unlinks it,
            // and walkers pass over it meanwhile.
            return Claim::NoneFree { resync: false };
        }
        let words = class.bitmap_words() as u32;
        let mut resync = false;
        // 32-bit arithmetic and no division in the loop (a 64-bit `%` here cost a division
        // sequence per word).
        let mut w = start % words;
        for _ in 0..words {
            let at = w;
            w = if w + 1 == words { 0 } else { w + 1 };
            let word = &self.bitmap[at as usize];
            let free = !word.load_relaxed();
            if free == 0 {
                continue;
            }
            let want = lowest_bits(free.rotate_right(rotate), need).rotate_left(rotate);
            let n = want.count_ones();
            // INV(UA3): count first. Relaxed: `used` is one location, so either the CAS in
            // `try_retire` saw our count or we see its flag (INV(UA4)); the release half of the
            // `fetch_or` below keeps this count before our bits.
            let used = self.used.fetch_add_relaxed(n);
            if used & !USED_COUNT_MASK != 0 {
                // Retired: nothing was set; take the count back.
                self.used.fetch_sub_relaxed(n);
                return Claim::Retired;
            }
            let before = used & USED_COUNT_MASK;
            // The count may run ahead of the bitmap for a moment (INV(UA3)).
            resync |= before < slots && before + n >= slots;
            // Acquire: pairs with the release in `release_many` by the slots' previous owners
            // (their writes happen before ours). Release: our count above happens before any
            // release that sees these bits and takes the count back (INV(UA3)).
            let old = word.fetch_or_acq_rel(want);
            let bits = want & !old;
            let lost = n - bits.count_ones();
            if lost > 0 {
                // Bits another claimer set first: their count is theirs.
                let was = self.used.fetch_sub_relaxed(lost) & USED_COUNT_MASK;
                resync |= was >= slots && was - lost < slots;
            }
            if bits != 0 {
                return Claim::Got {
                    word: at,
                    bits,
                    resync,
                };
            }
        }
        Claim::NoneFree { resync }
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
        let used = self.used.fetch_sub_relaxed(n);
        let count = used & USED_COUNT_MASK;
        debug_assert!(
            used & !USED_COUNT_MASK == 0 && count >= n,
            "INV(UA3): a set bit is counted"
        );
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
        // Acq_rel: pairs with the fetch_add in `claim` and the fetch_sub in `release`.
        self.used.compare_exchange_acq_rel(0, USED_RETIRED).is_ok()
    }

    /// `used` as a snapshot: claimed count plus flags.
    #[inline(always)]
    pub fn used_word(&self) -> u32 {
        self.used.load_relaxed()
    }

    /// Claimed slots (a snapshot; `u32::MAX` when retired).
    #[inline(always)]
    pub fn used_count(&self) -> u32 {
        let u = self.used.load_relaxed();
        if u & !USED_COUNT_MASK != 0 {
            u32::MAX
        } else {
            u
        }
    }

    /// Whether the bin is retired (a snapshot).
    #[inline(always)]
    pub fn is_retired(&self) -> bool {
        self.used.load_relaxed() & !USED_COUNT_MASK != 0
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
                Claim::NoneFree { resync } => {
                    assert!(!resync);
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
    fn rotated_claims_start_at_their_bit_and_wrap() {
        let b = BinHeader::new();
        let class = c(16);
        b.init(class, 0);
        let got = |c: Claim| match c {
            Claim::Got { word, bits, .. } => (word, bits),
            other => panic!("{other:?}"),
        };
        // Two claimers of 32 at rotations 32 apart take the two halves of word 1.
        assert_eq!(got(b.claim_from(class, 1, 32, 32)), (1, 0xFFFF_FFFF << 32));
        assert_eq!(got(b.claim_from(class, 1, 0, 32)), (1, 0xFFFF_FFFF));
        // Wrapping: from bit 48 of word 0, 20 slots are bits 48..63 and 0..3.
        assert_eq!(got(b.claim_from(class, 0, 48, 20)), (0, 0xFFFF << 48 | 0xF));
        assert_eq!(b.used_word(), 84);
        assert_eq!(b.taken_slots(class), 84);
    }

    #[test]
    fn zeroed_header_is_not_carved() {
        // SAFETY: host atomics are plain integers; all-zero is `new()`.
        let b: BinHeader = unsafe { core::mem::zeroed() };
        assert_eq!(b.class(), None);
    }
}
