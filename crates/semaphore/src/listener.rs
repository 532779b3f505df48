//! [`Listener`]: how a scheduler learns that a semaphore advanced, recorded a device signal or
//! failed, without polling and without being called under the semaphore's lock; the [`Notice`]
//! it is told; and the [`Burst`] it is fired from.
//!
//! A listener that records device signals itself (a scheduler issuing the work a change made
//! ready, on the thread that made the change) would otherwise fire the listeners of those
//! signals from inside its own call, and so on down a chain across queues: one nested call per
//! queue, with the locks of the queues above still held. Instead such a record puts what it made
//! due into the caller's burst ([`Semaphore::record_device_signal_into`]); the caller lets go of
//! its locks, then [`run`](Burst::run)s the burst, which fires each listener with the burst
//! itself, so that what they make due joins the same loop. The stack stays one listener deep
//! however long the chain.
//!
//! [`Semaphore::record_device_signal_into`]: crate::Semaphore::record_device_signal_into

use std::sync::Arc;
use std::task::Waker;

use smallvec::SmallVec;

use crate::id::SemaphoreId;

/// Receives one-shot notifications from [`Semaphore::listen`](crate::Semaphore::listen), for a
/// semaphore of event type `E`.
///
/// `notify` is called outside every semaphore lock, on whichever thread caused the change (a
/// signalling thread, a completion thread, a host waiter that saw a device event complete, or the
/// thread calling `listen` when the condition already holds). It must not block on a lock another
/// thread may hold while it calls into semaphores: record the key and wake a worker, or *try* a
/// lock and do the work right there (a scheduler issues what became ready on the notifying thread,
/// which saves a thread hand-off). It may call back into any semaphore.
pub trait Listener<E>: Send + Sync {
    /// The semaphore `semaphore` reached the listened value, recorded a device signal for a value
    /// at least that high, or failed. `key` is the key given to `listen`.
    fn notify(&self, semaphore: SemaphoreId, key: u64);

    /// [`notify`](Self::notify), with what the semaphore did: a listener that would look at the
    /// semaphore next (a scheduler about to issue the action it held back) can act on the
    /// notice instead, without taking the semaphore's lock and searching its timepoints. The
    /// semaphore calls this one for every change it makes (a listener due when it registers gets
    /// `notify`); the default drops the notice and calls `notify`.
    ///
    /// `burst` is the caller's: a listener that records device signals itself (a scheduler
    /// issuing on the notifying thread) records them with
    /// [`record_device_signal_into`](crate::Semaphore::record_device_signal_into) `burst`, and
    /// the caller fires the listeners those made due once this returns. A chain across many
    /// queues is so walked by one loop, not by calls nested one per queue.
    fn notice(
        &self,
        semaphore: SemaphoreId,
        key: u64,
        notice: Notice<'_, E>,
        burst: &mut Burst<E>,
    ) {
        let _ = (notice, burst);
        self.notify(semaphore, key);
    }
}

/// What a semaphore did when it fired a listener (see [`Listener::notice`]), as of that moment:
/// the semaphore may have moved on since. A value reached stays reached, and a recorded device
/// signal stays recorded until its value is reached, but the semaphore may also have failed
/// since, which a listener that acts on a notice asks [`has_failed`](crate::Semaphore::has_failed).
pub enum Notice<'a, E> {
    /// The value reached this. A listener that listened for a higher value was fired by a
    /// recorded device signal at least that high, not by this value.
    Reached(u64),
    /// A device signal was recorded for the listened value or higher.
    Recorded {
        /// The recorded value.
        value: u64,
        /// A handle to the signal's event that one listener may `take()`; the other listeners
        /// the same record fired find `None`.
        event: &'a mut Option<E>,
    },
    /// The semaphore failed: look at it.
    Changed,
}

/// Room for the listeners one loop holds at once before its list spills: a chain holds one
/// (each fired listener's records join the loop as it runs).
const INLINE_FIRED: usize = 8;

/// Room for the wakes one loop owes before its list spills (and keeps its spill).
const INLINE_WAKES: usize = 8;

/// Listeners due and wakes owed by one loop of changes, owned by that loop (a value on its
/// stack). Inline lists: a burst that holds no more than eight of each allocates nothing.
///
/// Dropping a burst runs it: nothing it holds is lost if its owner unwinds.
pub struct Burst<E> {
    fired: SmallVec<[Fired<E>; INLINE_FIRED]>,
    wakes: SmallVec<[Waker; INLINE_WAKES]>,
}

/// One due listener and what it is told.
struct Fired<E> {
    listener: Arc<dyn Listener<E>>,
    semaphore: SemaphoreId,
    key: u64,
    told: Told<E>,
}

/// What a change tells a listener it fires (see [`Notice`]).
pub(crate) enum Told<E> {
    Changed,
    Reached(u64),
    /// The recorded value, and a handle to its event for the listener to take.
    Recorded(u64, Option<E>),
}

impl<E> Told<E> {
    /// The notice, lending the event handle a `Recorded` holds.
    pub(crate) fn notice(&mut self) -> Notice<'_, E> {
        match self {
            Told::Changed => Notice::Changed,
            Told::Reached(value) => Notice::Reached(*value),
            Told::Recorded(value, event) => Notice::Recorded {
                value: *value,
                event,
            },
        }
    }
}

impl<E> Default for Burst<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> Burst<E> {
    /// An empty burst.
    pub fn new() -> Self {
        Burst {
            fired: SmallVec::new(),
            wakes: SmallVec::new(),
        }
    }

    /// Whether it holds no listener and owes no wake.
    pub fn is_empty(&self) -> bool {
        self.fired.is_empty() && self.wakes.is_empty()
    }

    /// Adds a listener a change made due.
    pub(crate) fn push(
        &mut self,
        listener: Arc<dyn Listener<E>>,
        semaphore: SemaphoreId,
        key: u64,
        told: Told<E>,
    ) {
        self.fired.push(Fired {
            listener,
            semaphore,
            key,
            told,
        });
    }

    /// Owes `waker`'s wake until the end of [`run`](Self::run) (or the burst's drop): each
    /// waker once ([`Waker::will_wake`]), however often it is held. A wake that nobody needs
    /// before the loop ends (a completion thread's, for work nobody waits on yet) so costs one
    /// system call per loop, not one per piece of work, and none while the loop still issues.
    pub fn hold_wake(&mut self, waker: &Waker) {
        if !self.wakes.iter().any(|held| held.will_wake(waker)) {
            self.wakes.push(waker.clone());
        }
    }

    /// Fires every listener it holds, each with this burst (what they make due joins the loop),
    /// until none is left; then makes the wakes it owes. The owner calls it with no lock held
    /// that a listener may take. The last listener pushed is fired first.
    pub fn run(&mut self) {
        while let Some(mut fired) = self.fired.pop() {
            tell(
                &*fired.listener,
                fired.semaphore,
                fired.key,
                fired.told.notice(),
                self,
            );
        }
        for waker in self.wakes.drain(..) {
            waker.wake();
        }
    }
}

impl<E> Drop for Burst<E> {
    /// Runs what the burst still holds: an owner lets its burst drop (with no lock held that a
    /// listener may take) to run it, as a submission does.
    fn drop(&mut self) {
        // The emptiness test written out: an empty burst (the common case) enters no other call.
        if !self.fired.is_empty() || !self.wakes.is_empty() {
            self.run();
        }
    }
}

/// Calls a listener that a change fired, with no semaphore lock held. A panicking listener must
/// not cost the others their notification (a scheduler waiting for one would wait for ever), so
/// its panic is contained here.
pub(crate) fn tell<E>(
    listener: &dyn Listener<E>,
    semaphore: SemaphoreId,
    key: u64,
    notice: Notice<'_, E>,
    burst: &mut Burst<E>,
) {
    let notify = std::panic::AssertUnwindSafe(|| listener.notice(semaphore, key, notice, burst));
    let _ = std::panic::catch_unwind(notify);
}
