//! [`Semaphore`]: the timeline semaphore itself.

use std::fmt;
use std::sync::PoisonError;

use smallvec::SmallVec;

use crate::error::Error;
use crate::event::DeviceEvent;
use crate::failure::Failure;
use crate::id::SemaphoreId;
use crate::listener::{Burst, Listener, Told, tell};
use crate::listeners::{Due, FIRED_SLOT, ListenToken, Listeners};
use crate::options::SemaphoreOptions;
use crate::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering, Thread};
use crate::timepoint::{Timepoints, WaitPoint};
use crate::waiter::{FAILURE_ONLY, Waiters};

/// A timeline semaphore: a `u64` value that only increases, or a failure.
///
/// `Clone` gives another handle to the same semaphore. See the [crate docs](crate) for the model.
pub struct Semaphore<E: DeviceEvent> {
    shared: Arc<Shared<E>>,
}

struct Shared<E: DeviceEvent> {
    id: SemaphoreId,
    options: SemaphoreOptions,
    state: Mutex<State<E>>,
    /// Bumped under the lock by every change a waiter could be waiting for (an advance, a
    /// recorded device signal, a failure): a waiter with nothing to query spins on it, without
    /// the lock, before it parks.
    changes: AtomicU64,
    /// The value (mirrors `State::value`, readable without the lock): a waiter holding back its
    /// queries while the device is busy watches it, not `changes`, which every recorded device
    /// signal moves too.
    value: AtomicU64,
    /// Parked host waiters and pending futures registered now (mirrors `State::waiters` and
    /// `State::wakers`, readable without the lock): tells a completion side whether anybody is
    /// waiting for an answer.
    parked: AtomicUsize,
    /// Whether the semaphore has failed (mirrors `State::failure`, readable without the lock).
    failed: AtomicBool,
    /// How often the lock was taken.
    #[cfg(feature = "lock-stats")]
    locks: AtomicU64,
}

struct State<E: DeviceEvent> {
    value: u64,
    failure: Option<Failure>,
    timepoints: Timepoints<E>,
    waiters: Waiters,
    listeners: Listeners<E>,
    /// The listeners of pending futures (see `future.rs`): fired only by the value reaching
    /// theirs, or a failure, never by a recorded device signal (a future resolves on the value).
    wakers: Listeners<E>,
}

impl<E: DeviceEvent> State<E> {
    /// Parked waiters and pending futures: what `Shared::parked` mirrors.
    fn waiting(&self) -> usize {
        self.waiters.len() + self.wakers.len()
    }

    /// The highest value a listener can be satisfied by: the value, or a recorded device signal above it.
    fn listen_threshold(&self) -> u64 {
        self.timepoints
            .max_value()
            .map_or(self.value, |v| v.max(self.value))
    }

    /// What a wait for `value` needs (see [`Semaphore::wait_point_ordered`]).
    fn wait_point(
        &self,
        value: u64,
        ordered: impl FnOnce(&E) -> bool,
    ) -> Result<WaitPoint<E>, Error> {
        if let Some(failure) = &self.failure {
            return Err(Error::Failed(failure.clone()));
        }
        if self.value >= value {
            return Ok(WaitPoint::Reached);
        }
        Ok(match self.timepoints.at_least(value) {
            Some((_, event)) if ordered(event) => WaitPoint::Reached,
            Some((v, event)) => WaitPoint::Device {
                value: *v,
                event: event.clone(),
            },
            None => WaitPoint::Pending,
        })
    }

    /// Records a device signal (see [`Semaphore::record_device_signal`]); returns whether the
    /// state changed.
    fn record_device_signal(
        &mut self,
        value: u64,
        event: E,
        wake: &mut Wake<E>,
    ) -> (Result<(), Error>, bool) {
        if let Some(failure) = &self.failure {
            wake.released.push(event);
            (Err(Error::Failed(failure.clone())), false)
        } else if value <= self.value {
            wake.released.push(event);
            (Ok(()), false)
        } else {
            self.listeners.take_due(value, &mut wake.due);
            if !wake.due.is_empty() {
                // A handle for a listener (see `Notice::Recorded`): the one that takes it needs
                // no look at the timepoints for it.
                wake.told = Told::Recorded(value, Some(event.clone()));
            }
            self.timepoints.insert(value, event);
            (Ok(()), true)
        }
    }

    /// Advances to `value`; returns whether it fired a pending future's listener (the count of
    /// those waiting changed).
    fn advance(&mut self, value: u64, wake: &mut Wake<E>, released: Option<&mut Vec<E>>) -> bool {
        self.value = value;
        match released {
            Some(released) => self.timepoints.release_through_into(value, released),
            None => self.timepoints.release_through(value, &mut wake.released),
        }
        self.waiters.take_reached(value, &mut wake.unparkers);
        let threshold = self.listen_threshold();
        self.listeners.take_due(threshold, &mut wake.due);
        let wakers = self.wakers.len();
        if wakers > 0 {
            self.wakers.take_due(value, &mut wake.due);
        }
        wake.told = Told::Reached(value);
        self.wakers.len() != wakers
    }
}

/// What a state change must do once the lock is released: wake parked waiters, notify listeners,
/// and drop released events (which may return them to a pool that has its own lock).
pub(crate) struct Wake<E> {
    unparkers: SmallVec<[Thread; 8]>,
    due: SmallVec<[Due<E>; 8]>,
    released: SmallVec<[E; 8]>,
    /// What the due listeners are told.
    told: Told<E>,
}

impl<E: 'static> Wake<E> {
    fn new() -> Self {
        Wake {
            unparkers: SmallVec::new(),
            due: SmallVec::new(),
            released: SmallVec::new(),
            told: Told::Changed,
        }
    }

    /// Wakes, notifies and releases what the lock's holder gathered; call once the lock is let
    /// go. In place (`&mut`): the lists are inline, and moving them costs a copy of several
    /// hundred bytes on every signal's record, which mostly has nothing to do here. The
    /// listeners are fired in order, each with one burst that this runs after them: what they
    /// make due (a scheduler's issues record device signals) is fired by that loop, not by
    /// calls nested inside theirs.
    fn run(&mut self, id: SemaphoreId) {
        for unparker in self.unparkers.drain(..) {
            unparker.unpark();
        }
        if !self.due.is_empty() {
            let mut burst = Burst::new();
            for (listener, key) in self.due.drain(..) {
                tell(&*listener, id, key, self.told.notice(), &mut burst);
            }
            burst.run();
        }
        self.told = Told::Changed;
        self.released.clear();
    }

    /// [`run`](Self::run) for a caller that fires the listeners itself (a device-signal record,
    /// a failure, under a queue's issue lock): the due listeners go into `burst`, for its owner
    /// to fire, each told what `run` would tell it; of a record's, the first fired is handed
    /// the event.
    fn defer(&mut self, id: SemaphoreId, burst: &mut Burst<E>) {
        for unparker in self.unparkers.drain(..) {
            unparker.unpark();
        }
        // Pushed last first: the burst fires the last one pushed first, so they are fired in
        // the order they were due (smallest value first, then registration).
        for (index, (listener, key)) in self.due.drain(..).enumerate().rev() {
            let told = match &mut self.told {
                Told::Changed => Told::Changed,
                Told::Reached(value) => Told::Reached(*value),
                Told::Recorded(value, event) if index == 0 => Told::Recorded(*value, event.take()),
                Told::Recorded(value, _) => Told::Recorded(*value, None),
            };
            burst.push(listener, id, key, told);
        }
        self.told = Told::Changed;
        self.released.clear();
    }
}

/// A check of one wait entry, taken under the lock.
pub(crate) enum Check<E> {
    Failed(Failure),
    Reached,
    /// Not reached; the recorded device-signal timepoint to query, if host waits query events.
    Pending(Option<(u64, E)>),
}

impl<E: DeviceEvent> Semaphore<E> {
    /// A semaphore at `initial`, with default [`SemaphoreOptions`].
    pub fn new(initial: u64) -> Self {
        Self::with_options(initial, SemaphoreOptions::default())
    }

    /// A semaphore at `initial` with the given options.
    pub fn with_options(initial: u64, options: SemaphoreOptions) -> Self {
        Semaphore {
            shared: Arc::new(Shared {
                id: SemaphoreId::next(),
                options,
                state: Mutex::new(State {
                    value: initial,
                    failure: None,
                    timepoints: Timepoints::new(),
                    waiters: Waiters::new(),
                    listeners: Listeners::new(),
                    wakers: Listeners::empty(),
                }),
                changes: AtomicU64::new(0),
                value: AtomicU64::new(initial),
                parked: AtomicUsize::new(0),
                failed: AtomicBool::new(false),
                #[cfg(feature = "lock-stats")]
                locks: AtomicU64::new(0),
            }),
        }
    }

    /// Notes a change for spinning waiters (called under the lock).
    fn changed(&self) {
        // Every writer holds the lock, so a load and a store make the same count as an atomic
        // add, without its locked instruction on the submission path.
        let changes = self.shared.changes.load(Ordering::Relaxed);
        self.shared.changes.store(changes + 1, Ordering::Release);
    }

    /// Notes an advance to `value` (called under the lock, after `State::advance`): the value's
    /// mirror, then the change count.
    fn advanced(&self, value: u64) {
        self.shared.value.store(value, Ordering::Release);
        self.changed();
    }

    /// Mirrors the number of parked waiters and pending futures in `Shared::parked` (called
    /// under the lock, after a change to either).
    fn note_waiting(&self, state: &State<E>) {
        self.shared.parked.store(state.waiting(), Ordering::Relaxed);
    }

    /// A counter that moves whenever the semaphore advances, records a device signal or fails
    /// (read without the lock, for spinning waiters).
    pub(crate) fn changes(&self) -> u64 {
        self.shared.changes.load(Ordering::Acquire)
    }

    /// Whether the value has reached `value` or the semaphore has failed, read without the lock
    /// (either may have happened just after).
    pub(crate) fn reached_or_failed(&self, value: u64) -> bool {
        self.shared.value.load(Ordering::Acquire) >= value || self.has_failed()
    }

    /// The value as last published, read without the lock: it may lag an advance under way,
    /// but never runs ahead of the value, so a value at or below it has been reached. For
    /// cheap checks (a queue refusing a signal that could not raise the semaphore); `query`
    /// gives the value itself, or the failure.
    pub fn value_hint(&self) -> u64 {
        self.shared.value.load(Ordering::Acquire)
    }

    /// Whether a host thread is parked waiting on this semaphore now, or a pending future
    /// ([`wait_async`](Self::wait_async)) is registered on it (read without the lock). A
    /// completion side polls fast for such a waiter, whose wake-up its advance is; a waiter that
    /// is still spinning on a device event does not need it.
    pub fn has_waiters(&self) -> bool {
        self.shared.parked.load(Ordering::Relaxed) > 0
    }

    /// Whether the semaphore has failed, read without its lock: once true, for good. A queue
    /// that knows a wait is ordered by its own stream (it recorded the awaited signal there)
    /// asks only this.
    pub fn has_failed(&self) -> bool {
        self.shared.failed.load(Ordering::Acquire)
    }

    /// This semaphore's identity.
    pub fn id(&self) -> SemaphoreId {
        self.shared.id
    }

    /// This semaphore's options.
    pub fn options(&self) -> SemaphoreOptions {
        self.shared.options
    }

    /// Whether `self` and `other` are handles to the same semaphore.
    pub fn ptr_eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// How many times this semaphore's lock has been taken, by anyone (feature `lock-stats`): a
    /// test's view of how many locks an operation costs.
    #[cfg(feature = "lock-stats")]
    pub fn lock_count(&self) -> u64 {
        self.shared.locks.load(Ordering::Relaxed)
    }

    /// Whether some thread holds this semaphore's lock right now (feature `lock-stats`): a
    /// test's way to check that a caller does not hold it across work of its own.
    #[cfg(feature = "lock-stats")]
    pub fn lock_is_held(&self) -> bool {
        matches!(
            self.shared.state.try_lock(),
            Err(std::sync::TryLockError::WouldBlock)
        )
    }

    fn lock(&self) -> MutexGuard<'_, State<E>> {
        #[cfg(feature = "lock-stats")]
        self.shared.locks.fetch_add(1, Ordering::Relaxed);
        // Nothing user-supplied runs under the lock but `DeviceEvent::awaited`, whose panics are
        // caught, so a poisoned lock still guards a consistent state.
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The current value, or `Err(Failed)` once the semaphore has failed.
    ///
    /// The value as last advanced, with no device query: a device-signal timepoint counts once
    /// somebody saw its event complete (a waiter, or a completion side that retires in batches
    /// and, while nobody waits, may do so a gather later). To poll the device itself, wait with
    /// [`Timeout::Immediate`](crate::Timeout::Immediate): that queries the awaited timepoint's event once and brings the
    /// value up if it completed.
    pub fn query(&self) -> Result<u64, Error> {
        let state = self.lock();
        match &state.failure {
            Some(failure) => Err(Error::Failed(failure.clone())),
            None => Ok(state.value),
        }
    }

    /// Host signal: sets the value to `value`, which must be greater than the current one
    /// (else `Err(NotMonotonic)` and nothing changes). `Err(Failed)` once failed.
    ///
    /// Listeners run on the calling thread before this returns, and a scheduler's listener issues
    /// the work the signal made ready right there (device calls included), which saves a thread
    /// hand-off. So do not signal from inside a driver callback (CUDA's `cuLaunchHostFunc`
    /// forbids driver calls there): signal from a thread of your own.
    pub fn signal(&self, value: u64) -> Result<(), Error> {
        let mut wake = Wake::new();
        {
            let mut state = self.lock();
            if let Some(failure) = &state.failure {
                return Err(Error::Failed(failure.clone()));
            }
            if value <= state.value {
                return Err(Error::NotMonotonic {
                    current: state.value,
                    requested: value,
                });
            }
            let woke = state.advance(value, &mut wake, None);
            self.advanced(value);
            if woke {
                self.note_waiting(&state);
            }
        }
        wake.run(self.id());
        Ok(())
    }

    /// Completion-path signal: raises the value to `max(current, value)`. Reaching a value that is
    /// already reached is not an error, because a host waiter that saw the device event complete may
    /// have advanced the semaphore first. `Err(Failed)` once failed.
    pub fn advance_to(&self, value: u64) -> Result<(), Error> {
        self.advance_inner(value, None)
    }

    /// [`advance_to`](Self::advance_to) for a caller that advances many timepoints at once (a
    /// completion side retiring a batch): the events of the device-signal timepoints it releases
    /// are moved into `released` instead of being dropped while the semaphore's lock is held, so
    /// the lock is held only for the bookkeeping. The caller drops them (returning them to their
    /// pool) after this returns; keeping `released` from call to call (clearing it) means no
    /// allocation once it is as large as the largest batch.
    pub fn advance_to_releasing(&self, value: u64, released: &mut Vec<E>) -> Result<(), Error> {
        self.advance_inner(value, Some(released))
    }

    fn advance_inner(&self, value: u64, released: Option<&mut Vec<E>>) -> Result<(), Error> {
        let mut wake = Wake::new();
        {
            let mut state = self.lock();
            if let Some(failure) = &state.failure {
                return Err(Error::Failed(failure.clone()));
            }
            if value <= state.value {
                return Ok(());
            }
            let woke = state.advance(value, &mut wake, released);
            self.advanced(value);
            if woke {
                self.note_waiting(&state);
            }
        }
        wake.run(self.id());
        Ok(())
    }

    /// Fails the semaphore. The first failure wins and is kept; later ones are ignored. Wakes every
    /// waiter, fires every listener, and releases every recorded device event.
    pub fn fail(&self, failure: Failure) {
        let mut burst = Burst::new();
        self.fail_into(failure, &mut burst);
        burst.run();
    }

    /// [`fail`](Self::fail), which fires no listener: those it makes due go into `burst`, for
    /// the caller to fire with [`Burst::run`] once it holds no lock a listener may take (as
    /// [`record_device_signal_into`](Self::record_device_signal_into)).
    pub fn fail_into(&self, failure: Failure, burst: &mut Burst<E>) {
        let mut wake = Wake::new();
        {
            let mut state = self.lock();
            if state.failure.is_some() {
                return;
            }
            state.failure = Some(failure);
            self.shared.failed.store(true, Ordering::Release);
            state.timepoints.release_all(&mut wake.released);
            state.waiters.take_all(&mut wake.unparkers);
            state.listeners.take_all(&mut wake.due);
            state.wakers.take_all(&mut wake.due);
            self.note_waiting(&state);
            self.changed();
        }
        wake.defer(self.id(), burst);
    }

    /// The failure, if the semaphore has failed.
    pub fn failure(&self) -> Option<Failure> {
        self.lock().failure.clone()
    }

    /// Records a device-signal timepoint: `event` completes when `value` is reached. Other queues can
    /// then wait for `value` on the device through [`device_wait_event`](Self::device_wait_event).
    /// If `value` is already reached the event is dropped at once. Fires listeners waiting for values
    /// `<= value`, on this thread before it returns. `Err(Failed)` (and the event dropped) once
    /// failed.
    pub fn record_device_signal(&self, value: u64, event: E) -> Result<(), Error> {
        let mut burst = Burst::new();
        let result = self.record_device_signal_into(value, event, &mut burst);
        burst.run();
        result
    }

    /// [`record_device_signal`](Self::record_device_signal), which fires no listener: those it
    /// makes due go into `burst`, each with its [`Notice::Recorded`](crate::Notice::Recorded)
    /// (one of them handed the event), for the caller to fire with [`Burst::run`] once it holds
    /// no lock a listener may take. A scheduler records the signals of the work it issues this
    /// way, under its queue's issue lock.
    pub fn record_device_signal_into(
        &self,
        value: u64,
        event: E,
        burst: &mut Burst<E>,
    ) -> Result<(), Error> {
        let mut state = self.lock();
        if state.failure.is_none() && value > state.value {
            if !state.listeners.any_due(value) {
                // The common case, a chain's next value with nobody listening for it: nothing to
                // wake, notify or release afterwards.
                state.timepoints.insert(value, event);
                self.changed();
                return Ok(());
            }
            if let Some((listener, key)) = state.listeners.take_only_due(value) {
                // A chain's released step: one listener, told what `State::record_device_signal`
                // and `Wake::defer` would tell it, without their lists.
                let handed = Some(event.clone());
                state.timepoints.insert(value, event);
                self.changed();
                drop(state);
                burst.push(listener, self.id(), key, Told::Recorded(value, handed));
                return Ok(());
            }
        }
        let mut wake = Wake::new();
        let (result, changed) = state.record_device_signal(value, event, &mut wake);
        if changed {
            self.changed();
        }
        drop(state);
        wake.defer(self.id(), burst);
        result
    }

    /// The event of the recorded device signal with the smallest value `>= value`, or `None` if none
    /// is recorded, the value is already reached (nothing to wait for), or the semaphore failed.
    /// [`wait_point`](Self::wait_point) answers all of these in one look.
    pub fn device_wait_event(&self, value: u64) -> Option<E> {
        match self.wait_point(value) {
            Ok(WaitPoint::Device { event, .. }) => Some(event),
            _ => None,
        }
    }

    /// What a wait for `value` needs, decided under one lock: reached, a device event to wait on, or
    /// pending. `Err(Failed)` once failed.
    pub fn wait_point(&self, value: u64) -> Result<WaitPoint<E>, Error> {
        self.lock().wait_point(value, |_| false)
    }

    /// [`wait_point`](Self::wait_point) for a consumer that some device signals need no wait
    /// from: a recorded timepoint whose event `ordered` accepts (called under the lock; keep it
    /// cheap) answers [`WaitPoint::Reached`], for there is nothing that consumer must wait for,
    /// and no handle to the event is made. A queue passes "recorded on my own stream" (stream
    /// order already puts its work after the event); a caller that only asks whether it could
    /// go ahead passes `|_| true`. Making and dropping a handle costs a count on the event's
    /// pool slot that this skips.
    pub fn wait_point_ordered(
        &self,
        value: u64,
        ordered: impl FnOnce(&E) -> bool,
    ) -> Result<WaitPoint<E>, Error> {
        self.lock().wait_point(value, ordered)
    }

    /// Registers a one-shot listener: `listener.notify(self.id(), key)` is called once, outside the
    /// lock, when the value reaches `value`, a device signal for a value `>= value` is recorded, or
    /// the semaphore fails. If one of these already holds it is called at once on this thread (and the
    /// token's cancel does nothing).
    ///
    /// The listener's storage is reused, so registering allocates nothing in steady state.
    pub fn listen(
        &self,
        value: u64,
        listener: &std::sync::Arc<dyn Listener<E>>,
        key: u64,
    ) -> ListenToken {
        let id = self.id();
        let mut state = self.lock();
        if state.failure.is_some() || state.listen_threshold() >= value {
            drop(state);
            listener.notify(id, key);
            return ListenToken {
                semaphore: id,
                slot: FIRED_SLOT,
                seq: 0,
            };
        }
        let (slot, seq) = state.listeners.insert(value, listener, key);
        ListenToken {
            semaphore: id,
            slot,
            seq,
        }
    }

    /// Cancels a listener. Does nothing if it already fired, was cancelled, or belongs to another
    /// semaphore. A notification already under way on another thread may still arrive.
    pub fn cancel_listen(&self, token: ListenToken) {
        if token.semaphore != self.id() || token.slot == FIRED_SLOT {
            return;
        }
        let removed = self.lock().listeners.cancel(token.slot, token.seq);
        // The listener may be the last reference to something with its own lock: drop it unlocked.
        drop(removed);
    }

    /// Number of registered listeners (diagnostics and tests): those of [`listen`](Self::listen)
    /// and those of pending futures ([`wait_async`](Self::wait_async) and the multi-waits).
    pub fn listener_count(&self) -> usize {
        let state = self.lock();
        state.listeners.len() + state.wakers.len()
    }

    /// Number of recorded device-signal timepoints still held (diagnostics and tests).
    pub fn timepoint_count(&self) -> usize {
        self.lock().timepoints.len()
    }

    /// Number of host waiters currently registered (diagnostics and tests).
    pub fn waiter_count(&self) -> usize {
        self.lock().waiters.len()
    }

    /// Checks one wait entry (used by the wait loop).
    pub(crate) fn check(&self, value: u64) -> Check<E> {
        let query_events = self.shared.options.event_spin().is_some();
        let state = self.lock();
        if let Some(failure) = &state.failure {
            return Check::Failed(failure.clone());
        }
        if state.value >= value {
            return Check::Reached;
        }
        let timepoint = if query_events {
            state.timepoints.at_least(value).cloned()
        } else {
            None
        };
        Check::Pending(timepoint)
    }

    /// Registers a parked waiter for `value`. Returns its slot and whether `value` is already
    /// reached (then it is only woken by a failure), or the failure. If `tell`, the
    /// device-signal timepoint the waiter needs, if one is recorded, is told it is awaited
    /// ([`DeviceEvent::awaited`]) right after the registration, which the completion side reads
    /// as "somebody waits", and `told` is set. Told under the lock, through the timepoint's own handle: a clone made
    /// to tell it after the lock would be a handle to the event that nothing accounts for while
    /// it lives.
    pub(crate) fn register_waiter(
        &self,
        value: u64,
        unparker: &Thread,
        tell: bool,
        told: &mut bool,
    ) -> Result<(usize, bool), Failure> {
        let mut state = self.lock();
        if let Some(failure) = &state.failure {
            return Err(failure.clone());
        }
        let reached = state.value >= value;
        let slot = state
            .waiters
            .insert(if reached { FAILURE_ONLY } else { value }, unparker);
        self.note_waiting(&state);
        if tell
            && !reached
            && let Some((_, event)) = state.timepoints.at_least(value)
        {
            // A panicking event must not unwind past the registration: the waiter's slot would
            // never be removed, and the semaphore would look waited on for ever.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| event.awaited()));
            *told = true;
        }
        Ok((slot, reached))
    }

    pub(crate) fn remove_waiter(&self, slot: usize) {
        let mut state = self.lock();
        state.waiters.remove(slot);
        self.note_waiting(&state);
    }

    /// Registers a one-shot listener for `value` that only the value itself ends: fired once,
    /// outside the lock, when the value reaches `value` or the semaphore fails, and not by a
    /// recorded device signal (unlike [`listen`](Self::listen)). `None` when either already
    /// holds: nothing is registered and nothing called. The device-signal timepoint the value
    /// waits for, if one is recorded, is told it is awaited ([`DeviceEvent::awaited`]), so that
    /// a completion side that gathers lazily retires it promptly; one recorded later finds
    /// [`has_waiters`](Self::has_waiters) true. Pending futures use it (see `future.rs`), and so
    /// does anything that must see values, not promises of them. Cancel it with
    /// [`cancel_reached`](Self::cancel_reached).
    pub fn listen_reached(
        &self,
        value: u64,
        listener: &std::sync::Arc<dyn Listener<E>>,
        key: u64,
    ) -> Option<ListenToken> {
        let mut state = self.lock();
        if state.failure.is_some() || state.value >= value {
            return None;
        }
        let (slot, seq) = state.wakers.insert(value, listener, key);
        self.note_waiting(&state);
        if let Some((_, event)) = state.timepoints.at_least(value) {
            // As in `register_waiter`: a panicking event must not unwind past the registration.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| event.awaited()));
        }
        Some(ListenToken {
            semaphore: self.id(),
            slot,
            seq,
        })
    }

    /// Cancels a listener [`listen_reached`](Self::listen_reached) registered; does nothing if
    /// it fired, was cancelled, or belongs to another semaphore.
    pub fn cancel_reached(&self, token: ListenToken) {
        if token.semaphore != self.id() {
            return;
        }
        let removed = {
            let mut state = self.lock();
            let removed = state.wakers.cancel(token.slot, token.seq);
            if removed.is_some() {
                self.note_waiting(&state);
            }
            removed
        };
        // The listener may hold the last clone of a waker: dropped unlocked.
        drop(removed);
    }

    /// The failure, if the semaphore failed, else whether the value has reached `value`: read
    /// without the lock unless the semaphore failed (then the lock, for the failure).
    pub(crate) fn reached(&self, value: u64) -> Result<bool, Failure> {
        if self.has_failed()
            && let Some(failure) = self.failure()
        {
            return Err(failure);
        }
        Ok(self.shared.value.load(Ordering::Acquire) >= value)
    }
}

impl<E: DeviceEvent> Clone for Semaphore<E> {
    fn clone(&self) -> Self {
        Semaphore {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<E: DeviceEvent> fmt::Debug for Semaphore<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("Semaphore")
            .field("id", &self.shared.id)
            .field("value", &state.value)
            .field("failure", &state.failure)
            .field("timepoints", &state.timepoints.len())
            .finish()
    }
}
