//! Fills and copies, synchronous and "asynchronous" (which run at once, in stream order).
//!
//! Device ranges must lie inside one live device allocation (`CUDA_ERROR_INVALID_VALUE`
//! otherwise); host pointers are the caller's to vouch for, as with the real driver.
// Functions carry the driver's names so a reader can match them to cuda.h.
#![allow(non_snake_case)]

use std::ffi::{c_int, c_uint, c_void};

use cuhal_sys::{CUdeviceptr, CUstream};

use crate::entry::{Status, ensure, entry};
use crate::graph::Op;
use crate::memory::{fill, move_bytes};
use crate::status;
use crate::world::{World, world};

/// Fills `count` elements of `size` bytes at `target` on `stream` (null: the current context).
fn memset(
    world: &mut World,
    stream: CUstream,
    target: CUdeviceptr,
    value: u32,
    size: usize,
    count: usize,
) -> Status {
    world.stream_device(stream)?;
    ensure(target.is_multiple_of(size as u64), status::INVALID_VALUE)?;
    if count == 0 {
        return Ok(());
    }
    let bytes = count.checked_mul(size).ok_or(status::INVALID_VALUE)?;
    let span = world.device_span(target, bytes)?;
    if world.captured(stream, || Op::linear_fill(target, value, size, count))? {
        return Ok(());
    }
    // SAFETY: `span` is `bytes` bytes inside a live allocation, which the held lock keeps alive.
    unsafe { fill(span, value, size, count) };
    Ok(())
}

/// `CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)`.
pub extern "C" fn cuMemsetD8Async(
    target: CUdeviceptr,
    value: u8,
    count: usize,
    stream: CUstream,
) -> c_int {
    entry("cuMemsetD8Async", || {
        memset(&mut world(), stream, target, value.into(), 1, count)
    })
}

/// `CUresult cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream)`.
pub extern "C" fn cuMemsetD16Async(
    target: CUdeviceptr,
    value: u16,
    count: usize,
    stream: CUstream,
) -> c_int {
    entry("cuMemsetD16Async", || {
        memset(&mut world(), stream, target, value.into(), 2, count)
    })
}

/// `CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)`.
pub extern "C" fn cuMemsetD32Async(
    target: CUdeviceptr,
    value: c_uint,
    count: usize,
    stream: CUstream,
) -> c_int {
    entry("cuMemsetD32Async", || {
        memset(&mut world(), stream, target, value, 4, count)
    })
}

/// One end of a copy.
#[derive(Copy, Clone)]
pub(crate) enum End {
    /// A device address, checked against the allocations.
    Device(CUdeviceptr),
    /// A host address the caller vouches for.
    Host(*mut u8),
    /// Unified addressing: a device allocation if the address is one, else host memory.
    Unified(CUdeviceptr),
}

impl World {
    /// The host address of `len` bytes at `end`.
    pub(crate) fn resolve(&self, end: End, len: usize) -> Result<*mut u8, c_int> {
        match end {
            End::Device(address) => self.device_span(address, len),
            End::Host(pointer) => {
                ensure(!pointer.is_null(), status::INVALID_VALUE)?;
                Ok(pointer)
            }
            End::Unified(address) => match self.device_span(address, len) {
                Ok(span) => Ok(span),
                Err(_) if address != 0 => {
                    Ok(std::ptr::with_exposed_provenance_mut(address as usize))
                }
                Err(e) => Err(e),
            },
        }
    }

    /// Copies `len` bytes from `source` to `target`.
    ///
    /// # Safety
    /// Host ends are valid for `len` bytes.
    pub(crate) unsafe fn copy(&self, target: End, source: End, len: usize) -> Status {
        if len == 0 {
            return Ok(());
        }
        let (target, source) = (self.resolve(target, len)?, self.resolve(source, len)?);
        // SAFETY: device ends were checked to lie in live allocations (kept alive by the held
        // lock), host ends are vouched for by the caller.
        unsafe { move_bytes(target, source, len) };
        Ok(())
    }
}

/// A copy on `stream`, or synchronous (in the current context) when `stream` is `None`.
///
/// # Safety
/// Host ends are valid for `len` bytes.
unsafe fn memcpy(stream: Option<CUstream>, target: End, source: End, len: usize) -> Status {
    let mut world = world();
    match stream {
        Some(stream) => {
            world.stream_device(stream)?;
            if len > 0 {
                world.resolve(target, len)?;
                world.resolve(source, len)?;
            }
            if world.captured(stream, || Op::linear_copy(target, source, len))? {
                return Ok(());
            }
        }
        None => {
            world.current_context()?;
            // A synchronous copy synchronizes: forbidden on a capturing thread.
            world.forbid_on_capturing_thread()?;
        }
    }
    // SAFETY: forwarded caller contract.
    unsafe { world.copy(target, source, len) }
}

/// `CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)`.
///
/// # Safety
/// `source` is valid for `len` bytes.
pub unsafe extern "C" fn cuMemcpyHtoD(
    target: CUdeviceptr,
    source: *const c_void,
    len: usize,
) -> c_int {
    // SAFETY: forwarded caller contract.
    entry("cuMemcpyHtoD", || unsafe {
        memcpy(
            None,
            End::Device(target),
            End::Host(source.cast_mut().cast()),
            len,
        )
    })
}

/// `CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)`.
///
/// # Safety
/// `target` is valid for `len` bytes.
pub unsafe extern "C" fn cuMemcpyDtoH(
    target: *mut c_void,
    source: CUdeviceptr,
    len: usize,
) -> c_int {
    // SAFETY: forwarded caller contract.
    entry("cuMemcpyDtoH", || unsafe {
        memcpy(None, End::Host(target.cast()), End::Device(source), len)
    })
}

/// `CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
/// CUstream hStream)`.
///
/// # Safety
/// `source` is valid for `len` bytes.
pub unsafe extern "C" fn cuMemcpyHtoDAsync(
    target: CUdeviceptr,
    source: *const c_void,
    len: usize,
    stream: CUstream,
) -> c_int {
    // SAFETY: forwarded caller contract.
    entry("cuMemcpyHtoDAsync", || unsafe {
        memcpy(
            Some(stream),
            End::Device(target),
            End::Host(source.cast_mut().cast()),
            len,
        )
    })
}

/// `CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
/// CUstream hStream)`.
///
/// # Safety
/// `target` is valid for `len` bytes.
pub unsafe extern "C" fn cuMemcpyDtoHAsync(
    target: *mut c_void,
    source: CUdeviceptr,
    len: usize,
    stream: CUstream,
) -> c_int {
    // SAFETY: forwarded caller contract.
    entry("cuMemcpyDtoHAsync", || unsafe {
        memcpy(
            Some(stream),
            End::Host(target.cast()),
            End::Device(source),
            len,
        )
    })
}

/// `CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
/// CUstream hStream)`.
pub extern "C" fn cuMemcpyDtoDAsync(
    target: CUdeviceptr,
    source: CUdeviceptr,
    len: usize,
    stream: CUstream,
) -> c_int {
    // SAFETY: both ends are device ranges, checked against the allocations.
    entry("cuMemcpyDtoDAsync", || unsafe {
        memcpy(Some(stream), End::Device(target), End::Device(source), len)
    })
}

/// `CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr
/// srcDevice, CUcontext srcContext, size_t ByteCount, CUstream hStream)`: both contexts must be
/// active primary contexts and each end must be an allocation of its context's device.
pub extern "C" fn cuMemcpyPeerAsync(
    target: CUdeviceptr,
    target_context: cuhal_sys::CUcontext,
    source: CUdeviceptr,
    source_context: cuhal_sys::CUcontext,
    len: usize,
    stream: CUstream,
) -> c_int {
    entry("cuMemcpyPeerAsync", || {
        {
            let world = world();
            for (address, context) in [(target, target_context), (source, source_context)] {
                let device = world
                    .active_context(crate::world::id(context).map_err(|_| status::INVALID_CONTEXT)?)
                    .ok_or(status::INVALID_CONTEXT)?;
                if len > 0 {
                    ensure(
                        world.allocation_device(address) == Some(device),
                        status::INVALID_VALUE,
                    )?;
                }
            }
        }
        // SAFETY: both ends are device ranges, checked against the allocations.
        unsafe { memcpy(Some(stream), End::Device(target), End::Device(source), len) }
    })
}

/// `CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)`:
/// unified addressing, so either end may be host memory.
///
/// # Safety
/// An end that is not a device allocation is host memory valid for `len` bytes.
pub unsafe extern "C" fn cuMemcpyAsync(
    target: CUdeviceptr,
    source: CUdeviceptr,
    len: usize,
    stream: CUstream,
) -> c_int {
    // SAFETY: forwarded caller contract.
    entry("cuMemcpyAsync", || unsafe {
        memcpy(
            Some(stream),
            End::Unified(target),
            End::Unified(source),
            len,
        )
    })
}
