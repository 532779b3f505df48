//! `Driver::load` without a usable driver library: a typed error that names what was tried,
//! never a panic. Its own test binary, because it sets `CUHAL_CUDA_LIBRARY` for the process.

use cuhal::{Driver, Error};

#[test]
fn a_missing_driver_library_is_a_typed_error() {
    let dir = std::env::temp_dir().join(format!("cuhal-no-driver-{}", std::process::id()));
    let missing = dir.join("libcuda-that-does-not-exist.so.1");
    // SAFETY: this binary's only test; no other thread reads the environment concurrently.
    unsafe { std::env::set_var(cuhal_sys::LIBRARY_ENV, &missing) };
    let result = std::panic::catch_unwind(Driver::load);
    let error = match result {
        Ok(Ok(_)) => panic!(
            "{} does not exist, yet the driver loaded",
            missing.display()
        ),
        Ok(Err(error)) => error,
        Err(_) => panic!("Driver::load panicked"),
    };
    let tried = match &error {
        Error::Driver(cuhal_sys::Error::LibraryNotFound { tried }) => tried,
        other => panic!("expected LibraryNotFound, got {other:?}"),
    };
    let path = missing.to_string_lossy();
    assert!(
        tried.iter().any(|attempt| attempt.path == path),
        "the attempts {tried:?} do not name {path}"
    );
    assert!(tried.iter().all(|attempt| !attempt.reason.is_empty()));
    let text = error.to_string();
    assert!(text.contains(&*path), "{text}");
    // Not a CUDA call's failure (no status code), and not a lost device.
    assert!(error.failure().is_none());
    let root = error.cuda().expect("the loader's error is the root");
    assert!(root.result().is_none() && !root.is_sticky());
    assert!(std::error::Error::source(&error).is_some());
}
