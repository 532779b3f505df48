//! Calling cuBLAS: each call is written once, with its name, and checked, as the driver's are
//! (`cuhal_sys::cu!`).

use crate::error::BlasError;
use crate::ffi::{CUBLAS_STATUS_SUCCESS, CublasApi, cublasStatus_t};

impl CublasApi {
    /// `Ok(())` for `CUBLAS_STATUS_SUCCESS`, else a [`BlasError::Call`] naming `call` and the
    /// status. What [`cublas!`](crate::cublas!) checks with.
    pub fn check(&self, call: &'static str, status: cublasStatus_t) -> Result<(), BlasError> {
        if status == CUBLAS_STATUS_SUCCESS {
            Ok(())
        } else {
            Err(BlasError::Call { call, status })
        }
    }
}

/// Calls a function of a [`CublasApi`](crate::CublasApi) table and checks its status, naming
/// the function once: cuBLAS's counterpart of `cuhal_sys::cu!`.
///
/// `cublas!(api, cublasX(args...))` calls the table's entry `cublasX` with `args` and returns
/// `Result<(), BlasError>`, whose error's `call` is `"cublasX"`. A name the table lacks does not
/// compile. `api` is any expression that dereferences to a `CublasApi`, evaluated once. The call
/// is `unsafe`, so the macro is used inside an `unsafe` block with a `// SAFETY:` comment:
///
/// ```no_run
/// # fn f(api: &cuhal_blas::CublasApi, handle: cuhal_blas::cublasHandle_t) -> Result<(), cuhal_blas::BlasError> {
/// // SAFETY: a live handle, destroyed once.
/// unsafe { cuhal_blas::cublas!(api, cublasDestroy_v2(handle)) }
/// # }
/// ```
#[macro_export]
macro_rules! cublas {
    ($api:expr, $name:ident ( $($arg:expr),* $(,)? )) => {{
        let api: &$crate::CublasApi = &$api;
        api.check(::core::stringify!($name), (api.$name)($($arg),*))
    }};
}

/// The name of a function of the [`CublasApi`](crate::CublasApi) table, as a `&'static str`,
/// checked at compile time: `cublas_name!(cublasSgemm_v2)` is `"cublasSgemm_v2"`. For code that
/// speaks of a call without making it (tests, messages).
///
/// ```
/// assert_eq!(cuhal_blas::cublas_name!(cublasSgemm_v2), "cublasSgemm_v2");
/// ```
///
/// ```compile_fail
/// let _ = cuhal_blas::cublas_name!(cublasDgemm_v2);
/// ```
#[macro_export]
macro_rules! cublas_name {
    ($name:ident) => {{
        // Never called: it only makes the compiler check that the table has the entry.
        let _ = |api: &$crate::CublasApi| {
            let _ = &api.$name;
        };
        ::core::stringify!($name)
    }};
}
