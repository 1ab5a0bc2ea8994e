//! Typed errors of the host side.

use cudarc::driver::DriverError;

/// Everything that can go wrong on the host side of toga.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `libcuda.so` could not be loaded: no NVIDIA driver on this machine.
    #[error("no CUDA driver: libcuda could not be loaded (is an NVIDIA driver installed?)")]
    NoDriver,
    /// The driver loaded but reports no device (or failed to initialize).
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// The requested device ordinal does not exist.
    #[error("device {ordinal} does not exist: this machine has {count} CUDA device(s)")]
    DeviceOutOfRange {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices there are.
        count: usize,
    },
    /// A heap size of zero bytes.
    #[error("heap size must be greater than zero")]
    HeapSizeZero,
    /// A heap smaller than the smallest the allocator can manage.
    #[error("heap size {requested} B is below the minimum of {minimum} B (one 512 KiB chunk)")]
    HeapTooSmall {
        /// The bytes asked for.
        requested: u64,
        /// The smallest heap toga makes.
        minimum: u64,
    },
    /// A heap larger than the allocator supports or than the device has free.
    #[error("heap size {requested} B is above the limit of {limit} B ({why})")]
    HeapTooLarge {
        /// The bytes asked for.
        requested: u64,
        /// The most that can be had.
        limit: u64,
        /// Which limit: toga's largest heap, a growable heap's maximum, or free device memory.
        why: &'static str,
    },
    /// Fewer arenas than SM ids: an arena's semaphores are sized for one SM's threads.
    #[error(
        "{arenas} arena(s) requested, but this device's SM ids go up to {sm_ids}: a heap needs one arena per SM id"
    )]
    TooFewArenas {
        /// The arenas asked for.
        arenas: u32,
        /// The device's bound of SM ids (`DeviceInfo::sm_id_bound`).
        sm_ids: u32,
    },
    /// `grow` on a heap that was made with a fixed size.
    #[error("the heap has a fixed size and cannot grow (make it with Heap::growable)")]
    NotGrowable,
    /// A PTX file could not be read (the file toga's harness loads instead of its own when
    /// `TOGA_PTX_FILE` names one).
    #[doc(hidden)]
    #[error("TOGA_PTX_FILE: {0}")]
    PtxFile(String),
    /// `Heap::alloc_async` of zero bytes (CUDA's `cudaMallocAsync(0)` returns null; toga
    /// refuses it, so that a null slot always means out of memory).
    #[error("alloc_async of 0 bytes: ask for at least one byte")]
    ZeroSizeAllocation,
    /// `Heap::alloc_async` of more bytes than the heap can ever hold.
    #[error("alloc_async of {requested} B: the heap holds at most {limit} B")]
    AllocationTooLarge {
        /// The bytes asked for.
        requested: u64,
        /// The heap's data region (a growable heap's maximum).
        limit: u64,
    },
    /// The kernel of an `alloc_async` ran and found no block: the heap is out of memory.
    #[error("alloc_async of {bytes} B: the heap had no free block of that size (out of memory)")]
    OutOfMemory {
        /// The bytes asked for.
        bytes: u64,
    },
    /// `Heap::free_async` of a pointer outside the heap's data region: refused at once on the
    /// host, and counted in `HeapStats::invalid_frees` as a kernel's foreign free is.
    #[error(
        "free_async({ptr:#x}): not a block of this heap (its data region is {start:#x}..{end:#x}); counted in invalid_frees"
    )]
    ForeignPointer {
        /// The pointer given.
        ptr: u64,
        /// The data region's first byte.
        start: u64,
        /// One past its last byte.
        end: u64,
    },
    /// A block handle given to a heap other than the one that allocated it.
    #[error("a block of the heap at {block_heap:#x} given to the heap at {heap:#x}")]
    WrongHeap {
        /// The base of the heap that allocated the block.
        block_heap: u64,
        /// The base of the heap it was given to.
        heap: u64,
    },
    /// A block handle used after its heap was destroyed.
    #[error("the heap of this block was destroyed")]
    HeapDestroyed,
    /// Work for a heap enqueued on a stream of another device.
    #[error(
        "the heap lives on device {heap_device}; a stream of device {stream_device} cannot allocate from or free into it (other devices may only read and write its blocks, after Heap::set_peer_access)"
    )]
    WrongDevice {
        /// The heap's device.
        heap_device: usize,
        /// The stream's device.
        stream_device: usize,
    },
    /// The module a heap was created with lacks one of toga's kernels (a PTX file built before
    /// it existed).
    #[error("the loaded module has no kernel {0}: rebuild it against this version of toga")]
    MissingKernel(&'static str),
    /// A peer-access request that the driver cannot grant.
    #[error("device {peer} cannot access memory of device {device}: {why}")]
    PeerAccess {
        /// The heap's device.
        device: usize,
        /// The device that asked for access.
        peer: usize,
        /// Why not.
        why: String,
    },
    /// A batched call whose arrays do not fit each other.
    #[error("batched call: {0}")]
    BadBatch(String),
    /// Export or import of a heap between processes failed.
    #[error("heap IPC: {0}")]
    Ipc(String),
    /// An imported heap was asked to allocate or free: only its owner may.
    #[error(
        "an imported heap cannot {0}: only the process that created it allocates and frees; the importer reads and writes blocks the owner hands it"
    )]
    ImportedHeap(&'static str),
    /// A CUDA driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
}

/// `Result` with toga's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
