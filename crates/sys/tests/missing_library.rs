//! Loading without a usable driver library: a typed error listing what was tried, no panic.
//! (Loads against a real `cuGetProcAddress` live in the cuhal-fake-driver package's tests.)

use std::path::PathBuf;

use cuhal_sys::{DEFAULT_LIBRARIES, DriverApi, Error, LIBRARY_ENV, LoadAttempt};

fn tried(err: Error) -> Vec<LoadAttempt> {
    match err {
        Error::LibraryNotFound { tried } => tried,
        other => panic!("expected LibraryNotFound, got {other:?}"),
    }
}

#[test]
fn a_missing_file_is_reported_with_its_path_and_the_fix() {
    let path = PathBuf::from("/nonexistent/cuhal-test/libcuda.so.1");
    let err = DriverApi::load_from(&path).unwrap_err();
    let text = err.to_string();
    let tried = tried(err);
    assert_eq!(tried.len(), 1);
    assert_eq!(tried[0].path, path.display().to_string());
    assert!(!tried[0].reason.is_empty());
    assert!(
        text.contains("/nonexistent/cuhal-test/libcuda.so.1"),
        "{text}"
    );
    assert!(
        text.contains(LIBRARY_ENV),
        "the message says how to point at a driver: {text}"
    );
}

#[test]
fn a_file_that_is_not_a_library_is_reported_not_loaded() {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("not-a-library.so");
    std::fs::write(&path, b"this is not an ELF file").unwrap();
    let tried = tried(DriverApi::load_from(&path).unwrap_err());
    assert_eq!(tried.len(), 1);
    assert_eq!(tried[0].path, path.display().to_string());
    // The dynamic loader's own words, so a user sees why the file was refused.
    assert!(!tried[0].reason.is_empty());
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn a_library_that_is_not_a_cuda_driver_lacks_get_proc_address() {
    // libc is loadable everywhere glibc is, and has no cuGetProcAddress.
    let err = DriverApi::load_from("libc.so.6").unwrap_err();
    assert_eq!(
        err,
        Error::MissingSymbol {
            symbol: "cuGetProcAddress",
            library: "libc.so.6".into(),
            driver_version: None,
        }
    );
    assert!(err.to_string().contains("cuGetProcAddress"));
}

#[test]
fn without_a_driver_every_default_name_is_tried_in_order() {
    if std::env::var_os(LIBRARY_ENV).is_some() {
        // The variable replaces the defaults; its own test is in cuhal-fake-driver.
        return;
    }
    match DriverApi::load() {
        // A machine with a driver: the defaults are not all tried, nothing to check here.
        Ok(_) => {}
        Err(Error::LibraryNotFound { tried }) => {
            let paths: Vec<&str> = tried.iter().map(|t| t.path.as_str()).collect();
            assert_eq!(paths, DEFAULT_LIBRARIES);
            assert!(tried.iter().all(|t| !t.reason.is_empty()));
        }
        // A driver was found but failed (no device, say): a typed error, not a panic.
        Err(other) => assert!(!other.to_string().is_empty()),
    }
}
