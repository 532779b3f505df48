//! Timeline semaphores for cuhal: host and device timepoints, failure, multi-wait, listeners.
//!
//! Every queue operation in cuhal is ordered by timeline semaphores, as in Vulkan and IREE. A
//! [`Semaphore`] holds a `u64` value that only increases, or a [`Failure`]. Queue operations wait
//! for `(semaphore, value)` pairs and signal new values when they complete. This crate is the
//! primitive alone: it knows nothing of CUDA. It is generic over the [`DeviceEvent`] type, so the
//! CUDA device crate binds timepoints to pooled `CUevent`s, a CPU backend binds them to
//! [`testing::FlagEvent`]s, and a host-only user picks [`NoEvent`].
//!
//! # The model
//!
//! - **Value**: [`Semaphore::query`], [`Semaphore::signal`] (strictly increasing; a value not above
//!   the current one is [`Error::NotMonotonic`] and changes nothing), [`Semaphore::advance_to`]
//!   (the completion path: `max(current, value)`, never an error for a reached value).
//! - **Failure**: [`Semaphore::fail`] keeps the first failure, wakes every waiter and fires every
//!   listener with it. From then on `query`, `signal`, `advance_to`, every wait that includes the
//!   semaphore and [`Semaphore::record_device_signal`] return [`Error::Failed`] with that same
//!   failure ([`Failure::ptr_eq`] holds).
//! - **Host waits**: [`Semaphore::wait`], [`wait_all`], [`wait_any`], with a [`Timeout`] (immediate,
//!   a duration, a deadline, or infinite). Waiters park their own thread; nothing spins
//!   unboundedly and no wake-up is lost (see `waiter.rs` for the argument).
//! - **Device-signal timepoints**: [`Semaphore::record_device_signal`] binds an event that completes
//!   when a value is reached, before it is reached. Other queues find it with
//!   [`Semaphore::device_wait_event`] (the smallest recorded value `>= v`) or
//!   [`Semaphore::wait_point`] and wait on the device, with no host round trip. The semaphore drops
//!   its clone of an event as soon as its value reaches the timepoint (or it fails), so a pool can
//!   reuse the event once every other clone is gone too.
//! - **Host waits on device events**: a host wait whose value has a recorded event queries that
//!   event for a bounded time ([`SemaphoreOptions`]) before parking. When it sees the event complete
//!   it advances the semaphore itself ([`Semaphore::advance_to`]), so the host value never lags
//!   behind what the waiter observed; when the query errors it fails the semaphore with that error.
//!   While the event's device is being submitted to ([`DeviceEvent::submissions`], judged by
//!   [`Traffic`]), the wait queries once per [`SemaphoreOptions::busy_query_pace`], watching the
//!   value in between: a device's event query takes the lock its submitters need.
//! - **Listeners**: [`Semaphore::listen`] registers a one-shot [`Listener`], fired outside the lock
//!   when the value reaches `v`, a device signal `>= v` is recorded, or the semaphore fails; this is
//!   how a scheduler re-examines only the work waiting on a semaphore that changed. A listener is
//!   told what happened as a typed [`Notice`] (a recorded signal hands it the event itself).
//!   [`Semaphore::record_device_signal_into`] fires nobody: it puts the listeners it made due into
//!   the caller's [`Burst`], which the caller runs once it holds no lock, and each listener fired
//!   from a burst records into it in turn, so a chain across many queues is one loop, not nested
//!   calls.
//! - **Futures**: [`Semaphore::wait_async`], [`wait_all_async`] and [`wait_any_async`] return
//!   `Future`s for any executor (std's `Future`, `Waker` and `Poll` only). A pending future's
//!   waker is a listener fired only when the value is reached or the semaphore fails, woken by
//!   whichever thread advances it; a later poll's waker replaces the earlier one, and dropping
//!   the future unregisters it. See the `future` module's source for the no-lost-wake-up
//!   argument.
//!
//! # Public API (what the scheduler and device crates call)
//!
//! ```text
//! Failure::{new(e), msg(text), downcast_ref::<E>(), ptr_eq(&other), inner()}   Clone + Error
//! trait DeviceEvent: Clone + Send + Sync + 'static { fn query(&self) -> Result<bool, Failure>;
//!                                                    fn submissions(&self) -> u64 { 0 } }
//! struct Traffic  ::new(count, pace), .busy(count, now) -> bool, .pace()
//! enum NoEvent {}                                                    (host-only semaphores)
//! enum Error { Failed(Failure), NotMonotonic { current, requested }, Timeout, EmptyWaitList }  non_exhaustive
//! enum Timeout { Immediate, After(Duration), At(Instant), Infinite }  From<Duration>, From<Instant>
//! struct SemaphoreId(u64)  Copy + Eq + Ord + Hash + Debug; .get() -> u64
//! struct SemaphoreOptions  ::new() / default(), .with_event_spin(Duration), .without_event_queries(), .event_spin(),
//!                          .with_busy_query_pace(Duration), .busy_query_pace()
//! struct Semaphore<E: DeviceEvent>   Clone (same semaphore) + Debug
//!   new(initial) / with_options(initial, options) / id() / options() / ptr_eq(&other)
//!   query() -> Result<u64, Error>
//!   signal(value) -> Result<(), Error>          advance_to(value) -> Result<(), Error>
//!   fail(Failure)                               failure() -> Option<Failure>
//!   fail_into(Failure, &mut Burst<E>)             (fires nobody)
//!   wait(value, impl Into<Timeout>) -> Result<(), Error>
//!   wait_async(value) -> Wait<E>                 impl Future<Output = Result<(), Error>> + 'static
//!   record_device_signal(value, event: E) -> Result<(), Error>
//!   record_device_signal_into(value, event: E, &mut Burst<E>) -> Result<(), Error>   (fires nobody)
//!   device_wait_event(value) -> Option<E>
//!   wait_point(value) -> Result<WaitPoint<E>, Error>   WaitPoint::{Reached, Device { value, event }, Pending}
//!   wait_point_ordered(value, ordered: impl FnOnce(&E) -> bool) -> Result<WaitPoint<E>, Error>
//!                                                (an event `ordered` accepts answers Reached, no handle)
//!   has_failed() -> bool                         (without the lock)
//!   listen(value, &Arc<dyn Listener<E>>, key: u64) -> ListenToken      cancel_listen(ListenToken)
//!   listen_reached(value, &Arc<dyn Listener<E>>, key) -> Option<ListenToken>   cancel_reached(ListenToken)
//!                                                (fired by the value or a failure, never a recorded signal)
//!   has_waiters() -> bool                        (a parked host waiter or a pending future; without the lock)
//!   listener_count() / timepoint_count() / waiter_count() -> usize   (diagnostics)
//! trait Listener<E>: Send + Sync { fn notify(&self, semaphore: SemaphoreId, key: u64);
//!                                   fn notice(&self, semaphore, key, Notice<E>, &mut Burst<E>) { notify(..) } }
//! enum Notice<'a, E> { Reached(u64), Recorded { value, event: &'a mut Option<E> }, Changed }
//! struct Burst<E>  ::new(), .run(), .hold_wake(&Waker), .is_empty()     (runs on drop)
//! wait_all(&[(&Semaphore<E>, u64)], impl Into<Timeout>) -> Result<(), Error>
//! wait_any(&[(&Semaphore<E>, u64)], impl Into<Timeout>) -> Result<usize, Error>
//! wait_all_async(&[(&Semaphore<E>, u64)]) -> WaitAll<E>   impl Future<Output = Result<(), Error>>
//! wait_any_async(&[(&Semaphore<E>, u64)]) -> WaitAny<E>   impl Future<Output = Result<usize, Error>>
//! testing::LiveCounter  ::new(), .live() -> usize
//! testing::FlagEvent    ::new(), ::counted(&LiveCounter), ::on_busy_device(), .complete(), .fail(Failure), .is_complete(),
//!                       .query_count(), .clone_count(), .ptr_eq(&other)         impl DeviceEvent
//! ```
//!
//! One module serves the pools built on top: [`slot_pool`] (the handle counts and free list of a
//! pool of slots). The crate is safe code; its reused storage (the timepoint rings) follows
//! `cuhal-recycle`'s policy.
//!
//! Listener notifications and event drops happen after the semaphore's lock is released; no two
//! semaphore locks are ever held at once, and no event is queried under a lock. Dropping a semaphore
//! drops its listeners without notifying them (whoever listens should hold the semaphore) and releases
//! its events.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use cuhal_semaphore::{Semaphore, NoEvent, Error, wait_all};
//!
//! let a = Semaphore::<NoEvent>::new(0);
//! let b = a.clone();
//! let t = std::thread::spawn(move || b.signal(2));
//! a.wait(2, Duration::from_secs(5)).unwrap();
//! t.join().unwrap().unwrap();
//! assert!(matches!(a.signal(1), Err(Error::NotMonotonic { current: 2, requested: 1 })));
//! wait_all(&[(&a, 1), (&a, 2)], Duration::ZERO).unwrap();
//! ```

#![forbid(unsafe_code)]

mod error;
mod event;
mod failure;
mod future;
mod id;
mod listener;
mod listeners;
mod multi_wait;
mod options;
mod semaphore;
pub mod slot_pool;
mod sync;
pub mod testing;
mod timeout;
mod timepoint;
mod traffic;
mod waiter;

pub use error::Error;
pub use event::{DeviceEvent, NoEvent};
pub use failure::Failure;
pub use future::{Wait, WaitAll, WaitAny, wait_all_async, wait_any_async};
pub use id::SemaphoreId;
pub use listener::{Burst, Listener, Notice};
pub use listeners::ListenToken;
pub use multi_wait::{wait_all, wait_any};
pub use options::SemaphoreOptions;
pub use semaphore::Semaphore;
pub use timeout::Timeout;
pub use timepoint::WaitPoint;
pub use traffic::Traffic;

/// loom builds only (`--cfg loom`): the parker this crate's models use in place of crossbeam's,
/// shared with the scheduler's own sync shim so both crates park the same checked way.
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_sync {
    pub use crate::sync::loom_parker::{Parker, Unparker};
}

/// The README's examples, compiled (and run where they need no GPU) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
