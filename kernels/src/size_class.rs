//! UAlloc's size classes: powers of two from [`MIN_SIZE`] (16 B) to [`MAX_SMALL_SIZE`] (4 KB).
//!
//! `malloc(n)` with `n <= MAX_SMALL_SIZE` is served by UAlloc from the smallest class that holds
//! `n`; anything larger goes to TBuddy, whose blocks are whole pages (4 KB + 1 B to 8 KB loses
//! at most half, like every power-of-two allocator). 4 KB blocks come from UAlloc and not from
//! TBuddy's order 0 because a 4 KB page from the buddy tree costs a climb through every order
//! above it: on an H100, 2^20 × 4 KB took 67 ms from TBuddy (docs/benchmarks.md), while a bin
//! of 25 of them costs one semaphore operation per warp and one chunk per 125 blocks.
//!
//! Classes come in two bin kinds ([`BinKind`], geometry in [`crate::ualloc::layout`]):
//!
//! | class | kind | bin | slots per bin | alignment |
//! | --- | --- | --- | --- | --- |
//! | 16, 32, 64, 128 B | small | 4 KB page, 128 B header, 128 B tail | 4096 / size | size |
//! | 256 B … 4 KB | large | 104,704 B (five per chunk), 128 B header | (104704 − 128) / size | 128 B |
//!
//! # Alignment promise
//! Every block is aligned to `min(class size, 128 B)` ([`SizeClass::align`]): at least the
//! 16 bytes CUDA's `malloc` promises, the class size for classes up to 128 B, and 128 B (one
//! L2 line) for the large classes. No UAlloc block is ever 4096-aligned (INV(UA1)): that is how
//! `free` tells UAlloc blocks from TBuddy pages.

use crate::ualloc::layout::{
    BIN_HEADER_SIZE, BITMAP_WORDS, LARGE_BIN_SIZE, LARGE_BINS, MAX_SLOTS, PAGE_SIZE, SMALL_BINS,
    TAIL_SIZE, WORD_BITS,
};

/// log2 of the smallest class.
pub const MIN_SIZE_SHIFT: u32 = 4;
/// The smallest class: 16 B, the alignment CUDA's device `malloc` promises.
pub const MIN_SIZE: usize = 1 << MIN_SIZE_SHIFT;
/// log2 of the largest class that has a tail (classes up to it use small bins).
pub const TAIL_MAX_SHIFT: u32 = 7;
/// log2 of [`MAX_SMALL_SIZE`].
pub const MAX_SMALL_SHIFT: u32 = 12;
/// The largest request UAlloc serves; larger ones go to TBuddy (whole pages).
pub const MAX_SMALL_SIZE: usize = 1 << MAX_SMALL_SHIFT;
/// Number of size classes.
pub const NUM_CLASSES: usize = (MAX_SMALL_SHIFT - MIN_SIZE_SHIFT + 1) as usize;
/// The alignment cap: large-class slots start 128 B past a 256 B boundary (INV(UA1)).
pub const MAX_SLOT_ALIGN: usize = BIN_HEADER_SIZE;
/// Number of bin kinds.
pub const NUM_KINDS: usize = 2;

const _: () = assert!(MIN_SIZE_SHIFT <= TAIL_MAX_SHIFT && TAIL_MAX_SHIFT < MAX_SMALL_SHIFT);
// A tail holds whole slots of every tailed class.
const _: () = assert!(TAIL_SIZE == 1 << TAIL_MAX_SHIFT);
// TBuddy's smallest block is a page: UAlloc must cover everything below it.
const _: () = assert!(2 * MAX_SMALL_SIZE >= PAGE_SIZE);

/// Which bin geometry a class uses (see [`crate::ualloc::layout`]). A chunk holds bins of one
/// kind only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum BinKind {
    /// One-page bins with a header at the page start and a 128 B tail in the chunk's reserved
    /// pages: classes 16–128 B.
    Small = 0,
    /// [`LARGE_BIN_SIZE`] bins, header at the start, no tail: classes 256 B–4 KB.
    Large = 1,
}

impl BinKind {
    /// Both kinds, by index.
    pub const ALL: [BinKind; NUM_KINDS] = [BinKind::Small, BinKind::Large];

    /// The kind's index (`0..NUM_KINDS`).
    #[inline(always)]
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The kind with index `i`, if any.
    #[inline(always)]
    pub const fn from_index(i: u32) -> Option<BinKind> {
        match i {
            0 => Some(BinKind::Small),
            1 => Some(BinKind::Large),
            _ => None,
        }
    }
}

/// A size class: index `0..NUM_CLASSES`, size `MIN_SIZE << index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SizeClass(u8);

impl SizeClass {
    /// Every class, smallest first.
    pub const ALL: [SizeClass; NUM_CLASSES] = {
        let mut all = [SizeClass(0); NUM_CLASSES];
        let mut i = 0;
        while i < NUM_CLASSES {
            all[i] = SizeClass(i as u8);
            i += 1;
        }
        all
    };

    /// The smallest class holding `size` bytes. `size` must be at most [`MAX_SMALL_SIZE`]
    /// (checked in debug builds); 0 maps to the smallest class.
    #[inline(always)]
    pub const fn from_size(size: usize) -> SizeClass {
        debug_assert!(size <= MAX_SMALL_SIZE);
        if size <= MIN_SIZE {
            return SizeClass(0);
        }
        // ceil(log2(size)) for size >= 2.
        let shift = usize::BITS - (size - 1).leading_zeros();
        SizeClass((shift - MIN_SIZE_SHIFT) as u8)
    }

    /// The class with index `i`, if any.
    #[inline(always)]
    pub const fn from_index(i: usize) -> Option<SizeClass> {
        if i < NUM_CLASSES {
            Some(SizeClass(i as u8))
        } else {
            None
        }
    }

    /// Index `0..NUM_CLASSES`.
    #[inline(always)]
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// log2 of the class size.
    #[inline(always)]
    pub const fn shift(self) -> u32 {
        MIN_SIZE_SHIFT + self.0 as u32
    }

    /// Block size in bytes.
    #[inline(always)]
    pub const fn size(self) -> usize {
        1 << self.shift()
    }

    /// The alignment of every block of this class: `min(size, MAX_SLOT_ALIGN)`.
    #[inline(always)]
    pub const fn align(self) -> usize {
        if self.size() < MAX_SLOT_ALIGN {
            self.size()
        } else {
            MAX_SLOT_ALIGN
        }
    }

    /// The bin kind this class uses.
    #[inline(always)]
    pub const fn kind(self) -> BinKind {
        if self.shift() <= TAIL_MAX_SHIFT {
            BinKind::Small
        } else {
            BinKind::Large
        }
    }

    /// Slots in the bin body (after the header). For small classes the tail adds
    /// [`tail_slots`](Self::tail_slots) more.
    #[inline(always)]
    pub const fn main_slots(self) -> u32 {
        let body = match self.kind() {
            BinKind::Small => PAGE_SIZE - BIN_HEADER_SIZE,
            BinKind::Large => LARGE_BIN_SIZE - BIN_HEADER_SIZE,
        };
        (body >> self.shift()) as u32
    }

    /// Slots in the bin's tail (0 for large classes).
    #[inline(always)]
    pub const fn tail_slots(self) -> u32 {
        match self.kind() {
            BinKind::Small => (TAIL_SIZE >> self.shift()) as u32,
            BinKind::Large => 0,
        }
    }

    /// Slots per bin: the bulk semaphore's batch for this class.
    #[inline(always)]
    pub const fn slots(self) -> u32 {
        self.main_slots() + self.tail_slots()
    }

    /// Bitmap words a bin of this class uses (`ceil(slots / 64)`).
    #[inline(always)]
    pub const fn bitmap_words(self) -> usize {
        (self.slots() as usize).div_ceil(WORD_BITS)
    }

    /// Bytes a bin of this class hands out (slots × size).
    #[inline(always)]
    pub const fn bin_payload(self) -> usize {
        (self.slots() as usize) << self.shift()
    }
}

/// Lanes in the widest warp (nvptx). A group of lanes asking for one class never exceeds it.
pub const MAX_GROUP: u32 = 32;

impl SizeClass {
    /// The most lanes one group of this class may have: a warp, or a bin's slots where a bin
    /// holds fewer (4 KB: 25), so that a group refill takes exactly one new bin (INV(UA6)).
    #[inline(always)]
    pub const fn max_group(self) -> u32 {
        if self.slots() < MAX_GROUP {
            self.slots()
        } else {
            MAX_GROUP
        }
    }
}

/// Slots a refill aims to carve at once while chunks are plentiful: about 1024 from the
/// small bins (4 bins of 16 B, 8 of 32 and 64 B), and from the large ones a whole chunk (its
/// 5 bins of 256 B, 512 B or 1 KB). See [`SizeClass::refill_bins`].
///
/// The large target was 128 slots (one bin of 256 B and 512 B, two of 1 KB) until 2026-11-26.
/// A whole chunk made 2^20 fresh mallocs 23% faster at 256 B and 13–19% at 1 KB (H200, three
/// leases), and a kernel that mallocs and then frees 1 KB 7–9% slower (docs/benchmarks.md).
/// Sizing the refill by the reservations it saw uncovered instead was slower than both.
const REFILL_SLOTS: [u32; NUM_KINDS] = [1024, 2048];
/// The most bins one refill carves while chunks are plentiful (small bins: 32 KB).
pub const MAX_REFILL_BINS: u32 = 8;

/// Slots a refill for a class's home aims to carve at once while chunks are scarce (INV(UA16)):
/// every SM takes from it, so it makes enough for a crowd of warps, about 128 groups of 32 from
/// the small bins (16 bins of 16 B) and a whole chunk of the large ones. See
/// [`SizeClass::home_refill_bins`].
const HOME_REFILL_SLOTS: u32 = 4096;
/// The most bins one refill for a home carves (small bins: 128 KB).
pub const MAX_HOME_REFILL_BINS: u32 = 32;

impl SizeClass {
    /// Bins a refill of this class carves at once while the heap has chunks to spare
    /// (`ualloc::refill`): enough for [`REFILL_SLOTS`] slots, at most [`MAX_REFILL_BINS`] and
    /// at most a chunk's bins. Each refill goes through the arena's chunk-list and class-list
    /// mutexes once, so carving several bins per refill divides the refills of a fresh heap
    /// (2^20 × 64 B: 124 per arena with one bin each) by this factor.
    ///
    /// Two bins for a class whose bin holds fewer than two groups (128 B, 2 KB, 4 KB). Its
    /// refill's promise (`slots - k`) covers no other group, so every group that finds the
    /// semaphore short refills at once; each refill's second bin serves the next group without
    /// a refill of its own, so such a class takes the arena's chunk-list lock half as often.
    /// ncu on 2^20 fresh mallocs of 4 KB with one bin per refill: 45 attempts per acquisition
    /// of that lock. Two bins made them 5–15% faster and mixed 16 B – 4 KB 16–17% faster (H200,
    /// two leases). Three bins made mixed faster still (23%) and a kernel that mallocs and
    /// then frees 4 KB 12% slower; a promise that covers every bin of the refill was slower
    /// than one bin. With a whole chunk per refill and a promise of one bin, 2^20 × 4 KB
    /// adopted a chunk per refill and was 39% slower (docs/benchmarks.md).
    #[inline(always)]
    pub const fn refill_bins(self) -> u32 {
        if self.slots() < 2 * self.max_group() {
            return 2;
        }
        self.bins_for(REFILL_SLOTS[self.kind().index()], MAX_REFILL_BINS)
    }

    /// Bins a refill for the class's home carves at once while chunks are scarce
    /// (`ualloc::steal`, INV(UA16)): enough for [`HOME_REFILL_SLOTS`] slots, at most
    /// [`MAX_HOME_REFILL_BINS`] and at most a chunk's bins. Every SM takes this class's blocks
    /// at the home then, one refill at a time; with one bin per refill, 2^16 threads asking
    /// 16 B each waited for 256 refills in turn in a 64 MiB heap (8.1 ms, H100, 092ea42), where
    /// a 512 MiB heap, whose SMs carve bins of their own, took 0.12 ms. What a home holds
    /// beyond its blocks is a few listed bins per class, shared by every SM, which a trim gives
    /// back once they are empty.
    #[inline(always)]
    pub const fn home_refill_bins(self) -> u32 {
        self.bins_for(HOME_REFILL_SLOTS, MAX_HOME_REFILL_BINS)
    }

    /// Bins enough for `slots` slots of this class, at most `most` and at most a chunk's.
    #[inline(always)]
    const fn bins_for(self, slots: u32, most: u32) -> u32 {
        let chunk_bins = match self.kind() {
            BinKind::Small => SMALL_BINS as u32,
            BinKind::Large => LARGE_BINS as u32,
        };
        let want = slots.div_ceil(self.slots());
        let cap = if chunk_bins < most { chunk_bins } else { most };
        if want < cap { want } else { cap }
    }
}

// Every class fits the bitmap, and a group asking for one class fits in one bin (INV(UA6)).
const _: () = {
    let mut i = 0;
    while i < NUM_CLASSES {
        let c = SizeClass(i as u8);
        assert!(c.slots() as usize <= MAX_SLOTS);
        assert!(c.bitmap_words() <= BITMAP_WORDS);
        assert!(c.slots() >= c.max_group() && c.max_group() > 0);
        assert!(c.refill_bins() >= 1 && c.refill_bins() <= MAX_REFILL_BINS);
        assert!(c.home_refill_bins() >= 1 && c.home_refill_bins() <= MAX_HOME_REFILL_BINS);
        i += 1;
    }
};

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn refill_bins_per_class() {
        let bins = SizeClass::ALL.map(|c| c.refill_bins());
        // 16 B … 4 KB: 256, 128, 64, 32, 408, 204, 102, 51, 25 slots per bin.
        assert_eq!(bins, [4, 8, 8, 2, 5, 5, 5, 2, 2]);
    }

    #[test]
    fn home_refill_bins_per_class() {
        let bins = SizeClass::ALL.map(|c| c.home_refill_bins());
        // 16 B … 4 KB: 256, 128, 64, 32, 408, 204, 102, 51, 25 slots per bin; a large chunk
        // holds 5 bins.
        assert_eq!(bins, [16, 32, 32, 32, 5, 5, 5, 5, 5]);
    }

    #[test]
    fn from_size_rounds_up_to_powers_of_two() {
        assert_eq!(SizeClass::from_size(0).size(), 16);
        assert_eq!(SizeClass::from_size(1).size(), 16);
        assert_eq!(SizeClass::from_size(16).size(), 16);
        assert_eq!(SizeClass::from_size(17).size(), 32);
        assert_eq!(SizeClass::from_size(1024).size(), 1024);
        assert_eq!(SizeClass::from_size(1025).size(), 2048);
        assert_eq!(SizeClass::from_size(MAX_SMALL_SIZE).size(), MAX_SMALL_SIZE);
        for size in 1..=MAX_SMALL_SIZE {
            let c = SizeClass::from_size(size);
            assert!(c.size() >= size && (c.index() == 0 || c.size() / 2 < size));
        }
    }

    #[test]
    fn index_round_trips() {
        for (i, c) in SizeClass::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
            assert_eq!(SizeClass::from_index(i), Some(*c));
        }
        assert_eq!(SizeClass::from_index(NUM_CLASSES), None);
    }

    #[test]
    fn slot_counts() {
        let slots: [u32; NUM_CLASSES] = core::array::from_fn(|i| SizeClass::ALL[i].slots());
        assert_eq!(slots, [256, 128, 64, 32, 408, 204, 102, 51, 25]);
        assert_eq!(SizeClass::from_size(4096).max_group(), 25);
        assert_eq!(SizeClass::from_size(2048).max_group(), MAX_GROUP);
        assert_eq!(SizeClass::from_size(128).kind(), BinKind::Small);
        assert_eq!(SizeClass::from_size(129).kind(), BinKind::Large);
        assert_eq!(SizeClass::from_size(16).align(), 16);
        assert_eq!(SizeClass::from_size(2048).align(), 128);
    }
}

/// The chunk geometry of `ualloc::layout`, checked slot by slot for every class (here, so that
/// `layout` does not import the classes that are built on it).
#[cfg(all(test, not(loom)))]
mod layout_tests {
    use super::{BinKind, MIN_SIZE, SizeClass};
    use crate::ualloc::layout::*;

    fn slot_offset(class: SizeClass, bin: usize, slot: u32) -> usize {
        let i = slot as usize;
        match class.kind() {
            BinKind::Small if slot < class.main_slots() => {
                small_bin_offset(bin) + BIN_HEADER_SIZE + (i << class.shift())
            }
            BinKind::Small => {
                tail_offset(bin) + ((i - class.main_slots() as usize) << class.shift())
            }
            BinKind::Large => large_bin_offset(bin) + BIN_HEADER_SIZE + (i << class.shift()),
        }
    }

    /// Every slot of every bin of every class: inside the chunk, aligned to the class's
    /// promise, never page-aligned (INV(UA1)), disjoint from headers and from each other, and
    /// `area_of` maps it back to its bin.
    #[test]
    fn slots_are_disjoint_aligned_and_never_page_aligned() {
        for class in SizeClass::ALL {
            let small = class.kind() == BinKind::Small;
            let bins = if small { SMALL_BINS } else { LARGE_BINS };
            let mut owner = std::vec![u32::MAX; CHUNK_SIZE / MIN_SIZE];
            // Headers.
            let mut mark = |start: usize, len: usize, who: u32| {
                for b in (start..start + len).step_by(MIN_SIZE) {
                    assert_eq!(owner[b / MIN_SIZE], u32::MAX, "overlap at {b}");
                    owner[b / MIN_SIZE] = who;
                }
            };
            mark(0, CHUNK_HEADER_SIZE, u32::MAX - 1);
            for bin in 0..bins {
                let h = if small {
                    small_bin_offset(bin)
                } else {
                    large_bin_offset(bin)
                };
                mark(h, BIN_HEADER_SIZE, u32::MAX - 1);
            }
            for bin in 0..bins {
                for slot in 0..class.slots() {
                    let off = slot_offset(class, bin, slot);
                    assert!(off + class.size() <= CHUNK_SIZE);
                    assert_ne!(off % PAGE_SIZE, 0, "{class:?} bin {bin} slot {slot}");
                    assert_eq!(off % class.align(), 0);
                    mark(off, class.size(), bin as u32);
                    let (b, area) = area_of(small, off).expect("slot maps to a bin");
                    assert_eq!(b, bin);
                    match area {
                        SlotArea::Body(x) => assert_eq!(x >> class.shift(), slot as usize),
                        SlotArea::Tail(x) => assert_eq!(
                            class.main_slots() as usize + (x >> class.shift()),
                            slot as usize
                        ),
                    }
                }
            }
            assert_eq!(area_of(small, 0), None);
        }
    }

    #[test]
    fn tails_fill_the_reserved_pages() {
        for bin in 0..SMALL_BINS {
            let t = tail_offset(bin);
            assert!(t < SMALL_RESERVED_PAGES * PAGE_SIZE);
            assert_ne!(t % PAGE_SIZE, 0);
        }
        assert_eq!(area_of(true, PAGE_SIZE), None);
        assert_eq!(area_of(true, 3 * PAGE_SIZE + 5), None);
    }
}
