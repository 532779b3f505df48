//! Loading libcupti at run time: an explicit path, then the environment variable, then the
//! loader's search path; never linked.

use std::path::{Path, PathBuf};

use cuhal_sys::LoadAttempt;
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

/// The candidates to try, in order: `explicit`, else the environment variable `env`, else
/// [`DEFAULT_LIBRARIES`]. An explicit path or variable is the only candidate: a user who names a
/// library wants that one or an error, not a silent substitute.
pub fn candidates(explicit: Option<&Path>, env: Option<std::ffi::OsString>) -> Vec<PathBuf> {
    if let Some(path) = explicit {
        return vec![path.to_path_buf()];
    }
    if let Some(value) = env.filter(|v| !v.is_empty()) {
        return vec![PathBuf::from(value)];
    }
    DEFAULT_LIBRARIES.iter().map(PathBuf::from).collect()
}

impl CuptiLibrary {
    /// Opens CUPTI: `explicit` if given, else [`LIBRARY_ENV`] if set, else [`DEFAULT_LIBRARIES`].
    pub fn load(explicit: Option<&Path>) -> Result<Self, CuptiError> {
        let mut tried = Vec::new();
        for candidate in candidates(explicit, std::env::var_os(LIBRARY_ENV)) {
            // SAFETY: opening libcupti runs its initializers, which only set up CUPTI's own
            // state; a library of another name at this path is the caller's choice.
            match unsafe { Library::new(&candidate) } {
                Ok(library) => {
                    // Never closed (see the type's documentation): a handle per successful
                    // open, of which a process makes one per tracing session at most.
                    let library: &'static Library = Box::leak(Box::new(library));
                    return Self::resolve(library, candidate.display().to_string());
                }
                Err(e) => tried.push(LoadAttempt {
                    path: candidate.display().to_string(),
                    reason: e.to_string(),
                }),
            }
        }
        Err(CuptiError::LibraryNotFound { tried })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_path_wins_over_the_environment_and_the_defaults() {
        let c = candidates(
            Some(Path::new("/opt/x/libcupti.so")),
            Some("/env/lib.so".into()),
        );
        assert_eq!(c, vec![PathBuf::from("/opt/x/libcupti.so")]);
        let c = candidates(None, Some("/env/lib.so".into()));
        assert_eq!(c, vec![PathBuf::from("/env/lib.so")]);
        let c = candidates(None, Some("".into()));
        assert_eq!(c.len(), DEFAULT_LIBRARIES.len());
        assert_eq!(c[0], PathBuf::from("libcupti.so.13"));
    }

    #[test]
    fn a_missing_library_is_a_typed_error_naming_the_path() {
        let err = CuptiLibrary::load(Some(Path::new("/nonexistent/libcupti.so.13"))).unwrap_err();
        match &err {
            CuptiError::LibraryNotFound { tried } => {
                assert_eq!(tried.len(), 1);
                assert_eq!(tried[0].path, "/nonexistent/libcupti.so.13");
                assert!(!tried[0].reason.is_empty());
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.to_string().contains(LIBRARY_ENV), "{err}");
        assert_eq!(err.reason(), "library not found");
    }

    /// Whether a library whose path contains `name` is mapped into this process.
    fn mapped(name: &str) -> bool {
        std::fs::read_to_string("/proc/self/maps")
            .expect("/proc/self/maps")
            .lines()
            .any(|line| line.contains(name))
    }

    /// An opened library stays mapped after its `CuptiLibrary` is gone, and after a failed
    /// resolve: CUPTI leaves thread-exit destructors and hooks behind that point into it.
    /// libthread_db (part of glibc) stands in for CUPTI: no test process maps it otherwise.
    #[test]
    fn an_opened_library_is_never_unloaded() {
        assert!(
            !mapped("libthread_db"),
            "libthread_db mapped before the test"
        );
        let err = CuptiLibrary::load(Some(Path::new("libthread_db.so.1"))).unwrap_err();
        assert!(
            matches!(
                err,
                CuptiError::MissingSymbol {
                    symbol: "cuptiSubscribe",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            mapped("libthread_db"),
            "the library was unloaded on the error path"
        );
        // A thread that exits after the library was given up must not find it unmapped.
        std::thread::spawn(|| ()).join().unwrap();
        assert!(mapped("libthread_db"));
    }

    #[test]
    fn a_library_without_cupti_symbols_is_a_typed_error_naming_the_symbol() {
        // libc opens everywhere these tests run and has none of CUPTI's entry points.
        let err = CuptiLibrary::load(Some(Path::new("libc.so.6"))).unwrap_err();
        assert_eq!(
            err,
            CuptiError::MissingSymbol {
                symbol: "cuptiSubscribe",
                library: "libc.so.6".to_owned()
            }
        );
    }
}
