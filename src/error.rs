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
    #[error("TOGA_PTX_FILE: {0}")]
    PtxFile(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
}

/// `Result` with toga's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
