//! What the two CPU backends (`host`, `model`) share: the atomic wrapper and a warp of one lane.

/// Wraps a `core`- or `loom`-style atomic in the platform's naming scheme.
macro_rules! cpu_atomic {
    ($name:ident, $t:ty, $inner:ty $(, $const:ident)?) => {
        /// A word that is only ever accessed atomically (CPU backend).
        #[repr(transparent)]
        pub struct $name($inner);

        impl $name {
            pub $($const)? fn new(v: $t) -> Self {
                Self(<$inner>::new(v))
            }
            #[inline]
            pub fn load_relaxed(&self) -> $t {
                self.0.load(Relaxed)
            }
            #[inline]
            pub fn load_acquire(&self) -> $t {
                self.0.load(Acquire)
            }
            /// The GPU's read-only load (`ld.global.nc`); a relaxed load here.
            #[inline]
            pub fn load_read_only(&self) -> $t {
                self.0.load(Relaxed)
            }
            #[inline]
            pub fn store_relaxed(&self, v: $t) {
                self.0.store(v, Relaxed)
            }
            #[inline]
            pub fn store_release(&self, v: $t) {
                self.0.store(v, Release)
            }
            #[inline]
            pub fn fetch_add_relaxed(&self, v: $t) -> $t {
                self.0.fetch_add(v, Relaxed)
            }
            #[inline]
            pub fn fetch_add_acquire(&self, v: $t) -> $t {
                self.0.fetch_add(v, Acquire)
            }
            #[inline]
            pub fn fetch_add_release(&self, v: $t) -> $t {
                self.0.fetch_add(v, Release)
            }
            #[inline]
            pub fn fetch_add_acq_rel(&self, v: $t) -> $t {
                self.0.fetch_add(v, AcqRel)
            }
            #[inline]
            pub fn fetch_sub_relaxed(&self, v: $t) -> $t {
                self.0.fetch_sub(v, Relaxed)
            }
            #[inline]
            pub fn fetch_sub_release(&self, v: $t) -> $t {
                self.0.fetch_sub(v, Release)
            }
            #[inline]
            pub fn fetch_sub_acq_rel(&self, v: $t) -> $t {
                self.0.fetch_sub(v, AcqRel)
            }
            #[inline]
            pub fn fetch_or_relaxed(&self, v: $t) -> $t {
                self.0.fetch_or(v, Relaxed)
            }
            #[inline]
            pub fn fetch_or_acquire(&self, v: $t) -> $t {
                self.0.fetch_or(v, Acquire)
            }
            #[inline]
            pub fn fetch_or_acq_rel(&self, v: $t) -> $t {
                self.0.fetch_or(v, AcqRel)
            }
            #[inline]
            pub fn fetch_or_release(&self, v: $t) -> $t {
                self.0.fetch_or(v, Release)
            }
            #[inline]
            pub fn fetch_and_relaxed(&self, v: $t) -> $t {
                self.0.fetch_and(v, Relaxed)
            }
            #[inline]
            pub fn fetch_and_acquire(&self, v: $t) -> $t {
                self.0.fetch_and(v, Acquire)
            }
            #[inline]
            pub fn fetch_and_acq_rel(&self, v: $t) -> $t {
                self.0.fetch_and(v, AcqRel)
            }
            #[inline]
            pub fn swap_acquire(&self, v: $t) -> $t {
                self.0.swap(v, Acquire)
            }
            #[inline]
            pub fn swap_release(&self, v: $t) -> $t {
                self.0.swap(v, Release)
            }
            #[inline]
            pub fn swap_acq_rel(&self, v: $t) -> $t {
                self.0.swap(v, AcqRel)
            }
            #[inline]
            pub fn fetch_min_relaxed(&self, v: $t) -> $t {
                self.0.fetch_min(v, Relaxed)
            }
            #[inline]
            pub fn fetch_max_relaxed(&self, v: $t) -> $t {
                self.0.fetch_max(v, Relaxed)
            }
            #[inline]
            pub fn compare_exchange_acq_rel(&self, current: $t, new: $t) -> Result<$t, $t> {
                self.0.compare_exchange(current, new, AcqRel, Acquire)
            }
            #[inline]
            pub fn compare_exchange_acquire(&self, current: $t, new: $t) -> Result<$t, $t> {
                self.0.compare_exchange(current, new, Acquire, Acquire)
            }
            #[inline]
            pub fn compare_exchange_relaxed(&self, current: $t, new: $t) -> Result<$t, $t> {
                self.0.compare_exchange(current, new, Relaxed, Relaxed)
            }
        }
    };
}
pub(super) use cpu_atomic;

/// A warp of one lane: width 1.
pub const WARP_SIZE: u32 = 1;

#[inline]
pub fn lane_id() -> u32 {
    0
}
#[inline]
pub fn active_mask() -> u32 {
    1
}
#[inline]
pub fn lanemask_lt() -> u32 {
    0
}
/// The position of the `n`-th lowest set bit of `mask` (`n < popcount(mask)`).
#[inline]
pub fn nth_set_bit_u32(mut mask: u32, n: u32) -> u32 {
    for _ in 0..n {
        mask &= mask - 1;
    }
    mask.trailing_zeros()
}
#[inline]
pub fn ballot(mask: u32, pred: bool) -> u32 {
    debug_assert_eq!(mask, 1);
    pred as u32
}
#[inline]
pub fn match_any(mask: u32, _value: u64) -> u32 {
    debug_assert_eq!(mask, 1);
    1
}
#[inline]
pub fn shfl_idx_u32(mask: u32, value: u32, src: u32) -> u32 {
    debug_assert!(mask == 1 && src == 0);
    value
}
#[inline]
pub fn shfl_idx_u64(mask: u32, value: u64, src: u32) -> u64 {
    debug_assert!(mask == 1 && src == 0);
    value
}
#[inline]
pub fn shfl_down_u32(mask: u32, value: u32, _delta: u32) -> u32 {
    debug_assert_eq!(mask, 1);
    value
}
/// The OR over the warp's lanes: this lane's value (a warp of one lane).
#[inline]
pub fn or_whole_warp_u64(value: u64) -> u64 {
    value
}
/// [`or_whole_warp_u64`] of two values: these values (a warp of one lane).
#[inline]
pub fn or_whole_warp_u64_pair(a: u64, b: u64) -> (u64, u64) {
    (a, b)
}
#[inline]
pub fn sync_warp(mask: u32) {
    debug_assert_eq!(mask, 1);
}

/// Load a word of memory another agent (the host's growth service) writes. `core` atomics in
/// both CPU backends: the mailbox lies outside what loom models.
///
/// # Safety
/// `p` is a valid, 8-aligned address that is only accessed atomically.
pub unsafe fn load_sys(p: *const u64) -> u64 {
    // SAFETY: caller's contract.
    unsafe { core::sync::atomic::AtomicU64::from_ptr(p as *mut u64) }
        .load(core::sync::atomic::Ordering::SeqCst)
}

/// Store a word of memory another agent reads.
///
/// # Safety
/// As for [`load_sys`].
pub unsafe fn store_sys(p: *mut u64, v: u64) {
    // SAFETY: caller's contract.
    unsafe { core::sync::atomic::AtomicU64::from_ptr(p) }
        .store(v, core::sync::atomic::Ordering::SeqCst)
}

/// A full fence, as on the device at system scope.
pub fn fence_sys() {
    core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst)
}
