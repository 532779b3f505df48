//! `Hurry`: how the completion thread is hurried and woken, and how its nap sleeps.

use std::sync::Arc;
use std::task::Wake;
use std::time::Duration;

use crate::sync::{AtomicUsize, Ordering, Parker, Unparker};

/// The completion thread is gathering (a timed park after a batch nobody waited for).
const GATHERING: usize = 1;
/// The completion thread is napping on a completion event (a timed park on the nap parker).
const NAPPING: usize = 2;
/// Somebody needs the completion side since its last take of finished work.
const HURRIED: usize = 4;

/// Who may hurry a queue's completion thread, and how it is woken: one word of flags and two
/// unparkers only, so a hurry takes no lock (it is made under a semaphore's lock) and, holding
/// the last handle to this, drops nothing but this.
///
/// A sleeper raises its state (gathering, napping) and a hurry raises `HURRIED` by a
/// read-modify-write of the same word, so the two are ordered whatever the memory model: the
/// later one sees the earlier. Either the sleeper sees the hurry and does not sleep, or the
/// hurry sees the sleeper and unparks it (a token, if it has not parked yet). A nap sleeps on a
/// parker of its own, so that the completion thread's other wakes (every push to a parked
/// thread) leave no token that would end a nap early, and a hurry's token at most ends one nap
/// step early.
pub struct Hurry {
    /// `GATHERING`, `NAPPING` and `HURRIED`.
    state: AtomicUsize,
    /// The completion thread's unparker (the queue's one handle to it).
    completion: Unparker,
    /// The unparker of the completion thread's nap parker.
    nap: Unparker,
}

impl Hurry {
    /// Flags for a completion thread parked on `completion` and napping on `nap`.
    pub fn new(completion: Unparker, nap: Unparker) -> Self {
        Hurry {
            state: AtomicUsize::new(0),
            completion,
            nap,
        }
    }

    /// Somebody needs the completion side now: ends its gather or its nap at once (or before
    /// either begins); until its next take of finished work it polls instead of sleeping, and
    /// that round is urgent. Takes no lock and makes at most one wake-up.
    pub fn hurry(&self) {
        let before = self.state.fetch_or(HURRIED, Ordering::AcqRel);
        if before & NAPPING != 0 {
            self.nap.unpark();
        }
        if before & GATHERING != 0 {
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
        self.state.load(Ordering::Relaxed) & HURRIED != 0
            && self.state.fetch_and(!HURRIED, Ordering::AcqRel) & HURRIED != 0
    }

    /// Whether the completion thread is gathering (read by a push, under the hand-over lock,
    /// which the gatherer's last look takes after it raised the state).
    pub(crate) fn gathering(&self) -> bool {
        self.state.load(Ordering::Relaxed) & GATHERING != 0
    }

    /// The gatherer raises its state before its last look; returns whether it is hurried
    /// already (then it does not sleep).
    pub(crate) fn begin_gather(&self) -> bool {
        self.state.fetch_or(GATHERING, Ordering::AcqRel) & HURRIED != 0
    }

    /// Whether a hurry came (read after `begin_gather`, before the gather's sleep).
    pub(crate) fn is_hurried(&self) -> bool {
        self.state.load(Ordering::Acquire) & HURRIED != 0
    }

    /// The gather is over.
    pub(crate) fn end_gather(&self) {
        self.state.fetch_and(!GATHERING, Ordering::AcqRel);
    }

    /// One nap step of the completion thread, on `parker` (the parker `nap` unparks): sleeps
    /// for at most `step` unless hurried, and ends at once when a hurry comes. Returns whether
    /// it was hurried (then the caller polls from now on). Under loom, which has no time, the
    /// sleep waits for an unpark: a model calls this only where a hurry will come.
    pub fn nap(&self, parker: &Parker, step: Duration) -> bool {
        if self.state.fetch_or(NAPPING, Ordering::AcqRel) & HURRIED == 0 {
            #[cfg(not(loom))]
            parker.park_timeout(step);
            #[cfg(loom)]
            {
                let _ = step;
                parker.park();
            }
        }
        self.state.fetch_and(!NAPPING, Ordering::AcqRel) & HURRIED != 0
    }
}

/// As a [`Waker`](std::task::Waker), a `Hurry` is the wake an issuing loop holds back in its
/// [`Burst`](cuhal_semaphore::Burst) until the loop ends: it wakes, it does not hurry.
impl Wake for Hurry {
    fn wake(self: Arc<Self>) {
        Hurry::wake(&self);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        Hurry::wake(self);
    }
}
