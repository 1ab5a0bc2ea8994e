//! The whole heap (`malloc`/`free` routing, TBuddy, UAlloc, statistics) on host threads over a
//! heap in host memory, with a shadow oracle and byte patterns.
#![cfg(not(loom))]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex, mpsc};

#[path = "common/host_heap.rs"]
mod host_heap;

use host_heap::HostHeap;
use toga_kernels::heap::{DeviceHeap, HeapHeader, stat};
use toga_kernels::pattern;
use toga_kernels::ualloc::{CHUNK_SIZE, MAX_SMALL_SIZE};

/// `malloc(size)` until it returns null: the blocks it served.
fn fill_until_null(heap: &DeviceHeap<'_>, size: usize) -> Vec<*mut u8> {
    let mut blocks = Vec::new();
    loop {
        let p = heap.malloc(size);
        if p.is_null() {
            return blocks;
        }
        blocks.push(p);
    }
}

/// Free each of `blocks` once.
fn free_all(heap: &DeviceHeap<'_>, blocks: &[*mut u8]) {
    for &p in blocks {
        // SAFETY: the caller's live blocks, each freed once here.
        unsafe { heap.free(p) };
    }
}

/// The seed of the randomized tests: `TOGA_STRESS_SEED` (decimal or `0x` hex), or a fixed
/// default. Printed, so that a failing run (whose output the test harness shows) names the
/// seed that reproduces it.
fn seed() -> u64 {
    let seed = match std::env::var("TOGA_STRESS_SEED") {
        Ok(v) => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("TOGA_STRESS_SEED={v:?} is not a u64: {e}"))
        }
        Err(_) => 0x1234_5678,
    };
    println!("seed {seed:#x} (set TOGA_STRESS_SEED={seed:#x} to run this case again)");
    seed
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn mixed_sizes_with_cross_thread_frees_keep_blocks_disjoint_and_intact() {
    let data = 64 << 20;
    let fewest = mixed_sizes_with_cross_thread_frees(Arc::new(HostHeap::stocked(data, 4)), None);
    println!("fewest live bytes at a null: {fewest} of {data}");
    // Nulls come only from a heap that is mostly handed out: the first came with 81% to 87%
    // of it live (usable bytes) over six seeds (0x12345678, 1, 0xdeadbeef, 42, 777, 0x9999).
    assert!(
        fewest >= data * 3 / 4,
        "malloc returned null with only {fewest} of {data} bytes live"
    );
}

/// INV(UA16) under contention: in a 4 MiB heap (8 chunks) with 32 arenas, chunks are always
/// scarce, so every refill goes to its class's home, and each thread plays several SMs in
/// turn: many SMs share the homes' bins and refills, and the heap runs out and recovers.
#[test]
fn home_refills_keep_blocks_disjoint_and_intact() {
    let h = Arc::new(HostHeap::new(4 << 20, 32));
    let fewest = mixed_sizes_with_cross_thread_frees(h.clone(), Some(32));
    println!("fewest live bytes at a null: {fewest} of {}", 4 << 20);
    assert!(h.stat(stat::FAILED) > 0, "the heap never ran out");
}

/// Six threads malloc blocks of every size (1 in 16 large), fill them with patterns, and free
/// them, half through a neighbour thread; the oracle catches overlaps of the blocks' usable
/// sizes (`usable_size`, at least the size asked for). With `sms`, each step runs as one of
/// that many SMs (thread `t` plays `t`, `t + 6`, ...). Returns, over the nulls `malloc`
/// returned, the fewest bytes the live blocks held at one (`u64::MAX`: no null).
fn mixed_sizes_with_cross_thread_frees(h: Arc<HostHeap>, sms: Option<u32>) -> u64 {
    const THREADS: usize = 6;
    const STEPS: usize = 3000;
    let seed = seed();
    // Start address → usable size of every live block.
    let oracle: Arc<Mutex<BTreeMap<u64, u64>>> = Arc::default();
    // Usable bytes of the live blocks, and the fewest of them seen at a null.
    let live_bytes: Arc<std::sync::atomic::AtomicU64> = Arc::default();
    let fewest_at_null = Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS)
        .map(|_| mpsc::channel::<(u64, u32, u64)>())
        .unzip();
    let senders = Arc::new(senders);
    let mut handles = Vec::new();
    for (t, rx) in receivers.into_iter().enumerate() {
        let (h, oracle, senders) = (h.clone(), oracle.clone(), senders.clone());
        let (live_bytes, fewest_at_null) = (live_bytes.clone(), fewest_at_null.clone());
        handles.push(std::thread::spawn(move || {
            let heap = h.heap();
            let mut rng = seed ^ ((t as u64 + 1) * 0x9E37_79B9);
            let mut live: Vec<(u64, u32, u64)> = Vec::new();
            let free = |(p, size, owner): (u64, u32, u64)| {
                // SAFETY: a live block filled for `owner`.
                unsafe {
                    assert_eq!(
                        pattern::check(p as *const u8, size as usize, owner, 1),
                        0,
                        "corrupted block at {p:#x}"
                    );
                }
                let usable = oracle
                    .lock()
                    .unwrap()
                    .remove(&p)
                    .expect("freeing a block the oracle does not know");
                live_bytes.fetch_sub(usable, SeqCst);
                // SAFETY: live block of this heap, freed once.
                unsafe { heap.free(p as *mut u8) };
            };
            for step in 0..STEPS {
                if let Some(sms) = sms {
                    let plays = sms.div_ceil(THREADS as u32);
                    let sm = t as u32 + THREADS as u32 * (step as u32 % plays);
                    toga_kernels::platform::set_sm_id(sm % sms);
                }
                while let Ok(b) = rx.try_recv() {
                    free(b);
                }
                let r = xorshift(&mut rng);
                if r.is_multiple_of(3) && !live.is_empty() {
                    let b = live.swap_remove((r as usize / 3) % live.len());
                    if r.is_multiple_of(2) {
                        // The neighbour may have finished already: then free it here.
                        if let Err(mpsc::SendError(b)) = senders[(t + 1) % THREADS].send(b) {
                            free(b);
                        }
                    } else {
                        free(b);
                    }
                } else {
                    let size = if r % 16 == 1 {
                        4096 + (r >> 20) % 200_000
                    } else {
                        1 + (r >> 20) % MAX_SMALL_SIZE as u64
                    } as u32;
                    let p = heap.malloc(size as usize) as u64;
                    if p == 0 {
                        fewest_at_null.fetch_min(live_bytes.load(SeqCst), SeqCst);
                        continue;
                    }
                    assert_eq!(p % 16, 0, "malloc({size}) returned {p:#x}");
                    // SAFETY: a live block of this heap.
                    let usable = unsafe { heap.usable_size(p as *mut u8) } as u64;
                    assert!(
                        usable >= size as u64,
                        "malloc({size}) gave {usable} usable bytes"
                    );
                    let owner = (t * STEPS + step) as u64;
                    {
                        let mut o = oracle.lock().unwrap();
                        if let Some((&q, &len)) = o.range(..=p).next_back() {
                            assert!(q + len <= p, "{p:#x} overlaps the live block {q:#x}+{len}");
                        }
                        if let Some((&q, _)) = o.range(p..).next() {
                            assert!(
                                p + usable <= q,
                                "{p:#x}+{usable} overlaps the live block {q:#x}"
                            );
                        }
                        o.insert(p, usable);
                    }
                    live_bytes.fetch_add(usable, SeqCst);
                    // SAFETY: `p` holds `size` bytes.
                    unsafe { pattern::fill(p as *mut u8, size as usize, owner, 1) };
                    live.push((p, size, owner));
                }
            }
            live
        }));
    }
    let leftovers: Vec<_> = handles
        .into_iter()
        .flat_map(|j| j.join().unwrap())
        .collect();
    // Blocks still in flight in channels are gone with the receivers; free what the threads kept
    // and what the oracle still knows.
    let heap = h.heap();
    for (p, size, owner) in leftovers {
        // SAFETY: live block.
        unsafe {
            assert_eq!(pattern::check(p as *const u8, size as usize, owner, 1), 0);
        }
        oracle.lock().unwrap().remove(&p);
        // SAFETY: live block, freed once.
        unsafe { heap.free(p as *mut u8) };
    }
    for &p in oracle.lock().unwrap().keys() {
        // SAFETY: blocks sent but never received are still live.
        unsafe { heap.free(p as *mut u8) };
    }
    assert_eq!(h.stat(stat::MALLOCS), h.stat(stat::FREES));
    assert_eq!(h.stat(stat::LIVE_BYTES), 0);
    assert_eq!(h.stat(stat::DOUBLE_FREES) + h.stat(stat::INVALID_FREES), 0);
    // Empty bins stay with their class until a trim (INV(UA4)).
    heap.trim();
    heap.buddy().assert_valid();
    assert_eq!(
        heap.buddy().available_pages(),
        h.geometry.pages,
        "every chunk is back in TBuddy"
    );
    fewest_at_null.load(SeqCst)
}

#[test]
fn misuse_is_counted_and_changes_nothing() {
    let h = HostHeap::new(8 << 20, 2);
    let heap = h.heap();
    let small = heap.malloc(40);
    let large = heap.malloc(3 * 4096);
    assert!(!small.is_null() && !large.is_null());
    // SAFETY: deliberate misuse; the heap must detect every case below.
    unsafe {
        heap.free(std::ptr::null_mut());
        heap.free(small);
        heap.free(small);
        heap.free(large);
        heap.free(large);
        heap.free(0x1000 as *mut u8);
        heap.free(h.mem);
    }
    assert_eq!(h.stat(stat::DOUBLE_FREES) + h.stat(stat::INVALID_FREES), 4);
    assert_eq!(h.stat(stat::LIVE_BYTES), 0);
    heap.trim();
    heap.buddy().assert_valid();
    assert_eq!(heap.buddy().available_pages(), h.geometry.pages);
    assert!(heap.malloc(0).is_null());
    assert!(heap.malloc(usize::MAX / 2).is_null());
    assert_eq!(
        h.stat(stat::FAILED),
        1,
        "malloc(0) is no failure; the huge one is"
    );
}

#[test]
fn exhaustion_then_full_recovery() {
    let h = HostHeap::new(4 << 20, 2);
    let heap = h.heap();
    for size in [64usize, 8192, 1000] {
        let first = fill_until_null(&heap, size);
        free_all(&heap, &first);
        let second = fill_until_null(&heap, size);
        assert_eq!(
            first.len(),
            second.len(),
            "size {size}: the heap recovered fully"
        );
        free_all(&heap, &second);
        heap.trim();
        heap.buddy().assert_valid();
        assert_eq!(heap.buddy().available_pages(), h.geometry.pages);
    }
}

#[test]
fn freed_small_blocks_serve_a_whole_heap_block_without_a_trim() {
    let h = HostHeap::new(4 << 20, 2);
    let heap = h.heap();
    for size in [16usize, 64, 1000, 4096] {
        let blocks = fill_until_null(&heap, size);
        assert!(blocks.len() > 100, "size {size}: {} blocks", blocks.len());
        free_all(&heap, &blocks);
        // No trim: the empty bins are still UAlloc's, and the large malloc that finds no
        // pages takes them back itself.
        let whole = heap.malloc(h.geometry.pages as usize * 4096);
        assert!(
            !whole.is_null(),
            "size {size}: the whole heap is not allocatable"
        );
        // SAFETY: a live block, freed once.
        unsafe { heap.free(whole) };
        heap.buddy().assert_valid();
        assert_eq!(heap.buddy().available_pages(), h.geometry.pages);
    }
}

/// Freed large blocks wait in their order's stash (INV(HP6)): a heap filled with blocks of
/// 8 KiB to 256 KiB and emptied again holds them out of the tree; the next `malloc` of each
/// size takes a freed block back; and a whole-heap request, which finds the tree short,
/// trims, so the stashed blocks go back, merge, and serve it.
#[test]
fn freed_large_blocks_wait_in_stashes_until_a_malloc_or_a_trim() {
    let h = HostHeap::new(4 << 20, 2);
    let heap = h.heap();
    let pages = h.geometry.pages;
    for size in [8usize << 10, 16 << 10, 64 << 10, 256 << 10] {
        let blocks = fill_until_null(&heap, size);
        assert!(blocks.len() >= 8, "size {size}: {} blocks", blocks.len());
        let before = heap.buddy().free_pages();
        free_all(&heap, &blocks);
        assert_eq!(
            heap.buddy().free_pages(),
            before,
            "size {size}: freed blocks stay out of the tree"
        );
        assert_eq!(heap_reserved(&h) % (CHUNK_SIZE as u64), 0, "size {size}");
        // A stashed block freed again is counted and changes nothing (INV(HP1)).
        let doubles = h.stat(stat::DOUBLE_FREES);
        // SAFETY: a double free, which the heap detects for large blocks.
        unsafe { heap.free(blocks[0]) };
        assert_eq!(h.stat(stat::DOUBLE_FREES), doubles + 1, "size {size}");
        let again = heap.malloc(size);
        assert!(
            blocks.contains(&again),
            "size {size}: a stashed block serves"
        );
        // SAFETY: a live block, freed once.
        unsafe { heap.free(again) };
        let whole = heap.malloc(pages as usize * 4096);
        assert!(
            !whole.is_null(),
            "size {size}: the whole heap is not allocatable"
        );
        // SAFETY: a live block, freed once.
        unsafe { heap.free(whole) };
        heap.buddy().assert_valid();
        assert_eq!(heap.buddy().available_pages(), pages);
    }
    assert_eq!(h.stat(stat::DOUBLE_FREES), 4);
    assert_eq!(h.stat(stat::INVALID_FREES), 0);
}

/// Spare chunks (INV(UA14)): a heap with room stocks each arena with one chunk per bin kind;
/// the first adoption of each kind takes the spare without touching the tree, a second
/// stocking keeps nothing, and a whole-heap request right after stocking is served (the
/// out-of-memory path's trim gives the unused spares back). A heap without room gets none.
/// (32 MiB for 4 arenas: eight chunks per spare, too few for the chunks adopted at once of
/// `stocked_heaps_with_twice_the_room_adopt_a_chunk_per_arena_and_kind`.)
#[test]
fn stocked_spares_serve_first_adoptions_and_go_back_to_the_tree() {
    const ARENAS: u64 = 4;
    let h = HostHeap::new(32 << 20, ARENAS);
    let heap = h.heap();
    let pages = h.geometry.pages;
    let chunk_pages = (CHUNK_SIZE / 4096) as u64;
    let spares = ARENAS * 2;
    let reserved = || heap_reserved(&h);
    for t in 0..spares + 3 {
        assert_eq!(heap.stock_arenas(t), t < spares, "thread {t}");
    }
    assert_eq!(heap.buddy().free_pages(), pages - spares * chunk_pages);
    assert_eq!(reserved(), spares * CHUNK_SIZE as u64);
    // A second launch finds every arena stocked: the chunks it took go back at once.
    for t in 0..spares {
        assert!(!heap.stock_arenas(t), "thread {t} stocked twice");
    }
    assert_eq!(heap.buddy().free_pages(), pages - spares * chunk_pages);
    // This thread's arena adopts a small and a large chunk: both are its spares.
    let small = heap.malloc(16);
    let large = heap.malloc(1000);
    assert!(!small.is_null() && !large.is_null());
    assert_eq!(
        heap.buddy().free_pages(),
        pages - spares * chunk_pages,
        "the first adoptions took the spares, not new chunks"
    );
    // SAFETY: live blocks, freed once.
    unsafe {
        heap.free(small);
        heap.free(large);
    }
    // The whole heap at once: the spares and the emptied chunks come back on the way.
    let whole = heap.malloc(pages as usize * 4096);
    assert!(!whole.is_null(), "a whole-heap block with spares stocked");
    assert_eq!(
        reserved(),
        pages * 4096,
        "the whole block alone is reserved"
    );
    // SAFETY: a live block, freed once.
    unsafe { heap.free(whole) };
    heap.buddy().assert_valid();
    assert_eq!(heap.buddy().available_pages(), pages);

    // Eight chunks per spare or more, or none: 64 MiB has 128 chunks, too few for 16 arenas.
    let small_heap = HostHeap::new(64 << 20, 16);
    assert!(!small_heap.heap().stock_arenas(0));
    assert_eq!(
        small_heap.heap().buddy().free_pages(),
        small_heap.geometry.pages
    );
}

/// A heap with sixteen chunks per spare or more (twice `STOCK_HEADROOM`) also adopts one chunk
/// of each kind for each arena when it stocks them (INV(UA14)): an arena's first refills take
/// that chunk's bins, with neither a trip to the tree nor the spare's swap; its first adoption
/// then takes the spare. A whole-heap request right after is still served (the trim gives
/// back the spares and the empty adopted chunks).
#[test]
fn stocked_heaps_with_twice_the_room_adopt_a_chunk_per_arena_and_kind() {
    const ARENAS: u64 = 4;
    let h = HostHeap::stocked(64 << 20, ARENAS);
    let heap = h.heap();
    let pages = h.geometry.pages;
    let chunk_pages = (CHUNK_SIZE / 4096) as u64;
    // Per arena and kind: a spare and an adopted chunk.
    let out = ARENAS * 2 * 2 * chunk_pages;
    assert_eq!(heap.buddy().free_pages(), pages - out);
    assert_eq!(heap_reserved(&h), out * 4096);
    // A small chunk's worth of 64 B blocks (124 bins of 62 + 2 slots) and a large bin of 1 KB
    // blocks: all from the adopted chunks, none from the tree or the spares.
    toga_kernels::platform::set_sm_id(0);
    let mut blocks: Vec<*mut u8> = (0..124 * 64).map(|_| heap.malloc(64)).collect();
    blocks.extend((0..102).map(|_| heap.malloc(1000)));
    assert!(blocks.iter().all(|p| !p.is_null()));
    assert_eq!(
        heap.buddy().free_pages(),
        pages - out,
        "the adopted chunks served the first refills"
    );
    // The next 64 B block needs a new chunk: the spare's, still not the tree's.
    blocks.push(heap.malloc(64));
    assert!(!blocks[blocks.len() - 1].is_null());
    assert_eq!(heap.buddy().free_pages(), pages - out);
    free_all(&heap, &blocks);
    let whole = heap.malloc(pages as usize * 4096);
    assert!(
        !whole.is_null(),
        "a whole-heap block with chunks adopted at init"
    );
    assert_eq!(
        heap_reserved(&h),
        pages * 4096,
        "the whole block alone is reserved"
    );
    // SAFETY: a live block, freed once.
    unsafe { heap.free(whole) };
    heap.buddy().assert_valid();
    assert_eq!(heap.buddy().available_pages(), pages);
}

/// While at most a quarter of the tree's chunks are out (and it holds 16 per arena), an
/// adoption takes four chunks in one allocation: it adopts the first, keeps the second as the
/// arena's spare and adopts the other two, so the tree is asked again only after four chunks'
/// worth of blocks. With more out (and still eight per arena) it takes two, the second the
/// spare. Then eight threads of one arena take 4 KiB blocks at once until the heap runs out,
/// where adoptions may race: every block is disjoint and intact, and everything comes back.
/// (The race in which the arena got a spare meanwhile, so that the second chunk is adopted
/// too, is rare on two host cores; a fresh fill of 4 KiB on the GPU takes that path thousands
/// of times, `heap_gpu` and the sanitizers run it there.)
#[test]
fn adoptions_take_chunks_in_runs_and_race_safely() {
    let h = HostHeap::new(64 << 20, 2);
    let heap = h.heap();
    let pages = h.geometry.pages;
    let chunk_pages = (CHUNK_SIZE / 4096) as u64;
    // The first adoption of the small kind: four chunks from the tree.
    let first = heap.malloc(16);
    assert!(!first.is_null());
    assert_eq!(heap.buddy().free_pages(), pages - 4 * chunk_pages);
    assert_eq!(heap_reserved(&h), 4 * CHUNK_SIZE as u64);
    // 16 B blocks until the tree gives more: three chunks adopted and the spare serve more
    // than three chunks' worth of blocks; then four chunks again (a quarter is not out yet).
    let mut small = vec![first];
    while heap.buddy().free_pages() == pages - 4 * chunk_pages {
        let p = heap.malloc(16);
        assert!(!p.is_null());
        small.push(p);
    }
    assert_eq!(heap.buddy().free_pages(), pages - 8 * chunk_pages);
    assert!(
        small.len() > 3 * CHUNK_SIZE / 16,
        "the tree was asked again after {} blocks of 16 B",
        small.len()
    );
    for &p in &small {
        // SAFETY: live blocks, freed once.
        unsafe { heap.free(p) };
    }
    heap.trim();
    assert_eq!(
        heap.buddy().free_pages(),
        pages,
        "the trim gave every chunk back"
    );
    // Half the heap out: an adoption of the large kind takes a pair.
    let half = heap.malloc(pages as usize * 4096 / 2);
    assert!(!half.is_null());
    let before = heap.buddy().free_pages();
    let p = heap.malloc(1000);
    assert!(!p.is_null());
    assert_eq!(heap.buddy().free_pages(), before - 2 * chunk_pages);
    // SAFETY: live blocks, freed once.
    unsafe {
        heap.free(p);
        heap.free(half);
    }
    // Racing adoptions: eight threads of arena 0, 4 KiB each, until the heap runs out.
    let got: Vec<Vec<usize>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let h = &h;
                s.spawn(move || {
                    toga_kernels::platform::set_sm_id(0);
                    let heap = h.heap();
                    let mut mine = Vec::new();
                    loop {
                        let p = heap.malloc(4096);
                        if p.is_null() {
                            return mine;
                        }
                        // SAFETY: a live block of 4 KiB, ours.
                        unsafe { pattern::fill(p, 4096, p as u64, t as u32) };
                        mine.push(p as usize);
                    }
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let mut all: Vec<usize> = got.iter().flatten().copied().collect();
    all.sort_unstable();
    assert!(
        all.windows(2).all(|w| w[1] - w[0] >= 4096),
        "overlapping blocks"
    );
    assert!(
        all.len() as u64 * 4096 >= (pages * 4096) * 9 / 10,
        "{} blocks of 4 KiB in 64 MiB",
        all.len()
    );
    for (t, blocks) in got.iter().enumerate() {
        for &p in blocks {
            // SAFETY: live blocks of 4 KiB, freed once.
            unsafe {
                let bad = pattern::check(p as *const u8, 4096, p as u64, t as u32);
                assert_eq!(bad, 0, "block {p:#x} corrupted");
                heap.free(p as *mut u8);
            }
        }
    }
    heap.trim();
    heap.buddy().assert_valid();
    assert_eq!(heap.buddy().available_pages(), pages);
}

/// The header word at `offset` (`offset_of!(HeapHeader, ..)`).
fn header_word(h: &HostHeap, offset: usize) -> u64 {
    // SAFETY: reading one word of our own heap's header.
    unsafe { std::ptr::read_volatile(h.mem.add(offset) as *const u64) }
}

fn heap_reserved(h: &HostHeap) -> u64 {
    header_word(h, std::mem::offset_of!(HeapHeader, reserved))
}

fn heap_used(h: &HostHeap) -> (u64, u64) {
    (
        header_word(h, std::mem::offset_of!(HeapHeader, used)),
        header_word(h, std::mem::offset_of!(HeapHeader, used_high)),
    )
}

/// INV(HP3): the header's `used` word follows this SM's live bytes in whole steps of the
/// heap's quantum (`Geometry::used_quantum_shift`, which `account_live` takes from the view's
/// lengths), and `used_high` keeps the highest.
#[test]
fn the_used_word_moves_by_whole_quanta() {
    let h = HostHeap::new(64 << 20, 2);
    let heap = h.heap();
    toga_kernels::platform::set_sm_id(0);
    let quantum = 1u64 << h.geometry.used_quantum_shift();
    let per = quantum / MAX_SMALL_SIZE as u64;
    let mut blocks = Vec::new();
    for step in 1..=3u64 {
        for _ in 0..per - 1 {
            blocks.push(heap.malloc(MAX_SMALL_SIZE));
        }
        assert_eq!(
            heap_used(&h).0,
            (step - 1) * quantum,
            "one block short of step {step}"
        );
        blocks.push(heap.malloc(MAX_SMALL_SIZE));
        assert_eq!(heap_used(&h).0, step * quantum, "step {step}");
    }
    for &p in &blocks {
        assert!(!p.is_null());
        // SAFETY: live blocks, freed once.
        unsafe { heap.free(p) };
    }
    assert_eq!(heap_used(&h), (0, 3 * quantum));
}

#[test]
fn calloc_and_realloc_keep_contents() {
    let h = HostHeap::new(8 << 20, 1);
    let heap = h.heap();
    let p = heap.calloc(100, 8);
    // SAFETY: `p` holds 800 zeroed bytes.
    unsafe {
        assert!(std::slice::from_raw_parts(p, 800).iter().all(|&b| b == 0));
        pattern::fill(p, 800, 7, 7);
        let q = heap.realloc(p, 20_000);
        assert!(!q.is_null());
        assert_eq!(pattern::check(q, 800, 7, 7), 0);
        let r = heap.realloc(q, 100);
        assert_eq!(pattern::check(r, 100, 7, 7), 0);
        assert!(heap.realloc(r, 0).is_null());
    }
    assert!(heap.calloc(usize::MAX, 2).is_null());
    assert_eq!(h.stat(stat::LIVE_BYTES), 0);
}

/// `DeviceHeap::trim` in a loop while threads allocate and free blocks of every size (small ones from
/// UAlloc, large ones from TBuddy, which are carved from the same pages as UAlloc's chunks):
/// empty bins and chunks go back to the buddy tree under the threads' feet. Patterns are
/// checked before every free and on kept blocks now and then (a chunk given back with a live
/// block in it shows up as corruption), the oracle catches overlap, and at the end the
/// statistics balance and a final trim leaves every page in the buddy tree.
#[test]
fn trim_races_mixed_mallocs_and_frees() {
    const THREADS: usize = 3;
    const STEPS: usize = 4000;
    const MAX_LIVE: usize = 48;
    // Stocked: the trims race the arenas' first adoptions for the spares too.
    let h = Arc::new(HostHeap::stocked(16 << 20, 2));
    let oracle: Arc<Mutex<BTreeMap<u64, u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let trimmer = {
        let (h, stop) = (h.clone(), stop.clone());
        std::thread::spawn(move || {
            let heap = h.heap();
            let (mut calls, mut work) = (0u64, 0u64);
            // One more trim after the workers stop, when every bin is empty: on a loaded
            // machine the scheduler may never run this thread while some bin is (seen on one
            // core: 1 run in 120 found nothing in 34,856 racing calls), and the count below
            // checks that trims give back, not how the threads were scheduled.
            loop {
                let last = stop.load(SeqCst);
                work += heap.trim() as u64;
                calls += 1;
                if last {
                    break;
                }
            }
            (calls, work)
        })
    };
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (h, oracle) = (h.clone(), oracle.clone());
            std::thread::spawn(move || {
                let heap = h.heap();
                let mut rng = 0x7219_0000 ^ ((t as u64 + 1) * 0x9E37_79B9);
                let mut live: Vec<(u64, u32, u64)> = Vec::new();
                let free = |(p, size, owner): (u64, u32, u64)| {
                    // SAFETY: a live block filled for `owner`.
                    let bad = unsafe { pattern::check(p as *const u8, size as usize, owner, 2) };
                    assert_eq!(bad, 0, "corrupted block at {p:#x}+{size}");
                    oracle.lock().unwrap().remove(&p).expect("unknown block");
                    // SAFETY: live block of this heap, freed once.
                    unsafe { heap.free(p as *mut u8) };
                };
                for step in 0..STEPS {
                    let r = xorshift(&mut rng);
                    if live.len() >= MAX_LIVE || (r.is_multiple_of(3) && !live.is_empty()) {
                        // Empty the list now and then, so bins go empty and get trimmed.
                        if r.is_multiple_of(17) {
                            live.drain(..).for_each(free);
                        } else {
                            free(live.swap_remove((r as usize / 3) % live.len()));
                        }
                        continue;
                    }
                    let size = match r % 16 {
                        0 => 4097 + (r >> 20) % (32 << 10),
                        1..=5 => 1 + (r >> 20) % 128,
                        _ => 1 + (r >> 20) % MAX_SMALL_SIZE as u64,
                    } as u32;
                    let p = heap.malloc(size as usize) as u64;
                    assert_ne!(p, 0, "malloc({size}) failed on a heap with room");
                    let owner = (t * STEPS + step) as u64;
                    {
                        let mut o = oracle.lock().unwrap();
                        if let Some((&q, &len)) = o.range(..=p).next_back() {
                            assert!(q + len <= p, "{p:#x} overlaps the live block {q:#x}+{len}");
                        }
                        if let Some((&q, _)) = o.range(p..).next() {
                            assert!(p + size as u64 <= q, "{p:#x}+{size} overlaps {q:#x}");
                        }
                        o.insert(p, size as u64);
                    }
                    // SAFETY: `p` holds `size` bytes.
                    unsafe { pattern::fill(p as *mut u8, size as usize, owner, 2) };
                    live.push((p, size, owner));
                    if step % 128 == 0 {
                        for &(q, len, owner) in &live {
                            // SAFETY: live blocks.
                            let bad =
                                unsafe { pattern::check(q as *const u8, len as usize, owner, 2) };
                            assert_eq!(bad, 0, "kept block at {q:#x}+{len} corrupted");
                        }
                    }
                }
                live.drain(..).for_each(free);
            })
        })
        .collect();
    handles.into_iter().for_each(|j| j.join().unwrap());
    stop.store(true, SeqCst);
    let (calls, work) = trimmer.join().unwrap();
    assert!(oracle.lock().unwrap().is_empty());
    assert!(work > 0, "trim found nothing to give back in {calls} calls");
    assert_eq!(h.stat(stat::MALLOCS), h.stat(stat::FREES));
    assert_eq!(h.stat(stat::FAILED), 0);
    assert_eq!(h.stat(stat::LIVE_BYTES), 0);
    assert_eq!(h.stat(stat::DOUBLE_FREES) + h.stat(stat::INVALID_FREES), 0);
    let heap = h.heap();
    heap.trim();
    heap.buddy().assert_valid();
    assert_eq!(heap.buddy().available_pages(), h.geometry.pages);
}

/// Threads that each ask for a large block at once, after small blocks filled the heap and
/// were freed without a trim: every request fits, so every one must succeed (each runs a trim
/// when the buddy tree is out of pages). Fails on 8ceb2b2: a thread whose `trim` finds the
/// arenas being trimmed by another skips them, gets 0, and `alloc_large` returns null while
/// the other thread's trim is handing the chunks back.
#[test]
fn concurrent_large_mallocs_after_small_frees_succeed() {
    const THREADS: usize = 3;
    const ROUNDS: usize = 20;
    let h = Arc::new(HostHeap::new(4 << 20, 2));
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        let heap = h.heap();
        let mut blocks = Vec::new();
        loop {
            let p = heap.malloc(64);
            if p.is_null() {
                break;
            }
            blocks.push(p);
        }
        for p in blocks {
            // SAFETY: live blocks, freed once.
            unsafe { heap.free(p) };
        }
        // A quarter of the heap each: three fit with room to spare.
        let size = (h.geometry.pages as usize * 4096) / 4;
        let start = Arc::new(Barrier::new(THREADS));
        let got: Vec<u64> = (0..THREADS)
            .map(|_| {
                let (h, start) = (h.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    h.heap().malloc(size) as u64
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|j| j.join().unwrap())
            .collect();
        for (t, &p) in got.iter().enumerate() {
            if p == 0 {
                failures.push((round, t));
            } else {
                // SAFETY: a live block, freed once.
                unsafe { heap.free(p as *mut u8) };
            }
        }
    }
    let heap = h.heap();
    heap.trim();
    heap.buddy().assert_valid();
    assert_eq!(heap.buddy().available_pages(), h.geometry.pages);
    assert!(
        failures.is_empty(),
        "large mallocs failed with the memory free: (round, thread) {failures:?}"
    );
}

/// `threads` threads start together and each mallocs up to `per` blocks of `size`, stopping at
/// the first null; once all are done they free what they got. Returns the blocks served.
fn malloc_then_free_in_threads(h: &Arc<HostHeap>, threads: usize, size: usize, per: u64) -> u64 {
    let barrier = Arc::new(Barrier::new(threads));
    (0..threads)
        .map(|_| {
            let (h, barrier) = (h.clone(), barrier.clone());
            std::thread::spawn(move || {
                let heap = h.heap();
                barrier.wait();
                let mut got = Vec::new();
                while (got.len() as u64) < per {
                    let p = heap.malloc(size);
                    if p.is_null() {
                        break;
                    }
                    got.push(p);
                }
                barrier.wait();
                for &p in &got {
                    // SAFETY: live blocks, freed once.
                    unsafe { heap.free(p) };
                }
                got.len() as u64
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|j| j.join().unwrap())
        .sum()
}

/// The storm sequence of `host stress`: for each size in turn, threads on every "SM" allocate
/// half the heap in blocks of that size, then free them all, with no trim in between. The
/// empty bins each size leaves behind must not keep the next size from its half.
#[test]
fn size_storms_in_turn_each_get_half_the_heap() {
    const THREADS: usize = 64;
    let h = Arc::new(HostHeap::new(32 << 20, 8));
    let data = h.geometry.pages * 4096;
    for size in [16u64, 64, 256, 1024, 4096, 16384] {
        let per = (data / 2 / size).min(1 << 20).div_ceil(THREADS as u64);
        let asked = per * THREADS as u64;
        let failed = asked - malloc_then_free_in_threads(&h, THREADS, size as usize, per);
        assert_eq!(failed, 0, "size {size}: {failed} of {asked} failed");
    }
    assert_eq!(h.stat(stat::LIVE_BYTES), 0);
}

/// The out-of-memory row of `host stress` after small blocks: threads on every "SM" fill most
/// of the heap with small blocks and free them (no trim), then all ask for TBuddy blocks at
/// once until malloc returns null. The empty bins must come back to the buddy tree under that
/// concurrent out-of-memory: nearly the whole heap is served, in each of three rounds.
#[test]
fn concurrent_oom_takes_back_empty_bins() {
    const THREADS: usize = 32;
    let h = Arc::new(HostHeap::new(32 << 20, 8));
    let data = h.geometry.pages * 4096;
    let per = |total: u64| total.div_ceil(THREADS as u64);
    for round in 0..3 {
        // Small blocks of two kinds fill most of the heap, then are freed (no trim).
        malloc_then_free_in_threads(&h, THREADS, 16, per(data / 8 / 16));
        malloc_then_free_in_threads(&h, THREADS, 1024, per(data / 2 / 1024));
        let big = 64 << 10;
        let got = malloc_then_free_in_threads(&h, THREADS, big, u64::MAX) * big as u64;
        assert!(
            got * 100 >= data * 95,
            "round {round}: {got} of {data} bytes served in 64 KiB blocks"
        );
    }
    assert_eq!(h.stat(stat::LIVE_BYTES), 0);
}

/// The sizes of `uniform_sizes` in the harness: `n` sizes uniform over `lo..=hi`.
fn uniform(n: usize, lo: u32, hi: u32, seed: u64) -> Vec<u32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| lo + (xorshift(&mut x) % (hi - lo + 1) as u64) as u32)
        .collect()
}

/// One fill round as a GPU would run it, played on this thread: request `i` belongs to block
/// `i / 256`, block `b` runs on SM `b % sms`, and the SMs take their requests in turn (all of
/// them start together, as on the GPU). Returns the heap's live bytes over its data bytes.
fn fill_as_a_gpu_would(h: &HostHeap, sizes: &[u32], sms: u32, live: &mut Vec<u64>) -> f64 {
    let heap = h.heap();
    let mut queues: Vec<Vec<usize>> = vec![Vec::new(); sms as usize];
    for i in 0..sizes.len() {
        queues[(i / 256) % sms as usize].push(i);
    }
    let longest = queues.iter().map(Vec::len).max().unwrap_or(0);
    for t in 0..longest {
        for (sm, queue) in queues.iter().enumerate() {
            if let Some(&i) = queue.get(t) {
                toga_kernels::platform::set_sm_id(sm as u32);
                let p = heap.malloc(sizes[i] as usize);
                if !p.is_null() {
                    live.push(p as u64);
                }
            }
        }
    }
    h.stat(stat::LIVE_BYTES) as f64 / h.geometry.data_bytes() as f64
}

/// INV(UA16), measured as the GPU bench measures it: a fill of requests uniform over
/// 16 – 4096 B totalling twice the heap, played as 132 SMs would run it, serves at least 88%
/// of an 8 MiB heap and 95% of a 64 MiB one, round after round. Each SM carving its own bin of
/// every class served 69% and 55% here (132 partly used bins of 104 KB per class).
#[test]
fn mixed_fills_of_small_heaps_leave_little_in_partly_used_bins() {
    const SMS: u32 = 132;
    for (mib, floor) in [(8u64, 88.0), (64, 95.0)] {
        let h = HostHeap::new(mib << 20, SMS as u64);
        // Requests totalling about twice the heap (mean block about 2.7 KB once rounded).
        let sizes = uniform(((mib << 21) / 2730) as usize, 16, 4096, 0x5EED);
        for round in 0..2 {
            let mut live = Vec::new();
            let served = fill_as_a_gpu_would(&h, &sizes, SMS, &mut live) * 100.0;
            eprintln!("{mib} MiB, round {round}: {served:.1}% served");
            assert!(
                served >= floor,
                "{mib} MiB, round {round}: {served:.1}% of the heap served, below {floor}%"
            );
            for p in live {
                // SAFETY: live blocks of this heap, freed once.
                unsafe { h.heap().free(p as *mut u8) };
            }
            assert_eq!(h.stat(stat::LIVE_BYTES), 0);
        }
        h.heap().trim();
        h.heap().buddy().assert_valid();
        assert_eq!(h.heap().buddy().free_pages(), h.geometry.pages);
    }
}

/// Lone lanes' large blocks of the orders that runs serve (`tbuddy::run`), 4–16 KiB, from
/// four threads on two SMs (two threads share each run), with frees on other threads and a
/// trim racing them all: every block is disjoint and intact (oracle), each round fills the
/// heap until null and serves at least 90% of it (runs hold nothing back from a request that
/// needs it, INV(TB14)), and after the last round a trim gives every page back.
#[test]
fn runs_of_large_blocks_race_trims_and_give_back_every_block() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 6;
    let h = Arc::new(HostHeap::new(8 << 20, 2));
    let oracle: Arc<Mutex<BTreeMap<u64, u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let trimmer = {
        let (h, stop) = (h.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut work = 0u64;
            while !stop.load(SeqCst) {
                work += h.heap().trim() as u64;
            }
            work
        })
    };
    for round in 0..ROUNDS {
        let start = Arc::new(Barrier::new(THREADS));
        let kept: Vec<Vec<(u64, u32, u64)>> = (0..THREADS)
            .map(|t| {
                let (h, oracle, start) = (h.clone(), oracle.clone(), start.clone());
                std::thread::spawn(move || {
                    toga_kernels::platform::set_sm_id(t as u32 % 2);
                    let heap = h.heap();
                    let mut rng = 0x51ED_2701 ^ (((round * THREADS + t) as u64 + 1) * 0x9E37_79B9);
                    let mut live = Vec::new();
                    start.wait();
                    for step in 0.. {
                        let r = xorshift(&mut rng);
                        let size = (MAX_SMALL_SIZE as u64 + 1 + (r >> 20) % (12 << 10)) as u32;
                        let p = heap.malloc(size as usize) as u64;
                        if p == 0 {
                            break;
                        }
                        {
                            let mut o = oracle.lock().unwrap();
                            if let Some((&q, &len)) = o.range(..=p).next_back() {
                                assert!(q + len <= p, "{p:#x} overlaps {q:#x}+{len}");
                            }
                            if let Some((&q, _)) = o.range(p..).next() {
                                assert!(p + size as u64 <= q, "{p:#x}+{size} overlaps {q:#x}");
                            }
                            o.insert(p, size as u64);
                        }
                        let owner = ((round * THREADS + t) << 20 | step) as u64;
                        // SAFETY: `p` holds `size` bytes.
                        unsafe { pattern::fill(p as *mut u8, size as usize, owner, 1) };
                        live.push((p, size, owner));
                    }
                    live
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|j| j.join().unwrap())
            .collect();
        // Blocks of at most 16 KiB in 4–16 KiB requests: served bytes count whole blocks.
        let served: u64 = kept
            .iter()
            .flatten()
            .map(|&(_, size, _)| (size as u64).next_power_of_two())
            .sum();
        let heap_bytes = h.geometry.pages * 4096;
        assert!(
            served * 10 >= heap_bytes * 9,
            "round {round}: {served} of {heap_bytes} bytes served before null"
        );
        // Free each thread's blocks on the next thread's SM.
        let frees: Vec<_> = kept
            .into_iter()
            .enumerate()
            .map(|(t, blocks)| {
                let (h, oracle) = (h.clone(), oracle.clone());
                std::thread::spawn(move || {
                    toga_kernels::platform::set_sm_id((t as u32 + 1) % 2);
                    for (p, size, owner) in blocks {
                        // SAFETY: a live block filled for `owner`, freed once.
                        unsafe {
                            assert_eq!(
                                pattern::check(p as *const u8, size as usize, owner, 1),
                                0,
                                "corrupted block at {p:#x}"
                            );
                            oracle.lock().unwrap().remove(&p).unwrap();
                            h.heap().free(p as *mut u8);
                        }
                    }
                })
            })
            .collect();
        for f in frees {
            f.join().unwrap();
        }
    }
    stop.store(true, SeqCst);
    trimmer.join().unwrap();
    let heap = h.heap();
    // The last round's frees may still wait in the stashes (INV(HP6)), whose blocks a lane
    // asked to stock takes instead of stocking: a trim first, so that the runs below stock.
    heap.trim();
    // Runs left partly used: the stockers' first blocks and two more of each run.
    for sm in 0..2 {
        toga_kernels::platform::set_sm_id(sm);
        for size in [5000, 5000, 5000, 9000, 9000, 9000] {
            let p = heap.malloc(size);
            assert!(!p.is_null());
            // SAFETY: a live block, freed once.
            unsafe { heap.free(p) };
        }
    }
    assert!(heap_reserved(&h) > 0, "the runs hold blocks nobody took");
    assert_eq!(h.stat(stat::LIVE_BYTES), 0);
    assert_eq!(h.stat(stat::DOUBLE_FREES) + h.stat(stat::INVALID_FREES), 0);
    heap.trim();
    heap.buddy().assert_valid();
    assert_eq!(heap.buddy().available_pages(), h.geometry.pages);
    assert_eq!(heap_reserved(&h), 0, "a trim took every run back");
}

/// A small fill takes back what the runs of large blocks hold (INV(TB14)): both SMs' runs
/// hold 15 blocks of 8 KiB and 15 of 16 KiB (a third of a 2 MiB heap), then 64 B blocks
/// fill the heap until null. The refill out of chunks trims, the trim flushes the
/// runs, and the fill serves what a heap without runs would.
#[test]
fn small_fills_take_back_what_the_runs_hold() {
    let h = HostHeap::new(2 << 20, 2);
    let heap = h.heap();
    // The same fill with no run stocked.
    toga_kernels::platform::set_sm_id(0);
    let plain = fill_until_null(&heap, 64);
    free_all(&heap, &plain);
    heap.trim();
    // Every block is freed after both SMs stocked their runs: a freed block waits in its
    // order's stash (INV(HP6)), and the other SM's first take would serve it from there
    // instead of stocking.
    let mut large = Vec::new();
    for sm in 0..2 {
        toga_kernels::platform::set_sm_id(sm);
        for size in [5000, 9000] {
            let p = heap.malloc(size);
            assert!(!p.is_null());
            large.push(p);
        }
    }
    for p in large {
        // SAFETY: a live block, freed once.
        unsafe { heap.free(p) };
    }
    let (b8, b16) = (heap.run_blocks(1) as u64, heap.run_blocks(2) as u64);
    assert!(b8 >= 4 && b16 >= 4, "this heap has runs of both orders");
    assert_eq!(
        heap_reserved(&h),
        (2 * ((b8 - 1) * 8 + (b16 - 1) * 16)) << 10,
        "each run holds all but one of its blocks"
    );
    toga_kernels::platform::set_sm_id(0);
    let blocks = fill_until_null(&heap, 64);
    assert!(
        blocks.len() >= plain.len(),
        "{} blocks of 64 B with runs stocked, {} without",
        blocks.len(),
        plain.len()
    );
    free_all(&heap, &blocks);
    heap.trim();
    heap.buddy().assert_valid();
    assert_eq!(heap.buddy().available_pages(), h.geometry.pages);
}
