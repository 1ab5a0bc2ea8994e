//! Peer access, the analogue of `cudaMemPoolSetAccess`: kernels on other devices may read and
//! write a heap's blocks (`docs/host-api.md`, "Other GPUs").
//!
//! Only the heap's own device runs its `malloc` and `free`. The allocator's atomics and fences
//! are of `.gpu` scope, which orders nothing for threads of another device, and its arenas are
//! chosen by SM id, which another device's SMs share; so a heap refuses to be bound to a module
//! on another device ([`Heap::bind`]) and refuses host calls on another device's streams
//! ([`crate::Error::WrongDevice`]). A kernel on another device that calls `free` on a block of
//! this heap reaches the heap bound on *its* device, which does not contain the block: that
//! heap counts it in `invalid_frees` and changes nothing, and this heap is untouched.

use cudarc::driver::sys;

use super::{Backing, Heap, check};
use crate::error::{Error, Result};

/// The driver's handle of device `ordinal`.
fn device(ordinal: usize) -> Result<sys::CUdevice> {
    let mut d = 0;
    // SAFETY: writes one handle.
    check(unsafe { sys::cuDeviceGet(&mut d, ordinal as i32) })?;
    Ok(d)
}

impl Heap {
    /// Let kernels on the devices `peers` (ordinals) read and write this heap's blocks, like
    /// `cudaMemPoolSetAccess`: a growable heap maps every granule, now and later, for them
    /// (`cuMemSetAccess`); a fixed heap sets its pool's access (`cuMemPoolSetAccess`). The
    /// heap's own device in the list is ignored. Refused with [`Error::PeerAccess`], naming the
    /// pair, for a device that cannot access this one's memory, and with
    /// [`Error::DeviceOutOfRange`] for one that does not exist.
    ///
    /// The peers may not allocate from the heap or free into it (module docs).
    pub fn set_peer_access(&self, peers: &[usize]) -> Result<()> {
        let own = self.device();
        let count = crate::gpu::device_count()?;
        let mut others = Vec::new();
        for &peer in peers {
            if peer >= count {
                return Err(Error::DeviceOutOfRange {
                    ordinal: peer,
                    count,
                });
            }
            if peer == own || others.contains(&(peer as i32)) {
                continue;
            }
            let mut can = 0;
            // SAFETY: writes one int.
            check(unsafe { sys::cuDeviceCanAccessPeer(&mut can, device(peer)?, device(own)?) })?;
            if can == 0 {
                return Err(Error::PeerAccess {
                    device: own,
                    peer,
                    why: "the driver reports no peer access between them (cuDeviceCanAccessPeer)"
                        .into(),
                });
            }
            others.push(peer as i32);
        }
        if others.is_empty() {
            return Ok(());
        }
        self.stream.context().bind_to_thread()?;
        let refused = |e: Error, peer: i32| match e {
            Error::Driver(d) => Error::PeerAccess {
                device: own,
                peer: peer as usize,
                why: d.to_string(),
            },
            e => e,
        };
        match &self.backing {
            Backing::Pool(pool) => {
                for &peer in &others {
                    let desc = sys::CUmemAccessDesc {
                        location: sys::CUmemLocation {
                            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                            id: peer,
                        },
                        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                    };
                    // SAFETY: one descriptor for the pool we own.
                    check(unsafe { sys::cuMemPoolSetAccess(pool.0, &desc, 1) })
                        .map_err(|e| refused(e, peer))?;
                }
            }
            Backing::Growable(g) => {
                g.vmm
                    .lock()
                    .unwrap()
                    .set_peers(&others)
                    .map_err(|e| refused(e, others[0]))?;
            }
        }
        Ok(())
    }
}
