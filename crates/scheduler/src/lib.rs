//! The pending-action scheduler of cuhal: issue work when it is ready, complete it off the
//! driver's threads.
//!
//! A device queue receives *actions*: wait for some `(semaphore, value)` pairs, run a payload,
//! then signal other `(semaphore, value)` pairs. This crate decides when each action may be
//! issued to the device, issues it, and retires it when it completes. It follows IREE's
//! `pending_queue_actions.c` and fixes its defects; it knows nothing of CUDA: a device provides a
//! [`Backend`] (the CUDA one lives in the device crate; [`host`] is a CPU one), and semaphores come
//! from `cuhal-semaphore`.
//!
//! # The life of an action
//!
//! 1. [`Queue::submit`] takes the waits, the signals, the payload, the resources to keep alive
//!    and the cleanup callbacks. All of it lives inline (smallvec) in a heap slot of the queue,
//!    written once and recycled when the action is released; only the slot's pointer moves from
//!    then on, and steady state allocates nothing. [`Queue::submit_with`] lets the caller write
//!    the payload, resources and cleanups into the slot itself, instead of moving them in.
//! 2. Readiness, per wait: a reached value is dropped; a value whose device-signal event is
//!    already recorded (some issued action will signal it) becomes a device wait, with no host
//!    round trip; otherwise the action is pending, and a one-shot listener on that one semaphore
//!    (keyed by slot and generation) is all that will look at it again. Nothing ever rescans the
//!    pending list, so an action costs the same with 100 or 100,000 others pending.
//! 3. Issue, strictly in submission order per queue: the backend enqueues the device waits, the
//!    payload and a completion event, which is then recorded as the device-signal timepoint of
//!    every signal semaphore, so other queues can wait for it on the device. An action that is
//!    ready when submitted, with nothing pending ahead of it, is issued by the submitting thread
//!    (no thread hand-off on the hot path); the queue's worker thread issues only those that
//!    become ready later.
//! 4. The queue's completion thread retires finished actions in batches, in issue order: it waits
//!    for the newest completion event of a batch along the completion [`policy`] (polling for a
//!    bounded, configurable time while somebody needs the answer, else napping, then blocking, or,
//!    on a queue that gathers, keeping a batch whose work still runs for its next round), advances each signal semaphore once on the host, runs
//!    the cleanup callbacks (where tracing is collected), then releases the resources and gives
//!    the payloads back to the backend. Nothing runs inside a driver callback. A thread that
//!    issues a burst (a chain across queues that one host signal released) wakes a parked
//!    completion thread when the burst ends, not at its first hand-over, unless the work is
//!    urgent or a full gather batch waits.
//! 5. Failure: a failed wait semaphore fails the action and every one of its signal semaphores with
//!    the same [`Failure`]. A backend error fails that action and loses the queue: pending actions
//!    fail with it and every later submit returns [`Error::Lost`]. Cleanups run and resources are
//!    released either way; nothing waits forever.
//! 6. Shutdown ([`Queue`]'s drop): ready work is issued, everything else pending fails with
//!    [`Error::ShutDown`], issued work is waited for, the threads are joined, nothing leaks.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use cuhal_scheduler::{Cleanups, QueueOptions, Resources};
//! use cuhal_scheduler::host::{self, HostPayload, HostSemaphore};
//!
//! let upload = host::queue(QueueOptions::new("upload")).unwrap();
//! let compute = host::queue(QueueOptions::new("compute")).unwrap();
//! let uploaded = HostSemaphore::new(0);
//! let computed = HostSemaphore::new(0);
//! // Submitted first, it waits: the upload is not even submitted yet.
//! compute
//!     .submit(&[(&uploaded, 1)], &[(&computed, 1)], HostPayload::Nop, Resources::new(), Cleanups::new())
//!     .unwrap();
//! upload
//!     .submit(&[], &[(&uploaded, 1)], HostPayload::Nop, Resources::new(), Cleanups::new())
//!     .unwrap();
//! computed.wait(1, Duration::from_secs(5)).unwrap();
//! ```

#![forbid(unsafe_code)]

mod action;
mod backend;
mod completion;
mod error;
mod guard;
mod handover;
pub mod host;
mod hurry;
mod issue;
mod issue_lock;
mod listen;
mod notifier;
mod options;
mod pending;
pub mod policy;
mod queue;
mod readiness;
mod resource;
mod room;
mod shared;
mod slots;
mod spin;
mod state;
mod sync;
mod worker;

pub use action::{
    Cleanup, Cleanups, INLINE_CLEANUPS, INLINE_SEMAPHORES, Outcome, SPILLED_ENTRIES, SemaphoreList,
    SlotCleanups, SlotResources,
};
pub use backend::{Backend, ThreadRole};
pub use cuhal_semaphore::{DeviceEvent, Failure, Semaphore};
pub use error::Error;
/// The completion thread's hurry and nap, public for the loom models only.
#[cfg(loom)]
pub use hurry::Hurry;
pub use issue::check_signals;
pub use options::QueueOptions;
pub use policy::CompletionOptions;
pub use queue::{CompletionNudge, LossTrigger, Queue, QueueStats};
pub use resource::{INLINE_RESOURCES, Resource, Resources};
pub use spin::spin_until;

/// The README's examples, compiled (and run where they need no GPU) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
