//! The cuBLAS entry points cuhal uses, declared as in `cublas_api.h` (CUDA 13), and their types.

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_int, c_void};

use cuhal_sys::CUstream;

/// `cublasHandle_t`: an opaque handle.
pub type cublasHandle_t = *mut c_void;
/// `cublasStatus_t`: 0 is success.
pub type cublasStatus_t = c_int;
/// `cublasOperation_t`: `CUBLAS_OP_N` (0), `CUBLAS_OP_T` (1), `CUBLAS_OP_C` (2).
pub type cublasOperation_t = c_int;

/// `CUBLAS_STATUS_SUCCESS`.
pub const CUBLAS_STATUS_SUCCESS: cublasStatus_t = 0;
/// `CUBLAS_OP_N`: no transpose.
pub const CUBLAS_OP_N: cublasOperation_t = 0;

/// `cublasSgemm_v2`'s signature.
pub type SgemmFn = unsafe extern "C" fn(
    cublasHandle_t,
    cublasOperation_t,
    cublasOperation_t,
    c_int,
    c_int,
    c_int,
    *const f32,
    *const f32,
    c_int,
    *const f32,
    c_int,
    *const f32,
    *mut f32,
    c_int,
) -> cublasStatus_t;

/// The entry points, each field named after its function (what [`cublas!`](crate::cublas!)
/// and [`cublas_name!`](crate::cublas_name!) rely on). The pointers are valid while the
/// [`CublasLibrary`](crate::CublasLibrary) that resolved them is loaded.
#[derive(Clone, Copy, Debug)]
pub struct CublasApi {
    /// Creates a handle on the current context's device.
    pub cublasCreate_v2: unsafe extern "C" fn(*mut cublasHandle_t) -> cublasStatus_t,
    /// Destroys a handle.
    pub cublasDestroy_v2: unsafe extern "C" fn(cublasHandle_t) -> cublasStatus_t,
    /// Sets the stream a handle's later calls enqueue on (and resets its workspace to cuBLAS's
    /// default pool).
    pub cublasSetStream_v2: unsafe extern "C" fn(cublasHandle_t, CUstream) -> cublasStatus_t,
    /// Gives a handle the caller's workspace.
    pub cublasSetWorkspace_v2:
        unsafe extern "C" fn(cublasHandle_t, *mut c_void, usize) -> cublasStatus_t,
    /// Single-precision GEMM.
    pub cublasSgemm_v2: SgemmFn,
}
