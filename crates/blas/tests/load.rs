//! Without cuBLAS (or with a library that is not cuBLAS), loading is a typed error that says
//! what was tried; never a panic.

use std::path::Path;

use cuhal_blas::{BlasError, Cublas, CublasLibrary, LIBRARY_ENV, cublas_name};

#[test]
fn a_missing_library_is_a_typed_error_naming_the_path() {
    let err = CublasLibrary::load(Some(Path::new("/nonexistent/libcublas.so.13"))).unwrap_err();
    match &err {
        BlasError::LibraryNotFound { tried } => {
            assert_eq!(tried.len(), 1);
            assert_eq!(tried[0].path, "/nonexistent/libcublas.so.13");
            assert!(!tried[0].reason.is_empty());
        }
        other => panic!("unexpected {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("/nonexistent/libcublas.so.13"), "{text}");
    assert!(text.contains(LIBRARY_ENV), "{text}");
    // The handle's constructor reports the same, before any call.
    let err = Cublas::load_from(Some(Path::new("/nonexistent/libcublas.so.13")))
        .err()
        .expect("no cuBLAS at that path");
    assert!(matches!(err, BlasError::LibraryNotFound { .. }), "{err:?}");
}

/// A library that opens but is not cuBLAS (libm, part of glibc) lacks the first entry point.
#[test]
fn a_library_without_cublas_symbols_is_a_missing_symbol_error() {
    let err = CublasLibrary::load(Some(Path::new("libm.so.6"))).unwrap_err();
    assert_eq!(
        err,
        BlasError::MissingSymbol {
            symbol: cublas_name!(cublasCreate_v2),
            library: "libm.so.6".into(),
        }
    );
    assert!(
        err.to_string().contains(cublas_name!(cublasCreate_v2)),
        "{err}"
    );
}

#[test]
fn a_failed_call_names_the_function_and_the_status() {
    let err = BlasError::Call {
        call: cublas_name!(cublasSgemm_v2),
        status: 7,
    };
    let text = err.to_string();
    assert!(
        text.contains(cublas_name!(cublasSgemm_v2)) && text.contains("CUBLAS_STATUS_INVALID_VALUE"),
        "{text}"
    );
}
