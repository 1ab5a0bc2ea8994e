//! # toga's C API
//!
//! `libtoga` (`include/toga.h`, generated from this file by cbindgen): heaps of toga's host
//! library (`toga::Heap`) for programs in C and CUDA C++. With the device functions of
//! `include/toga.cuh` (`toga_malloc`, `toga_free`, ... in the relocatable device object made
//! from [`toga_device_ptx`]'s PTX), a CUDA C++ kernel allocates from a toga heap. See
//! `docs/cpp.md`.
//!
//! # Rules every function follows
//! - It returns a [`toga_status`]; [`TOGA_SUCCESS`] is 0. On an
//!   error, [`toga_last_error_message`] says what happened, in words, on the calling thread.
//! - Bad input is an error code, never a crash: a null output pointer, a heap handle that is
//!   zero, unknown or destroyed, a size of 0 or too large, a device that does not exist. A
//!   panic inside is caught and reported as [`TOGA_ERROR_INTERNAL`].
//! - Heaps live in the device's primary context: the CUDA runtime API's context. Streams are
//!   `cudaStream_t` / `CUstream` handles of that context, passed as `void *`; NULL is the
//!   default stream. The order of work on streams is the Rust API's (`toga::heap`).
//! - Handles are numbers that are never reused, so a destroyed handle stays recognisably
//!   destroyed.

// The C names are the API: `toga_heap`, `toga_status`, ...
#![allow(non_camel_case_types)]
#![warn(missing_docs)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use toga::cudarc::driver::{CudaStream, sys};
use toga::{Error, Gpu, Heap};

/// What a call of the C API ended with.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum toga_status {
    /// The call did what it says.
    TOGA_SUCCESS = 0,
    /// A pointer argument that must not be NULL was NULL, or an argument is out of its range.
    TOGA_ERROR_INVALID_VALUE = 1,
    /// The heap handle is zero, was never returned by a create call, or was destroyed.
    TOGA_ERROR_INVALID_HANDLE = 2,
    /// A heap size of 0, or below the smallest heap toga makes (one 512 KiB chunk).
    TOGA_ERROR_INVALID_SIZE = 3,
    /// A size above the largest heap toga addresses, a growable heap's maximum or the
    /// device's free memory.
    TOGA_ERROR_TOO_LARGE = 4,
    /// The device ordinal is negative or not below the number of devices.
    TOGA_ERROR_INVALID_DEVICE = 5,
    /// No NVIDIA driver could be loaded.
    TOGA_ERROR_NO_DRIVER = 6,
    /// The driver loaded but reports no usable device.
    TOGA_ERROR_NO_DEVICE = 7,
    /// `toga_heap_grow` on a heap of fixed size.
    TOGA_ERROR_NOT_GROWABLE = 8,
    /// The device is out of memory.
    TOGA_ERROR_OUT_OF_MEMORY = 9,
    /// A CUDA driver call failed (the message names it), or a kernel of the program failed
    /// before it.
    TOGA_ERROR_CUDA = 10,
    /// A fault inside toga (a bug): the message says where.
    TOGA_ERROR_INTERNAL = 11,
}

use toga_status::*;

/// A heap, by number: 0 is no heap. Copy it freely; it stays valid until
/// [`toga_heap_destroy`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct toga_heap {
    /// The heap's number (never reused).
    pub id: u64,
}

/// [`toga_growable_options::flags`]: kernels that run out of memory do not ask the host for
/// more; the heap grows only through [`toga_heap_grow`] and [`toga_heap_synchronize`].
pub const TOGA_NO_KERNEL_GROWTH: u32 = 1;

/// How to make a growable heap. An all-zero struct asks for every default.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct toga_growable_options {
    /// Bytes mapped at creation, rounded up to whole granules (0: 8 MiB, CUDA's default device
    /// heap).
    pub initial_bytes: u64,
    /// The most bytes the data region may grow to (0: the device's memory).
    pub max_bytes: u64,
    /// The mapped bytes `toga_heap_synchronize` trims back to (0: the initial size).
    pub release_threshold: u64,
    /// [`TOGA_NO_KERNEL_GROWTH`], or 0.
    pub flags: u32,
}

/// A heap's statistics (`toga::HeapStats`; see its documentation for each field).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct toga_stats {
    /// Bytes the heap can hand out now.
    pub capacity_bytes: u64,
    /// Bytes taken from the buddy tree now.
    pub reserved_bytes: u64,
    /// The most `reserved_bytes` has been.
    pub reserved_high: u64,
    /// Bytes of live blocks now (sizes as rounded up by the allocator).
    pub used_bytes: u64,
    /// The most `used_bytes` has been.
    pub used_high: u64,
    /// Live blocks of every size.
    pub live_blocks: u64,
    /// Live blocks larger than the largest size class.
    pub live_large: u64,
    /// `malloc`s that returned a block.
    pub mallocs: u64,
    /// `free`s that gave a block back.
    pub frees: u64,
    /// `malloc`s that returned NULL for want of memory.
    pub failed_allocations: u64,
    /// `free`s of pointers the heap did not hand out (counted, otherwise ignored).
    pub invalid_frees: u64,
    /// `free`s of blocks that were free already (counted, otherwise ignored).
    pub double_frees: u64,
    /// Bytes the data region may grow to (the capacity of a fixed heap).
    pub max_bytes: u64,
    /// Bytes of the data region backed by memory now.
    pub mapped_bytes: u64,
    /// The most `mapped_bytes` has been.
    pub mapped_high: u64,
    /// Device memory the heap holds, metadata included.
    pub device_bytes: u64,
    /// Growths that kernels asked for and got.
    pub kernel_grows: u64,
    /// Growth requests from kernels that got nothing.
    pub kernel_grow_failures: u64,
    /// 1 for a growable heap, 0 for a fixed one.
    pub growable: u32,
}

/// One live heap and the device it is on.
struct Entry {
    heap: Heap,
    gpu: Arc<Gpu>,
}

type Shared = Arc<Mutex<Option<Entry>>>;

/// Live heaps by number; a destroyed heap's number leaves the map and is never handed out
/// again.
static HEAPS: Mutex<Option<HashMap<u64, Shared>>> = Mutex::new(None);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// One `Gpu` (toga's module loaded in the primary context) per device, made on first use.
static GPUS: Mutex<Option<HashMap<usize, Arc<Gpu>>>> = Mutex::new(None);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// A failure: its code and its message.
struct Failure(toga_status, String);

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let code = match &e {
            Error::NoDriver => TOGA_ERROR_NO_DRIVER,
            Error::NoDevice(_) => TOGA_ERROR_NO_DEVICE,
            Error::DeviceOutOfRange { .. } => TOGA_ERROR_INVALID_DEVICE,
            Error::HeapSizeZero | Error::HeapTooSmall { .. } => TOGA_ERROR_INVALID_SIZE,
            Error::HeapTooLarge { .. } => TOGA_ERROR_TOO_LARGE,
            Error::TooFewArenas { .. } => TOGA_ERROR_INVALID_VALUE,
            Error::NotGrowable => TOGA_ERROR_NOT_GROWABLE,
            Error::Driver(d) if d.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                TOGA_ERROR_OUT_OF_MEMORY
            }
            Error::Driver(_) => TOGA_ERROR_CUDA,
            #[allow(unreachable_patterns)]
            _ => TOGA_ERROR_INTERNAL,
        };
        Failure(code, e.to_string())
    }
}

impl From<toga::cudarc::driver::DriverError> for Failure {
    fn from(e: toga::cudarc::driver::DriverError) -> Self {
        Error::Driver(e).into()
    }
}

fn invalid(what: &str) -> Failure {
    Failure(TOGA_ERROR_INVALID_VALUE, what.to_owned())
}

fn set_message(text: &str) {
    let text = CString::new(text.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|m| *m.borrow_mut() = text);
}

/// Run `f`, turning its error or panic into a status and the thread's message.
fn api(f: impl FnOnce() -> Result<(), Failure>) -> toga_status {
    set_message("");
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => TOGA_SUCCESS,
        Ok(Err(Failure(code, text))) => {
            set_message(&text);
            code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            set_message(&format!("internal error in toga: {what}"));
            TOGA_ERROR_INTERNAL
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while a lock was held is reported as it happened; the maps stay usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn gpu(device: c_int) -> Result<Arc<Gpu>, Failure> {
    let ordinal = usize::try_from(device).map_err(|_| {
        Failure(
            TOGA_ERROR_INVALID_DEVICE,
            format!("device {device} does not exist: ordinals start at 0"),
        )
    })?;
    // Checks the driver and the ordinal before anything is cached.
    toga::gpu::context(ordinal)?;
    let mut gpus = lock(&GPUS);
    let gpus = gpus.get_or_insert_with(HashMap::new);
    if let Some(g) = gpus.get(&ordinal) {
        return Ok(g.clone());
    }
    let g = Arc::new(Gpu::open(ordinal)?);
    gpus.insert(ordinal, g.clone());
    Ok(g)
}

fn stream_of(gpu: &Gpu, stream: *mut c_void) -> Arc<CudaStream> {
    // SAFETY: the caller passes a stream of the device's primary context, alive for the call
    // (the API's rule); cudarc does not destroy a borrowed stream.
    unsafe { gpu.context().wrap_borrowed_stream(stream as sys::CUstream) }
}

fn find(heap: toga_heap) -> Result<Shared, Failure> {
    if heap.id == 0 {
        return Err(Failure(
            TOGA_ERROR_INVALID_HANDLE,
            "the heap handle is 0".into(),
        ));
    }
    let heaps = lock(&HEAPS);
    heaps
        .as_ref()
        .and_then(|h| h.get(&heap.id))
        .cloned()
        .ok_or_else(|| {
            let why = if heap.id < NEXT_ID.load(Ordering::Relaxed) {
                "was destroyed"
            } else {
                "was never created"
            };
            Failure(TOGA_ERROR_INVALID_HANDLE, format!("heap {} {why}", heap.id))
        })
}

/// Run `f` on a live heap.
fn with_heap<R>(
    heap: toga_heap,
    f: impl FnOnce(&mut Entry) -> Result<R, Failure>,
) -> Result<R, Failure> {
    let shared = find(heap)?;
    let mut entry = lock(&shared);
    match entry.as_mut() {
        Some(e) => f(e),
        None => Err(Failure(
            TOGA_ERROR_INVALID_HANDLE,
            format!("heap {} was destroyed", heap.id),
        )),
    }
}

fn register(heap: Heap, gpu: Arc<Gpu>, out: *mut toga_heap) -> Result<(), Failure> {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    lock(&HEAPS)
        .get_or_insert_with(HashMap::new)
        .insert(id, Arc::new(Mutex::new(Some(Entry { heap, gpu }))));
    // SAFETY: checked non-null by the caller of `register`.
    unsafe { out.write(toga_heap { id }) };
    Ok(())
}

/// A short, constant description of a status code (any `int`; unknown codes say so).
#[unsafe(no_mangle)]
pub extern "C" fn toga_status_string(status: c_int) -> *const c_char {
    let s: &'static CStr = match status {
        0 => c"success",
        1 => c"invalid value",
        2 => c"invalid heap handle",
        3 => c"invalid heap size",
        4 => c"size too large",
        5 => c"invalid device",
        6 => c"no CUDA driver",
        7 => c"no CUDA device",
        8 => c"heap not growable",
        9 => c"out of device memory",
        10 => c"CUDA error",
        11 => c"internal error",
        _ => c"unknown status code",
    };
    s.as_ptr()
}

/// The message of the last failed call on this thread ("" after a success). Valid until the
/// thread's next call of the API.
#[unsafe(no_mangle)]
pub extern "C" fn toga_last_error_message() -> *const c_char {
    LAST_ERROR.with(|m| m.borrow().as_ptr())
}

/// The number of CUDA devices.
///
/// # Safety
/// `count` is NULL (an error) or points to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn toga_device_count(count: *mut c_int) -> toga_status {
    api(|| {
        if count.is_null() {
            return Err(invalid("toga_device_count: `count` is NULL"));
        }
        let n = toga::device_count()?;
        // SAFETY: checked non-null; the caller's contract.
        unsafe { count.write(c_int::try_from(n).unwrap_or(c_int::MAX)) };
        Ok(())
    })
}

/// Create a fixed heap whose data region holds `bytes` bytes (rounded down to 4 KiB pages)
/// on device `device`, enqueued on `stream`, and write its handle to `*out`.
///
/// # Safety
/// `out` is NULL (an error) or writable; `stream` is NULL or a live stream of the device's
/// primary context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn toga_heap_create(
    device: c_int,
    bytes: u64,
    stream: *mut c_void,
    out: *mut toga_heap,
) -> toga_status {
    api(|| {
        if out.is_null() {
            return Err(invalid("toga_heap_create: `out` is NULL"));
        }
        // Before any CUDA work: sizes no device can hold.
        toga::heap::check_heap_size(bytes)?;
        let gpu = gpu(device)?;
        let s = stream_of(&gpu, stream);
        let heap = Heap::new(&gpu, &s, bytes)?;
        register(heap, gpu, out)
    })
}

/// Create a growable heap on device `device`, enqueued on `stream` (NULL `options`: every
/// default), and write its handle to `*out`. It maps memory as kernels need it, also while
/// they run (docs/growable.md).
///
/// # Safety
/// `options` is NULL or readable; otherwise as for [`toga_heap_create`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn toga_heap_create_growable(
    device: c_int,
    options: *const toga_growable_options,
    stream: *mut c_void,
    out: *mut toga_heap,
) -> toga_status {
    api(|| {
        if out.is_null() {
            return Err(invalid("toga_heap_create_growable: `out` is NULL"));
        }
        let o = if options.is_null() {
            toga_growable_options::default()
        } else {
            // SAFETY: non-null and readable (the caller's contract).
            unsafe { options.read() }
        };
        if o.flags & !TOGA_NO_KERNEL_GROWTH != 0 {
            return Err(invalid(&format!(
                "toga_heap_create_growable: unknown flags {:#x}",
                o.flags
            )));
        }
        if o.max_bytes != 0 && o.initial_bytes > o.max_bytes {
            return Err(Failure(
                TOGA_ERROR_TOO_LARGE,
                format!(
                    "initial size {} B is above the maximum of {} B",
                    o.initial_bytes, o.max_bytes
                ),
            ));
        }
        let gpu = gpu(device)?;
        let s = stream_of(&gpu, stream);
        let mut b = Heap::growable().grow_in_kernel(o.flags & TOGA_NO_KERNEL_GROWTH == 0);
        if o.initial_bytes != 0 {
            b = b.initial_bytes(o.initial_bytes);
        }
        if o.max_bytes != 0 {
            b = b.max_bytes(o.max_bytes);
        }
        if o.release_threshold != 0 {
            b = b.release_threshold(o.release_threshold);
        }
        let heap = b.create(&gpu, &s)?;
        register(heap, gpu, out)
    })
}

/// The heap's device address: what `toga_bind` takes in a kernel (`toga_bind_device_heap` in
/// `toga.cuh` does that for you).
///
/// # Safety
/// `base` is NULL (an error) or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn toga_heap_base(heap: toga_heap, base: *mut *mut c_void) -> toga_status {
    api(|| {
        if base.is_null() {
            return Err(invalid("toga_heap_base: `base` is NULL"));
        }
        let b = with_heap(heap, |e| Ok(e.heap.base()))?;
        // SAFETY: checked non-null; the caller's contract.
        unsafe { base.write(b as *mut c_void) };
        Ok(())
    })
}

/// Read the heap's statistics into `*stats`, ordered on `stream` (synchronizes it).
///
/// # Safety
/// `stats` is NULL (an error) or writable; `stream` as for [`toga_heap_create`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn toga_heap_stats(
    heap: toga_heap,
    stream: *mut c_void,
    stats: *mut toga_stats,
) -> toga_status {
    api(|| {
        if stats.is_null() {
            return Err(invalid("toga_heap_stats: `stats` is NULL"));
        }
        let s = with_heap(heap, |e| {
            let st = stream_of(&e.gpu, stream);
            Ok((e.heap.stats(&st)?, e.heap.is_growable()))
        })?;
        let (s, growable) = s;
        let out = toga_stats {
            capacity_bytes: s.capacity_bytes,
            reserved_bytes: s.reserved_bytes,
            reserved_high: s.reserved_high,
            used_bytes: s.used_bytes,
            used_high: s.used_high,
            live_blocks: s.live_blocks(),
            live_large: s.live_large,
            mallocs: s.mallocs,
            frees: s.frees,
            failed_allocations: s.failed_allocations,
            invalid_frees: s.invalid_frees,
            double_frees: s.double_frees,
            max_bytes: s.max_bytes,
            mapped_bytes: s.mapped_bytes,
            mapped_high: s.mapped_high,
            device_bytes: s.device_bytes,
            kernel_grows: s.kernel_grows,
            kernel_grow_failures: s.kernel_grow_failures,
            growable: growable.into(),
        };
        // SAFETY: checked non-null; the caller's contract.
        unsafe { stats.write(out) };
        Ok(())
    })
}

/// Give back what the heap holds but does not use (stashed large blocks, empty bins and
/// chunks), in order on `stream`. Safe while kernels use the heap.
///
/// # Safety
/// `stream` as for [`toga_heap_create`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn toga_heap_trim(heap: toga_heap, stream: *mut c_void) -> toga_status {
    api(|| with_heap(heap, |e| Ok(e.heap.trim(&stream_of(&e.gpu, stream))?)))
}

/// Growable heap: unmap what is mapped beyond `keep_bytes` and not in use (synchronizes
/// `stream`); `*released` (if not NULL) gets the bytes given back. A fixed heap releases 0.
///
/// # Safety
/// `released` is NULL or writable; `stream` as for [`toga_heap_create`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn toga_heap_trim_to(
    heap: toga_heap,
    stream: *mut c_void,
    keep_bytes: u64,
    released: *mut u64,
) -> toga_status {
    api(|| {
        let r = with_heap(heap, |e| {
            Ok(e.heap.trim_to(&stream_of(&e.gpu, stream), keep_bytes)?)
        })?;
        if !released.is_null() {
            // SAFETY: non-null; the caller's contract.
            unsafe { released.write(r) };
        }
        Ok(())
    })
}

/// Growable heap: map `bytes` more (rounded up to granules) and hand them to the allocator,
/// in order on `stream`; `*mapped` (if not NULL) gets the mapped bytes after it. A fixed heap
/// gives [`TOGA_ERROR_NOT_GROWABLE`]; 0 bytes or more
/// than the maximum allows is an error and changes nothing.
///
/// # Safety
/// `mapped` is NULL or writable; `stream` as for [`toga_heap_create`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn toga_heap_grow(
    heap: toga_heap,
    stream: *mut c_void,
    bytes: u64,
    mapped: *mut u64,
) -> toga_status {
    api(|| {
        let m = with_heap(heap, |e| {
            if !e.heap.is_growable() {
                return Err(Error::NotGrowable.into());
            }
            if bytes == 0 {
                return Err(Failure(
                    TOGA_ERROR_INVALID_SIZE,
                    "toga_heap_grow: 0 bytes".into(),
                ));
            }
            Ok(e.heap.grow(&stream_of(&e.gpu, stream), bytes)?)
        })?;
        if !mapped.is_null() {
            // SAFETY: non-null; the caller's contract.
            unsafe { mapped.write(m) };
        }
        Ok(())
    })
}

/// Wait for `stream`; then a growable heap grows ahead or trims back, as CUDA's pools do at a
/// synchronization (`toga::Heap::synchronize`).
///
/// # Safety
/// `stream` as for [`toga_heap_create`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn toga_heap_synchronize(
    heap: toga_heap,
    stream: *mut c_void,
) -> toga_status {
    api(|| {
        with_heap(heap, |e| {
            Ok(e.heap.synchronize(&stream_of(&e.gpu, stream))?)
        })
    })
}

/// Free every block at once: the heap is re-initialized in order on `stream`. Every kernel
/// using the heap must be ordered before it.
///
/// # Safety
/// `stream` as for [`toga_heap_create`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn toga_heap_reset(heap: toga_heap, stream: *mut c_void) -> toga_status {
    api(|| with_heap(heap, |e| Ok(e.heap.reset(&stream_of(&e.gpu, stream))?)))
}

/// Destroy the heap, in order on `stream` (every kernel using it must be ordered before).
/// The handle is invalid afterwards; using it again is
/// [`TOGA_ERROR_INVALID_HANDLE`]. Unbind it first
/// (`toga_unbind_device_heap`) if kernels that allocate still run later.
///
/// # Safety
/// `stream` as for [`toga_heap_create`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn toga_heap_destroy(heap: toga_heap, stream: *mut c_void) -> toga_status {
    api(|| {
        let shared = find(heap)?;
        let entry = lock(&shared).take();
        if let Some(h) = lock(&HEAPS).as_mut() {
            h.remove(&heap.id);
        }
        let Some(e) = entry else {
            return Err(Failure(
                TOGA_ERROR_INVALID_HANDLE,
                format!("heap {} was destroyed", heap.id),
            ));
        };
        let s = stream_of(&e.gpu, stream);
        e.heap.destroy(&s)?;
        Ok(())
    })
}

/// The PTX of toga's device functions (`toga_malloc` and the rest, `.visible .func`), as built
/// with this library: `nvcc -arch=sm_XX -dc` makes the relocatable device object from it, and
/// a driver-API program may JIT-link it instead. A NUL-terminated constant.
#[unsafe(no_mangle)]
pub extern "C" fn toga_device_ptx() -> *const c_char {
    DEVICE_PTX.as_ptr().cast()
}

/// [`toga_device_ptx`]'s text and a NUL (PTX is text without NUL bytes; a test checks).
static DEVICE_PTX: &[u8] = concat!(include_str!(env!("TOGA_DEVICE_PTX")), "\0").as_bytes();
