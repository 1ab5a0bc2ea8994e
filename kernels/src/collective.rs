//! Collective synchronization: lane groups, the collective mutex, and single-flight work.
//!
//! A [`Group`] is the set of lanes of one warp that are active at the same call site and pass
//! the same key (`match.any`); its lowest lane is the leader. UAlloc groups lanes that ask for
//! the same size class, or the same bin kind, so that one lane does the group's atomics.
//!
//! A [`CollectiveMutex`] lets a whole group enter a critical section with ONE lock
//! acquisition:
//!
//! ```text
//!   lanes of the group      leader                       word `inside`
//!   ──────────────────      ──────────────────────────   ─────────────────────────────
//!   lock(&group)       ──►  CAS 0 → group.size()          0 ──► k   (spin with back-off)
//!                           bar.warp.sync(group)  ◄── every member waits here
//!   ... critical section, each member on its own ...
//!   unlock()                each member: fetch_sub 1       k ──► … ──► 0: released by the last
//! ```
//!
//! Members may leave in any order and at different times (independent thread scheduling):
//! the lock is free when the last member has left. The word counts members inside, so zeroed
//! memory is an unlocked mutex.
//!
//! # Convergence rules
//! - [`Group::of`] reads `activemask` and calls `match.any.sync` on it: every lane that is
//!   active at the call must reach it (straight-line code right after the mask).
//! - Every other collective here ([`Group::broadcast_u32`], [`Group::broadcast_u64`],
//!   [`Group::sync`], [`CollectiveMutex::lock`]) must be called by every lane of the group,
//!   with the same group, the same number of times: keep the control flow between them
//!   uniform over the group (branch only on values every member got from a broadcast).
//! - On the host a warp is one lane: every group is `{lane 0}`; so it is under loom, except
//!   for the threads of a `platform::ModelWarp` (`loom_warp.rs`, `loom_free.rs`).

use crate::platform::{self, Atomic32, BACKOFF_MIN_NS, Backoff};

/// Lanes of one warp that act together. Copy it freely; it is two words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    mask: u32,
    lane: u32,
}

impl Group {
    /// The lanes active here whose `key` equals this lane's. Convergence: see the module doc.
    #[inline(always)]
    pub fn of(key: u64) -> Self {
        Self::of_among(platform::active_mask(), key)
    }

    /// [`of`](Self::of) for a caller that read the active lanes (`platform::active_mask`)
    /// here already.
    #[inline(always)]
    pub fn of_among(active: u32, key: u64) -> Self {
        Self {
            mask: platform::match_any(active, key),
            lane: platform::lane_id(),
        }
    }

    /// This lane alone (a group of one; every collective on it is trivial).
    #[inline(always)]
    pub fn single() -> Self {
        let lane = platform::lane_id();
        Self {
            mask: 1 << lane,
            lane,
        }
    }

    /// This lane's part of the group cut into consecutive runs of at most `max` lanes by rank
    /// (lanes `0..max` of the group, then `max..2 max`, ...). For a resource whose batch is
    /// smaller than a warp. No collective: every lane computes it from the mask.
    #[inline(always)]
    pub fn split(&self, max: u32) -> Group {
        Group {
            mask: split_mask(self.mask, self.lane, max),
            lane: self.lane,
        }
    }

    /// The lanes of the group from rank `first` on, for a lane among them (`first <= rank`):
    /// those a step that served the lowest ranks left over. No collective: every lane
    /// computes it from the mask.
    #[inline(always)]
    pub fn from_rank(&self, first: u32) -> Group {
        debug_assert!(first <= self.rank());
        if first == 0 {
            return *self;
        }
        let lowest = platform::nth_set_bit_u32(self.mask, first);
        Group {
            mask: self.mask & !((1u32 << lowest) - 1),
            lane: self.lane,
        }
    }

    /// The lanes of the group.
    #[inline(always)]
    pub fn mask(&self) -> u32 {
        self.mask
    }

    /// Number of lanes.
    #[inline(always)]
    pub fn size(&self) -> u32 {
        self.mask.count_ones()
    }

    /// This lane's rank: the number of group lanes below it (the leader has rank 0).
    #[inline(always)]
    pub fn rank(&self) -> u32 {
        platform::rank_in(self.mask, self.lane)
    }

    /// The leader's lane (the lowest lane of the group).
    #[inline(always)]
    pub fn leader(&self) -> u32 {
        platform::leader_of(self.mask)
    }

    /// Whether this lane leads the group.
    #[inline(always)]
    pub fn is_leader(&self) -> bool {
        self.lane == self.leader()
    }

    /// Whether this lane is alone in its group.
    #[inline(always)]
    pub fn is_single(&self) -> bool {
        self.mask == 1 << self.lane
    }

    /// The leader's `value`, on every lane. Collective (module doc).
    #[inline(always)]
    pub fn broadcast_u32(&self, value: u32) -> u32 {
        if self.is_single() {
            return value;
        }
        if self.mask == u32::MAX {
            // The whole warp (the leader is lane 0): a shuffle with a constant full mask, which
            // SASS issues without the convergence check (`MATCH`, `REDUX`) that a variable
            // mask costs.
            return platform::shfl_idx_u32(u32::MAX, value, 0);
        }
        platform::shfl_idx_u32(self.mask, value, self.leader())
    }

    /// The leader's `value`, on every lane. Collective (module doc).
    #[inline(always)]
    pub fn broadcast_u64(&self, value: u64) -> u64 {
        if self.is_single() {
            return value;
        }
        if self.mask == u32::MAX {
            // As in `broadcast_u32`.
            return platform::shfl_idx_u64(u32::MAX, value, 0);
        }
        platform::shfl_idx_u64(self.mask, value, self.leader())
    }

    /// Wait for every lane of the group; orders their memory accesses among themselves.
    /// Collective (module doc).
    #[inline(always)]
    pub fn sync(&self) {
        if !self.is_single() {
            platform::sync_warp(self.mask);
        }
    }
}

/// The lanes of `mask` whose rank divided by `max` equals that of `lane` (see
/// [`Group::split`]).
#[inline(always)]
pub fn split_mask(mask: u32, lane: u32, max: u32) -> u32 {
    debug_assert!(max > 0 && mask & (1 << lane) != 0);
    if mask.count_ones() <= max {
        return mask;
    }
    let part = platform::rank_in(mask, lane) / max;
    let mut rest = mask;
    let mut rank = 0;
    let mut out = 0;
    while rest != 0 {
        let bit = rest & rest.wrapping_neg();
        if rank / max == part {
            out |= bit;
        }
        rank += 1;
        rest ^= bit;
    }
    out
}

/// A mutex that a [`Group`] takes with one acquisition (see the module doc). 4 bytes; zeroed
/// memory is unlocked.
#[repr(C)]
pub struct CollectiveMutex {
    /// Members inside the critical section; 0 = unlocked (INV(CM1)).
    inside: Atomic32,
}

impl CollectiveMutex {
    /// An unlocked mutex (all-zero).
    pub fn new() -> Self {
        Self {
            inside: Atomic32::new(0),
        }
    }

    /// Collective lock: every lane of `group` calls it; when it returns, all of them are
    /// inside, and each must call [`unlock`](Self::unlock) once. Spins with back-off.
    pub fn lock(&self, group: &Group) {
        if group.is_leader() {
            self.acquire(group.size());
        }
        // INV(CM2): bar.warp.sync orders the leader's acquire before every member's accesses.
        group.sync();
    }

    /// Lock for this lane alone.
    #[inline]
    pub fn lock_single(&self) {
        self.acquire(1);
    }

    /// Leave the critical section; the last member to leave unlocks. Returns whether this was
    /// the last member.
    #[inline]
    pub fn unlock(&self) -> bool {
        // Release: this member's critical-section accesses happen before the next holder's
        // acquire CAS, which reads the value the last member's decrement wrote (the decrements
        // form one release sequence). No acquire half: nothing after the unlock reads what
        // other members wrote inside (an acquire is an L1 invalidation on the GPU).
        let old = self.inside.fetch_sub_release(1);
        debug_assert!(old > 0, "unlock of an unlocked CollectiveMutex");
        old == 1
    }

    /// Lock on behalf of `members` members (the leader's half of [`lock`](Self::lock)); each
    /// member then calls [`unlock`](Self::unlock) once.
    pub fn acquire(&self, members: u32) {
        debug_assert!(members > 0);
        let mut backoff = Backoff::new();
        while !self.try_acquire(members) {
            backoff.snooze();
        }
    }

    /// One attempt at [`acquire`](Self::acquire).
    #[inline]
    pub fn try_acquire(&self, members: u32) -> bool {
        // One CAS, no test-and-test-and-set: the CAS always reads the newest value, so a
        // waiter that backs off between tries cannot spin on a stale load. These locks guard
        // rare paths (list surgery), so the CAS traffic stays low.
        // Acquire: pairs with the release in `unlock` of the previous holders. No release half:
        // taking a lock publishes nothing (what a holder writes, its `unlock` publishes), and
        // on the GPU an `acq_rel` CAS is a MEMBAR per try, which waiters for a busy list paid
        // over and over (ncu: 15 MEMBARs per `take_bins` call of a fresh 16 B malloc).
        self.inside.compare_exchange_acquire(0, members).is_ok()
    }

    /// Whether anyone is inside (a snapshot, for assertions).
    pub fn is_locked(&self) -> bool {
        self.inside.load_relaxed() != 0
    }
}

impl Default for CollectiveMutex {
    fn default() -> Self {
        Self::new()
    }
}

/// The longest sleep of a thread waiting for a [`SingleFlight`] run to end.
pub const JOIN_SLEEP_MAX_NS: u32 = 2048;

/// Work that one thread does on behalf of every thread that asks for it meanwhile: the first
/// caller runs it, callers that come while it runs wait for that run to end and share its
/// result instead of running it again (INV(SF1)). UAlloc's `trim` goes through one, so that
/// thousands of threads out of memory do not each walk every arena: before, each of them did,
/// waiting in turn on every arena's trim lock (docs/ualloc.md). 8 bytes; zeroed memory is
/// idle.
///
/// INV(SF1): `run_or_join` returns the result of a run that started after the call began (its
/// own, or one it joined), and everything that run did happens before the call returns.
#[repr(C)]
pub struct SingleFlight {
    /// Runs finished (wrapping) times 2, plus 1 while a run is in progress: one word, so that
    /// "a run is in progress" and "which run" change together.
    state: Atomic32,
    /// What the newest finished run returned.
    result: Atomic32,
}

impl SingleFlight {
    /// Idle (all-zero).
    pub fn new() -> Self {
        Self {
            state: Atomic32::new(0),
            result: Atomic32::new(0),
        }
    }

    /// Run `work` unless a run is in progress; then wait for that run to end and for the one
    /// after it, which started after this call began, and return what that one returned
    /// (running it ourselves if no one else has started it). `work` must not call this on the
    /// same `SingleFlight`.
    ///
    /// Joining only the run in progress would not do for a trim: that run may have passed the
    /// arena whose bins this caller is missing before they were empty. The run after it is
    /// shared too, by every caller that joined the first.
    pub fn run_or_join(&self, work: impl Fn() -> u32) -> u32 {
        match self.try_run(&work) {
            Ok(result) => result,
            Err(running) => {
                self.join(running);
                match self.try_run(&work) {
                    Ok(result) => result,
                    // Started after `running` ended, so after this call began.
                    Err(next) => self.join(next),
                }
            }
        }
    }

    /// Run `work` if no run is in progress and return its result; otherwise `Err` with the
    /// state of the run in progress, for [`join`](Self::join).
    pub fn try_run(&self, work: impl FnOnce() -> u32) -> Result<u32, u32> {
        // Relaxed: a stale value only costs a failed CAS, which reads the newest one.
        let mut state = self.state.load_relaxed();
        while state & 1 == 0 {
            // Idle: start a run. Acquire pairs with the previous run's release.
            match self.state.compare_exchange_acq_rel(state, state | 1) {
                Ok(_) => {
                    let result = work();
                    self.result.store_relaxed(result);
                    // Release: the run's effects and its result happen before a joiner that
                    // sees the new state. Only the runner writes while the bit is set.
                    self.state.store_release(state.wrapping_add(2));
                    return Ok(result);
                }
                Err(now) => state = now,
            }
        }
        Err(state)
    }

    /// Wait until the run that `try_run` saw in progress (`running`) has ended, and return
    /// what the newest run returned. A run walks every arena, so it takes
    /// microseconds or more: sleep up to [`JOIN_SLEEP_MAX_NS`] between looks.
    pub fn join(&self, running: u32) -> u32 {
        let mut ns = BACKOFF_MIN_NS;
        // Relaxed looks (no fence per look); the acquire comes after the last one.
        while self.state.load_relaxed() == running {
            platform::nanosleep(ns);
            ns = (ns * 2).min(JOIN_SLEEP_MAX_NS);
        }
        // Acquire, with the look that saw the new state: pairs with the run's release.
        platform::fence_acq_rel();
        self.result.load_relaxed()
    }

    /// Runs finished so far (wrapping; a snapshot, for statistics and tests).
    pub fn runs(&self) -> u32 {
        self.state.load_relaxed() >> 1
    }

    /// Whether a run is in progress (a snapshot, for assertions).
    pub fn is_running(&self) -> bool {
        self.state.load_relaxed() & 1 != 0
    }
}

impl Default for SingleFlight {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// INV(SF1) under contention on CPU threads: every call returns a run that started after
    /// it began, runs never overlap, and callers that come together share runs.
    #[test]
    fn single_flight_shares_runs_among_concurrent_callers() {
        use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
        let gate = SingleFlight::new();
        let (started, ended, inside) = (AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0));
        let calls = 16 * 50;
        std::thread::scope(|s| {
            for _ in 0..16 {
                s.spawn(|| {
                    for _ in 0..50 {
                        let before = started.load(SeqCst);
                        let got = gate.run_or_join(|| {
                            assert_eq!(inside.fetch_add(1, SeqCst), 0, "runs overlap");
                            let id = started.fetch_add(1, SeqCst) + 1;
                            std::thread::sleep(std::time::Duration::from_micros(200));
                            ended.store(id, SeqCst);
                            inside.fetch_sub(1, SeqCst);
                            id
                        });
                        assert!(
                            got > before,
                            "run {got} started before the call (after {before})"
                        );
                        assert!(ended.load(SeqCst) >= got);
                    }
                });
            }
        });
        let runs = started.load(SeqCst);
        assert!(
            runs < calls,
            "{runs} runs for {calls} calls: nothing was shared"
        );
        assert!(!gate.is_running());
    }

    #[test]
    fn host_group_is_one_lane() {
        let g = Group::of(42);
        assert!(g.is_single() && g.is_leader());
        assert_eq!((g.size(), g.rank()), (1, 0));
        assert_eq!(g.broadcast_u64(7), 7);
    }

    #[test]
    fn split_cuts_by_rank() {
        let mask = 0b1011_0110_1101u32;
        // Ranks: lane 0→0, 2→1, 3→2, 5→3, 6→4, 8→5, 9→6, 11→7.
        assert_eq!(split_mask(mask, 0, 3), 0b1101);
        assert_eq!(split_mask(mask, 3, 3), 0b1101);
        assert_eq!(split_mask(mask, 5, 3), 0b1_0110_0000);
        assert_eq!(split_mask(mask, 9, 3), 0b1010_0000_0000);
        assert_eq!(split_mask(mask, 9, 8), mask);
        assert_eq!(split_mask(u32::MAX, 31, 5), 0b11 << 30);
        for lane in 0..32 {
            let m = split_mask(u32::MAX, lane, 5);
            assert!(m.count_ones() <= 5 && m & (1 << lane) != 0);
        }
    }

    #[test]
    fn last_member_unlocks() {
        let m = CollectiveMutex::new();
        m.acquire(3);
        assert!(!m.try_acquire(1));
        assert!(!m.unlock());
        assert!(!m.unlock());
        assert!(m.is_locked());
        assert!(m.unlock());
        assert!(!m.is_locked());
        m.lock(&Group::single());
        assert!(m.unlock());
    }

    #[test]
    fn mutual_exclusion_with_threads() {
        let m = CollectiveMutex::new();
        let inside = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        m.lock_single();
                        assert_eq!(inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0);
                        inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        m.unlock();
                    }
                });
            }
        });
        assert!(!m.is_locked());
    }
}
