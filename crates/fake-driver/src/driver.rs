//! Initialization, version and devices.
//!
//! Devices are numbered
//! from 0 and their handle is their ordinal; their facts are derived from the ordinal so a
//! test can predict them ([`device_name`], [`total_memory`], [`uuid`], [`pci_bus_id`]).
//! Like the real driver, device calls before `cuInit` return `CUDA_ERROR_NOT_INITIALIZED`.
// Functions carry the driver's names so a reader can match them to cuda.h.
#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint};

use cuhal_sys::{
    CU_DEVICE_ATTRIBUTE_CLOCK_RATE, CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
    CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
    CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID,
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, CU_DEVICE_ATTRIBUTE_WARP_SIZE, CUdevice_attribute,
};

use crate::config::state;
use crate::entry::{Status, ensure, entry, put};
use crate::status;

/// Every fake device reports compute capability 9.0, like an H100/H200.
pub const COMPUTE_CAPABILITY: (i32, i32) = (9, 0);
/// Every fake device has this many multiprocessors.
pub const MULTIPROCESSORS: i32 = 132;
/// Threads per block, for devices and kernels alike.
pub const MAX_THREADS_PER_BLOCK: i32 = 1024;
/// Shared memory per block without opting in (48 KiB).
pub const MAX_SHARED_PER_BLOCK: i32 = 48 * 1024;
/// Shared memory per block a kernel may opt in to (227 KiB, as on Hopper).
pub const MAX_SHARED_OPTIN: i32 = 227 * 1024;

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

/// Checks `cuInit` happened and `device` exists.
pub(crate) fn check_device(device: c_int) -> Status {
    let state = state();
    ensure(state.initialized, status::NOT_INITIALIZED)?;
    ensure(
        device >= 0 && device < state.device_count,
        status::INVALID_DEVICE,
    )
}

/// Copies `text` and a NUL into the caller's `buffer` of `len` bytes.
///
/// # Safety
/// `buffer` is null or valid for `len` byte writes.
unsafe fn write_text(buffer: *mut c_char, len: c_int, text: &str) -> Status {
    ensure(!buffer.is_null() && len > 0, status::INVALID_VALUE)?;
    // The real driver truncates names to the buffer; do the same, keeping the NUL.
    let n = text.len().min(len as usize - 1);
    // SAFETY: `buffer` holds `len` > n bytes; source and destination do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buffer, n);
        buffer.add(n).write(0);
    }
    Ok(())
}

/// `CUresult cuInit(unsigned int flags)`.
pub extern "C" fn cuInit(flags: c_uint) -> c_int {
    entry("cuInit", || {
        ensure(flags == 0, status::INVALID_VALUE)?;
        state().initialized = true;
        Ok(())
    })
}

/// `CUresult cuDriverGetVersion(int *driverVersion)`. Works before `cuInit`, as the real one.
///
/// # Safety
/// `version` is null or valid for one write.
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> c_int {
    entry("cuDriverGetVersion", || {
        let v = state().driver_version;
        // SAFETY: forwarded caller contract.
        unsafe { put(version, v) }
    })
}

/// `CUresult cuDeviceGetCount(int *count)`.
///
/// # Safety
/// `count` is null or valid for one write.
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> c_int {
    entry("cuDeviceGetCount", || {
        let (initialized, n) = {
            let s = state();
            (s.initialized, s.device_count)
        };
        ensure(initialized, status::NOT_INITIALIZED)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(count, n) }
    })
}

/// `CUresult cuDeviceGet(CUdevice *device, int ordinal)`.
///
/// # Safety
/// `device` is null or valid for one write.
pub unsafe extern "C" fn cuDeviceGet(device: *mut c_int, ordinal: c_int) -> c_int {
    entry("cuDeviceGet", || {
        check_device(ordinal)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(device, ordinal) }
    })
}

/// `CUresult cuDeviceGetName(char *name, int len, CUdevice dev)`.
///
/// # Safety
/// `name` is null or valid for `len` byte writes.
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, device: c_int) -> c_int {
    entry("cuDeviceGetName", || {
        check_device(device)?;
        // SAFETY: forwarded caller contract.
        unsafe { write_text(name, len, &device_name(device)) }
    })
}

/// The value of `attribute` on device `ordinal`, for the attributes cuhal reads.
pub fn attribute(attribute: CUdevice_attribute, ordinal: i32) -> Option<i32> {
    Some(match attribute {
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK => MAX_THREADS_PER_BLOCK,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK => MAX_SHARED_PER_BLOCK,
        CU_DEVICE_ATTRIBUTE_WARP_SIZE => 32,
        CU_DEVICE_ATTRIBUTE_CLOCK_RATE => 1_980_000,
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => MULTIPROCESSORS,
        CU_DEVICE_ATTRIBUTE_PCI_BUS_ID => 0x3b + ordinal,
        CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID | CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID => 0,
        CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING | CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED => 1,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => COMPUTE_CAPABILITY.0,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => COMPUTE_CAPABILITY.1,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => MAX_SHARED_OPTIN,
        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X => i32::MAX,
        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y | CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z => 65_535,
        CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH | CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH => 1,
        _ => return None,
    })
}

/// `CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)`.
///
/// Knows the attributes cuhal reads ([`attribute`]); others are `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `value` is null or valid for one write.
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    which: CUdevice_attribute,
    device: c_int,
) -> c_int {
    entry("cuDeviceGetAttribute", || {
        check_device(device)?;
        let v = attribute(which, device).ok_or(status::INVALID_VALUE)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(value, v) }
    })
}

/// `CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)`.
///
/// # Safety
/// `bytes` is null or valid for one write.
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut usize, device: c_int) -> c_int {
    entry("cuDeviceTotalMem", || {
        check_device(device)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(bytes, total_memory(device)) }
    })
}

/// `CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)` (`CUuuid` is 16 bytes).
///
/// # Safety
/// `out` is null or valid for a 16-byte write.
pub unsafe extern "C" fn cuDeviceGetUuid(out: *mut [u8; 16], device: c_int) -> c_int {
    entry("cuDeviceGetUuid", || {
        check_device(device)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(out, uuid(device)) }
    })
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
    entry("cuDeviceGetPCIBusId", || {
        check_device(device)?;
        // The real driver wants room for the whole id (13 bytes with the NUL).
        ensure(len >= 13, status::INVALID_VALUE)?;
        // SAFETY: forwarded caller contract.
        unsafe { write_text(bus_id, len, &pci_bus_id(device)) }
    })
}

/// `CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)`: any two
/// distinct fake devices can.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    out: *mut c_int,
    device: c_int,
    peer: c_int,
) -> c_int {
    entry("cuDeviceCanAccessPeer", || {
        check_device(device)?;
        check_device(peer)?;
        let allowed = device != peer && !state().no_peer_access;
        // SAFETY: forwarded caller contract.
        unsafe { put(out, c_int::from(allowed)) }
    })
}

/// `CUresult cuDeviceGetP2PAttribute(int *value, CUdevice_P2PAttribute attrib, CUdevice
/// srcDevice, CUdevice dstDevice)`: distinct fake devices are joined like NVLink peers (access,
/// native atomics, performance rank 0) unless peer access is switched off
/// ([`crate::config::NO_PEER_ACCESS_ENV`]).
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuDeviceGetP2PAttribute(
    out: *mut c_int,
    attribute: c_uint,
    source: c_int,
    destination: c_int,
) -> c_int {
    entry("cuDeviceGetP2PAttribute", || {
        check_device(source)?;
        check_device(destination)?;
        ensure(source != destination, status::INVALID_DEVICE)?;
        let linked = c_int::from(!state().no_peer_access);
        let value = match attribute {
            cuhal_sys::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK => 0,
            cuhal_sys::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED
            | cuhal_sys::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED => linked,
            // CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED.
            4 => linked,
            _ => return Err(status::INVALID_VALUE),
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(out, value) }
    })
}
