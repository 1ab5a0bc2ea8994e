//! The memory of a growable heap: a virtual address range reserved up front, with physical
//! memory mapped into it granule by granule (CUDA's virtual memory management), and the growth
//! service that maps memory for kernels that run out.
//!
//! ```text
//!  va                       data = va + data_offset
//!  │ metadata (mapped once) │ granule 0 │ granule 1 │ ... │ granule n-1 │
//!                             mapped      unmapped          mapped        (one handle each)
//! ```
//! Each data granule has its own physical allocation (`cuMemCreate`), so any granule can be
//! unmapped alone when the heap trims, whichever order they were mapped in.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use cudarc::driver::{CudaContext, sys};
use toga_kernels::heap::Mailbox;

use crate::error::{Error, Result};

fn check(r: sys::CUresult) -> Result<()> {
    r.result().map_err(Error::from)
}

/// Whether device `ordinal` supports virtual memory management (`cuMemMap`).
pub(crate) fn supported(ctx: &Arc<CudaContext>) -> bool {
    use sys::CUdevice_attribute as A;
    std::env::var_os("TOGA_NO_VMM").is_none()
        && ctx
            .attribute(A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
            .is_ok_and(|v| v != 0)
}

/// The physical-allocation properties for device memory on `ordinal`.
fn device_prop(ordinal: i32) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct; zero is its documented default for every field we leave.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    prop
}

/// The driver's granularity for device memory on `ordinal`: mappings are multiples of it.
pub(crate) fn granularity(ordinal: i32) -> Result<u64> {
    let prop = device_prop(ordinal);
    let mut g = 0usize;
    // SAFETY: writes one usize.
    check(unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    Ok(g as u64)
}

/// A reserved range with its mapped granules.
pub(crate) struct Vmm {
    ordinal: i32,
    va: u64,
    va_bytes: u64,
    meta_bytes: u64,
    meta_handle: sys::CUmemGenericAllocationHandle,
    /// Device address of granule 0.
    data: u64,
    granule: u64,
    /// One physical allocation per mapped granule.
    handles: Vec<Option<sys::CUmemGenericAllocationHandle>>,
    mapped: u64,
    mapped_high: u64,
    /// Other devices that may read and write the mapping (`Heap::set_peer_access`).
    peers: Vec<i32>,
    /// Whether every physical allocation can be exported as a POSIX file descriptor (IPC).
    exportable: bool,
}

// SAFETY: the handles are plain integers owned by this struct; the driver calls it makes are
// thread-safe, and the struct is only used under a mutex.
unsafe impl Send for Vmm {}

impl Vmm {
    /// Reserve `va_bytes` aligned to `granule` and map its first `meta_bytes` (a multiple of
    /// `granule`, the metadata). The data granules start unmapped.
    /// Every physical allocation is exportable to other processes as a POSIX file descriptor
    /// when `exportable` (`Heap::export_ipc`).
    pub(crate) fn reserve_with(
        ordinal: i32,
        va_bytes: u64,
        meta_bytes: u64,
        granule: u64,
        exportable: bool,
    ) -> Result<Self> {
        let mut va = 0;
        // SAFETY: writes one device pointer.
        check(unsafe {
            sys::cuMemAddressReserve(&mut va, va_bytes as usize, granule as usize, 0, 0)
        })?;
        let mut vmm = Self {
            ordinal,
            va,
            va_bytes,
            meta_bytes: 0,
            meta_handle: 0,
            data: va + meta_bytes,
            granule,
            handles: vec![None; ((va_bytes - meta_bytes) / granule) as usize],
            mapped: 0,
            mapped_high: 0,
            peers: Vec::new(),
            exportable,
        };
        // On error `vmm` drops, unmaps and frees the reservation.
        vmm.meta_handle = vmm.map_one(va, meta_bytes)?;
        vmm.meta_bytes = meta_bytes;
        vmm.allow(va, meta_bytes)?;
        Ok(vmm)
    }

    /// Create `bytes` of device memory and map it at `at` (not yet accessible: see
    /// [`Vmm::allow`]).
    fn map_one(&self, at: u64, bytes: u64) -> Result<sys::CUmemGenericAllocationHandle> {
        let mut prop = device_prop(self.ordinal);
        if self.exportable {
            prop.requestedHandleTypes =
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        }
        let mut handle = 0;
        // SAFETY: writes one handle.
        check(unsafe { sys::cuMemCreate(&mut handle, bytes as usize, &prop, 0) })?;
        // SAFETY: `at..at+bytes` lies in our reservation and is unmapped.
        let mapped = check(unsafe { sys::cuMemMap(at, bytes as usize, 0, handle, 0) });
        if let Err(e) = mapped {
            // SAFETY: the handle is ours and unmapped.
            unsafe { sys::cuMemRelease(handle) };
            return Err(e);
        }
        Ok(handle)
    }

    /// Let the device read and write `at..at+bytes`, all mapped: one call for a whole run of
    /// granules (it costs about as much as a mapping).
    fn allow(&self, at: u64, bytes: u64) -> Result<()> {
        let access: Vec<_> = std::iter::once(self.ordinal)
            .chain(self.peers.iter().copied())
            .map(|device| sys::CUmemAccessDesc {
                location: device_prop(device).location,
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        // SAFETY: the range is mapped; `access` holds `len` descriptors.
        check(unsafe { sys::cuMemSetAccess(at, bytes as usize, access.as_ptr(), access.len()) })
    }

    /// The reservation's device address (the heap's base).
    pub(crate) fn base(&self) -> u64 {
        self.va
    }

    /// Bytes of one granule.
    pub(crate) fn granule(&self) -> u64 {
        self.granule
    }

    /// Bytes of data granules mapped now, and at most since the heap was made.
    pub(crate) fn mapped(&self) -> (u64, u64) {
        (self.mapped, self.mapped_high)
    }

    /// Bytes of the data region: what the heap may grow to.
    pub(crate) fn max_bytes(&self) -> u64 {
        self.handles.len() as u64 * self.granule
    }

    /// Bytes of device memory held in all (metadata included).
    pub(crate) fn device_bytes(&self) -> u64 {
        self.meta_bytes + self.mapped
    }

    /// The mapped granules as maximal runs `(first, count)`.
    pub(crate) fn mapped_runs(&self) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (i, h) in self.handles.iter().enumerate() {
            if h.is_none() {
                continue;
            }
            match runs.last_mut() {
                Some((first, count)) if *first + *count == i as u64 => *count += 1,
                _ => runs.push((i as u64, 1)),
            }
        }
        runs
    }

    /// Map granules for at least `bytes` more: an unmapped, aligned run of a power-of-two
    /// number of granules, so that the buddy tree can merge it into one block. Tries `step`
    /// bytes first (the growth policy's wish), then fewer down to what `bytes` needs. Returns
    /// the run's data offset and length in bytes; the heap is unchanged on error.
    pub(crate) fn grow(&mut self, bytes: u64, step: u64) -> Result<(u64, u64)> {
        let need = bytes.div_ceil(self.granule).max(1).next_power_of_two();
        let want = step.div_ceil(self.granule).max(need).next_power_of_two();
        let total = self.handles.len() as u64;
        let mut count = want.min(total.next_power_of_two());
        // A smaller run is tried when the device has no memory for a larger one.
        let mut failed = None;
        while count >= need {
            let mut first = 0;
            while first + count <= total {
                let range = first as usize..(first + count) as usize;
                if self.handles[range].iter().all(Option::is_none) {
                    match self.map_run(first, count) {
                        Ok(()) => return Ok((first * self.granule, count * self.granule)),
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                first += count;
            }
            count /= 2;
        }
        if let Some(e) = failed {
            return Err(e);
        }
        Err(Error::HeapTooLarge {
            requested: self.mapped + need * self.granule,
            limit: self.max_bytes(),
            why: "the growable heap's maximum (no free aligned range left)",
        })
    }

    /// Map the first granules, enough for `bytes` (a new heap's initial size).
    pub(crate) fn map_prefix(&mut self, bytes: u64) -> Result<()> {
        let count = bytes.div_ceil(self.granule).min(self.handles.len() as u64);
        self.map_run(0, count)
    }

    /// Map granules `first..first+count`, all or none.
    fn map_run(&mut self, first: u64, count: u64) -> Result<()> {
        let mut result = Ok(());
        for i in first..first + count {
            match self.map_one(self.data + i * self.granule, self.granule) {
                Ok(h) => self.handles[i as usize] = Some(h),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
            self.mapped += self.granule;
        }
        let at = self.data + first * self.granule;
        let result = result.and_then(|()| self.allow(at, count * self.granule));
        if result.is_err() {
            for i in first..first + count {
                self.unmap(i);
            }
        }
        self.mapped_high = self.mapped_high.max(self.mapped);
        result
    }

    /// Unmap the granules of `len` bytes at data offset `offset` (a run from [`Vmm::grow`]
    /// that never reached the heap).
    pub(crate) fn unmap_range(&mut self, offset: u64, len: u64) {
        for i in offset / self.granule..(offset + len) / self.granule {
            self.unmap(i);
        }
    }

    /// Unmap granule `i` and give its memory back. The heap no longer holds it (taken out of
    /// the tree by `toga_heap_take_granules`).
    pub(crate) fn unmap(&mut self, i: u64) {
        if let Some(h) = self.handles[i as usize].take() {
            // SAFETY: the granule is mapped with handle `h`, and nothing uses it any more.
            unsafe {
                sys::cuMemUnmap(self.data + i * self.granule, self.granule as usize);
                sys::cuMemRelease(h);
            }
            self.mapped -= self.granule;
        }
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        for i in 0..self.handles.len() as u64 {
            self.unmap(i);
        }
        // SAFETY: the metadata mapping and the reservation are ours; the heap made sure no
        // kernel uses them (it synchronized its stream first).
        unsafe {
            if self.meta_bytes != 0 {
                sys::cuMemUnmap(self.va, self.meta_bytes as usize);
                sys::cuMemRelease(self.meta_handle);
            }
            sys::cuMemAddressFree(self.va, self.va_bytes as usize);
        }
    }
}

/// The growth mailbox in pinned host memory, mapped into the device.
pub(crate) struct MailboxMemory {
    host: *mut Mailbox,
    device: u64,
}

// SAFETY: the pointer is to pinned host memory owned by this struct; every access to it is a
// volatile access to one aligned word.
unsafe impl Send for MailboxMemory {}
unsafe impl Sync for MailboxMemory {}

impl MailboxMemory {
    pub(crate) fn new() -> Result<Self> {
        let mut p = std::ptr::null_mut();
        // SAFETY: writes one pointer; the memory is zeroed below before any use.
        check(unsafe {
            sys::cuMemHostAlloc(&mut p, size_of::<Mailbox>(), sys::CU_MEMHOSTALLOC_DEVICEMAP)
        })?;
        let host = p as *mut Mailbox;
        // SAFETY: `host` is ours and large enough.
        unsafe { host.write(Mailbox::default()) };
        let mut device = 0;
        // SAFETY: `p` is mapped pinned memory.
        if let Err(e) = check(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, p, 0) }) {
            // SAFETY: ours.
            unsafe { sys::cuMemFreeHost(p) };
            return Err(e);
        }
        Ok(Self { host, device })
    }

    /// The mailbox's address in the device's address space.
    pub(crate) fn device(&self) -> u64 {
        self.device
    }

    pub(crate) fn read(&self, f: impl Fn(*mut Mailbox) -> *mut u64) -> u64 {
        // SAFETY: one aligned word of our pinned memory, written by the device at system scope.
        unsafe { std::ptr::read_volatile(f(self.host)) }
    }

    pub(crate) fn write(&self, f: impl Fn(*mut Mailbox) -> *mut u64, v: u64) {
        // SAFETY: as for `read`.
        unsafe { std::ptr::write_volatile(f(self.host), v) }
    }
}

impl Drop for MailboxMemory {
    fn drop(&mut self) {
        // SAFETY: ours; the heap stopped its service and synchronized before dropping this.
        unsafe { sys::cuMemFreeHost(self.host as *mut _) };
    }
}

/// What the growth service has done, for the heap's statistics.
#[derive(Default)]
pub(crate) struct ServiceCounts {
    pub(crate) granted: u64,
    pub(crate) denied: u64,
    /// Nanoseconds spent mapping for granted requests.
    pub(crate) map_ns: u64,
}

/// A host thread that answers the device's growth requests: it maps memory and writes the
/// range into the mailbox; the requesting device thread adds it to the heap (INV(HP5)).
pub(crate) struct Service {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// How often the service looks at the mailbox right after a request: growths come in bursts.
pub(crate) const POLL: Duration = Duration::from_micros(20);
/// The longest it sleeps while idle (the interval doubles from [`POLL`]): a first request after
/// a quiet spell waits at most this long to be seen, and an idle heap costs 5,000 wake-ups a
/// second instead of 50,000.
pub(crate) const IDLE_POLL: Duration = Duration::from_micros(200);

impl Service {
    pub(crate) fn start(
        ctx: Arc<CudaContext>,
        vmm: Arc<Mutex<Vmm>>,
        mailbox: Arc<MailboxMemory>,
        counts: Arc<Mutex<ServiceCounts>>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("toga-grow".into())
            .spawn(move || {
                let _ = ctx.bind_to_thread();
                let mut poll = POLL;
                while !flag.load(Ordering::Relaxed) {
                    let posted = mailbox.read(|m| unsafe { &raw mut (*m).request_seq });
                    let answered = mailbox.read(|m| unsafe { &raw mut (*m).reply_seq });
                    if posted == answered {
                        std::thread::sleep(poll);
                        poll = (poll * 2).min(IDLE_POLL);
                        continue;
                    }
                    poll = POLL;
                    let bytes = mailbox.read(|m| unsafe { &raw mut (*m).request_bytes });
                    let start = std::time::Instant::now();
                    // The reply is written under the lock, so that a heap reset (which
                    // takes the lock) sees each mapped range either answered or not yet
                    // mapped.
                    let len = {
                        let mut vmm = vmm.lock().unwrap();
                        let step = growth_step(vmm.mapped().0);
                        let (offset, len) = vmm.grow(bytes, step).unwrap_or((0, 0));
                        mailbox.write(|m| unsafe { &raw mut (*m).reply_offset }, offset);
                        mailbox.write(|m| unsafe { &raw mut (*m).reply_bytes }, len);
                        std::sync::atomic::fence(Ordering::SeqCst);
                        mailbox.write(|m| unsafe { &raw mut (*m).reply_seq }, posted);
                        len
                    };
                    let mut c = counts.lock().unwrap();
                    if len == 0 {
                        c.denied += 1;
                    } else {
                        c.granted += 1;
                        c.map_ns += start.elapsed().as_nanos() as u64;
                    }
                }
            })
            .expect("spawn the growth service thread");
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How much a growth maps beyond what the request needs: half of what is mapped already, so
/// that a heap that keeps growing doubles in a few steps instead of one granule at a time.
pub(crate) fn growth_step(mapped: u64) -> u64 {
    mapped / 2
}

/// Peer access and export (`Heap::set_peer_access`, `Heap::export_ipc`).
impl Vmm {
    /// Let `peers` (device ordinals, the heap's own excluded) read and write the whole mapping,
    /// now and every granule mapped later, like `cudaMemPoolSetAccess`.
    /// On error the list of peers is as before, so that later mappings still succeed.
    pub(crate) fn set_peers(&mut self, peers: &[i32]) -> Result<()> {
        let before = self.peers.clone();
        for &p in peers {
            if p != self.ordinal && !self.peers.contains(&p) {
                self.peers.push(p);
            }
        }
        let granted = self.allow(self.va, self.meta_bytes).and_then(|()| {
            self.mapped_runs()
                .into_iter()
                .try_for_each(|(first, count)| {
                    self.allow(self.data + first * self.granule, count * self.granule)
                })
        });
        if granted.is_err() {
            self.peers = before;
        }
        granted
    }

    /// Whether the physical allocations can be exported ([`Vmm::reserve_with`]).
    pub(crate) fn exportable(&self) -> bool {
        self.exportable
    }

    /// The metadata's handle and bytes, then `(data offset, handle)` of every mapped granule.
    pub(crate) fn allocations(
        &self,
    ) -> (
        sys::CUmemGenericAllocationHandle,
        u64,
        Vec<(u64, sys::CUmemGenericAllocationHandle)>,
    ) {
        let granules = self
            .handles
            .iter()
            .enumerate()
            .filter_map(|(i, h)| h.map(|h| (i as u64 * self.granule, h)))
            .collect();
        (self.meta_handle, self.meta_bytes, granules)
    }

    /// Bytes of the reservation.
    pub(crate) fn va_bytes(&self) -> u64 {
        self.va_bytes
    }
}
