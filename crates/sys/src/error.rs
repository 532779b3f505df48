//! The one error type of `cuhal-sys`: what failed, with the driver's own words for it.

use std::fmt;

use crate::CUresult;

pub use crate::library::LoadAttempt;

/// Errors from loading the driver or from a driver call.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// No driver library could be opened.
    LibraryNotFound {
        /// Every path tried, in order, with the loader's reason.
        tried: Vec<LoadAttempt>,
    },
    /// The library opened but lacks a symbol this table requires.
    MissingSymbol {
        /// The symbol's name, as passed to `cuGetProcAddress`.
        symbol: &'static str,
        /// The library that was opened.
        library: String,
        /// The driver's CUDA version (`cuDriverGetVersion`, e.g. 12040), if it could be read.
        driver_version: Option<i32>,
    },
    /// A driver call returned an error.
    Cuda {
        /// The driver function that failed.
        call: &'static str,
        /// Its status code.
        result: CUresult,
        /// The code's name from `cuGetErrorName` (or this crate's table).
        name: String,
        /// The driver's description from `cuGetErrorString`.
        description: String,
    },
    /// A module image failed to load (`cuModuleLoadDataEx`); the JIT's log says why.
    ModuleLoad {
        /// The driver's error.
        source: Box<Error>,
        /// The JIT's error log (its informational log when the error log is empty; may be
        /// empty when the driver wrote neither).
        log: String,
    },
    /// A module image or a name passed with it cannot be given to the driver at all.
    BadImage {
        /// Why.
        reason: &'static str,
    },
}

impl Error {
    /// The CUDA status code, for [`Error::Cuda`].
    pub fn result(&self) -> Option<CUresult> {
        match self {
            Error::Cuda { result, .. } => Some(*result),
            Error::ModuleLoad { source, .. } => source.result(),
            _ => None,
        }
    }

    /// Whether this error lost the context (see [`CUresult::is_sticky`]).
    pub fn is_sticky(&self) -> bool {
        self.result().is_some_and(CUresult::is_sticky)
    }
}

/// Formats a `cuDriverGetVersion` number (12040) as "12.4".
pub fn format_cuda_version(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::LibraryNotFound { tried } => {
                write!(f, "could not load the CUDA driver library (tried ")?;
                for (i, attempt) in tried.iter().enumerate() {
                    if i > 0 {
                        write!(f, "; ")?;
                    }
                    write!(f, "{}: {}", attempt.path, attempt.reason)?;
                }
                write!(
                    f,
                    "); install the NVIDIA driver or set {} to the path of libcuda.so.1",
                    crate::LIBRARY_ENV
                )
            }
            Error::MissingSymbol {
                symbol,
                library,
                driver_version,
            } => {
                write!(
                    f,
                    "the CUDA driver library {library} lacks the required symbol {symbol}"
                )?;
                match driver_version {
                    Some(v) => write!(
                        f,
                        " (driver supports CUDA {}; cuhal needs CUDA {} or newer)",
                        format_cuda_version(*v),
                        format_cuda_version(crate::TABLE_CUDA_VERSION)
                    ),
                    None => write!(f, " (driver version unknown)"),
                }
            }
            Error::Cuda {
                call,
                name,
                description,
                result,
            } => write!(f, "{call} failed: {name} ({}): {description}", result.0),
            Error::ModuleLoad { source, log } => {
                write!(f, "module load failed: {source}")?;
                if !log.is_empty() {
                    write!(f, "\nJIT log:\n{log}")?;
                }
                Ok(())
            }
            Error::BadImage { reason } => write!(f, "bad module image: {reason}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::ModuleLoad { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_what_failed() {
        let e = Error::Cuda {
            call: crate::cu_name!(cuMemAlloc),
            result: CUresult::ERROR_OUT_OF_MEMORY,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            description: "out of memory".into(),
        };
        assert_eq!(
            e.to_string(),
            format!(
                "{} failed: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory",
                crate::cu_name!(cuMemAlloc)
            )
        );
        assert!(!e.is_sticky());

        let e = Error::MissingSymbol {
            symbol: crate::cu_name!(cuGraphLaunch),
            library: "libcuda.so.1".into(),
            driver_version: Some(11040),
        };
        let text = e.to_string();
        assert!(text.contains(crate::cu_name!(cuGraphLaunch)), "{text}");
        assert!(text.contains("CUDA 11.4"), "{text}");

        let e = Error::LibraryNotFound {
            tried: vec![LoadAttempt {
                path: "libcuda.so.1".into(),
                reason: "not found".into(),
            }],
        };
        let text = e.to_string();
        assert!(text.contains("libcuda.so.1: not found"), "{text}");
        assert!(text.contains("CUHAL_CUDA_LIBRARY"), "{text}");
    }

    #[test]
    fn versions_format_like_the_toolkit() {
        assert_eq!(format_cuda_version(12040), "12.4");
        assert_eq!(format_cuda_version(13000), "13.0");
        assert_eq!(format_cuda_version(11080), "11.8");
    }
}
