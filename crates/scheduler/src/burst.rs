//! Completion-thread wakes held back until the issuing thread's burst ends.
//!
//! A thread that issues holds a queue's issue lock. An issue there can record a device signal
//! that makes another queue's action ready, which the same thread then issues while it still
//! holds the first lock; a chain across queues released by one host signal is issued whole this
//! way, one burst. The first action handed to a parked completion thread wakes it: a syscall,
//! and a thread that then takes the hand-over lock and asks the driver about the newest event
//! (taking the driver's lock) while the burst goes on issuing. Nobody needs that thread before
//! the burst ends: host waiters look at their events themselves, and work that a host thread is
//! parked on, or that only the completion thread can see done, is urgent and wakes it at once.
//! So the wake waits until this thread holds no issue lock, or until the queue has a full
//! gather batch handed over, which bounds what a long burst leaves unretired. A thread about
//! to wait for room on a queue makes its held-back wakes first (see `Shared::wait_for_room`).

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use smallvec::SmallVec;

use crate::shared::Hurry;
use crate::sync::thread_local;

#[cfg(not(loom))]
thread_local! {
    /// Issue locks this thread holds now, and whether it holds back a wake.
    static BURST: Burst = const { Burst { depth: Cell::new(0), held: Cell::new(false) } };
    /// The completion threads whose wakes this thread holds back, each once. Inline, so that a
    /// thread's first held wake allocates nothing either.
    static HELD: RefCell<Held> = RefCell::new(Held::new());
}

// The same under loom, whose macro takes no `const` initialiser (each loom thread has its own).
#[cfg(loom)]
thread_local! {
    static BURST: Burst = Burst { depth: Cell::new(0), held: Cell::new(false) };
    static HELD: RefCell<Held> = RefCell::new(Held::new());
}

/// Room for the queues of a burst across eight before the list spills (and keeps its spill).
type Held = SmallVec<[Arc<Hurry>; 8]>;

struct Burst {
    depth: Cell<usize>,
    /// `HELD` is not empty: the outermost release looks at it only then.
    held: Cell<bool>,
}

/// This thread took an issue lock.
pub(crate) fn enter() {
    BURST.with(|burst| burst.depth.set(burst.depth.get() + 1));
}

/// This thread let go of an issue lock: the burst ends with its outermost one, and the wakes it
/// held back are made.
pub(crate) fn leave() {
    let wake = BURST.with(|burst| {
        let depth = burst.depth.get().saturating_sub(1);
        burst.depth.set(depth);
        depth == 0 && burst.held.get()
    });
    if wake {
        wake_held();
    }
}

/// Holds back the wake of `hurry`'s completion thread until this thread's burst ends; `false`
/// (the caller wakes it now) when this thread holds no issue lock.
pub(crate) fn hold_wake(hurry: &Arc<Hurry>) -> bool {
    if BURST.with(|burst| burst.depth.get()) == 0 {
        return false;
    }
    HELD.with(|held| {
        let mut held = held.borrow_mut();
        if !held.iter().any(|h| Arc::ptr_eq(h, hurry)) {
            held.push(Arc::clone(hurry));
        }
    });
    BURST.with(|burst| burst.held.set(true));
    true
}

/// Makes every wake this thread held back, now.
pub(crate) fn wake_held() {
    if !BURST.with(|burst| burst.held.replace(false)) {
        return;
    }
    HELD.with(|held| {
        // An unpark calls nothing back, so the list stays borrowed only for this loop.
        for hurry in held.borrow_mut().drain(..) {
            hurry.wake();
        }
    });
}
