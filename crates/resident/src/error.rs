//! The crate's one error type.

use std::fmt;

use cuhal_semaphore::Failure;

use crate::refusal::Refusal;

/// Errors of the resident queue and its ring.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Error {
    /// The ring holds its capacity of submissions not yet retired (the `try_` forms only; the
    /// others wait for room).
    Full {
        /// The ring's capacity.
        capacity: usize,
    },
    /// The submission cannot run on a resident queue; nothing was published.
    Refused(Refusal),
    /// The queue is lost (a launch reported a sticky error, or the device was lost): every
    /// later call returns this failure.
    Lost(Failure),
    /// The queue is shutting down.
    Shutdown,
    /// A submission still waiting when the queue shut down: its signals fail with this.
    ShutdownBeforeReady {
        /// The submission's sequence number.
        sequence: u64,
    },
    /// A submission's wait failed and the failure itself was not known to this queue (the
    /// slot was failed by another consumer): its signals fail with this.
    WaitFailed {
        /// The submission's sequence number.
        sequence: u64,
    },
    /// Every semaphore slot is bound.
    NoFreeSlot {
        /// The table's size.
        slots: usize,
    },
    /// The consumer read a descriptor whose sequence is not the one it expected.
    TornDescriptor {
        /// The sequence the consumer expected.
        expected: u64,
        /// The sequence the descriptor holds.
        found: u64,
    },
    /// Options or shared memory the queue cannot use.
    InvalidOptions(&'static str),
    /// The consumer's thread (the CPU model's) could not be started.
    Spawn(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Full { capacity } => {
                write!(
                    f,
                    "resident queue ring full ({capacity} submissions in flight)"
                )
            }
            Error::Refused(refusal) => write!(f, "refused by a resident queue: {refusal}"),
            Error::Lost(failure) => write!(f, "resident queue lost: {failure}"),
            Error::Shutdown => f.write_str("resident queue is shutting down"),
            Error::ShutdownBeforeReady { sequence } => write!(
                f,
                "resident submission {sequence} was still waiting when its queue shut down"
            ),
            Error::WaitFailed { sequence } => {
                write!(f, "a wait of resident submission {sequence} failed")
            }
            Error::NoFreeSlot { slots } => {
                write!(
                    f,
                    "all {slots} semaphore slots of the resident queue are bound"
                )
            }
            Error::TornDescriptor { expected, found } => write!(
                f,
                "resident ring descriptor holds sequence {found}, expected {expected}"
            ),
            Error::InvalidOptions(what) => write!(f, "invalid resident queue options: {what}"),
            Error::Spawn(what) => write!(f, "resident queue consumer thread: {what}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<Refusal> for Error {
    fn from(refusal: Refusal) -> Self {
        Error::Refused(refusal)
    }
}
