//! [`HostEvent`]: the host backend's device event, a completion flag with an optional error,
//! and the pool that reuses them.

use std::fmt;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use cuhal_semaphore::{DeviceEvent, Failure};

use crate::spin::spin_until;

const PENDING: u8 = 0;
const COMPLETING: u8 = 1;
const DONE: u8 = 2;
const FAILED: u8 = 3;

/// A completion flag with an optional error: the host backend's [`DeviceEvent`].
///
/// Clones share the flag. Events made by a [`HostBackend`](super::HostBackend) come from its pool
/// and are reused once every clone is dropped (so issuing allocates nothing in steady state).
#[derive(Clone)]
pub struct HostEvent(Arc<EventState>);

pub(crate) struct EventState {
    state: AtomicU8,
    failure: OnceLock<Failure>,
    /// Threads blocked in `wait`: the completer takes the lock and notifies only if there are any.
    waiters: AtomicU32,
    lock: Mutex<()>,
    ready: Condvar,
}

impl EventState {
    fn new() -> Self {
        EventState {
            state: AtomicU8::new(PENDING),
            failure: OnceLock::new(),
            waiters: AtomicU32::new(0),
            lock: Mutex::new(()),
            ready: Condvar::new(),
        }
    }

    fn reset(&mut self) {
        *self.state.get_mut() = PENDING;
        self.failure.take();
        *self.waiters.get_mut() = 0;
    }
}

impl HostEvent {
    /// A pending event outside any pool.
    pub fn new() -> Self {
        HostEvent(Arc::new(EventState::new()))
    }

    /// Completes the event with `result`; the first completion wins, later ones are ignored.
    /// Wakes every thread blocked in [`wait`](Self::wait).
    pub fn complete(&self, result: Result<(), Failure>) {
        let state = &self.0;
        if state
            .state
            .compare_exchange(PENDING, COMPLETING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let final_state = match result {
            Ok(()) => DONE,
            Err(failure) => {
                let _ = state.failure.set(failure);
                FAILED
            }
        };
        // SeqCst pairs with the waiter's SeqCst increment and re-check: either the waiter sees the
        // final state, or this sees the waiter and notifies under the lock.
        state.state.store(final_state, Ordering::SeqCst);
        if state.waiters.load(Ordering::SeqCst) > 0 {
            let _guard = state.lock.lock().unwrap_or_else(PoisonError::into_inner);
            state.ready.notify_all();
        }
    }

    fn result(&self, state: u8) -> Option<Result<(), Failure>> {
        match state {
            DONE => Some(Ok(())),
            FAILED => Some(Err(self
                .0
                .failure
                .get()
                .cloned()
                .unwrap_or_else(|| Failure::msg("host event failed")))),
            _ => None,
        }
    }

    /// The result, if the event has completed.
    pub fn try_result(&self) -> Option<Result<(), Failure>> {
        self.result(self.0.state.load(Ordering::Acquire))
    }

    /// Waits for the event: polls it for at most `spin`, then blocks.
    pub fn wait(&self, spin: Duration) -> Result<(), Failure> {
        if spin_until(spin, || self.0.state.load(Ordering::Acquire) >= DONE)
            && let Some(result) = self.try_result()
        {
            return result;
        }
        let state = &self.0;
        state.waiters.fetch_add(1, Ordering::SeqCst);
        let mut guard = state.lock.lock().unwrap_or_else(PoisonError::into_inner);
        while state.state.load(Ordering::SeqCst) < DONE {
            guard = state
                .ready
                .wait(guard)
                .unwrap_or_else(PoisonError::into_inner);
        }
        drop(guard);
        state.waiters.fetch_sub(1, Ordering::SeqCst);
        self.try_result()
            .unwrap_or_else(|| Err(Failure::msg("host event in an impossible state")))
    }

    /// Whether `self` and `other` are clones of the same event.
    pub fn ptr_eq(&self, other: &HostEvent) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Default for HostEvent {
    fn default() -> Self {
        Self::new()
    }
}

impl DeviceEvent for HostEvent {
    fn query(&self) -> Result<bool, Failure> {
        match self.try_result() {
            None => Ok(false),
            Some(Ok(())) => Ok(true),
            Some(Err(failure)) => Err(failure),
        }
    }
}

impl fmt::Debug for HostEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.0.state.load(Ordering::Acquire) {
            DONE => "done",
            FAILED => "failed",
            _ => "pending",
        };
        f.debug_tuple("HostEvent").field(&state).finish()
    }
}

/// Reuses events: an event whose only remaining handle is the pool's can be reset and handed out
/// again (`Arc::get_mut` proves nobody else can still see it). Events come back roughly in issue
/// order, so a short scan from a moving cursor finds one; if none is free the pool grows, and keeps
/// what it grew.
pub(crate) struct HostEventPool {
    ring: Vec<Arc<EventState>>,
    cursor: usize,
}

/// How many events to look at before growing the pool.
const SCAN: usize = 8;

impl HostEventPool {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        HostEventPool {
            ring: (0..capacity).map(|_| Arc::new(EventState::new())).collect(),
            cursor: 0,
        }
    }

    pub(crate) fn acquire(&mut self) -> HostEvent {
        let len = self.ring.len();
        for _ in 0..SCAN.min(len) {
            let at = self.cursor;
            self.cursor = (self.cursor + 1) % len;
            if let Some(state) = Arc::get_mut(&mut self.ring[at]) {
                state.reset();
                return HostEvent(self.ring[at].clone());
            }
        }
        let state = Arc::new(EventState::new());
        self.ring.push(state.clone());
        HostEvent(state)
    }

    /// Events in the pool, free or in use.
    pub(crate) fn len(&self) -> usize {
        self.ring.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_completion_wins_and_wakes_a_blocked_waiter() {
        let event = HostEvent::new();
        let waiter = {
            let event = event.clone();
            std::thread::spawn(move || event.wait(Duration::ZERO))
        };
        std::thread::sleep(Duration::from_millis(20));
        let failure = Failure::msg("boom");
        event.complete(Err(failure.clone()));
        event.complete(Ok(()));
        let seen = waiter.join().unwrap().unwrap_err();
        assert!(seen.ptr_eq(&failure));
        assert!(event.query().unwrap_err().ptr_eq(&failure));
    }

    #[test]
    fn pool_reuses_only_events_nobody_holds() {
        let mut pool = HostEventPool::with_capacity(2);
        let a = pool.acquire();
        a.complete(Ok(()));
        let b = pool.acquire();
        assert!(
            !a.ptr_eq(&b),
            "a is still held, so it must not be handed out again"
        );
        drop(a);
        let c = pool.acquire();
        assert!(!c.query().unwrap(), "a reused event starts pending");
        assert_eq!(
            pool.len(),
            2,
            "the freed event was reused, not a new one made"
        );
        let d = pool.acquire();
        assert_eq!(pool.len(), 3, "every event is held: the pool grows");
        drop((b, c, d));
    }
}
