//! Loading libcupti at run time: an explicit path, then the environment variable, then the
//! loader's search path; never linked.

use std::path::Path;

use cuhal_sys::library::{candidates, open_first};
use libloading::Library;

use super::error::CuptiError;
use super::ffi::CuptiApi;

/// The environment variable that names the CUPTI library to load.
pub const LIBRARY_ENV: &str = "CUHAL_CUPTI_LIBRARY";

/// Names tried, in order, when neither an explicit path nor [`LIBRARY_ENV`] is given: the
/// loader's search path first, then the toolkit's usual places (CUPTI ships with the toolkit,
/// whose library folder is often not on the loader's path).
pub const DEFAULT_LIBRARIES: &[&str] = &[
    "libcupti.so.13",
    "libcupti.so",
    "/usr/local/cuda/lib64/libcupti.so.13",
    "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
];

/// An opened CUPTI library and its entry points.
///
/// The library is never unloaded, not even when this is dropped: once CUPTI has run, it leaves
/// code of its own behind that outlives any subscription (thread-local destructors run when
/// each thread that made a CUDA call exits, its activity worker thread, the hooks it installed
/// in the driver). Closing the library unmapped that code, and the next thread to exit jumped
/// into unmapped memory.
pub struct CuptiLibrary {
    api: CuptiApi,
    path: String,
    // Leaked on purpose (see above); every pointer in `api` points into it.
    _library: &'static Library,
}

impl std::fmt::Debug for CuptiLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CuptiLibrary")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl CuptiLibrary {
    /// Opens CUPTI: `explicit` if given, else [`LIBRARY_ENV`] if set, else [`DEFAULT_LIBRARIES`].
    pub fn load(explicit: Option<&Path>) -> Result<Self, CuptiError> {
        let candidates = candidates(explicit, std::env::var_os(LIBRARY_ENV), DEFAULT_LIBRARIES);
        // SAFETY: opening CUPTI runs its initializers, which only set up its own state; a
        // library of another name at a path the user gave is the user's choice.
        match unsafe { open_first(candidates) } {
            // Never closed (see the type's documentation).
            Ok((library, path)) => Self::resolve(library, path),
            Err(tried) => Err(CuptiError::LibraryNotFound { tried }),
        }
    }

    fn resolve(library: &'static Library, path: String) -> Result<Self, CuptiError> {
        macro_rules! symbol {
            ($name:ident) => {{
                // SAFETY: the symbol is given the type of the CuptiApi field it fills, which is
                // its C declaration in the CUPTI headers; `library` is never unloaded, so the
                // pointer stays valid.
                match unsafe { library.get(concat!(stringify!($name), "\0").as_bytes()) } {
                    Ok(symbol) => *symbol,
                    Err(_) => {
                        return Err(CuptiError::MissingSymbol {
                            symbol: stringify!($name),
                            library: path,
                        });
                    }
                }
            }};
        }
        let api = CuptiApi {
            cuptiSubscribe: symbol!(cuptiSubscribe),
            cuptiUnsubscribe: symbol!(cuptiUnsubscribe),
            cuptiEnableCallback: symbol!(cuptiEnableCallback),
            cuptiActivityRegisterCallbacks: symbol!(cuptiActivityRegisterCallbacks),
            cuptiActivityEnable: symbol!(cuptiActivityEnable),
            cuptiActivityDisable: symbol!(cuptiActivityDisable),
            cuptiActivityFlushAll: symbol!(cuptiActivityFlushAll),
            cuptiActivityGetNextRecord: symbol!(cuptiActivityGetNextRecord),
            cuptiActivityGetNumDroppedRecords: symbol!(cuptiActivityGetNumDroppedRecords),
            cuptiGetTimestamp: symbol!(cuptiGetTimestamp),
            cuptiGetGraphNodeId: symbol!(cuptiGetGraphNodeId),
            cuptiGetResultString: symbol!(cuptiGetResultString),
        };
        Ok(Self {
            api,
            path,
            _library: library,
        })
    }

    /// The entry points.
    pub fn api(&self) -> &CuptiApi {
        &self.api
    }

    /// The path the library was opened from.
    pub fn path(&self) -> &str {
        &self.path
    }
}
