//! Loom models of the SRCU domain (`rcu.rs`): every interleaving up to the preemption bound.
//! Run with
//! `RUSTFLAGS="--cfg loom -C debug-assertions=on" LOOM_MAX_PREEMPTIONS=2 cargo test -p toga-kernels --release --test loom_rcu`.
//!
//! A deferred object's payload is a loom `UnsafeCell`: if a callback's write is not ordered
//! after a reader's read (INV(RCU1)), loom reports the race; a spin loop that never ends shows
//! up as loom's "too many branches".
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use loom::thread;

use toga_kernels::platform::Atomic64;
use toga_kernels::rcu::{Barrier, RcuHead, Srcu};

const LIVE: u32 = 1;
const DEAD: u32 = 2;

/// A deferred object: the head first, so the callback's head pointer is the object pointer.
#[repr(C)]
struct Obj {
    head: RcuHead,
    value: UnsafeCell<u32>,
}

fn new_obj() -> *mut Obj {
    Box::into_raw(Box::new(Obj {
        head: RcuHead::new(),
        value: UnsafeCell::new(LIVE),
    }))
}

/// The callback: marks the object dead (a write that must not race any reader).
fn reclaim(head: *const RcuHead, ran: &AtomicUsize) {
    let obj = head as *const Obj;
    // SAFETY: heads are the first field of live `Obj`s (freed only after the model).
    unsafe { &*obj }.value.with_mut(|v| {
        // SAFETY: the grace period makes this the only access (what loom checks).
        unsafe { *v = DEAD }
    });
    ran.fetch_add(1, SeqCst);
}

/// Read the object published in `slot`, if any: the caller is inside a read section.
fn read_published(slot: &Atomic64) {
    // Acquire: pairs with the publication (the object is initialized).
    let p = slot.load_acquire() as *const Obj;
    if !p.is_null() {
        // SAFETY: reachable inside a read section → not reclaimed (INV(RCU1)).
        let v = unsafe { &*p }.value.with(|v| unsafe { *v });
        assert_eq!(v, LIVE, "reader saw a reclaimed object");
    }
}

/// Read the object published in `slot`, if any, inside a read section.
fn read(srcu: &Srcu, slot: &Atomic64) {
    let guard = srcu.read_lock();
    read_published(slot);
    drop(guard);
}

/// The writer of the one-reader models: unlink the object in `slot`, queue it and run a
/// conditional barrier, which must run its callback (and only it) at once.
fn unlink_and_reclaim(srcu: &Srcu, slot: &Atomic64, ran: &AtomicUsize) {
    let p = slot.swap_acq_rel(0) as *const Obj;
    // SAFETY: the object stays allocated until the model ends.
    unsafe { srcu.call_rcu(&(*p).head) };
    assert_eq!(srcu.barrier_conditional(|h| reclaim(h, ran)), Barrier::Ran);
    assert_eq!(ran.load(SeqCst), 1);
}

fn free_obj(p: *mut Obj) {
    // SAFETY: from `new_obj`, no longer shared.
    drop(unsafe { Box::from_raw(p) });
}

/// One reader, one writer that unlinks, queues and runs a conditional barrier: the callback
/// never runs while the reader can still see the object, and it always runs.
#[test]
fn callback_waits_for_readers() {
    loom::model(|| {
        let srcu = Arc::new(Srcu::new());
        let obj = new_obj();
        let slot = Arc::new(Atomic64::new(obj as u64));
        let ran = Arc::new(AtomicUsize::new(0));
        let reader = {
            let (srcu, slot) = (srcu.clone(), slot.clone());
            thread::spawn(move || read(&srcu, &slot))
        };
        unlink_and_reclaim(&srcu, &slot, &ran);
        reader.join().unwrap();
        assert!(srcu.is_idle());
        assert_eq!(srcu.readers(), (0, 0));
        free_obj(obj);
    });
}

/// `read_lock_fenced` (a fence, then the entry, as `free` enters): the callback never runs
/// while the reader can see the object, and a write made before the section is released by a
/// relaxed store inside it to a thread that acquires that store (the fence is the caller's
/// release). Without the fence, loom reports the race on `data`.
#[test]
fn fenced_readers_are_waited_for_and_release_earlier_writes() {
    loom::model(|| {
        let srcu = Arc::new(Srcu::new());
        let obj = new_obj();
        let slot = Arc::new(Atomic64::new(obj as u64));
        let ran = Arc::new(AtomicUsize::new(0));
        let data = Arc::new(UnsafeCell::new(0u32));
        let flag = Arc::new(Atomic64::new(0));
        let reader = {
            let (srcu, slot) = (srcu.clone(), slot.clone());
            let (data, flag) = (data.clone(), flag.clone());
            thread::spawn(move || {
                // SAFETY: only this thread writes, before the flag publishes it.
                data.with_mut(|d| unsafe { *d = 7 });
                let guard = srcu.read_lock_fenced();
                read_published(&slot);
                flag.store_relaxed(1);
                drop(guard);
            })
        };
        let observer = {
            let (data, flag) = (data.clone(), flag.clone());
            thread::spawn(move || {
                if flag.load_acquire() == 1 {
                    // SAFETY: loom reports a race if the write above is not ordered before.
                    assert_eq!(data.with(|d| unsafe { *d }), 7);
                }
            })
        };
        unlink_and_reclaim(&srcu, &slot, &ran);
        reader.join().unwrap();
        observer.join().unwrap();
        assert!(srcu.is_idle());
        assert_eq!(srcu.readers(), (0, 0));
        free_obj(obj);
    });
}

/// Two writers with conditional barriers and a reader: a writer that finds an owner running
/// delegates (returns at once); every callback runs exactly once, none while a reader that
/// could see its object is inside.
#[test]
fn conditional_barrier_delegates() {
    loom::model(|| {
        let srcu = Arc::new(Srcu::new());
        let objs = [new_obj(), new_obj()];
        let slots = Arc::new([Atomic64::new(objs[0] as u64), Atomic64::new(objs[1] as u64)]);
        let ran = Arc::new(AtomicUsize::new(0));
        let writer = |i: usize| {
            let (srcu, slots, ran) = (srcu.clone(), slots.clone(), ran.clone());
            thread::spawn(move || {
                let p = slots[i].swap_acq_rel(0) as *const Obj;
                // SAFETY: the object stays allocated until the model ends.
                unsafe { srcu.call_rcu(&(*p).head) };
                srcu.barrier_conditional(|h| reclaim(h, &ran))
            })
        };
        let w0 = writer(0);
        let w1 = writer(1);
        read(&srcu, &slots[1]);
        let outcomes = [w0.join().unwrap(), w1.join().unwrap()];
        assert!(
            outcomes.contains(&Barrier::Ran),
            "someone owned a barrier: {outcomes:?}"
        );
        assert_eq!(ran.load(SeqCst), 2, "every callback ran once");
        assert!(srcu.is_idle());
        objs.into_iter().for_each(free_obj);
    });
}

/// The classic barrier returns only after the caller's callback ran, even when another
/// writer owns the barrier at the time.
#[test]
fn classic_barrier_waits_for_own_callback() {
    loom::model(|| {
        let srcu = Arc::new(Srcu::new());
        let objs = [new_obj(), new_obj()];
        let ran = Arc::new(AtomicUsize::new(0));
        let other = {
            let (srcu, ran) = (srcu.clone(), ran.clone());
            let p = objs[1] as usize;
            thread::spawn(move || {
                // SAFETY: the object stays allocated until the model ends.
                unsafe { srcu.call_rcu(&(*(p as *const Obj)).head) };
                srcu.barrier_conditional(|h| reclaim(h, &ran));
            })
        };
        // SAFETY: as above.
        unsafe { srcu.call_rcu(&(*objs[0]).head) };
        srcu.barrier(|h| reclaim(h, &ran));
        // Our object is dead now, whoever ran the callback.
        // SAFETY: reading after the barrier; the other writer never touches objs[0] again.
        let v = unsafe { &*objs[0] }.value.with(|v| unsafe { *v });
        assert_eq!(v, DEAD);
        other.join().unwrap();
        assert_eq!(ran.load(SeqCst), 2);
        objs.into_iter().for_each(free_obj);
    });
}

/// Two readers and two back-to-back grace periods: a reader counted in both parities for a
/// moment delays an owner at most, and both parities drain.
#[test]
fn readers_across_two_grace_periods() {
    loom::model(|| {
        let srcu = Arc::new(Srcu::new());
        let obj = new_obj();
        let slot = Arc::new(Atomic64::new(obj as u64));
        let ran = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (srcu, slot) = (srcu.clone(), slot.clone());
                thread::spawn(move || read(&srcu, &slot))
            })
            .collect();
        // An empty grace period first (epoch 0 → 1), then the real one (1 → 2).
        let dummy = new_obj();
        // SAFETY: both objects stay allocated until the model ends.
        unsafe { srcu.call_rcu(&(*dummy).head) };
        srcu.barrier(|h| reclaim(h, &ran));
        let p = slot.swap_acq_rel(0) as *const Obj;
        // SAFETY: as above.
        unsafe { srcu.call_rcu(&(*p).head) };
        srcu.barrier(|h| reclaim(h, &ran));
        readers.into_iter().for_each(|r| r.join().unwrap());
        assert_eq!(ran.load(SeqCst), 2);
        assert_eq!(srcu.epoch(), 2);
        free_obj(obj);
        free_obj(dummy);
    });
}
