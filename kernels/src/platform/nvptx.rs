//! nvptx backend: inline PTX with explicit semantics and `.gpu` scope.
//!
//! Every atomic word lives in global memory (the heap, and kernel-module statics, which are
//! global too): loads, stores and read-modify-writes name the `.global` state space. A generic
//! `atom` compiles to the atomic plus fallbacks for shared and local addresses (an `ATOMS` loop
//! and a load/store pair, about eight SASS instructions per site, most of them between hot
//! instructions): with `.global` the allocator's hot functions are 10-40% shorter and the
//! malloc/free churn 12% faster (H100, `docs/benchmarks.md`). A generic address of global
//! memory is its global address, so the pointers need no conversion. Requires sm_70 and PTX
//! ISA 6.3 or newer.

use core::arch::asm;
use core::cell::UnsafeCell;

/// Lanes in a warp.
pub const WARP_SIZE: u32 = 32;

macro_rules! rmw {
    ($name:ident, $t:ty, $reg:ident, $sem:literal, $op:literal, $bits:literal) => {
        #[inline(always)]
        pub fn $name(&self, v: $t) -> $t {
            let old: $t;
            // SAFETY: `self.0` is a valid, aligned location that only atomics touch.
            unsafe {
                asm!(concat!("atom.", $sem, ".gpu.global.", $op, $bits, " {0}, [{1}], {2};"),
                    out($reg) old, in(reg64) self.0.get(), in($reg) v,
                    options(nostack));
            }
            old
        }
    };
}

macro_rules! cas {
    ($name:ident, $t:ty, $reg:ident, $sem:literal, $bits:literal) => {
        /// Compare-and-swap with the semantics the name gives: `Ok(old)` if the word was
        /// `current` and is now `new`, `Err(actual)` otherwise.
        #[inline(always)]
        pub fn $name(&self, current: $t, new: $t) -> Result<$t, $t> {
            let old: $t;
            // SAFETY: `self.0` is a valid, aligned location that only atomics touch.
            unsafe {
                asm!(concat!("atom.", $sem, ".gpu.global.cas.b", $bits, " {0}, [{1}], {2}, {3};"),
                    out($reg) old, in(reg64) self.0.get(), in($reg) current, in($reg) new,
                    options(nostack));
            }
            if old == current { Ok(old) } else { Err(old) }
        }
    };
}

macro_rules! atomic_type {
    ($name:ident, $t:ty, $reg:ident, $bits:literal) => {
        /// A word in GPU memory that is only ever accessed atomically.
        #[repr(transparent)]
        pub struct $name(UnsafeCell<$t>);

        // SAFETY: every access is an atomic PTX instruction.
        unsafe impl Sync for $name {}

        impl $name {
            pub const fn new(v: $t) -> Self {
                Self(UnsafeCell::new(v))
            }

            #[inline(always)]
            pub fn load_relaxed(&self) -> $t {
                let v: $t;
                // SAFETY: valid aligned location, atomic access.
                unsafe {
                    asm!(concat!("ld.relaxed.gpu.global.u", $bits, " {0}, [{1}];"),
                        out($reg) v, in(reg64) self.0.get(), options(nostack));
                }
                v
            }

            #[inline(always)]
            pub fn load_acquire(&self) -> $t {
                let v: $t;
                // SAFETY: valid aligned location, atomic access.
                unsafe {
                    asm!(concat!("ld.acquire.gpu.global.u", $bits, " {0}, [{1}];"),
                        out($reg) v, in(reg64) self.0.get(), options(nostack));
                }
                v
            }

            /// A load through the non-coherent, L1-cached read-only path (`ld.global.nc`),
            /// for a word that no thread writes while the kernel that reads it runs (no
            /// ordering, and the compiler may merge such loads). A GPU-scope load goes to L2
            /// every time.
            #[inline(always)]
            pub fn load_read_only(&self) -> $t {
                let v: $t;
                // SAFETY: valid aligned location; the caller's contract keeps writers away.
                unsafe {
                    asm!(concat!("ld.global.nc.u", $bits, " {0}, [{1}];"),
                        out($reg) v, in(reg64) self.0.get(),
                        options(nostack, readonly, pure, preserves_flags));
                }
                v
            }

            #[inline(always)]
            pub fn store_relaxed(&self, v: $t) {
                // SAFETY: valid aligned location, atomic access.
                unsafe {
                    asm!(concat!("st.relaxed.gpu.global.u", $bits, " [{0}], {1};"),
                        in(reg64) self.0.get(), in($reg) v, options(nostack));
                }
            }

            #[inline(always)]
            pub fn store_release(&self, v: $t) {
                // SAFETY: valid aligned location, atomic access.
                unsafe {
                    asm!(concat!("st.release.gpu.global.u", $bits, " [{0}], {1};"),
                        in(reg64) self.0.get(), in($reg) v, options(nostack));
                }
            }

            rmw!(fetch_add_relaxed, $t, $reg, "relaxed", "add.u", $bits);
            rmw!(fetch_add_acquire, $t, $reg, "acquire", "add.u", $bits);
            rmw!(fetch_add_release, $t, $reg, "release", "add.u", $bits);
            rmw!(fetch_add_acq_rel, $t, $reg, "acq_rel", "add.u", $bits);
            rmw!(fetch_or_relaxed, $t, $reg, "relaxed", "or.b", $bits);
            rmw!(fetch_or_acquire, $t, $reg, "acquire", "or.b", $bits);
            rmw!(fetch_or_acq_rel, $t, $reg, "acq_rel", "or.b", $bits);
            rmw!(fetch_or_release, $t, $reg, "release", "or.b", $bits);
            rmw!(fetch_and_relaxed, $t, $reg, "relaxed", "and.b", $bits);
            rmw!(fetch_and_acquire, $t, $reg, "acquire", "and.b", $bits);
            rmw!(fetch_and_acq_rel, $t, $reg, "acq_rel", "and.b", $bits);
            rmw!(swap_acquire, $t, $reg, "acquire", "exch.b", $bits);
            rmw!(swap_release, $t, $reg, "release", "exch.b", $bits);
            rmw!(swap_acq_rel, $t, $reg, "acq_rel", "exch.b", $bits);
            rmw!(fetch_min_relaxed, $t, $reg, "relaxed", "min.u", $bits);
            rmw!(fetch_max_relaxed, $t, $reg, "relaxed", "max.u", $bits);

            /// `fetch_add_relaxed(v.wrapping_neg())`.
            #[inline(always)]
            pub fn fetch_sub_relaxed(&self, v: $t) -> $t {
                self.fetch_add_relaxed(v.wrapping_neg())
            }

            /// `fetch_add_release(v.wrapping_neg())`.
            #[inline(always)]
            pub fn fetch_sub_release(&self, v: $t) -> $t {
                self.fetch_add_release(v.wrapping_neg())
            }

            /// `fetch_add_acq_rel(v.wrapping_neg())`.
            #[inline(always)]
            pub fn fetch_sub_acq_rel(&self, v: $t) -> $t {
                self.fetch_add_acq_rel(v.wrapping_neg())
            }

            // acq_rel: list surgery and node states; acquire: a lock's acquisition (no MEMBAR
            // before the atomic on the GPU, where `acq_rel` issues one per try); relaxed:
            // counters that order nothing.
            cas!(compare_exchange_acq_rel, $t, $reg, "acq_rel", $bits);
            cas!(compare_exchange_acquire, $t, $reg, "acquire", $bits);
            cas!(compare_exchange_relaxed, $t, $reg, "relaxed", $bits);

            /// The word's address.
            #[inline(always)]
            pub fn as_ptr(&self) -> *mut $t {
                self.0.get()
            }
        }
    };
}

atomic_type!(Atomic32, u32, reg32, "32");
atomic_type!(Atomic64, u64, reg64, "64");

/// `fence.acq_rel.gpu`: orders this thread's earlier accesses before its later ones, GPU-wide.
#[inline(always)]
pub fn fence_acq_rel() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.acq_rel.gpu;", options(nostack)) }
}

/// `fence.sc.gpu`: a sequentially consistent fence at GPU scope.
#[inline(always)]
pub fn fence_sc() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.sc.gpu;", options(nostack)) }
}

/// This thread's lane within its warp, `0..32`.
#[inline(always)]
pub fn lane_id() -> u32 {
    let v: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {0}, %laneid;", out(reg32) v, options(nomem, nostack, pure)) }
    v
}

/// Lanes of this warp currently executing this instruction together.
#[inline(always)]
pub fn active_mask() -> u32 {
    let v: u32;
    // SAFETY: `activemask` has no preconditions.
    unsafe { asm!("activemask.b32 {0};", out(reg32) v, options(nomem, nostack)) }
    v
}

/// Lanes below this one (`%lanemask_lt`).
#[inline(always)]
pub fn lanemask_lt() -> u32 {
    let v: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {0}, %lanemask_lt;", out(reg32) v, options(nomem, nostack, pure)) }
    v
}

/// The position of the `n`-th lowest set bit of `mask` (`n < popcount(mask)`): `fns.b32`,
/// one instruction instead of a loop over the lower bits.
#[inline(always)]
pub fn nth_set_bit_u32(mask: u32, n: u32) -> u32 {
    let v: u32;
    // SAFETY: pure arithmetic.
    unsafe {
        asm!("fns.b32 {0}, {1}, 0, {2};", out(reg32) v, in(reg32) mask, in(reg32) n + 1,
            options(nomem, nostack, pure))
    }
    v
}

/// `vote.sync.ballot`: bit `i` set iff lane `i` of `mask` passed `pred == true`.
/// Convergence: every lane of `mask` must call it (module rule).
#[inline(always)]
pub fn ballot(mask: u32, pred: bool) -> u32 {
    let v: u32;
    // SAFETY: the caller is in `mask` (module rule).
    unsafe {
        asm!("{{ .reg .pred p; setp.ne.u32 p, {1}, 0; vote.sync.ballot.b32 {0}, p, {2}; }}",
            out(reg32) v, in(reg32) pred as u32, in(reg32) mask, options(nomem, nostack));
    }
    v
}

/// `match.any.sync.b64`: the lanes of `mask` whose `value` equals this lane's.
/// Convergence: every lane of `mask` must call it (module rule).
#[inline(always)]
pub fn match_any(mask: u32, value: u64) -> u32 {
    let v: u32;
    // SAFETY: the caller is in `mask` (module rule).
    unsafe {
        asm!("match.any.sync.b64 {0}, {1}, {2};",
            out(reg32) v, in(reg64) value, in(reg32) mask, options(nomem, nostack));
    }
    v
}

/// `shfl.sync.idx.b32`: `value` as held by lane `src`. `src` must be in `mask`.
/// Convergence: every lane of `mask` must call it (module rule).
#[inline(always)]
pub fn shfl_idx_u32(mask: u32, value: u32, src: u32) -> u32 {
    let v: u32;
    // SAFETY: the caller is in `mask` (module rule).
    unsafe {
        asm!("shfl.sync.idx.b32 {0}, {1}, {2}, 0x1f, {3};",
            out(reg32) v, in(reg32) value, in(reg32) src, in(reg32) mask,
            options(nomem, nostack));
    }
    v
}

/// [`shfl_idx_u32`] for 64-bit values (two shuffles).
#[inline(always)]
pub fn shfl_idx_u64(mask: u32, value: u64, src: u32) -> u64 {
    let lo = shfl_idx_u32(mask, value as u32, src);
    let hi = shfl_idx_u32(mask, (value >> 32) as u32, src);
    (hi as u64) << 32 | lo as u64
}

/// `shfl.sync.down.b32`: `value` of lane `lane + delta`, or this lane's own value when that lane
/// is past 31. Convergence: every lane of `mask` must call it (module rule), and the source lane
/// must be in `mask` for the result to be defined.
#[inline(always)]
pub fn shfl_down_u32(mask: u32, value: u32, delta: u32) -> u32 {
    let v: u32;
    // SAFETY: the caller is in `mask` (module rule).
    unsafe {
        asm!("shfl.sync.down.b32 {0}, {1}, {2}, 0x1f, {3};",
            out(reg32) v, in(reg32) value, in(reg32) delta, in(reg32) mask,
            options(nomem, nostack));
    }
    v
}

/// The OR of `value` over all 32 lanes of the warp: a butterfly of five `shfl.sync.bfly`
/// steps per half with the constant full mask (no per-shuffle convergence check in SASS, where
/// a variable mask costs a `MATCH` and a `REDUX` per shuffle). Convergence: all 32 lanes must
/// call it.
#[inline(always)]
pub fn or_whole_warp_u64(value: u64) -> u64 {
    #[inline(always)]
    fn step(v: u64, delta: u32) -> u64 {
        let (l, h): (u32, u32);
        // SAFETY: every lane of the warp calls it (the caller's contract).
        unsafe {
            asm!("shfl.sync.bfly.b32 {0}, {2}, {4}, 0x1f, 0xffffffff;",
                 "shfl.sync.bfly.b32 {1}, {3}, {4}, 0x1f, 0xffffffff;",
                out(reg32) l, out(reg32) h, in(reg32) v as u32, in(reg32) (v >> 32) as u32,
                in(reg32) delta, options(nomem, nostack));
        }
        v | (h as u64) << 32 | l as u64
    }
    // Written out: a loop over the deltas keeps them in local memory.
    step(step(step(step(step(value, 16), 8), 4), 2), 1)
}

/// [`or_whole_warp_u64`] of two values at once: the two butterflies step together, so the
/// shuffles of one step are issued back to back and their latencies overlap. Convergence: all
/// 32 lanes must call it.
#[inline(always)]
pub fn or_whole_warp_u64_pair(a: u64, b: u64) -> (u64, u64) {
    #[inline(always)]
    fn step((a, b): (u64, u64), delta: u32) -> (u64, u64) {
        let (al, ah, bl, bh): (u32, u32, u32, u32);
        // SAFETY: every lane of the warp calls it (the caller's contract).
        unsafe {
            asm!("shfl.sync.bfly.b32 {0}, {4}, {8}, 0x1f, 0xffffffff;",
                 "shfl.sync.bfly.b32 {1}, {5}, {8}, 0x1f, 0xffffffff;",
                 "shfl.sync.bfly.b32 {2}, {6}, {8}, 0x1f, 0xffffffff;",
                 "shfl.sync.bfly.b32 {3}, {7}, {8}, 0x1f, 0xffffffff;",
                out(reg32) al, out(reg32) ah, out(reg32) bl, out(reg32) bh,
                in(reg32) a as u32, in(reg32) (a >> 32) as u32,
                in(reg32) b as u32, in(reg32) (b >> 32) as u32,
                in(reg32) delta, options(nomem, nostack));
        }
        (
            a | (ah as u64) << 32 | al as u64,
            b | (bh as u64) << 32 | bl as u64,
        )
    }
    // Written out, as in `or_whole_warp_u64`.
    step(step(step(step(step((a, b), 16), 8), 4), 2), 1)
}

/// `bar.warp.sync`: lanes of `mask` wait for each other; also orders their memory accesses
/// among themselves.
#[inline(always)]
pub fn sync_warp(mask: u32) {
    // SAFETY: the caller is in `mask` (module rule).
    unsafe { asm!("bar.warp.sync {0};", in(reg32) mask, options(nostack)) }
}

/// The SM this thread runs on, `0..sm_count()`. A thread may move between SMs only at
/// preemption, so this is a placement hint, never an ownership proof.
#[inline(always)]
pub fn sm_id() -> u32 {
    let v: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {0}, %smid;", out(reg32) v, options(nomem, nostack)) }
    v
}

/// Upper bound of `%smid` (`%nsmid`; it may exceed the number of SMs, ids need not be contiguous).
#[inline(always)]
pub fn sm_count() -> u32 {
    let v: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {0}, %nsmid;", out(reg32) v, options(nomem, nostack, pure)) }
    v
}

/// Suspend this thread for about `ns` nanoseconds (at most 1 ms).
#[inline(always)]
pub fn nanosleep(ns: u32) {
    // SAFETY: `nanosleep` has no memory effects.
    unsafe { asm!("nanosleep.u32 {0};", in(reg32) ns, options(nomem, nostack)) }
}

/// `%globaltimer`: nanoseconds, GPU-wide.
#[inline(always)]
pub fn global_timer_ns() -> u64 {
    let v: u64;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u64 {0}, %globaltimer;", out(reg64) v, options(nomem, nostack)) }
    v
}

/// Index of this thread in a 1-D grid.
#[inline(always)]
pub fn global_thread_id() -> u64 {
    use core::arch::nvptx::*;
    // SAFETY: special-register reads.
    unsafe { _block_idx_x() as u64 * _block_dim_x() as u64 + _thread_idx_x() as u64 }
}

/// A seed that differs between the warps an SM runs at once (`%warpid`, the warp's slot on
/// its SM) and between the lanes of a warp: spreads claimers over a bin's words and bits.
#[inline(always)]
pub fn spread_seed() -> u32 {
    let v: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {0}, %warpid;", out(reg32) v, options(nomem, nostack)) }
    v.wrapping_mul(0x9E37_79B1) ^ lane_id()
}

/// Threads in a 1-D grid.
#[inline(always)]
pub fn grid_threads() -> u64 {
    use core::arch::nvptx::*;
    // SAFETY: special-register reads.
    unsafe { _grid_dim_x() as u64 * _block_dim_x() as u64 }
}

/// Abort the kernel (the launch reports an error to the host).
#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: `trap` ends the thread.
    unsafe { core::arch::nvptx::trap() }
}

/// Load a word of host memory mapped into the device (`ld.relaxed.sys`): what the host wrote
/// there, seen across the bus. Only toga's growth mailbox uses system scope.
///
/// # Safety
/// `p` is a valid, 8-aligned address (mapped host memory).
#[inline(always)]
pub unsafe fn load_sys(p: *const u64) -> u64 {
    let v: u64;
    // SAFETY: caller's contract.
    unsafe { asm!("ld.relaxed.sys.u64 {0}, [{1}];", out(reg64) v, in(reg64) p, options(nostack)) }
    v
}

/// Store a word of mapped host memory (`st.relaxed.sys`).
///
/// # Safety
/// As for [`load_sys`].
#[inline(always)]
pub unsafe fn store_sys(p: *mut u64, v: u64) {
    // SAFETY: caller's contract.
    unsafe { asm!("st.relaxed.sys.u64 [{0}], {1};", in(reg64) p, in(reg64) v, options(nostack)) }
}

/// `fence.sc.sys`: orders this thread's accesses of device and host memory as the host sees
/// them (the growth mailbox: payload before sequence number, and the reverse on reading).
#[inline(always)]
pub fn fence_sys() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.sc.sys;", options(nostack)) }
}
