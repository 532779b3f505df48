//! What one submission carries: waits, signals, payload, retained resources, cleanup callbacks.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use cuhal_recycle::Recycled;
use cuhal_semaphore::{Burst, DeviceEvent, Failure, Semaphore};
use smallvec::SmallVec;

use crate::backend::Backend;
use crate::resource::Resources;

/// The fewest body slots made at once when a queue runs out: the rotation doubles from there.
pub(crate) const MIN_NEW_BOXES: usize = 16;

/// A list of empty body slots, which grows (the slots in rotation with it) as [`Recycled`] does.
pub(crate) type Spares<B> = Recycled<Vec<Spare<B>>, MIN_NEW_BOXES>;

/// How many waits or signals an action holds inline before its list spills to the heap.
pub const INLINE_SEMAPHORES: usize = 4;
/// How many cleanup callbacks an action holds inline.
pub const INLINE_CLEANUPS: usize = 2;

/// A `(semaphore, value)` list: the waits or the signals of one action.
pub type SemaphoreList<E> = SmallVec<[(Semaphore<E>, u64); INLINE_SEMAPHORES]>;

/// The cleanup callbacks of one action.
pub type Cleanups = SmallVec<[Cleanup; INLINE_CLEANUPS]>;

/// The room a slot's list takes when it first spills past its inline room; it doubles from
/// there, and the slot keeps it for every later action ([`Recycled`]).
pub const SPILLED_ENTRIES: usize = 16;

/// The resources of the action a recycled slot carries: [`Resources`] whose storage the slot
/// keeps, spilled or not, for the next action ([`Queue::submit_with`](crate::Queue::submit_with)
/// fills it).
pub type SlotResources = Recycled<Resources, SPILLED_ENTRIES>;

/// The cleanups of the action a recycled slot carries (see [`SlotResources`]).
pub type SlotCleanups = Recycled<Cleanups, SPILLED_ENTRIES>;

/// The waits or the signals of the action a recycled slot carries (see [`SlotResources`]).
pub(crate) type SlotSemaphores<E> = Recycled<SemaphoreList<E>, SPILLED_ENTRIES>;

/// How an action ended, as its cleanup callbacks see it.
pub type Outcome<'a> = Result<(), &'a Failure>;

/// A callback run on the completion thread once its action completed or failed, before the
/// action's resources and payload are released. This is where GPU timestamps are collected:
/// only then are the action's timing events known to be complete.
///
/// Callbacks must not block for long: the completion thread serves the whole queue. A panicking
/// callback is caught and ignored, so it cannot stop the queue.
pub enum Cleanup {
    /// A shared callback; cloning the `Arc` per action allocates nothing.
    Shared(Arc<dyn Fn(Outcome<'_>) + Send + Sync>),
    /// A plain function with a word of data; allocates nothing.
    Call(fn(Outcome<'_>, u64), u64),
    /// A one-shot closure. Boxing it allocates, so hot paths use the other two.
    Once(Box<dyn FnOnce(Outcome<'_>) + Send>),
}

impl Cleanup {
    /// A shared callback.
    pub fn shared(callback: &Arc<dyn Fn(Outcome<'_>) + Send + Sync>) -> Self {
        Cleanup::Shared(Arc::clone(callback))
    }

    /// A function called with the outcome and `data`.
    pub fn call(function: fn(Outcome<'_>, u64), data: u64) -> Self {
        Cleanup::Call(function, data)
    }

    /// A one-shot closure (allocates).
    pub fn once(callback: impl FnOnce(Outcome<'_>) + Send + 'static) -> Self {
        Cleanup::Once(Box::new(callback))
    }

    pub(crate) fn run(self, outcome: Outcome<'_>) {
        match self {
            Cleanup::Shared(callback) => callback(outcome),
            Cleanup::Call(function, data) => function(outcome, data),
            Cleanup::Once(callback) => callback(outcome),
        }
    }
}

impl fmt::Debug for Cleanup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Cleanup::Shared(_) => "Cleanup::Shared",
            Cleanup::Call(..) => "Cleanup::Call",
            Cleanup::Once(_) => "Cleanup::Once",
        })
    }
}

/// Device events an issued action waited on, kept to tell an upstream failure from a device
/// loss when its completion event reports an error.
pub(crate) type EventList<E> = SmallVec<[E; INLINE_SEMAPHORES]>;

/// One action's contents, from submission to release, in a slot that the queue recycles (see
/// [`Boxed`]). Its lists stay in the slot when it is emptied, with any storage they spilled to,
/// so a submission writes only the entries it has; the payload is moved in whole.
/// Slots start on cache lines of their own: the issuing side fills one while the completion side
/// empties another.
#[repr(align(64))]
pub(crate) struct Body<B: Backend> {
    pub(crate) waits: SlotSemaphores<B::Event>,
    pub(crate) signals: SlotSemaphores<B::Event>,
    /// `None` only while the slot is spare.
    pub(crate) payload: Option<B::Payload>,
    pub(crate) resources: SlotResources,
    pub(crate) cleanups: SlotCleanups,
}

impl<B: Backend> Body<B> {
    fn empty() -> Self {
        Body {
            waits: Recycled::new(),
            signals: Recycled::new(),
            payload: None,
            resources: Recycled::new(),
            cleanups: Recycled::new(),
        }
    }

    /// The payload (a filled slot always has one).
    pub(crate) fn payload(&self) -> &B::Payload {
        match &self.payload {
            Some(payload) => payload,
            None => unreachable!("a filled body slot holds a payload"),
        }
    }

    /// Whether a host thread is parked on one of the signal semaphores now: the completion side's
    /// advance is what wakes it, so its completion must be seen soon.
    pub(crate) fn has_parked_waiters(&self) -> bool {
        self.signals
            .iter()
            .any(|(semaphore, _)| semaphore.has_waiters())
    }

    /// Fails every signal semaphore with `failure` (the first failure of each wins).
    pub(crate) fn fail_signals(&self, failure: &Failure) {
        for (semaphore, _) in &self.signals {
            semaphore.fail(failure.clone());
        }
    }

    /// [`fail_signals`](Self::fail_signals) under the issue lock: the listeners the failures
    /// fire go into `burst`, fired once the lock is let go.
    pub(crate) fn fail_signals_into(&self, failure: &Failure, burst: &mut Burst<B::Event>) {
        for (semaphore, _) in &self.signals {
            semaphore.fail_into(failure.clone(), burst);
        }
    }
}

/// What the completion thread receives, in issue order.
pub(crate) enum Finished<B: Backend> {
    /// Issued: wait for `event`, then signal.
    Issued {
        body: Boxed<B>,
        event: B::Event,
        device_waits: EventList<B::Event>,
        /// The backend checks the work on completion ([`Backend::checks_completion`]).
        checked: bool,
    },
    /// Failed before it was issued; its signals are already failed.
    Failed { body: Boxed<B>, failure: Failure },
}

/// The first device wait whose event reports an error: the failure came from upstream.
pub(crate) fn upstream_failure<E: DeviceEvent>(device_waits: &[E]) -> Option<Failure> {
    device_waits
        .iter()
        .find_map(|event| crate::guard::query(event).err())
}

/// An action's body in a heap slot of its own, which the queue recycles: the body is written
/// into it once, at submission, and from then on only this pointer moves (into the pending list,
/// the completion side's hand-over list and batch, back to the issue side once emptied), not the
/// few hundred bytes of the body itself.
pub(crate) struct Boxed<B: Backend>(pub(crate) Box<Body<B>>);

/// An empty slot for a body, kept by the queue for the next submission.
pub(crate) struct Spare<B: Backend>(pub(crate) Box<Body<B>>);

impl<B: Backend> Spare<B> {
    /// A new slot (allocates).
    pub(crate) fn new() -> Self {
        Spare(Box::new(Body::empty()))
    }

    /// Where the slot's body lies: what a pool of spares warms for the submission that fills it
    /// next ([`Recycled::pop_warm`]), for the completion thread emptied it last.
    #[inline]
    pub(crate) fn body(&self) -> *const Body<B> {
        &raw const *self.0
    }
}

impl<B: Backend> Boxed<B> {
    /// Keeps handles to `waits`, for an action that goes pending.
    pub(crate) fn own_waits(&mut self, waits: &[(&Semaphore<B::Event>, u64)]) {
        for (semaphore, value) in waits {
            self.0.waits.push(((*semaphore).clone(), *value));
        }
    }

    /// Runs the cleanups with `outcome`, drops the resources and semaphore handles, and gives the
    /// payload to `release`, leaving the slot empty for reuse. A panic in a cleanup, a drop or
    /// `release` is contained: it cannot stop the completion thread, and the slot is emptied
    /// whatever happens.
    pub(crate) fn release(
        self,
        outcome: Outcome<'_>,
        release: impl FnOnce(B::Payload),
    ) -> Spare<B> {
        let mut slot = self.0;
        let body = &mut *slot;
        for cleanup in body.cleanups.drain(..) {
            let _ = catch_unwind(AssertUnwindSafe(|| cleanup.run(outcome)));
        }
        // Each list pops an entry before dropping it, so a clear that a panicking drop cut short
        // is simply resumed.
        // Their storage stays, spilled or not, for the slot's next action.
        while catch_unwind(AssertUnwindSafe(|| {
            body.resources.clear();
            body.waits.clear();
            body.signals.clear();
        }))
        .is_err()
        {}
        if let Some(payload) = body.payload.take() {
            let _ = catch_unwind(AssertUnwindSafe(|| release(payload)));
        }
        Spare(slot)
    }
}

impl<B: Backend> std::ops::Deref for Boxed<B> {
    type Target = Body<B>;
    fn deref(&self) -> &Body<B> {
        &self.0
    }
}

impl<B: Backend> std::ops::DerefMut for Boxed<B> {
    fn deref_mut(&mut self) -> &mut Body<B> {
        &mut self.0
    }
}
