//! Why CUPTI could not be used.

use std::fmt;

use cuhal_sys::LoadAttempt;

use super::ffi::{self, CUptiResult};

/// Why CUPTI activity tracing is not available. A queue that asked for FINE zones without
/// insisting on CUPTI falls back to event zones and reports this once; one that asked for CUPTI
/// explicitly gets it as an error.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CuptiError {
    /// No CUPTI library could be opened.
    LibraryNotFound {
        /// Every path tried, in order, with the loader's reason.
        tried: Vec<LoadAttempt>,
    },
    /// The library opened but lacks an entry point cuhal needs.
    MissingSymbol {
        /// The symbol.
        symbol: &'static str,
        /// The library that was opened.
        library: String,
    },
    /// Another profiler (Nsight Systems, PyTorch's profiler, a second cuhal tracer) already
    /// holds CUPTI's one subscriber (`CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED`).
    SubscriberTaken,
    /// A CUPTI call failed.
    Call {
        /// The CUPTI function.
        call: &'static str,
        /// Its status code.
        result: CUptiResult,
        /// The code's name.
        name: &'static str,
        /// CUPTI's description (`cuptiGetResultString`), when it could be read.
        description: String,
    },
}

impl CuptiError {
    /// A short reason for logs and statistics ("library not found", "subscriber taken", ...).
    pub fn reason(&self) -> &'static str {
        match self {
            CuptiError::LibraryNotFound { .. } => "library not found",
            CuptiError::MissingSymbol { .. } => "symbol missing",
            CuptiError::SubscriberTaken => "subscriber taken by another profiler",
            CuptiError::Call { .. } => "call failed",
        }
    }

    pub(crate) fn call(call: &'static str, result: CUptiResult, description: String) -> Self {
        if result == ffi::CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED {
            return CuptiError::SubscriberTaken;
        }
        CuptiError::Call {
            call,
            result,
            name: ffi::result_name(result),
            description,
        }
    }
}

impl fmt::Display for CuptiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CuptiError::LibraryNotFound { tried } => {
                write!(f, "CUPTI: could not load libcupti (tried ")?;
                for (i, attempt) in tried.iter().enumerate() {
                    if i > 0 {
                        write!(f, "; ")?;
                    }
                    write!(f, "{}: {}", attempt.path, attempt.reason)?;
                }
                write!(
                    f,
                    "); set {} to the path of libcupti.so",
                    super::load::LIBRARY_ENV
                )
            }
            CuptiError::MissingSymbol { symbol, library } => {
                write!(f, "CUPTI: {library} has no {symbol}")
            }
            CuptiError::SubscriberTaken => write!(
                f,
                "CUPTI: another profiler is already subscribed \
                 (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)"
            ),
            CuptiError::Call {
                call,
                result,
                name,
                description,
            } => write!(f, "CUPTI: {call} failed: {name} ({result}): {description}"),
        }
    }
}

impl std::error::Error for CuptiError {}
