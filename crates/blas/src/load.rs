//! Loading libcublas at run time: an explicit path, then the environment variable, then the
//! usual places; never linked.

use std::path::{Path, PathBuf};

use cuhal_sys::LoadAttempt;
use libloading::Library;

use crate::error::BlasError;
use crate::ffi::CublasApi;

/// The environment variable that names the cuBLAS library to load.
pub const LIBRARY_ENV: &str = "CUHAL_CUBLAS_LIBRARY";

/// Names tried, in order, when neither an explicit path nor [`LIBRARY_ENV`] is given: the
/// toolkit's usual place first (often not on the loader's search path), then the loader's path.
pub const DEFAULT_LIBRARIES: &[&str] = &[
    "/usr/local/cuda/lib64/libcublas.so.13",
    "libcublas.so.13",
    "libcublas.so",
];

/// The candidates to try, in order: `explicit`, else the environment variable's value `env`,
/// else [`DEFAULT_LIBRARIES`]. An explicit path or variable is the only candidate: a user who
/// names a library wants that one or an error, not a silent substitute.
pub fn candidates(explicit: Option<&Path>, env: Option<std::ffi::OsString>) -> Vec<PathBuf> {
    if let Some(path) = explicit {
        return vec![path.to_path_buf()];
    }
    if let Some(value) = env.filter(|v| !v.is_empty()) {
        return vec![PathBuf::from(value)];
    }
    DEFAULT_LIBRARIES.iter().map(PathBuf::from).collect()
}

/// An opened cuBLAS library and its entry points.
///
/// The library is never unloaded: cuBLAS runs CUDA runtime code of its own, which registers
/// exit-time and thread-exit cleanup that points into the library; unmapping it before the
/// process ends would leave those pointing at nothing. A process opens it a handful of times
/// at most (each open of the same file shares one mapping).
pub struct CublasLibrary {
    api: CublasApi,
    path: String,
}

impl std::fmt::Debug for CublasLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CublasLibrary")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl CublasLibrary {
    /// Opens cuBLAS: `explicit` if given, else [`LIBRARY_ENV`] if set, else
    /// [`DEFAULT_LIBRARIES`]; resolves every entry point of [`CublasApi`].
    pub fn load(explicit: Option<&Path>) -> Result<Self, BlasError> {
        let mut tried = Vec::new();
        for candidate in candidates(explicit, std::env::var_os(LIBRARY_ENV)) {
            // SAFETY: opening libcublas runs its initializers, which only set up cuBLAS's own
            // state; a library of another name at this path is the caller's choice.
            match unsafe { Library::new(&candidate) } {
                Ok(library) => {
                    // Never closed (see the type's documentation).
                    let library: &'static Library = Box::leak(Box::new(library));
                    return Self::resolve(library, candidate.display().to_string());
                }
                Err(e) => tried.push(LoadAttempt {
                    path: candidate.display().to_string(),
                    reason: e.to_string(),
                }),
            }
        }
        Err(BlasError::LibraryNotFound { tried })
    }

    fn resolve(library: &'static Library, path: String) -> Result<Self, BlasError> {
        macro_rules! symbol {
            ($name:ident) => {{
                // SAFETY: the symbol is given the type of the CublasApi field it fills, which is
                // its C declaration in cublas_api.h; `library` is never unloaded, so the
                // pointer stays valid.
                match unsafe { library.get(concat!(stringify!($name), "\0").as_bytes()) } {
                    Ok(symbol) => *symbol,
                    Err(_) => {
                        return Err(BlasError::MissingSymbol {
                            symbol: stringify!($name),
                            library: path,
                        });
                    }
                }
            }};
        }
        let api = CublasApi {
            cublasCreate_v2: symbol!(cublasCreate_v2),
            cublasDestroy_v2: symbol!(cublasDestroy_v2),
            cublasSetStream_v2: symbol!(cublasSetStream_v2),
            cublasSetWorkspace_v2: symbol!(cublasSetWorkspace_v2),
            cublasSgemm_v2: symbol!(cublasSgemm_v2),
        };
        Ok(Self { api, path })
    }

    /// The entry points.
    pub fn api(&self) -> &CublasApi {
        &self.api
    }

    /// The path the library was opened from.
    pub fn path(&self) -> &str {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_path_wins_over_the_environment_and_the_defaults() {
        let c = candidates(
            Some(Path::new("/opt/x/libcublas.so")),
            Some("/env/lib.so".into()),
        );
        assert_eq!(c, vec![PathBuf::from("/opt/x/libcublas.so")]);
        let c = candidates(None, Some("/env/lib.so".into()));
        assert_eq!(c, vec![PathBuf::from("/env/lib.so")]);
        let c = candidates(None, Some("".into()));
        assert_eq!(c.len(), DEFAULT_LIBRARIES.len());
        assert_eq!(c[0], PathBuf::from(DEFAULT_LIBRARIES[0]));
        assert_eq!(candidates(None, None), c);
    }
}
