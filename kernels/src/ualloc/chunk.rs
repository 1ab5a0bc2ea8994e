//! A chunk: 512 KB from the [`ChunkSource`](super::ChunkSource), cut into bins of one kind.
//!
//! ```text
//!  ChunkHeader (128 B, the chunk's first block)
//!  ┌───────┬───────────┬──────┬──────┬──────────┬──────────┬─────┬────────┬───────┬──────┬────────┐
//!  │ magic │ free_bins │ next │ prev │ all_next │ all_prev │ rcu │ n_free │ arena │ kind │ listed │
//!  │  u64  │ 2 × u64   │   partial list   │   every chunk of the   │     │        │       │      │        │
//!  │       │           │  (free bins > 0) │   arena and kind       │     │        │       │      │        │
//!  └───────┴───────────┴──────┴──────┴──────────┴──────────┴─────┴────────┴───────┴──────┴────────┘
//! ```
//!
//! `magic` is `address ^ CHUNK_MAGIC` exactly while the chunk belongs to UAlloc (INV(UA8)): set
//! last when the chunk is adopted, cleared before it goes back to the source (after an RCU
//! grace period). `free` checks it, so a pointer into memory that is not a UAlloc chunk is
//! rejected without touching anything. Everything but `magic`, `arena` and `kind` changes only
//! under the arena's chunk-list mutex for the chunk's kind.

use crate::platform::{Atomic32, Atomic64};
use crate::rcu::RcuHead;
use crate::size_class::BinKind;
use crate::ualloc::bin::BinHeader;
use crate::ualloc::layout::{
    CHUNK_BITMAP_WORDS, CHUNK_SIZE, LARGE_BINS, SMALL_BINS, WORD_BITS, large_bin_offset,
    small_bin_offset,
};

/// XORed with the chunk's address to form its `magic` (`"togachnk"`).
pub const CHUNK_MAGIC: u64 = u64::from_le_bytes(*b"togachnk");

/// The chunk header (see the module doc). Lives at the chunk's first byte.
#[repr(C, align(128))]
pub struct ChunkHeader {
    /// `address ^ CHUNK_MAGIC` while UAlloc owns the chunk, else anything else (INV(UA8)).
    pub(crate) magic: Atomic64,
    /// Bit `b` set: bin `b` is free (in the chunk, not carved). INV(UA9):
    /// `n_free == popcount(free_bins)` outside the mutex.
    pub(crate) free_bins: [Atomic64; CHUNK_BITMAP_WORDS],
    /// The arena's partial list (chunks with free bins): next / previous chunk address.
    pub(crate) next: Atomic64,
    pub(crate) prev: Atomic64,
    /// The arena's list of all its chunks of this kind.
    pub(crate) all_next: Atomic64,
    pub(crate) all_prev: Atomic64,
    /// Link for the deferred return to the source.
    pub(crate) rcu: RcuHead,
    /// Free bins.
    pub(crate) n_free: Atomic32,
    /// Index of the owning arena.
    pub(crate) arena: Atomic32,
    /// [`BinKind`] index.
    pub(crate) kind: Atomic32,
    /// 1 while on the partial list (INV(UA10): `listed == (n_free > 0)` outside the mutex).
    pub(crate) listed: Atomic32,
}

#[cfg(not(loom))]
const _: () =
    assert!(core::mem::size_of::<ChunkHeader>() == crate::ualloc::layout::CHUNK_HEADER_SIZE);

/// The `magic` of the chunk at `addr`.
#[inline(always)]
pub const fn magic_of(addr: usize) -> u64 {
    addr as u64 ^ CHUNK_MAGIC
}

/// The chunk holding address `addr`.
#[inline(always)]
pub const fn chunk_base(addr: usize) -> usize {
    addr & !(CHUNK_SIZE - 1)
}

/// Bins in a chunk of `kind`.
#[inline(always)]
pub const fn bins_per_chunk(kind: BinKind) -> u32 {
    match kind {
        BinKind::Small => SMALL_BINS as u32,
        BinKind::Large => LARGE_BINS as u32,
    }
}

/// Chunk offset of bin `bin`'s header in a chunk of `kind`.
#[inline(always)]
pub const fn bin_offset(kind: BinKind, bin: usize) -> usize {
    match kind {
        BinKind::Small => small_bin_offset(bin),
        BinKind::Large => large_bin_offset(bin),
    }
}

/// The `free_bins` word `w` of a chunk of `bins` bins whose first `taken` bins are taken.
#[inline(always)]
fn initial_free_word(w: usize, bins: u32, taken: u32) -> u64 {
    let lo = (w * WORD_BITS) as u32;
    let below = |n: u32| -> u64 {
        match n.saturating_sub(lo) {
            0 => 0,
            k if k >= WORD_BITS as u32 => u64::MAX,
            k => (1u64 << k) - 1,
        }
    };
    below(bins) & !below(taken)
}

impl ChunkHeader {
    /// The header of the chunk at `base`.
    ///
    /// # Safety
    /// `base` is `CHUNK_SIZE`-aligned and the chunk is readable memory for `'a` (inside the
    /// heap); its first block is only accessed atomically.
    #[inline(always)]
    pub unsafe fn at<'a>(base: usize) -> &'a ChunkHeader {
        // SAFETY: the caller guarantees a readable, aligned block; every field is an atomic
        // whose representation is a plain integer, so any bit pattern is a valid value.
        unsafe { &*(base as *const ChunkHeader) }
    }

    /// The chunk's address.
    #[inline(always)]
    pub fn base(&self) -> usize {
        self as *const Self as usize
    }

    /// Whether UAlloc owns the chunk now (INV(UA8)).
    #[inline(always)]
    pub fn is_live(&self) -> bool {
        // Acquire: pairs with the release in `adopt`: a live chunk's header is initialized.
        self.magic.load_acquire() == magic_of(self.base())
    }

    /// The chunk's bin kind (valid while live).
    #[inline(always)]
    pub fn kind(&self) -> BinKind {
        BinKind::from_index(self.kind.load_relaxed()).unwrap_or(BinKind::Small)
    }

    /// Bin `bin`'s header.
    #[inline(always)]
    pub fn bin(&self, bin: usize) -> &BinHeader {
        self.bin_as(self.kind(), bin)
    }

    /// Bin `bin`'s header in a chunk of `kind` (no load: the caller knows, or guesses, the
    /// kind).
    #[inline(always)]
    pub fn bin_as(&self, kind: BinKind, bin: usize) -> &BinHeader {
        let addr = self.base() + bin_offset(kind, bin);
        // SAFETY: bin headers lie inside the chunk (layout asserts), which is readable while
        // `self` is; they are only accessed atomically.
        unsafe { &*(addr as *const BinHeader) }
    }

    /// Whether the chunk is live and its kind (raw), loaded back to back so that both are in
    /// flight at once. `ordered`: the magic with acquire, as [`is_live`](Self::is_live);
    /// otherwise both are relaxed hints.
    #[inline(always)]
    pub fn look(&self, ordered: bool) -> (bool, u32) {
        let magic = if ordered {
            self.magic.load_acquire()
        } else {
            self.magic.load_relaxed()
        };
        (magic == magic_of(self.base()), self.kind.load_relaxed())
    }

    /// Index of the bin whose header is `bin` (a header of this chunk).
    #[inline(always)]
    pub fn bin_index(&self, bin: &BinHeader) -> usize {
        let off = bin as *const BinHeader as usize - self.base();
        match self.kind() {
            BinKind::Small => (off - small_bin_offset(0)) / crate::ualloc::layout::PAGE_SIZE,
            BinKind::Large => (off - large_bin_offset(0)) / crate::ualloc::layout::LARGE_BIN_SIZE,
        }
    }

    /// Take over the fresh chunk at `base` for `arena` and `kind`, with its first `taken` bins
    /// already handed out. Makes every bin header "not carved" (INV(UA5)) and sets the magic
    /// last. Lists are linked by the caller.
    ///
    /// # Safety
    /// `base` is a `CHUNK_SIZE`-aligned chunk just returned by the source: exclusively ours.
    pub unsafe fn adopt<'a>(base: usize, arena: u32, kind: BinKind, taken: u32) -> &'a ChunkHeader {
        // SAFETY: the caller owns the chunk.
        let h = unsafe { Self::at(base) };
        let bins = bins_per_chunk(kind);
        debug_assert!(taken <= bins);
        h.kind.store_relaxed(kind.index() as u32);
        for b in 0..bins as usize {
            // Published by the release of the magic below. `bin_as`, not `bin`: that loads
            // the chunk's kind, a round trip to memory per bin (124 of them, 25 µs of every
            // small chunk's adoption on the H100).
            h.bin_as(kind, b).uncarve_unpublished();
        }
        for (w, word) in h.free_bins.iter().enumerate() {
            word.store_relaxed(initial_free_word(w, bins, taken));
        }
        h.n_free.store_relaxed(bins - taken);
        h.arena.store_relaxed(arena);
        h.next.store_relaxed(0);
        h.prev.store_relaxed(0);
        h.all_next.store_relaxed(0);
        h.all_prev.store_relaxed(0);
        h.listed.store_relaxed(0);
        // Release: pairs with the acquire in `is_live` (INV(UA8)).
        h.magic.store_release(magic_of(base));
        h
    }

    /// The `rank`-th free bin of this chunk (under the mutex; `rank < n_free`).
    pub fn nth_free_bin(&self, mut rank: u32) -> Option<usize> {
        for (w, word) in self.free_bins.iter().enumerate() {
            let mut bits = word.load_relaxed();
            let n = bits.count_ones();
            if rank < n {
                for _ in 0..rank {
                    bits &= bits - 1;
                }
                return Some(w * WORD_BITS + bits.trailing_zeros() as usize);
            }
            rank -= n;
        }
        None
    }

    /// The first free bin at index `from` or after it (under the mutex).
    pub fn next_free_bin(&self, from: usize) -> Option<usize> {
        let mut w = from / WORD_BITS;
        let mut bits = self.free_bins.get(w)?.load_relaxed() & (u64::MAX << (from % WORD_BITS));
        loop {
            if bits != 0 {
                return Some(w * WORD_BITS + bits.trailing_zeros() as usize);
            }
            w += 1;
            bits = self.free_bins.get(w)?.load_relaxed();
        }
    }

    /// Mark bin `bin` taken (under the mutex).
    pub fn take_bin(&self, bin: usize) {
        let bit = 1u64 << (bin % WORD_BITS);
        let old = self.free_bins[bin / WORD_BITS].fetch_and_relaxed(!bit);
        debug_assert!(old & bit != 0, "bin {bin} taken twice");
        self.n_free.fetch_sub_relaxed(1);
    }

    /// Mark bin `bin` taken, free itself, and the free bins right after it, `want` in all at
    /// most (under the mutex): one atomic per bitmap word. Returns how many.
    pub fn take_neighbours(&self, bin: usize, want: u32) -> u32 {
        debug_assert!(self.is_bin_free(bin), "bin {bin} is not free");
        let mut taken = 0;
        let mut at = bin;
        while taken < want && at / WORD_BITS < CHUNK_BITMAP_WORDS {
            let (w, lo) = (at / WORD_BITS, at % WORD_BITS);
            let bits = self.free_bins[w].load_relaxed() >> lo;
            let n = (!bits).trailing_zeros().min(want - taken);
            if n == 0 {
                break;
            }
            let mask = (u64::MAX >> (WORD_BITS as u32 - n)) << lo;
            self.free_bins[w].fetch_and_relaxed(!mask);
            taken += n;
            at += n as usize;
            if !at.is_multiple_of(WORD_BITS) {
                break;
            }
        }
        self.n_free.fetch_sub_relaxed(taken);
        taken
    }

    /// Mark bin `bin` free (under the mutex); returns the new count of free bins.
    pub fn put_bin(&self, bin: usize) -> u32 {
        let bit = 1u64 << (bin % WORD_BITS);
        let old = self.free_bins[bin / WORD_BITS].fetch_or_relaxed(bit);
        debug_assert!(old & bit == 0, "bin {bin} returned twice");
        self.n_free.fetch_add_relaxed(1) + 1
    }

    /// Whether bin `bin` is free (under the mutex or quiescent).
    pub fn is_bin_free(&self, bin: usize) -> bool {
        self.free_bins[bin / WORD_BITS].load_relaxed() & (1 << (bin % WORD_BITS)) != 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn free_words() {
        assert_eq!(initial_free_word(0, 124, 0), u64::MAX);
        assert_eq!(initial_free_word(1, 124, 0), (1 << 60) - 1);
        assert_eq!(initial_free_word(0, 5, 2), 0b11100);
        assert_eq!(initial_free_word(1, 5, 2), 0);
    }

    #[test]
    fn next_free_bin_scans_both_words() {
        let mut memory = std::vec![0u8; 2 * CHUNK_SIZE];
        let base = (memory.as_mut_ptr() as usize).next_multiple_of(CHUNK_SIZE);
        // SAFETY: `base` is a chunk-aligned span inside `memory`, which outlives the header.
        let chunk = unsafe { ChunkHeader::adopt(base, 0, BinKind::Small, 0) };
        for taken in [0, 1, 2, 63, 64, 100] {
            chunk.take_bin(taken);
        }
        assert_eq!(chunk.next_free_bin(0), Some(3));
        assert_eq!(chunk.next_free_bin(62), Some(62));
        assert_eq!(chunk.next_free_bin(63), Some(65));
        assert_eq!(chunk.next_free_bin(101), Some(101));
        assert_eq!(chunk.next_free_bin(123), Some(123));
        assert_eq!(chunk.next_free_bin(124), None);
        assert_eq!(chunk.next_free_bin(128), None);
    }

    #[test]
    fn take_neighbours_takes_free_bins_side_by_side_across_words() {
        let mut memory = std::vec![0u8; 2 * CHUNK_SIZE];
        let base = (memory.as_mut_ptr() as usize).next_multiple_of(CHUNK_SIZE);
        // SAFETY: `base` is a chunk-aligned span inside `memory`, which outlives the header.
        let chunk = unsafe { ChunkHeader::adopt(base, 0, BinKind::Small, 0) };
        for taken in [5, 70] {
            chunk.take_bin(taken);
        }
        // Up to the taken bin 5.
        assert_eq!(chunk.take_neighbours(1, 16), 4);
        // Across the word boundary at 64, up to the taken bin 70.
        assert_eq!(chunk.take_neighbours(50, 32), 20);
        assert_eq!(chunk.next_free_bin(50), Some(71));
        // At most `want`, and never past the chunk's last bin (123).
        assert_eq!(chunk.take_neighbours(71, 3), 3);
        assert_eq!(chunk.take_neighbours(100, 64), 24);
        assert_eq!(chunk.next_free_bin(74), Some(74));
        assert_eq!(chunk.next_free_bin(99), Some(99));
        let free = (0..124).filter(|&b| chunk.is_bin_free(b)).count() as u32;
        assert_eq!(chunk.n_free.load_relaxed(), free);
        assert_eq!(free, 124 - 2 - 4 - 20 - 3 - 24);
    }
}

/// The chunk header at address `addr` (non-zero, a live chunk).
///
/// # Safety
/// `addr` is a chunk UAlloc owns.
#[inline(always)]
pub(crate) unsafe fn chunk_at<'a>(addr: u64) -> &'a ChunkHeader {
    // SAFETY: caller.
    unsafe { ChunkHeader::at(addr as usize) }
}
