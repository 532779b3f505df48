//! `CUHAL_CUDA_LIBRARY` redirects `DriverApi::load`. This file holds a single test, so it is a
//! process of its own and nothing else reads the environment while the test changes it.

mod common;

use common::Fake;
use cuhal_sys::{DriverApi, Error, LIBRARY_ENV, LoadAttempt};

#[test]
fn the_environment_names_the_library_to_load() {
    let fake = Fake::new("env");
    // SAFETY: this is the only test in this executable, so no other thread reads or writes
    // the environment concurrently.
    unsafe { std::env::set_var(LIBRARY_ENV, &fake.path) };
    let api = DriverApi::load().expect("loads the library the environment names");
    assert_eq!(api.library_path(), fake.path.display().to_string());
    assert!(
        fake.requested("cuInit").0 >= 1,
        "the fake was not the library resolved"
    );

    let missing = fake.path.with_file_name("no-such-libcuda.so");
    // SAFETY: as above.
    unsafe { std::env::set_var(LIBRARY_ENV, &missing) };
    match DriverApi::load().unwrap_err() {
        // Only the named library is tried: the defaults would hide a typo in the variable.
        Error::LibraryNotFound { tried } => {
            assert_eq!(tried.len(), 1, "{tried:?}");
            let LoadAttempt { path, reason } = &tried[0];
            assert_eq!(path, &missing.display().to_string());
            assert!(!reason.is_empty());
        }
        other => panic!("unexpected {other:?}"),
    }
    // SAFETY: as above.
    unsafe { std::env::remove_var(LIBRARY_ENV) };
}
