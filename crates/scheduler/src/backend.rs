//! [`Backend`]: the few operations a device gives the scheduler.

use cuhal_semaphore::{DeviceEvent, Failure};

use crate::resource::Resource;

/// Which scheduler thread is starting, for [`Backend::bind_thread`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ThreadRole {
    /// The queue's worker: issues actions that become ready after they were submitted.
    Worker,
    /// The queue's completion thread: waits for completion events in issue order.
    Completion,
    /// A thread a backend runs to stand for the device itself (the host backend's executor).
    /// Never passed to [`Backend::bind_thread`]; it appears in [`Error::Spawn`](crate::Error::Spawn).
    Device,
}

/// The device side of one queue: what the scheduler needs from CUDA, HIP, or the CPU.
///
/// A queue calls these methods under a strict discipline, which an implementation may rely on:
///
/// - [`issue`](Backend::issue) is called for one queue by one thread at a time, in the queue's
///   issue order, under the queue's issue lock; the calling thread may be any thread: one that
///   called [`Queue::submit`](crate::Queue::submit) (the fast path), one whose semaphore change
///   made the action ready (a host `signal`, another queue's issue, a host waiter or another
///   queue's completion thread advancing a value), or the queue's worker. A CUDA backend must
///   therefore make its context current inside `issue` (a cheap check of `cuCtxGetCurrent`)
///   rather than rely on [`bind_thread`](Backend::bind_thread) alone.
/// - [`query_event`](Backend::query_event) and [`block_on_event`](Backend::block_on_event) are
///   called only by the completion thread, in issue order: for the newest event of each batch of
///   finished actions, and (unless [`STICKY_ERRORS`](Backend::STICKY_ERRORS)) for the earlier
///   ones once the newest completed, or for each one when the newest reported an error. When
///   to query and when to block is the scheduler's [`policy`](crate::policy), not the backend's.
/// - [`completed`](Backend::completed) is called on the completion thread once per issued action
///   whose completion event completed without error, in issue order, before any cleanup of its
///   batch runs.
/// - [`release`](Backend::release) is called on the completion thread once per action, after the
///   action completed or failed and after its cleanup callbacks ran, whether or not it was issued.
/// - No method is ever called from inside a driver callback, and no scheduler lock that `issue`
///   may wait on is held by a driver callback (the scheduler registers none).
/// - `issue` runs under the queue's issue lock but with no semaphore lock held: the action's
///   waits are looked at before it and its signals recorded after it.
///
/// Errors are [`Failure`]s: an error from `issue`, `query_event` or `block_on_event` fails the action, fails its
/// signal semaphores with that failure and marks the queue lost.
pub trait Backend: Send + Sync + 'static {
    /// The device event: the completion of an issued action, and the device-signal timepoint of
    /// every semaphore that action signals. Cloned into those semaphores, so it must be cheap to
    /// clone and, if pooled, go back to its pool only when its last clone is dropped.
    type Event: DeviceEvent;

    /// The work of one action: command buffers, a graph launch, a host call. The scheduler owns
    /// it from submission until [`release`](Backend::release).
    type Payload: Send + 'static;

    /// The backend's own state for one queue's issues, kept by the scheduler under the queue's
    /// issue lock and lent to every [`issue`](Backend::issue): what only issues touch (CUDA: the
    /// free completion events the issuing side took in one go) needs no lock of its own. `()`
    /// when there is none.
    type IssueLocal: Send;

    /// Whether an error of this device is sticky, so that an event completing without error
    /// proves that every event the queue issued before it completed without error too (CUDA: a
    /// stream runs in order and a device fault poisons the whole context). Then the completion
    /// side of a batch waits for its newest event only and reads no other. Otherwise (the default)
    /// it also reads each earlier event's outcome once the newest is complete, so an action that
    /// failed alone (an upstream failure on the host backend) fails exactly.
    const STICKY_ERRORS: bool = false;

    /// Called once at the start of each scheduler thread, before any other call from it: make the
    /// device's context current. An error here fails the queue's creation.
    fn bind_thread(&self, role: ThreadRole) -> Result<(), Failure> {
        let _ = role;
        Ok(())
    }

    /// Enqueues, in order: a device wait on every event of `device_waits` (CUDA:
    /// `cuStreamWaitEvent`), then the payload (`cuGraphLaunch`, a replay onto the stream, a host
    /// call), then the recording of one new completion event, which it returns.
    ///
    /// `device_waits` are events from this or other queues of the same backend type whose
    /// semaphores have not yet reached the awaited values on the host; they are already issued,
    /// so they will complete or fail. The payload stays owned by the scheduler (and alive) until
    /// `release`; a backend that runs it elsewhere may take what it needs out of it.
    ///
    /// `local` is the backend's own state for this queue's issues ([`Backend::IssueLocal`]).
    fn issue(
        &self,
        local: &mut Self::IssueLocal,
        device_waits: &[Self::Event],
        payload: &mut Self::Payload,
    ) -> Result<Self::Event, Failure>;

    /// A new queue's [`IssueLocal`](Backend::IssueLocal).
    fn issue_local(&self) -> Self::IssueLocal;

    /// Whether `event` completed (`Ok(true)`), is still running (`Ok(false)`) or reports a
    /// device error (`Err`), without waiting (CUDA: `cuEventQuery`).
    fn query_event(&self, event: &Self::Event) -> Result<bool, Failure>;

    /// Blocks until `event` completes (`Ok`) or reports a device error (`Err`), in whatever way
    /// the device blocks without burning a core (CUDA: a blocking-sync event that a stream of
    /// its own records once `event` completed). The scheduler calls it only after its policy's
    /// spin or nap ran out.
    ///
    /// Must return even when the device is lost (the CUDA driver does: every query of a context
    /// with a sticky error returns that error), or a dropped queue would wait forever.
    fn block_on_event(&self, event: &Self::Event) -> Result<(), Failure>;

    /// A count of the work issued to the device so far, by all its queues (it only grows): while
    /// it moves fast, the policy queries events less often, as each query may take a lock the
    /// issuing threads need (CUDA: the driver's). The default: 0 (never busy).
    fn traffic(&self) -> u64 {
        0
    }

    /// Called by the completion side for an action whose event completed without error and
    /// whose payload [`checks_completion`](Backend::checks_completion) (asked once, at issue),
    /// before its signals advance: work that detects its own failure on the device (CUDA: an
    /// indirect dispatch whose count was out of range, recorded instead of run) reports it here,
    /// and the action fails with it. The queue stays usable: this is the work's failure, not the
    /// device's. The default: nothing to check.
    fn check_completed(&self, payload: &Self::Payload) -> Result<(), Failure> {
        let _ = payload;
        Ok(())
    }

    /// Called by the completion side for each issued action whose completion event it saw
    /// complete without error (that event, or a later one of the queue, answered its query), in
    /// issue order, before its check ([`check_completed`](Backend::check_completed)) and before
    /// any cleanup callback of its batch runs. What the backend learns here costs it no query of
    /// its own (CUDA: a traced submission's timing events are known complete, so their
    /// collection in the cleanup reads their times without asking the driver again). Must be
    /// cheap: the completion side calls it for every action. The default does nothing.
    fn completed(&self, payload: &Self::Payload) {
        let _ = payload;
    }

    /// Whether work this backend issues from now on is ordered after `event` already (CUDA: an
    /// event recorded on the queue's own stream). Such a device wait is answered as reached when
    /// the action's waits are looked at (under the semaphore's lock, so keep this cheap), and no
    /// handle to its event is made: it costs nothing on the device, is not carried to the
    /// completion side, and an error its event reports is this queue's own, not an upstream
    /// failure. The default: no.
    fn orders(&self, event: &Self::Event) -> bool {
        let _ = event;
        false
    }

    /// Whether [`check_completed`](Backend::check_completed) may fail this payload. Such an
    /// action's completion event is not recorded as a device-signal timepoint of its signal
    /// semaphores: host waiters and other queues then wait for the completion side, which signals
    /// only after the check passed (so nothing runs after work that failed on the device). The
    /// default: no.
    fn checks_completion(&self, payload: &Self::Payload) -> bool {
        let _ = payload;
        false
    }

    /// Gives back a payload the scheduler is done with: its action completed or failed (it may
    /// never have been issued). The default drops it.
    fn release(&self, payload: Self::Payload) {
        drop(payload);
    }

    /// Called right after an action was issued, under the queue's issue lock, with the resources
    /// it keeps until it completes: a resource that needs to know it is now in the queue's issue
    /// order (CUDA: a use of stream-ordered memory, which a later free on the same stream is
    /// ordered after) can be told here. The default does nothing.
    fn issued(&self, resources: &[Resource]) {
        let _ = resources;
    }
}
