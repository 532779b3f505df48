//! [`DeviceEvent`]: the device-side completion a semaphore timepoint is bound to.

use crate::failure::Failure;

/// The device-side event a device-signal timepoint is bound to.
///
/// The CUDA implementation (in the device crate) is a pooled `CU_EVENT_DISABLE_TIMING` event; tests
/// use [`testing::FlagEvent`](crate::testing::FlagEvent); a CPU backend can use a flag too.
///
/// `Clone` must be cheap (an `Arc`), and an implementation backed by a pool must return the event to
/// the pool only when its last clone is dropped: a semaphore drops its clone as soon as its value
/// reaches the timepoint, and whoever obtained a clone through
/// [`Semaphore::device_wait_event`](crate::Semaphore::device_wait_event) holds theirs until the
/// device wait is issued.
///
/// Dropping an event may happen under a semaphore's lock (when many timepoints are released at
/// once), so an event's `Drop` must not call into a semaphore; returning it to a pool with a lock
/// of its own is fine.
pub trait DeviceEvent: Clone + Send + Sync + 'static {
    /// `Ok(true)`: the work before the event has completed. `Ok(false)`: not yet.
    /// `Err`: the device failed; the semaphore that queried it fails with this failure.
    ///
    /// Called by host waiters in a bounded spin, so it must be cheap and must not block.
    fn query(&self) -> Result<bool, Failure>;

    /// A count of the work submitted so far to the device this event belongs to, by every
    /// submitter of that device: a host wait that sees it move by two or more within its
    /// [`busy_query_pace`](crate::SemaphoreOptions::busy_query_pace) spaces its queries of this
    /// event that far apart, for as long as the submissions keep coming. A CUDA event query
    /// takes the driver's lock that the submitting threads need: on the H200, another thread's
    /// query every 2 us made each launch + record 0.55 us slower.
    ///
    /// Read on every round of a host wait's queries, so it must be a few loads. The default, a
    /// count that never moves, never spaces queries out (nothing to contend with).
    fn submissions(&self) -> u64 {
        0
    }

    /// A host thread is about to park until the work before this event is done: whoever
    /// retires that work should look for its completion now, not at its own pace (a completion
    /// side that gathers batches sleeps between them, and the advance it makes is what wakes a
    /// parked waiter; the waiter's own looks at the event come 50 us to 1 ms apart). A backend
    /// whose completion side sleeps between batches passes it on (the scheduler's
    /// `CompletionNudge`, which sets two flags and may unpark a thread). Called at the first
    /// park of a wait that finds a timepoint to tell (and not at its later parks, which end in
    /// its own looks at the event), after the waiter registered, under the lock of the
    /// semaphore whose timepoint this is: it must not block or use that semaphore, and may take
    /// only locks never held while a semaphore's is taken (a panic is caught and ignored). The
    /// default does nothing.
    fn awaited(&self) {}
}

/// The event type of a host-only semaphore: it has no values, so no device signal can be recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoEvent {}

impl DeviceEvent for NoEvent {
    fn query(&self) -> Result<bool, Failure> {
        match *self {}
    }
}
