//! Where UAlloc's memory sits: the arenas' semaphores and chunk counts, read from the device.

use std::sync::Arc;

use cudarc::driver::{CudaStream, sys};
use toga::{Error, Heap, Result};
use toga_kernels::size_class::{BinKind, SizeClass};
use toga_kernels::ualloc::Arena;

/// A snapshot of every arena, summed: free slots per class (in listed bins or on their way to
/// a list), chunks and free bins per bin kind. Take it while no kernel runs on the heap.
#[derive(Clone, Debug, Default)]
pub struct Census {
    /// Per class: `(class size, free slots, arenas with free slots)`.
    pub free_slots: Vec<(usize, u64, u32)>,
    /// Per kind (small, large): `(chunks, free bins)`.
    pub chunks: Vec<(u64, u64)>,
}

impl Census {
    /// Bytes in free slots of carved bins.
    pub fn free_slot_bytes(&self) -> u64 {
        self.free_slots.iter().map(|&(s, n, _)| s as u64 * n).sum()
    }

    /// One line: free slot bytes per class, then chunks and free bins per kind.
    pub fn line(&self) -> String {
        let classes: Vec<String> = self
            .free_slots
            .iter()
            .filter(|c| c.1 > 0)
            .map(|&(s, n, a)| format!("{s} B: {} KiB in {a} arenas", s as u64 * n / 1024))
            .collect();
        let kinds: Vec<String> = ["small", "large"]
            .iter()
            .zip(&self.chunks)
            .map(|(k, &(c, b))| format!("{k} chunks {c} ({b} bins free)"))
            .collect();
        format!(
            "free slots {} KiB ({}); {}",
            self.free_slot_bytes() / 1024,
            classes.join(", "),
            kinds.join(", ")
        )
    }
}

/// Read every arena of `heap` (one copy of the arenas region) and sum it.
pub fn census(stream: &Arc<CudaStream>, heap: &Heap) -> Result<Census> {
    let g = heap.geometry();
    let n = g.arenas as usize;
    let mut arenas: Vec<Arena> = (0..n).map(|_| Arena::new()).collect();
    // SAFETY: copies the arenas region (`n` arenas laid out as on the host: the struct is
    // `repr(C)` with a size asserted in `kernels/`) over `n` host arenas, then waits.
    let r = unsafe {
        sys::cuMemcpyDtoHAsync_v2(
            arenas.as_mut_ptr() as *mut _,
            heap.base() + g.arenas_offset,
            n * size_of::<Arena>(),
            stream.cu_stream(),
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(Error::Driver(cudarc::driver::DriverError(r)));
    }
    stream.synchronize()?;
    let free_slots = SizeClass::ALL
        .iter()
        .map(|&c| {
            let per: Vec<u64> = arenas.iter().map(|a| a.slot_counters(c).0 as u64).collect();
            (
                c.size(),
                per.iter().sum(),
                per.iter().filter(|&&x| x > 0).count() as u32,
            )
        })
        .collect();
    let chunks = [BinKind::Small, BinKind::Large]
        .iter()
        .map(|&k| {
            (
                arenas.iter().map(|a| a.kind_chunk_count(k) as u64).sum(),
                arenas.iter().map(|a| a.bin_counters(k).0 as u64).sum(),
            )
        })
        .collect();
    Ok(Census { free_slots, chunks })
}
