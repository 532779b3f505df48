//! [`Error`]: what queue operations return, and the failures the scheduler itself creates.

use std::fmt;
use std::sync::Arc;

use cuhal_semaphore::Failure;

use crate::backend::ThreadRole;

/// The error of every fallible queue operation, and the error inside the [`Failure`]s the
/// scheduler creates itself (find it with `failure.downcast_ref::<Error>()`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// The queue is lost: its backend failed to issue or complete an action. Every later submit
    /// returns this, with the same failure, and every action that was not yet issued failed with it.
    Lost {
        /// The queue's label.
        queue: Arc<str>,
        /// The backend error that lost the queue.
        failure: Failure,
    },
    /// The queue was dropped while the action still waited for a semaphore: the action failed
    /// with this instead of waiting forever.
    ShutDown {
        /// The queue's label.
        queue: Arc<str>,
    },
    /// A queue thread could not bind itself to the device ([`Backend::bind_thread`](crate::Backend::bind_thread)).
    Bind {
        /// The queue's label.
        queue: Arc<str>,
        /// Which thread.
        role: ThreadRole,
        /// The backend's error.
        failure: Failure,
    },
    /// A queue thread could not be started.
    Spawn {
        /// The queue's label.
        queue: Arc<str>,
        /// Which thread.
        role: ThreadRole,
        /// The operating system's error.
        error: Arc<std::io::Error>,
    },
    /// A submission from inside this queue's own issue (a backend callback, such as a deferred
    /// replay's stream work, that calls back into the queue): it would wait for the issue lock
    /// its own thread holds. Nothing was queued, and the queue keeps working.
    Reentrant {
        /// The queue's label.
        queue: Arc<str>,
    },
    /// A submission would signal a semaphore to a value it has already reached: timeline
    /// values only rise, so the signal could never take effect. Nothing was queued.
    SignalNotAbove {
        /// The queue's label.
        queue: Arc<str>,
        /// The value the submission would signal.
        value: u64,
        /// The semaphore's value when it was submitted.
        current: u64,
    },
}

impl Error {
    /// The backend failure behind a `Lost` or `Bind` error.
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            Error::Lost { failure, .. } | Error::Bind { failure, .. } => Some(failure),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Lost { queue, failure } => write!(f, "queue `{queue}` is lost: {failure}"),
            Error::ShutDown { queue } => write!(
                f,
                "queue `{queue}` shut down before the action's waits were satisfied"
            ),
            Error::Bind {
                queue,
                role,
                failure,
            } => write!(
                f,
                "queue `{queue}`: the {role:?} thread could not bind to the device: {failure}"
            ),
            Error::Spawn { queue, role, error } => {
                write!(
                    f,
                    "queue `{queue}`: cannot start the {role:?} thread: {error}"
                )
            }
            Error::SignalNotAbove {
                queue,
                value,
                current,
            } => write!(
                f,
                "a submission to queue `{queue}` would signal a semaphore to {value}, which it \
                 has already reached (it is at {current}): timeline values only rise"
            ),
            Error::Reentrant { queue } => write!(
                f,
                "a submission to queue `{queue}` from inside its own issue (stream work or another \
                 callback of the queue's backend) is refused: it would wait for itself"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Lost { failure, .. } | Error::Bind { failure, .. } => Some(failure),
            Error::Spawn { error, .. } => Some(&**error),
            Error::ShutDown { .. } | Error::Reentrant { .. } | Error::SignalNotAbove { .. } => None,
        }
    }
}
