//! The heap: one device allocation holding the allocator's metadata and the memory it hands out,
//! and `malloc`/`free` routing between UAlloc (small) and TBuddy (large).
//!
//! ```text
//!  base                                                   data (CHUNK_SIZE-aligned address)
//!  │ HeapHeader │ stats shards │ arenas │ TBuddy nodes │ large-block table │ stash slots │pad│ data ...
//!  └──────────────────────── metadata ────────────────────────────────────────────────────┘
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
//!
//! # Freed large blocks wait in stashes (lazy coalescing)
//! A freed block of an order in [`STASH_ORDERS`] (8 KiB to 256 KiB) goes into its order's
//! [`Stash`] instead of climbing the buddy tree; a `malloc` of that order takes one from there
//! before it looks in the tree. The stashes go back into the tree, merging as they go, when the
//! heap trims: which `malloc` does before it answers null, and the host with `toga_trim`
//! (INV(HP6)).

use core::ops::Range;
use core::ptr;

use crate::collective::Group;
use crate::platform::{self, Atomic32, Atomic64};
use crate::size_class::{NUM_CLASSES, SizeClass};
use crate::stash::{Stash, StashHeader};
use crate::tbuddy::run::{self as block_run, Leftover, RUN_ORDERS, Take};
use crate::tbuddy::{PAGE_SHIFT, PAGE_SIZE, TBuddy, TBuddyHeader};
use crate::ualloc::{
    Arena, CHUNK_SHIFT, CHUNK_SIZE, ChunkSource, FreeOutcome, MAX_SMALL_SIZE, OOM_RETRIES,
    TrimGate, UAlloc,
};

/// `"togaheap"`: marks an initialized header.
pub const HEAP_MAGIC: u64 = u64::from_le_bytes(*b"togaheap");
/// Separate cache lines for words that different SMs update.
pub const LINE_SIZE: usize = 128;
/// TBuddy order of one UAlloc chunk.
pub const CHUNK_ORDER: u32 = CHUNK_SHIFT - PAGE_SHIFT;
/// The smallest step in which the header's `used` word follows the per-SM live-byte counts
/// (INV(HP3), [`Geometry::used_quantum_shift`]).
pub const MIN_USED_QUANTUM: i64 = 64 << 10;
/// Keeps the keys of the large free's groups (`free_large`, by block order) apart from other
/// `Group::of` call sites that a warp's lanes may reach at once.
const LARGE_FREE_TAG: u64 = 1 << 40;
/// Keeps the group of `stock_arenas` apart from other `Group::of` call sites.
const STOCK_TAG: u64 = 2 << 40;
/// Keeps the keys of a large malloc's reserved-bytes groups (`alloc_large`, by block order)
/// apart from other `Group::of` call sites.
const LARGE_RESERVE_TAG: u64 = 3 << 40;
/// A heap stocks its arenas with spare chunks (`DeviceHeap::stock_arenas`) only where it has
/// at least this many chunks per spare: the spares are at most this fraction of the heap.
pub const STOCK_HEADROOM: u64 = 8;
/// The smallest heap: one chunk of data.
pub const MIN_HEAP_BYTES: u64 = CHUNK_SIZE as u64;
/// The orders of the blocks a `free` puts into a stash (8 KiB to 256 KiB); larger ones, and
/// UAlloc's chunks, go back into the tree at once.
pub const STASH_ORDERS: Range<u32> = 1..CHUNK_ORDER;
/// Stashes in the header: one per order of [`STASH_ORDERS`].
pub const STASHES: usize = (STASH_ORDERS.end - STASH_ORDERS.start) as usize;
// `DeviceHeap::malloc` serves small sizes without comparing them with the heap's size.
const _: () = assert!(MAX_SMALL_SIZE as u64 <= MIN_HEAP_BYTES);
/// The largest heap: the buddy tree's levels bound it (see `tbuddy::MAX_LEVELS`).
pub const MAX_HEAP_BYTES: u64 = (PAGE_SIZE as u64) << (crate::tbuddy::MAX_LEVELS - 1);
// UAlloc's arenas are laid out for a source of at most this size.
const _: () = assert!(MAX_HEAP_BYTES <= crate::ualloc::layout::MAX_SOURCE_BYTES);

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
    /// The stashes' slots (INV(HP6)): `2^max_order` words, right after the large-block table
    /// on the next line; the stash of order `k` holds `2^(max_order - k)` of them, from word
    /// `2^max_order - 2^(max_order - k + 1)` on.
    pub stash_offset: u64,
    pub data_offset: u64,
    pub pages: u64,
    pub max_order: u64,
    /// log2 of a growable heap's granule, the unit in which memory is mapped and unmapped
    /// (0: a fixed heap, whose whole data region is memory).
    pub granule_shift: u64,
    /// The granule map of a growable heap: one bit per granule, set while it is mapped and in
    /// the tree (INV(HP4)).
    pub granules_offset: u64,
    /// Device address of the growth [`Mailbox`] in mapped host memory (0: no growth while a
    /// kernel runs).
    pub mailbox: u64,
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
        g.stash_offset + g.stash_words() * 4
    }

    /// Words of the stashes' slots: `2^max_order`, at least the blocks of any order
    /// in the data region, so no stash can overflow (INV(ST2)).
    pub fn stash_words(&self) -> u64 {
        1 << self.max_order
    }

    /// Lay out a growable heap whose data region may reach `max_data_bytes` (rounded down to
    /// whole granules of `1 << granule_shift` bytes) in a reservation at `base`, which must be
    /// granule-aligned. The metadata comes first and is always mapped: `data_offset` bytes.
    /// Nothing of the data region needs to be mapped yet. The reservation's size is
    /// `total_bytes`.
    pub fn growable(
        base: u64,
        max_data_bytes: u64,
        arenas: u64,
        granule_shift: u32,
        mailbox: u64,
    ) -> Result<Self, GeometryError> {
        let granule = 1u64 << granule_shift;
        assert!(granule >= CHUNK_SIZE as u64 && base.is_multiple_of(granule));
        if max_data_bytes < granule {
            return Err(GeometryError::TooSmall { minimum: granule });
        }
        let pages = Self::check(max_data_bytes / granule * granule)?;
        let mut g = Self::layout(base, 0, pages, arenas.max(1));
        let granules = pages >> (granule_shift - PAGE_SHIFT);
        g.granule_shift = granule_shift as u64;
        g.granules_offset = align_up(g.stash_offset + g.stash_words() * 4, LINE_SIZE as u64);
        let map_bytes = granules.div_ceil(32) * 4;
        g.data_offset = align_up(g.granules_offset + map_bytes, granule);
        g.total_bytes = g.data_offset + pages * PAGE_SIZE as u64;
        g.mailbox = mailbox;
        Ok(g)
    }

    /// Granules of a growable heap's data region (0 for a fixed heap).
    pub fn granules(&self) -> u64 {
        if self.granule_shift == 0 {
            0
        } else {
            (self.pages << PAGE_SHIFT) >> self.granule_shift
        }
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
        let stash_offset = align_up(large_offset + pages * 4, line);
        let stash_end = stash_offset + (4 << max_order);
        let data_offset = align_up(base + stash_end, CHUNK_SIZE as u64) - base;
        Self {
            base,
            total_bytes,
            shards_offset,
            arenas_offset,
            arenas,
            nodes_offset,
            node_words,
            large_offset,
            stash_offset,
            data_offset,
            pages,
            max_order,
            granule_shift: 0,
            granules_offset: 0,
            mailbox: 0,
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

    /// log2 of the step in which the header's `used` word follows the per-SM live-byte counts
    /// (INV(HP3)): the largest power of two with `arenas × step ≤ data_bytes / 32`, and at
    /// least [`MIN_USED_QUANTUM`]. So `used` and its high-water mark are exact to within
    /// `arenas` steps: 1/32 of the data region at most, or 64 KiB per SM in a heap below 1 GiB
    /// (132 SMs: `arenas` rounds up to 256 here). Every step
    /// crossed costs an add on the header's two global words, which all SMs share: at 64 KiB,
    /// every warp that frees 32 blocks of 4 KB crossed one, and that was a tenth of the kernel
    /// (H100, 2^20 frees in an 8 GiB heap: 0.173 → 0.155 ms with 1 MiB steps,
    /// docs/benchmarks.md). Fixed for the heap's life: a growable heap's pages are its whole
    /// reservation.
    #[inline(always)]
    pub fn used_quantum_shift(&self) -> u32 {
        Self::quantum_shift(self.pages, self.arenas)
    }

    /// [`used_quantum_shift`](Self::used_quantum_shift) of a heap of `pages` data pages and
    /// `arenas` arenas.
    #[inline(always)]
    pub fn quantum_shift(pages: u64, arenas: u64) -> u32 {
        let data_log = 63 - (pages * PAGE_SIZE as u64).max(1).leading_zeros();
        // ceil(log2(arenas)).
        let arenas_log = 64 - (arenas.max(1) - 1).leading_zeros();
        let min = MIN_USED_QUANTUM.trailing_zeros();
        data_log.saturating_sub(5 + arenas_log).max(min)
    }
}

/// Where a quiescent heap's memory is ([`DeviceHeap::census`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapCensus {
    /// Bytes free in the buddy tree.
    pub tree_free_bytes: u64,
    /// UAlloc's chunks, and how many of their bins are free (not carved).
    pub chunks: u64,
    pub chunk_free_bins: u64,
    /// Live large blocks and their bytes (the large-block table).
    pub large_blocks: u64,
    pub large_bytes: u64,
    /// Bytes of the blocks in the stashes.
    pub stashed_bytes: u64,
    /// Carved bins; those with no slot taken, and of those the listed ones; those carved for
    /// runs of slots; the free slots of carved bins; the units of the arenas' slot semaphores.
    pub carved_bins: u64,
    pub empty_bins: u64,
    pub empty_listed_bins: u64,
    pub run_bins: u64,
    pub free_slots: u64,
    pub slot_units: u64,
    /// Chunks by kind (small, large) and carved bins (0, 1, 2, 3, 4, 5 or more).
    pub chunks_by_carved: [[u64; 6]; 2],
}

/// A large-block table entry whose block was freed (INV(HP1)): a free that finds it is a
/// double free, one that finds 0 the free of a pointer `malloc` never handed out.
const FREED_LARGE: u32 = u32::MAX;

/// The first bytes of every heap.
#[repr(C, align(128))]
pub struct HeapHeader {
    pub magic: Atomic64,
    pub geometry: Geometry,
    /// Bytes of live blocks in steps of the heap's quantum per SM
    /// ([`Geometry::used_quantum_shift`]), and its high-water mark
    /// (INV(HP3)); the exact count is the sum of the shards' `LIVE_BYTES`.
    pub used: Line,
    pub used_high: Line,
    /// Bytes taken from TBuddy (UAlloc chunks and live large blocks; not stashed ones,
    /// INV(HP6)), and its high-water mark.
    pub reserved: Line,
    pub reserved_high: Line,
    /// Growth while kernels run (INV(HP5)): the lock of the mailbox, held by the one thread
    /// that talks to the host; nonzero `grow_denied` once the host answered that the heap is
    /// at its maximum (the host clears it when it trims); and counts of the growths and of the
    /// requests that got nothing (denied or timed out).
    pub grow_lock: Line,
    pub grow_denied: Line,
    pub grows: Line,
    pub grow_failures: Line,
    /// One trim of UAlloc at a time; threads out of memory meanwhile share its result, and
    /// skip a trim that cannot help (INV(UA17)).
    pub trim_gate: TrimGate,
    pub buddy: TBuddyHeader,
    /// The stashes' counters, one per order of [`STASH_ORDERS`] (INV(HP6)).
    pub stash: [StashHeader; STASHES],
}

/// The growth mailbox: a few words of pinned host memory mapped into the device, through
/// which a kernel asks the host for more memory (INV(HP5)). The device side writes the
/// request and `consumed_seq`, the host the reply; sequence numbers say what is new.
#[repr(C)]
#[derive(Debug, Default)]
pub struct Mailbox {
    /// Requests posted (device).
    pub request_seq: u64,
    /// Bytes the newest request needs (device).
    pub request_bytes: u64,
    /// Replies taken into the heap (device).
    pub consumed_seq: u64,
    /// Replies written (host): equals `request_seq` once the newest request is answered.
    pub reply_seq: u64,
    /// The mapped range of the newest reply: data-region offset and bytes (0 bytes: denied).
    pub reply_offset: u64,
    pub reply_bytes: u64,
}

/// How long a thread waits for the host to answer a growth request before it gives up (and
/// its `malloc` returns null, counted in `grow_failures`).
pub const GROW_TIMEOUT_NS: u64 = 1_000_000_000;

/// A view of an initialized heap.
///
/// Every `malloc` and `free` builds one, so it holds only what the header says, loaded at once
/// (one round trip to memory, no branch between the loads), and nothing derived: the buddy
/// tree's view is built where a path uses the tree ([`buddy`](Self::buddy)). ncu of 2^20 frees
/// of 16 B (H100, 2026-11-26l): with the tree's view in here, a check of the node array's length
/// put a branch between two batches of the header's loads, the granule shift came in a third,
/// and the view (kept in local memory, which the callees borrow) took a loop over the index's
/// layers; three round trips went by before the block's own chunk was read.
#[derive(Clone, Copy)]
pub struct DeviceHeap<'a> {
    header: &'a HeapHeader,
    shards: &'a [StatsShard],
    arenas: &'a [Arena],
    large: &'a [Atomic32],
    /// The buddy tree's node words: its view is built where a path uses the tree
    /// ([`buddy`](Self::buddy)).
    nodes: &'a [Atomic32],
    data: *mut u8,
    /// The geometry's `granule_shift` (0: a fixed heap), for [`is_mapped`](Self::is_mapped).
    granule_shift: u32,
}

/// UAlloc's chunks come from the heap's buddy tree. It holds the heap's header, one pointer,
/// and rebuilds the heap's view from it where a chunk is taken or given back (`DeviceHeap::at`,
/// loads of the header's geometry, in paths that run once per chunk or refill).
///
/// Not a copy of the view's fields: the tree's view is 72 bytes, and a copy per `malloc` and
/// `free` was a byte loop of 72 local loads and 72 local stores in every kernel (LLVM's
/// expansion of an unaligned `memcpy`; 5% of the stall samples of a warm 16 B malloc, per ncu).
/// Not a borrow of the view either: out-of-line functions that took one (this, `free_large`,
/// `alloc_large`) made every kernel store the view (88 bytes a thread) to its stack on entry,
/// and reload fields from there after each call; those stores reached L2. ncu of 2^20 frees
/// of 4 KB: 4.25 M sectors written to L2 (the frees themselves write a few thousand lines),
/// the fabric between the L2's halves 87% busy; 0.13 M sectors without the borrow. 2^20 fresh
/// mallocs of 16 B: 0.143 → 0.093 ms (H100).
#[derive(Clone, Copy)]
pub struct HeapChunks<'h> {
    header: &'h HeapHeader,
}

impl<'h> HeapChunks<'h> {
    /// The heap's view, rebuilt from its header.
    #[inline(always)]
    fn heap(self) -> DeviceHeap<'h> {
        DeviceHeap::at(self.header)
    }
}

impl ChunkSource for HeapChunks<'_> {
    fn alloc_chunk(&self) -> Option<*mut u8> {
        let heap = self.heap();
        let buddy = heap.buddy();
        let mut offset = buddy.alloc(CHUNK_ORDER);
        while offset.is_none() && heap.grow_on_demand(CHUNK_SIZE as u64) {
            offset = buddy.alloc(CHUNK_ORDER);
        }
        let offset = offset?;
        add_reserved(heap.header, CHUNK_SIZE as u64);
        // SAFETY: TBuddy offsets are inside the data region.
        Some(unsafe { heap.data.add(offset as usize) })
    }

    /// `2^log2` chunks from the tree in one allocation (`TBuddy::alloc_split`), without
    /// growing the heap: a growable heap's growth is for the chunk that was asked for.
    fn alloc_chunk_run(&self, log2: u32) -> Option<*mut u8> {
        let heap = self.heap();
        let offset = heap.buddy().alloc_split(CHUNK_ORDER, log2)?;
        add_reserved(heap.header, (CHUNK_SIZE as u64) << log2);
        // SAFETY: TBuddy offsets are inside the data region.
        Some(unsafe { heap.data.add(offset as usize) })
    }

    unsafe fn free_chunk(&self, chunk: *mut u8) {
        let heap = self.heap();
        let offset = chunk as u64 - heap.data as u64;
        heap.header.reserved.0.fetch_sub_relaxed(CHUNK_SIZE as u64);
        heap.buddy().free(offset, CHUNK_ORDER);
    }

    /// Free pages in chunks (one load; fragmentation may make fewer whole chunks available).
    /// A growable heap counts its mapped pages only (INV(HP8)): while its tree runs dry and
    /// waits for growth, UAlloc's refills plan as in a fixed heap running out, one chunk of a
    /// kind at a time at the class's home, instead of each arena adopting chunks of its own.
    fn chunks_left(&self) -> usize {
        (self.heap().buddy().free_pages() >> CHUNK_ORDER) as usize
    }

    /// The blocks of the SMs' runs that nobody took go back to the tree (INV(TB14)). The
    /// stashed blocks went back just before, in `reclaim_shared`.
    fn reclaim(&self) -> u32 {
        self.heap().flush_runs()
    }

    /// Every thread that trims gives stashed blocks back to the tree, one at a time, until
    /// the stashes are empty (INV(HP6)): threads out of memory at once share the climbs, where
    /// the one thread of the trim would climb once per block while the others wait.
    fn reclaim_shared(&self) -> u32 {
        self.heap().flush_stashes()
    }

    /// The heap's pages in chunks (the header's geometry, plain loads): a fixed heap's, or a
    /// growable heap's at its maximum (INV(HP8)).
    fn chunks_at_most(&self) -> usize {
        (self.header.geometry.pages >> CHUNK_ORDER) as usize
    }
}

fn add_reserved(header: &HeapHeader, bytes: u64) {
    let now = header.reserved.0.fetch_add_relaxed(bytes) + bytes;
    header.reserved_high.0.fetch_max_relaxed(now);
}

impl<'a> DeviceHeap<'a> {
    /// View the heap at `base`.
    ///
    /// # Safety
    /// `base` points at a heap laid out by [`Geometry`] whose header holds that geometry (and,
    /// before `malloc`/`free`, that [`DeviceHeap::init_nodes`]/[`DeviceHeap::init_finish`] completed), and
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
                nodes,
                data: at(g.data_offset),
                granule_shift: g.granule_shift as u32,
            }
        }
    }

    /// The view of the heap whose header is `header`, rebuilt from the header's geometry.
    /// For out-of-line paths, which take the header (one pointer) rather than a borrow of the
    /// view: a borrow made every kernel store the view to its stack (`HeapChunks`).
    #[inline(always)]
    fn at(header: &'a HeapHeader) -> Self {
        // SAFETY: `header` is the header of an initialized heap: every view is built from one
        // (`from_base`), and the heap outlives `'a`.
        unsafe { Self::from_base(header as *const HeapHeader as *mut u8) }
    }

    /// Initialization, step 1: thread `thread` of `threads` initializes its share of the tree.
    pub fn init_nodes(&self, thread: u64, threads: u64) {
        let words = self.buddy_words();
        let per = words.div_ceil(threads);
        let start = (thread * per).min(words);
        let end = (start + per).min(words);
        let g = &self.header.geometry;
        // A growable heap's tree starts empty (all Busy); its memory comes with `add_range`.
        let usable = if g.granule_shift == 0 { g.pages } else { 0 };
        self.buddy()
            .init_nodes(start as usize..end as usize, usable);
    }

    /// Initialization, step 2 (one thread, after step 1 finished everywhere).
    pub fn init_finish(&self) {
        self.buddy().init_finish(self.header.geometry.pages);
        // Pairs with the acquire in `is_initialized`.
        self.header.magic.store_release(HEAP_MAGIC);
    }

    /// Initialization, step 3 (fixed heaps, after `init_finish`): thread `thread` takes one
    /// chunk from the tree for arena `thread / 2` as its spare of bin kind `thread % 2`
    /// (threads past `2 × arenas` do nothing). An arena's first adoption of a kind then takes
    /// the spare with one `swap` instead of climbing the tree: in a fresh heap every arena
    /// adopts its first chunks at once, and those climbs, one split at a time, were most of a
    /// 1024-thread kernel's time. Only heaps where the spares are at most an eighth of the
    /// chunks get them ([`STOCK_HEADROOM`]); `trim`, which `malloc` runs before it reports out
    /// of memory, gives back the spares no arena took (INV(UA14)). The lanes of a warp take
    /// their chunks with one group walk (`TBuddy::alloc_together`). A heap with twice the
    /// room (sixteen chunks per spare) also adopts one chunk of the kind for the arena now
    /// (`UAlloc::adopt_extra`): the arena's first refills take its bins with neither a climb
    /// nor the spare's swap, and its first adoption is the spare's. At 2^20 fresh mallocs of
    /// 64 B every arena needed a second chunk near the end of the fill, and the 132 climbs of
    /// the tree at once made the fill 18% slower (H100, 8 GiB). The trim gives back an adopted
    /// chunk that nothing used, as it does the spares. Returns whether this thread stocked a
    /// spare.
    pub fn stock_arenas(&self, thread: u64) -> bool {
        let kinds = crate::size_class::NUM_KINDS as u64;
        let arenas = self.arenas.len() as u64;
        let buddy = self.buddy();
        let chunks = buddy.usable_pages() >> CHUNK_ORDER;
        if thread >= arenas * kinds || chunks < STOCK_HEADROOM * arenas * kinds {
            return false;
        }
        let group = Group::of(STOCK_TAG);
        let Some(offset) = buddy.alloc_together(&group, CHUNK_ORDER) else {
            return false;
        };
        add_reserved(self.header, CHUNK_SIZE as u64);
        // SAFETY: TBuddy offsets are inside the data region.
        let chunk = unsafe { self.data.add(offset as usize) };
        let kind = crate::size_class::BinKind::ALL[(thread % kinds) as usize];
        let stocked = self
            .ualloc()
            .stock_spare((thread / kinds) as usize, kind, chunk);
        if !stocked {
            // Stocked twice (a second launch): the chunk goes back.
            // SAFETY: the chunk came from `alloc_together` above and nobody else has it.
            unsafe {
                HeapChunks {
                    header: self.header,
                }
                .free_chunk(chunk)
            };
        } else if chunks >= 2 * STOCK_HEADROOM * arenas * kinds
            && let Some(offset) = buddy.alloc(CHUNK_ORDER)
        {
            // Twice the room: the arena also adopts a chunk of this kind now (see above).
            add_reserved(self.header, CHUNK_SIZE as u64);
            // SAFETY: TBuddy offsets are inside the data region; the chunk is ours alone.
            unsafe {
                self.ualloc().adopt_extra(
                    (thread / kinds) as usize,
                    kind,
                    self.data.add(offset as usize),
                );
            }
        }
        stocked
    }

    /// Initialization of a growable heap, step 2 (one thread, after step 1): the tree starts
    /// empty; the host then adds its mapped granules with `add_range`.
    pub fn init_growable_finish(&self) {
        self.buddy()
            .init_growable_finish(self.header.geometry.pages);
        self.header.magic.store_release(HEAP_MAGIC);
    }

    fn buddy_words(&self) -> u64 {
        self.header.geometry.node_words
    }

    // ---- growth (growable heaps) ----------------------------------------------------------

    fn granule_map(&self) -> &'a [Atomic32] {
        let g = &self.header.geometry;
        let base = self.header as *const HeapHeader as *const u8;
        // SAFETY: the geometry places `granules().div_ceil(32)` words at `granules_offset`.
        unsafe {
            core::slice::from_raw_parts(
                base.add(g.granules_offset as usize) as *const Atomic32,
                g.granules().div_ceil(32) as usize,
            )
        }
    }

    /// Whether the granule of `p` (inside the data region) is mapped: always for a fixed heap.
    #[inline]
    fn is_mapped(&self, p: *mut u8) -> bool {
        let shift = self.granule_shift;
        if shift == 0 {
            return true;
        }
        let granule = (p as u64 - self.data as u64) >> shift;
        self.granule_map()[(granule / 32) as usize].load_relaxed() & (1 << (granule % 32)) != 0
    }

    /// Hand `bytes` of freshly mapped memory at data offset `offset` (whole granules, none in
    /// the heap yet) to the heap: mark the granules mapped, then grow the buddy tree by the
    /// aligned blocks that tile the range.
    pub fn add_range(&self, offset: u64, bytes: u64) {
        let shift = self.header.geometry.granule_shift;
        debug_assert!(
            shift != 0 && offset.is_multiple_of(1 << shift) && bytes.is_multiple_of(1 << shift)
        );
        let map = self.granule_map();
        for granule in offset >> shift..(offset + bytes) >> shift {
            map[(granule / 32) as usize].fetch_or_relaxed(1 << (granule % 32));
        }
        let (mut at, end) = (offset >> PAGE_SHIFT, (offset + bytes) >> PAGE_SHIFT);
        let buddy = self.buddy();
        while at < end {
            let order = (at.trailing_zeros())
                .min(63 - (end - at).leading_zeros())
                .min(buddy.max_order());
            // INV(TB10): the block is mapped and was not in the tree.
            buddy.grow(at << PAGE_SHIFT, order);
            at += 1 << order;
        }
    }

    /// Take free granules out of the heap for the host to unmap: first give back what UAlloc
    /// holds unused, then take granule-sized blocks from the tree and clear their map bits,
    /// writing their data offsets to `out` (at most `out.len()`). Returns how many.
    pub fn take_granules(&self, out: &mut [u64]) -> usize {
        let shift = self.header.geometry.granule_shift;
        if shift == 0 {
            return 0;
        }
        self.trim();
        let (map, buddy) = (self.granule_map(), self.buddy());
        let mut n = 0;
        while n < out.len() {
            let Some(offset) = buddy.take(shift as u32 - PAGE_SHIFT) else {
                break;
            };
            let granule = offset >> shift;
            map[(granule / 32) as usize].fetch_and_relaxed(!(1 << (granule % 32)));
            out[n] = offset;
            n += 1;
        }
        n
    }

    /// Ask the host for `bytes` more memory and wait for it (a growable heap with a mailbox;
    /// `false` at once otherwise, or when the heap is at its maximum). `true` when memory was
    /// added, by this thread or by another while this one waited: the caller tries again.
    /// One thread at a time holds the mailbox (INV(HP5)); the others wait for it and retry.
    ///
    /// INV(HP7): one denied request per growth epoch. Once the host has answered that it
    /// cannot grow the heap (its maximum, or the device out of memory), `grow_denied` stays
    /// set until the host clears it (`Heap::synchronize`, `grow`, `trim_to`): every thread
    /// that asks after that, or that waits for the mailbox meanwhile, returns `false` at once
    /// instead of posting a request of its own and waiting for the host's answer. Without
    /// that, the waiters took the lock one after another and each waited a round trip to the
    /// host: 2^17 threads asking for twice a 2 GiB maximum took 1,070 ms, and those that
    /// waited past [`GROW_TIMEOUT_NS`] failed with memory still unmapped (82.7% of the
    /// maximum served; H200).
    #[cold]
    #[inline(never)]
    pub fn grow_on_demand(&self, bytes: u64) -> bool {
        let h = self.header;
        if h.geometry.mailbox == 0 || h.grow_denied.0.load_relaxed() != 0 {
            return false;
        }
        let start = platform::global_timer_ns();
        let grows = h.grows.0.load_relaxed();
        let mut backoff = platform::Backoff::new();
        loop {
            // Acquire: pairs with the release that dropped the lock after the last growth.
            if h.grow_lock.0.load_relaxed() == 0
                && h.grow_lock.0.compare_exchange_acq_rel(0, 1).is_ok()
            {
                break;
            }
            // INV(HP7): the holder's request was denied; nothing to wait for.
            if h.grow_denied.0.load_relaxed() != 0 {
                return false;
            }
            // The holder grew the heap: try that memory without taking the lock in turn.
            if h.grows.0.load_relaxed() != grows {
                return true;
            }
            if platform::global_timer_ns().wrapping_sub(start) > GROW_TIMEOUT_NS {
                h.grow_failures.0.fetch_add_relaxed(1);
                return false;
            }
            backoff.snooze();
        }
        let grown = if h.grow_denied.0.load_relaxed() != 0 {
            // INV(HP7): denied while this thread waited for the lock.
            false
        } else if h.grows.0.load_relaxed() != grows {
            // Another thread grew the heap while this one waited: try that first.
            true
        } else {
            self.grow_locked(bytes, start)
        };
        // Release: the tree's new blocks before the next holder's look.
        h.grow_lock.0.store_release(0);
        grown
    }

    /// The mailbox exchange, under the grow lock: post a request unless one is open, wait for
    /// the answer, take it in. Inlined into `grow_on_demand`, the one function of a kernel
    /// whose accesses may be of system scope (`tests/ptxas.rs`).
    #[inline(always)]
    fn grow_locked(&self, bytes: u64, start: u64) -> bool {
        let mb = self.header.geometry.mailbox as *mut Mailbox;
        // SAFETY: the host keeps the mailbox mapped for the heap's life; only the lock holder
        // writes the device's words.
        unsafe {
            let consumed = platform::load_sys(&raw const (*mb).consumed_seq);
            if platform::load_sys(&raw const (*mb).reply_seq) == consumed {
                // No answer waiting. Post a request, unless an earlier holder's is still open
                // (it timed out): then wait for that one's answer.
                let posted = platform::load_sys(&raw const (*mb).request_seq);
                if posted == consumed {
                    platform::store_sys(&raw mut (*mb).request_bytes, bytes);
                    platform::fence_sys();
                    platform::store_sys(&raw mut (*mb).request_seq, posted + 1);
                }
                let mut sleep = 1_000;
                while platform::load_sys(&raw const (*mb).reply_seq) == consumed {
                    if platform::global_timer_ns().wrapping_sub(start) > GROW_TIMEOUT_NS {
                        self.header.grow_failures.0.fetch_add_relaxed(1);
                        return false;
                    }
                    platform::nanosleep(sleep);
                    sleep = (sleep * 2).min(20_000);
                }
            }
            self.consume_reply(mb)
        }
    }

    /// Take the mailbox's newest answer into the heap (under the grow lock, an answer being
    /// there). Returns whether it added memory.
    ///
    /// # Safety
    /// `mb` is the heap's mailbox.
    unsafe fn consume_reply(&self, mb: *mut Mailbox) -> bool {
        // SAFETY: caller's contract.
        unsafe {
            let seq = platform::load_sys(&raw const (*mb).reply_seq);
            // The host wrote the range before the sequence number.
            platform::fence_sys();
            let offset = platform::load_sys(&raw const (*mb).reply_offset);
            let bytes = platform::load_sys(&raw const (*mb).reply_bytes);
            platform::store_sys(&raw mut (*mb).consumed_seq, seq);
            if bytes == 0 {
                self.header.grow_denied.0.store_relaxed(1);
                self.header.grow_failures.0.fetch_add_relaxed(1);
                return false;
            }
            self.add_range(offset, bytes);
        }
        self.header.grows.0.fetch_add_relaxed(1);
        true
    }

    /// Take in an answer that arrived after its asker gave up (the host runs this before it
    /// looks at the heap, `toga_heap_collect`). Returns whether it added memory.
    pub fn collect_growth(&self) -> bool {
        let h = self.header;
        if h.geometry.mailbox == 0 {
            return false;
        }
        let mut backoff = platform::Backoff::new();
        while h.grow_lock.0.compare_exchange_acq_rel(0, 1).is_err() {
            backoff.snooze();
        }
        let mb = h.geometry.mailbox as *mut Mailbox;
        // SAFETY: the heap's mailbox, under the lock.
        let grown = unsafe {
            platform::load_sys(&raw const (*mb).reply_seq)
                != platform::load_sys(&raw const (*mb).consumed_seq)
                && self.consume_reply(mb)
        };
        h.grow_lock.0.store_release(0);
        grown
    }

    /// Where a quiescent heap's memory is (one thread; nothing else runs on the heap): a
    /// diagnostic for tests and `toga_heap_census`, which reads every chunk header and every
    /// page's large-table word.
    pub fn census(&self) -> HeapCensus {
        let mut c = HeapCensus {
            tree_free_bytes: self.buddy().available_pages() << PAGE_SHIFT,
            ..HeapCensus::default()
        };
        let pages = self.large.len();
        let mut page = 0;
        while page < pages {
            let p = self.data.wrapping_add(page << PAGE_SHIFT);
            if !self.is_mapped(p) {
                page += 1 << (self.granule_shift.max(PAGE_SHIFT) - PAGE_SHIFT);
                continue;
            }
            match self.large[page].load_relaxed() {
                0 | FREED_LARGE => {}
                order => {
                    c.large_bytes += (PAGE_SIZE as u64) << (order - 1);
                    c.large_blocks += 1;
                }
            }
            if page.is_multiple_of(1 << CHUNK_ORDER) {
                // SAFETY: a mapped page of the data region; a chunk header is read only where
                // its magic says UAlloc owns the chunk.
                let h = unsafe { &*(p as *const crate::ualloc::chunk::ChunkHeader) };
                if h.magic.load_relaxed() == crate::ualloc::chunk::magic_of(p as usize) {
                    c.chunks += 1;
                    c.chunk_free_bins += h.n_free.load_relaxed() as u64;
                    let per = crate::ualloc::chunk::bins_per_chunk(h.kind()) as usize;
                    let carved = per - h.n_free.load_relaxed() as usize;
                    c.chunks_by_carved[h.kind().index()][carved.min(5)] += 1;
                    for b in 0..per {
                        if h.is_bin_free(b) {
                            continue;
                        }
                        let bin = h.bin(b);
                        let (class, owner) = bin.look(true);
                        let Some(class) = class else { continue };
                        let used = bin.used_count();
                        c.carved_bins += 1;
                        if used == 0 {
                            c.empty_bins += 1;
                            if bin.listed.load_relaxed() != 0 {
                                c.empty_listed_bins += 1;
                            }
                        }
                        if owner & crate::ualloc::bin::RUN_BIN != 0 {
                            c.run_bins += 1;
                        }
                        if used != u32::MAX {
                            c.free_slots += (class.slots() - used.min(class.slots())) as u64;
                        }
                    }
                }
            }
            page += 1;
        }
        for order in STASH_ORDERS {
            c.stashed_bytes += self.stash(order).len() << (order + PAGE_SHIFT);
        }
        for arena in self.arenas {
            for class in SizeClass::ALL {
                c.slot_units += arena.class(class).slots.0.available() as u64;
            }
        }
        c
    }

    /// Whether `init_finish` has run.
    pub fn is_initialized(&self) -> bool {
        self.header.magic.load_acquire() == HEAP_MAGIC
    }

    /// The geometry in the header.
    pub fn geometry(&self) -> &Geometry {
        &self.header.geometry
    }

    /// The buddy tree's view: built on each call, in a few instructions with no loop and no
    /// memory access ([`TBuddy::new_unchecked`]). Not a field: the view of the heap is kept in
    /// local memory wherever a callee borrows it, and a tree's view in it made every `malloc`
    /// and `free` store it there.
    #[inline(always)]
    pub fn buddy(&self) -> TBuddy<'a> {
        // SAFETY: the geometry sized the node words for this tree (`from_base`'s promise).
        unsafe { TBuddy::new_unchecked(&self.header.buddy, self.nodes) }
    }

    fn ualloc(&self) -> UAlloc<'_, HeapChunks<'_>> {
        UAlloc::new(
            self.arenas,
            HeapChunks {
                header: self.header,
            },
        )
        .with_trim_gate(&self.header.trim_gate)
    }

    fn shard(&self) -> &StatsShard {
        &self.shards[platform::sm_id() as usize % self.shards.len()]
    }

    fn count(&self, word: usize, n: u64) {
        self.shard().words[word].fetch_add_relaxed(n);
    }

    /// Account a change of `delta` bytes in live blocks: exactly on this SM's shard, and on
    /// the header's `used` word (and its high-water mark) in steps of the heap's quantum
    /// ([`Geometry::used_quantum_shift`]), only when the shard's count crosses a multiple of it
    /// (INV(HP3)). One add on a per-SM word per call, which a warp's lanes share in hardware;
    /// the global words see one add per quantum instead of one per warp.
    fn account_live(&self, delta: i64) {
        let old = self.shard().words[stat::LIVE_BYTES].fetch_add_relaxed(delta as u64) as i64;
        let new = old.wrapping_add(delta);
        // From the view's lengths (data pages, arenas), not the header's geometry: two loads of
        // the header per call were, after an acquire's L1 invalidation, two round trips to
        // memory one after the other (ncu of one thread's mallocs, `docs/benchmarks.md`). A
        // field of the view with the shift made frees 2% slower (H100).
        let shift = Geometry::quantum_shift(self.large.len() as u64, self.arenas.len() as u64);
        // Arithmetic shifts: floor division by the quantum, also below zero.
        let steps = (new >> shift) - (old >> shift);
        if steps != 0 {
            let add = (steps << shift) as u64;
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

    /// Whether `size` bytes are more than the data region holds. From the length of the
    /// large-block table (one word per page), which the view keeps: no load of the header's
    /// geometry, a round trip to memory in a kernel whose acquires emptied the L1 (ncu of one
    /// thread's mallocs, `docs/benchmarks.md`).
    #[inline(always)]
    fn exceeds_data(&self, size: usize) -> bool {
        size.div_ceil(PAGE_SIZE) > self.large.len()
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
        // Small sizes first: every heap holds a chunk (`MIN_HEAP_BYTES`), so they never exceed
        // the data region.
        let (p, bytes, word) = if size.wrapping_sub(1) < MAX_SMALL_SIZE {
            let p = self.ualloc().malloc(size);
            let class = SizeClass::from_size(size);
            (p, class.size(), stat::LIVE_CLASS0 + class.index())
        } else if size == 0 || self.exceeds_data(size) {
            (ptr::null_mut(), 0, stat::FAILED)
        } else {
            let (p, bytes) = self.alloc_large_copy(size);
            (p, bytes, stat::LIVE_LARGE)
        };
        self.settle_malloc(size, p, bytes, word)
    }

    /// A TBuddy block of at least `size` bytes (whole pages, aligned to its power-of-two size),
    /// recorded in the large-block table; `(null, 0)` when out of memory.
    ///
    /// Out of line, on a copy of the view that the caller makes in its large branch
    /// ([`alloc_large_copy`](Self::alloc_large_copy)): a borrow of the caller's own view made
    /// every kernel store it to its stack on entry (`HeapChunks`). Not rebuilt from the header
    /// as `free_large` is: one thread's 10,000 mallocs of 1–8192 B, half of them large, took
    /// 2.2% longer with the header's loads in every call than with the copy (19.96 against
    /// 19.53 ms, H100).
    #[inline(never)]
    fn alloc_large(&self, size: usize) -> (*mut u8, usize) {
        let order = Self::order_for(size);
        let group = Group::of(order as u64);
        // A lone lane takes a block of the smaller orders from its SM's run (`tbuddy::run`),
        // whose pages are counted as reserved already.
        let from_run = if group.is_single() && RUN_ORDERS.contains(&order) {
            self.alloc_from_run(order)
        } else {
            None
        };
        let offset = match from_run {
            Some(offset) => Some(offset),
            None => self.alloc_from_tree(&group, order),
        };
        match offset {
            Some(offset) => {
                let page = (offset >> PAGE_SHIFT) as usize;
                // INV(HP1): the first page of a live large block holds order + 1.
                self.large[page].store_relaxed(order + 1);
                if from_run.is_none() {
                    // One add for the lanes that took a block of this order from the tree
                    // here together, as in `free_large`.
                    let group = Group::of(LARGE_RESERVE_TAG | order as u64);
                    if group.is_leader() {
                        add_reserved(self.header, (group.size() as u64) << (order + PAGE_SHIFT));
                    }
                }
                // SAFETY: TBuddy offsets are inside the data region.
                (
                    unsafe { self.data.add(offset as usize) },
                    PAGE_SIZE << order,
                )
            }
            None => (ptr::null_mut(), 0),
        }
    }

    /// [`alloc_large`](Self::alloc_large) on a copy of the view made here, so that only the
    /// large branch stores it to the stack. `black_box`: a plain copy was folded back into the
    /// caller's view, whose stores then went back to the kernel's entry (PTX of `toga_malloc`).
    #[inline(always)]
    fn alloc_large_copy(&self, size: usize) -> (*mut u8, usize) {
        let view = core::hint::black_box(*self);
        view.alloc_large(size)
    }

    /// A block of `order` for the lanes of `group` (collective): from the order's stash where
    /// it holds some (INV(HP6)), otherwise from the tree, where the lanes that ask for the
    /// same order share the blocks above it (`TBuddy::alloc_together`, INV(TB11)). Out of
    /// line, so that a block from a run (the common case of a lone lane) does not build the
    /// tree's view in local memory.
    #[inline(never)]
    fn alloc_from_tree(&self, group: &Group, order: u32) -> Option<u64> {
        let mut rest = *group;
        if STASH_ORDERS.contains(&order) {
            match self.stash(order).take(group) {
                (Some(value), _) => return Some(Self::stashed_offset(value)),
                // The lanes of the lowest ranks got a block; the others go on together.
                (None, got) => rest = group.from_rank(got),
            }
        }
        let buddy = self.buddy();
        let mut offset = buddy.alloc_together(&rest, order);
        if offset.is_none() {
            offset = self.alloc_after_trims(order);
        }
        // A growable heap asks the host for more before it gives up.
        while offset.is_none() && self.grow_on_demand((PAGE_SIZE as u64) << order) {
            offset = buddy.alloc(order);
        }
        // INV(HP9): a growable heap that cannot grow (any more). While this lane waited for
        // the host, other SMs may have stocked runs from the memory the growths brought,
        // after this lane's trims: a last round of trims gives those blocks back before the
        // lane answers null, as a fixed heap's lane out of memory does.
        if offset.is_none() && self.header.geometry.mailbox != 0 {
            offset = self.alloc_after_trims(order);
        }
        offset
    }

    /// Out of pages: empty bins and chunks that UAlloc still holds, the runs' blocks and the
    /// stashes may be what is missing (INV(UA4), INV(TB14)); give them back and try again, as
    /// a small refill does (always once after a trim, more often while trims still find
    /// something).
    #[cold]
    fn alloc_after_trims(&self, order: u32) -> Option<u64> {
        let buddy = self.buddy();
        let mut retries = 0;
        while retries < OOM_RETRIES {
            if self.trim() == 0 && retries > 0 {
                break;
            }
            retries += 1;
            if let Some(offset) = buddy.alloc(order) {
                return Some(offset);
            }
        }
        None
    }

    /// A block of `order` (in `RUN_ORDERS`) for a lone lane, counted as reserved already:
    /// from its SM's run, one add, and
    /// once per run a split of one block of the tree into a new run of
    /// [`run_blocks`](Self::run_blocks) blocks (`tbuddy::run`). Runs are stocked only while a
    /// quarter of the tree stays free after the split, the bound of the group path
    /// (`TBuddy::alloc_together`): nearer the end of memory every lone lane goes to the tree.
    /// The run's pages are counted as reserved when it is stocked. `None`: take the block from
    /// the tree (also in a heap too small for runs of `order`, whose words stay parked).
    #[inline(never)]
    fn alloc_from_run(&self, order: u32) -> Option<u64> {
        let arena = &self.arenas[platform::sm_id() as usize % self.arenas.len()];
        let run = arena.run(order);
        let shift = order + PAGE_SHIFT;
        match run.take(shift) {
            Take::Block(offset) => Some(offset),
            Take::Elsewhere => None,
            Take::Stock => {
                // Freed blocks of this order before a new run (INV(HP6)): the next take
                // stocks again. Not counted as reserved yet, unlike a run's.
                if let Some(value) = self.stash(order).take_one() {
                    if let Some(left) = run.clear(shift) {
                        self.give_back(left, order);
                    }
                    add_reserved(self.header, (PAGE_SIZE as u64) << order);
                    return Some(Self::stashed_offset(value));
                }
                // A heap too small for runs of this order parks the word (levels 0).
                let levels = self.run_levels(order);
                let run_pages = 1u64 << (order + levels);
                let buddy = self.buddy();
                let plenty =
                    levels != 0 && buddy.free_pages() >= buddy.usable_pages() / 4 + run_pages;
                let first = if plenty {
                    buddy.alloc_split(order, levels)
                } else {
                    None
                };
                if first.is_some() {
                    add_reserved(self.header, run_pages << PAGE_SHIFT);
                }
                if let Some(left) = run.stock(first, shift, levels) {
                    self.give_back(left, order);
                }
                if first.is_some() {
                    // INV(UA17): a trim may now find the run's blocks to give back, so a
                    // refill out of memory must not skip it as futile.
                    arena.harvest().note();
                }
                first
            }
        }
    }

    /// log2 of the blocks in a run of `order` in this heap (`tbuddy::run::run_levels`; 0: no
    /// runs of that order), from the view's lengths (data pages, arenas): no header load.
    #[inline(always)]
    fn run_levels(&self, order: u32) -> u32 {
        block_run::run_levels(self.large.len() as u64, self.arenas.len() as u64, order)
    }

    /// Blocks in a run of `order` in this heap (0: no runs of that order).
    pub fn run_blocks(&self, order: u32) -> u32 {
        match self.run_levels(order) {
            0 => 0,
            levels => 1 << levels,
        }
    }

    /// Give the blocks of `order` that a run held and nobody took back to the tree (INV(TB14)).
    #[cold]
    #[inline(never)]
    fn give_back(&self, left: Leftover, order: u32) {
        let bytes = (PAGE_SIZE as u64) << order;
        self.header
            .reserved
            .0
            .fetch_sub_relaxed(bytes * left.count as u64);
        self.buddy().free_run_tail(left.first, order, left.count);
    }

    /// Empty every SM's runs into the tree (a trim). Returns how many runs gave something back.
    #[cold]
    #[inline(never)]
    fn flush_runs(&self) -> u32 {
        let mut flushed = 0;
        for arena in self.arenas {
            for order in RUN_ORDERS {
                if let Some(left) = arena.run(order).flush(order + PAGE_SHIFT) {
                    self.give_back(left, order);
                    flushed += 1;
                }
            }
        }
        flushed
    }

    /// The stash of `order` (in [`STASH_ORDERS`]). Its slots follow the large-block table on
    /// the next line (`Geometry::stash_offset`), so the view finds them from the table's end
    /// and the heap's size, with no load of the header.
    #[inline(always)]
    fn stash(&self, order: u32) -> Stash<'a> {
        debug_assert!(STASH_ORDERS.contains(&order));
        let pages = self.large.len() as u64;
        let max_order = pages.next_power_of_two().trailing_zeros();
        let line = LINE_SIZE as u64;
        let end_of_large = self.large.as_ptr() as u64 + pages * 4;
        let words = end_of_large.div_ceil(line) * line;
        let first = (1u64 << max_order) - (1u64 << (max_order + 1 - order));
        // SAFETY: `Geometry::layout` puts `2^max_order` words of slots there, in the heap's
        // metadata (the header's base is line-aligned); the stash of `order` holds
        // `2^(max_order - order)` of them from word `first` on.
        let slots = unsafe {
            core::slice::from_raw_parts(
                (words as *const Atomic32).add(first as usize),
                1 << (max_order - order),
            )
        };
        Stash::new(
            &self.header.stash[(order - STASH_ORDERS.start) as usize],
            slots,
        )
    }

    /// The offset of the block whose stashed value is `value` (its first page + 1).
    #[inline(always)]
    fn stashed_offset(value: u32) -> u64 {
        ((value - 1) as u64) << PAGE_SHIFT
    }

    /// Give every stashed block back to the tree, merging it with its free buddies (a trim,
    /// INV(HP6)). Returns how many blocks went back. Threads that call it at once share the
    /// blocks (`toga_trim` runs it on many).
    #[cold]
    #[inline(never)]
    pub fn flush_stashes(&self) -> u32 {
        let buddy = self.buddy();
        let mut flushed = 0;
        for order in STASH_ORDERS {
            let stash = self.stash(order);
            while let Some(value) = stash.take_one() {
                buddy.free(Self::stashed_offset(value), order);
                flushed += 1;
            }
        }
        flushed
    }

    /// Count a `malloc` of `size` that returned `p` (a block of `bytes`), and return `p`.
    /// `word`: the live-block counter of the block (`LIVE_CLASS0 + class` or `LIVE_LARGE`).
    #[inline(always)]
    fn settle_malloc(&self, size: usize, p: *mut u8, bytes: usize, word: usize) -> *mut u8 {
        if p.is_null() {
            if size != 0 {
                self.settle(stat::FAILED, 0, false);
            }
        } else {
            self.settle(word, bytes as u64, false);
        }
        p
    }

    /// Count what one `malloc` or `free` did. `word` goes up by one, or down for the `free` of
    /// a live block (`freed`, its `LIVE_*` word); for a block made or freed (`bytes > 0`),
    /// `MALLOCS` or `FREES` and the live bytes move too. The lanes of a warp that did the same
    /// (same word, size and direction) are counted by their leader, for all of them: a warp's
    /// 32 frees of one class add to each counter once instead of 32 times. Atomics of many
    /// lanes on one word serialize in L2, and the live-bytes add returns a value that its
    /// lanes wait for: ncu on 2^20 frees of 16 B found 15% of the stall samples there.
    #[inline(always)]
    fn settle(&self, word: usize, bytes: u64, freed: bool) {
        let group = Group::of(bytes << 8 | (freed as u64) << 7 | word as u64);
        if !group.is_leader() {
            return;
        }
        let n = group.size() as u64;
        if bytes == 0 {
            self.count(word, n);
        } else if freed {
            self.count(word, n.wrapping_neg());
            self.count(stat::FREES, n);
            self.account_live(((n * bytes) as i64).wrapping_neg());
        } else {
            self.count(word, n);
            self.count(stat::MALLOCS, n);
            self.account_live((n * bytes) as i64);
        }
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
        if align > CHUNK_SIZE || self.exceeds_data(size) {
            self.count(stat::FAILED, 1);
            return ptr::null_mut();
        }
        // A TBuddy block is aligned to its size, at least a page.
        let (p, bytes) = self.alloc_large_copy(size.max(align));
        self.settle_malloc(size, p, bytes, stat::LIVE_LARGE)
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
                0 | FREED_LARGE => 0,
                o => PAGE_SIZE << (o - 1),
            }
        } else if !self.is_mapped(p) {
            0
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
    /// As for [`DeviceHeap::free`].
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
        // The data region's pages are the large table's length (no load of the header).
        let end = start + ((self.large.len() as u64) << PAGE_SHIFT);
        (start..end).contains(&(p as u64))
    }

    /// The tree's half of a large free (the caller swapped the block's order out of the large
    /// table): a block of [`STASH_ORDERS`] goes into its order's stash, the lanes that free
    /// blocks of one order with one ticket (INV(HP6)); a larger one goes back into the tree,
    /// where the lanes that give back blocks of one order together merge theirs first
    /// (`TBuddy::free_together`). Returns the bytes given back. Out of line, so that the group
    /// path's registers stay off the small-block free; it takes the header, not the view
    /// (`HeapChunks` says why).
    #[inline(never)]
    fn free_large(header: &HeapHeader, offset: u64, order: u32) -> u64 {
        let heap = DeviceHeap::at(header);
        heap.free_large_here(offset, order)
    }

    #[inline(always)]
    fn free_large_here(&self, offset: u64, order: u32) -> u64 {
        let group = Group::of(LARGE_FREE_TAG | order as u64);
        if STASH_ORDERS.contains(&order) {
            let value = (offset >> PAGE_SHIFT) as u32 + 1;
            if self.stash(order).put(&group, value) {
                // INV(UA17): a trim may now find blocks to give back (the stash had none), so
                // a refill out of memory must not skip it as futile.
                let arena = &self.arenas[platform::sm_id() as usize % self.arenas.len()];
                arena.harvest().note();
            }
        } else {
            self.buddy().free_together(&group, offset, order);
        }
        let bytes = (PAGE_SIZE as u64) << order;
        // One subtraction for the group: every lane's own on this one word, after the lanes
        // of a warp parted in `free_together`, held the free of 2^17 blocks of 8 KiB (ncu:
        // the lanes' return waited on it for 27% of the stall samples; H100).
        if group.is_leader() {
            self.header
                .reserved
                .0
                .fetch_sub_relaxed(bytes * group.size() as u64);
        }
        bytes
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
        // The counter this free moves and the bytes it gives back (0: none), for `settle`.
        let (word, bytes) = if !self.contains(p) {
            (stat::INVALID_FREES, 0)
        } else if (p as usize).is_multiple_of(PAGE_SIZE) {
            let offset = p as u64 - self.data as u64;
            let page = (offset >> PAGE_SHIFT) as usize;
            // INV(HP1): only the one free that swaps the order out passes the block on. Acquire
            // (no MEMBAR on the GPU, where `acq_rel` issues one): the tree's steps below stay
            // after the swap; the block's writes are published by the release that makes it
            // Available (`TBuddy::free`), not by this swap.
            match self.large[page].swap_acquire(FREED_LARGE) {
                // Never the first page of a block that `malloc` handed out: inside one, or a
                // block a run or a stash holds.
                0 => (stat::INVALID_FREES, 0),
                FREED_LARGE => (stat::DOUBLE_FREES, 0),
                o => (
                    stat::LIVE_LARGE,
                    Self::free_large(self.header, offset, o - 1),
                ),
            }
        } else if !self.is_mapped(p) {
            // A growable heap's unmapped granule: no block there, and nothing to read.
            (stat::INVALID_FREES, 0)
        } else {
            // SAFETY: `p` is inside the data region and not page-aligned (caller's contract).
            match unsafe { self.ualloc().free(p) } {
                FreeOutcome::Freed(class) => {
                    (stat::LIVE_CLASS0 + class.index(), class.size() as u64)
                }
                FreeOutcome::DoubleFree => (stat::DOUBLE_FREES, 0),
                FreeOutcome::Invalid => (stat::INVALID_FREES, 0),
            }
        };
        self.settle(word, bytes, true);
    }
}

#[cfg(not(loom))]
mod bound;
#[cfg(not(loom))]
pub use bound::*;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// INV(HP3): the quantum keeps `arenas` steps within 1/32 of the data region, or at the
    /// 64 KiB floor; it grows with the heap.
    #[test]
    fn used_quantum_scales_with_the_heap() {
        let shift = |data: u64, arenas: u64| {
            Geometry::layout(0, 0, data / PAGE_SIZE as u64, arenas).used_quantum_shift()
        };
        assert_eq!(shift(64 << 20, 132), 16, "64 MiB: the floor");
        assert_eq!(shift(1 << 30, 132), 17);
        assert_eq!(shift(8 << 30, 132), 20, "8 GiB: 1 MiB steps");
        assert_eq!(shift(1 << 30, 1), 25);
        for data_log in 22..=(MAX_HEAP_BYTES.ilog2()) {
            for arenas in [1u64, 2, 80, 108, 132, 144] {
                let data = 1u64 << data_log;
                let s = shift(data, arenas);
                assert!(s >= 16);
                assert!(s == 16 || arenas << s <= data / 32, "{data} {arenas} {s}");
                assert!(
                    s == 16 || arenas << (s + 1) > data / 32,
                    "the largest such step"
                );
            }
        }
    }
}
