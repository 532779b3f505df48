//! Commands enqueued on a stream: what a stream command buffer does as it records, and what a
//! deferred command buffer does when it replays. No allocation, one driver call each.

use std::ffi::c_void;

use cuhal_sys::{CUdeviceptr, CUevent, CUfunction, CUstream, DriverApi, cu};

use crate::launch::{LaunchAttributes, NO_ATTRIBUTE, launch_config};
use crate::{Error, FillPattern};

/// `cuMemsetD{8,16,32}Async` of `length` bytes.
///
/// # Safety
/// `[target, target + length)` is live device memory of the current context, aligned for the
/// pattern; `stream` is a live stream of that context.
pub unsafe fn fill(
    api: &DriverApi,
    stream: CUstream,
    target: CUdeviceptr,
    length: usize,
    pattern: FillPattern,
) -> Result<(), Error> {
    let count = length / pattern.size();
    // SAFETY: guaranteed by the caller; `count` elements of the pattern's size cover the range.
    unsafe {
        match pattern {
            FillPattern::U8(v) => cu!(api, cuMemsetD8Async(target, v, count, stream)),
            FillPattern::U16(v) => cu!(api, cuMemsetD16Async(target, v, count, stream)),
            FillPattern::U32(v) => cu!(api, cuMemsetD32Async(target, v, count, stream)),
        }
    }?;
    Ok(())
}

/// `cuMemcpyHtoDAsync` of `length` bytes from host memory.
///
/// # Safety
/// As for [`fill`]; `source` points to `length` bytes that stay unchanged and allocated until
/// the copy has executed.
pub(crate) unsafe fn update(
    api: &DriverApi,
    stream: CUstream,
    target: CUdeviceptr,
    source: *const u8,
    length: usize,
) -> Result<(), Error> {
    // SAFETY: guaranteed by the caller.
    unsafe {
        cu!(
            api,
            cuMemcpyHtoDAsync(target, source.cast(), length, stream)
        )
    }?;
    Ok(())
}

/// `cuMemcpyDtoDAsync`.
///
/// # Safety
/// Both ranges are live device memory (of the current context, or one end of a peer device's,
/// reached by unified addressing) and do not overlap; `stream` is a live stream of the current
/// context.
pub(crate) unsafe fn copy(
    api: &DriverApi,
    stream: CUstream,
    source: CUdeviceptr,
    target: CUdeviceptr,
    length: usize,
) -> Result<(), Error> {
    // SAFETY: guaranteed by the caller.
    unsafe { cu!(api, cuMemcpyDtoDAsync(target, source, length, stream)) }?;
    Ok(())
}

/// The shape of a launch.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct LaunchShape {
    pub(crate) grid: [u32; 3],
    pub(crate) block: [u32; 3],
    pub(crate) shared_memory: u32,
}

/// `cuLaunchKernel`, or `cuLaunchKernelEx` when the dispatch has launch attributes (checked
/// at recording, which also made sure the driver has `cuLaunchKernelEx`).
///
/// # Safety
/// `function` is a function of a loaded module of the current context; `params` is null (no
/// arguments) or one pointer per kernel argument, each to a value of that argument's size, all
/// live for the duration of the call (the driver copies them); `stream` is live.
pub(crate) unsafe fn launch(
    api: &DriverApi,
    stream: CUstream,
    function: CUfunction,
    shape: LaunchShape,
    attributes: &LaunchAttributes,
    params: *mut *mut c_void,
) -> Result<(), Error> {
    if !attributes.is_plain() {
        if api.cuLaunchKernelEx.is_none() {
            return Err(Error::UnsupportedAttribute {
                attribute: "launch attributes",
                reason: "the driver has no extended launch (CUDA 11.8)",
            });
        }
        let mut attrs = [NO_ATTRIBUTE; 4];
        let n = attributes.fill(&mut attrs, true);
        let config = launch_config(
            shape.grid,
            shape.block,
            shape.shared_memory,
            stream,
            &mut attrs,
            n,
        );
        // SAFETY: guaranteed by the caller; `config` and the attributes it points to are
        // locals that outlive the call.
        unsafe {
            cu!(
                optional: api,
                cuLaunchKernelEx(&config, function, params, std::ptr::null_mut())
            )
        }?;
        return Ok(());
    }
    let [gx, gy, gz] = shape.grid;
    let [bx, by, bz] = shape.block;
    // SAFETY: guaranteed by the caller.
    unsafe {
        cu!(
            api,
            cuLaunchKernel(
                function,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                shape.shared_memory,
                stream,
                params,
                std::ptr::null_mut(),
            )
        )
    }?;
    Ok(())
}

/// `cuEventRecord` of a tracing event.
///
/// # Safety
/// `event` is a live event of the current context (owned by a zone recorder that outlives the
/// command buffer); `stream` is live.
pub(crate) unsafe fn record_event(
    api: &DriverApi,
    stream: CUstream,
    event: CUevent,
) -> Result<(), Error> {
    // SAFETY: guaranteed by the caller.
    unsafe { cu!(api, cuEventRecord(event, stream)) }?;
    Ok(())
}
