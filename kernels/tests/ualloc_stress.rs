//! UAlloc on OS threads: a shadow oracle of live blocks (no two overlap), byte patterns
//! checked before every free, cross-thread frees, double and foreign frees, memory flowing
//! between classes, and out-of-memory that never hangs and fully recovers. Every test ends
//! with `assert_valid` and every chunk back in the source.
#![cfg(not(loom))]

mod common;

use common::{Rng, with_deadline};

use std::alloc::{Layout, alloc, dealloc};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, mpsc};

use toga_kernels::size_class::{BinKind, MAX_SMALL_SIZE, NUM_CLASSES, SizeClass};
use toga_kernels::ualloc::layout::{
    LARGE_BINS, LARGE_DATA_OFFSET, SMALL_BINS, SMALL_RESERVED_PAGES,
};
use toga_kernels::ualloc::{Arena, CHUNK_SIZE, ChunkSource, FreeOutcome, PAGE_SIZE, UAlloc};

/// Byte written over chunk memory before UAlloc gets it and after it gives it back, so that
/// nothing relies on zeroed chunks or touches a returned one unnoticed.
const SCRIBBLE: u8 = 0xA5;

/// Test-specific draws.
trait RngExt {
    fn size(&mut self) -> usize;
}

impl RngExt for Rng {
    /// A request size: every class, small ones more often, odd sizes included.
    fn size(&mut self) -> usize {
        let class = match self.below(16) {
            0..=5 => self.below(4),
            6..=12 => 4 + self.below(2),
            _ => 6 + self.below(2),
        };
        let hi = 16usize << class;
        (hi / 2 + 1 + self.below(hi as u64 / 2) as usize).clamp(1, MAX_SMALL_SIZE)
    }
}

/// Chunks carved out of one host buffer, with a free list and a count of chunks handed out.
struct HostChunks {
    base: *mut u8,
    chunks: usize,
    free: Mutex<Vec<usize>>,
    out: AtomicUsize,
}

// SAFETY: the buffer is only handed out through the mutex-guarded free list.
unsafe impl Send for HostChunks {}
// SAFETY: as above.
unsafe impl Sync for HostChunks {}

impl HostChunks {
    fn new(chunks: usize) -> Arc<Self> {
        let layout = Layout::from_size_align(chunks * CHUNK_SIZE, CHUNK_SIZE).unwrap();
        // SAFETY: non-zero size.
        let base = unsafe { alloc(layout) };
        assert!(!base.is_null());
        // SAFETY: the buffer is ours.
        unsafe { base.write_bytes(SCRIBBLE, chunks * CHUNK_SIZE) };
        let free = (0..chunks)
            .rev()
            .map(|i| base as usize + i * CHUNK_SIZE)
            .collect();
        Arc::new(Self {
            base,
            chunks,
            free: Mutex::new(free),
            out: AtomicUsize::new(0),
        })
    }

    fn outstanding(&self) -> usize {
        self.out.load(SeqCst)
    }

    /// Address `offset` bytes into chunk `i` of the buffer.
    fn at(&self, i: usize, offset: usize) -> *mut u8 {
        (self.base as usize + i * CHUNK_SIZE + offset) as *mut u8
    }
}

impl Drop for HostChunks {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.chunks * CHUNK_SIZE, CHUNK_SIZE).unwrap();
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.base, layout) };
    }
}

/// The source UAlloc sees: a shared handle.
#[derive(Clone)]
struct Source(Arc<HostChunks>);

impl ChunkSource for Source {
    fn alloc_chunk(&self) -> Option<*mut u8> {
        let c = self.0.free.lock().unwrap().pop()?;
        self.0.out.fetch_add(1, SeqCst);
        Some(c as *mut u8)
    }

    unsafe fn free_chunk(&self, chunk: *mut u8) {
        let c = chunk as usize;
        assert_eq!(c % CHUNK_SIZE, 0);
        assert!(c >= self.0.base as usize && c < self.0.base as usize + self.0.chunks * CHUNK_SIZE);
        // SAFETY: the chunk is ours again; scribble so a later use of it shows up.
        unsafe { chunk.write_bytes(SCRIBBLE, CHUNK_SIZE) };
        let mut free = self.0.free.lock().unwrap();
        assert!(!free.contains(&c), "chunk {c:#x} returned twice");
        free.push(c);
        self.0.out.fetch_sub(1, SeqCst);
    }
}

/// Arenas plus a source, leaked for `'static` so threads can share a `UAlloc`.
fn heap(arenas: usize, chunks: usize) -> (&'static [Arena], Arc<HostChunks>) {
    let arenas: &'static [Arena] = Box::leak((0..arenas).map(|_| Arena::new()).collect());
    (arenas, HostChunks::new(chunks))
}

fn ualloc(arenas: &'static [Arena], chunks: &Arc<HostChunks>) -> UAlloc<'static, Source> {
    UAlloc::new(arenas, Source(chunks.clone()))
}

/// The pattern word `k` of a block at `addr` in round `tag`.
fn pattern(addr: usize, tag: u64, k: usize) -> u64 {
    ((addr as u64) ^ tag.rotate_left(32) ^ k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn fill(p: *mut u8, len: usize, tag: u64) {
    for k in 0..len / 8 {
        // SAFETY: the block is live and ours, at least `len` bytes, 16-aligned.
        unsafe {
            (p as *mut u64)
                .add(k)
                .write_volatile(pattern(p as usize, tag, k))
        };
    }
}

fn check(p: *mut u8, len: usize, tag: u64) {
    for k in 0..len / 8 {
        // SAFETY: as in `fill`.
        let v = unsafe { (p as *const u64).add(k).read_volatile() };
        assert_eq!(
            v,
            pattern(p as usize, tag, k),
            "block {p:p} corrupted at word {k}"
        );
    }
}

/// Live blocks: address → size. Insertion checks that the block overlaps no other.
#[derive(Default)]
struct Shadow(Mutex<BTreeMap<usize, usize>>);

impl Shadow {
    fn insert(&self, p: *mut u8, len: usize) {
        let a = p as usize;
        let mut m = self.0.lock().unwrap();
        if let Some((&b, &blen)) = m.range(..=a).next_back() {
            assert!(b + blen <= a, "{a:#x}+{len} overlaps live {b:#x}+{blen}");
        }
        if let Some((&b, _)) = m.range(a..).next() {
            assert!(a + len <= b, "{a:#x}+{len} overlaps live {b:#x}");
        }
        m.insert(a, len);
    }

    fn remove(&self, p: *mut u8) -> usize {
        self.0
            .lock()
            .unwrap()
            .remove(&(p as usize))
            .expect("freeing a block the shadow does not know")
    }
}

/// A freshly allocated block: checked against the class promises and the shadow, filled.
fn adopt_block(ua: &UAlloc<'static, Source>, shadow: &Shadow, p: *mut u8, size: usize, tag: u64) {
    assert!(!p.is_null());
    let class = SizeClass::from_size(size);
    assert_ne!(p as usize % PAGE_SIZE, 0, "INV(UA1): page-aligned block");
    assert_eq!(
        p as usize % class.align(),
        0,
        "block not aligned to {}",
        class.align()
    );
    // SAFETY: `p` is live.
    assert_eq!(unsafe { ua.usable_size(p) }, class.size());
    shadow.insert(p, class.size());
    fill(p, class.size(), tag);
}

fn release_block(ua: &UAlloc<'static, Source>, shadow: &Shadow, p: *mut u8, tag: u64) {
    let len = shadow.remove(p);
    check(p, len, tag);
    // SAFETY: `p` is in the heap (it was a live block).
    assert_eq!(
        unsafe { ua.free(p) },
        FreeOutcome::Freed(SizeClass::from_size(len))
    );
}

/// Everything freed: the heap is consistent and holds no chunk.
fn assert_all_returned(ua: &UAlloc<'static, Source>, chunks: &HostChunks) {
    // Empty bins stay with their class until a trim (INV(UA4)).
    ua.trim();
    ua.assert_valid();
    assert_eq!(ua.chunks_held(), 0, "UAlloc still holds chunks");
    assert_eq!(chunks.outstanding(), 0, "chunks not back in the source");
}

#[test]
fn every_class_alone() {
    with_deadline(|| {
        let (arenas, chunks) = heap(1, 4);
        let ua = ualloc(arenas, &chunks);
        let shadow = Shadow::default();
        for class in SizeClass::ALL {
            let size = class.size();
            let mut blocks = Vec::new();
            // More than one bin's worth, so bins fill, leave the list and come back.
            for _ in 0..class.slots() * 2 + 3 {
                let p = ua.malloc(size);
                adopt_block(&ua, &shadow, p, size, 1);
                blocks.push(p);
            }
            ua.assert_valid();
            for p in blocks.iter().step_by(2) {
                release_block(&ua, &shadow, *p, 1);
            }
            ua.assert_valid();
            for p in blocks.iter().skip(1).step_by(2) {
                release_block(&ua, &shadow, *p, 1);
            }
            assert_all_returned(&ua, &chunks);
        }
        assert_eq!(ua.malloc(MAX_SMALL_SIZE + 1), std::ptr::null_mut());
        // Size 0 gets the smallest class.
        let p = ua.malloc(0);
        adopt_block(&ua, &shadow, p, 1, 2);
        release_block(&ua, &shadow, p, 2);
        assert_all_returned(&ua, &chunks);
    });
}

/// Threads allocate mixed sizes, free their own blocks and hand others to other threads
/// through channels; the shadow oracle checks every block for overlap and its pattern before
/// it is freed.
#[test]
fn mixed_sizes_with_cross_thread_frees() {
    with_deadline(|| {
        const THREADS: usize = 4;
        const OPS: usize = 30_000;
        const MAX_LIVE: usize = 400;
        // Two arenas for four threads: threads share arenas, as warps of one SM do.
        let (arenas, chunks) = heap(2, 64);
        let ua = Arc::new(ualloc(arenas, &chunks));
        let shadow = Arc::new(Shadow::default());
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS)
            .map(|_| mpsc::channel::<(usize, u64)>())
            .unzip();
        let handles: Vec<_> = receivers
            .into_iter()
            .enumerate()
            .map(|(t, rx)| {
                let (ua, shadow, senders) = (ua.clone(), shadow.clone(), senders.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng(0x5eed_0000 + t as u64);
                    let mut live: Vec<(usize, u64)> = Vec::new();
                    let (mut allocs, mut remote) = (0u64, 0u64);
                    for op in 0..OPS {
                        while let Ok((p, tag)) = rx.try_recv() {
                            release_block(&ua, &shadow, p as *mut u8, tag);
                            remote += 1;
                        }
                        match rng.below(10) {
                            0..=5 if live.len() < MAX_LIVE => {
                                let size = rng.size();
                                let tag = (t as u64) << 48 | op as u64;
                                let p = ua.malloc(size);
                                adopt_block(&ua, &shadow, p, size, tag);
                                live.push((p as usize, tag));
                                allocs += 1;
                            }
                            0..=7 if !live.is_empty() => {
                                let (p, tag) =
                                    live.swap_remove(rng.below(live.len() as u64) as usize);
                                release_block(&ua, &shadow, p as *mut u8, tag);
                            }
                            _ if !live.is_empty() => {
                                let (p, tag) =
                                    live.swap_remove(rng.below(live.len() as u64) as usize);
                                let to = (t + 1 + rng.below(THREADS as u64 - 1) as usize) % THREADS;
                                senders[to].send((p, tag)).unwrap();
                            }
                            _ => {}
                        }
                    }
                    for (p, tag) in live.drain(..) {
                        release_block(&ua, &shadow, p as *mut u8, tag);
                    }
                    drop(senders);
                    // Blocks other threads still send us, until every sender is gone.
                    while let Ok((p, tag)) = rx.recv() {
                        release_block(&ua, &shadow, p as *mut u8, tag);
                        remote += 1;
                    }
                    (allocs, remote)
                })
            })
            .collect();
        drop(senders);
        let (mut allocs, mut remote) = (0, 0);
        for h in handles {
            let (a, r) = h.join().unwrap();
            allocs += a;
            remote += r;
        }
        assert!(
            allocs > (THREADS * OPS / 3) as u64,
            "too few allocations: {allocs}"
        );
        assert!(
            remote > allocs / 10,
            "too few cross-thread frees: {remote} of {allocs}"
        );
        assert!(shadow.0.lock().unwrap().is_empty());
        assert_all_returned(&ua, &chunks);
    });
}

/// Double frees and pointers that are not UAlloc blocks are reported and change nothing.
#[test]
fn double_and_foreign_frees_are_rejected() {
    with_deadline(|| {
        let (arenas, chunks) = heap(1, 8);
        let ua = ualloc(arenas, &chunks);
        let shadow = Shadow::default();
        let free = |p: *mut u8| {
            // SAFETY: every pointer below lies in the source's buffer.
            unsafe { ua.free(p) }
        };
        // The `keep_` blocks keep the bins carved, so that a second free finds a clear bit
        // (DoubleFree) rather than a bin that went back to its chunk (Invalid).
        let small = ua.malloc(16);
        let keep_small = ua.malloc(16);
        let large = ua.malloc(2048);
        let keep_large = ua.malloc(2048);
        for (p, size) in [
            (small, 16),
            (keep_small, 16),
            (large, 2048),
            (keep_large, 2048),
        ] {
            adopt_block(&ua, &shadow, p, size, 3);
        }
        let small_chunk = small as usize & !(CHUNK_SIZE - 1);
        let large_chunk = large as usize & !(CHUNK_SIZE - 1);
        assert_ne!(
            small_chunk, large_chunk,
            "small and large classes share no chunk"
        );
        let foreign: Vec<(&str, usize)> = vec![
            ("inside a block", large as usize + 8),
            ("large slot interior at 128", large as usize + 128),
            ("small chunk header", small_chunk + 8),
            ("reserved page, block 0", small_chunk + PAGE_SIZE + 64),
            (
                "bin header",
                small_chunk + (SMALL_RESERVED_PAGES + 60) * PAGE_SIZE + 64,
            ),
            (
                "slot of a bin never carved",
                small_chunk + (SMALL_RESERVED_PAGES + 60) * PAGE_SIZE + 128,
            ),
            (
                "tail of a bin never carved",
                small_chunk + 3 * PAGE_SIZE + 30 * 128,
            ),
            ("large chunk padding", large_chunk + LARGE_DATA_OFFSET - 64),
            ("large bin header", large_chunk + LARGE_DATA_OFFSET + 64),
            ("after the last large bin", large_chunk + CHUNK_SIZE - 128),
            (
                "a chunk UAlloc never had",
                chunks.at(7, 4 * PAGE_SIZE + 128) as usize,
            ),
            ("page-aligned", small_chunk + 8 * PAGE_SIZE),
            ("null", 0),
        ];
        for (what, p) in &foreign {
            assert_eq!(free(*p as *mut u8), FreeOutcome::Invalid, "{what}: {p:#x}");
            ua.assert_valid();
        }
        release_block(&ua, &shadow, small, 3);
        assert_eq!(free(small), FreeOutcome::DoubleFree);
        release_block(&ua, &shadow, large, 3);
        assert_eq!(free(large), FreeOutcome::DoubleFree);
        ua.assert_valid();
        check(keep_small, 16, 3);
        check(keep_large, 2048, 3);
        release_block(&ua, &shadow, keep_small, 3);
        release_block(&ua, &shadow, keep_large, 3);
        assert_all_returned(&ua, &chunks);
        // The chunks are back in the source (scribbled): their old blocks are foreign now.
        for p in [small, keep_small, large, keep_large] {
            assert_eq!(free(p), FreeOutcome::Invalid);
        }
        assert_all_returned(&ua, &chunks);
    });
}

/// Two threads free the same blocks at once: each block is freed exactly once.
#[test]
fn racing_double_frees() {
    with_deadline(|| {
        const BLOCKS: usize = 3000;
        let (arenas, chunks) = heap(1, 8);
        let ua = Arc::new(ualloc(arenas, &chunks));
        let mut rng = Rng(77);
        let blocks: Arc<Vec<usize>> = Arc::new(
            (0..BLOCKS)
                .map(|_| ua.malloc(rng.size()) as usize)
                .collect(),
        );
        assert!(blocks.iter().all(|&p| p != 0));
        let freed: Vec<_> = (0..2)
            .map(|_| {
                let (ua, blocks) = (ua.clone(), blocks.clone());
                std::thread::spawn(move || {
                    let mut counts = [0usize; 3];
                    for &p in blocks.iter() {
                        // SAFETY: `p` lies in the heap.
                        counts[match unsafe { ua.free(p as *mut u8) } {
                            FreeOutcome::Freed(_) => 0,
                            FreeOutcome::DoubleFree => 1,
                            FreeOutcome::Invalid => 2,
                        }] += 1;
                    }
                    counts
                })
            })
            .map(|h| h.join().unwrap())
            .collect();
        assert_eq!(
            freed[0][0] + freed[1][0],
            BLOCKS,
            "each block freed exactly once"
        );
        // A second free either finds the slot bit clear or (after the bin or chunk went back)
        // finds no carved bin or no UAlloc chunk.
        assert_eq!(
            freed[0][1] + freed[0][2] + freed[1][1] + freed[1][2],
            BLOCKS
        );
        assert_all_returned(&ua, &chunks);
    });
}

/// Capacity of `chunks` chunks in blocks of `class` (one arena, one thread).
fn capacity(class: SizeClass, chunks: usize) -> usize {
    let bins = match class.kind() {
        BinKind::Small => SMALL_BINS,
        BinKind::Large => LARGE_BINS,
    };
    chunks * bins * class.slots() as usize
}

/// Fill the heap with one class until malloc returns null: exactly the capacity.
fn fill_class(
    ua: &UAlloc<'static, Source>,
    shadow: &Shadow,
    size: usize,
    chunks: usize,
) -> Vec<*mut u8> {
    let class = SizeClass::from_size(size);
    let mut blocks = Vec::new();
    loop {
        let p = ua.malloc(size);
        if p.is_null() {
            break;
        }
        adopt_block(ua, shadow, p, size, size as u64);
        blocks.push(p);
    }
    assert_eq!(
        blocks.len(),
        capacity(class, chunks),
        "{class:?} filled {} blocks",
        blocks.len()
    );
    ua.assert_valid();
    blocks
}

/// Memory flows between classes and kinds: fill the whole heap with one class, free it all,
/// then fill it with another.
#[test]
fn memory_flows_between_classes() {
    with_deadline(|| {
        const CHUNKS: usize = 3;
        let (arenas, chunks) = heap(1, CHUNKS);
        let ua = ualloc(arenas, &chunks);
        let shadow = Shadow::default();
        for size in [16, 2048, 100, 300, 32, 1024, 64, 512] {
            let blocks = fill_class(&ua, &shadow, size, CHUNKS);
            assert_eq!(chunks.outstanding(), CHUNKS);
            for p in blocks {
                release_block(&ua, &shadow, p, size as u64);
            }
            assert_all_returned(&ua, &chunks);
        }
    });
}

/// Out of memory returns null and never hangs, with many threads; afterwards every chunk
/// comes back and the whole heap can be filled again.
#[test]
fn out_of_memory_then_full_recovery() {
    with_deadline(|| {
        const THREADS: usize = 4;
        const CHUNKS: usize = 6;
        const GIVE_UP: usize = 64;
        let (arenas, chunks) = heap(2, CHUNKS);
        let ua = Arc::new(ualloc(arenas, &chunks));
        let shadow = Arc::new(Shadow::default());
        for round in 0..2 {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (ua, shadow) = (ua.clone(), shadow.clone());
                    std::thread::spawn(move || {
                        let mut rng = Rng(round * 100 + t as u64);
                        let (mut live, mut nulls) = (Vec::new(), 0);
                        while nulls < GIVE_UP {
                            let size = rng.size();
                            let p = ua.malloc(size);
                            if p.is_null() {
                                nulls += 1;
                                continue;
                            }
                            adopt_block(&ua, &shadow, p, size, 9);
                            live.push(p as usize);
                        }
                        live
                    })
                })
                .collect();
            let lives: Vec<Vec<usize>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            assert_eq!(chunks.outstanding(), CHUNKS, "the heap was not exhausted");
            ua.assert_valid();
            // Free from other threads than the allocating ones.
            let frees: Vec<_> = lives
                .into_iter()
                .map(|live| {
                    let (ua, shadow) = (ua.clone(), shadow.clone());
                    std::thread::spawn(move || {
                        for p in live {
                            release_block(&ua, &shadow, p as *mut u8, 9);
                        }
                    })
                })
                .collect();
            frees.into_iter().for_each(|h| h.join().unwrap());
            assert_all_returned(&ua, &chunks);
        }
        // Full recovery: one arena's worth of threads can use every chunk again.
        let single = UAlloc::new(&ua.arenas()[..1], Source(chunks.clone()));
        let blocks = fill_class(&single, &shadow, 16, CHUNKS);
        for p in blocks {
            release_block(&single, &shadow, p, 16);
        }
        assert_all_returned(&ua, &chunks);
    });
}

/// `malloc_bulk`: a group's worth of blocks with one semaphore operation, every class and
/// group size, several threads, down to out of memory.
#[test]
fn bulk_claims_like_a_warp() {
    with_deadline(|| {
        const THREADS: usize = 3;
        const ROUNDS: usize = 300;
        let (arenas, chunks) = heap(2, 24);
        let ua = Arc::new(ualloc(arenas, &chunks));
        let shadow = Arc::new(Shadow::default());
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (ua, shadow) = (ua.clone(), shadow.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng(4242 + t as u64);
                    let mut live: Vec<Vec<usize>> = Vec::new();
                    for round in 0..ROUNDS {
                        let size = rng.size();
                        let k = 1 + rng.below(32) as usize;
                        let mut out = vec![std::ptr::null_mut(); k];
                        assert!(
                            ua.malloc_bulk(size, &mut out),
                            "bulk of {k} × {size} failed"
                        );
                        for &p in &out {
                            adopt_block(&ua, &shadow, p, size, round as u64);
                        }
                        live.push(out.iter().map(|&p| p as usize).collect());
                        if live.len() > 8 {
                            let group = live.swap_remove(rng.below(live.len() as u64) as usize);
                            for p in group {
                                let len = shadow.remove(p as *mut u8);
                                // SAFETY: `p` is live.
                                assert_eq!(
                                    unsafe { ua.free(p as *mut u8) },
                                    FreeOutcome::Freed(SizeClass::from_size(len))
                                );
                            }
                        }
                    }
                    for group in live {
                        for p in group {
                            shadow.remove(p as *mut u8);
                            // SAFETY: `p` is live.
                            assert!(matches!(
                                unsafe { ua.free(p as *mut u8) },
                                FreeOutcome::Freed(_)
                            ));
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().for_each(|h| h.join().unwrap());
        assert_all_returned(&ua, &chunks);
        // Out of memory: all or nothing.
        let (arenas, chunks) = heap(1, 1);
        let ua = ualloc(arenas, &chunks);
        let mut out = [std::ptr::null_mut(); 32];
        let mut got = Vec::new();
        while ua.malloc_bulk(2048, &mut out) {
            got.extend_from_slice(&out);
        }
        assert!(out.iter().all(|p| p.is_null()));
        assert_eq!(got.len() / 32, capacity(SizeClass::from_size(2048), 1) / 32);
        for p in got {
            // SAFETY: live blocks.
            assert!(matches!(unsafe { ua.free(p) }, FreeOutcome::Freed(_)));
        }
        assert_all_returned(&ua, &chunks);
    });
}

#[test]
fn class_table_matches_the_layout() {
    // The numbers docs/ualloc.md quotes.
    for class in SizeClass::ALL {
        let chunk_bytes = capacity(class, 1) * class.size();
        let permille = chunk_bytes * 1000 / CHUNK_SIZE;
        match class.kind() {
            BinKind::Small => assert_eq!(permille, 968),
            // 4 KB: 25 blocks per bin, 125 per chunk.
            BinKind::Large if class.size() == 4096 => assert_eq!(permille, 976),
            BinKind::Large => assert_eq!(permille, 996),
        }
    }
    assert_eq!(NUM_CLASSES, 9);
}

/// Bins and chunks churn: threads on one arena fill and empty bins of a few classes over and
/// over, so bins retire (slots taken back from the semaphore, RCU grace periods, chunks back
/// to the source) while other threads claim in the same lists.
#[test]
fn retire_churn() {
    with_deadline(|| {
        const THREADS: usize = 4;
        const ROUNDS: usize = 6000;
        let (arenas, chunks) = heap(1, 8);
        let ua = Arc::new(ualloc(arenas, &chunks));
        let shadow = Arc::new(Shadow::default());
        let peak = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (ua, shadow, chunks, peak) =
                    (ua.clone(), shadow.clone(), chunks.clone(), peak.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng(999 + t as u64);
                    for round in 0..ROUNDS {
                        // 128 B (32 slots) and 2 KB (51 slots): few slots per bin, many retirements.
                        let size = if rng.below(2) == 0 { 128 } else { 2048 };
                        let n = 1 + rng.below(60) as usize;
                        let blocks: Vec<*mut u8> = (0..n).map(|_| ua.malloc(size)).collect();
                        for &p in &blocks {
                            adopt_block(&ua, &shadow, p, size, round as u64);
                        }
                        peak.fetch_max(chunks.outstanding(), SeqCst);
                        for p in blocks {
                            release_block(&ua, &shadow, p, round as u64);
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().for_each(|h| h.join().unwrap());
        assert!(peak.load(SeqCst) >= 2, "both kinds had chunks");
        assert_all_returned(&ua, &chunks);
    });
}
