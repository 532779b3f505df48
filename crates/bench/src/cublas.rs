//! cuBLAS, loaded at run time (like the driver), for the library case and the GPU suite's
//! interop tests: a handle with its own workspace and an SGEMM on whatever stream it is given.
//!
//! The library is `libcublas.so.13` from `/usr/local/cuda/lib64` or the loader path; without it
//! [`Cublas::load`] says what it tried.

use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use cuhal_sys::{CUdeviceptr, CUstream};
use libloading::Library;

/// Where cuBLAS is looked for, in order.
pub const CUBLAS_PATHS: &[&str] = &["/usr/local/cuda/lib64/libcublas.so.13", "libcublas.so.13"];

type Handle = *mut c_void;
type Status = c_int;
/// `CUBLAS_OP_N`: no transpose.
const OP_N: c_int = 0;

/// The entry points the tests use.
struct Api {
    create: unsafe extern "C" fn(*mut Handle) -> Status,
    destroy: unsafe extern "C" fn(Handle) -> Status,
    set_stream: unsafe extern "C" fn(Handle, CUstream) -> Status,
    set_workspace: unsafe extern "C" fn(Handle, *mut c_void, usize) -> Status,
    #[allow(clippy::type_complexity)]
    sgemm: unsafe extern "C" fn(
        Handle,
        c_int,
        c_int,
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
    ) -> Status,
    // Dropped last: the pointers above point into it.
    _library: Library,
}

/// A cuBLAS error: the call and its `cublasStatus_t`.
#[derive(Debug)]
pub struct CublasError {
    /// The function that failed.
    pub call: &'static str,
    /// Its status (0 is success).
    pub status: i32,
}

impl std::fmt::Display for CublasError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} failed with cublasStatus_t {}",
            self.call, self.status
        )
    }
}

impl std::error::Error for CublasError {}

fn check(call: &'static str, status: Status) -> Result<(), CublasError> {
    if status == 0 {
        Ok(())
    } else {
        Err(CublasError { call, status })
    }
}

/// A cuBLAS handle on the current device, with a workspace cuhal owns. Calls are serialized (a
/// handle must not be used by two threads at once); `Send + Sync` so stream-work closures can
/// hold it.
pub struct Cublas {
    api: Api,
    handle: Mutex<Bound>,
}

/// The handle and what it is bound to.
struct Bound {
    handle: Handle,
    /// The stream given to `cublasSetStream` last (`None`: never set).
    stream: Option<CUstream>,
    /// The caller's workspace (`cublasSetWorkspace`), applied again after every stream change:
    /// `cublasSetStream` resets a handle to cuBLAS's default workspace pool, so without this
    /// every GEMM after the first would run with a workspace of cuBLAS's choosing.
    workspace: Option<(CUdeviceptr, usize)>,
}

// SAFETY: the handle is only used under the mutex, one thread at a time, which cuBLAS allows.
unsafe impl Send for Cublas {}
// SAFETY: as above.
unsafe impl Sync for Cublas {}

impl Cublas {
    /// Loads cuBLAS and creates a handle on the current context's device; `Err` names every
    /// path tried.
    pub fn load() -> Result<Cublas, String> {
        let mut tried = Vec::new();
        for path in CUBLAS_PATHS {
            // SAFETY: loading cuBLAS runs its initializers, which have no preconditions.
            match unsafe { Library::new(path) } {
                Ok(library) => return Self::from_library(library).map_err(|e| e.to_string()),
                Err(e) => tried.push(format!("{path}: {e}")),
            }
        }
        Err(format!("cuBLAS not found ({})", tried.join("; ")))
    }

    fn from_library(library: Library) -> Result<Cublas, Box<dyn std::error::Error>> {
        // SAFETY: each symbol is declared with its signature from cublas_api.h (CUDA 13); the
        // copies of the pointers live next to the library, which outlives them.
        let api = unsafe {
            Api {
                create: *library.get(b"cublasCreate_v2\0")?,
                destroy: *library.get(b"cublasDestroy_v2\0")?,
                set_stream: *library.get(b"cublasSetStream_v2\0")?,
                set_workspace: *library.get(b"cublasSetWorkspace_v2\0")?,
                sgemm: *library.get(b"cublasSgemm_v2\0")?,
                _library: library,
            }
        };
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("cublasCreate_v2", unsafe { (api.create)(&mut handle) })?;
        Ok(Cublas {
            api,
            handle: Mutex::new(Bound {
                handle,
                stream: None,
                workspace: None,
            }),
        })
    }

    /// Gives the handle `bytes` of workspace at `ptr` (so captures never allocate), for every
    /// later call whatever its stream.
    ///
    /// # Safety
    /// `[ptr, ptr + bytes)` is device memory that outlives every use of this handle, and no two
    /// GEMMs of this handle run at once (they would share it).
    pub unsafe fn set_workspace(&self, ptr: CUdeviceptr, bytes: usize) -> Result<(), CublasError> {
        let mut bound = self.handle.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: guaranteed by the caller; the handle is live.
        check("cublasSetWorkspace_v2", unsafe {
            (self.api.set_workspace)(bound.handle, ptr as *mut c_void, bytes)
        })?;
        bound.workspace = Some((ptr, bytes));
        Ok(())
    }

    /// `C = A * B` in single precision, column-major, `A` m x k, `B` k x n, `C` m x n, enqueued
    /// on `stream`.
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
    ) -> Result<(), CublasError> {
        let mut bound = self.handle.lock().unwrap_or_else(|e| e.into_inner());
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (m, n, k) = (m as c_int, n as c_int, k as c_int);
        if bound.stream != Some(stream) {
            // SAFETY: a live handle; the caller vouches for the stream; the workspace was
            // vouched for when it was set.
            unsafe {
                check(
                    "cublasSetStream_v2",
                    (self.api.set_stream)(bound.handle, stream),
                )?;
                if let Some((ptr, bytes)) = bound.workspace {
                    check(
                        "cublasSetWorkspace_v2",
                        (self.api.set_workspace)(bound.handle, ptr as *mut c_void, bytes),
                    )?;
                }
            }
            bound.stream = Some(stream);
        }
        // SAFETY: guaranteed by the caller; alpha and beta are host scalars read during the call
        // (host pointer mode: a capture records their values).
        unsafe {
            check(
                "cublasSgemm_v2",
                (self.api.sgemm)(
                    bound.handle,
                    OP_N,
                    OP_N,
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
                ),
            )
        }
    }
}

impl Drop for Cublas {
    fn drop(&mut self) {
        let handle = self
            .handle
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .handle;
        // SAFETY: created in `load`, destroyed once; nothing uses it any more.
        let _ = unsafe { (self.api.destroy)(handle) };
    }
}
