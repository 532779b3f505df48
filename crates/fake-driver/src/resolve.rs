//! `cuGetProcAddress` in both forms, the only driver entry points the fake exports by name.
//!
//! Like the real driver, a name is looked up without version suffix and the `cudaVersion`
//! argument says which ABI the caller was written for: a function newer than that version is
//! "version not sufficient", a hidden one "symbol not found" (both `CUDA_ERROR_NOT_FOUND`
//! with a null pointer). Every request is recorded for tests to inspect.

use std::ffi::{CStr, c_char, c_int, c_void};

use crate::config::{Request, Via, state};
use crate::{driver, errors, status};

/// `CU_GET_PROC_ADDRESS_SUCCESS`.
pub const QUERY_SUCCESS: c_int = 0;
/// `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`.
pub const QUERY_SYMBOL_NOT_FOUND: c_int = 1;
/// `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`.
pub const QUERY_VERSION_NOT_SUFFICIENT: c_int = 2;

/// The CUDA version that introduced each implemented function, and its address.
fn implemented(name: &str) -> Option<(i32, *mut c_void)> {
    let (since, f): (i32, *mut c_void) = match name {
        "cuInit" => (2000, driver::cuInit as *mut c_void),
        "cuDriverGetVersion" => (2020, driver::cuDriverGetVersion as *mut c_void),
        "cuDeviceGetCount" => (2000, driver::cuDeviceGetCount as *mut c_void),
        "cuDeviceGet" => (2000, driver::cuDeviceGet as *mut c_void),
        "cuDeviceGetName" => (2000, driver::cuDeviceGetName as *mut c_void),
        "cuDeviceGetAttribute" => (2000, driver::cuDeviceGetAttribute as *mut c_void),
        "cuDeviceTotalMem" => (3020, driver::cuDeviceTotalMem as *mut c_void),
        "cuDeviceGetUuid" => (9020, driver::cuDeviceGetUuid as *mut c_void),
        "cuDeviceGetPCIBusId" => (4010, driver::cuDeviceGetPCIBusId as *mut c_void),
        "cuGetErrorName" => (6000, errors::cuGetErrorName as *mut c_void),
        "cuGetErrorString" => (6000, errors::cuGetErrorString as *mut c_void),
        // An entry point newer than CUDA 12.0, to test version-gated lookups.
        "cuFakeSince13" => (13000, not_supported as *mut c_void),
        _ => return None,
    };
    Some((since, f))
}

/// What every name the fake does not implement resolves to.
///
/// A loader casts it to the signature it expects; on the C ABIs CUDA supports the caller
/// owns the argument registers and stack, so ignoring arguments is sound in practice. The
/// loaders under test never call these: they only need the table to be complete.
unsafe extern "C" fn not_supported() -> c_int {
    status::NOT_SUPPORTED
}

/// Resolves `symbol` for `cuda_version`, recording the request. Returns the
/// `CUdriverProcAddressQueryResult` and the pointer.
///
/// # Safety
/// `symbol` is null or a NUL-terminated string.
unsafe fn lookup(
    symbol: *const c_char,
    cuda_version: c_int,
    flags: u64,
    via: Via,
) -> (c_int, *mut c_void) {
    if symbol.is_null() {
        return (QUERY_SYMBOL_NOT_FOUND, std::ptr::null_mut());
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let name = unsafe { CStr::from_ptr(symbol) }
        .to_string_lossy()
        .into_owned();
    let mut state = state();
    let hidden = state.is_hidden(&name);
    state.requests.push(Request {
        name: name.clone(),
        cuda_version,
        flags,
        via,
    });
    drop(state);
    if hidden {
        return (QUERY_SYMBOL_NOT_FOUND, std::ptr::null_mut());
    }
    match implemented(&name) {
        Some((since, _)) if since > cuda_version => {
            (QUERY_VERSION_NOT_SUFFICIENT, std::ptr::null_mut())
        }
        Some((_, f)) => (QUERY_SUCCESS, f),
        None => (QUERY_SUCCESS, not_supported as *mut c_void),
    }
}

/// `CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)`.
///
/// # Safety
/// `symbol` is null or NUL-terminated; `pfn` is null or valid for one pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> c_int {
    if pfn.is_null() {
        return status::INVALID_VALUE;
    }
    // SAFETY: forwarded caller contract.
    let (query, f) = unsafe { lookup(symbol, cuda_version, flags, Via::V1) };
    // SAFETY: `pfn` is non-null and writable by the caller's contract.
    unsafe { pfn.write(f) };
    if query == QUERY_SUCCESS {
        status::SUCCESS
    } else {
        status::NOT_FOUND
    }
}

/// `CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
/// cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)`.
///
/// # Safety
/// `symbol` is null or NUL-terminated; `pfn` is null or valid for one pointer write;
/// `symbol_status` is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_int,
) -> c_int {
    if pfn.is_null() {
        return status::INVALID_VALUE;
    }
    // SAFETY: forwarded caller contract.
    let (query, f) = unsafe { lookup(symbol, cuda_version, flags, Via::V2) };
    // SAFETY: `pfn` is non-null and writable by the caller's contract.
    unsafe { pfn.write(f) };
    if !symbol_status.is_null() {
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { symbol_status.write(query) };
    }
    if query == QUERY_SUCCESS {
        status::SUCCESS
    } else {
        status::NOT_FOUND
    }
}
