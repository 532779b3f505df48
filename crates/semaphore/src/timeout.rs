//! [`Timeout`]: how long a host wait may block.

use std::time::{Duration, Instant};

/// How long a host wait may block before it returns [`Error::Timeout`](crate::Error::Timeout).
///
/// A `Duration` converts into [`Timeout::After`] and an `Instant` into [`Timeout::At`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timeout {
    /// Do not block: check (and query recorded device events once), then return.
    Immediate,
    /// Block for at most this long, measured from the start of the wait.
    After(Duration),
    /// Block until this instant at the latest.
    At(Instant),
    /// Block until the values are reached or a semaphore fails.
    Infinite,
}

impl Timeout {
    /// The instant the wait gives up, or `None` to wait forever. A duration too long to represent
    /// as an instant is treated as forever.
    pub(crate) fn deadline(self) -> Option<Instant> {
        match self {
            Timeout::Immediate => Some(Instant::now()),
            Timeout::After(duration) => Instant::now().checked_add(duration),
            Timeout::At(instant) => Some(instant),
            Timeout::Infinite => None,
        }
    }
}

impl From<Duration> for Timeout {
    fn from(duration: Duration) -> Self {
        Timeout::After(duration)
    }
}

impl From<Instant> for Timeout {
    fn from(instant: Instant) -> Self {
        Timeout::At(instant)
    }
}
