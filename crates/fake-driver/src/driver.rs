//! The driver functions the fake implements: initialization, version, devices.
//!
//! Every function first returns the failure configured for it, if any. Devices are numbered
//! from 0 and their handle is their ordinal; their facts are derived from the ordinal so a
//! test can predict them ([`device_name`], [`total_memory`], [`uuid`], [`pci_bus_id`]).
//! Like the real driver, device calls before `cuInit` return `CUDA_ERROR_NOT_INITIALIZED`.
// Functions carry the driver's names so a reader can match them to cuda.h.
#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint};

use crate::config::state;
use crate::status;

/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`.
pub const ATTRIBUTE_MULTIPROCESSOR_COUNT: c_uint = 16;
/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR`.
pub const ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_uint = 75;
/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR`.
pub const ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_uint = 76;

/// Every fake device reports compute capability 9.0, like an H100/H200.
pub const COMPUTE_CAPABILITY: (i32, i32) = (9, 0);
/// Every fake device has this many multiprocessors.
pub const MULTIPROCESSORS: i32 = 132;

/// The name of device `ordinal`.
pub fn device_name(ordinal: i32) -> String {
    format!("cuhal fake GPU {ordinal}")
}

/// The memory of device `ordinal`: (ordinal + 1) x 16 GiB, so devices differ.
pub fn total_memory(ordinal: i32) -> usize {
    (ordinal as usize + 1) * (16 << 30)
}

/// The UUID of device `ordinal`: `fa ce 00 .. 00 <ordinal>`.
pub fn uuid(ordinal: i32) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[0] = 0xfa;
    bytes[1] = 0xce;
    bytes[15] = ordinal as u8;
    bytes
}

/// The PCI bus id of device `ordinal`: `0000:3b:00.0`, then `0000:3c:00.0`, ...
pub fn pci_bus_id(ordinal: i32) -> String {
    format!("0000:{:02x}:00.0", 0x3b + ordinal)
}

/// Returns early with the configured failure of `$name`, if any.
macro_rules! configured_failure {
    ($name:literal) => {
        if let Some(code) = state().failure($name) {
            return code;
        }
    };
}

/// Checks `cuInit` happened and `device` exists.
fn check_device(device: c_int) -> c_int {
    let state = state();
    if !state.initialized {
        status::NOT_INITIALIZED
    } else if device < 0 || device >= state.device_count {
        status::INVALID_DEVICE
    } else {
        status::SUCCESS
    }
}

/// Writes `value` through `out` after the usual checks.
///
/// # Safety
/// `out` is null or valid for one write of `T`.
unsafe fn write_out<T>(out: *mut T, value: T) -> c_int {
    if out.is_null() {
        return status::INVALID_VALUE;
    }
    // SAFETY: non-null and valid for a write by the caller's contract.
    unsafe { out.write(value) };
    status::SUCCESS
}

/// Copies `text` and a NUL into the caller's `buffer` of `len` bytes.
///
/// # Safety
/// `buffer` is null or valid for `len` byte writes.
unsafe fn write_text(buffer: *mut c_char, len: c_int, text: &str) -> c_int {
    if buffer.is_null() || len <= 0 {
        return status::INVALID_VALUE;
    }
    // The real driver truncates names to the buffer; do the same, keeping the NUL.
    let n = text.len().min(len as usize - 1);
    // SAFETY: `buffer` holds `len` > n bytes; source and destination do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buffer, n);
        buffer.add(n).write(0);
    }
    status::SUCCESS
}

/// `CUresult cuInit(unsigned int flags)`.
///
/// # Safety
/// None beyond the C ABI; `unsafe` to match the driver's other entry points.
pub unsafe extern "C" fn cuInit(flags: c_uint) -> c_int {
    configured_failure!("cuInit");
    if flags != 0 {
        return status::INVALID_VALUE;
    }
    state().initialized = true;
    status::SUCCESS
}

/// `CUresult cuDriverGetVersion(int *driverVersion)`. Works before `cuInit`, as the real one.
///
/// # Safety
/// `version` is null or valid for one write.
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> c_int {
    configured_failure!("cuDriverGetVersion");
    let v = state().driver_version;
    // SAFETY: forwarded caller contract.
    unsafe { write_out(version, v) }
}

/// `CUresult cuDeviceGetCount(int *count)`.
///
/// # Safety
/// `count` is null or valid for one write.
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> c_int {
    configured_failure!("cuDeviceGetCount");
    let (initialized, n) = {
        let s = state();
        (s.initialized, s.device_count)
    };
    if !initialized {
        return status::NOT_INITIALIZED;
    }
    // SAFETY: forwarded caller contract.
    unsafe { write_out(count, n) }
}

/// `CUresult cuDeviceGet(CUdevice *device, int ordinal)`.
///
/// # Safety
/// `device` is null or valid for one write.
pub unsafe extern "C" fn cuDeviceGet(device: *mut c_int, ordinal: c_int) -> c_int {
    configured_failure!("cuDeviceGet");
    match check_device(ordinal) {
        // SAFETY: forwarded caller contract.
        status::SUCCESS => unsafe { write_out(device, ordinal) },
        error => error,
    }
}

/// `CUresult cuDeviceGetName(char *name, int len, CUdevice dev)`.
///
/// # Safety
/// `name` is null or valid for `len` byte writes.
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, device: c_int) -> c_int {
    configured_failure!("cuDeviceGetName");
    match check_device(device) {
        // SAFETY: forwarded caller contract.
        status::SUCCESS => unsafe { write_text(name, len, &device_name(device)) },
        error => error,
    }
}

/// `CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)`.
///
/// Knows the attributes `cuhal info` reads; others are `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `value` is null or valid for one write.
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attribute: c_uint,
    device: c_int,
) -> c_int {
    configured_failure!("cuDeviceGetAttribute");
    let error = check_device(device);
    if error != status::SUCCESS {
        return error;
    }
    let v = match attribute {
        ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => COMPUTE_CAPABILITY.0,
        ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => COMPUTE_CAPABILITY.1,
        ATTRIBUTE_MULTIPROCESSOR_COUNT => MULTIPROCESSORS,
        _ => return status::INVALID_VALUE,
    };
    // SAFETY: forwarded caller contract.
    unsafe { write_out(value, v) }
}

/// `CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)`.
///
/// # Safety
/// `bytes` is null or valid for one write.
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut usize, device: c_int) -> c_int {
    configured_failure!("cuDeviceTotalMem");
    match check_device(device) {
        // SAFETY: forwarded caller contract.
        status::SUCCESS => unsafe { write_out(bytes, total_memory(device)) },
        error => error,
    }
}

/// `CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)` (`CUuuid` is 16 bytes).
///
/// # Safety
/// `out` is null or valid for a 16-byte write.
pub unsafe extern "C" fn cuDeviceGetUuid(out: *mut [u8; 16], device: c_int) -> c_int {
    configured_failure!("cuDeviceGetUuid");
    match check_device(device) {
        // SAFETY: forwarded caller contract.
        status::SUCCESS => unsafe { write_out(out, uuid(device)) },
        error => error,
    }
}

/// `CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)`.
///
/// # Safety
/// `bus_id` is null or valid for `len` byte writes.
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    bus_id: *mut c_char,
    len: c_int,
    device: c_int,
) -> c_int {
    configured_failure!("cuDeviceGetPCIBusId");
    match check_device(device) {
        // The real driver wants room for the whole id (13 bytes with the NUL).
        status::SUCCESS if len < 13 => status::INVALID_VALUE,
        // SAFETY: forwarded caller contract.
        status::SUCCESS => unsafe { write_text(bus_id, len, &pci_bus_id(device)) },
        error => error,
    }
}
