//! [`Hurry`]: the handle that ends a completion thread's gather, and through which every wake of
//! that thread the issue side makes or holds back is made.

use std::sync::Arc;
use std::task::Wake;

use crate::sync::{AtomicBool, Ordering, Unparker};

/// What a host thread about to park on a queue's work needs to end that queue's gather (see
/// `completion::gather`): the completion side's advance is what wakes a parked thread (its own
/// looks at its event come 50 us to 1 ms apart). Flags and an unparker only, so a hurry takes
/// no lock (it is made under a semaphore's lock) and, holding the last handle to this, drops
/// nothing but this.
///
/// As a [`Waker`](std::task::Waker) (see [`Wake`]) it is the wake an issuing loop holds back in
/// its [`Burst`](cuhal_semaphore::Burst) until the loop ends.
pub(crate) struct Hurry {
    /// The completion thread is gathering (a timed park after a batch nobody waited for). Set
    /// before the gather's last look, read by every push under the hand-over lock and by a
    /// hurry against `hurried` (each sets its own flag, then reads the other's, both
    /// sequentially consistent: one of them sees the other).
    pub(crate) gathering: AtomicBool,
    /// A host thread parked on this queue's work since the completion thread's last take.
    pub(crate) hurried: AtomicBool,
    /// The completion thread's unparker (the queue's one handle to it).
    pub(crate) completion: Unparker,
}

impl Hurry {
    /// Ends the completion thread's gather, now or before it begins; its next round is urgent.
    pub(crate) fn hurry(&self) {
        self.hurried.store(true, Ordering::SeqCst);
        if self.gathering.load(Ordering::SeqCst) {
            self.completion.unpark();
        }
    }

    /// Wakes the completion thread for work handed to it: made at once, or held back by the
    /// issuing loop until it ends.
    pub(crate) fn wake(&self) {
        self.completion.unpark();
    }
}

impl Wake for Hurry {
    fn wake(self: Arc<Self>) {
        Hurry::wake(&self);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        Hurry::wake(self);
    }
}
