//! Finding a run-time library: the candidates to try, and the first of them that opens, never
//! unloaded. Shared by the driver's loader and those of the optional NVIDIA libraries (CUPTI in
//! cuhal-trace, cuBLAS in cuhal-blas).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use libloading::Library;

/// One place a loader looked for a library, and why it was not usable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadAttempt {
    /// The path or library name passed to the dynamic loader.
    pub path: String,
    /// The loader's reason (`dlerror`).
    pub reason: String,
}

/// The candidates to try, in order: `explicit`, else the environment variable's value `env`,
/// else `defaults`. An explicit path or variable is the only candidate: a user who names a
/// library wants that one or an error, not a silent substitute.
pub fn candidates(
    explicit: Option<&Path>,
    env: Option<OsString>,
    defaults: &[&str],
) -> Vec<PathBuf> {
    if let Some(path) = explicit {
        return vec![path.to_path_buf()];
    }
    if let Some(value) = env.filter(|v| !v.is_empty()) {
        return vec![PathBuf::from(value)];
    }
    defaults.iter().map(PathBuf::from).collect()
}

/// Opens the first of `candidates` that the dynamic loader accepts and leaks its handle, so the
/// library is never unloaded (the callers' libraries register exit-time and thread-exit work
/// that points into them); returns it with the path it was opened by, or every path tried with
/// the loader's reason.
///
/// # Safety
/// Opening a library runs its initializers: the caller vouches that those of every candidate
/// have no preconditions on the calling program.
pub unsafe fn open_first(
    candidates: impl IntoIterator<Item = PathBuf>,
) -> Result<(&'static Library, String), Vec<LoadAttempt>> {
    let mut tried = Vec::new();
    for candidate in candidates {
        // SAFETY: the caller vouches for the initializers of every candidate (see above).
        match unsafe { Library::new(&candidate) } {
            Ok(library) => {
                let library: &'static Library = Box::leak(Box::new(library));
                return Ok((library, candidate.display().to_string()));
            }
            Err(e) => tried.push(LoadAttempt {
                path: candidate.display().to_string(),
                reason: e.to_string(),
            }),
        }
    }
    Err(tried)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_path_wins_over_the_environment_and_the_defaults() {
        let defaults = ["liba.so.1", "liba.so"];
        let c = candidates(
            Some(Path::new("/x/lib.so")),
            Some("/env/lib.so".into()),
            &defaults,
        );
        assert_eq!(c, vec![PathBuf::from("/x/lib.so")]);
        let c = candidates(None, Some("/env/lib.so".into()), &defaults);
        assert_eq!(c, vec![PathBuf::from("/env/lib.so")]);
        let c = candidates(None, Some("".into()), &defaults);
        assert_eq!(
            c,
            vec![PathBuf::from("liba.so.1"), PathBuf::from("liba.so")]
        );
        assert_eq!(candidates(None, None, &defaults), c);
    }

    #[test]
    fn every_candidate_that_does_not_open_is_reported_in_order() {
        let missing = ["/nonexistent/cuhal/liba.so", "/nonexistent/cuhal/libb.so"];
        // SAFETY: neither path exists, so nothing is opened and no initializer runs.
        let Err(tried) = (unsafe { open_first(missing.iter().map(PathBuf::from)) }) else {
            panic!("a library that does not exist opened");
        };
        let paths: Vec<_> = tried.iter().map(|t| t.path.as_str()).collect();
        assert_eq!(paths, missing);
        assert!(tried.iter().all(|t| !t.reason.is_empty()));
    }
}
