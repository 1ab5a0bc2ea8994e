//! Chunk geometry: where bins, headers, tails and slots sit in a 512 KB chunk, derived from
//! named constants and checked at compile time. Pure arithmetic on offsets (no memory access).
//!
//! # Small chunks (classes 16–128 B): 4 reserved pages, 124 one-page bins
//! ```text
//!  offset 0          4 KB              8 KB              12 KB            16 KB        512 KB
//!  ┌────┬──────────┬────┬──────────┬────┬──────────┬────┬──────────┬──────┬───┬──────┐
//!  │ CH │ tails    │ -- │ tails    │ -- │ tails    │ -- │ tails    │ bin 0│...│bin123│
//!  │    │ 0..30    │    │ 31..61   │    │ 62..92   │    │ 93..123  │      │   │      │
//!  └────┴──────────┴────┴──────────┴────┴──────────┴────┴──────────┴──────┴───┴──────┘
//!   CH: chunk header (128 B)   --: unused 128 B block (a tail here would be page-aligned)
//!
//!  bin b (page 4 + b)                              its tail t = b
//!  ┌────────┬──────┬──────┬─────┬──────┐          ┌──────┬─────┬──────┐
//!  │ header │slot 0│slot 1│ ... │slot m│          │slot  │ ... │ slot │  m = 3968/size − 1
//!  │ 128 B  │      │      │     │      │          │ m+1  │     │      │  128/size slots
//!  └────────┴──────┴──────┴─────┴──────┘          └──────┴─────┴──────┘
//! ```
//! Tail `t` lives in reserved page `t / 31`, block `1 + t % 31`. With the tail every small bin
//! offers exactly 4096 B of slots.
//!
//! # Large chunks (classes 256 B–2 KB): five bins of 104,704 B
//! ```text
//!  0     128   256                 104,960             209,664 ...        523,776  512 KB
//!  ┌────┬────┬───────────────────┬───────────────────┬──── ─ ─ ──┬───────┬──────┐
//!  │ CH │pad │ bin 0             │ bin 1             │    ...    │ bin 4 │ 512 B│
//!  └────┴────┴───────────────────┴───────────────────┴──── ─ ─ ──┴───────┴──────┘
//!  bin: │ header 128 B │ slot 0 │ slot 1 │ ... (slots start 128 B past a 256 B boundary)
//! ```
//! Five bins is the smallest bin count that wastes no more than one large slot per bin and
//! keeps every bitmap within 512 bits: 99.61% of the chunk is slots for every large class
//! (eight 64 KB bins would give 96.9% at 2 KB, the paper's 4 KB bins 50%).
//!
//! # Why no slot is page-aligned (INV(UA1))
//! Small: a bin's slots start at page offset 128, tails sit in blocks 1..31 of their page.
//! Large: data starts at 256, bins are multiples of 256 long, slots start 128 past a bin start,
//! and every large class is a multiple of 256: every slot offset is `128 mod 256`.

use crate::size_class::{BinKind, SizeClass};

/// log2 of a page (TBuddy's smallest block, and the free-routing test `p % PAGE_SIZE`).
pub const PAGE_SHIFT: u32 = 12;
/// A page: 4 KB.
pub const PAGE_SIZE: usize = 1 << PAGE_SHIFT;
/// log2 of a chunk.
pub const CHUNK_SHIFT: u32 = 19;
/// A chunk: 512 KB, the unit UAlloc takes from its [`ChunkSource`](super::ChunkSource).
pub const CHUNK_SIZE: usize = 1 << CHUNK_SHIFT;
/// The largest chunk source UAlloc is laid out for (the arenas' semaphores hold a class's free
/// slots of this many bytes of chunks, INV(SEM2)); the heap checks that its largest fits.
pub const MAX_SOURCE_BYTES: u64 = 32 << 30;
/// Pages in a chunk.
pub const PAGES_PER_CHUNK: usize = CHUNK_SIZE / PAGE_SIZE;
/// log2 of the metadata block: headers and tails are 128 B, one L2 line.
pub const BLOCK_SHIFT: u32 = 7;
/// The metadata block.
pub const BLOCK_SIZE: usize = 1 << BLOCK_SHIFT;
/// Blocks in a page.
pub const BLOCKS_PER_PAGE: usize = PAGE_SIZE / BLOCK_SIZE;
/// A chunk header: the chunk's first block.
pub const CHUNK_HEADER_SIZE: usize = BLOCK_SIZE;
/// A bin header: the bin's first block (slot bitmap, list links, counters).
pub const BIN_HEADER_SIZE: usize = BLOCK_SIZE;
/// A tail: the 128 B that extends a small bin to a full page of slots.
pub const TAIL_SIZE: usize = BLOCK_SIZE;
/// Bits in a bitmap word.
pub const WORD_BITS: usize = u64::BITS as usize;
/// Most slots a bin may have: 64 B of the header hold the bitmap.
pub const MAX_SLOTS: usize = 512;
/// Words of the slot bitmap.
pub const BITMAP_WORDS: usize = MAX_SLOTS / WORD_BITS;

/// Reserved pages at the start of a small chunk (chunk header and tails).
pub const SMALL_RESERVED_PAGES: usize = 4;
/// Tails per reserved page: every block but the first (INV(UA1)).
pub const TAILS_PER_PAGE: usize = BLOCKS_PER_PAGE - 1;
/// Bins of a small chunk: one per remaining page.
pub const SMALL_BINS: usize = PAGES_PER_CHUNK - SMALL_RESERVED_PAGES;

/// log2 of the smallest large class: large slots are aligned to it plus 128 B.
pub const LARGE_MIN_SHIFT: u32 = 8;
/// The smallest large class (256 B): bin starts and lengths are multiples of it.
pub const LARGE_UNIT: usize = 1 << LARGE_MIN_SHIFT;
/// Where a large chunk's first bin starts: the chunk header, padded to [`LARGE_UNIT`].
pub const LARGE_DATA_OFFSET: usize = LARGE_UNIT;
/// Bins of a large chunk (see the module doc for why five).
pub const LARGE_BINS: usize = 5;
/// Length of a large bin: an equal share of the chunk, rounded down to [`LARGE_UNIT`].
pub const LARGE_BIN_SIZE: usize =
    (CHUNK_SIZE - LARGE_DATA_OFFSET) / LARGE_BINS / LARGE_UNIT * LARGE_UNIT;

/// Most bins in a chunk (a small chunk's).
pub const MAX_BINS_PER_CHUNK: usize = SMALL_BINS;
/// Words of a chunk's free-bin bitmap.
pub const CHUNK_BITMAP_WORDS: usize = MAX_BINS_PER_CHUNK.div_ceil(WORD_BITS);

// Small chunks: the reserved pages hold one tail per bin, and one page fewer would not.
const _: () = assert!(SMALL_RESERVED_PAGES * TAILS_PER_PAGE >= SMALL_BINS);
const _: () = assert!(
    (SMALL_RESERVED_PAGES - 1) * TAILS_PER_PAGE < PAGES_PER_CHUNK - (SMALL_RESERVED_PAGES - 1)
);
// The chunk header is block 0 of page 0, which holds no tail.
const _: () = assert!(CHUNK_HEADER_SIZE == BLOCK_SIZE && TAIL_SIZE == BLOCK_SIZE);
// Large chunks: bins fit, slot offsets are 128 mod 256 (INV(UA1)).
const _: () = assert!(LARGE_DATA_OFFSET >= CHUNK_HEADER_SIZE);
const _: () = assert!(LARGE_DATA_OFFSET + LARGE_BINS * LARGE_BIN_SIZE <= CHUNK_SIZE);
const _: () = assert!(
    LARGE_DATA_OFFSET.is_multiple_of(LARGE_UNIT) && LARGE_BIN_SIZE.is_multiple_of(LARGE_UNIT)
);
const _: () = assert!(BIN_HEADER_SIZE < LARGE_UNIT && PAGE_SIZE.is_multiple_of(LARGE_UNIT));
const _: () = assert!(LARGE_BIN_SIZE == 104_704);
const _: () = assert!(LARGE_BINS <= MAX_BINS_PER_CHUNK && CHUNK_BITMAP_WORDS == 2);
const _: () = assert!(BITMAP_WORDS * WORD_BITS == MAX_SLOTS);

/// Where inside its bin a chunk offset points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotArea {
    /// `offset` bytes past the end of the bin header.
    Body(usize),
    /// `offset` bytes into the bin's tail.
    Tail(usize),
}

/// Chunk offset of small bin `bin`'s header (the start of its page).
#[inline(always)]
pub const fn small_bin_offset(bin: usize) -> usize {
    (SMALL_RESERVED_PAGES + bin) << PAGE_SHIFT
}

/// Chunk offset of small bin `bin`'s tail.
#[inline(always)]
pub const fn tail_offset(bin: usize) -> usize {
    ((bin / TAILS_PER_PAGE) << PAGE_SHIFT) + ((1 + bin % TAILS_PER_PAGE) << BLOCK_SHIFT)
}

/// Chunk offset of large bin `bin`'s header.
#[inline(always)]
pub const fn large_bin_offset(bin: usize) -> usize {
    LARGE_DATA_OFFSET + bin * LARGE_BIN_SIZE
}

/// Which bin (index within the chunk) and which part of it chunk offset `off` falls in, for a
/// chunk of small bins (`small`) or large bins. `None` for headers, padding and unused blocks.
#[inline(always)]
pub const fn area_of(small: bool, off: usize) -> Option<(usize, SlotArea)> {
    if small {
        let page = off >> PAGE_SHIFT;
        if page >= SMALL_RESERVED_PAGES {
            let in_page = off & (PAGE_SIZE - 1);
            if in_page < BIN_HEADER_SIZE {
                return None;
            }
            return Some((
                page - SMALL_RESERVED_PAGES,
                SlotArea::Body(in_page - BIN_HEADER_SIZE),
            ));
        }
        let block = (off >> BLOCK_SHIFT) & (BLOCKS_PER_PAGE - 1);
        if block == 0 {
            return None;
        }
        let bin = page * TAILS_PER_PAGE + block - 1;
        if bin >= SMALL_BINS {
            return None;
        }
        Some((bin, SlotArea::Tail(off & (TAIL_SIZE - 1))))
    } else {
        if off < LARGE_DATA_OFFSET {
            return None;
        }
        let rel = off - LARGE_DATA_OFFSET;
        let bin = rel / LARGE_BIN_SIZE;
        if bin >= LARGE_BINS {
            return None;
        }
        let in_bin = rel - bin * LARGE_BIN_SIZE;
        if in_bin < BIN_HEADER_SIZE {
            return None;
        }
        Some((bin, SlotArea::Body(in_bin - BIN_HEADER_SIZE)))
    }
}

/// The address of slot `slot` of the bin whose header is at `bin`.
#[inline(always)]
pub(crate) fn slot_ptr(bin: u64, class: SizeClass, slot: u32) -> *mut u8 {
    let bin = bin as usize;
    let i = slot as usize;
    let addr = match class.kind() {
        BinKind::Small if slot >= class.main_slots() => {
            let chunk = bin & !(CHUNK_SIZE - 1);
            let index = ((bin - chunk) >> PAGE_SHIFT) - SMALL_RESERVED_PAGES;
            chunk + tail_offset(index) + ((i - class.main_slots() as usize) << class.shift())
        }
        _ => bin + BIN_HEADER_SIZE + (i << class.shift()),
    };
    addr as *mut u8
}
