//! Exported functions that steer one loaded instance of the fake.
//!
//! A test opens its own copy of the library, calls these through `dlsym`, then loads the
//! same path through `cuhal-sys` (the dynamic loader hands back the same instance). Each
//! returns 0 on success and -1 for a null name.

use std::ffi::{CStr, c_char, c_int};

use crate::config::{Via, state};

/// Reads a caller's C string.
///
/// # Safety
/// `name` is null or NUL-terminated.
unsafe fn text(name: *const c_char) -> Option<String> {
    if name.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    Some(
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// Makes `cuGetProcAddress` report `name` missing.
///
/// # Safety
/// `name` is null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuhal_fake_hide(name: *const c_char) -> c_int {
    // SAFETY: forwarded caller contract.
    match unsafe { text(name) } {
        Some(name) => {
            state().hidden.push(name);
            0
        }
        None => -1,
    }
}

/// Makes the implemented function `name` return `code` from now on.
///
/// # Safety
/// `name` is null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuhal_fake_fail(name: *const c_char, code: c_int) -> c_int {
    // SAFETY: forwarded caller contract.
    match unsafe { text(name) } {
        Some(name) => {
            state().failures.insert(name, code);
            0
        }
        None => -1,
    }
}

/// Sets what `cuDriverGetVersion` reports (e.g. 12040 for 12.4).
#[unsafe(no_mangle)]
pub extern "C" fn cuhal_fake_set_driver_version(version: c_int) {
    state().driver_version = version;
}

/// Sets how many devices there are.
#[unsafe(no_mangle)]
pub extern "C" fn cuhal_fake_set_device_count(count: c_int) {
    state().device_count = count.max(0);
}

/// How many times `name` was requested through either resolver. The last request's
/// resolver (1 or 2), CUDA version and flags are written through the non-null out-pointers.
///
/// # Safety
/// `name` is null or NUL-terminated; each out-pointer is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuhal_fake_requested(
    name: *const c_char,
    via: *mut c_int,
    cuda_version: *mut c_int,
    flags: *mut u64,
) -> c_int {
    // SAFETY: forwarded caller contract.
    let Some(name) = (unsafe { text(name) }) else {
        return -1;
    };
    let state = state();
    let mut matching = state.requests.iter().filter(|r| r.name == name);
    let count = matching.clone().count();
    if let Some(last) = matching.next_back() {
        // SAFETY: each pointer is null or writable by the caller's contract.
        unsafe {
            if !via.is_null() {
                via.write(last.via as c_int);
            }
            if !cuda_version.is_null() {
                cuda_version.write(last.cuda_version);
            }
            if !flags.is_null() {
                flags.write(last.flags);
            }
        }
    }
    count as c_int
}

/// How many requests came through resolver `via` (1: `cuGetProcAddress`, 2: `_v2`).
#[unsafe(no_mangle)]
pub extern "C" fn cuhal_fake_request_count(via: c_int) -> c_int {
    state()
        .requests
        .iter()
        .filter(|r| r.via as c_int == via && matches!(r.via, Via::V1 | Via::V2))
        .count() as c_int
}
