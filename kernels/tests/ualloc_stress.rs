//! UAlloc on OS threads: a shadow oracle of live blocks (no two overlap), byte patterns
//! checked before every free, cross-thread frees, double and foreign frees, group frees
//! (`free_bulk`, the warp path on one thread), `trim` racing malloc and free, memory flowing
//! between classes (through `trim` and through the out-of-memory path), and out-of-memory
//! that never hangs and fully recovers. Every test ends with `trim`, `assert_valid` and every
//! chunk back in the source.
#![cfg(not(loom))]

mod common;

use common::{Rng, with_deadline};

use std::alloc::{Layout, alloc, dealloc};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex, mpsc};

use toga_kernels::size_class::{BinKind, MAX_SMALL_SIZE, NUM_CLASSES, SizeClass};
use toga_kernels::ualloc::layout::{
    LARGE_BINS, LARGE_DATA_OFFSET, SMALL_BINS, SMALL_RESERVED_PAGES,
};
use toga_kernels::ualloc::{
    Arena, CHUNK_SIZE, ChunkSource, FreeOutcome, PAGE_SIZE, TrimGate, UAlloc, run_items,
};

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
    /// Whether the source says how many chunks it could ever hold (`chunks_at_most`), as a
    /// fixed heap's does: with fewer than four per arena, a small heap (INV(UA16)).
    bounded: AtomicBool,
    /// A test's hold on the next trip to a bounded source (`alloc_chunk_run`, or
    /// `alloc_chunk`): the trip takes it, says so in `in_run`, and waits for the test's word
    /// before it takes its chunks.
    run_hold: Mutex<Option<mpsc::Receiver<()>>>,
    in_run: AtomicBool,
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
            bounded: AtomicBool::new(false),
            run_hold: Mutex::new(None),
            in_run: AtomicBool::new(false),
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

impl Source {
    /// The test's hold, if it set one and this is the first trip since (bounded sources only).
    fn hold(&self) {
        if !self.0.bounded.load(SeqCst) {
            return;
        }
        let hold = self.0.run_hold.lock().unwrap().take();
        if let Some(hold) = hold {
            self.0.in_run.store(true, SeqCst);
            hold.recv().unwrap();
        }
    }
}

impl ChunkSource for Source {
    fn alloc_chunk(&self) -> Option<*mut u8> {
        self.hold();
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

    fn chunks_left(&self) -> usize {
        self.0.free.lock().unwrap().len()
    }

    /// Runs only from a bounded source (the heap's buddy tree hands them out; the tests that
    /// predate them see single chunks).
    fn alloc_chunk_run(&self, log2: u32) -> Option<*mut u8> {
        if !self.0.bounded.load(SeqCst) {
            return None;
        }
        self.hold();
        let n = 1usize << log2;
        let mut free = self.0.free.lock().unwrap();
        let index = |c: usize| (c - self.0.base as usize) / CHUNK_SIZE;
        let mut have = vec![false; self.0.chunks];
        for &c in free.iter() {
            have[index(c)] = true;
        }
        let first =
            (0..=self.0.chunks.checked_sub(n)?).find(|&i| have[i..i + n].iter().all(|&h| h))?;
        free.retain(|&c| !(first..first + n).contains(&index(c)));
        self.0.out.fetch_add(n, SeqCst);
        Some(self.0.at(first, 0))
    }

    fn chunks_at_most(&self) -> usize {
        if self.0.bounded.load(SeqCst) {
            self.0.chunks
        } else {
            usize::MAX
        }
    }
}

/// Arenas plus a source, leaked for `'static` so threads can share a `UAlloc`.
fn heap(arenas: usize, chunks: usize) -> (&'static [Arena], Arc<HostChunks>) {
    let arenas: &'static [Arena] = Box::leak((0..arenas).map(|_| Arena::new()).collect());
    (arenas, HostChunks::new(chunks))
}

/// UAlloc over `arenas` and the source, with a trim gate of its own, as every view of a heap
/// has (one trim at a time, and refills that skip a futile trim, INV(UA17)).
fn ualloc(arenas: &'static [Arena], chunks: &Arc<HostChunks>) -> UAlloc<'static, Source> {
    gated(arenas, chunks).0
}

/// [`ualloc`] and its gate.
fn gated(
    arenas: &'static [Arena],
    chunks: &Arc<HostChunks>,
) -> (UAlloc<'static, Source>, &'static TrimGate) {
    let gate: &'static TrimGate = Box::leak(Box::new(TrimGate::new()));
    let ua = UAlloc::new(arenas, Source(chunks.clone())).with_trim_gate(gate);
    (ua, gate)
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

/// A refill carves `refill_bins` bins at once while the source holds at least four chunks per
/// arena; when it holds fewer, `home_refill_bins` if the arena is the class's home (the one
/// arena here is every class's) and the class shares its home (`UAlloc::shares_home`: the
/// large classes; the small ones not, in this unbounded source), else one bin. The class's
/// semaphore holds exactly their slots but the one taken, and everything goes back. The plentiful heap's refill is a group's of a large class (a lone
/// `malloc` there takes a run's slot, `lone_mallocs_take_a_runs_slots_in_order`, and so does
/// a whole warp's group of a small class, `whole_warp_groups_of_a_small_class_take_the_run_when_the_semaphore_is_empty`);
/// in the scarce one a lone `malloc` refills too, its class's run parked.
#[test]
fn refills_carve_several_bins_only_while_chunks_are_plentiful() {
    with_deadline(|| {
        for (chunks, plenty) in [(8, true), (3, false)] {
            let (arenas, source) = heap(1, chunks);
            let ua = ualloc(arenas, &source);
            let shadow = Shadow::default();
            for class in SizeClass::ALL {
                let small = class.kind() == toga_kernels::size_class::BinKind::Small;
                if plenty && small {
                    continue;
                }
                let mut p = [std::ptr::null_mut()];
                if plenty {
                    assert!(ua.malloc_bulk(class.size(), &mut p));
                } else {
                    p[0] = ua.malloc(class.size());
                }
                let p = p[0];
                adopt_block(&ua, &shadow, p, class.size(), 1);
                let bins = if plenty {
                    class.refill_bins()
                } else if class.kind() == toga_kernels::size_class::BinKind::Large {
                    class.home_refill_bins()
                } else {
                    1
                };
                let (free, _, _) = arenas[0].slot_counters(class);
                assert_eq!(free, bins * class.slots() - 1, "{class:?}, {chunks} chunks");
                ua.assert_valid();
                release_block(&ua, &shadow, p, 1);
                assert_all_returned(&ua, &source);
            }
        }
    });
}

/// Refills of one arena that come together while chunks are plentiful share one trip of
/// several chunks to the source, in a heap below 64 chunks per arena: the trip's promise on
/// the arena's bins semaphore covers all the bins it brings (`take_bins`' batch). A 1 KB
/// refill carves a whole chunk's 5 bins; when the promise covered one chunk it covered none
/// of the others, and each refill that came meanwhile made a trip of its own (on the GPU,
/// 2^16 threads asking 1 KB held 1.4 GiB of chunks for 64 MiB of blocks). Deterministic: the
/// source holds the first trip while the test looks. Thread A's trip of four chunks promises
/// 20 bins less its 5; thread B, a 512 B refill of the same arena and kind, reserves 5 and
/// waits for A instead of going to the source (with the old promise of 0 it went: 8 chunks
/// out). After the trip the semaphore holds no promise: each chunk settled its part, the
/// spare's part was retracted.
#[test]
fn refills_that_come_together_share_a_trip_of_several_chunks() {
    use toga_kernels::size_class::BinKind;
    with_deadline(|| {
        // 32 chunks per arena: below 64, and four per trip while a quarter is out at most.
        let (arenas, source) = heap(4, 128);
        source.bounded.store(true, SeqCst);
        let (release, hold) = mpsc::channel();
        *source.run_hold.lock().unwrap() = Some(hold);
        let ua = ualloc(arenas, &source);
        let shadow = Shadow::default();
        let blocks = |size: usize| {
            toga_kernels::platform::set_sm_id(0);
            let mut out = vec![std::ptr::null_mut(); 32];
            assert!(ua.malloc_bulk(size, &mut out));
            out.into_iter().map(|p| p as usize).collect::<Vec<_>>()
        };
        // What the test saw while A's trip was held; asserted after the hold is let go, so a
        // failure does not leave A waiting.
        let (a, b, during, out_during) = std::thread::scope(|s| {
            let a = s.spawn(|| blocks(1024));
            while !source.in_run.load(SeqCst) {
                std::thread::yield_now();
            }
            let during = arenas[0].bin_counters(BinKind::Large);
            let b = s.spawn(|| blocks(512));
            while arenas[0].bin_counters(BinKind::Large).2 == 0 && source.outstanding() == 0 {
                std::thread::yield_now();
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            let out_during = source.outstanding();
            release.send(()).unwrap();
            (a.join().unwrap(), b.join().unwrap(), during, out_during)
        });
        assert_eq!(
            during,
            (0, 15, 0),
            "A's trip promises 20 bins but its own 5"
        );
        assert_eq!(out_during, 0, "B made a trip of its own");
        assert_eq!(source.outstanding(), 4, "one trip of four chunks");
        let (_, promised, reserved) = arenas[0].bin_counters(BinKind::Large);
        assert_eq!(
            (promised, reserved),
            (0, 0),
            "the trip's promise is settled"
        );
        ua.assert_valid();
        for (size, list) in [(1024, a), (512, b)] {
            for p in list {
                adopt_block(&ua, &shadow, p as *mut u8, size, 5);
                release_block(&ua, &shadow, p as *mut u8, 5);
            }
        }
        assert_all_returned(&ua, &source);
    });
}

/// `refill_batch`: in a fixed heap whose source holds fewer than eight chunks per arena (but
/// not yet fewer than four), a refill of a large class promises all the slots of the bins it
/// carves (a 1 KB refill takes a chunk's five bins: 510 slots). Thread A's refill is held on
/// its way to the source; three more groups of 32 of the same arena come meanwhile and wait
/// for it. With one bin's promise (102 slots less A's 32) the third of them was not covered,
/// refilled too and took a chunk of its own (two chunks for 128 blocks, and in a 512 MiB heap
/// on an H100 six chunks per arena for one chunk's worth of blocks).
#[test]
fn refills_of_a_large_class_share_one_chunk_when_chunks_run_short() {
    with_deadline(|| {
        // 24 chunks for 4 arenas: six per arena, between the scarce bound (4) and pairs (8).
        let (arenas, source) = heap(4, 24);
        source.bounded.store(true, SeqCst);
        let (release, hold) = mpsc::channel();
        *source.run_hold.lock().unwrap() = Some(hold);
        let ua = ualloc(arenas, &source);
        let shadow = Shadow::default();
        let class = SizeClass::from_size(1024);
        let blocks = || {
            toga_kernels::platform::set_sm_id(0);
            let mut out = vec![std::ptr::null_mut(); 32];
            assert!(ua.malloc_bulk(1024, &mut out));
            out.into_iter().map(|p| p as usize).collect::<Vec<_>>()
        };
        let (lists, promise, out_during) = std::thread::scope(|s| {
            let a = s.spawn(blocks);
            while !source.in_run.load(SeqCst) {
                std::thread::yield_now();
            }
            let promise = arenas[0].slot_counters(class).1;
            let others: Vec<_> = (0..3).map(|_| s.spawn(blocks)).collect();
            // Until all three wait on the slots (R), or one went to the source.
            while arenas[0].slot_counters(class).2 < 96 && source.outstanding() == 0 {
                std::thread::yield_now();
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            let out_during = source.outstanding();
            release.send(()).unwrap();
            let mut lists = vec![a.join().unwrap()];
            lists.extend(others.into_iter().map(|t| t.join().unwrap()));
            (lists, promise, out_during)
        });
        assert_eq!(
            promise,
            class.refill_bins() * class.slots() - 32,
            "A's refill promises its five bins' slots but its own"
        );
        assert_eq!(
            out_during, 0,
            "a group that came meanwhile went to the source"
        );
        assert_eq!(source.outstanding(), 1, "one chunk for 128 blocks of 1 KB");
        ua.assert_valid();
        for p in lists.into_iter().flatten() {
            adopt_block(&ua, &shadow, p as *mut u8, 1024, 7);
            release_block(&ua, &shadow, p as *mut u8, 7);
        }
        assert_all_returned(&ua, &source);
    });
}

/// `take_free_bins` loads the arenas' free bins eight at a time, the last batch wrapping round:
/// a refill of a scarce heap finds the one free bin there is, in whichever arena it sits, and
/// carves it instead of adopting a chunk. 13 arenas, so that the last batch wraps.
#[test]
fn scarce_refills_find_a_free_bin_in_any_arena() {
    use toga_kernels::size_class::BinKind;
    with_deadline(|| {
        const SMS: usize = 13;
        for holder in [0u32, 1, 7, 8, 12] {
            let (arenas, source) = heap(SMS, 8 * SMS);
            let ua = ualloc(arenas, &source);
            let shadow = Shadow::default();
            // Arena `holder` adopts a chunk of five 4 KB bins and carves one.
            toga_kernels::platform::set_sm_id(holder);
            let first = ua.malloc(4096);
            assert!(!first.is_null());
            adopt_block(&ua, &shadow, first, 4096, 9);
            let free_bins = |a: usize| arenas[a].bin_counters(BinKind::Large).0;
            let before: u32 = (0..SMS).map(free_bins).sum();
            assert!(before > 0, "the chunk's other bins are free");
            // Leave the source four chunks per arena short: scarce from here on.
            let src = Source(source.clone());
            let mut taken = Vec::new();
            while src.chunks_left() >= 4 * SMS {
                taken.push(src.alloc_chunk().unwrap());
            }
            let out = source.outstanding();
            // Every other arena's refill of 4 KB takes a free bin of `holder`'s chunk.
            let mut live = vec![first];
            for sm in (0..SMS as u32)
                .filter(|&sm| sm != holder)
                .take(before as usize)
            {
                toga_kernels::platform::set_sm_id(sm);
                let p = ua.malloc(4096);
                assert!(!p.is_null());
                adopt_block(&ua, &shadow, p, 4096, 9);
                live.push(p);
            }
            assert_eq!(
                source.outstanding(),
                out,
                "holder {holder}: a refill adopted a chunk"
            );
            assert_eq!((0..SMS).map(free_bins).sum::<u32>(), 0, "holder {holder}");
            for p in live {
                release_block(&ua, &shadow, p, 9);
            }
            for c in taken {
                // SAFETY: taken from this source above, unused.
                unsafe { src.free_chunk(c) };
            }
            assert_all_returned(&ua, &source);
        }
    });
}

/// A full group of `class` on SM `sm` through `malloc_bulk`, each block adopted by the shadow.
fn group_on(
    ua: &UAlloc<'static, Source>,
    shadow: &Shadow,
    class: SizeClass,
    sm: u32,
    tag: u64,
) -> Vec<*mut u8> {
    toga_kernels::platform::set_sm_id(sm);
    let mut out = vec![std::ptr::null_mut(); class.max_group() as usize];
    assert!(ua.malloc_bulk(class.size(), &mut out));
    for &p in &out {
        adopt_block(ua, shadow, p, class.size(), tag);
    }
    out
}

/// The arenas that hold free slots of `class`.
fn slot_holders(arenas: &[Arena], class: SizeClass) -> Vec<usize> {
    (0..arenas.len())
        .filter(|&a| arenas[a].slot_counters(class).0 > 0)
        .collect()
}

/// `UAlloc::shares_home`: in a small heap of at least one chunk per two arenas, a small class's
/// groups refill their own arenas (one bin each, from one shared small chunk), while a large
/// class's still go to its home. Everything goes back.
#[test]
fn small_classes_refill_their_own_arenas_in_a_heap_of_a_chunk_per_two_arenas() {
    with_deadline(|| {
        const SMS: usize = 8;
        let (arenas, source) = heap(SMS, 8);
        source.bounded.store(true, SeqCst);
        let ua = ualloc(arenas, &source);
        let shadow = Shadow::default();
        for (class, own) in [
            (SizeClass::from_size(16), true),
            (SizeClass::from_size(1024), false),
        ] {
            let mut live = Vec::new();
            for sm in [0u32, 5] {
                live.extend(group_on(&ua, &shadow, class, sm, 4));
                assert_eq!(source.outstanding(), 1, "{class:?}: one chunk in all");
            }
            let holders = slot_holders(arenas, class);
            if own {
                assert_eq!(
                    holders,
                    [0, 5],
                    "{class:?}: each SM carved a bin of its own"
                );
            } else {
                assert_eq!(holders.len(), 1, "{class:?}: one arena holds the slots");
                assert!(!holders.contains(&0), "{class:?}: SM 0 carved for itself");
            }
            ua.assert_valid();
            for p in live {
                release_block(&ua, &shadow, p, 4);
            }
            assert_all_returned(&ua, &source);
        }
        toga_kernels::platform::set_sm_id(0);
    });
}

/// INV(UA16) in a small heap (a source that could never hold four chunks per arena): a group
/// whose arena is not its class's home takes its slots at the home. The home's one refill
/// carves `home_refill_bins` bins from the group's own chunks, for the home; a group of
/// another SM then takes its slots there without a refill and without a chunk of its own.
/// Everything goes back. Without the home, each SM would carve a bin of its own (one chunk
/// per SM here), and with one bin per home refill the home would hold a bin's slots.
#[test]
fn small_heap_groups_share_a_home_refill_of_many_bins() {
    with_deadline(|| {
        const SMS: usize = 8;
        // Three chunks for eight arenas: fewer than one per two arenas, so the small classes
        // share their homes too.
        let (arenas, source) = heap(SMS, 3);
        source.bounded.store(true, SeqCst);
        let ua = ualloc(arenas, &source);
        let shadow = Shadow::default();
        for class in [SizeClass::from_size(16), SizeClass::from_size(1024)] {
            let k = class.max_group();
            let made = class.home_refill_bins() * class.slots();
            let mut live = Vec::new();
            for (step, sm) in [0u32, 5].into_iter().enumerate() {
                live.extend(group_on(&ua, &shadow, class, sm, 3));
                let at_home: u32 = (0..SMS).map(|a| arenas[a].slot_counters(class).0).sum();
                assert_eq!(
                    at_home,
                    made - (step as u32 + 1) * k,
                    "{class:?}: the slots of one home refill, less the groups'"
                );
                assert_eq!(source.outstanding(), 1, "{class:?}: one chunk in all");
            }
            let holders = slot_holders(arenas, class);
            assert_eq!(holders.len(), 1, "{class:?}: one arena holds the slots");
            assert_ne!(
                holders[0], 0,
                "{class:?}: SM 0 carved for itself, not the home"
            );
            ua.assert_valid();
            for p in live {
                release_block(&ua, &shadow, p, 3);
            }
            assert_all_returned(&ua, &source);
        }
        toga_kernels::platform::set_sm_id(0);
    });
}

/// While chunks are plentiful, a whole warp's group of a small class whose arena's semaphore
/// holds no unit for it takes its slots from the arena's run with one add (`ualloc::run`):
/// groups in a row get neighbouring items, after the item a lone `malloc` took first. The group
/// whose add crosses the end of the run takes all its items from the next run, which it
/// stocks, and frees the old run's last items, which the semaphore then holds. A group that
/// finds units takes those (a warm heap's slots stay in use), and everything goes back.
#[test]
fn whole_warp_groups_of_a_small_class_take_the_run_when_the_semaphore_is_empty() {
    with_deadline(|| {
        let (arenas, source) = heap(1, 8);
        let ua = ualloc(arenas, &source);
        let shadow = Shadow::default();
        for class in SizeClass::ALL
            .into_iter()
            .filter(|c| c.kind() == BinKind::Small)
        {
            let size = class.size();
            let items = run_items(class) as usize;
            let slots = class.slots() as usize;
            let k = 32;
            // A lone malloc stocks the run and takes item 0; the groups' items start at 1.
            let lone = ua.malloc(size);
            adopt_block(&ua, &shadow, lone, size, 1);
            let mut groups: Vec<Vec<*mut u8>> = Vec::new();
            // The last of them crosses the end of the run.
            for _ in 0..items / k {
                let mut out = vec![std::ptr::null_mut(); k];
                assert!(ua.malloc_bulk(size, &mut out), "{class:?}");
                for &p in &out {
                    adopt_block(&ua, &shadow, p, size, 1);
                }
                groups.push(out);
            }
            let first = lone as usize;
            let in_run = std::iter::once(lone).chain(groups.iter().flatten().copied());
            // Every item of the run, in order: the last group's first k - 1 lanes got the
            // run's last items (INV(UA19): what the word counted as handed out is).
            for (i, p) in in_run.enumerate().take(items) {
                if i % slots < class.main_slots() as usize {
                    let at = first + (i / slots) * PAGE_SIZE + i % slots * size;
                    assert_eq!(p as usize, at, "{class:?} item {i}");
                }
            }
            // The last group crossed the end: its last lane holds the next run's first item,
            // and nothing went to the semaphore.
            let last = groups.last().unwrap();
            let next = last[k - 1] as usize;
            let end = first + (items - 1) / slots * PAGE_SIZE + slots * size;
            assert!(next < first || next >= end, "{class:?}: a new run");
            assert_eq!(arenas[0].slot_counters(class).0, 0, "{class:?}");
            ua.assert_valid();
            // With units there, the next group takes them, not the run's.
            let mut out = vec![std::ptr::null_mut(); k];
            for &p in &groups[0] {
                release_block(&ua, &shadow, p, 1);
            }
            assert_eq!(arenas[0].slot_counters(class).0, k as u32);
            assert!(ua.malloc_bulk(size, &mut out));
            assert_eq!(arenas[0].slot_counters(class).0, 0, "{class:?}");
            groups[0] = out;
            for &p in &groups[0] {
                adopt_block(&ua, &shadow, p, size, 2);
            }
            ua.assert_valid();
            release_block(&ua, &shadow, lone, 1);
            for (g, group) in groups.iter().enumerate() {
                for &p in group {
                    release_block(&ua, &shadow, p, if g == 0 { 2 } else { 1 });
                }
            }
            assert_all_returned(&ua, &source);
        }
    });
}

/// While chunks are plentiful, a lone `malloc` takes the next slot of its arena's run of the
/// class (`ualloc::run`): bins carved full side by side (a small class's `run_bins`, a large
/// class's one), so the class's semaphore holds no unit for them. The malloc that finds the
/// run used up carves the next. A trim gives back the slots nobody took (INV(UA18)): they are
/// listed, with their units, and serve the usual way; and when every block is freed, every
/// chunk goes back.
#[test]
fn lone_mallocs_take_a_runs_slots_in_order() {
    with_deadline(|| {
        let (arenas, source) = heap(1, 8);
        let ua = ualloc(arenas, &source);
        let shadow = Shadow::default();
        for class in SizeClass::ALL {
            let size = class.size();
            let items = run_items(class) as usize;
            let first = ua.malloc(size);
            adopt_block(&ua, &shadow, first, size, 1);
            let mut blocks = vec![first];
            // The run's bins, slot by slot: item i is slot i % slots of the bin i / slots
            // pages after the first (every main slot is `size` past the one before).
            let slots = class.slots() as usize;
            for i in 1..items {
                let p = ua.malloc(size);
                if i % slots < class.main_slots() as usize {
                    let at = first as usize + (i / slots) * PAGE_SIZE + i % slots * size;
                    assert_eq!(p as usize, at, "{class:?} item {i}");
                }
                adopt_block(&ua, &shadow, p, size, 1);
                blocks.push(p);
            }
            let end = first as usize + (items - 1) / slots * PAGE_SIZE + slots * size;
            // Used up: the next malloc carves another bin for the run, elsewhere.
            let next = ua.malloc(size);
            adopt_block(&ua, &shadow, next, size, 1);
            assert!(next < first || next as usize >= end, "{class:?}: a new run");
            let second = ua.malloc(size);
            assert_eq!(second as usize, next as usize + size);
            adopt_block(&ua, &shadow, second, size, 1);
            blocks.extend([next, second]);
            ua.assert_valid();
            // The trim frees the new run's other slots: those of its first bin, which holds our
            // two blocks, are listed with their units; its other bins, empty, go back.
            assert!(ua.trim() > 0);
            ua.assert_valid();
            assert_eq!(
                arenas[0].slot_counters(class).0,
                class.slots() - 2,
                "{class:?}"
            );
            // A lone malloc after the trim stocks a run again.
            let again = ua.malloc(size);
            adopt_block(&ua, &shadow, again, size, 1);
            assert_eq!(
                arenas[0].slot_counters(class).0,
                class.slots() - 2,
                "{class:?}"
            );
            blocks.push(again);
            for p in blocks {
                release_block(&ua, &shadow, p, 1);
            }
            assert_all_returned(&ua, &source);
        }
    });
}

/// Threads on one arena take lone slots of three classes, so they share those classes' runs,
/// while a trimmer flushes the runs over and over and the blocks are freed by other threads.
/// The shadow oracle sees no overlap and every pattern intact (INV(UA18): a slot is handed out
/// by its run once, or given back once). Most mallocs come from runs: counted by the slots
/// that follow the thread's last one of their class.
#[test]
fn lone_lanes_share_runs_while_trims_flush_them() {
    with_deadline(|| {
        const THREADS: usize = 3;
        const ROUNDS: usize = 6000;
        let (arenas, source) = heap(1, 64);
        let ua = Arc::new(ualloc(arenas, &source));
        let shadow = Arc::new(Shadow::default());
        let stop = Arc::new(AtomicBool::new(false));
        let trimmer = {
            let (ua, stop) = (ua.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut work = 0u64;
                while !stop.load(SeqCst) {
                    work += ua.trim() as u64;
                    std::thread::yield_now();
                }
                work
            })
        };
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS)
            .map(|_| mpsc::channel::<Vec<(usize, u64)>>())
            .unzip();
        let handles: Vec<_> = receivers
            .into_iter()
            .enumerate()
            .map(|(t, rx)| {
                let (ua, shadow, out) = (ua.clone(), shadow.clone(), senders.clone());
                std::thread::spawn(move || {
                    toga_kernels::platform::set_sm_id(0);
                    let mut rng = Rng(0x5107_0000 + t as u64);
                    let mut last = [0usize; 3];
                    let (mut mallocs, mut next_slot, mut trims) = (0u64, 0u64, 0u64);
                    let free_some = |blocks: Vec<(usize, u64)>| {
                        for (p, tag) in blocks {
                            let p = p as *mut u8;
                            let len = shadow.remove(p);
                            check(p, len, tag);
                            // SAFETY: a live block of this heap.
                            let freed = unsafe { ua.free(p) };
                            assert_eq!(freed, FreeOutcome::Freed(SizeClass::from_size(len)));
                        }
                    };
                    let mut mine = Vec::new();
                    for round in 0..ROUNDS {
                        let which = rng.below(3) as usize;
                        let size = [16, 256, 4096][which];
                        let tag = (t as u64) << 48 | round as u64;
                        let p = ua.malloc(size);
                        adopt_block(&ua, &shadow, p, size, tag);
                        mallocs += 1;
                        next_slot += (p as usize == last[which] + size) as u64;
                        last[which] = p as usize;
                        mine.push((p as usize, tag));
                        if mine.len() >= 32 {
                            let to = (t + 1 + rng.below(THREADS as u64 - 1) as usize) % THREADS;
                            let batch: Vec<_> = mine.drain(..16).collect();
                            out[to].send(batch).unwrap();
                        }
                        while let Ok(blocks) = rx.try_recv() {
                            free_some(blocks);
                        }
                        if round % 200 == 100 {
                            trims += ua.trim() as u64;
                        }
                    }
                    free_some(mine);
                    (rx, mallocs, next_slot, trims)
                })
            })
            .collect();
        let mut rest = Vec::new();
        let (mut mallocs, mut next_slot, mut work) = (0, 0, 0);
        for h in handles {
            let (rx, m, n, w) = h.join().unwrap();
            rest.push(rx);
            work += w;
            mallocs += m;
            next_slot += n;
        }
        for rx in rest {
            while let Ok(blocks) = rx.try_recv() {
                for (p, tag) in blocks {
                    let p = p as *mut u8;
                    let len = shadow.remove(p);
                    check(p, len, tag);
                    // SAFETY: a live block of this heap.
                    assert_ne!(unsafe { ua.free(p) }, FreeOutcome::DoubleFree);
                }
            }
        }
        stop.store(true, SeqCst);
        work += trimmer.join().unwrap();
        assert!(shadow.0.lock().unwrap().is_empty());
        assert!(work > 10, "the trims found nothing: {work}");
        assert!(
            next_slot * 4 > mallocs,
            "{next_slot} of {mallocs} mallocs took the slot after the thread's last one"
        );
        assert_all_returned(&ua, &source);
    });
}

/// A chunk adopted with none of its bins taken (`adopt_extra`: the second chunk of a pair
/// whose arena got a spare meanwhile) serves mallocs like any other, and goes back to the
/// source at the next trim whether or not a bin of it was ever carved: no bin's return would
/// give back a chunk that never had one.
#[test]
fn extra_chunks_serve_and_go_back_at_a_trim() {
    with_deadline(|| {
        for kind in BinKind::ALL {
            for used in [false, true] {
                let (arenas, source) = heap(1, 4);
                let ua = ualloc(arenas, &source);
                let chunk = Source(source.clone()).alloc_chunk().unwrap();
                // SAFETY: a chunk of this UAlloc's source, used by nobody else.
                unsafe { ua.adopt_extra(0, kind, chunk) };
                ua.assert_valid();
                assert_eq!(ua.chunks_held(), 1);
                let class = SizeClass::ALL
                    .into_iter()
                    .find(|c| c.kind() == kind)
                    .unwrap();
                if used {
                    // The refill takes bins of the extra chunk: no other chunk is adopted.
                    let shadow = Shadow::default();
                    let p = ua.malloc(class.size());
                    adopt_block(&ua, &shadow, p, class.size(), 1);
                    assert_eq!(
                        source.outstanding(),
                        1,
                        "{kind:?}: a chunk beside the extra one"
                    );
                    release_block(&ua, &shadow, p, 1);
                }
                assert_all_returned(&ua, &source);
            }
        }
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

/// INV(UA17): once a refill found the heap out of memory after a trim, later refills skip
/// their trims until a bin is left empty, and then trim and find it. One arena and one thread,
/// so every step is exact: a full heap of 16 B blocks; nulls for 16 B and 32 B with no trim; a
/// free that leaves its bin with blocks changes nothing for 32 B; freeing the rest of that bin
/// lets the next 32 B refill trim, retire the bin and carve it for 32 B.
#[test]
fn refills_skip_futile_trims_until_a_bin_is_left_empty() {
    with_deadline(|| {
        const CHUNKS: usize = 2;
        let (arenas, chunks) = heap(1, CHUNKS);
        let (ua, gate) = gated(arenas, &chunks);
        let shadow = Shadow::default();
        // A lone thread fills the first bin of each refill (its list's head) before the next:
        // the first `slots` blocks are the first bin's.
        let blocks = fill_class(&ua, &shadow, 16, CHUNKS);
        let trims = gate.trims();
        assert!(trims > 0, "the fill's last refill trims before its null");
        assert!(ua.malloc(16).is_null());
        assert!(ua.malloc(32).is_null());
        assert_eq!(
            gate.trims(),
            trims,
            "a refill trimmed with nothing to give back"
        );
        let (first_bin, rest) = blocks.split_at(SizeClass::from_size(16).slots() as usize);
        release_block(&ua, &shadow, first_bin[0], 16);
        assert!(
            ua.malloc(32).is_null(),
            "a bin with blocks left was given away"
        );
        assert_eq!(
            gate.trims(),
            trims,
            "a free that left its bin with blocks made a trim run"
        );
        for &p in &first_bin[1..] {
            release_block(&ua, &shadow, p, 16);
        }
        let p = ua.malloc(32);
        assert!(!p.is_null(), "the emptied bin was not found");
        assert!(
            gate.trims() > trims,
            "the emptied bin came back without a trim"
        );
        adopt_block(&ua, &shadow, p, 32, 32);
        release_block(&ua, &shadow, p, 32);
        for &p in rest {
            release_block(&ua, &shadow, p, 16);
        }
        assert_all_returned(&ua, &chunks);
    });
}

/// Lazy listing (INV(UA7)): frees into full bins, which a filled heap unlinked, take no list
/// mutex; they set the list's `relist` word. With every chunk held, a second fill must find
/// each freed slot again through a drain (no chunk is left to carve), and after all is freed a
/// trim drains before it retires, so every chunk goes back.
#[test]
fn slots_freed_in_full_bins_are_found_again() {
    with_deadline(|| {
        const CHUNKS: usize = 2;
        const THREADS: usize = 4;
        let (arenas, chunks) = heap(1, CHUNKS);
        let ua = Arc::new(ualloc(arenas, &chunks));
        let shadow = Arc::new(Shadow::default());
        for size in [16, 128, 256, 4096] {
            let blocks = fill_class(&ua, &shadow, size, CHUNKS);
            let (keep, give): (Vec<_>, Vec<_>) =
                blocks.iter().enumerate().partition(|(i, _)| i % 3 == 0);
            let give: Vec<usize> = give.into_iter().map(|(_, p)| *p as usize).collect();
            // Other threads free two blocks of every three, from full bins.
            std::thread::scope(|s| {
                for part in give.chunks(give.len().div_ceil(THREADS)) {
                    let (ua, shadow) = (&ua, &shadow);
                    s.spawn(move || {
                        for &p in part {
                            release_block(ua, shadow, p as *mut u8, size as u64);
                        }
                    });
                }
            });
            ua.assert_valid();
            assert_eq!(chunks.outstanding(), CHUNKS);
            // Every freed slot is served again, and no more.
            let mut again = Vec::new();
            loop {
                let p = ua.malloc(size);
                if p.is_null() {
                    break;
                }
                adopt_block(&ua, &shadow, p, size, size as u64 + 1);
                again.push(p);
            }
            assert_eq!(
                again.len(),
                give.len(),
                "{size} B: freed slots not found again"
            );
            ua.assert_valid();
            for (_, p) in keep {
                release_block(&ua, &shadow, *p, size as u64);
            }
            for p in again {
                release_block(&ua, &shadow, p, size as u64 + 1);
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
/// over, and each trims now and then, so bins retire (slots taken back from the semaphore,
/// RCU grace periods, chunks back to the source) while other threads claim in the same lists.
/// (`free` leaves empty bins listed; only `trim` retires them.)
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
                        if round % 64 == t {
                            ua.trim();
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

// ---------------------------------------------------------------------------------------------
// Group frees (`free_bulk`) and `trim`.

/// The arena this thread's mallocs use: UAlloc picks `sm_id % arenas`.
fn my_arena(arenas: usize) -> usize {
    toga_kernels::platform::sm_id() as usize % arenas
}

/// A live block: address, class, pattern tag, and the arena whose bins it came from.
#[derive(Clone, Copy, Debug)]
struct Block {
    p: usize,
    class: SizeClass,
    tag: u64,
    arena: usize,
}

/// A pointer in a `free_bulk` batch, and so the outcome it must get.
#[derive(Clone, Copy, Debug)]
enum Entry {
    /// A live block: its first occurrence in the batch is freed, any other is a double free.
    Live(Block),
    /// A block already freed whose slot nobody can have claimed since: a double free.
    Stale(usize),
    /// Not a UAlloc block: invalid.
    Foreign(usize),
}

/// Per arena: the blocks known to be free whose slots no malloc can take while the lock is
/// held. Every malloc of the test holds its arena's lock (claims in an arena come only from
/// mallocs of that arena), so a block in the set is free until the holder lets go; without
/// this a "double free" could free a block another thread was just handed.
type FreeSets = Arc<Vec<Mutex<StaleSet>>>;

/// One arena's free blocks, and how often each block was handed out (under the arena's lock).
/// A freed block joins `free` only if nobody claimed it since its owner read its count: its
/// shadow entry goes before the free itself, so "not in the shadow" alone could admit a block
/// that another thread is about to free but still owns.
#[derive(Default)]
struct StaleSet {
    free: BTreeSet<usize>,
    claims: HashMap<usize, u64>,
}

/// Bounds the free sets (any subset of the free blocks will do).
const STALE_KEEP: usize = 256;

/// What one thread of `bulk_frees_mix_every_kind_of_pointer` counted.
#[derive(Default)]
struct BulkCounts {
    allocs: [u64; NUM_CLASSES],
    freed: [u64; NUM_CLASSES],
    double_expected: u64,
    double: u64,
    invalid_expected: u64,
    invalid: u64,
    remote: u64,
    batches: u64,
}

/// One thread of `bulk_frees_mix_every_kind_of_pointer`.
struct BulkWorker {
    ua: Arc<UAlloc<'static, Source>>,
    shadow: Arc<Shadow>,
    free_sets: FreeSets,
    /// A chunk UAlloc never had (scribbled): pointers into it are foreign.
    foreign: Arc<HostChunks>,
    arena: usize,
    rng: Rng,
    live: Vec<Block>,
    remote: Vec<Block>,
    counts: BulkCounts,
}

impl BulkWorker {
    /// Allocate a group with `malloc_bulk` (blocks of one word, mostly) or a few `malloc`s,
    /// holding this arena's lock so no listed free block is claimed behind a double free.
    fn allocate(&mut self, tag: u64) {
        let size = self.rng.size();
        let class = SizeClass::from_size(size);
        let mut out =
            vec![std::ptr::null_mut(); 1 + self.rng.below(class.max_group() as u64) as usize];
        let mut set = self.free_sets[self.arena].lock().unwrap();
        if self.rng.below(3) == 0 {
            for p in out.iter_mut() {
                *p = self.ua.malloc(size);
            }
        } else {
            assert!(
                self.ua.malloc_bulk(size, &mut out),
                "bulk of {} × {size}",
                out.len()
            );
        }
        for &p in &out {
            set.free.remove(&(p as usize));
            *set.claims.entry(p as usize).or_default() += 1;
            adopt_block(&self.ua, &self.shadow, p, size, tag);
            self.live.push(Block {
                p: p as usize,
                class,
                tag,
                arena: self.arena,
            });
        }
        drop(set);
        self.counts.allocs[class.index()] += out.len() as u64;
    }

    /// A pointer that is no UAlloc block (a block's interior, a bin header or padding, a chunk
    /// UAlloc never had, a page-aligned pointer, null).
    fn foreign_pointer(&mut self, near: Block) -> usize {
        let page = near.p & !(PAGE_SIZE - 1);
        match self.rng.below(5) {
            // Off the slot boundary (every class is a multiple of 16).
            0 => near.p + 8,
            // 64 into a page: a bin header or a tail page's first block (small), or 64 mod
            // 256 where slots are 128 mod 256 (large).
            1 => page + 64,
            // Page-aligned: TBuddy's, never UAlloc's (INV(UA1)).
            2 => page,
            3 => self.foreign.at(0, 4 * PAGE_SIZE + 128) as usize,
            _ => 0,
        }
    }

    /// Free one batch of up to 64 pointers with `free_bulk`: a run of live blocks in
    /// allocation order (a `malloc_bulk` group shares a bitmap word), a few live blocks picked
    /// anywhere, blocks other threads sent, repeats, stale blocks and foreign pointers, in a
    /// random order. Checks every outcome.
    fn free_batch(&mut self) {
        let mut batch: Vec<Entry> = Vec::new();
        let run = (1 + self.rng.below(24) as usize).min(self.live.len());
        let start = self.rng.below((self.live.len() - run + 1) as u64) as usize;
        batch.extend(self.live.drain(start..start + run).map(Entry::Live));
        for _ in 0..self.rng.below(6) {
            if self.live.is_empty() {
                break;
            }
            let i = self.rng.below(self.live.len() as u64) as usize;
            batch.push(Entry::Live(self.live.swap_remove(i)));
        }
        let take = self.remote.len().min(40usize.saturating_sub(batch.len()));
        batch.extend(self.remote.drain(..take).map(Entry::Live));
        // Check and forget the live blocks now, before anything else can free them.
        for e in &batch {
            if let Entry::Live(b) = e {
                let len = self.shadow.remove(b.p as *mut u8);
                check(b.p as *mut u8, len, b.tag);
            }
        }
        let live: Vec<Block> = batch
            .iter()
            .map(|e| match *e {
                Entry::Live(b) => b,
                _ => unreachable!("only live blocks so far"),
            })
            .collect();
        if live.is_empty() {
            return;
        }
        // The blocks are ours until the free below: nobody can claim them meanwhile.
        let claims_at_free: Vec<u64> = live
            .iter()
            .map(|b| {
                let set = self.free_sets[b.arena].lock().unwrap();
                set.claims.get(&b.p).copied().unwrap_or(0)
            })
            .collect();
        let live_in_batch = live.len();
        for _ in 0..self.rng.below(4) {
            let e = batch[self.rng.below(live_in_batch as u64) as usize];
            batch.push(e);
        }
        for _ in 0..self.rng.below(4) {
            let near = live[self.rng.below(live_in_batch as u64) as usize];
            let p = self.foreign_pointer(near);
            batch.push(Entry::Foreign(p));
        }
        // Stale blocks of one arena, whose lock is held until the batch is done.
        let stale_arena = self.rng.below(self.free_sets.len() as u64) as usize;
        let free_sets = self.free_sets.clone();
        let set = free_sets[stale_arena].lock().unwrap();
        if !set.free.is_empty() {
            for _ in 0..self.rng.below(4) {
                let p = *set
                    .free
                    .iter()
                    .nth(self.rng.below(set.free.len() as u64) as usize)
                    .unwrap();
                batch.push(Entry::Stale(p));
                if self.rng.below(4) == 0 {
                    batch.push(Entry::Stale(p));
                }
            }
        }
        assert!(batch.len() <= 64);
        for i in (1..batch.len()).rev() {
            batch.swap(i, self.rng.below(i as u64 + 1) as usize);
        }
        let ptrs: Vec<*mut u8> = batch
            .iter()
            .map(|e| match *e {
                Entry::Live(b) => b.p,
                Entry::Stale(p) | Entry::Foreign(p) => p,
            } as *mut u8)
            .collect();
        let mut out = vec![FreeOutcome::Invalid; ptrs.len()];
        // SAFETY: every pointer lies in the source's buffer, the foreign chunk, or is null.
        unsafe { self.ua.free_bulk(&ptrs, &mut out) };
        drop(set);
        let mut freed_at: HashMap<usize, usize> = HashMap::new();
        for (i, (e, &o)) in batch.iter().zip(&out).enumerate() {
            match *e {
                Entry::Live(b) => match o {
                    FreeOutcome::Freed(class) => {
                        if let Some(j) = freed_at.insert(b.p, i) {
                            panic!("{:#x} freed at {j} and {i} of one batch", b.p);
                        }
                        assert_eq!(class, b.class, "{:#x} freed as another class", b.p);
                        self.counts.freed[class.index()] += 1;
                    }
                    FreeOutcome::DoubleFree => self.counts.double += 1,
                    FreeOutcome::Invalid => panic!("live {:#x} reported invalid", b.p),
                },
                Entry::Stale(p) => {
                    assert_eq!(o, FreeOutcome::DoubleFree, "stale {p:#x}");
                    self.counts.double += 1;
                    self.counts.double_expected += 1;
                }
                Entry::Foreign(p) => {
                    assert_eq!(o, FreeOutcome::Invalid, "foreign {p:#x}");
                    self.counts.invalid += 1;
                    self.counts.invalid_expected += 1;
                }
            }
        }
        // Every live block exactly once Freed (a second one panicked above); its other
        // occurrences are double frees.
        let occurrences = batch.iter().filter(|e| matches!(e, Entry::Live(_))).count();
        self.counts.double_expected += (occurrences - live.len()) as u64;
        assert_eq!(
            freed_at.len(),
            live.len(),
            "a live block of the batch was not freed"
        );
        self.counts.batches += 1;
        // The blocks just freed are free until a malloc of their arena takes one; a block
        // claimed since we read its count was taken already.
        for (b, claims) in live.iter().zip(claims_at_free) {
            let mut set = self.free_sets[b.arena].lock().unwrap();
            if set.free.len() < STALE_KEEP && set.claims.get(&b.p).copied().unwrap_or(0) == claims {
                set.free.insert(b.p);
            }
        }
    }
}

/// `free_bulk` (the warp's group free on one thread) with batches of up to 64 pointers that
/// mix live blocks of several classes, runs of one bitmap word, the same block twice, blocks
/// freed before, foreign pointers and blocks other threads allocated: every outcome is exact,
/// frees balance mallocs class by class, and after a trim every chunk is back.
#[test]
fn bulk_frees_mix_every_kind_of_pointer() {
    with_deadline(|| {
        const THREADS: usize = 4;
        const ARENAS: usize = 3;
        const ROUNDS: usize = 5000;
        const MAX_LIVE: usize = 300;
        // Enough chunks that the source never runs dry: no malloc trims, so a freed block's
        // bin stays carved and its second free is a double free, not an invalid pointer.
        const CHUNKS: usize = 96;
        let (arenas, chunks) = heap(ARENAS, CHUNKS);
        let ua = Arc::new(ualloc(arenas, &chunks));
        let shadow = Arc::new(Shadow::default());
        let free_sets: FreeSets = Arc::new((0..ARENAS).map(|_| Mutex::default()).collect());
        let foreign = HostChunks::new(1);
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..THREADS).map(|_| mpsc::channel::<Vec<Block>>()).unzip();
        let handles: Vec<_> = receivers
            .into_iter()
            .enumerate()
            .map(|(t, rx)| {
                let (ua, shadow, free_sets, foreign, senders) = (
                    ua.clone(),
                    shadow.clone(),
                    free_sets.clone(),
                    foreign.clone(),
                    senders.clone(),
                );
                std::thread::spawn(move || {
                    let mut w = BulkWorker {
                        ua,
                        shadow,
                        free_sets,
                        foreign,
                        arena: my_arena(ARENAS),
                        rng: Rng(0xb01c_0000 + t as u64),
                        live: Vec::new(),
                        remote: Vec::new(),
                        counts: BulkCounts::default(),
                    };
                    for round in 0..ROUNDS {
                        while let Ok(blocks) = rx.try_recv() {
                            w.counts.remote += blocks.len() as u64;
                            w.remote.extend(blocks);
                        }
                        if w.live.len() < MAX_LIVE && w.rng.below(3) != 0 {
                            w.allocate((t as u64) << 48 | round as u64);
                        }
                        if w.rng.below(4) == 0 && w.live.len() > 8 {
                            // A run in allocation order: blocks of one word, freed elsewhere.
                            let n = 1 + w.rng.below(8) as usize;
                            let group: Vec<Block> = w.live.drain(..n).collect();
                            let to = (t + 1 + w.rng.below(THREADS as u64 - 1) as usize) % THREADS;
                            senders[to].send(group).unwrap();
                        }
                        if !w.live.is_empty() || !w.remote.is_empty() {
                            w.free_batch();
                        }
                    }
                    while !w.live.is_empty() {
                        w.free_batch();
                    }
                    drop(senders);
                    // Blocks other threads still send, until every sender is gone.
                    while let Ok(blocks) = rx.recv() {
                        w.counts.remote += blocks.len() as u64;
                        w.remote.extend(blocks);
                        while !w.remote.is_empty() {
                            w.free_batch();
                        }
                    }
                    while !w.remote.is_empty() {
                        w.free_batch();
                    }
                    w.counts
                })
            })
            .collect();
        drop(senders);
        let mut total = BulkCounts::default();
        for h in handles {
            let c = h.join().unwrap();
            for i in 0..NUM_CLASSES {
                total.allocs[i] += c.allocs[i];
                total.freed[i] += c.freed[i];
            }
            total.double += c.double;
            total.double_expected += c.double_expected;
            total.invalid += c.invalid;
            total.invalid_expected += c.invalid_expected;
            total.remote += c.remote;
            total.batches += c.batches;
        }
        assert_eq!(total.freed, total.allocs, "frees balance mallocs per class");
        assert_eq!(total.double, total.double_expected);
        assert_eq!(total.invalid, total.invalid_expected);
        let allocs: u64 = total.allocs.iter().sum();
        assert!(allocs > 20_000, "too few allocations: {allocs}");
        assert!(
            total.remote > allocs / 20,
            "too few cross-thread frees: {}",
            total.remote
        );
        assert!(
            total.double > 1000 && total.invalid > 1000,
            "too little misuse"
        );
        assert!(total.batches > (THREADS * ROUNDS / 2) as u64);
        assert!(shadow.0.lock().unwrap().is_empty());
        assert!(
            chunks.outstanding() < CHUNKS,
            "the source ran dry: a malloc may have trimmed"
        );
        assert_all_returned(&ua, &chunks);
        // The chunks are back in the source (scribbled): freed blocks are foreign now.
        let stale: Vec<*mut u8> = free_sets
            .iter()
            .flat_map(|s| s.lock().unwrap().free.iter().copied().collect::<Vec<_>>())
            .take(64)
            .map(|p| p as *mut u8)
            .collect();
        let mut out = vec![FreeOutcome::DoubleFree; stale.len()];
        // SAFETY: every pointer lies in the source's buffer.
        unsafe { ua.free_bulk(&stale, &mut out) };
        assert!(out.iter().all(|&o| o == FreeOutcome::Invalid), "{out:?}");
        assert_all_returned(&ua, &chunks);
    });
}

/// Free `blocks` (live, checked and forgotten by the caller) with `free_bulk` in batches of up
/// to 64, or one by one; every outcome must be `Freed` of the block's class.
fn free_all(ua: &UAlloc<'static, Source>, blocks: &[(*mut u8, SizeClass)], bulk: bool) {
    for batch in blocks.chunks(64) {
        let ptrs: Vec<*mut u8> = batch.iter().map(|&(p, _)| p).collect();
        let mut out = vec![FreeOutcome::Invalid; ptrs.len()];
        if bulk {
            // SAFETY: live blocks.
            unsafe { ua.free_bulk(&ptrs, &mut out) };
        } else {
            for (o, &p) in out.iter_mut().zip(&ptrs) {
                // SAFETY: a live block.
                *o = unsafe { ua.free(p) };
            }
        }
        for (&(p, class), o) in batch.iter().zip(out) {
            assert_eq!(o, FreeOutcome::Freed(class), "{p:p}");
        }
    }
}

/// `trim` in a loop on one thread (and now and then on the others) while threads fill and
/// empty bins of a few classes (`malloc` and `malloc_bulk`; `free`, or `free_bulk` when
/// `bulk_free`): bins retire under claimers, chunks go back to the source and come back as the
/// other kind. Blocks kept across rounds are checked again and again, so a bin or chunk given
/// back with a live block in it (the source scribbles returned chunks) shows up; the shadow
/// catches a slot handed out twice. With `tight`, the heap has fewer chunks than the two
/// arenas' two kinds want: mallocs run out of memory (and trim) all the time, and may fail.
fn trim_race(bulk_free: bool, tight: bool) {
    with_deadline(move || {
        const THREADS: usize = 3;
        const ROUNDS: usize = 8000;
        const KEEP: usize = 48;
        // Tight: two chunks, one per kind at best, for blocks that need more (memory flows
        // between the arenas, so three chunks no longer ran out).
        let (arenas, chunks) = heap(2, if tight { 2 } else { 32 });
        let ua = Arc::new(ualloc(arenas, &chunks));
        let shadow = Arc::new(Shadow::default());
        let stop = Arc::new(AtomicBool::new(false));
        let trimmer = {
            let (ua, stop) = (ua.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut calls, mut work) = (0u64, 0u64);
                while !stop.load(SeqCst) {
                    work += ua.trim() as u64;
                    calls += 1;
                }
                (calls, work)
            })
        };
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (ua, shadow, chunks) = (ua.clone(), shadow.clone(), chunks.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng(0x7819_0000 + t as u64);
                    // Blocks that live across rounds: (pointer, class, tag).
                    let mut kept: Vec<(*mut u8, SizeClass, u64)> = Vec::new();
                    let (mut peak, mut nulls) = (0, 0u64);
                    for round in 0..ROUNDS {
                        let tag = (t as u64) << 48 | round as u64;
                        // Few slots per bin (128 B: 32, 2 KB: 51, 4 KB: 25) empty bins often.
                        let size = match rng.below(5) {
                            0 => 128,
                            1 => 2048,
                            2 => 4096,
                            3 => 16,
                            _ => rng.size(),
                        };
                        let class = SizeClass::from_size(size);
                        let n = 1 + rng.below(class.max_group() as u64) as usize;
                        let mut blocks = vec![std::ptr::null_mut(); n];
                        if rng.below(2) == 0 {
                            let ok = ua.malloc_bulk(size, &mut blocks);
                            assert!(ok || tight, "bulk of {n} × {size}");
                        } else {
                            for p in blocks.iter_mut() {
                                *p = ua.malloc(size);
                            }
                        }
                        let before = blocks.len();
                        blocks.retain(|p| !p.is_null());
                        assert!(tight || blocks.len() == before, "out of memory");
                        nulls += (before - blocks.len()) as u64;
                        if blocks.is_empty() {
                            continue;
                        }
                        for &p in &blocks {
                            adopt_block(&ua, &shadow, p, size, tag);
                        }
                        peak = peak.max(chunks.outstanding());
                        // Keep one now and then; free the rest, as a group or one by one.
                        if kept.len() < KEEP && rng.below(2) == 0 {
                            kept.push((blocks.pop().unwrap(), class, tag));
                        }
                        let mut done = Vec::new();
                        for p in blocks {
                            let len = shadow.remove(p);
                            check(p, len, tag);
                            done.push((p, class));
                        }
                        if kept.len() >= KEEP || rng.below(8) == 0 {
                            for (p, class, tag) in kept.drain(..) {
                                let len = shadow.remove(p);
                                check(p, len, tag);
                                done.push((p, class));
                            }
                        }
                        free_all(&ua, &done, bulk_free && rng.below(2) == 0);
                        if round % 64 == 0 {
                            for &(p, class, tag) in &kept {
                                check(p, class.size(), tag);
                            }
                        }
                        if round % 500 == 250 {
                            ua.trim();
                        }
                    }
                    let rest: Vec<_> = kept
                        .drain(..)
                        .map(|(p, class, tag)| {
                            let len = shadow.remove(p);
                            check(p, len, tag);
                            (p, class)
                        })
                        .collect();
                    free_all(&ua, &rest, bulk_free);
                    (peak, nulls)
                })
            })
            .collect();
        let (mut peak, mut nulls) = (0, 0);
        for h in handles {
            let (p, n) = h.join().unwrap();
            peak = peak.max(p);
            nulls += n;
        }
        stop.store(true, SeqCst);
        let (calls, work) = trimmer.join().unwrap();
        assert!(shadow.0.lock().unwrap().is_empty());
        assert!(calls > 10, "the trimmer hardly ran: {calls}");
        assert!(
            work > 10,
            "trim found nothing to give back: {work} in {calls} calls"
        );
        assert!(peak >= 2, "both kinds had chunks");
        assert_eq!(nulls > 0, tight, "{nulls} mallocs ran out of memory");
        assert_all_returned(&ua, &chunks);
    });
}

#[test]
fn trim_races_malloc_and_free() {
    trim_race(false, false);
}

/// As `trim_races_malloc_and_free` on a heap of 3 chunks: every malloc that finds no chunk
/// trims too, so retirements, chunk returns (waiting out bins units held by claimers) and
/// chunk adoptions by the other kind all race.
#[test]
fn trim_races_malloc_and_free_out_of_memory() {
    trim_race(false, true);
}

/// As `trim_races_malloc_and_free`, half the frees through `free_bulk`. Fails on 8ceb2b2: see
/// `free_bulk_reports_freed_when_a_trim_takes_the_emptied_bin`.
#[test]
fn trim_races_malloc_and_free_bulk() {
    trim_race(true, false);
}

/// A `free_bulk` that empties a bin while another thread trims: every block is reported
/// `Freed`. Fails on 8ceb2b2 (a few hundred of 10^6 blocks come back `Invalid` on 2 cores):
/// after `release_bits`, `free_bulk` drops the read section and then calls `locate` again for
/// each member to find its bit; by then the trim may have retired the emptied bin and run
/// its return (`uncarve`), so `locate` fails and the `_` arm meant for an undone release calls
/// `free_single`, which answers `Invalid` for a block that was freed. Had the bin been carved
/// again in between, that `free_single` would free a slot of the new carving: another
/// thread's live block. (The GPU's `free_group` keeps each lane's bit from inside the section
/// and is not affected.)
#[test]
fn free_bulk_reports_freed_when_a_trim_takes_the_emptied_bin() {
    with_deadline(|| {
        const ROUNDS: usize = 40_000;
        let (arenas, chunks) = heap(1, 4);
        let ua = Arc::new(ualloc(arenas, &chunks));
        let stop = Arc::new(AtomicBool::new(false));
        let trimmer = {
            let (ua, stop) = (ua.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(SeqCst) {
                    ua.trim();
                }
            })
        };
        let mut wrong = BTreeMap::new();
        for round in 0..ROUNDS {
            // 4 KB: a group of 25 is a whole bin; 16 B: a group empties a bin of its own.
            let size = [4096, 1024, 16][round % 3];
            let class = SizeClass::from_size(size);
            let mut blocks = vec![std::ptr::null_mut(); class.max_group() as usize];
            assert!(ua.malloc_bulk(size, &mut blocks));
            let mut out = vec![FreeOutcome::Invalid; blocks.len()];
            // SAFETY: live blocks.
            unsafe { ua.free_bulk(&blocks, &mut out) };
            for o in out {
                if o != FreeOutcome::Freed(class) {
                    *wrong.entry(format!("{class:?}: {o:?}")).or_insert(0) += 1;
                }
            }
        }
        stop.store(true, SeqCst);
        trimmer.join().unwrap();
        assert!(
            wrong.is_empty(),
            "live blocks not reported freed: {wrong:?}"
        );
        assert_all_returned(&ua, &chunks);
    });
}

/// Fill with one class until null, free everything WITHOUT a trim, then fill with a class of
/// the other kind: the empty bins still hold every chunk, so the second fill gets its memory
/// only through malloc's own trim before it reports out of memory, and must get exactly what
/// a fresh heap gives.
#[test]
fn freed_memory_serves_another_kind_without_a_trim() {
    with_deadline(|| {
        const CHUNKS: usize = 3;
        for (first, second) in [(16, 1024), (1024, 16), (4096, 64), (128, 2048), (256, 32)] {
            let fresh = {
                let (arenas, chunks) = heap(1, CHUNKS);
                let ua = ualloc(arenas, &chunks);
                let blocks = fill_class(&ua, &Shadow::default(), second, CHUNKS);
                for p in &blocks {
                    // SAFETY: live blocks.
                    unsafe { ua.free(*p) };
                }
                assert_all_returned(&ua, &chunks);
                blocks.len()
            };
            let (arenas, chunks) = heap(1, CHUNKS);
            let ua = ualloc(arenas, &chunks);
            let shadow = Shadow::default();
            for p in fill_class(&ua, &shadow, first, CHUNKS) {
                release_block(&ua, &shadow, p, first as u64);
            }
            // Freeing alone gives nothing back: the empty bins keep their chunks.
            assert_eq!(chunks.outstanding(), CHUNKS);
            assert_eq!(ua.chunks_held(), CHUNKS);
            let blocks = fill_class(&ua, &shadow, second, CHUNKS);
            assert_eq!(blocks.len(), fresh, "{first} B, then {second} B");
            for p in blocks {
                release_block(&ua, &shadow, p, second as u64);
            }
            assert_all_returned(&ua, &chunks);
        }
    });
}

/// Runs `f` on a thread whose mallocs use arena `want` of `arenas` (host threads are dealt
/// round-robin over the "SMs"; threads of other tests take turns too, so try until one fits).
fn on_arena<T: Send + 'static>(
    arenas: usize,
    want: usize,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let f = Arc::new(Mutex::new(Some(f)));
    for _ in 0..1000 {
        let f = f.clone();
        let got = std::thread::spawn(move || {
            if my_arena(arenas) != want {
                return None;
            }
            let f = f.lock().unwrap().take().unwrap();
            Some(f())
        })
        .join()
        .unwrap();
        if let Some(v) = got {
            return v;
        }
    }
    panic!("no thread landed on arena {want}");
}

/// As above across arenas: one arena fills the heap with small blocks and frees them, the
/// other then fills it with large ones, with no trim in between (malloc's trim covers every
/// arena).
#[test]
fn freed_memory_flows_to_another_arena_without_a_trim() {
    with_deadline(|| {
        const CHUNKS: usize = 3;
        let (arenas, chunks) = heap(2, CHUNKS);
        let ua = Arc::new(ualloc(arenas, &chunks));
        let shadow = Arc::new(Shadow::default());
        let (u, s) = (ua.clone(), shadow.clone());
        let held = on_arena(2, 0, move || {
            let blocks = fill_class(&u, &s, 16, CHUNKS);
            for p in blocks {
                release_block(&u, &s, p, 16);
            }
            u.arenas()[0].chunk_count()
        });
        assert_eq!(
            held as usize, CHUNKS,
            "arena 0 keeps its chunks until a trim"
        );
        let (u, s) = (ua.clone(), shadow.clone());
        let blocks: Vec<usize> = on_arena(2, 1, move || {
            fill_class(&u, &s, 1024, CHUNKS)
                .into_iter()
                .map(|p| p as usize)
                .collect()
        });
        assert_eq!(ua.arenas()[1].chunk_count() as usize, CHUNKS);
        for p in blocks {
            release_block(&ua, &shadow, p as *mut u8, 1024);
        }
        assert_all_returned(&ua, &chunks);
    });
}

/// Threads that reach the out-of-memory path at once, each for a large class of its own,
/// after every chunk was left in empty small bins: each must get its block, since malloc
/// trims before it reports out of memory and the memory is there. Fails on 8ceb2b2 (about a
/// fifth of the mallocs return null): `trim` skips an arena whose `trimming` lock another
/// thread holds, so `reclaim` of a second thread that runs out of chunks returns 0 at once
/// and `alloc_slow` reports out of memory while the first thread's trim is handing every
/// chunk back.
#[test]
fn concurrent_mallocs_after_free_all_without_a_trim_succeed() {
    with_deadline(|| {
        const CHUNKS: usize = 3;
        const ROUNDS: usize = 30;
        let sizes = [256usize, 512, 1024, 2048, 4096];
        let (arenas, chunks) = heap(1, CHUNKS);
        let ua = Arc::new(ualloc(arenas, &chunks));
        let shadow = Arc::new(Shadow::default());
        let mut failures = Vec::new();
        for round in 0..ROUNDS {
            for p in fill_class(&ua, &shadow, 16, CHUNKS) {
                release_block(&ua, &shadow, p, 16);
            }
            let start = Arc::new(Barrier::new(sizes.len()));
            let got: Vec<usize> = sizes
                .iter()
                .map(|&size| {
                    let (ua, start) = (ua.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        ua.malloc(size) as usize
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect();
            for (&p, &size) in got.iter().zip(&sizes) {
                if p == 0 {
                    failures.push((round, size));
                } else {
                    adopt_block(&ua, &shadow, p as *mut u8, size, 5);
                    release_block(&ua, &shadow, p as *mut u8, 5);
                }
            }
        }
        assert_all_returned(&ua, &chunks);
        assert!(
            failures.is_empty(),
            "out of memory with free memory: (round, size) {failures:?}"
        );
    });
}

/// One arena holds more free 16 B slots than a 24-bit count can: 2^23 + 1 slots and more
/// (issue 13, item 3). Four threads fill it through the group path, free everything, and the
/// class's semaphore must then count every slot exactly; the heap must fill to the same
/// capacity again and give every chunk back.
#[test]
fn an_arena_counts_more_free_slots_than_24_bits_hold() {
    with_deadline(|| {
        const THREADS: usize = 4;
        let class = SizeClass::from_size(16);
        let per_chunk = capacity(class, 1);
        let chunks_needed = ((1usize << 23) + 1).div_ceil(per_chunk) + 1;
        let (arenas, chunks) = heap(1, chunks_needed);
        let ua = Arc::new(ualloc(arenas, &chunks));
        let total = capacity(class, chunks_needed);
        assert!(total > 1 << 23);
        for round in 0..2 {
            let blocks: Vec<Vec<usize>> = (0..THREADS)
                .map(|_| {
                    let ua = ua.clone();
                    std::thread::spawn(move || {
                        let mut mine = Vec::new();
                        let mut out = [std::ptr::null_mut(); 32];
                        loop {
                            let n = if ua.malloc_bulk(16, &mut out) {
                                out.len()
                            } else {
                                // Near the end a group of 32 may not fit: finish one by one.
                                let p = ua.malloc(16);
                                if p.is_null() {
                                    break;
                                }
                                out[0] = p;
                                1
                            };
                            for &p in &out[..n] {
                                // SAFETY: a live 16 B block.
                                unsafe { (p as *mut u64).write(p as u64 ^ round) };
                                mine.push(p as usize);
                            }
                        }
                        mine
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect();
            let mut all: Vec<usize> = blocks.iter().flatten().copied().collect();
            assert_eq!(
                all.len(),
                total,
                "round {round}: the heap filled to its capacity"
            );
            all.sort_unstable();
            all.dedup();
            assert_eq!(
                all.len(),
                total,
                "round {round}: a block was handed out twice"
            );
            for p in &all {
                // SAFETY: live blocks written above.
                assert_eq!(unsafe { (*p as *const u64).read() }, *p as u64 ^ round);
            }
            let handles: Vec<_> = blocks
                .into_iter()
                .map(|mine| {
                    let ua = ua.clone();
                    std::thread::spawn(move || {
                        let mut outcomes = [FreeOutcome::Invalid; 64];
                        for part in mine.chunks(64) {
                            let ptrs: Vec<*mut u8> = part.iter().map(|&p| p as *mut u8).collect();
                            // SAFETY: live blocks of this heap.
                            unsafe { ua.free_bulk(&ptrs, &mut outcomes[..ptrs.len()]) };
                            assert!(
                                outcomes[..ptrs.len()]
                                    == vec![FreeOutcome::Freed(class); ptrs.len()][..]
                            );
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            // Every slot is free and listed: C counts them all, past the 24-bit bound.
            assert_eq!(arenas[0].slot_counters(class), (total as u32, 0, 0));
            ua.assert_valid();
        }
        assert_all_returned(&ua, &chunks);
    });
}

/// Memory flows between arenas before any null (issue 13, item 2): arena 0 holds one 16 B
/// block, so its chunk holds 123 free bins and its first bin 255 free slots. Arena 1 then
/// fills the rest of the heap with 16 B blocks: its own chunk, then the bins it takes from
/// arena 0's chunk (`take_bin_elsewhere`), then arena 0's free slots (`steal_slot`): every
/// slot but the one arena 0 holds, with no trim.
#[test]
fn an_arena_takes_free_bins_and_slots_from_another_before_null() {
    with_deadline(|| {
        const CHUNKS: usize = 2;
        let (arenas, chunks) = heap(2, CHUNKS);
        let ua = Arc::new(ualloc(arenas, &chunks));
        let shadow = Arc::new(Shadow::default());
        let (u, s) = (ua.clone(), shadow.clone());
        let first = on_arena(2, 0, move || {
            let p = u.malloc(16);
            assert!(!p.is_null());
            adopt_block(&u, &s, p, 16, 1);
            p as usize
        });
        let (u, s) = (ua.clone(), shadow.clone());
        let rest: Vec<usize> = on_arena(2, 1, move || {
            let mut got = Vec::new();
            loop {
                let p = u.malloc(16);
                if p.is_null() {
                    break;
                }
                adopt_block(&u, &s, p, 16, 2);
                got.push(p as usize);
            }
            got
        });
        let class = SizeClass::from_size(16);
        assert_eq!(rest.len(), capacity(class, CHUNKS) - 1);
        assert_eq!(ua.arenas()[0].chunk_count(), 1);
        assert_eq!(ua.arenas()[1].chunk_count(), 1);
        ua.assert_valid();
        for p in rest {
            release_block(&ua, &shadow, p as *mut u8, 2);
        }
        release_block(&ua, &shadow, first as *mut u8, 1);
        assert_all_returned(&ua, &chunks);
    });
}

/// Arenas whose SMs adopted no chunk still get memory (issue 13, item 2). Arenas 0–3 each
/// take one 16 B block; the source holds fewer chunks than there are arenas, so they share
/// one chunk. Then threads on arenas 4–7 ask for mixed small sizes (one kind), each until
/// every size has returned null to it, three rounds. They must get at least 90% of the slot
/// bytes (before memory flowed between arenas, once arenas 0–3 held a chunk each, they got
/// none). Nothing overlaps, and everything comes back.
#[test]
fn arenas_without_chunks_fill_the_heap_from_the_others() {
    with_deadline(|| {
        const ARENAS: usize = 8;
        const CHUNKS: usize = 4;
        let (arenas, chunks) = heap(ARENAS, CHUNKS);
        let ua = Arc::new(ualloc(arenas, &chunks));
        let shadow = Arc::new(Shadow::default());
        let firsts: Vec<usize> = (0..CHUNKS)
            .map(|a| {
                let (u, s) = (ua.clone(), shadow.clone());
                on_arena(ARENAS, a, move || {
                    let p = u.malloc(16);
                    assert!(!p.is_null());
                    adopt_block(&u, &s, p, 16, 99);
                    p as usize
                })
            })
            .collect();
        // The source holds fewer chunks than there are arenas: arenas 1–3 carve their bins in
        // arena 0's chunk instead of taking one each.
        assert_eq!(chunks.outstanding(), 1);
        // Small kind only (16 B – 256 B), so every free bin can serve every request.
        let sizes = [16usize, 32, 64, 128, 256];
        let slot_bytes = CHUNKS * SMALL_BINS * PAGE_SIZE;
        for round in 0..3u64 {
            let handles: Vec<_> = (0..64u64)
                .map(|t| {
                    let (u, s) = (ua.clone(), shadow.clone());
                    std::thread::spawn(move || {
                        let mut got = Vec::new();
                        if my_arena(ARENAS) < CHUNKS {
                            return got;
                        }
                        let mut rng = Rng(round * 100 + t);
                        // A size that returned null is not asked again: the thread goes on
                        // with the others until every size has returned null once.
                        let mut open: Vec<usize> = sizes.to_vec();
                        while !open.is_empty() {
                            let i = rng.below(open.len() as u64) as usize;
                            let p = u.malloc(open[i]);
                            if p.is_null() {
                                open.swap_remove(i);
                                continue;
                            }
                            adopt_block(&u, &s, p, open[i], round);
                            got.push((p as usize, open[i]));
                        }
                        got
                    })
                })
                .collect();
            let blocks: Vec<(usize, usize)> = handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect();
            let served: usize = blocks
                .iter()
                .map(|&(_, size)| SizeClass::from_size(size).size())
                .sum();
            assert!(
                served * 10 >= slot_bytes * 9,
                "round {round}: {served} of {slot_bytes} slot bytes served"
            );
            assert_eq!(chunks.outstanding(), CHUNKS, "every chunk in use");
            ua.assert_valid();
            for (p, _) in blocks {
                release_block(&ua, &shadow, p as *mut u8, round);
            }
        }
        for p in firsts {
            release_block(&ua, &shadow, p as *mut u8, 99);
        }
        assert_all_returned(&ua, &chunks);
    });
}

/// INV(UA16) on the group path: a fill of requests uniform over 16 – 4096 B totalling twice
/// the memory, played as 132 SMs would run it, each warp's 32 requests grouped by class and
/// served with `malloc_bulk` (one semaphore operation per group, as a warp's leader does),
/// fills at least 88% of 16 chunks and 95% of 128, and 90% of 640 (93.4% when written).
/// This source gives no bound, so it is never a small heap: each case turns to the homes
/// once fewer than four chunks per arena are left. From one chunk per arena on instead
/// (branch `next/home-late`), 640 chunks served 72.9%: every arena had carved a partly used
/// bin of every class by then.
#[test]
fn group_fills_of_few_chunks_share_bins_between_arenas() {
    use toga_kernels::size_class::SizeClass;
    const SMS: usize = 132;
    for (chunks, floor) in [(16usize, 88.0), (128, 95.0), (640, 90.0)] {
        let (arenas, source) = heap(SMS, chunks);
        let ua = ualloc(arenas, &source);
        let n = chunks * CHUNK_SIZE * 2 / 2730;
        let mut rng = Rng(0x5EED);
        let sizes: Vec<usize> = (0..n).map(|_| 16 + rng.below(4081) as usize).collect();
        // Warp `w` belongs to block `w / 8` (256 threads), which runs on SM `block % SMS`.
        let mut queues: Vec<Vec<usize>> = vec![Vec::new(); SMS];
        for w in 0..n.div_ceil(32) {
            queues[(w / 8) % SMS].push(w);
        }
        let longest = queues.iter().map(Vec::len).max().unwrap();
        let mut live = Vec::new();
        let mut served = 0;
        for t in 0..longest {
            for (sm, q) in queues.iter().enumerate() {
                let Some(&w) = q.get(t) else { continue };
                toga_kernels::platform::set_sm_id(sm as u32);
                let warp = &sizes[w * 32..((w + 1) * 32).min(n)];
                for class in SizeClass::ALL {
                    let mut left = warp
                        .iter()
                        .filter(|&&s| SizeClass::from_size(s) == class)
                        .count();
                    while left > 0 {
                        let k = left.min(class.max_group() as usize);
                        let mut out = vec![std::ptr::null_mut(); k];
                        if ua.malloc_bulk(class.size(), &mut out) {
                            live.extend(out);
                        } else {
                            // A group whose refill failed: each lane alone, as on the GPU.
                            live.extend((0..k).map(|_| ua.malloc(class.size())));
                        }
                        left -= k;
                    }
                }
            }
        }
        live.retain(|p| !p.is_null());
        for &p in &live {
            // SAFETY: a live block of this UAlloc, freed once.
            served += match unsafe { ua.free(p) } {
                FreeOutcome::Freed(c) => c.size(),
                other => panic!("free of a live block: {other:?}"),
            };
        }
        let percent = served as f64 / (chunks * CHUNK_SIZE) as f64 * 100.0;
        println!("{chunks} chunks: {percent:.2}% served");
        assert!(
            percent >= floor,
            "{chunks} chunks: {percent:.1}% served, below {floor}%"
        );
        ua.trim();
        ua.flush();
        assert_eq!(source.outstanding(), 0, "every chunk back in the source");
    }
}

/// Groups and lone lanes of the small classes churn through the arenas' runs while chunks are
/// plentiful (`ualloc::run`): groups of every size that take items side by side, cross the end
/// of a run and stock the next, lone mallocs on the same runs, frees by other threads that
/// give the semaphores units (so that groups go back and forth between the lists and the
/// runs), and trims that flush the runs. Every block is checked against the shadow and its
/// pattern, and everything goes back.
#[test]
fn group_runs_churn_with_lone_lanes_frees_and_trims() {
    with_deadline(|| {
        const THREADS: usize = 4;
        const ROUNDS: usize = 4000;
        let (arenas, chunks) = heap(2, 256);
        let ua = Arc::new(ualloc(arenas, &chunks));
        let shadow = Arc::new(Shadow::default());
        let (tx, rx) = mpsc::channel::<Vec<usize>>();
        let rx = Arc::new(Mutex::new(rx));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (ua, shadow, tx, rx) = (ua.clone(), shadow.clone(), tx.clone(), rx.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng(777 + t as u64);
                    let mut live: Vec<(Vec<usize>, u64)> = Vec::new();
                    for round in 0..ROUNDS {
                        let tag = (t * ROUNDS + round) as u64;
                        let size = 16usize << rng.below(4);
                        let blocks: Vec<usize> = if rng.below(4) == 0 {
                            (0..1 + rng.below(3))
                                .map(|_| ua.malloc(size) as usize)
                                .collect()
                        } else {
                            let k = 1 + rng.below(32) as usize;
                            let mut out = vec![std::ptr::null_mut(); k];
                            assert!(ua.malloc_bulk(size, &mut out), "{k} × {size}");
                            out.iter().map(|&p| p as usize).collect()
                        };
                        for &p in &blocks {
                            adopt_block(&ua, &shadow, p as *mut u8, size, tag);
                        }
                        live.push((blocks, tag));
                        if live.len() > 16 {
                            let (group, tag) =
                                live.swap_remove(rng.below(live.len() as u64) as usize);
                            if rng.below(2) == 0 {
                                for p in group {
                                    release_block(&ua, &shadow, p as *mut u8, tag);
                                }
                            } else {
                                // Another thread frees it (tag 0 marks it unchecked there).
                                for &p in &group {
                                    check(p as *mut u8, shadow_len(&shadow, p), tag);
                                }
                                tx.send(group).unwrap();
                            }
                        }
                        if let Ok(group) = rx.lock().unwrap().try_recv() {
                            for p in group {
                                shadow.remove(p as *mut u8);
                                // SAFETY: a live block another thread handed over.
                                assert!(matches!(
                                    unsafe { ua.free(p as *mut u8) },
                                    FreeOutcome::Freed(_)
                                ));
                            }
                        }
                        if round % 500 == 250 + t {
                            ua.trim();
                        }
                    }
                    for (group, tag) in live {
                        for p in group {
                            release_block(&ua, &shadow, p as *mut u8, tag);
                        }
                    }
                })
            })
            .collect();
        drop(tx);
        handles.into_iter().for_each(|h| h.join().unwrap());
        while let Ok(group) = rx.lock().unwrap().try_recv() {
            for p in group {
                shadow.remove(p as *mut u8);
                // SAFETY: a live block handed over.
                assert!(matches!(
                    unsafe { ua.free(p as *mut u8) },
                    FreeOutcome::Freed(_)
                ));
            }
        }
        assert_all_returned(&ua, &chunks);
    });
}

/// The size the shadow holds for the live block at `p`.
fn shadow_len(shadow: &Shadow, p: usize) -> usize {
    *shadow.0.lock().unwrap().get(&p).expect("a live block")
}
