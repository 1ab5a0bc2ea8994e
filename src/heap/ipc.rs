//! A growable heap shared with another process, the analogue of CUDA's IPC pools
//! (`cudaMemPoolExportToShareableHandle` / `cudaMemPoolImportFromShareableHandle` /
//! `cudaMemPoolImportPointer`; `docs/host-api.md`, "Another process").
//!
//! The owner makes the heap with [`HeapBuilder::ipc_exportable`](super::HeapBuilder::ipc_exportable),
//! exports it ([`Heap::export_ipc`]): an [`IpcDescriptor`] (plain bytes) and one POSIX file
//! descriptor per physical allocation (the metadata and each mapped granule). The importer
//! maps them ([`ImportedHeap::import`]) and reads and writes the blocks whose pointers the
//! owner passes it ([`ImportedHeap::translate`]). [`send_export`] and [`recv_export`] carry an
//! export over a Unix socket (`SCM_RIGHTS`).
//!
//! The importer may not allocate or free ([`Error::ImportedHeap`]): the allocator's metadata
//! lives in the owner's address space (pointers in it are the owner's), and its kernels are
//! bound to the owner's module. The import is of the granules mapped at export time: export a
//! heap whose mapping stays put (initial size = maximum, or no trim below what was exported).

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, sys};
use toga_kernels::heap::{HEAP_MAGIC, HeapHeader};

use super::{Backing, Heap, HostBlock, check};
use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// The first word of a serialized [`IpcDescriptor`].
const DESCRIPTOR_MAGIC: u64 = u64::from_le_bytes(*b"togaipc1");
/// File descriptors per message on the socket (the kernel allows at most 253).
const FDS_PER_MESSAGE: usize = 128;

const POSIX_FD: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// What an importer needs besides the file descriptors: where each allocation goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpcDescriptor {
    pid: u32,
    device: u64,
    base: u64,
    va_bytes: u64,
    meta_bytes: u64,
    data_offset: u64,
    granule: u64,
    /// Data-region offsets of the exported granules, in the order of their descriptors
    /// (after the metadata's).
    granules: Vec<u64>,
}

impl IpcDescriptor {
    /// The exporting process's id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The heap's base address in the exporting process.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// How many file descriptors go with it: the metadata's, then one per granule.
    pub fn fd_count(&self) -> usize {
        1 + self.granules.len()
    }

    /// The descriptor as bytes, to send to another process.
    pub fn to_bytes(&self) -> Vec<u8> {
        let head = [
            DESCRIPTOR_MAGIC,
            self.pid as u64,
            self.device,
            self.base,
            self.va_bytes,
            self.meta_bytes,
            self.data_offset,
            self.granule,
            self.granules.len() as u64,
        ];
        head.iter()
            .chain(&self.granules)
            .flat_map(|w| w.to_le_bytes())
            .collect()
    }

    /// Read a descriptor written by [`IpcDescriptor::to_bytes`]; anything else is refused.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let bad = |why: &str| Error::Ipc(format!("not a toga heap descriptor: {why}"));
        if !bytes.len().is_multiple_of(8) || bytes.len() < 9 * 8 {
            return Err(bad("wrong length"));
        }
        let w: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        if w[0] != DESCRIPTOR_MAGIC {
            return Err(bad("wrong magic"));
        }
        let n = w[8] as usize;
        if w.len() != 9 + n {
            return Err(bad("wrong number of granules"));
        }
        let d = Self {
            pid: w[1] as u32,
            device: w[2],
            base: w[3],
            va_bytes: w[4],
            meta_bytes: w[5],
            data_offset: w[6],
            granule: w[7],
            granules: w[9..].to_vec(),
        };
        let fits = d.granule > 0
            && d.meta_bytes <= d.data_offset
            && d.granules.iter().all(|&g| {
                g.is_multiple_of(d.granule) && d.data_offset + g + d.granule <= d.va_bytes
            });
        if !fits {
            return Err(bad("granules outside the reservation"));
        }
        Ok(d)
    }
}

/// A heap's export: its descriptor and the file descriptors, in its order.
#[derive(Debug)]
pub struct IpcExport {
    /// Where each allocation goes.
    pub descriptor: IpcDescriptor,
    /// One per physical allocation: the metadata's, then each granule's.
    pub fds: Vec<OwnedFd>,
}

impl Heap {
    /// Export a growable heap made with
    /// [`HeapBuilder::ipc_exportable`](super::HeapBuilder::ipc_exportable) to another process:
    /// its descriptor and one POSIX file descriptor per physical allocation, like
    /// `cudaMemPoolExportToShareableHandle`. Send them with [`send_export`]. The export covers
    /// the granules mapped now.
    pub fn export_ipc(&self) -> Result<IpcExport> {
        let Backing::Growable(g) = &self.backing else {
            return Err(Error::Ipc(
                "only a growable heap can be exported (a fixed heap's pool is not exportable)"
                    .into(),
            ));
        };
        let vmm = g.vmm.lock().unwrap();
        if !vmm.exportable() {
            return Err(Error::Ipc(
                "the heap was not made exportable: build it with HeapBuilder::ipc_exportable(true)"
                    .into(),
            ));
        }
        self.stream.context().bind_to_thread()?;
        let (meta, meta_bytes, granules) = vmm.allocations();
        let mut fds = Vec::with_capacity(1 + granules.len());
        for h in std::iter::once(meta).chain(granules.iter().map(|g| g.1)) {
            let mut fd: i32 = -1;
            // SAFETY: writes one int, a new file descriptor we then own.
            check(unsafe {
                sys::cuMemExportToShareableHandle(&mut fd as *mut i32 as *mut _, h, POSIX_FD, 0)
            })?;
            // SAFETY: a fresh descriptor from the driver, owned by nobody else.
            fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        Ok(IpcExport {
            descriptor: IpcDescriptor {
                pid: std::process::id(),
                device: self.device() as u64,
                base: self.base,
                va_bytes: vmm.va_bytes(),
                meta_bytes,
                data_offset: self.geometry.data_offset,
                granule: vmm.granule(),
                granules: granules.iter().map(|g| g.0).collect(),
            },
            fds,
        })
    }
}

/// A heap of another process, mapped into this one (read and write its blocks only).
pub struct ImportedHeap {
    ctx: Arc<CudaContext>,
    va: u64,
    va_bytes: u64,
    /// Mapped ranges: address, bytes, handle.
    maps: Vec<(u64, u64, sys::CUmemGenericAllocationHandle)>,
    descriptor: IpcDescriptor,
}

// SAFETY: the handles and addresses are plain integers; the driver API is thread-safe.
unsafe impl Send for ImportedHeap {}
// SAFETY: as above; no method mutates.
unsafe impl Sync for ImportedHeap {}

impl ImportedHeap {
    /// Map a heap that another process exported ([`Heap::export_ipc`]) on `gpu`, like
    /// `cudaMemPoolImportFromShareableHandle`. Refused with [`Error::Ipc`] when the exporting
    /// process has exited, when the descriptors do not match the descriptor, or when the memory
    /// holds no toga heap.
    pub fn import(gpu: &Gpu, descriptor: &IpcDescriptor, fds: Vec<OwnedFd>) -> Result<Self> {
        let d = descriptor;
        if !std::path::Path::new(&format!("/proc/{}", d.pid)).exists() {
            return Err(Error::Ipc(format!(
                "the exporting process {} has exited: its heap has no owner to allocate and free",
                d.pid
            )));
        }
        if fds.len() != d.fd_count() {
            return Err(Error::Ipc(format!(
                "{} file descriptors for a heap of {} allocations",
                fds.len(),
                d.fd_count()
            )));
        }
        let ctx = gpu.context().clone();
        ctx.bind_to_thread()?;
        let mut va = 0;
        // SAFETY: writes one address; the owner's base is only a hint.
        check(unsafe {
            sys::cuMemAddressReserve(&mut va, d.va_bytes as usize, d.granule as usize, d.base, 0)
        })?;
        let mut heap = Self {
            ctx,
            va,
            va_bytes: d.va_bytes,
            maps: Vec::new(),
            descriptor: d.clone(),
        };
        let places = std::iter::once((va, d.meta_bytes)).chain(
            d.granules
                .iter()
                .map(|&g| (va + d.data_offset + g, d.granule)),
        );
        for ((at, bytes), fd) in places.zip(&fds) {
            let mut h = 0;
            // SAFETY: writes one handle; the fd stays ours (the driver does not take it).
            check(unsafe {
                sys::cuMemImportFromShareableHandle(
                    &mut h,
                    fd.as_raw_fd() as usize as *mut _,
                    POSIX_FD,
                )
            })
            .map_err(|e| Error::Ipc(format!("a descriptor is not a CUDA allocation: {e}")))?;
            // SAFETY: `at..at+bytes` lies in our reservation, unmapped.
            if let Err(e) = check(unsafe { sys::cuMemMap(at, bytes as usize, 0, h, 0) }) {
                // SAFETY: ours, unmapped.
                unsafe { sys::cuMemRelease(h) };
                return Err(Error::Ipc(format!(
                    "an allocation does not fit its place in the heap: {e}"
                )));
            }
            heap.maps.push((at, bytes, h));
            let access = sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id: gpu.info().ordinal as i32,
                },
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: the range is mapped.
            check(unsafe { sys::cuMemSetAccess(at, bytes as usize, &access, 1) })?;
        }
        // The header names a toga heap laid out as the descriptor says.
        let mut magic = 0u64;
        // SAFETY: the header's first word (its magic) into `magic`.
        check(unsafe { sys::cuMemcpyDtoH_v2(&mut magic as *mut u64 as *mut _, va, 8) })?;
        let base_at = std::mem::offset_of!(HeapHeader, geometry) as u64;
        let mut owner_base = 0u64;
        // SAFETY: one word of the header's geometry (its `base`, the first field).
        check(unsafe {
            sys::cuMemcpyDtoH_v2(&mut owner_base as *mut u64 as *mut _, va + base_at, 8)
        })?;
        if magic != HEAP_MAGIC || owner_base != d.base {
            return Err(Error::Ipc(
                "the imported memory holds no toga heap (wrong magic or base in its header)".into(),
            ));
        }
        Ok(heap)
    }

    /// The heap's base in this process.
    pub fn base(&self) -> u64 {
        self.va
    }

    /// The descriptor it was imported from.
    pub fn descriptor(&self) -> &IpcDescriptor {
        &self.descriptor
    }

    /// This process's address of the block at `owner_ptr` in the exporting process, like
    /// `cudaMemPoolImportPointer`. Refused for a pointer outside the exported granules.
    pub fn translate(&self, owner_ptr: u64) -> Result<u64> {
        let d = &self.descriptor;
        let data = d.base + d.data_offset;
        let in_granule = owner_ptr
            .checked_sub(data)
            .map(|off| off - off % d.granule)
            .is_some_and(|g| d.granules.contains(&g));
        if !in_granule {
            return Err(Error::Ipc(format!(
                "{owner_ptr:#x} is not in a granule of the exported heap"
            )));
        }
        Ok(owner_ptr - d.base + self.va)
    }

    /// Always refused: only the owner allocates ([`Error::ImportedHeap`]).
    pub fn alloc_async(&self, _bytes: u64, _stream: &Arc<CudaStream>) -> Result<HostBlock> {
        Err(Error::ImportedHeap("allocate"))
    }

    /// Always refused: only the owner frees ([`Error::ImportedHeap`]).
    pub fn free_async(&self, _ptr: u64, _stream: &Arc<CudaStream>) -> Result<()> {
        Err(Error::ImportedHeap("free"))
    }
}

impl Drop for ImportedHeap {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: ours; the caller's kernels that use the mapping are done (as for any
        // unmapping, the caller synchronizes first).
        unsafe {
            for &(at, bytes, h) in &self.maps {
                sys::cuMemUnmap(at, bytes as usize);
                sys::cuMemRelease(h);
            }
            sys::cuMemAddressFree(self.va, self.va_bytes as usize);
        }
    }
}

// The socket transport: `sendmsg`/`recvmsg` with `SCM_RIGHTS`, declared here for Linux's
// 64-bit ABIs (glibc's and musl's `msghdr` agree on these fields' offsets there).

#[repr(C)]
struct IoVec {
    base: *mut std::ffi::c_void,
    len: usize,
}

#[repr(C)]
struct MsgHdr {
    name: *mut std::ffi::c_void,
    namelen: u32,
    iov: *mut IoVec,
    iovlen: usize,
    control: *mut std::ffi::c_void,
    controllen: usize,
    flags: i32,
}

/// `struct cmsghdr`: 16 bytes, the data after it.
const CMSG_HEADER: usize = 16;
const SOL_SOCKET: i32 = 1;
const SCM_RIGHTS: i32 = 1;
const MSG_CMSG_CLOEXEC: i32 = 0x4000_0000;

unsafe extern "C" {
    fn sendmsg(fd: i32, msg: *const MsgHdr, flags: i32) -> isize;
    fn recvmsg(fd: i32, msg: *mut MsgHdr, flags: i32) -> isize;
}

fn io(e: std::io::Error) -> Error {
    Error::Ipc(format!("socket: {e}"))
}

/// Send `export` over a connected Unix socket: the descriptor's bytes, then the file
/// descriptors (`SCM_RIGHTS`).
#[cfg(target_os = "linux")]
pub fn send_export(sock: &mut UnixStream, export: &IpcExport) -> Result<()> {
    let bytes = export.descriptor.to_bytes();
    sock.write_all(&(bytes.len() as u64).to_le_bytes())
        .map_err(io)?;
    sock.write_all(&bytes).map_err(io)?;
    for batch in export.fds.chunks(FDS_PER_MESSAGE) {
        let mut byte = [0u8; 1];
        let mut iov = IoVec {
            base: byte.as_mut_ptr() as *mut _,
            len: 1,
        };
        let data = batch.len() * 4;
        let mut control = vec![0u64; (CMSG_HEADER + data).div_ceil(8)];
        let cbytes = control.as_mut_ptr() as *mut u8;
        // SAFETY: `control` holds the header and `batch.len()` ints.
        unsafe {
            (cbytes as *mut usize).write(CMSG_HEADER + data);
            (cbytes.add(8) as *mut i32).write(SOL_SOCKET);
            (cbytes.add(12) as *mut i32).write(SCM_RIGHTS);
            for (k, fd) in batch.iter().enumerate() {
                (cbytes.add(CMSG_HEADER + 4 * k) as *mut i32).write(fd.as_raw_fd());
            }
        }
        let msg = MsgHdr {
            name: std::ptr::null_mut(),
            namelen: 0,
            iov: &mut iov,
            iovlen: 1,
            control: cbytes as *mut _,
            controllen: control.len() * 8,
            flags: 0,
        };
        // SAFETY: every pointer in `msg` is valid for the call.
        if unsafe { sendmsg(sock.as_raw_fd(), &msg, 0) } != 1 {
            return Err(io(std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Receive what [`send_export`] sent. A peer that closed the socket first (for example a
/// process that exited) is a clear error.
#[cfg(target_os = "linux")]
pub fn recv_export(sock: &mut UnixStream) -> Result<(IpcDescriptor, Vec<OwnedFd>)> {
    let closed = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => Error::Ipc(
            "the exporting process closed the socket before it sent the heap (has it exited?)"
                .into(),
        ),
        _ => io(e),
    };
    let mut len = [0u8; 8];
    sock.read_exact(&mut len).map_err(closed)?;
    let len = u64::from_le_bytes(len) as usize;
    if len > 1 << 30 {
        return Err(Error::Ipc("not a toga heap descriptor: too long".into()));
    }
    let mut bytes = vec![0u8; len];
    sock.read_exact(&mut bytes).map_err(closed)?;
    let descriptor = IpcDescriptor::from_bytes(&bytes)?;
    let mut fds = Vec::with_capacity(descriptor.fd_count());
    while fds.len() < descriptor.fd_count() {
        let mut byte = [0u8; 1];
        let mut iov = IoVec {
            base: byte.as_mut_ptr() as *mut _,
            len: 1,
        };
        let mut control = vec![0u64; (CMSG_HEADER + 4 * FDS_PER_MESSAGE).div_ceil(8)];
        let mut msg = MsgHdr {
            name: std::ptr::null_mut(),
            namelen: 0,
            iov: &mut iov,
            iovlen: 1,
            control: control.as_mut_ptr() as *mut _,
            controllen: control.len() * 8,
            flags: 0,
        };
        // SAFETY: every pointer in `msg` is valid for the call.
        let n = unsafe { recvmsg(sock.as_raw_fd(), &mut msg, MSG_CMSG_CLOEXEC) };
        if n < 0 {
            return Err(io(std::io::Error::last_os_error()));
        }
        if n == 0 {
            return Err(closed(std::io::ErrorKind::UnexpectedEof.into()));
        }
        let cbytes = control.as_ptr() as *const u8;
        // SAFETY: the kernel wrote `msg.controllen` bytes of control messages; one is read.
        let (clen, level, kind) = unsafe {
            (
                (cbytes as *const usize).read(),
                (cbytes.add(8) as *const i32).read(),
                (cbytes.add(12) as *const i32).read(),
            )
        };
        if msg.controllen < CMSG_HEADER || level != SOL_SOCKET || kind != SCM_RIGHTS {
            return Err(Error::Ipc(
                "a message without file descriptors where the heap's were expected".into(),
            ));
        }
        for k in 0..(clen - CMSG_HEADER) / 4 {
            // SAFETY: a descriptor the kernel just installed in this process, ours alone.
            fds.push(unsafe {
                OwnedFd::from_raw_fd((cbytes.add(CMSG_HEADER + 4 * k) as *const i32).read())
            });
        }
    }
    Ok((descriptor, fds))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    fn descriptor(granules: usize) -> IpcDescriptor {
        IpcDescriptor {
            pid: std::process::id(),
            device: 0,
            base: 0x7f00_0000_0000,
            va_bytes: (4 + 2 * granules as u64) << 21,
            meta_bytes: 2 << 21,
            data_offset: 4 << 21,
            granule: 2 << 21,
            granules: (0..granules as u64).map(|g| (2 * g) << 21).collect(),
        }
    }

    #[test]
    fn a_descriptor_survives_its_bytes_and_garbage_is_refused() {
        let d = descriptor(5);
        assert_eq!(IpcDescriptor::from_bytes(&d.to_bytes()).unwrap(), d);
        assert_eq!(d.fd_count(), 6);
        let mut bytes = d.to_bytes();
        for bad in [&b"togaipc1"[..], &bytes[..bytes.len() - 8], &[0u8; 80][..]] {
            assert!(matches!(IpcDescriptor::from_bytes(bad), Err(Error::Ipc(_))));
        }
        // A granule outside the reservation.
        bytes[9 * 8..10 * 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let e = IpcDescriptor::from_bytes(&bytes).unwrap_err();
        assert!(e.to_string().contains("outside"), "{e}");
    }

    #[test]
    fn an_export_crosses_a_socket_with_all_its_descriptors() {
        // More descriptors than one message carries.
        let n = 2 * FDS_PER_MESSAGE + 3;
        let dir = std::env::temp_dir();
        let files: Vec<std::fs::File> = (0..n)
            .map(|i| {
                let path = dir.join(format!("toga-ipc-test-{}-{i}", std::process::id()));
                let f = std::fs::File::create(&path).unwrap();
                std::fs::remove_file(&path).unwrap();
                f
            })
            .collect();
        let inodes: Vec<u64> = files.iter().map(|f| f.metadata().unwrap().ino()).collect();
        let export = IpcExport {
            descriptor: descriptor(n - 1),
            fds: files.into_iter().map(OwnedFd::from).collect(),
        };
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let sender = std::thread::spawn(move || send_export(&mut a, &export).map(|_| export));
        let (d, fds) = recv_export(&mut b).unwrap();
        let export = sender.join().unwrap().unwrap();
        assert_eq!(d, export.descriptor);
        let got: Vec<u64> = fds
            .into_iter()
            .map(|fd| std::fs::File::from(fd).metadata().unwrap().ino())
            .collect();
        assert_eq!(got, inodes, "the same files, in order");
    }

    #[test]
    fn a_closed_socket_is_a_clear_error() {
        let (a, mut b) = UnixStream::pair().unwrap();
        drop(a);
        let e = recv_export(&mut b).unwrap_err();
        assert!(e.to_string().contains("exited"), "{e}");
    }
}
