//! [`SemaphoreOptions`]: per-semaphore tuning of host waits.

use std::time::Duration;

/// Tuning of host waits on a semaphore.
///
/// A host wait for a value whose device-signal event is already recorded queries that event in a
/// spin for at most [`event_spin`](SemaphoreOptions::event_spin) before it parks; when it sees the
/// event complete it advances the semaphore itself, sparing the round trip through the completion
/// thread (a parked thread takes microseconds to wake; a spinning one sees completion at once).
///
/// While work is being submitted to the device of the event it queries (the event's
/// [`submissions`](crate::DeviceEvent::submissions) count moves by two or more within
/// [`busy_query_pace`](SemaphoreOptions::busy_query_pace)), a wait queries only once per that
/// pace and watches the semaphore (no driver call) in between: each query takes the lock those
/// submissions need. It then sees completion up to the pace late; with nobody submitting it
/// queries back to back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SemaphoreOptions {
    event_spin: Option<Duration>,
    busy_query_pace: Duration,
}

impl SemaphoreOptions {
    /// The default spin budget of a host wait on a recorded device event.
    pub const DEFAULT_EVENT_SPIN: Duration = Duration::from_micros(50);

    /// Defaults: host waits spin on a recorded device event for [`Self::DEFAULT_EVENT_SPIN`],
    /// querying it back to back whatever is submitted meanwhile.
    pub const fn new() -> Self {
        SemaphoreOptions {
            event_spin: Some(Self::DEFAULT_EVENT_SPIN),
            busy_query_pace: Duration::ZERO,
        }
    }

    /// Host waits query a recorded device event for at most `budget` (per wait call) before they
    /// park; parked, they wake to query it again, 50 us after parking and then twice as long each
    /// time, up to every 1 ms. `Duration::ZERO` still queries each event once, which costs about
    /// as much as a `cuEventQuery`.
    pub const fn with_event_spin(mut self, budget: Duration) -> Self {
        self.event_spin = Some(budget);
        self
    }

    /// Host waits never query device events: they only park until the value is signalled (or
    /// advanced, or failed), and never wake to look at an event.
    pub const fn without_event_queries(mut self) -> Self {
        self.event_spin = None;
        self
    }

    /// The spin budget, or `None` when host waits never query device events.
    pub const fn event_spin(&self) -> Option<Duration> {
        self.event_spin
    }

    /// While work is being submitted to an awaited event's device, host waits query it at most
    /// once per `pace` (see the type's documentation). `Duration::ZERO`, the default here, always
    /// queries back to back; a device sets its own (`DeviceOptions::busy_query_pace` in the
    /// device crate).
    pub const fn with_busy_query_pace(mut self, pace: Duration) -> Self {
        self.busy_query_pace = pace;
        self
    }

    /// The pace of queries while the device is being submitted to (zero: no pacing).
    pub const fn busy_query_pace(&self) -> Duration {
        self.busy_query_pace
    }
}

impl Default for SemaphoreOptions {
    fn default() -> Self {
        Self::new()
    }
}
