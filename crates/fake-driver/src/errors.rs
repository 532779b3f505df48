//! `cuGetErrorName` and `cuGetErrorString`, with the driver's own wording for the codes the
//! fake can return.
// Functions carry the driver's names so a reader can match them to cuda.h.
#![allow(non_snake_case)]

use std::ffi::{CStr, c_char, c_int};

use crate::status;

/// Each known code with its `cuda.h` name and the real driver's description.
pub const TABLE: &[(i32, &CStr, &CStr)] = &[
    (status::SUCCESS, c"CUDA_SUCCESS", c"no error"),
    (
        status::INVALID_VALUE,
        c"CUDA_ERROR_INVALID_VALUE",
        c"invalid argument",
    ),
    (
        status::OUT_OF_MEMORY,
        c"CUDA_ERROR_OUT_OF_MEMORY",
        c"out of memory",
    ),
    (
        status::NOT_INITIALIZED,
        c"CUDA_ERROR_NOT_INITIALIZED",
        c"initialization error",
    ),
    (
        status::STUB_LIBRARY,
        c"CUDA_ERROR_STUB_LIBRARY",
        c"CUDA driver is a stub library",
    ),
    (
        status::NO_DEVICE,
        c"CUDA_ERROR_NO_DEVICE",
        c"no CUDA-capable device is detected",
    ),
    (
        status::INVALID_DEVICE,
        c"CUDA_ERROR_INVALID_DEVICE",
        c"invalid device ordinal",
    ),
    (
        status::INVALID_IMAGE,
        c"CUDA_ERROR_INVALID_IMAGE",
        c"device kernel image is invalid",
    ),
    (
        status::INVALID_CONTEXT,
        c"CUDA_ERROR_INVALID_CONTEXT",
        c"invalid device context",
    ),
    (
        status::INVALID_PTX,
        c"CUDA_ERROR_INVALID_PTX",
        c"a PTX JIT compilation failed",
    ),
    (
        status::INVALID_HANDLE,
        c"CUDA_ERROR_INVALID_HANDLE",
        c"invalid resource handle",
    ),
    (
        status::NOT_FOUND,
        c"CUDA_ERROR_NOT_FOUND",
        c"named symbol not found",
    ),
    (
        status::NOT_READY,
        c"CUDA_ERROR_NOT_READY",
        c"device not ready",
    ),
    (
        status::ILLEGAL_ADDRESS,
        c"CUDA_ERROR_ILLEGAL_ADDRESS",
        c"an illegal memory access was encountered",
    ),
    (
        status::LAUNCH_FAILED,
        c"CUDA_ERROR_LAUNCH_FAILED",
        c"unspecified launch failure",
    ),
    (
        status::NOT_SUPPORTED,
        c"CUDA_ERROR_NOT_SUPPORTED",
        c"operation not supported",
    ),
    (status::UNKNOWN, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
];

fn lookup(code: c_int) -> Option<&'static (i32, &'static CStr, &'static CStr)> {
    TABLE.iter().find(|(c, _, _)| *c == code)
}

/// `CUresult cuGetErrorName(CUresult error, const char **pStr)`.
///
/// Like the real driver, an unknown code returns `CUDA_ERROR_INVALID_VALUE` and a null string.
///
/// # Safety
/// `text` is null or valid for one pointer write.
pub unsafe extern "C" fn cuGetErrorName(code: c_int, text: *mut *const c_char) -> c_int {
    // SAFETY: forwarded caller contract.
    unsafe { describe(code, text, |(_, name, _)| name) }
}

/// `CUresult cuGetErrorString(CUresult error, const char **pStr)`.
///
/// # Safety
/// `text` is null or valid for one pointer write.
pub unsafe extern "C" fn cuGetErrorString(code: c_int, text: *mut *const c_char) -> c_int {
    // SAFETY: forwarded caller contract.
    unsafe { describe(code, text, |(_, _, description)| description) }
}

/// # Safety
/// `text` is null or valid for one pointer write.
unsafe fn describe(
    code: c_int,
    text: *mut *const c_char,
    pick: fn(&'static (i32, &'static CStr, &'static CStr)) -> &'static CStr,
) -> c_int {
    if text.is_null() {
        return status::INVALID_VALUE;
    }
    let (result, string) = match lookup(code) {
        Some(entry) => (status::SUCCESS, pick(entry).as_ptr()),
        None => (status::INVALID_VALUE, std::ptr::null()),
    };
    // SAFETY: `text` is non-null and valid for a write by the caller's contract; the string
    // is a static C literal.
    unsafe { text.write(string) };
    result
}
