//! Loading libcublas at run time: an explicit path, then the environment variable, then the
//! usual places; never linked.

use std::path::Path;

use cuhal_sys::library::{candidates, open_first};
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
        let candidates = candidates(explicit, std::env::var_os(LIBRARY_ENV), DEFAULT_LIBRARIES);
        // SAFETY: opening cuBLAS runs its initializers, which only set up its own state; a
        // library of another name at a path the user gave is the user's choice.
        match unsafe { open_first(candidates) } {
            // Never closed (see the type's documentation).
            Ok((library, path)) => Self::resolve(library, path),
            Err(tried) => Err(BlasError::LibraryNotFound { tried }),
        }
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
