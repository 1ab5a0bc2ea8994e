//! `free` and `usable_size`: pointer → chunk → bin → slot, validation, and the release of slots.
//!
//! # The warp path (`free_group`)
//! Lanes of a warp that free slots of the same bitmap word (so the same bin, class and arena)
//! form a [`Group`]. Its leader enters the arena's read section once, clears the group's bits
//! with ONE `fetch_and`, moves `used` with ONE `fetch_sub` and returns the units with ONE
//! semaphore release; every lane reads its own bit in the old word, so a double free is still
//! caught per lane. Where some lanes of a warp share a word, the others take this path too, each
//! a group of one, so that the warp runs one path; where none do, each lane takes the same
//! steps for itself (`free_single`).
//!
//! # No retirement on the free path
//! A bin that becomes empty stays carved and listed: the next `malloc` of its class reuses it
//! without re-carving, and `free` never takes the list mutex for it nor waits for a grace
//! period. Empty bins go back to their chunks (and empty chunks to the source) in
//! [`UAlloc::trim`], which `malloc` runs by itself before it reports out of memory
//! (`docs/ualloc.md`, INV(UA4)).

use crate::collective::Group;
use crate::platform;
use crate::size_class::{BinKind, SizeClass};
use crate::ualloc::arena::{Arena, give_units, release_bits};
use crate::ualloc::bin::{BinHeader, RUN_BIN};
use crate::ualloc::chunk::{ChunkHeader, chunk_base};
use crate::ualloc::layout::{PAGE_SIZE, SlotArea, WORD_BITS, area_of};
use crate::ualloc::run::{Held, run_holds};
use crate::ualloc::{ChunkSource, FreeOutcome, UAlloc};

/// Where a block lies: its bin, class and slot, the bin's owner, the chunk kind it was
/// found with, and whether the bin was carved for a run of slots.
#[derive(Clone, Copy)]
struct Spot<'a> {
    bin: &'a BinHeader,
    class: SizeClass,
    slot: u32,
    owner: u32,
    kind: BinKind,
    in_run: bool,
}

impl Spot<'_> {
    /// Whether the slot may be freed as far as the runs go (INV(UA19)): its bin was not
    /// carved for a run, or the arena's run of its class does not hold it. Inside the read
    /// section of the free's arena, after the look.
    #[inline(always)]
    fn not_held(&self, arena: &Arena) -> bool {
        !self.in_run || matches!(self.held(arena), Held::No)
    }

    /// What the arena's run of the slot's class holds of it (a bin carved for a run). The
    /// run's word is loaded after the look, whose class names it. Not kept: the word of the
    /// class the optimistic look found, loaded beside the look (no dependent round trip):
    /// 2^20 frees of 16 B and 64 B took 1-9% longer that way than after it (acquire: +4.5%
    /// and +1.4%; relaxed, in another call: +9% and +8%; H200, medians of three rounds).
    #[inline(always)]
    fn held(&self, arena: &Arena) -> Held {
        run_holds(
            arena.slot_run(self.class).look(),
            self.class,
            self.bin,
            self.slot,
        )
    }
}

/// Look `addr` up in `chunk` as a chunk of `kind`. The chunk's magic and kind and the bin's
/// class and owner are loaded back to back (one round trip to memory), then checked: `None`
/// if the chunk is not live, not of `kind`, or `addr` is not the start of a slot of a carved
/// bin. `ordered`: acquire loads, for the look inside a read section that a release relies
/// on; without it, a hint that orders nothing.
#[inline(always)]
fn locate_as(chunk: &ChunkHeader, addr: usize, kind: BinKind, ordered: bool) -> Option<Spot<'_>> {
    let (index, area) = area_of(kind == BinKind::Small, addr - chunk.base())?;
    let bin = chunk.bin_as(kind, index);
    let (live, chunk_kind) = chunk.look(ordered);
    let (class, owner) = bin.look(ordered);
    spot(
        live && chunk_kind == kind.index() as u32,
        kind,
        bin,
        area,
        class,
        owner,
    )
}

/// The optimistic look, outside any read section (grouping lanes, choosing the arena): the
/// chunk's words and the bin `addr` would lie in under the large layout are loaded back to
/// back; the small layout's bin only once the chunk reads small. A look of a block in a large
/// chunk is one round trip to memory, of one in a small chunk two.
///
/// Not both layouts' bins at once: under a large chunk, the small layout's bin of an address
/// (its page's first line) is a line nobody needs, and a different one for every block of a
/// page or more. ncu of 2^20 frees of 4 KB counted 2.08 M of the kernel's 3.07 M sectors read
/// from L2 there, and the fabric between the L2's halves 83% busy; without them, 0.95 M
/// sectors, and the frees took 0.080 ms instead of 0.112 (mixed 16 B – 4 KB: 0.098 and 0.118;
/// 16 – 256 B unchanged; H100). Loading it early for lanes whose page another lane of the
/// warp frees into (`match.any`) took 0.091 ms.
#[inline(always)]
fn locate_hint(chunk: &ChunkHeader, addr: usize) -> Option<Spot<'_>> {
    let off = addr - chunk.base();
    let large = area_of(false, off).map(|(i, area)| (chunk.bin_as(BinKind::Large, i), area));
    let (live, chunk_kind) = chunk.look(false);
    let large_words = large.map(|(bin, _)| bin.look(false));
    let (kind, (bin, area), (class, owner)) = match BinKind::from_index(chunk_kind)? {
        BinKind::Small => {
            let (index, area) = area_of(true, off)?;
            let bin = chunk.bin_as(BinKind::Small, index);
            (BinKind::Small, (bin, area), bin.look(false))
        }
        BinKind::Large => (BinKind::Large, large?, large_words?),
    };
    spot(live, kind, bin, area, class, owner)
}

/// The checks of a look, once its words are loaded: the chunk is `live` as a chunk of
/// `kind`, and the bin (in `area` of it) is carved for a class of that kind (INV(UA5),
/// INV(UA8): a live chunk keeps its kind) with a slot starting at the address. `owner`: the
/// bin's owner word ([`RUN_BIN`] included).
#[inline(always)]
fn spot(
    live: bool,
    kind: BinKind,
    bin: &BinHeader,
    area: SlotArea,
    class: Option<SizeClass>,
    owner: u32,
) -> Option<Spot<'_>> {
    let class = class.filter(|c| live && c.kind() == kind)?;
    let (offset, first, limit) = match area {
        SlotArea::Body(x) => (x, 0, class.main_slots()),
        SlotArea::Tail(x) => (x, class.main_slots(), class.slots()),
    };
    if offset & (class.size() - 1) != 0 {
        return None;
    }
    let slot = first + (offset >> class.shift()) as u32;
    if slot >= limit {
        return None;
    }
    Some(Spot {
        bin,
        class,
        slot,
        owner: owner & !RUN_BIN,
        kind,
        in_run: owner & RUN_BIN != 0,
    })
}

/// [`locate_as`] with the chunk's kind as it reads now (one load more, before the others).
#[inline(always)]
fn locate(chunk: &ChunkHeader, addr: usize, ordered: bool) -> Option<Spot<'_>> {
    locate_as(chunk, addr, chunk.kind(), ordered)
}

/// The key that groups lanes freeing into one bitmap word: the word's address (bins are
/// 128-aligned, so it is never 0).
#[inline(always)]
fn word_key(bin: &BinHeader, slot: u32) -> u64 {
    bin as *const BinHeader as u64 + 8 * (slot as u64 / WORD_BITS as u64)
}

impl<S: ChunkSource> UAlloc<'_, S> {
    /// Free the block at `p`. Detects double frees (slot bit already clear) and pointers that
    /// are not UAlloc blocks, and then changes nothing. Callable from any lanes of a warp in
    /// any convergence (module doc).
    ///
    /// # Safety
    /// `p` is not page-aligned or is rejected at once; otherwise the `CHUNK_SIZE`-aligned
    /// block containing `p` must be readable memory (inside the heap's data region) for the
    /// duration of the call. `p` need not be a live block.
    #[inline]
    pub unsafe fn free(&self, p: *mut u8) -> FreeOutcome {
        let addr = p as usize;
        // An optimistic look, outside any read section, to group the lanes and to choose the
        // arena: the lanes validate it again inside the section. 0: not a block (or no group).
        let hint = if addr.is_multiple_of(PAGE_SIZE) {
            None
        } else {
            // SAFETY: the caller guarantees the chunk-aligned block around `p` is readable.
            let chunk = unsafe { ChunkHeader::at(chunk_base(addr)) };
            locate_hint(chunk, addr)
        };
        let key = hint.map_or(0, |s| word_key(s.bin, s.slot));
        let hint = hint.map(|s| (s.owner, s.kind));
        let active = platform::active_mask();
        let group = Group::of_among(active, key);
        // Where any lanes share a word, every lane of a block takes the group path, a lane alone
        // with its word as a group of one: one pass for the warp, where the two paths ran one
        // after the other (2^20 frees of mixed 16 B – 4 KB: 155 → 130 µs, H100).
        let grouped = platform::ballot(active, key != 0 && !group.is_single()) != 0;
        if key == 0 || !grouped {
            // SAFETY: forwarded from the caller.
            unsafe { self.free_single(p, hint) }
        } else {
            // SAFETY: forwarded from the caller.
            unsafe { self.free_group(&group, p, hint) }
        }
    }

    /// `free` for a lane of a warp where no lanes share a bitmap word (or a pointer that is not
    /// a block).
    /// `hint`: the owner and chunk kind that the optimistic look found (`None`: not a block).
    ///
    /// # Safety
    /// As for [`free`](Self::free).
    #[inline(never)]
    unsafe fn free_single(&self, p: *mut u8, hint: Option<(u32, BinKind)>) -> FreeOutcome {
        let addr = p as usize;
        // INV(UA1): UAlloc blocks are never page-aligned (null included). A live block is
        // never missed by the hint: its carving happened before its allocation, which
        // happened before this free.
        let Some((ai, kind)) = hint else {
            return FreeOutcome::Invalid;
        };
        let Some(arena) = self.arenas.get(ai as usize) else {
            return FreeOutcome::Invalid;
        };
        // SAFETY: the caller guarantees the chunk-aligned block around `p` is readable.
        let chunk = unsafe { ChunkHeader::at(chunk_base(addr)) };
        let (reader, at) = loop {
            // The entry's fence also releases the caller's writes to the block (free_bits).
            let reader = arena.rcu.read_lock_fenced();
            // INV(UA8)/INV(UA12)/INV(RCU1): re-checked inside the read section, the bin stays
            // carved by this arena (and its chunk UAlloc's) until we leave it.
            let Some(at) = locate_as(chunk, addr, kind, true).filter(|s| s.owner == ai) else {
                return FreeOutcome::Invalid;
            };
            if !at.in_run {
                break (reader, at);
            }
            // INV(UA19): a slot that the run of its bin still holds was never handed out.
            match at.held(arena) {
                Held::No => break (reader, at),
                Held::Yes => return FreeOutcome::Invalid,
                Held::Swapping(seen) => {
                    // Outside the section (a swap gives back items inside read sections of
                    // its own), until the swap ends; then the look again.
                    drop(reader);
                    arena.slot_run(at.class).wait_while_draining(&seen);
                }
            }
        };
        let word = at.slot / WORD_BITS as u32;
        let bit = 1u64 << (at.slot % WORD_BITS as u32);
        let (old, emptied) = release_bits(arena, at.class, at.bin, word, bit);
        drop(reader);
        give_units(arena, at.class, old, bit, emptied);
        if old & bit != 0 {
            FreeOutcome::Freed(at.class)
        } else {
            FreeOutcome::DoubleFree
        }
    }

    /// `free` for a group of lanes whose slots share one bitmap word (module doc). Collective
    /// over `group` (collective.rs rules: every branch below depends on broadcast values only).
    /// `hint` as for [`free_single`](Self::free_single).
    ///
    /// # Safety
    /// As for [`free`](Self::free).
    #[inline(never)]
    unsafe fn free_group(
        &self,
        group: &Group,
        p: *mut u8,
        hint: Option<(u32, BinKind)>,
    ) -> FreeOutcome {
        let addr = p as usize;
        // SAFETY: the caller guarantees the chunk-aligned block around `p` is readable.
        let chunk = unsafe { ChunkHeader::at(chunk_base(addr)) };
        // Every lane of the group saw the same word, so the same chunk, bin and owner.
        let ai = group.broadcast_u32(hint.map_or(u32::MAX, |(owner, _)| owner)) as usize;
        let arena = self.arenas.get(ai);
        // The barrier orders the members' writes to their blocks before the leader's entry,
        // whose fence releases them to the next claimers (release_bits).
        group.sync();
        let reader = match (group.is_leader(), arena) {
            (true, Some(a)) => Some(a.rcu.read_lock_fenced()),
            _ => None,
        };
        // Inside the leader's read section (the barrier orders it before the members' reads),
        // each lane locates its slot again; the group goes on only if every lane still finds a
        // slot in the word they were grouped by (INV(UA8)/INV(RCU1)).
        group.sync();
        let here = match (arena, hint) {
            (Some(a), Some((_, kind))) => locate_as(chunk, addr, kind, true)
                .filter(|s| s.owner as usize == ai && s.not_held(a)),
            _ => None,
        };
        let (slot, class, bin) = match here {
            Some(at) => (at.slot, at.class.index() as u32, at.bin as *const BinHeader),
            None => (u32::MAX, u32::MAX, core::ptr::null()),
        };
        let valid = platform::ballot(group.mask(), slot != u32::MAX) == group.mask()
            && platform::match_any(group.mask(), (class as u64) << 32 | bin as u64) == group.mask();
        if !valid {
            drop(reader);
            group.sync();
            // SAFETY: forwarded from the caller.
            return unsafe { self.free_single(p, hint) };
        }
        let bit_index = slot % WORD_BITS as u32;
        // The group's bits: duplicates (a pointer freed twice in one call) collapse here.
        let bits = if group.mask() == u32::MAX {
            // The whole warp (the common case for the smallest classes): a butterfly with the
            // constant full mask, 10 shuffles. (Uniform: a full group is the only group.)
            platform::or_whole_warp_u64(1u64 << bit_index)
        } else if platform::active_mask() == u32::MAX {
            // Every lane of the warp is here, in several groups (a warp's 64 B, 1 KB or 4 KB
            // blocks over two bins' words): a full-mask butterfly per group, in which only the
            // group's lanes contribute, two groups at a time stepping together; the loop runs
            // once per two groups. (Uniform: every lane sees the full mask and the same
            // leaders.) A gather of one shuffle per lane ran as often as the largest group has
            // lanes: 21.6 rounds per warp of a 4 KB free, a tenth of its stall samples (ncu).
            let mine = 1u64 << bit_index;
            let leader = group.leader();
            // Groups of one need no butterfly: their bits are their own.
            let mut leaders = platform::ballot(u32::MAX, group.is_leader() && !group.is_single());
            let mut bits = 0u64;
            while leaders != 0 {
                let first = leaders.trailing_zeros();
                leaders &= leaders - 1;
                let second = if leaders != 0 {
                    leaders.trailing_zeros()
                } else {
                    u32::MAX
                };
                leaders &= leaders.wrapping_sub(1);
                let (a, b) = platform::or_whole_warp_u64_pair(
                    if leader == first { mine } else { 0 },
                    if leader == second { mine } else { 0 },
                );
                if leader == first {
                    bits = a;
                } else if leader == second {
                    bits = b;
                }
            }
            if group.is_single() { mine } else { bits }
        } else {
            // A gather, one lane at a time (each shuffle with the group's mask, which SASS
            // checks for convergence every time).
            let mut bits = 0u64;
            let mut rest = group.mask();
            while rest != 0 {
                let src = rest.trailing_zeros();
                bits |= 1u64 << platform::shfl_idx_u32(group.mask(), bit_index, src);
                rest &= rest - 1;
            }
            bits
        };
        // SAFETY: `bin` was located inside the read section; valid until it ends.
        let (bin, class) = (unsafe { &*bin }, SizeClass::from_index(class as usize));
        let class = class.expect("a located slot has a class");
        let (old, emptied) = match (&reader, arena) {
            (Some(_), Some(a)) => release_bits(a, class, bin, slot / WORD_BITS as u32, bits),
            _ => (0, false),
        };
        // The leader leaves the section, then gives the units back.
        let leader_arena = if reader.is_some() { arena } else { None };
        drop(reader);
        if let Some(a) = leader_arena {
            give_units(a, class, old, bits, emptied);
        }
        let old = group.broadcast_u64(old);
        group.sync();
        // Of lanes that freed the same slot, the lowest one freed it; the rest are double frees.
        let mut mine = old >> bit_index & 1 != 0;
        if bits.count_ones() < group.size() {
            let same = platform::match_any(group.mask(), bit_index as u64);
            mine &= platform::leader_of(same) == platform::lane_id();
        }
        if mine {
            FreeOutcome::Freed(class)
        } else {
            FreeOutcome::DoubleFree
        }
    }

    /// Free the blocks of `ptrs` as one group does on the GPU, for a thread alone (the host,
    /// where a warp is one lane): pointers into one bitmap word are released with one
    /// [`release_bits`]. `out[i]` gets the outcome of `ptrs[i]`. For tests of the group path.
    ///
    /// # Safety
    /// As for [`free`](Self::free), for every pointer.
    pub unsafe fn free_bulk(&self, ptrs: &[*mut u8], out: &mut [FreeOutcome]) {
        debug_assert_eq!(ptrs.len(), out.len());
        let mut done = [false; 64];
        assert!(
            ptrs.len() <= done.len(),
            "free_bulk takes at most 64 pointers"
        );
        for i in 0..ptrs.len() {
            if done[i] {
                continue;
            }
            let addr = ptrs[i] as usize;
            let target = if addr.is_multiple_of(PAGE_SIZE) {
                None
            } else {
                // SAFETY: the caller guarantees the block around each pointer is readable.
                let chunk = unsafe { ChunkHeader::at(chunk_base(addr)) };
                locate_hint(chunk, addr)
                    .filter(|s| (s.owner as usize) < self.arenas.len())
                    .map(|s| (chunk, s.owner, s.kind))
            };
            let hint = target.map(|(_, owner, kind)| (owner, kind));
            let Some((chunk, ai, kind)) = target else {
                // SAFETY: forwarded.
                out[i] = unsafe { self.free_single(ptrs[i], hint) };
                done[i] = true;
                continue;
            };
            let arena = &self.arenas[ai as usize];
            let reader = arena.rcu.read_lock_fenced();
            let Some(at) =
                locate_as(chunk, addr, kind, true).filter(|s| s.owner == ai && s.not_held(arena))
            else {
                drop(reader);
                // SAFETY: forwarded.
                out[i] = unsafe { self.free_single(ptrs[i], hint) };
                done[i] = true;
                continue;
            };
            let (bin, class, slot) = (at.bin, at.class, at.slot);
            // The group: every pointer not yet done that lies in the same word.
            let key = word_key(bin, slot);
            let mut members = [(0usize, 0u32); 64];
            let mut k = 0;
            let mut bits = 0u64;
            for (j, &q) in ptrs.iter().enumerate().skip(i) {
                let a = q as usize;
                if done[j] || a.is_multiple_of(PAGE_SIZE) || chunk_base(a) != chunk.base() {
                    continue;
                }
                // `i` was checked against the runs above; a second look at a run's word could
                // find a swap begun since, and leave `i` out of the group and unanswered.
                if let Some(m) = locate_as(chunk, a, kind, true)
                    && m.class == class
                    && word_key(m.bin, m.slot) == key
                    && (j == i || m.not_held(arena))
                {
                    members[k] = (j, m.slot);
                    k += 1;
                    bits |= 1u64 << (m.slot % WORD_BITS as u32);
                }
            }
            let (old, emptied) = release_bits(arena, class, bin, slot / WORD_BITS as u32, bits);
            drop(reader);
            give_units(arena, class, old, bits, emptied);
            let mut seen = 0u64;
            for &(j, s) in &members[..k] {
                done[j] = true;
                // The slot as located inside the read section: a trim may uncarve the bin now.
                let bit = 1u64 << (s % WORD_BITS as u32);
                let first = seen & bit == 0;
                seen |= bit;
                out[j] = if old & bit != 0 && first {
                    FreeOutcome::Freed(class)
                } else {
                    FreeOutcome::DoubleFree
                };
            }
        }
    }

    /// The class size of the live block at `p` (what `realloc` may use in place); 0 if `p` is
    /// not a UAlloc block.
    ///
    /// # Safety
    /// As for [`free`](Self::free), and `p` must stay live during the call.
    pub unsafe fn usable_size(&self, p: *mut u8) -> usize {
        let addr = p as usize;
        if addr.is_multiple_of(PAGE_SIZE) {
            return 0;
        }
        // SAFETY: the caller guarantees the chunk-aligned block around `p` is readable.
        let chunk = unsafe { ChunkHeader::at(chunk_base(addr)) };
        locate(chunk, addr, true).map_or(0, |s| s.class.size())
    }
}
