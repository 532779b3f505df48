//! cuBLAS for cuhal, loaded at run time like the driver (never linked, so a program that uses
//! it builds and starts on a machine without the CUDA toolkit and is told, as a typed error,
//! when cuBLAS is missing).
//!
//! - [`CublasLibrary`] opens libcublas: an explicit path, else [`LIBRARY_ENV`]
//!   (`CUHAL_CUBLAS_LIBRARY`), else [`DEFAULT_LIBRARIES`]; every entry point of [`CublasApi`] is
//!   resolved up front, so a library that lacks one is a [`BlasError::MissingSymbol`] at load,
//!   never a failure at the call.
//! - [`cublas!`] calls an entry point and checks its status, naming the function once (as
//!   `cuhal_sys::cu!` does for the driver): the error's `call` comes from the identifier, so it
//!   cannot be misspelled or drift from the function called. [`cublas_name!`] names one without
//!   calling it.
//! - [`Cublas`] is a handle on the current context's device with the caller's workspace, used
//!   from any thread (calls are serialized), set to each call's stream: the GEMMs it offers can
//!   run on a raw stream or as cuhal stream work in a command buffer (the crate's README shows
//!   one).

mod call;
mod error;
mod ffi;
mod handle;
mod load;

pub use error::BlasError;
pub use ffi::{
    CUBLAS_STATUS_SUCCESS, CublasApi, cublasHandle_t, cublasOperation_t, cublasStatus_t,
};
pub use handle::Cublas;
pub use load::{CublasLibrary, DEFAULT_LIBRARIES, LIBRARY_ENV};

/// The README's example, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
