//! A heap in host memory, laid out exactly as on the GPU, for the CPU tests of the whole heap
//! (`heap_stress`, `stray_free`): `#[path = "common/host_heap.rs"] mod host_heap;`.
#![allow(dead_code)]

use std::alloc::{Layout, alloc_zeroed, dealloc};

use toga_kernels::heap::{DeviceHeap, Geometry, HeapHeader, stat};
use toga_kernels::ualloc::CHUNK_SIZE;

/// A heap in host memory, laid out exactly as on the GPU.
pub struct HostHeap {
    pub mem: *mut u8,
    layout: Layout,
    pub geometry: Geometry,
}

// SAFETY: the heap is made for concurrent use; the buffer is owned by this struct.
unsafe impl Send for HostHeap {}
unsafe impl Sync for HostHeap {}

impl HostHeap {
    pub fn new(data_bytes: u64, arenas: u64) -> Self {
        let total = Geometry::allocation_bytes(data_bytes, arenas).unwrap();
        let layout = Layout::from_size_align(total as usize, CHUNK_SIZE).unwrap();
        // SAFETY: non-zero size.
        let mem = unsafe { alloc_zeroed(layout) };
        assert!(!mem.is_null());
        let geometry = Geometry::new(mem as u64, total, data_bytes, arenas).unwrap();
        // SAFETY: the header is at the start of the zeroed buffer; nothing else uses it yet.
        unsafe {
            let header = mem as *mut HeapHeader;
            std::ptr::addr_of_mut!((*header).geometry).write(geometry);
            let heap = DeviceHeap::from_base(mem);
            heap.init_nodes(0, 3);
            heap.init_nodes(1, 3);
            heap.init_nodes(2, 3);
            heap.init_finish();
        }
        Self {
            mem,
            layout,
            geometry,
        }
    }

    /// [`HostHeap::new`], then every arena stocked with its spare chunks, as the GPU's init
    /// does (`toga_heap_stock_arenas`).
    pub fn stocked(data_bytes: u64, arenas: u64) -> Self {
        let h = Self::new(data_bytes, arenas);
        let stocked = (0..arenas * 2)
            .filter(|&t| h.heap().stock_arenas(t))
            .count() as u64;
        assert_eq!(stocked, arenas * 2, "the heap has room for spares");
        h
    }

    pub fn heap(&self) -> DeviceHeap<'_> {
        // SAFETY: initialized in `new`, lives as long as `self`.
        unsafe { DeviceHeap::from_base(self.mem) }
    }

    pub fn stat(&self, word: usize) -> u64 {
        let g = &self.geometry;
        (0..g.arenas as usize)
            .map(|a| {
                // SAFETY: reading the shards of our own heap.
                unsafe {
                    let shard = self.mem.add(
                        g.shards_offset as usize + a * size_of::<toga_kernels::heap::StatsShard>(),
                    ) as *const u64;
                    std::ptr::read_volatile(shard.add(word))
                }
            })
            .fold(0u64, u64::wrapping_add)
    }

    /// Live blocks, as `toga::HeapStats::live_blocks` computes them.
    pub fn live_blocks(&self) -> u64 {
        self.stat(stat::MALLOCS)
            .wrapping_sub(self.stat(stat::FREES))
    }
}

impl Drop for HostHeap {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.mem, self.layout) }
    }
}
