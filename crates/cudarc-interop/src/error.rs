//! The crate's one error type.

use std::fmt;

/// Why a crossing between cudarc and cuhal was refused or failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// cuhal refused the operation or the driver failed it (the cuhal error names the call).
    Cuhal(cuhal::Error),
    /// A cudarc object of another context than the cuhal device's primary context: cuhal
    /// devices use the primary context, as cudarc's `CudaContext::new` does.
    OtherContext {
        /// What was handed over ("stream", "slice").
        what: &'static str,
        /// The cudarc object's device ordinal.
        ordinal: usize,
        /// The cuhal device's ordinal.
        device: i32,
    },
    /// A slice of zero bytes: there is no memory to lend.
    Empty,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Cuhal(e) => write!(f, "{e}"),
            Error::OtherContext {
                what,
                ordinal,
                device,
            } => write!(
                f,
                "the cudarc {what} (device {ordinal}) is not of the primary context of cuhal \
                 device {device}"
            ),
            Error::Empty => write!(f, "a cudarc slice of zero bytes cannot be lent to cuhal"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Cuhal(e) => Some(e),
            _ => None,
        }
    }
}

impl From<cuhal::Error> for Error {
    fn from(e: cuhal::Error) -> Self {
        Error::Cuhal(e)
    }
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
