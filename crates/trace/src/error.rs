//! The one error type of `cuhal-trace`.

use std::fmt;

/// Errors from creating a tracing context, recording a zone or talking to a sink.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A driver call failed (the call and the driver's words for it are inside).
    Driver(cuhal_sys::Error),
    /// A sink could not be set up (for example Tracy's limit of 255 GPU contexts per process).
    Sink {
        /// Which sink.
        sink: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// CUPTI was asked for explicitly and cannot be had (missing, or taken by another profiler).
    Cupti(crate::cupti::CuptiError),
    /// The host <-> `%globaltimer` clock exchange could not be had (no answer in time, the
    /// kernel gone, stamps missing, or a backend without one); the context falls back to its
    /// host-bracket calibration and counts it.
    ClockSync {
        /// What went wrong.
        reason: &'static str,
    },
    /// Zone stamps could not be had: a backend without device memory for them, or no room
    /// left for a command buffer's stamps.
    Stamps {
        /// What went wrong.
        reason: &'static str,
    },
    /// Writing a trace file failed.
    Io {
        /// What was being written.
        what: &'static str,
        /// The underlying error.
        source: std::io::Error,
    },
}

impl Error {
    /// The CUDA status code, when a driver call failed.
    pub fn result(&self) -> Option<cuhal_sys::CUresult> {
        match self {
            Error::Driver(e) => e.result(),
            _ => None,
        }
    }
}

impl From<cuhal_sys::Error> for Error {
    fn from(e: cuhal_sys::Error) -> Self {
        Error::Driver(e)
    }
}

impl From<crate::cupti::CuptiError> for Error {
    fn from(e: crate::cupti::CuptiError) -> Self {
        Error::Cupti(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Driver(e) => write!(f, "tracing: {e}"),
            Error::Sink { sink, reason } => write!(f, "tracing: {sink} sink: {reason}"),
            Error::Io { what, source } => write!(f, "tracing: writing {what}: {source}"),
            Error::Cupti(e) => write!(f, "tracing: {e}"),
            Error::ClockSync { reason } => write!(f, "tracing: clock exchange: {reason}"),
            Error::Stamps { reason } => write!(f, "tracing: zone stamps: {reason}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Driver(e) => Some(e),
            Error::Io { source, .. } => Some(source),
            Error::Cupti(e) => Some(e),
            Error::Sink { .. } | Error::ClockSync { .. } | Error::Stamps { .. } => None,
        }
    }
}
