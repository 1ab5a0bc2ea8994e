//! `host scan`: one `malloc` kernel and one `free` kernel per (size, thread count), smallest
//! first, each on a fresh heap and each with its own time limit, polling a CUDA event instead of
//! blocking. It shows where the allocator stops scaling (or stops finishing) without hanging the
//! session on the first stuck kernel.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaStream, sys};
use toga::{Gpu, Heap};
use toga_harness::Workloads;

use crate::exit;

const SIZES: [u32; 6] = [16, 256, 2048, 4096, 65536, 1 << 20];
/// How long one kernel may take before the scan gives up.
const KERNEL_LIMIT: Duration = Duration::from_secs(10);

/// Wait for the work enqueued so far on `stream`; `Ok(None)` if it did not finish in time.
/// Returns the GPU time since `start` in milliseconds.
fn finish(
    stream: &Arc<CudaStream>,
    start: &cudarc::driver::CudaEvent,
) -> toga::Result<Option<f32>> {
    let end = stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
    let t0 = Instant::now();
    while !end.try_is_complete()? {
        if t0.elapsed() > KERNEL_LIMIT {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(Some(start.elapsed_ms(&end)?))
}

/// What a stuck kernel leaves to look at: a non-blocking stream and pinned memory, made
/// before the kernel starts (allocating pinned memory may wait for the device).
struct Probe {
    side: sys::CUstream,
    host: *mut u8,
    bytes: usize,
}

impl Probe {
    fn new(heap: &Heap) -> toga::Result<Self> {
        use toga_kernels::heap::HeapHeader;
        let g = heap.geometry();
        let arena_bytes = std::mem::size_of::<toga_kernels::ualloc::Arena>();
        let bytes = (g.arenas_offset as usize + g.arenas as usize * arena_bytes)
            .max(std::mem::size_of::<HeapHeader>())
            .max((g.nodes_offset + 4 * g.node_words) as usize);
        let mut side: sys::CUstream = std::ptr::null_mut();
        let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: plain driver calls on the current context.
        unsafe {
            check(sys::cuStreamCreate(
                &mut side,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            ))?;
            check(sys::cuMemAllocHost_v2(&mut host, bytes))?;
        }
        Ok(Self {
            side,
            host: host.cast(),
            bytes,
        })
    }

    /// Copy the heap's header and arenas beside the stuck kernel and print each buddy order's
    /// semaphore `C/E/R` (available, promised, reserved), the free-page counter, and the
    /// arenas with waiters or held locks; plus how many threads wrote their result to `ptrs`.
    /// The memory is left to the process's end (freeing pinned memory may wait for the
    /// device).
    fn print(&self, heap: &Heap, ptrs: &cudarc::driver::CudaSlice<u64>) -> toga::Result<()> {
        use cudarc::driver::DevicePtr;
        use toga_kernels::heap::HeapHeader;
        let n = ptrs.len();
        let mut results = vec![0u64; n];
        let (ptrs_dev, _guard) = ptrs.device_ptr(ptrs.stream());
        // SAFETY: `host` holds `bytes` bytes and the heap's header and arenas lie at its base;
        // `results` holds `n` words, as does `ptrs`.
        unsafe {
            check(sys::cuMemcpyDtoHAsync_v2(
                self.host.cast(),
                heap.base(),
                self.bytes,
                self.side,
            ))?;
            check(sys::cuMemcpyDtoHAsync_v2(
                results.as_mut_ptr().cast(),
                ptrs_dev,
                n * 8,
                self.side,
            ))?;
        }
        let t0 = Instant::now();
        // SAFETY: a query of our own stream.
        while unsafe { sys::cuStreamQuery(self.side) } != sys::CUresult::CUDA_SUCCESS {
            if t0.elapsed() > Duration::from_secs(5) {
                println!("  (the copy beside the stuck kernel did not finish either)");
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: the copy finished; HeapHeader is plain integer words, any bit pattern is valid.
        let raw = unsafe { std::slice::from_raw_parts(self.host, self.bytes) };
        let header: HeapHeader = unsafe { std::ptr::read_unaligned(raw.as_ptr().cast()) };
        let g = heap.geometry();
        let orders = g.max_order as u32;
        let line: Vec<String> = (0..=orders)
            .map(|o| {
                let (c, e, r) = header.buddy.semaphore(o).counters();
                format!("{o}:{c}/{e}/{r}")
            })
            .collect();
        println!("  buddy semaphores (order:C/E/R): {}", line.join(" "));
        // SAFETY: the copy holds the node words at `nodes_offset` (see `new`); host atomics
        // have the layout of the integers.
        let nodes = unsafe {
            std::slice::from_raw_parts(
                raw.as_ptr().add(g.nodes_offset as usize)
                    as *const toga_kernels::platform::Atomic32,
                g.node_words as usize,
            )
        };
        println!(
            "  buddy nodes (order:Available/index bits/locked): {}",
            toga_kernels::tbuddy::TBuddy::new(&header.buddy, nodes).census()
        );
        println!(
            "  free pages: {}; threads done: {} non-null of {n} (results still 0 include unfinished threads)",
            header.buddy.free_pages(),
            results.iter().filter(|&&p| p != 0).count()
        );
        print_arenas(
            &raw[g.arenas_offset as usize..],
            g.arenas as usize,
            std::mem::size_of::<toga_kernels::ualloc::Arena>(),
        );
        Ok(())
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        // SAFETY: made in `new`; only dropped when no kernel is stuck (see `print`'s callers).
        unsafe {
            sys::cuMemFreeHost(self.host.cast());
            sys::cuStreamDestroy_v2(self.side);
        }
    }
}

/// A kernel is stuck: end the process now, with [`exit::TIMEOUT`]. Dropping the heap or the
/// context would wait for the kernel forever.
fn stuck() -> ! {
    println!("scan: a kernel is stuck; exiting without waiting for it");
    eprintln!(
        "host: a kernel did not finish within {} s (scan's limit per kernel)",
        KERNEL_LIMIT.as_secs()
    );
    std::process::exit(exit::TIMEOUT as i32)
}

fn check(r: sys::CUresult) -> toga::Result<()> {
    r.result().map_err(toga::Error::from)
}

/// The arenas' words that say who waits for what (see `ualloc/arena.rs`: every field on its own
/// 128-byte line: 4 lines of SRCU, then per class a semaphore line and a list line, then per
/// kind a semaphore line and a chunk-list line). Prints arenas with promises, reservations or
/// held locks.
fn print_arenas(raw: &[u8], arenas: usize, arena_bytes: usize) {
    use toga_kernels::bulk_semaphore::{Fields, PerSm};
    let word = |at: usize| u64::from_le_bytes(raw[at..at + 8].try_into().unwrap());
    let word32 = |at: usize| u32::from_le_bytes(raw[at..at + 4].try_into().unwrap());
    let sem = |at: usize| Fields::<PerSm>::decode(word(at));
    const LINE: usize = 128;
    let classes = toga_kernels::size_class::NUM_CLASSES;
    for a in 0..arenas {
        let base = a * arena_bytes;
        let rcu: Vec<u32> = (0..4).map(|l| word32(base + l * LINE)).collect();
        let mut parts = Vec::new();
        for c in 0..classes {
            let line = base + (4 + 2 * c) * LINE;
            let (sc, se, sr) = sem(line);
            let lock = word32(line + LINE + 8);
            if se != 0 || sr != 0 || lock != 0 {
                parts.push(format!("class{c} slots {sc}/{se}/{sr} lock {lock}"));
            }
        }
        for k in 0..2 {
            let line = base + (4 + 2 * classes + 2 * k) * LINE;
            let (bc, be, br) = sem(line);
            let count = word32(line + LINE + 16);
            let lock = word32(line + LINE + 20);
            if be != 0 || br != 0 || lock != 0 {
                parts.push(format!(
                    "kind{k} bins {bc}/{be}/{br} chunks {count} lock {lock}"
                ));
            }
        }
        if !parts.is_empty() {
            println!("  arena {a}: rcu {rcu:?} {}", parts.join("; "));
        }
    }
}

/// Out of memory and back, twice: `2k` one-page requests on a heap of `k` pages; exactly `k`
/// must succeed (the line says how many did). A kernel that does not finish ends the process.
fn exhaust(gpu: &Gpu, w: &Workloads, stream: &Arc<CudaStream>) -> toga::Result<()> {
    let capacity = 64u64 << 20;
    let k = capacity / 4096;
    let heap = Heap::new(gpu, stream, capacity)?;
    let mut ptrs = stream.alloc_zeros::<u64>(2 * k as usize)?;
    let probe = Probe::new(&heap)?;
    for round in 0..2 {
        stream.synchronize()?;
        let start = stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        w.malloc(stream, Some(&heap), &mut ptrs, 4096)?;
        let Some(malloc_ms) = finish(stream, &start)? else {
            println!("  exhaustion round {round}: malloc kernel did not finish");
            probe.print(&heap, &ptrs)?;
            stuck();
        };
        let got = stream
            .clone_dtoh(&ptrs)?
            .iter()
            .filter(|&&p| p != 0)
            .count();
        let start = stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        w.free(stream, Some(&heap), &ptrs)?;
        let Some(free_ms) = finish(stream, &start)? else {
            println!("  exhaustion round {round}: free kernel did not finish");
            probe.print(&heap, &ptrs)?;
            stuck();
        };
        println!(
            "  exhaustion round {round}: {} x 4096 B on {k} pages: {got} succeeded (want {k}); malloc {malloc_ms:.3} ms, free {free_ms:.3} ms",
            2 * k
        );
    }
    Ok(())
}

/// Print the scan. The first kernel that does not finish within [`KERNEL_LIMIT`] ends the
/// process with [`exit::TIMEOUT`], after what the heap shows (the GPU is still running it).
/// `Ok(true)` otherwise: the scan times, it does not verify.
pub fn run(
    gpu: &Gpu,
    heap_size: u64,
    threads: u64,
    sizes: &[u32],
    exhaustion: bool,
) -> toga::Result<bool> {
    let sizes = if sizes.is_empty() { &SIZES[..] } else { sizes };
    let stream = gpu.default_stream();
    let w = Workloads::new(gpu)?;
    println!(
        "{} — fresh {} MiB heap per row; limit {} s per kernel",
        gpu.info().name,
        heap_size >> 20,
        KERNEL_LIMIT.as_secs()
    );
    println!(
        "{:>8} {:>9} {:>12} {:>12} {:>9} {:>12}",
        "size", "threads", "malloc ms", "free ms", "failed", "reserved MiB"
    );
    if exhaustion {
        exhaust(gpu, &w, &stream)?;
    }
    let max_log = 63 - threads.leading_zeros();
    for &size in sizes {
        for log in (8..=max_log).step_by(2) {
            let n = 1u64 << log;
            let heap = Heap::new(gpu, &stream, heap_size)?;
            let mut ptrs = stream.alloc_zeros::<u64>(n as usize)?;
            let probe = Probe::new(&heap)?;
            stream.synchronize()?;
            let start = stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            w.malloc(&stream, Some(&heap), &mut ptrs, size)?;
            let Some(malloc_ms) = finish(&stream, &start)? else {
                println!(
                    "{size:>8} {n:>9}  malloc kernel did not finish within {} s",
                    KERNEL_LIMIT.as_secs()
                );
                probe.print(&heap, &ptrs)?;
                stuck();
            };
            let failed = stream
                .clone_dtoh(&ptrs)?
                .iter()
                .filter(|&&p| p == 0)
                .count();
            let reserved_mib = heap.stats(&stream)?.reserved_bytes as f64 / (1u64 << 20) as f64;
            let start = stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            w.free(&stream, Some(&heap), &ptrs)?;
            let Some(free_ms) = finish(&stream, &start)? else {
                println!(
                    "{size:>8} {n:>9} {malloc_ms:>12.4}  free kernel did not finish within {} s",
                    KERNEL_LIMIT.as_secs()
                );
                probe.print(&heap, &ptrs)?;
                stuck();
            };
            println!(
                "{size:>8} {n:>9} {malloc_ms:>12.4} {free_ms:>12.4} {failed:>9} {reserved_mib:>12.1}"
            );
        }
    }
    Ok(true)
}
