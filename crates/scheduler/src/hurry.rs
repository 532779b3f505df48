//! `Hurry`: how the completion thread is hurried and woken, and how its nap sleeps.

use std::time::Duration;

use crate::sync::{AtomicBool, Ordering, Parker, Unparker};

/// Who may hurry a queue's completion thread, and how it is woken: flags and two unparkers only,
/// so a hurry takes no lock (it is made under a semaphore's lock) and, holding the last handle
/// to this, drops nothing but this.
///
/// Each sleeping state (`gathering`, `napping`) is raised before the sleeper's last look at
/// `hurried`, and a hurry raises `hurried` before it reads them, all sequentially consistent:
/// either the sleeper sees the hurry and does not sleep, or the hurry sees the sleeper and
/// unparks it. A nap sleeps on a parker of its own, so that the completion thread's other
/// wakes (every push to a parked thread) leave no token that would end a nap early, and a
/// hurry's token at most ends one nap step early.
pub struct Hurry {
    /// The completion thread is gathering (a timed park after a batch nobody waited for). Also
    /// read by every push under the hand-over lock.
    pub(crate) gathering: AtomicBool,
    /// The completion thread is napping on a completion event (a timed park on `nap`).
    napping: AtomicBool,
    /// Somebody needs the completion side since its last take of finished work.
    pub(crate) hurried: AtomicBool,
    /// The completion thread's unparker (the queue's one handle to it).
    completion: Unparker,
    /// The unparker of the completion thread's nap parker.
    nap: Unparker,
}

impl Hurry {
    /// Flags for a completion thread parked on `completion` and napping on `nap`.
    pub fn new(completion: Unparker, nap: Unparker) -> Self {
        Hurry {
            gathering: AtomicBool::new(false),
            napping: AtomicBool::new(false),
            hurried: AtomicBool::new(false),
            completion,
            nap,
        }
    }

    /// Somebody needs the completion side now: ends its gather or its nap at once (or before
    /// either begins); until its next take of finished work it polls instead of sleeping, and
    /// that round is urgent. Takes no lock and makes at most two wake-ups.
    pub fn hurry(&self) {
        self.hurried.store(true, Ordering::SeqCst);
        if self.napping.load(Ordering::SeqCst) {
            self.nap.unpark();
        }
        if self.gathering.load(Ordering::SeqCst) {
            self.completion.unpark();
        }
    }

    /// Wakes the completion thread (a wake a submitter's burst held back, new work for a parked
    /// thread, shutdown). Does not hurry it.
    pub fn wake(&self) {
        self.completion.unpark();
    }

    /// Takes the hurry (the completion thread's take of finished work, under the hand-over
    /// lock): whether one came since the last take.
    pub(crate) fn take(&self) -> bool {
        self.hurried.load(Ordering::Relaxed) && self.hurried.swap(false, Ordering::AcqRel)
    }

    /// One nap step of the completion thread, on `parker` (the parker `nap` unparks): sleeps
    /// for at most `step` unless hurried, and ends at once when a hurry comes. Returns whether
    /// it was hurried (then the caller polls from now on). Under loom, which has no time, the
    /// sleep waits for an unpark: a model calls this only where a hurry will come.
    pub fn nap(&self, parker: &Parker, step: Duration) -> bool {
        self.napping.store(true, Ordering::SeqCst);
        if !self.hurried.load(Ordering::SeqCst) {
            #[cfg(not(loom))]
            parker.park_timeout(step);
            #[cfg(loom)]
            {
                let _ = step;
                parker.park();
            }
        }
        self.napping.store(false, Ordering::Relaxed);
        self.hurried.load(Ordering::Acquire)
    }
}
