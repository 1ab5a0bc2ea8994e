//! Stream-ordered allocation from the host: [`Heap::alloc_async`], [`Heap::free_async`] and
//! their batched forms, the analogue of `cudaMallocFromPoolAsync` / `cudaFreeAsync` for a
//! toga heap (`docs/host-api.md`).
//!
//! Each call enqueues a small kernel that runs the heap's own `malloc` or `free`, so a block
//! the host allocates is an ordinary block of the heap: a kernel may `free` it, the host may
//! `free_async` a block a kernel allocated, and [`Heap::stats`] counts both sides.
//!
//! The host does not know a block's address until that kernel has run. [`Heap::alloc_async`]
//! therefore returns a [`HostBlock`]: the device address of a slot (one `u64`) that the kernel
//! fills with the block's pointer. Work enqueued after it on the same stream reads the slot
//! ([`HostBlock::slot`]); [`HostBlock::address`] waits for the stream and returns the pointer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg, sys,
};

use super::{Heap, check};
use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// Slots per piece of slot memory (one `cuMemAlloc` of 32 KiB each).
const SLOTS_PER_PIECE: u64 = 4096;

/// One thread: the launch of the single-block kernels.
const ONE_THREAD: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (1, 1, 1),
    shared_mem_bytes: 0,
};

/// The kernels of `kernels/src/entry/host_ops.rs`.
struct Kernels {
    malloc: CudaFunction,
    malloc_batch: CudaFunction,
    free: CudaFunction,
    free_batch: CudaFunction,
}

/// The host-allocation state of a heap (a field of [`Heap`]).
pub(crate) struct HostOps {
    kernels: Option<Kernels>,
    shared: Arc<Shared>,
}

/// What a heap shares with its [`HostBlock`]s: the slot memory outlives the heap while a
/// handle still points into it, and `alive` says whether the heap does.
struct Shared {
    alive: AtomicBool,
    ctx: Arc<CudaContext>,
    slots: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    /// Device memory of `SLOTS_PER_PIECE` slots each.
    pieces: Vec<u64>,
    /// Slots handed out of the newest piece.
    used_in_last: u64,
    /// Slots given back by `free_async`, per stream (keyed by its `CUstream`). A slot freed on
    /// stream S is reused only by an `alloc_async` on S, whose kernel runs after the free's
    /// kernel read it. The stream is kept alive here so that its handle is never reused by a
    /// new stream while those kernels may be pending.
    free: HashMap<usize, (Arc<CudaStream>, Vec<u64>)>,
}

// SAFETY: the raw device addresses are plain integers; every use is under the mutex or after
// it, with the context bound.
unsafe impl Send for Slots {}

impl HostOps {
    /// Load the kernels from `gpu`'s module (`None` for a module built before they existed:
    /// every host allocation then fails with [`Error::MissingKernel`]).
    pub(crate) fn load(gpu: &Gpu) -> Self {
        let f = |name| gpu.function(name).ok();
        let kernels = match (
            f("toga_host_malloc"),
            f("toga_host_malloc_batch"),
            f("toga_host_free"),
            f("toga_host_free_batch"),
        ) {
            (Some(malloc), Some(malloc_batch), Some(free), Some(free_batch)) => Some(Kernels {
                malloc,
                malloc_batch,
                free,
                free_batch,
            }),
            _ => None,
        };
        Self {
            kernels,
            shared: Arc::new(Shared {
                alive: AtomicBool::new(true),
                ctx: gpu.context().clone(),
                slots: Mutex::new(Slots::default()),
            }),
        }
    }

    fn kernels(&self) -> Result<&Kernels> {
        self.kernels
            .as_ref()
            .ok_or(Error::MissingKernel("toga_host_malloc"))
    }
}

impl Drop for HostOps {
    fn drop(&mut self) {
        self.shared.alive.store(false, Ordering::Release);
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let pieces = std::mem::take(&mut self.slots.get_mut().unwrap().pieces);
        if pieces.is_empty() {
            return;
        }
        let _ = self.ctx.bind_to_thread();
        for p in pieces {
            // SAFETY: ours, from `cuMemAlloc`; `cuMemFree` waits for the kernels that use it.
            unsafe { sys::cuMemFree_v2(p) };
        }
    }
}

impl Slots {
    /// A slot for an allocation on `stream`: one this stream freed, else a fresh one.
    fn take(&mut self, ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>) -> Result<u64> {
        if let Some((_, list)) = self.free.get_mut(&(stream.cu_stream() as usize))
            && let Some(slot) = list.pop()
        {
            return Ok(slot);
        }
        if self.pieces.is_empty() || self.used_in_last == SLOTS_PER_PIECE {
            ctx.bind_to_thread()?;
            let bytes = (SLOTS_PER_PIECE * 8) as usize;
            let mut p = 0;
            // SAFETY: writes one device pointer.
            check(unsafe { sys::cuMemAlloc_v2(&mut p, bytes) })?;
            // Zeroed before any slot is handed out, on a stream of its own that is waited
            // for: a `free_async` misordered before its block's allocation then reads null (a
            // no-op) rather than garbage. (A slot given back holds null too: the free's kernel
            // clears it.)
            let zeroed = ctx.new_stream().map_err(Error::from).and_then(|s| {
                // SAFETY: the piece is ours, `bytes` long.
                check(unsafe { sys::cuMemsetD8Async(p, 0, bytes, s.cu_stream()) })?;
                s.synchronize().map_err(Error::from)
            });
            if let Err(e) = zeroed {
                // SAFETY: ours, unused.
                unsafe { sys::cuMemFree_v2(p) };
                return Err(e);
            }
            self.pieces.push(p);
            self.used_in_last = 0;
        }
        let slot = self.pieces.last().unwrap() + 8 * self.used_in_last;
        self.used_in_last += 1;
        Ok(slot)
    }

    /// `slot` is free once the work enqueued on `stream` so far has run.
    fn give_back(&mut self, stream: &Arc<CudaStream>, slot: u64) {
        self.free
            .entry(stream.cu_stream() as usize)
            .or_insert_with(|| (stream.clone(), Vec::new()))
            .1
            .push(slot);
    }
}

/// A block that [`Heap::alloc_async`] enqueued: the device address of the slot its pointer
/// lands in, and the bytes asked for.
///
/// Give it back with [`Heap::free_async`] (or let a kernel `free` the pointer it reads from the
/// slot, and drop the handle). A handle dropped without either leaks its block, as a pointer
/// from `cudaMallocAsync` that is never freed does.
#[must_use = "a block that is neither freed nor handed to a kernel leaks"]
pub struct HostBlock {
    slot: u64,
    bytes: u64,
    heap: u64,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for HostBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBlock")
            .field("slot", &format_args!("{:#x}", self.slot))
            .field("bytes", &self.bytes)
            .field("heap", &format_args!("{:#x}", self.heap))
            .finish()
    }
}

impl HostBlock {
    /// The device address of the `u64` that holds the block's pointer once the allocating
    /// kernel has run (null if the heap had no such block). Kernels ordered after the
    /// `alloc_async` read the pointer from here; the slot stays valid until the block is given
    /// to [`Heap::free_async`].
    pub fn slot(&self) -> u64 {
        self.slot
    }

    /// The bytes asked for.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Wait for `stream` (the allocating one, or one ordered after it) and return the block's
    /// device address. [`Error::OutOfMemory`] when the heap had no such block,
    /// [`Error::HeapDestroyed`] when the heap is gone.
    pub fn address(&self, stream: &Arc<CudaStream>) -> Result<u64> {
        if !self.shared.alive.load(Ordering::Acquire) {
            return Err(Error::HeapDestroyed);
        }
        let mut p = 0u64;
        stream.context().bind_to_thread()?;
        // SAFETY: one word of our slot memory into `p`, which lives across the synchronize.
        check(unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                &mut p as *mut u64 as *mut _,
                self.slot,
                8,
                stream.cu_stream(),
            )
        })?;
        stream.synchronize()?;
        if p == 0 {
            return Err(Error::OutOfMemory { bytes: self.bytes });
        }
        Ok(p)
    }
}

/// What [`Heap::free_async`] frees: a [`HostBlock`] (its pointer is read from its slot on the
/// device, so the host need not know it), or a device pointer a kernel allocated.
#[derive(Debug)]
pub enum Freeable {
    /// A block from [`Heap::alloc_async`].
    Block(HostBlock),
    /// A block's device address (from a kernel's `malloc`, or [`HostBlock::address`]). Null
    /// is a no-op, as `free(null)` is.
    Ptr(u64),
}

impl From<HostBlock> for Freeable {
    fn from(b: HostBlock) -> Self {
        Self::Block(b)
    }
}

impl From<u64> for Freeable {
    fn from(p: u64) -> Self {
        Self::Ptr(p)
    }
}

impl Heap {
    /// The heap's device ordinal.
    pub fn device(&self) -> usize {
        self.stream.context().ordinal()
    }

    /// Refuse work for this heap on a stream of another device (INV: only the heap's own
    /// device runs its `malloc` and `free`; `docs/host-api.md`, "Other GPUs").
    pub(super) fn check_device(&self, stream: &Arc<CudaStream>) -> Result<()> {
        let (heap_device, stream_device) = (self.device(), stream.context().ordinal());
        if heap_device != stream_device {
            return Err(Error::WrongDevice {
                heap_device,
                stream_device,
            });
        }
        Ok(())
    }

    /// The data region: `start..end` device addresses.
    fn data_range(&self) -> (u64, u64) {
        let start = self.base + self.geometry.data_offset;
        (start, start + self.geometry.data_bytes())
    }

    fn check_size(&self, bytes: u64) -> Result<()> {
        if bytes == 0 {
            return Err(Error::ZeroSizeAllocation);
        }
        let limit = self.geometry.data_bytes();
        if bytes > limit {
            return Err(Error::AllocationTooLarge {
                requested: bytes,
                limit,
            });
        }
        Ok(())
    }

    /// Allocate `bytes` from the heap in order on `stream`, like `cudaMallocFromPoolAsync`:
    /// work enqueued on `stream` after this call may use the block, through the pointer in
    /// [`HostBlock::slot`]; [`HostBlock::address`] waits and returns it. The block is an
    /// ordinary block of the heap: a kernel may free it.
    ///
    /// Refused at once: 0 bytes ([`Error::ZeroSizeAllocation`]), more than the heap can hold
    /// ([`Error::AllocationTooLarge`]), a stream of another device ([`Error::WrongDevice`]).
    /// A heap out of memory leaves null in the slot ([`Error::OutOfMemory`] from `address`);
    /// a growable heap first grows, as for a kernel's `malloc`.
    pub fn alloc_async(&self, bytes: u64, stream: &Arc<CudaStream>) -> Result<HostBlock> {
        let k = self.host.kernels()?;
        self.check_device(stream)?;
        self.check_size(bytes)?;
        let shared = &self.host.shared;
        let mut slots = shared.slots.lock().unwrap();
        let slot = slots.take(&shared.ctx, stream)?;
        // SAFETY: the kernel writes one word at `slot`, ours; the heap outlives the launch.
        let launched = unsafe {
            stream
                .launch_builder(&k.malloc)
                .arg(&self.base)
                .arg(&bytes)
                .arg(&slot)
                .launch(ONE_THREAD)
        };
        if let Err(e) = launched {
            slots.give_back(stream, slot);
            return Err(e.into());
        }
        Ok(HostBlock {
            slot,
            bytes,
            heap: self.base,
            shared: shared.clone(),
        })
    }

    /// Free a block after the work enqueued on `stream` before this call, like
    /// `cudaFreeAsync`: a [`HostBlock`] (whose pointer the kernel reads from its slot) or the
    /// device address of any block of this heap, whichever side allocated it. As with
    /// `cudaFreeAsync`, `stream` must be ordered after the block's allocation and every use
    /// of it (the same stream, or an event).
    ///
    /// A pointer outside the heap's data region is refused at once with
    /// [`Error::ForeignPointer`], and counted in [`HeapStats::invalid_frees`] as a kernel's
    /// foreign free is. One inside it that is not a live block's start, or one freed already,
    /// can only be told by the device: the kernel counts it (`invalid_frees`,
    /// `double_frees`) and changes nothing. A [`HostBlock`] cannot be freed twice: this
    /// takes it.
    ///
    /// [`HeapStats::invalid_frees`]: super::HeapStats::invalid_frees
    pub fn free_async(&self, block: impl Into<Freeable>, stream: &Arc<CudaStream>) -> Result<()> {
        let k = self.host.kernels()?;
        self.check_device(stream)?;
        match block.into() {
            Freeable::Block(b) => {
                if b.heap != self.base || !Arc::ptr_eq(&b.shared, &self.host.shared) {
                    return Err(Error::WrongHeap {
                        block_heap: b.heap,
                        heap: self.base,
                    });
                }
                // SAFETY: the kernel reads and clears the slot, ours, and frees what it held.
                unsafe {
                    stream
                        .launch_builder(&k.free)
                        .arg(&self.base)
                        .arg(&0u64)
                        .arg(&b.slot)
                        .launch(ONE_THREAD)?;
                }
                self.host
                    .shared
                    .slots
                    .lock()
                    .unwrap()
                    .give_back(stream, b.slot);
                Ok(())
            }
            Freeable::Ptr(0) => Ok(()),
            Freeable::Ptr(p) => {
                // SAFETY: `free` checks the pointer against the heap before it reads anything
                // (a pointer outside the data region is only counted).
                unsafe {
                    stream
                        .launch_builder(&k.free)
                        .arg(&self.base)
                        .arg(&p)
                        .arg(&0u64)
                        .launch(ONE_THREAD)?;
                }
                let (start, end) = self.data_range();
                if !(start..end).contains(&p) {
                    return Err(Error::ForeignPointer { ptr: p, start, end });
                }
                Ok(())
            }
        }
    }

    /// Allocate one block per element of `sizes` in order on `stream`: `out[i]` gets the
    /// pointer for `sizes[i]` bytes (null where the heap had none, or for a size of 0, which
    /// the heap counts as a failed allocation). `out` must be at least as long as `sizes`.
    pub fn alloc_async_batch(
        &self,
        sizes: &CudaSlice<u64>,
        out: &mut CudaSlice<u64>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let k = self.host.kernels()?;
        self.check_device(stream)?;
        let n = sizes.len() as u64;
        if out.len() < sizes.len() {
            return Err(Error::BadBatch(format!(
                "alloc_async_batch: {} sizes but room for {} pointers",
                sizes.len(),
                out.len()
            )));
        }
        if n == 0 {
            return Ok(());
        }
        // SAFETY: `sizes` and `out` hold at least `n` words.
        unsafe {
            stream
                .launch_builder(&k.malloc_batch)
                .arg(&self.base)
                .arg(sizes)
                .arg(&0u64)
                .arg(out)
                .arg(&n)
                .launch(crate::launch_config(n))?;
        }
        Ok(())
    }

    /// Allocate `out.len()` blocks of `bytes` each in order on `stream`, their pointers in
    /// `out` (null where the heap ran out). Refused at once as [`Heap::alloc_async`] is.
    pub fn alloc_async_uniform(
        &self,
        bytes: u64,
        out: &mut CudaSlice<u64>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let k = self.host.kernels()?;
        self.check_device(stream)?;
        self.check_size(bytes)?;
        let n = out.len() as u64;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: `out` holds `n` words; a null `sizes` makes every thread ask for `bytes`.
        unsafe {
            stream
                .launch_builder(&k.malloc_batch)
                .arg(&self.base)
                .arg(&0u64)
                .arg(&bytes)
                .arg(out)
                .arg(&n)
                .launch(crate::launch_config(n))?;
        }
        Ok(())
    }

    /// Free every pointer of the device array `ptrs` after the work enqueued on `stream`
    /// before this call, and set each entry to null. Null entries are skipped; blocks may come
    /// from either side; bad pointers are counted as for a kernel's `free`.
    pub fn free_async_batch(
        &self,
        ptrs: &mut CudaSlice<u64>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let k = self.host.kernels()?;
        self.check_device(stream)?;
        let n = ptrs.len() as u64;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: `ptrs` holds `n` words; `free` counts what it cannot use.
        unsafe {
            stream
                .launch_builder(&k.free_batch)
                .arg(&self.base)
                .arg(ptrs)
                .arg(&n)
                .arg(&1u32)
                .launch(crate::launch_config(n))?;
        }
        Ok(())
    }
}
