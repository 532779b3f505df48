//! [`Error`]: what semaphore operations return when they do not succeed.

use std::fmt;

use crate::failure::Failure;

/// The error of every fallible semaphore operation.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// The semaphore (or, for a multi-wait, one of the semaphores) has failed with this failure.
    Failed(Failure),
    /// `signal(requested)` with `requested <= current`: timeline values only increase. Nothing changed.
    NotMonotonic {
        /// The semaphore's value when the signal was attempted.
        current: u64,
        /// The value the caller asked for.
        requested: u64,
    },
    /// The wait's timeout or deadline passed before the values were reached.
    Timeout,
    /// `wait_any` over an empty list: no entry could ever be satisfied, so it returns at once.
    EmptyWaitList,
}

impl Error {
    /// The failure, if this is [`Error::Failed`].
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            Error::Failed(failure) => Some(failure),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Failed(failure) => write!(f, "semaphore failed: {failure}"),
            Error::NotMonotonic { current, requested } => write!(
                f,
                "semaphore signal to {requested} is not above its current value {current}"
            ),
            Error::Timeout => f.write_str("semaphore wait timed out"),
            Error::EmptyWaitList => f.write_str("wait-any over an empty semaphore list"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Failed(failure) => Some(failure),
            _ => None,
        }
    }
}

impl From<Failure> for Error {
    fn from(failure: Failure) -> Self {
        Error::Failed(failure)
    }
}
