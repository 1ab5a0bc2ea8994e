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
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaFunction, CudaModule, CudaStream, PushKernelArg, sys};
use toga_kernels::heap::{
    Geometry, GeometryError, HeapHeader, MAX_HEAP_BYTES, STATS_WORDS, StatsShard, stat,
};
use toga_kernels::size_class::{NUM_CLASSES, NUM_KINDS, SizeClass};

use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::vmm::{self, MailboxMemory, Service, ServiceCounts, Vmm};

#[cfg(target_os = "linux")]
mod ipc;
mod peer;
mod stream;
#[cfg(target_os = "linux")]
pub use ipc::{ImportedHeap, IpcDescriptor, IpcExport, recv_export, send_export};
pub use stream::{Freeable, HostBlock};

/// The smallest granule a growable heap maps in (the driver's granularity may be larger).
pub const MIN_GRANULE: u64 = 2 << 20;
/// A growable heap's first mapping when the builder names none: CUDA's default device-heap
/// size.
pub const DEFAULT_INITIAL_BYTES: u64 = 8 << 20;

/// Threads of a `toga_trim` launch: they give the stashed large blocks back to the buddy
/// tree side by side (each block's climb is a chain of dependent atomics; one thread alone
/// would climb once per block).
const TRIM_THREADS: u64 = 1 << 15;

/// How to build a heap; see [`Heap::builder`].
#[derive(Clone, Debug)]
pub struct HeapBuilder {
    bytes: u64,
    release_threshold: Option<u64>,
    arenas: Option<u32>,
    growable: Option<GrowOptions>,
    /// Devices whose kernels may read and write the heap's blocks ([`Heap::set_peer_access`]).
    peers: Vec<usize>,
    /// Growable heap: physical memory exportable to other processes ([`Heap::export_ipc`]).
    exportable: bool,
}

#[derive(Clone, Debug)]
struct GrowOptions {
    max: Option<u64>,
    in_kernel: bool,
}

impl HeapBuilder {
    /// Fixed heap: bytes of memory the pool keeps cached after the heap is freed, instead of
    /// returning them to the driver (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`; default 0: give
    /// everything back). Growable heap: the mapped bytes that [`Heap::synchronize`] trims back
    /// to once kernels are done (default: the initial size).
    pub fn release_threshold(mut self, bytes: u64) -> Self {
        self.release_threshold = Some(bytes);
        self
    }

    /// Growable heap: the most bytes its data region may grow to (default: the device's
    /// memory, at most toga's largest heap). Rounded down to whole granules.
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        if let Some(g) = &mut self.growable {
            g.max = Some(bytes);
        }
        self
    }

    /// Growable heap: the bytes mapped at creation (default [`DEFAULT_INITIAL_BYTES`]),
    /// rounded up to whole granules.
    pub fn initial_bytes(mut self, bytes: u64) -> Self {
        self.bytes = bytes;
        self
    }

    /// Growable heap: whether a kernel that runs out of memory may ask the host for more and
    /// wait for it (default: yes). Without it, growth happens only through [`Heap::grow`] and
    /// [`Heap::synchronize`].
    pub fn grow_in_kernel(mut self, on: bool) -> Self {
        if let Some(g) = &mut self.growable {
            g.in_kernel = on;
        }
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

    /// Kernels on the devices `peers` (ordinals) may read and write the heap's blocks, like
    /// `cudaMemPoolSetAccess`; see [`Heap::set_peer_access`], which `create` calls.
    pub fn peer_access(mut self, peers: &[usize]) -> Self {
        self.peers = peers.to_vec();
        self
    }

    /// Growable heap: make its memory exportable to other processes through POSIX file
    /// descriptors ([`Heap::export_ipc`]). Default: no.
    pub fn ipc_exportable(mut self, on: bool) -> Self {
        self.exportable = on;
        self
    }

    /// Create the heap, enqueued on `stream`.
    pub fn create(mut self, gpu: &Gpu, stream: &Arc<CudaStream>) -> Result<Heap> {
        let peers = std::mem::take(&mut self.peers);
        let heap = Heap::create(gpu, stream, self)?;
        heap.set_peer_access(&peers)?;
        Ok(heap)
    }
}

/// Where a heap's memory comes from.
enum Backing {
    /// A fixed heap: one allocation from a pool of its own.
    Pool(PoolHandle),
    /// A growable heap: a reservation with granules mapped on demand.
    Growable(Growable),
}

/// A memory pool's driver handle.
struct PoolHandle(sys::CUmemoryPool);

// SAFETY: the handle names a driver object, not memory of this process, and the driver API is
// thread-safe. A heap uses its pool only while it is created (before anything can share it)
// and in `Drop` (`&mut`), each time with the heap's context bound to the calling thread first;
// no method of `&Heap` touches it. So `Heap` is `Send` and `Sync` (its other state is
// `Arc`s, mutexes and values written only at creation).
unsafe impl Send for PoolHandle {}
// SAFETY: as above.
unsafe impl Sync for PoolHandle {}

struct Growable {
    /// First field: dropped (stopped) before the memory it maps into.
    service: Option<Service>,
    vmm: Arc<Mutex<Vmm>>,
    mailbox: Option<Arc<MailboxMemory>>,
    counts: Arc<Mutex<ServiceCounts>>,
    release_threshold: u64,
    init_finish: CudaFunction,
    add_range: CudaFunction,
    take_granules: CudaFunction,
    collect: CudaFunction,
}

/// A heap in device memory; see the module docs for its ordering rule.
pub struct Heap {
    backing: Backing,
    base: u64,
    geometry: Geometry,
    stream: Arc<CudaStream>,
    init_nodes: cudarc::driver::CudaFunction,
    init_finish: cudarc::driver::CudaFunction,
    /// `toga_heap_stock_arenas`; `None` for a module built before it existed (a PTX file
    /// given through `TOGA_PTX_FILE`), whose heaps start without spare chunks.
    stock_arenas: Option<cudarc::driver::CudaFunction>,
    trim: cudarc::driver::CudaFunction,
    /// Host copy of the geometry, kept alive until the async copy that reads it has run.
    header_image: Vec<u8>,
    /// Stream-ordered allocation from the host (`stream.rs`).
    host: stream::HostOps,
}

/// What [`Heap::stats`] reports, like `cudaMemPoolAttr*`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Bytes of the data region (what the heap can hand out).
    pub capacity_bytes: u64,
    /// Bytes taken from the buddy tree (UAlloc chunks plus live large blocks), now. Freed
    /// large blocks of 8 KiB – 256 KiB that wait in their size's stash for the next `malloc`
    /// are not counted, nor in the tree until a trim ([`Heap::trim`]) gives them back.
    pub reserved_bytes: u64,
    /// The most [`reserved_bytes`](Self::reserved_bytes) has been.
    pub reserved_high: u64,
    /// Bytes of live blocks (sizes as rounded up by the allocator), now (exact) and at most
    /// (exact to within one quantum per SM: `Geometry::used_quantum_shift`, 1/32 of the data
    /// region or 64 KiB per SM, whichever is more).
    pub used_bytes: u64,
    /// The most [`used_bytes`](Self::used_bytes) has been.
    pub used_high: u64,
    /// Live blocks per size class: `(class size, count)`.
    pub live_per_class: Vec<(usize, u64)>,
    /// Live blocks served by TBuddy directly.
    pub live_large: u64,
    /// `malloc`s that returned a block.
    pub mallocs: u64,
    /// `free`s that gave a block back.
    pub frees: u64,
    /// `malloc`s that returned null for want of memory.
    pub failed_allocations: u64,
    /// `free`s of pointers the heap did not hand out (counted, otherwise ignored).
    pub invalid_frees: u64,
    /// `free`s of blocks that were free already (counted, otherwise ignored).
    pub double_frees: u64,
    /// Bytes the data region may grow to (the capacity of a fixed heap).
    pub max_bytes: u64,
    /// Bytes of the data region backed by memory now (a fixed heap: all of it).
    pub mapped_bytes: u64,
    /// The most [`mapped_bytes`](Self::mapped_bytes) has been.
    pub mapped_high: u64,
    /// Device memory the heap holds, metadata included.
    pub device_bytes: u64,
    /// Growths that kernels asked for and got.
    pub kernel_grows: u64,
    /// Growth requests from kernels that got nothing (the heap was at its maximum, the device
    /// out of memory, or the host did not answer in time).
    pub kernel_grow_failures: u64,
    /// Growth requests the host service answered with memory.
    pub service_grants: u64,
    /// The mean time the service took to map a granted request (ns).
    pub service_map_ns: u64,
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
            release_threshold: None,
            arenas: None,
            growable: None,
            peers: Vec::new(),
            exportable: false,
        }
    }

    /// Start building a growable heap: no size to guess. It reserves address space for its
    /// maximum, maps memory in granules as kernels need it (also while they run), and gives
    /// it back with [`Heap::trim_to`] and [`Heap::synchronize`]. Falls back to a fixed heap of
    /// the maximum's size, with a one-line notice, where the driver lacks virtual memory
    /// management.
    pub fn growable() -> HeapBuilder {
        HeapBuilder {
            bytes: DEFAULT_INITIAL_BYTES,
            release_threshold: None,
            arenas: None,
            growable: Some(GrowOptions {
                max: None,
                in_kernel: true,
            }),
            peers: Vec::new(),
            exportable: false,
        }
    }

    /// A heap of `bytes` with the default settings, enqueued on `stream`.
    pub fn new(gpu: &Gpu, stream: &Arc<CudaStream>, bytes: u64) -> Result<Self> {
        Self::builder(bytes).create(gpu, stream)
    }

    fn arenas_for(gpu: &Gpu, b: &HeapBuilder) -> Result<u64> {
        let bound = gpu.info().sm_id_bound.max(1);
        Ok(match b.arenas {
            None => bound,
            Some(n) if n >= bound => n,
            Some(n) => {
                return Err(Error::TooFewArenas {
                    arenas: n,
                    sm_ids: bound,
                });
            }
        } as u64)
    }

    fn create(gpu: &Gpu, stream: &Arc<CudaStream>, mut b: HeapBuilder) -> Result<Self> {
        let arenas = Self::arenas_for(gpu, &b)?;
        if let Some(grow) = b.growable.clone() {
            let max = grow.max.unwrap_or(default_max(gpu));
            if b.bytes > max {
                return Err(Error::HeapTooLarge {
                    requested: b.bytes,
                    limit: max,
                    why: "the growable heap's maximum",
                });
            }
            if vmm::supported(gpu.context()) {
                return Self::create_growable(gpu, stream, b, grow.in_kernel, max, arenas);
            }
            let max = max.min(gpu.free_memory()? / 2);
            eprintln!(
                "toga: no CUDA virtual memory management on this device; using a fixed heap of {max} B"
            );
            b.bytes = max;
        }
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
        let mut threshold = b.release_threshold.unwrap_or(0);
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
        Self::start(gpu, stream, Backing::Pool(PoolHandle(pool)), geometry)
    }

    /// The heap over `backing` laid out by `geometry`: initialized and bound to `gpu`'s module,
    /// in order on `stream`.
    fn start(
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        backing: Backing,
        geometry: Geometry,
    ) -> Result<Self> {
        let mut heap = Self {
            backing,
            base: geometry.base,
            geometry,
            stream: stream.clone(),
            init_nodes: gpu.function("toga_heap_init_nodes")?,
            init_finish: gpu.function("toga_heap_init_finish")?,
            stock_arenas: gpu.function("toga_heap_stock_arenas").ok(),
            trim: gpu.function("toga_trim")?,
            header_image: Vec::new(),
            host: stream::HostOps::load(gpu),
        };
        heap.reset(stream)?;
        heap.bind(gpu.module(), stream)?;
        Ok(heap)
    }

    fn create_growable(
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        b: HeapBuilder,
        in_kernel: bool,
        max: u64,
        arenas: u64,
    ) -> Result<Self> {
        gpu.context().bind_to_thread()?;
        let ordinal = gpu.info().ordinal as i32;
        let granule = vmm::granularity(ordinal)?
            .max(MIN_GRANULE)
            .next_power_of_two();
        let shift = granule.trailing_zeros();
        if max > MAX_HEAP_BYTES {
            return Err(geometry_error(
                GeometryError::TooLarge {
                    maximum: MAX_HEAP_BYTES,
                },
                max,
            ));
        }
        let mailbox = if in_kernel {
            Some(Arc::new(MailboxMemory::new()?))
        } else {
            None
        };
        let device_mailbox = mailbox.as_ref().map_or(0, |m| m.device());
        let layout = Geometry::growable(0, max, arenas, shift, device_mailbox)
            .map_err(|e| geometry_error(e, max))?;
        let mut vmm = Vmm::reserve_with(
            ordinal,
            layout.total_bytes,
            layout.data_offset,
            granule,
            b.exportable,
        )?;
        let geometry = Geometry::growable(vmm.base(), max, arenas, shift, device_mailbox)
            .map_err(|e| geometry_error(e, max))?;
        debug_assert_eq!(geometry.data_offset, layout.data_offset);
        vmm.map_prefix(b.bytes.max(1))?;
        let initial = vmm.mapped().0;
        let vmm = Arc::new(Mutex::new(vmm));
        let counts = Arc::new(Mutex::new(ServiceCounts::default()));
        let service = mailbox.as_ref().map(|m| {
            Service::start(
                gpu.context().clone(),
                vmm.clone(),
                m.clone(),
                counts.clone(),
            )
        });
        let backing = Backing::Growable(Growable {
            service,
            vmm,
            mailbox,
            counts,
            release_threshold: b.release_threshold.unwrap_or(initial),
            init_finish: gpu.function("toga_heap_init_growable_finish")?,
            add_range: gpu.function("toga_heap_add_range")?,
            take_granules: gpu.function("toga_heap_take_granules")?,
            collect: gpu.function("toga_heap_collect")?,
        });
        Self::start(gpu, stream, backing, geometry)
    }

    /// Whether the heap grows on demand (false for a fixed heap, and for a growable one that
    /// fell back to a fixed heap).
    pub fn is_growable(&self) -> bool {
        matches!(self.backing, Backing::Growable(_))
    }

    /// Free everything at once: the heap is re-initialized, in order on `stream`, and ready for
    /// the next iteration. Every kernel using the heap must be ordered before this. A growable
    /// heap keeps what it has mapped, and synchronizes `stream` first.
    pub fn reset(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        if self.is_growable() {
            // The mailbox is read and written below, now: no kernel may be using it.
            stream.synchronize()?;
        }
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
        }
        let Backing::Growable(g) = &self.backing else {
            self.launch_on_heap(stream, &self.init_finish)?;
            // Spare chunks for the arenas' first adoptions (the kernel decides whether the
            // heap is large enough). A growable heap's tree is empty here: no spares.
            if let Some(f) = &self.stock_arenas {
                let threads = self.geometry.arenas * NUM_KINDS as u64;
                // SAFETY: the stocking kernel takes the heap's base; ordered after init.
                unsafe {
                    stream
                        .launch_builder(f)
                        .arg(&self.base)
                        .launch(crate::launch_config(threads))?;
                }
            }
            return Ok(());
        };
        self.launch_on_heap(stream, &g.init_finish)?;
        // Under the lock, so that the growth service's replies are either in this snapshot
        // (and marked taken in) or come after it.
        let vmm = g.vmm.lock().unwrap();
        if let Some(m) = &g.mailbox {
            let answered = m.read(|m| unsafe { &raw mut (*m).reply_seq });
            m.write(|m| unsafe { &raw mut (*m).consumed_seq }, answered);
        }
        for (first, count) in vmm.mapped_runs() {
            // The run is mapped and not in the freshly initialized tree.
            self.add_range(stream, g, first * vmm.granule(), count * vmm.granule())?;
        }
        Ok(())
    }

    /// Launch `f(base)` on one thread, in order on `stream` (init, collect, bind).
    fn launch_on_heap(&self, stream: &Arc<CudaStream>, f: &CudaFunction) -> Result<()> {
        // SAFETY: toga's one-thread heap kernels take only the heap's base; the heap outlives
        // the launch (ordering rule).
        unsafe {
            stream
                .launch_builder(f)
                .arg(&self.base)
                .launch(crate::launch_config(1))?;
        }
        Ok(())
    }

    /// Hand `len` bytes of mapped memory at data offset `offset`, not yet in the heap, to the
    /// allocator (`toga_heap_add_range`), in order on `stream`.
    fn add_range(
        &self,
        stream: &Arc<CudaStream>,
        g: &Growable,
        offset: u64,
        len: u64,
    ) -> Result<()> {
        // SAFETY: the kernel takes the base and a range the caller vouches for.
        unsafe {
            stream
                .launch_builder(&g.add_range)
                .arg(&self.base)
                .arg(&offset)
                .arg(&len)
                .launch(crate::launch_config(1))?;
        }
        Ok(())
    }

    /// Map `bytes` more memory (rounded up to whole granules) into a growable heap and hand it
    /// to the allocator, in order on `stream` (the mapping itself happens now). The granules go
    /// in as aligned power-of-two runs, each of which the buddy tree merges into one block.
    /// Returns the mapped bytes after it. Past the maximum, or past the device's memory, it
    /// fails and the heap is unchanged.
    pub fn grow(&self, stream: &Arc<CudaStream>, bytes: u64) -> Result<u64> {
        let Backing::Growable(g) = &self.backing else {
            return Err(Error::NotGrowable);
        };
        stream.context().bind_to_thread()?;
        let mut vmm = g.vmm.lock().unwrap();
        let (mapped, max, granule) = (vmm.mapped().0, vmm.max_bytes(), vmm.granule());
        if bytes > max - mapped {
            return Err(Error::HeapTooLarge {
                requested: mapped + bytes,
                limit: max,
                why: "the growable heap's maximum",
            });
        }
        // Map every run first, so that a failure can take them all back.
        let mut left = bytes.div_ceil(granule);
        let mut runs = Vec::new();
        while left > 0 {
            let mut piece = 1u64 << (63 - left.leading_zeros());
            let run = loop {
                match vmm.grow(piece * granule, 0) {
                    Ok(run) => break Ok(run),
                    // No aligned free range that large: smaller pieces.
                    Err(Error::HeapTooLarge { .. }) if piece > 1 => piece /= 2,
                    Err(e) => break Err(e),
                }
            };
            match run {
                Ok(run) => {
                    runs.push(run);
                    left -= piece;
                }
                Err(e) => {
                    for &(offset, len) in &runs {
                        vmm.unmap_range(offset, len);
                    }
                    return Err(match e {
                        Error::Driver(d) if d.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                            let free =
                                cudarc::driver::result::mem_get_info().map_or(0, |m| m.0 as u64);
                            Error::HeapTooLarge {
                                requested: mapped + bytes,
                                limit: mapped + free,
                                why: "free device memory",
                            }
                        }
                        e => e,
                    });
                }
            }
        }
        for (offset, len) in runs {
            // Just mapped, not in the heap.
            self.add_range(stream, g, offset, len)?;
        }
        // Memory may be there again for a kernel that was turned away.
        self.clear_denied(stream)?;
        Ok(vmm.mapped().0)
    }

    /// Give back the mapped memory of a growable heap beyond `keep_bytes`, like
    /// `cudaMemPoolTrimTo`: first the stashed large blocks and UAlloc's unused bins and chunks
    /// go back to the buddy tree ([`Heap::trim`]), then whole free granules are taken out of it
    /// and unmapped. Blocks in use stay where
    /// they are, so less may be released. Synchronizes `stream`. Returns the bytes released.
    pub fn trim_to(&self, stream: &Arc<CudaStream>, keep_bytes: u64) -> Result<u64> {
        let Backing::Growable(g) = &self.backing else {
            return Ok(0);
        };
        stream.context().bind_to_thread()?;
        self.launch_on_heap(stream, &g.collect)?;
        // The stashed large blocks go back to the tree on many threads first: the one thread of
        // `toga_heap_take_granules` trims too, and would climb once per stashed block.
        self.trim(stream)?;
        let (granule, mapped) = {
            let vmm = g.vmm.lock().unwrap();
            (vmm.granule(), vmm.mapped().0)
        };
        let want = mapped.saturating_sub(keep_bytes) / granule;
        if want == 0 {
            return Ok(0);
        }
        let mut out = stream.alloc_zeros::<u64>(want as usize)?;
        let mut count = stream.alloc_zeros::<u64>(1)?;
        // SAFETY: the kernel writes at most `want` offsets and one count.
        unsafe {
            stream
                .launch_builder(&g.take_granules)
                .arg(&self.base)
                .arg(&mut out)
                .arg(&want)
                .arg(&mut count)
                .launch(crate::launch_config(1))?;
        }
        // The copies wait for the kernel: the granules are out of the heap before they go.
        let n = stream.clone_dtoh(&count)?[0] as usize;
        let offsets = stream.clone_dtoh(&out)?;
        let mut vmm = g.vmm.lock().unwrap();
        for &offset in &offsets[..n] {
            vmm.unmap(offset / granule);
        }
        drop(vmm);
        self.clear_denied(stream)?;
        Ok(n as u64 * granule)
    }

    /// Wait for `stream`, then apply a growable heap's policy, as CUDA's pools do at a
    /// synchronization: when live blocks fill more than three quarters of the mapped memory,
    /// grow by half ahead of the next launch; otherwise trim back to the release threshold
    /// (which first returns UAlloc's empty bins and chunks, [`Heap::trim_to`]). A fixed heap
    /// only waits.
    pub fn synchronize(&self, stream: &Arc<CudaStream>) -> Result<()> {
        stream.synchronize()?;
        let Backing::Growable(g) = &self.backing else {
            return Ok(());
        };
        let s = self.stats(stream)?;
        if s.used_bytes > s.mapped_bytes / 4 * 3 && s.mapped_bytes < s.max_bytes {
            let step = vmm::growth_step(s.mapped_bytes).min(s.max_bytes - s.mapped_bytes);
            // Growing ahead is a wish: a device without that much memory simply does not.
            let _ = self.grow(stream, step.max(1));
        } else if s.mapped_bytes > g.release_threshold {
            self.trim_to(stream, g.release_threshold)?;
        }
        stream.synchronize()?;
        Ok(())
    }

    /// Let kernels ask for growth again after the heap was found at its maximum.
    fn clear_denied(&self, stream: &Arc<CudaStream>) -> Result<()> {
        let at = self.base + offset_of!(HeapHeader, grow_denied) as u64;
        // SAFETY: one header word, ordered on `stream`.
        check(unsafe { sys::cuMemsetD32Async(at, 0, 2, stream.cu_stream()) })
    }

    /// Give back the memory the heap holds but does not use, in order on `stream`: freed
    /// large blocks of 8 KiB to 256 KiB that wait in their order's stash for the next
    /// `malloc` of that size go back to the buddy tree and merge there, empty bins go back to
    /// their chunks and empty chunks to the tree, so they can serve any size again. Kernels
    /// never need it (a `malloc` that finds no memory does the same before it returns null);
    /// call it after a phase that freed many blocks, or before asking for one very large
    /// block. Safe while other kernels use the heap.
    pub fn trim(&self, stream: &Arc<CudaStream>) -> Result<()> {
        // SAFETY: `toga_trim` takes only the heap's base; the heap outlives the launch
        // (ordering rule).
        unsafe {
            stream
                .launch_builder(&self.trim)
                .arg(&self.base)
                .launch(crate::launch_config(TRIM_THREADS))?;
        }
        Ok(())
    }

    /// The heap's device address, the `base` argument of toga's kernels.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Where everything is (for toga's harness and tests, not an API).
    #[doc(hidden)]
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
    /// Refused ([`Error::WrongDevice`]) for a module on another device: only the heap's own
    /// device runs its `malloc` and `free` (`peer.rs`).
    pub fn bind(&self, module: &Arc<CudaModule>, stream: &Arc<CudaStream>) -> Result<()> {
        self.check_device(stream)?;
        self.launch_on_heap(stream, &module.load_function("toga_bind_heap")?)
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
        let (max_bytes, mapped_bytes, mapped_high, device_bytes, grants, map_ns) =
            match &self.backing {
                Backing::Pool(_) => {
                    let d = g.data_bytes();
                    (d, d, d, g.total_bytes, 0, 0)
                }
                Backing::Growable(gr) => {
                    let v = gr.vmm.lock().unwrap();
                    let c = gr.counts.lock().unwrap();
                    let (now, high) = v.mapped();
                    let mean = c.map_ns.checked_div(c.granted).unwrap_or(0);
                    (v.max_bytes(), now, high, v.device_bytes(), c.granted, mean)
                }
            };
        Ok(HeapStats {
            max_bytes,
            mapped_bytes,
            mapped_high,
            device_bytes,
            kernel_grows: word(offset_of!(HeapHeader, grows)),
            kernel_grow_failures: word(offset_of!(HeapHeader, grow_failures)),
            service_grants: grants,
            service_map_ns: map_ns,
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
            match &mut self.backing {
                Backing::Pool(pool) => {
                    let _ = sys::cuMemFreeAsync(self.base, self.stream.cu_stream());
                    let _ = sys::cuMemPoolDestroy(pool.0);
                }
                Backing::Growable(g) => {
                    // Unmapping is not stream-ordered: wait for the kernels, stop the service,
                    // then the mapping and the mailbox go (`Vmm` and `MailboxMemory` drops).
                    let _ = self.stream.synchronize();
                    g.service.take();
                }
            }
        }
    }
}

/// The default maximum of a growable heap: the device's memory, at most toga's largest heap.
fn default_max(gpu: &Gpu) -> u64 {
    gpu.info().total_memory.min(MAX_HEAP_BYTES)
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
