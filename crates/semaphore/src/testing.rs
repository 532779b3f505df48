//! Test doubles shared with other crates: [`FlagEvent`], a [`DeviceEvent`] that is a completion
//! flag, and [`LiveCounter`], which counts live events so tests can prove nothing leaks.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::event::DeviceEvent;
use crate::failure::Failure;

/// Counts live [`FlagEvent`]s (underlying events, not clones). Clones share the count.
#[derive(Debug, Clone, Default)]
pub struct LiveCounter(Arc<AtomicUsize>);

impl LiveCounter {
    /// A counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of events created with this counter whose last clone is not yet dropped.
    pub fn live(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A [`DeviceEvent`] that is a flag: it reports completion once [`complete`](FlagEvent::complete) is
/// called, or an error once [`fail`](FlagEvent::fail) is. Clones share the flag; the underlying
/// event counts as live in its [`LiveCounter`] until its last clone drops, like a pooled device event
/// that goes back to its pool.
///
/// A CPU backend can use it as its real event type: complete it when the work it stands for is done.
#[derive(Debug, Clone)]
pub struct FlagEvent(Arc<Flag>);

#[derive(Debug)]
struct Flag {
    complete: AtomicBool,
    error: Mutex<Option<Failure>>,
    has_error: AtomicBool,
    queries: AtomicUsize,
    awaited: AtomicUsize,
    counter: Option<LiveCounter>,
    /// What [`DeviceEvent::submissions`] reports, if the event stands for one of a device that
    /// is being submitted to all the time ([`FlagEvent::on_busy_device`]).
    submissions: Option<AtomicU64>,
}

impl FlagEvent {
    /// A pending event, not counted.
    pub fn new() -> Self {
        Self::with_counter(None)
    }

    /// A pending event counted in `counter` until its last clone drops.
    pub fn counted(counter: &LiveCounter) -> Self {
        Self::with_counter(Some(counter.clone()))
    }

    /// A pending event, not counted, of a device that work is being submitted to all the time:
    /// its [`DeviceEvent::submissions`] count moves by two at every read.
    pub fn on_busy_device() -> Self {
        Self::make(None, Some(AtomicU64::new(0)))
    }

    fn with_counter(counter: Option<LiveCounter>) -> Self {
        Self::make(counter, None)
    }

    fn make(counter: Option<LiveCounter>, submissions: Option<AtomicU64>) -> Self {
        if let Some(counter) = &counter {
            counter.0.fetch_add(1, Ordering::SeqCst);
        }
        FlagEvent(Arc::new(Flag {
            complete: AtomicBool::new(false),
            error: Mutex::new(None),
            has_error: AtomicBool::new(false),
            queries: AtomicUsize::new(0),
            awaited: AtomicUsize::new(0),
            counter,
            submissions,
        }))
    }

    /// Marks the work before the event complete: later queries return `Ok(true)`.
    pub fn complete(&self) {
        self.0.complete.store(true, Ordering::Release);
    }

    /// Makes later queries return `Err(failure)` (a device error). The first error is kept.
    pub fn fail(&self, failure: Failure) {
        let mut error = self.0.error.lock().unwrap_or_else(PoisonError::into_inner);
        if error.is_none() {
            *error = Some(failure);
            self.0.has_error.store(true, Ordering::Release);
        }
    }

    /// Whether [`complete`](Self::complete) was called.
    pub fn is_complete(&self) -> bool {
        self.0.complete.load(Ordering::Acquire)
    }

    /// How many times [`DeviceEvent::query`] was called on this event (all clones).
    pub fn query_count(&self) -> usize {
        self.0.queries.load(Ordering::Relaxed)
    }

    /// How many times a host waiter parking for it called [`DeviceEvent::awaited`] (all clones).
    pub fn awaited_count(&self) -> usize {
        self.0.awaited.load(Ordering::Relaxed)
    }

    /// Number of live clones of this event, this one included.
    pub fn clone_count(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// Whether `self` and `other` are clones of the same event.
    pub fn ptr_eq(&self, other: &FlagEvent) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Default for FlagEvent {
    fn default() -> Self {
        Self::new()
    }
}

impl DeviceEvent for FlagEvent {
    fn query(&self) -> Result<bool, Failure> {
        self.0.queries.fetch_add(1, Ordering::Relaxed);
        if self.0.has_error.load(Ordering::Acquire) {
            let error = self.0.error.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(failure) = &*error {
                return Err(failure.clone());
            }
        }
        Ok(self.0.complete.load(Ordering::Acquire))
    }

    fn submissions(&self) -> u64 {
        self.0
            .submissions
            .as_ref()
            .map_or(0, |count| count.fetch_add(2, Ordering::Relaxed))
    }

    fn awaited(&self) {
        self.0.awaited.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Flag {
    fn drop(&mut self) {
        if let Some(counter) = &self.counter {
            counter.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
}
