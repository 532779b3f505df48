//! Futures on timepoints: [`Semaphore::wait_async`], [`wait_all_async`] and [`wait_any_async`],
//! for any executor (std's `Future`, `Waker` and `Poll` only).
//!
//! A pending future registers one listener on each semaphore it still waits for, fired only by
//! the value reaching the awaited one or by a failure (not by a recorded device signal, which
//! fires the scheduler's listeners). The listener holds the task's latest [`Waker`]: a later
//! poll with another waker (an executor moved the task) replaces it in place, so a future has
//! at most one listener per entry however often it is polled. Whoever advances or fails the
//! semaphore fires the listener once its lock is released, and the listener wakes the task: a
//! signalling thread for a host signal, the completion side for device work, or a host waiter
//! that saw a device event complete. No thread waits on the future's behalf.
//!
//! No lost wake-up: a poll stores its waker first and only then looks at the values; an advance
//! stores the value first and only then fires the listeners, which take the waker under the
//! same lock the poll stored it under. Either the fired listener finds the new waker, or the
//! poll's look comes after the advance and sees the value. A registration re-checks the value
//! under the semaphore's lock, as a parked host waiter does.
//!
//! Registration tells the awaited device-signal timepoint, if one is recorded, that it is
//! awaited ([`DeviceEvent::awaited`]), and a pending future counts in
//! [`Semaphore::has_waiters`]: a completion side that gathers completions lazily retires the
//! work a future waits for as soon as it completes. The future itself never queries a device
//! event and never spins. A future dropped while pending cancels its listeners.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, PoisonError};
use std::task::{Context, Poll, Waker};

use smallvec::SmallVec;

use crate::error::Error;
use crate::event::DeviceEvent;
use crate::id::SemaphoreId;
use crate::listener::Listener;
use crate::listeners::ListenToken;
use crate::multi_wait::Mode;
use crate::semaphore::Semaphore;
use crate::sync::Mutex;
use crate::waiter::FAILURE_ONLY;

/// A future that resolves when a semaphore reaches a value ([`Semaphore::wait_async`]):
/// `Ok(())`, or `Err(Failed)` with the semaphore's failure, as [`Semaphore::wait`] returns.
///
/// It has no timeout: use the executor's (dropping the future cancels the wait and unregisters
/// its listener).
#[must_use = "a future does nothing unless polled"]
#[derive(Debug)]
pub struct Wait<E: DeviceEvent>(Waiting<E>);

/// A future that resolves when every `(semaphore, value)` of a list is reached
/// ([`wait_all_async`]): `Ok(())`, or `Err(Failed)` as soon as one of them has failed.
#[must_use = "a future does nothing unless polled"]
#[derive(Debug)]
pub struct WaitAll<E: DeviceEvent>(Waiting<E>);

/// A future that resolves when one `(semaphore, value)` of a list is reached
/// ([`wait_any_async`]): `Ok(index)` of the first reached entry in list order, `Err(Failed)` as
/// soon as one of them has failed, `Err(EmptyWaitList)` for an empty list.
#[must_use = "a future does nothing unless polled"]
#[derive(Debug)]
pub struct WaitAny<E: DeviceEvent>(Waiting<E>);

impl<E: DeviceEvent> Semaphore<E> {
    /// A future that resolves when the value is at least `value` (`Ok`) or the semaphore fails
    /// (`Err(Failed)`, even if the value was reached before it failed), for any executor.
    ///
    /// A value already reached resolves at the first poll with nothing registered. Otherwise
    /// the poll registers a listener that wakes the task from whichever thread advances or
    /// fails the semaphore: no thread per waiter, no spinning. Dropping the future unregisters
    /// it. The future owns a handle to the semaphore (it is `'static`).
    ///
    /// ```
    /// use std::future::Future;
    /// use std::pin::pin;
    /// use std::task::{Context, Poll, Waker};
    /// use cuhal_semaphore::{NoEvent, Semaphore};
    ///
    /// let s = Semaphore::<NoEvent>::new(0);
    /// let mut wait = pin!(s.wait_async(1));
    /// let mut cx = Context::from_waker(Waker::noop());
    /// assert!(wait.as_mut().poll(&mut cx).is_pending());
    /// s.signal(1).unwrap();
    /// assert!(matches!(wait.poll(&mut cx), Poll::Ready(Ok(()))));
    /// ```
    pub fn wait_async(&self, value: u64) -> Wait<E> {
        Wait(Waiting::new(&[(self, value)], Mode::All))
    }
}

/// A future that resolves when every `(semaphore, value)` in `list` is reached: the async form
/// of [`wait_all`](crate::wait_all), without a timeout (use the executor's). `Err(Failed)` as
/// soon as any listed semaphore has failed; an empty list resolves at once. The future holds
/// handles to the semaphores (it is `'static`).
pub fn wait_all_async<E: DeviceEvent>(list: &[(&Semaphore<E>, u64)]) -> WaitAll<E> {
    WaitAll(Waiting::new(list, Mode::All))
}

/// A future that resolves when one `(semaphore, value)` in `list` is reached, with its index
/// (the first reached entry in list order when the future looked): the async form of
/// [`wait_any`](crate::wait_any), without a timeout. `Err(Failed)` as soon as any listed
/// semaphore has failed, `Err(EmptyWaitList)` for an empty list.
pub fn wait_any_async<E: DeviceEvent>(list: &[(&Semaphore<E>, u64)]) -> WaitAny<E> {
    WaitAny(Waiting::new(list, Mode::Any))
}

impl<E: DeviceEvent> Future for Wait<E> {
    type Output = Result<(), Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().0.poll_list(cx).map(|r| r.map(|_| ()))
    }
}

impl<E: DeviceEvent> Future for WaitAll<E> {
    type Output = Result<(), Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().0.poll_list(cx).map(|r| r.map(|_| ()))
    }
}

impl<E: DeviceEvent> Future for WaitAny<E> {
    type Output = Result<usize, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().0.poll_list(cx)
    }
}

/// One `(semaphore, value)` of a future, with its listener's token while one is registered.
#[derive(Debug)]
struct Entry<E: DeviceEvent> {
    semaphore: Semaphore<E>,
    value: u64,
    /// Whether the last look saw the value reached.
    reached: bool,
    token: Option<ListenToken>,
    /// The value `token` listens for: the entry's own, or `FAILURE_ONLY` once it is reached
    /// and only a failure of its semaphore can change what the wait returns (reached only by a
    /// signal to the last value, a harmless early wake; a failure wakes every listener).
    listening_for: u64,
}

/// What the three futures share: the entries, the mode, and the listener that holds the
/// waker (made at the first poll that finds the wait pending).
#[derive(Debug)]
struct Waiting<E: DeviceEvent> {
    entries: SmallVec<[Entry<E>; 1]>,
    mode: Mode,
    slot: Option<Arc<WakerSlot>>,
}

/// Where a look at the entries left the wait.
enum Look {
    /// Resolved: the index (0 for all).
    Done(usize),
    /// Not yet.
    Pending,
}

impl<E: DeviceEvent> Waiting<E> {
    fn new(list: &[(&Semaphore<E>, u64)], mode: Mode) -> Self {
        Waiting {
            entries: list
                .iter()
                .map(|(semaphore, value)| Entry {
                    semaphore: (*semaphore).clone(),
                    value: *value,
                    reached: false,
                    token: None,
                    listening_for: 0,
                })
                .collect(),
            mode,
            slot: None,
        }
    }

    /// Looks at every entry: a failure anywhere ends the wait, as in the host waits.
    fn look(&mut self) -> Result<Look, Error> {
        let mut first_reached = None;
        let mut all_reached = true;
        for (index, entry) in self.entries.iter_mut().enumerate() {
            entry.reached = entry.semaphore.reached(entry.value)?;
            if entry.reached {
                first_reached.get_or_insert(index);
            } else {
                all_reached = false;
            }
        }
        Ok(match (self.mode, first_reached) {
            (Mode::All, _) if all_reached => Look::Done(0),
            (Mode::Any, Some(index)) => Look::Done(index),
            (Mode::Any, None) if self.entries.is_empty() => return Err(Error::EmptyWaitList),
            _ => Look::Pending,
        })
    }

    fn poll_list(&mut self, cx: &mut Context<'_>) -> Poll<Result<usize, Error>> {
        // Already reached (or failed): resolved with nothing registered.
        match self.look() {
            Ok(Look::Done(index)) => return self.finish(Ok(index)),
            Err(error) => return self.finish(Err(error)),
            Ok(Look::Pending) => {}
        }
        // The waker first, then the looks (see the module docs).
        let slot = self.slot.get_or_insert_with(|| Arc::new(WakerSlot::new()));
        slot.set(cx.waker());
        loop {
            match self.look() {
                Ok(Look::Done(index)) => return self.finish(Ok(index)),
                Err(error) => return self.finish(Err(error)),
                Ok(Look::Pending) => {}
            }
            if !self.register() {
                return Poll::Pending;
            }
            // A registration found its value reached or its semaphore failed since the look:
            // look again (each turn, one more entry is reached or the wait ends).
        }
    }

    /// Registers a listener on every entry that needs one and has none; returns whether one
    /// found its value reached or its semaphore failed since (and registered nothing). An entry
    /// the last look saw pending listens for its value. One seen reached stays reached, but in
    /// a wait-all its semaphore's failure still ends the wait: it listens for failure only
    /// (its value's listener, if it had one, has fired). In a wait-any a reached entry ends the
    /// wait, so none is registered for it.
    fn register(&mut self) -> bool {
        let Some(slot) = &self.slot else {
            return false;
        };
        let listener: Arc<dyn Listener<E>> = slot.clone();
        let mut changed = false;
        for (index, entry) in self.entries.iter_mut().enumerate() {
            let wanted = match (entry.reached, self.mode) {
                (false, _) => entry.value,
                (true, Mode::All) => FAILURE_ONLY,
                (true, _) => continue,
            };
            if entry.token.is_some() && entry.listening_for == wanted {
                continue;
            }
            if wanted == FAILURE_ONLY && entry.semaphore.value_hint() == FAILURE_ONLY {
                // At the last value already: nothing to listen for (a listener would find it
                // reached at once, turn after turn).
                continue;
            }
            if let Some(token) = entry.token.take() {
                entry.semaphore.cancel_reached(token);
            }
            match entry
                .semaphore
                .listen_reached(wanted, &listener, index as u64)
            {
                Some(token) => {
                    entry.token = Some(token);
                    entry.listening_for = wanted;
                }
                None => changed = true,
            }
        }
        changed
    }

    /// Unregisters every listener and lets the waker go; returns `result`, ready.
    fn finish(&mut self, result: Result<usize, Error>) -> Poll<Result<usize, Error>> {
        self.unregister();
        if let Some(slot) = &self.slot {
            slot.clear();
        }
        Poll::Ready(result)
    }

    fn unregister(&mut self) {
        for entry in &mut self.entries {
            if let Some(token) = entry.token.take() {
                entry.semaphore.cancel_reached(token);
            }
        }
    }
}

impl<E: DeviceEvent> Drop for Waiting<E> {
    fn drop(&mut self) {
        self.unregister();
    }
}

/// The listener of a pending future: the task's latest waker, woken (and let go) when a
/// semaphore it listens on reaches its value or fails.
struct WakerSlot {
    waker: Mutex<Option<Waker>>,
}

impl WakerSlot {
    fn new() -> Self {
        WakerSlot {
            waker: Mutex::new(None),
        }
    }

    /// Keeps `waker` for the next wake-up, replacing an older one unless it wakes the same task.
    fn set(&self, waker: &Waker) {
        let mut slot = self.waker.lock().unwrap_or_else(PoisonError::into_inner);
        match &*slot {
            Some(held) if held.will_wake(waker) => {}
            _ => *slot = Some(waker.clone()),
        }
    }

    /// Lets the waker go (the future resolved).
    fn clear(&self) {
        let waker = self
            .waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(waker);
    }
}

impl<E> Listener<E> for WakerSlot {
    fn notify(&self, _semaphore: SemaphoreId, _key: u64) {
        let waker = self
            .waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        // Woken outside the slot's lock: an executor may poll the task right here.
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl std::fmt::Debug for WakerSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WakerSlot")
    }
}
