//! Why cuBLAS could not be used.

use std::fmt;

use cuhal_sys::LoadAttempt;

use crate::ffi::cublasStatus_t;
use crate::load::LIBRARY_ENV;

/// The crate's error: cuBLAS is absent or incomplete, or one of its calls failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BlasError {
    /// No cuBLAS library could be opened.
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
    /// A cuBLAS call failed.
    Call {
        /// The function.
        call: &'static str,
        /// Its `cublasStatus_t`.
        status: cublasStatus_t,
    },
}

/// The name of a `cublasStatus_t` (`cublas_api.h`), or `"unknown status"`.
pub(crate) fn status_name(status: cublasStatus_t) -> &'static str {
    match status {
        0 => "CUBLAS_STATUS_SUCCESS",
        1 => "CUBLAS_STATUS_NOT_INITIALIZED",
        3 => "CUBLAS_STATUS_ALLOC_FAILED",
        7 => "CUBLAS_STATUS_INVALID_VALUE",
        8 => "CUBLAS_STATUS_ARCH_MISMATCH",
        11 => "CUBLAS_STATUS_MAPPING_ERROR",
        13 => "CUBLAS_STATUS_EXECUTION_FAILED",
        14 => "CUBLAS_STATUS_INTERNAL_ERROR",
        15 => "CUBLAS_STATUS_NOT_SUPPORTED",
        16 => "CUBLAS_STATUS_LICENSE_ERROR",
        _ => "unknown status",
    }
}

impl fmt::Display for BlasError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlasError::LibraryNotFound { tried } => {
                write!(f, "cuBLAS: could not load libcublas (tried ")?;
                for (i, attempt) in tried.iter().enumerate() {
                    if i > 0 {
                        write!(f, "; ")?;
                    }
                    write!(f, "{}: {}", attempt.path, attempt.reason)?;
                }
                write!(f, "); set {LIBRARY_ENV} to the path of libcublas.so")
            }
            BlasError::MissingSymbol { symbol, library } => {
                write!(f, "cuBLAS: {library} has no {symbol}")
            }
            BlasError::Call { call, status } => write!(
                f,
                "{call} failed with cublasStatus_t {status} ({})",
                status_name(*status)
            ),
        }
    }
}

impl std::error::Error for BlasError {}
