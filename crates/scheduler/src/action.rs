//! What one submission carries: waits, signals, payload, retained resources, cleanup callbacks.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use cuhal_semaphore::{DeviceEvent, Failure, Semaphore};
use smallvec::SmallVec;

use crate::backend::Backend;

/// How many waits or signals an action holds inline before its list spills to the heap.
pub const INLINE_SEMAPHORES: usize = 4;
/// How many resources an action holds inline.
pub const INLINE_RESOURCES: usize = 4;
/// How many cleanup callbacks an action holds inline.
pub const INLINE_CLEANUPS: usize = 2;

/// A `(semaphore, value)` list: the waits or the signals of one action.
pub type SemaphoreList<E> = SmallVec<[(Semaphore<E>, u64); INLINE_SEMAPHORES]>;

/// Anything an action keeps alive until it completes or fails (buffers, command buffers, a
/// tracing context). Cloning an `Arc` into the list allocates nothing.
pub type Resource = Arc<dyn Any + Send + Sync>;

/// The resources of one action.
pub type Resources = SmallVec<[Resource; INLINE_RESOURCES]>;

/// The cleanup callbacks of one action.
pub type Cleanups = SmallVec<[Cleanup; INLINE_CLEANUPS]>;

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

/// One action's contents, from submission to release.
pub(crate) struct Body<B: Backend> {
    pub(crate) waits: SemaphoreList<B::Event>,
    pub(crate) signals: SemaphoreList<B::Event>,
    pub(crate) payload: B::Payload,
    pub(crate) resources: Resources,
    pub(crate) cleanups: Cleanups,
}

impl<B: Backend> Body<B> {
    /// Fails every signal semaphore with `failure` (the first failure of each wins).
    pub(crate) fn fail_signals(&self, failure: &Failure) {
        for (semaphore, _) in &self.signals {
            semaphore.fail(failure.clone());
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
    },
    /// Failed before it was issued; its signals are already failed.
    Failed { body: Boxed<B>, failure: Failure },
}

/// The first device wait whose event reports an error: the failure came from upstream.
pub(crate) fn upstream_failure<E: DeviceEvent>(device_waits: &[E]) -> Option<Failure> {
    device_waits.iter().find_map(|event| event.query().err())
}

/// An action's body in a heap slot of its own, which the queue recycles: the body is written
/// into it once, at submission, and from then on only this pointer moves (into the pending list,
/// the completion side's hand-over list and batch, back out for release), not the few hundred
/// bytes of the body itself.
pub(crate) struct Boxed<B: Backend>(Box<Option<Body<B>>>);

/// An empty slot for a body, kept by the queue for the next submission.
pub(crate) struct Spare<B: Backend>(Box<Option<Body<B>>>);

impl<B: Backend> Spare<B> {
    /// A new slot (allocates).
    pub(crate) fn new() -> Self {
        Spare(Box::new(None))
    }

    /// Writes `body` into the slot.
    pub(crate) fn fill(mut self, body: Body<B>) -> Boxed<B> {
        *self.0 = Some(body);
        Boxed(self.0)
    }
}

impl<B: Backend> Boxed<B> {
    /// Moves the body out, giving the empty slot back for reuse.
    pub(crate) fn empty(mut self) -> (Body<B>, Spare<B>) {
        let body = self.0.take().expect("a boxed body is filled until emptied");
        (body, Spare(self.0))
    }
}

impl<B: Backend> std::ops::Deref for Boxed<B> {
    type Target = Body<B>;
    fn deref(&self) -> &Body<B> {
        (*self.0)
            .as_ref()
            .expect("a boxed body is filled until emptied")
    }
}

impl<B: Backend> std::ops::DerefMut for Boxed<B> {
    fn deref_mut(&mut self) -> &mut Body<B> {
        (*self.0)
            .as_mut()
            .expect("a boxed body is filled until emptied")
    }
}
