//! [`Cublas`]: a cuBLAS handle with the caller's workspace, usable from any thread, set to
//! each call's stream.

use std::ffi::{c_int, c_void};
use std::path::Path;
use std::sync::Mutex;

use cuhal_sys::{CUdeviceptr, CUstream};

use crate::cublas;
use crate::error::BlasError;
use crate::ffi::{CUBLAS_OP_N, cublasHandle_t};
use crate::load::CublasLibrary;

/// A cuBLAS handle on the device of the context current when it was created, with a workspace
/// the caller owns. Calls are serialized (a handle must not be used by two threads at once);
/// `Send + Sync`, so stream-work closures of command buffers can hold it.
pub struct Cublas {
    library: CublasLibrary,
    bound: Mutex<Bound>,
}

/// The handle and what it is bound to.
struct Bound {
    handle: cublasHandle_t,
    /// The stream given to `cublasSetStream` last (`None`: never set).
    stream: Option<CUstream>,
    /// The caller's workspace (`cublasSetWorkspace`), applied again after every stream change:
    /// `cublasSetStream` resets a handle to cuBLAS's default workspace pool, so without this
    /// every GEMM after the first would run with a workspace of cuBLAS's choosing (and a graph
    /// capture would allocate).
    workspace: Option<(CUdeviceptr, usize)>,
}

// SAFETY: the handle is only used under the mutex, one thread at a time, which cuBLAS allows;
// the library's entry points are plain function pointers.
unsafe impl Send for Cublas {}
// SAFETY: as above.
unsafe impl Sync for Cublas {}

impl Cublas {
    /// Loads cuBLAS ([`CublasLibrary::load`] with no explicit path) and creates a handle on the
    /// current context's device.
    pub fn load() -> Result<Cublas, BlasError> {
        Self::load_from(None)
    }

    /// Loads cuBLAS from `path` (else as [`CublasLibrary::load`] looks for it) and creates a
    /// handle on the current context's device.
    pub fn load_from(path: Option<&Path>) -> Result<Cublas, BlasError> {
        Self::with_library(CublasLibrary::load(path)?)
    }

    /// Creates a handle on the current context's device from an opened library.
    pub fn with_library(library: CublasLibrary) -> Result<Cublas, BlasError> {
        let mut handle: cublasHandle_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe { cublas!(library.api(), cublasCreate_v2(&mut handle)) }?;
        Ok(Cublas {
            library,
            bound: Mutex::new(Bound {
                handle,
                stream: None,
                workspace: None,
            }),
        })
    }

    /// The library the handle's calls go to.
    pub fn library(&self) -> &CublasLibrary {
        &self.library
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Bound> {
        // A poisoned lock only means a call panicked; the handle's state is still cuBLAS's.
        self.bound.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives the handle `bytes` of workspace at `ptr` (so graph captures never allocate), for
    /// every later call whatever its stream.
    ///
    /// # Safety
    /// `[ptr, ptr + bytes)` is device memory that outlives every use of this handle, and no two
    /// GEMMs of this handle run at once on the GPU (they would share it).
    pub unsafe fn set_workspace(&self, ptr: CUdeviceptr, bytes: usize) -> Result<(), BlasError> {
        let mut bound = self.lock();
        // SAFETY: guaranteed by the caller; the handle is live.
        unsafe {
            cublas!(
                self.library.api(),
                cublasSetWorkspace_v2(bound.handle, ptr as *mut c_void, bytes)
            )
        }?;
        bound.workspace = Some((ptr, bytes));
        Ok(())
    }

    /// Points the handle at `stream` if it is not there already, with the caller's workspace.
    ///
    /// # Safety
    /// `stream` is a live stream of the handle's device.
    unsafe fn bind(&self, bound: &mut Bound, stream: CUstream) -> Result<(), BlasError> {
        if bound.stream == Some(stream) {
            return Ok(());
        }
        let api = self.library.api();
        // SAFETY: a live handle; the caller vouches for the stream; the workspace was vouched
        // for when it was set.
        unsafe {
            cublas!(api, cublasSetStream_v2(bound.handle, stream))?;
            if let Some((ptr, bytes)) = bound.workspace {
                cublas!(
                    api,
                    cublasSetWorkspace_v2(bound.handle, ptr as *mut c_void, bytes)
                )?;
            }
        }
        bound.stream = Some(stream);
        Ok(())
    }

    /// `C = A * B` in single precision, column-major, `A` m x k, `B` k x n, `C` m x n, enqueued
    /// on `stream`. A size that does not fit cuBLAS's `int` is a
    /// [`BlasError::Call`] with `CUBLAS_STATUS_INVALID_VALUE`, made without calling.
    ///
    /// # Safety
    /// The three pointers are device memory of at least those sizes, live until the GEMM has
    /// run; `stream` is a live stream of the handle's device.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn sgemm(
        &self,
        stream: CUstream,
        m: usize,
        n: usize,
        k: usize,
        a: CUdeviceptr,
        b: CUdeviceptr,
        c: CUdeviceptr,
    ) -> Result<(), BlasError> {
        let int = |x: usize| {
            c_int::try_from(x).map_err(|_| BlasError::Call {
                call: crate::cublas_name!(cublasSgemm_v2),
                status: INVALID_VALUE,
            })
        };
        let (m, n, k) = (int(m)?, int(n)?, int(k)?);
        let mut bound = self.lock();
        // SAFETY: the caller vouches for the stream.
        unsafe { self.bind(&mut bound, stream) }?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: guaranteed by the caller; alpha and beta are host scalars read during the call
        // (host pointer mode: a capture records their values).
        unsafe {
            cublas!(
                self.library.api(),
                cublasSgemm_v2(
                    bound.handle,
                    CUBLAS_OP_N,
                    CUBLAS_OP_N,
                    m,
                    n,
                    k,
                    &alpha,
                    a as *const f32,
                    m,
                    b as *const f32,
                    k,
                    &beta,
                    c as *mut f32,
                    m,
                )
            )
        }
    }
}

/// `CUBLAS_STATUS_INVALID_VALUE`.
const INVALID_VALUE: c_int = 7;

impl Drop for Cublas {
    fn drop(&mut self) {
        let handle = self
            .bound
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .handle;
        // SAFETY: created in `with_library`, destroyed once; nothing uses it any more.
        let _ = unsafe { cublas!(self.library.api(), cublasDestroy_v2(handle)) };
    }
}
