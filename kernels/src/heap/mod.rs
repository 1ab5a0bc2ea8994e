//! The heap: one device allocation holding the allocator's metadata and the memory it hands out,
//! and `malloc`/`free` routing between UAlloc (small) and TBuddy (large).
//!
//! ```text
//!  base                                                   data (CHUNK_SIZE-aligned address)
//!  │ HeapHeader │ stats shards │ arenas │ TBuddy nodes │ large-block table │pad│ data region ...
//!  └──────────────────────── metadata ──────────────────────────────────────┘   pages × PAGE_SIZE
//! ```
//! Every metadata structure is valid when zeroed: the host zeroes the allocation, writes the
//! [`Geometry`] into the header, and an init kernel sets up the buddy tree.
//!
//! # Routing
//! `malloc(n)`: `n == 0` → null; `n <= MAX_SMALL_SIZE` → UAlloc; otherwise TBuddy, at the
//! smallest order whose block holds `n`. `free(p)`: null → no-op; outside the data region →
//! counted as invalid; `p % PAGE_SIZE == 0` → a TBuddy block (UAlloc never hands out a
//! page-aligned address, INV(UA1)); otherwise UAlloc.
//!
//! A large block's order is kept in the large-block table, one word per page (`order + 1` at
//! the block's first page, 0 elsewhere). `free` swaps it to 0: a second free of the same pointer,
//! or a pointer into the middle of a block, reads 0 and is counted, never passed to TBuddy
//! (INV(HP1)).

use core::ptr;

use crate::platform::{self, Atomic32, Atomic64};
use crate::size_class::{NUM_CLASSES, SizeClass};
use crate::tbuddy::{PAGE_SHIFT, PAGE_SIZE, TBuddy, TBuddyHeader};
use crate::ualloc::{
    Arena, CHUNK_SHIFT, CHUNK_SIZE, ChunkSource, FreeOutcome, MAX_SMALL_SIZE, OOM_RETRIES, UAlloc,
};

/// `"togaheap"`: marks an initialized header.
pub const HEAP_MAGIC: u64 = u64::from_le_bytes(*b"togaheap");
/// Separate cache lines for words that different SMs update.
pub const LINE_SIZE: usize = 128;
/// TBuddy order of one UAlloc chunk.
pub const CHUNK_ORDER: u32 = CHUNK_SHIFT - PAGE_SHIFT;
/// The step in which the header's `used` word follows the per-SM live-byte counts (INV(HP3)):
/// `used` and its high-water mark are exact to within this much per SM.
pub const USED_QUANTUM: i64 = 64 << 10;
/// The smallest heap: one chunk of data.
pub const MIN_HEAP_BYTES: u64 = CHUNK_SIZE as u64;
/// The largest heap: the buddy tree's levels bound it (see `tbuddy::MAX_LEVELS`).
pub const MAX_HEAP_BYTES: u64 = (PAGE_SIZE as u64) << (crate::tbuddy::MAX_LEVELS - 1);

/// Index of each counter in a [`StatsShard`].
pub mod stat {
    /// Successful `malloc`s.
    pub const MALLOCS: usize = 0;
    /// `free`s of live blocks.
    pub const FREES: usize = 1;
    /// `malloc`s that returned null although the size was valid (out of memory).
    pub const FAILED: usize = 2;
    /// `free`s of a pointer the heap never handed out (outside, misaligned, not a block start).
    pub const INVALID_FREES: usize = 3;
    /// `free`s of a block that was already free.
    pub const DOUBLE_FREES: usize = 4;
    /// Live blocks per size class, then one for TBuddy blocks.
    pub const LIVE_CLASS0: usize = 5;
    /// Live TBuddy (large) blocks.
    pub const LIVE_LARGE: usize = LIVE_CLASS0 + super::NUM_CLASSES;
    /// Bytes of live blocks (block sizes, as rounded up by the allocator).
    pub const LIVE_BYTES: usize = LIVE_LARGE + 1;
    /// Words in use.
    pub const COUNT: usize = LIVE_BYTES + 1;
}

/// Words per stats shard: whole cache lines.
pub const STATS_WORDS: usize = stat::COUNT.div_ceil(LINE_SIZE / 8) * (LINE_SIZE / 8);

/// Counters of one SM; the host sums the shards. Updated with relaxed adds: they order nothing.
#[repr(C, align(128))]
pub struct StatsShard {
    pub words: [Atomic64; STATS_WORDS],
}

/// One counter alone on its cache line.
#[repr(C, align(128))]
pub struct Line(pub Atomic64);

/// Where everything is, computed on the host by [`Geometry::new`] and copied into the header.
/// All offsets are from the heap's base address.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub base: u64,
    pub total_bytes: u64,
    pub shards_offset: u64,
    pub arenas_offset: u64,
    pub arenas: u64,
    pub nodes_offset: u64,
    pub node_words: u64,
    pub large_offset: u64,
    pub data_offset: u64,
    pub pages: u64,
    pub max_order: u64,
}

/// Why a heap of the asked size cannot be laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GeometryError {
    Zero,
    TooSmall { minimum: u64 },
    TooLarge { maximum: u64 },
}

const fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

impl Geometry {
    /// Bytes to allocate for a heap whose data region holds `data_bytes` (rounded down to
    /// whole pages), with `arenas` UAlloc arenas: metadata plus alignment slack.
    pub fn allocation_bytes(data_bytes: u64, arenas: u64) -> Result<u64, GeometryError> {
        let pages = Self::check(data_bytes)?;
        Ok(Self::metadata_bytes(pages, arenas) + CHUNK_SIZE as u64 + pages * PAGE_SIZE as u64)
    }

    fn check(data_bytes: u64) -> Result<u64, GeometryError> {
        if data_bytes == 0 {
            return Err(GeometryError::Zero);
        }
        if data_bytes < MIN_HEAP_BYTES {
            return Err(GeometryError::TooSmall {
                minimum: MIN_HEAP_BYTES,
            });
        }
        if data_bytes > MAX_HEAP_BYTES {
            return Err(GeometryError::TooLarge {
                maximum: MAX_HEAP_BYTES,
            });
        }
        Ok(data_bytes / PAGE_SIZE as u64)
    }

    fn max_order_for(pages: u64) -> u64 {
        pages.next_power_of_two().trailing_zeros() as u64
    }

    fn metadata_bytes(pages: u64, arenas: u64) -> u64 {
        let g = Self::layout(0, 0, pages, arenas);
        g.large_offset + pages * 4
    }

    fn layout(base: u64, total_bytes: u64, pages: u64, arenas: u64) -> Self {
        let line = LINE_SIZE as u64;
        let max_order = Self::max_order_for(pages);
        let shards_offset = align_up(size_of::<HeapHeader>() as u64, line);
        let arenas_offset = align_up(
            shards_offset + arenas * size_of::<StatsShard>() as u64,
            line,
        );
        let nodes_offset = align_up(arenas_offset + arenas * size_of::<Arena>() as u64, line);
        let node_words = TBuddy::node_words(max_order as u32) as u64;
        let large_offset = align_up(nodes_offset + node_words * 4, line);
        let data_offset = align_up(base + large_offset + pages * 4, CHUNK_SIZE as u64) - base;
        Self {
            base,
            total_bytes,
            shards_offset,
            arenas_offset,
            arenas,
            nodes_offset,
            node_words,
            large_offset,
            data_offset,
            pages,
            max_order,
        }
    }

    /// Lay out a heap of `data_bytes` in an allocation of `total_bytes` (from
    /// [`Geometry::allocation_bytes`]) at device address `base`.
    pub fn new(
        base: u64,
        total_bytes: u64,
        data_bytes: u64,
        arenas: u64,
    ) -> Result<Self, GeometryError> {
        let pages = Self::check(data_bytes)?;
        let g = Self::layout(base, total_bytes, pages, arenas.max(1));
        debug_assert!(g.data_offset + pages * PAGE_SIZE as u64 <= total_bytes);
        Ok(g)
    }

    /// Bytes the data region holds.
    pub fn data_bytes(&self) -> u64 {
        self.pages * PAGE_SIZE as u64
    }
}

/// The first bytes of every heap.
#[repr(C, align(128))]
pub struct HeapHeader {
    pub magic: Atomic64,
    pub geometry: Geometry,
    /// Bytes of live blocks in steps of `USED_QUANTUM` per SM, and its high-water mark
    /// (INV(HP3)); the exact count is the sum of the shards' `LIVE_BYTES`.
    pub used: Line,
    pub used_high: Line,
    /// Bytes taken from TBuddy (UAlloc chunks and large blocks), and its high-water mark.
    pub reserved: Line,
    pub reserved_high: Line,
    pub buddy: TBuddyHeader,
}

/// A view of an initialized heap.
#[derive(Clone, Copy)]
pub struct Heap<'a> {
    header: &'a HeapHeader,
    shards: &'a [StatsShard],
    arenas: &'a [Arena],
    large: &'a [Atomic32],
    buddy: TBuddy<'a>,
    data: *mut u8,
}

/// UAlloc's chunks come from the heap's buddy tree.
#[derive(Clone, Copy)]
pub struct HeapChunks<'a> {
    header: &'a HeapHeader,
    buddy: TBuddy<'a>,
    data: *mut u8,
}

impl ChunkSource for HeapChunks<'_> {
    fn alloc_chunk(&self) -> Option<*mut u8> {
        let offset = self.buddy.alloc(CHUNK_ORDER)?;
        add_reserved(self.header, CHUNK_SIZE as u64);
        // SAFETY: TBuddy offsets are inside the data region.
        Some(unsafe { self.data.add(offset as usize) })
    }

    unsafe fn free_chunk(&self, chunk: *mut u8) {
        let offset = chunk as u64 - self.data as u64;
        self.header.reserved.0.fetch_sub_relaxed(CHUNK_SIZE as u64);
        self.buddy.free(offset, CHUNK_ORDER);
    }

    /// Free pages in chunks (one load; fragmentation may make fewer whole chunks available).
    fn chunks_left(&self) -> usize {
        (self.buddy.free_pages() >> CHUNK_ORDER) as usize
    }
}

fn add_reserved(header: &HeapHeader, bytes: u64) {
    let now = header.reserved.0.fetch_add_relaxed(bytes) + bytes;
    header.reserved_high.0.fetch_max_relaxed(now);
}

impl<'a> Heap<'a> {
    /// View the heap at `base`.
    ///
    /// # Safety
    /// `base` points at a heap laid out by [`Geometry`] whose header holds that geometry (and,
    /// before `malloc`/`free`, that [`Heap::init_nodes`]/[`Heap::init_finish`] completed), and
    /// it outlives `'a`.
    pub unsafe fn from_base(base: *mut u8) -> Self {
        // SAFETY: the caller promises a heap at `base`.
        unsafe {
            let header = &*(base as *const HeapHeader);
            let g = &header.geometry;
            let at = |off: u64| base.add(off as usize);
            let shards = core::slice::from_raw_parts(
                at(g.shards_offset) as *const StatsShard,
                g.arenas as usize,
            );
            let arenas =
                core::slice::from_raw_parts(at(g.arenas_offset) as *const Arena, g.arenas as usize);
            let nodes = core::slice::from_raw_parts(
                at(g.nodes_offset) as *const Atomic32,
                g.node_words as usize,
            );
            let large = core::slice::from_raw_parts(
                at(g.large_offset) as *const Atomic32,
                g.pages as usize,
            );
            Self {
                header,
                shards,
                arenas,
                large,
                buddy: TBuddy::new(&header.buddy, nodes),
                data: at(g.data_offset),
            }
        }
    }

    /// Initialization, step 1: thread `thread` of `threads` initializes its share of the tree.
    pub fn init_nodes(&self, thread: u64, threads: u64) {
        let words = self.buddy_words();
        let per = words.div_ceil(threads);
        let start = (thread * per).min(words);
        let end = (start + per).min(words);
        self.buddy
            .init_nodes(start as usize..end as usize, self.header.geometry.pages);
    }

    /// Initialization, step 2 (one thread, after step 1 finished everywhere).
    pub fn init_finish(&self) {
        self.buddy.init_finish(self.header.geometry.pages);
        // Pairs with the acquire in `is_initialized`.
        self.header.magic.store_release(HEAP_MAGIC);
    }

    fn buddy_words(&self) -> u64 {
        self.header.geometry.node_words
    }

    /// Whether `init_finish` has run.
    pub fn is_initialized(&self) -> bool {
        self.header.magic.load_acquire() == HEAP_MAGIC
    }

    /// The geometry in the header.
    pub fn geometry(&self) -> &Geometry {
        &self.header.geometry
    }

    /// The buddy tree (for tests and the whole-heap checks).
    pub fn buddy(&self) -> TBuddy<'a> {
        self.buddy
    }

    fn ualloc(&self) -> UAlloc<'a, HeapChunks<'a>> {
        UAlloc::new(
            self.arenas,
            HeapChunks {
                header: self.header,
                buddy: self.buddy,
                data: self.data,
            },
        )
    }

    fn shard(&self) -> &StatsShard {
        &self.shards[platform::sm_id() as usize % self.shards.len()]
    }

    fn count(&self, word: usize, n: u64) {
        self.shard().words[word].fetch_add_relaxed(n);
    }

    /// Account a change of `delta` bytes in live blocks: exactly on this SM's shard, and on
    /// the header's `used` word (and its high-water mark) in steps of [`USED_QUANTUM`], only
    /// when the shard's count crosses a multiple of it (INV(HP3)). One add on a per-SM word per
    /// call, which a warp's lanes share in hardware; the global words see one add per
    /// `USED_QUANTUM` bytes instead of one per warp.
    fn account_live(&self, delta: i64) {
        let old = self.shard().words[stat::LIVE_BYTES].fetch_add_relaxed(delta as u64) as i64;
        let new = old.wrapping_add(delta);
        let steps = new.div_euclid(USED_QUANTUM) - old.div_euclid(USED_QUANTUM);
        if steps != 0 {
            let add = (steps * USED_QUANTUM) as u64;
            let now = self.header.used.0.fetch_add_relaxed(add).wrapping_add(add);
            // The published sum dips below zero while frees run ahead on other SMs.
            if steps > 0 && (now as i64) > 0 {
                self.header.used_high.0.fetch_max_relaxed(now);
            }
        }
    }

    /// Give back the memory UAlloc holds but does not use: empty bins to their chunks, empty
    /// chunks to the buddy tree ([`UAlloc::trim`]). Returns how much work it found (0: none).
    /// `malloc` runs it by itself before it reports out of memory; the host runs it with
    /// `toga_trim` (`toga::Heap::trim`), after which a heap whose blocks are all freed holds
    /// every page in its buddy tree again.
    pub fn trim(&self) -> u32 {
        self.ualloc().trim()
    }

    /// TBuddy order of a block that holds `size` bytes.
    fn order_for(size: usize) -> u32 {
        let pages = size.div_ceil(PAGE_SIZE);
        pages.next_power_of_two().trailing_zeros()
    }

    /// Allocate `size` bytes; null when `size` is 0, larger than the heap, or memory is out.
    /// Blocks are aligned to 16 bytes at least; small blocks to their size class, large blocks
    /// to their power-of-two size.
    pub fn malloc(&self, size: usize) -> *mut u8 {
        let (p, bytes) = if size == 0 || size as u64 > self.header.geometry.data_bytes() {
            (ptr::null_mut(), 0)
        } else if size <= MAX_SMALL_SIZE {
            let p = self.ualloc().malloc(size);
            let class = SizeClass::from_size(size);
            if !p.is_null() {
                self.count(stat::LIVE_CLASS0 + class.index(), 1);
            }
            (p, class.size())
        } else {
            self.alloc_large(size)
        };
        self.settle_malloc(size, p, bytes)
    }

    /// A TBuddy block of at least `size` bytes (whole pages, aligned to its power-of-two size),
    /// recorded in the large-block table; `(null, 0)` when out of memory.
    #[inline(never)]
    fn alloc_large(&self, size: usize) -> (*mut u8, usize) {
        let order = Self::order_for(size);
        // Out of pages: empty bins and chunks that UAlloc still holds may be what is missing
        // (INV(UA4)); give them back and try again, as a small refill does (always once after
        // a trim, more often while trims still find something).
        let mut offset = self.buddy.alloc(order);
        let mut retries = 0;
        while offset.is_none() && retries < OOM_RETRIES {
            if self.trim() == 0 && retries > 0 {
                break;
            }
            retries += 1;
            offset = self.buddy.alloc(order);
        }
        match offset {
            Some(offset) => {
                let page = (offset >> PAGE_SHIFT) as usize;
                // INV(HP1): the first page of a live large block holds order + 1.
                self.large[page].store_relaxed(order + 1);
                add_reserved(self.header, (PAGE_SIZE as u64) << order);
                self.count(stat::LIVE_LARGE, 1);
                // SAFETY: TBuddy offsets are inside the data region.
                (
                    unsafe { self.data.add(offset as usize) },
                    PAGE_SIZE << order,
                )
            }
            None => (ptr::null_mut(), 0),
        }
    }

    /// Count a `malloc` of `size` that returned `p` (a block of `bytes`), and return `p`.
    fn settle_malloc(&self, size: usize, p: *mut u8, bytes: usize) -> *mut u8 {
        if p.is_null() {
            if size != 0 {
                self.count(stat::FAILED, 1);
            }
        } else {
            self.count(stat::MALLOCS, 1);
            self.account_live(bytes as i64);
        }
        p
    }

    /// Allocate `size` bytes aligned to `align` (a power of two). Small blocks are aligned to
    /// their class ([`SizeClass::align`]: the class size up to 128 B); a stricter alignment is
    /// served from TBuddy, whose blocks are aligned to their size (at least a page). Null for
    /// alignments above `CHUNK_SIZE`.
    pub fn malloc_aligned(&self, size: usize, align: usize) -> *mut u8 {
        let size = size.max(1);
        if size <= MAX_SMALL_SIZE && align <= SizeClass::from_size(size).align() {
            return self.malloc(size);
        }
        if align > CHUNK_SIZE || size as u64 > self.header.geometry.data_bytes() {
            self.count(stat::FAILED, 1);
            return ptr::null_mut();
        }
        // A TBuddy block is aligned to its size, at least a page.
        let (p, bytes) = self.alloc_large(size.max(align));
        self.settle_malloc(size, p, bytes)
    }

    /// Allocate `count * size` zeroed bytes (null on overflow, like C's `calloc`).
    pub fn calloc(&self, count: usize, size: usize) -> *mut u8 {
        let Some(bytes) = count.checked_mul(size) else {
            self.count(stat::FAILED, 1);
            return ptr::null_mut();
        };
        let p = self.malloc(bytes);
        if !p.is_null() {
            // SAFETY: `p` holds at least `bytes` bytes.
            unsafe { ptr::write_bytes(p, 0, bytes) };
        }
        p
    }

    /// Usable bytes of the live block at `p` (0 when `p` is not a live block start).
    ///
    /// # Safety
    /// `p` is null or was returned by this heap's `malloc` and not freed.
    pub unsafe fn usable_size(&self, p: *mut u8) -> usize {
        if !self.contains(p) {
            return 0;
        }
        if (p as usize).is_multiple_of(PAGE_SIZE) {
            let page = ((p as u64 - self.data as u64) >> PAGE_SHIFT) as usize;
            match self.large[page].load_relaxed() {
                0 => 0,
                o => PAGE_SIZE << (o - 1),
            }
        } else {
            // SAFETY: `p` is a live UAlloc block (caller).
            unsafe { self.ualloc().usable_size(p) }
        }
    }

    /// C's `realloc`: null `p` is `malloc(size)`; `size == 0` frees `p` and returns null;
    /// otherwise the contents move to a block of `size` bytes (in place when the block already
    /// fits and is not more than twice too big). On failure `p` stays valid and null is returned.
    ///
    /// # Safety
    /// As for [`Heap::free`].
    pub unsafe fn realloc(&self, p: *mut u8, size: usize) -> *mut u8 {
        if p.is_null() {
            return self.malloc(size);
        }
        if size == 0 {
            // SAFETY: forwarded from the caller.
            unsafe { self.free(p) };
            return ptr::null_mut();
        }
        // SAFETY: forwarded from the caller.
        let old = unsafe { self.usable_size(p) };
        if old == 0 {
            self.count(stat::INVALID_FREES, 1);
            return ptr::null_mut();
        }
        if size <= old && size * 2 > old {
            return p;
        }
        let q = self.malloc(size);
        if !q.is_null() {
            // SAFETY: both blocks are live and distinct; copy the smaller size.
            unsafe {
                ptr::copy_nonoverlapping(p, q, old.min(size));
                self.free(p);
            }
        }
        q
    }

    fn contains(&self, p: *mut u8) -> bool {
        let start = self.data as u64;
        let end = start + self.header.geometry.data_bytes();
        (start..end).contains(&(p as u64))
    }

    /// Free the block at `p`. Null is a no-op. A pointer this heap did not hand out, or one freed
    /// already, is counted (`stat::INVALID_FREES`, `stat::DOUBLE_FREES`) and otherwise ignored
    /// where detection is cheap: outside the data region, not a block start, a large block whose
    /// table entry is clear, a small slot whose bit is clear.
    ///
    /// # Safety
    /// Undetectable misuse (a pointer into a live block of another class that happens to be a
    /// slot boundary, or use after free) is undefined behaviour, as with any `free`.
    pub unsafe fn free(&self, p: *mut u8) {
        if p.is_null() {
            return;
        }
        if !self.contains(p) {
            self.count(stat::INVALID_FREES, 1);
            return;
        }
        let bytes = if (p as usize).is_multiple_of(PAGE_SIZE) {
            let offset = p as u64 - self.data as u64;
            let page = (offset >> PAGE_SHIFT) as usize;
            // INV(HP1): only the one free that swaps the order out passes the block on.
            match self.large[page].swap_acq_rel(0) {
                0 => {
                    self.count(stat::DOUBLE_FREES, 1);
                    0
                }
                o => {
                    let order = o - 1;
                    self.buddy.free(offset, order);
                    let bytes = (PAGE_SIZE as u64) << order;
                    self.header.reserved.0.fetch_sub_relaxed(bytes);
                    self.count(stat::LIVE_LARGE, u64::MAX);
                    bytes
                }
            }
        } else {
            // SAFETY: `p` is inside the data region and not page-aligned (caller's contract).
            match unsafe { self.ualloc().free(p) } {
                FreeOutcome::Freed(class) => {
                    self.count(stat::LIVE_CLASS0 + class.index(), u64::MAX);
                    class.size() as u64
                }
                FreeOutcome::DoubleFree => {
                    self.count(stat::DOUBLE_FREES, 1);
                    0
                }
                FreeOutcome::Invalid => {
                    self.count(stat::INVALID_FREES, 1);
                    0
                }
            }
        };
        if bytes != 0 {
            self.count(stat::FREES, 1);
            self.account_live((bytes as i64).wrapping_neg());
        }
    }
}

#[cfg(not(loom))]
mod bound;
#[cfg(not(loom))]
pub use bound::*;
