//! A toga heap in device memory, created, reset and destroyed in stream order.
//!
//! The memory comes from a CUDA memory pool of the heap's own (`cuMemPoolCreate`), taken with
//! `cuMemAllocFromPoolAsync` and given back with `cuMemFreeAsync`, so creating, resetting and
//! destroying a heap are all work enqueued on a stream: no device-wide synchronization.
//!
//! # Ordering rule (the same as CUDA's stream-ordered allocator)
//! A heap may be used by kernels on any stream of its context once its creation is ordered
//! before them: on the creating stream that is automatic; on another stream, record an event
//! after [`Heap::new`] and make that stream wait on it. Likewise a block returned by toga's
//! device `malloc` in a kernel on stream A may be read or freed by a kernel on stream B only after
//! an event or synchronization orders B's kernel after A's. [`Heap::reset`] and dropping the heap
//! are ordered on the stream given; every kernel using the heap must be ordered before them.

use std::mem::offset_of;
use std::sync::Arc;

use cudarc::driver::{CudaModule, CudaStream, PushKernelArg, sys};
use toga_kernels::heap::{Geometry, GeometryError, HeapHeader, STATS_WORDS, StatsShard, stat};
use toga_kernels::size_class::{NUM_CLASSES, SizeClass};

use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// How to build a heap; see [`Heap::builder`].
#[derive(Clone, Debug)]
pub struct HeapBuilder {
    bytes: u64,
    release_threshold: u64,
    arenas: Option<u32>,
}

impl HeapBuilder {
    /// Bytes of memory the pool keeps cached after the heap is freed, instead of returning them to
    /// the driver (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`; default 0: give everything back).
    pub fn release_threshold(mut self, bytes: u64) -> Self {
        self.release_threshold = bytes;
        self
    }

    /// Number of UAlloc arenas (default: one per SM id, [`DeviceInfo::sm_id_bound`]). Each
    /// SM uses arena `%smid % n`, and an arena's semaphores are sized for the threads of one
    /// SM, so `n` below the SM-id bound is refused ([`Error::TooFewArenas`]).
    ///
    /// [`DeviceInfo::sm_id_bound`]: crate::DeviceInfo::sm_id_bound
    pub fn arenas(mut self, n: u32) -> Self {
        self.arenas = Some(n);
        self
    }

    /// Create the heap, enqueued on `stream`.
    pub fn create(self, gpu: &Gpu, stream: &Arc<CudaStream>) -> Result<Heap> {
        Heap::create(gpu, stream, self)
    }
}

/// A heap in device memory; see the module docs for its ordering rule.
pub struct Heap {
    pool: sys::CUmemoryPool,
    base: u64,
    geometry: Geometry,
    stream: Arc<CudaStream>,
    init_nodes: cudarc::driver::CudaFunction,
    init_finish: cudarc::driver::CudaFunction,
    trim: cudarc::driver::CudaFunction,
    /// Host copy of the geometry, kept alive until the async copy that reads it has run.
    header_image: Vec<u8>,
}

/// What [`Heap::stats`] reports, like `cudaMemPoolAttr*`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Bytes of the data region (what the heap can hand out).
    pub capacity_bytes: u64,
    /// Bytes taken from the buddy tree (UAlloc chunks plus large blocks), now and at most.
    pub reserved_bytes: u64,
    pub reserved_high: u64,
    /// Bytes of live blocks (sizes as rounded up by the allocator), now (exact) and at most
    /// (exact to within `toga_kernels::heap::USED_QUANTUM` per SM).
    pub used_bytes: u64,
    pub used_high: u64,
    /// Live blocks per size class: `(class size, count)`.
    pub live_per_class: Vec<(usize, u64)>,
    /// Live blocks served by TBuddy directly.
    pub live_large: u64,
    pub mallocs: u64,
    pub frees: u64,
    /// `malloc`s that returned null for want of memory.
    pub failed_allocations: u64,
    pub invalid_frees: u64,
    pub double_frees: u64,
}

impl HeapStats {
    /// Live blocks of every kind.
    pub fn live_blocks(&self) -> u64 {
        self.live_per_class.iter().map(|c| c.1).sum::<u64>() + self.live_large
    }
}

fn check(r: sys::CUresult) -> Result<()> {
    r.result().map_err(Error::from)
}

impl Heap {
    /// Start building a heap whose data region holds `bytes` bytes (rounded down to 4 KiB pages).
    pub fn builder(bytes: u64) -> HeapBuilder {
        HeapBuilder {
            bytes,
            release_threshold: 0,
            arenas: None,
        }
    }

    /// A heap of `bytes` with the default settings, enqueued on `stream`.
    pub fn new(gpu: &Gpu, stream: &Arc<CudaStream>, bytes: u64) -> Result<Self> {
        Self::builder(bytes).create(gpu, stream)
    }

    fn create(gpu: &Gpu, stream: &Arc<CudaStream>, b: HeapBuilder) -> Result<Self> {
        let bound = gpu.info().sm_id_bound.max(1);
        let arenas = match b.arenas {
            None => bound,
            Some(n) if n >= bound => n,
            Some(n) => {
                return Err(Error::TooFewArenas {
                    arenas: n,
                    sm_ids: bound,
                });
            }
        } as u64;
        let total =
            Geometry::allocation_bytes(b.bytes, arenas).map_err(|e| geometry_error(e, b.bytes))?;
        let free = gpu.free_memory()?;
        if total > free {
            return Err(Error::HeapTooLarge {
                requested: b.bytes,
                limit: free,
                why: "free device memory",
            });
        }
        gpu.context().bind_to_thread()?;
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = gpu.info().ordinal as i32;
        let mut pool = std::ptr::null_mut();
        // SAFETY: `props` is a valid, zero-padded descriptor.
        check(unsafe { sys::cuMemPoolCreate(&mut pool, &props) })?;
        let mut threshold = b.release_threshold;
        // SAFETY: the attribute takes a u64.
        check(unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut threshold as *mut u64 as *mut _,
            )
        })?;
        let mut base = 0;
        // SAFETY: writes one device pointer; ordered on `stream`.
        check(unsafe {
            sys::cuMemAllocFromPoolAsync(&mut base, total as usize, pool, stream.cu_stream())
        })?;
        let geometry =
            Geometry::new(base, total, b.bytes, arenas).map_err(|e| geometry_error(e, b.bytes))?;
        let mut heap = Self {
            pool,
            base,
            geometry,
            stream: stream.clone(),
            init_nodes: gpu.function("toga_heap_init_nodes")?,
            init_finish: gpu.function("toga_heap_init_finish")?,
            trim: gpu.function("toga_trim")?,
            header_image: Vec::new(),
        };
        heap.reset(stream)?;
        heap.bind(gpu.module(), stream)?;
        Ok(heap)
    }

    /// Free everything at once: the heap is re-initialized, in order on `stream`, and ready for
    /// the next iteration. Every kernel using the heap must be ordered before this.
    pub fn reset(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        let header_bytes = self.geometry.data_offset as usize;
        let s = stream.cu_stream();
        // SAFETY: the metadata region is ours; ordered on `stream`.
        check(unsafe { sys::cuMemsetD8Async(self.base, 0, header_bytes, s) })?;
        let mut image = vec![0u8; offset_of!(HeapHeader, geometry) + size_of::<Geometry>()];
        // SAFETY: Geometry is plain `repr(C)` u64s.
        let g = unsafe {
            std::slice::from_raw_parts(
                &self.geometry as *const Geometry as *const u8,
                size_of::<Geometry>(),
            )
        };
        image[offset_of!(HeapHeader, geometry)..].copy_from_slice(g);
        self.header_image = image;
        // SAFETY: `header_image` outlives the copy (kept in `self` until the next reset/drop,
        // both of which are ordered after it on a stream or synchronize).
        check(unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                self.base,
                self.header_image.as_ptr() as *const _,
                self.header_image.len(),
                s,
            )
        })?;
        let threads = self.geometry.node_words.div_ceil(4).clamp(1, 1 << 20);
        // SAFETY: the init kernels take the heap's base; the geometry is in place.
        unsafe {
            stream
                .launch_builder(&self.init_nodes)
                .arg(&self.base)
                .launch(crate::launch_config(threads))?;
            stream
                .launch_builder(&self.init_finish)
                .arg(&self.base)
                .launch(crate::launch_config(1))?;
        }
        Ok(())
    }

    /// Give back the memory the small-block allocator holds but does not use, in order on
    /// `stream`: empty bins go back to their chunks and empty chunks to the buddy tree, so
    /// they can serve any size again. Kernels never need it (a `malloc` that finds no memory
    /// does the same before it returns null); call it after a phase that freed many small
    /// blocks, before reading `reserved` bytes, or before asking for one very large block.
    /// Safe while other kernels use the heap.
    pub fn trim(&self, stream: &Arc<CudaStream>) -> Result<()> {
        // SAFETY: `toga_trim` takes the heap's base; the heap outlives the launch (ordering rule).
        unsafe {
            stream
                .launch_builder(&self.trim)
                .arg(&self.base)
                .launch(crate::launch_config(1))?;
        }
        Ok(())
    }

    /// The heap's device address, the `base` argument of toga's kernels.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Where everything is.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// Bytes the heap can hand out.
    pub fn capacity(&self) -> u64 {
        self.geometry.data_bytes()
    }

    /// Make this heap the one that `toga_kernels::malloc`/`free` and the `GlobalAlloc` use in
    /// `module`, enqueued on `stream`. [`Heap::new`] binds the heap to the module of the `Gpu`
    /// it was created with; call this for other modules, or to switch between heaps.
    pub fn bind(&self, module: &Arc<CudaModule>, stream: &Arc<CudaStream>) -> Result<()> {
        let f = module.load_function("toga_bind_heap")?;
        // SAFETY: the heap outlives kernels that use it (documented ordering rule).
        unsafe {
            stream
                .launch_builder(&f)
                .arg(&self.base)
                .launch(crate::launch_config(1))?;
        }
        Ok(())
    }

    /// Read the statistics with one device-to-host copy, ordered on `stream` (synchronizes it).
    pub fn stats(&self, stream: &Arc<CudaStream>) -> Result<HeapStats> {
        let g = &self.geometry;
        let len = g.shards_offset as usize + g.arenas as usize * size_of::<StatsShard>();
        let mut raw = vec![0u8; len];
        // SAFETY: copies `len` bytes of the metadata region into `raw`, then waits.
        check(unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                raw.as_mut_ptr() as *mut _,
                self.base,
                len,
                stream.cu_stream(),
            )
        })?;
        stream.synchronize()?;
        let word = |off: usize| u64::from_le_bytes(raw[off..off + 8].try_into().unwrap());
        let mut sums = [0u64; STATS_WORDS];
        for shard in 0..g.arenas as usize {
            let at = g.shards_offset as usize + shard * size_of::<StatsShard>();
            for (k, s) in sums.iter_mut().enumerate() {
                *s = s.wrapping_add(word(at + 8 * k));
            }
        }
        Ok(HeapStats {
            capacity_bytes: g.data_bytes(),
            reserved_bytes: word(offset_of!(HeapHeader, reserved)),
            reserved_high: word(offset_of!(HeapHeader, reserved_high)),
            used_bytes: sums[stat::LIVE_BYTES],
            // INV(HP3): the device keeps the mark in steps; it is never below the count now.
            used_high: word(offset_of!(HeapHeader, used_high)).max(sums[stat::LIVE_BYTES]),
            live_per_class: (0..NUM_CLASSES)
                .map(|c| (SizeClass::ALL[c].size(), sums[stat::LIVE_CLASS0 + c]))
                .collect(),
            live_large: sums[stat::LIVE_LARGE],
            mallocs: sums[stat::MALLOCS],
            frees: sums[stat::FREES],
            failed_allocations: sums[stat::FAILED],
            invalid_frees: sums[stat::INVALID_FREES],
            double_frees: sums[stat::DOUBLE_FREES],
        })
    }

    /// Start the high-water marks again from the current values, ordered on `stream`.
    pub fn reset_high_water(&self, stream: &Arc<CudaStream>) -> Result<()> {
        let s = self.stats(stream)?;
        for (field, value) in [
            (offset_of!(HeapHeader, used_high), s.used_bytes),
            (offset_of!(HeapHeader, reserved_high), s.reserved_bytes),
        ] {
            // SAFETY: one word of the header; `value` lives across the synchronize below.
            check(unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    self.base + field as u64,
                    &value as *const u64 as *const _,
                    8,
                    stream.cu_stream(),
                )
            })?;
            stream.synchronize()?;
        }
        Ok(())
    }

    /// Give the memory back to the pool, ordered on `stream` (dropping the heap does the same on
    /// the stream that created it).
    pub fn destroy(mut self, stream: &Arc<CudaStream>) -> Result<()> {
        self.stream = stream.clone();
        Ok(())
    }
}

impl Drop for Heap {
    fn drop(&mut self) {
        // SAFETY: the allocation and pool are ours; the free is ordered on the stream, and the
        // pool is released by the driver once the free has run.
        unsafe {
            let _ = self.stream.context().bind_to_thread();
            let _ = sys::cuMemFreeAsync(self.base, self.stream.cu_stream());
            let _ = sys::cuMemPoolDestroy(self.pool);
        }
    }
}

/// Check a heap size without a GPU: zero, below one chunk and above toga's largest heap are
/// rejected here; [`Heap::new`] also rejects sizes above the device's free memory.
pub fn check_heap_size(bytes: u64) -> Result<()> {
    Geometry::allocation_bytes(bytes, 1)
        .map(|_| ())
        .map_err(|e| geometry_error(e, bytes))
}

fn geometry_error(e: GeometryError, requested: u64) -> Error {
    match e {
        GeometryError::Zero => Error::HeapSizeZero,
        GeometryError::TooSmall { minimum } => Error::HeapTooSmall { requested, minimum },
        GeometryError::TooLarge { maximum } => Error::HeapTooLarge {
            requested,
            limit: maximum,
            why: "the largest heap toga's buddy tree addresses",
        },
    }
}
