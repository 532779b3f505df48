//! `cuGetProcAddress` in both forms, the only driver entry points the fake exports by name.
//!
//! Like the real driver, a name is looked up without version suffix and the `cudaVersion`
//! argument says which ABI the caller was written for: a function newer than that version is
//! "version not sufficient", a hidden one "symbol not found" (both `CUDA_ERROR_NOT_FOUND`
//! with a null pointer). Every request is recorded for tests to inspect.

use std::ffi::{CStr, c_char, c_int, c_void};

use crate::config::{Request, Via, state};
use crate::{errors, status};

/// `CU_GET_PROC_ADDRESS_SUCCESS`.
pub const QUERY_SUCCESS: c_int = 0;
/// `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`.
pub const QUERY_SYMBOL_NOT_FOUND: c_int = 1;
/// `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`.
pub const QUERY_VERSION_NOT_SUFFICIENT: c_int = 2;

/// The CUDA version that introduced each implemented function, and its address.
fn implemented(name: &str) -> Option<(i32, *mut c_void)> {
    use crate::{context as ctx, driver as dev, graph, memory as mem, module as modl};
    use crate::{stream, transfer as xfer};
    macro_rules! f {
        ($since:expr, $f:path) => {
            ($since, $f as *mut c_void)
        };
    }
    Some(match name {
        "cuInit" => f!(2000, dev::cuInit),
        "cuDriverGetVersion" => f!(2020, dev::cuDriverGetVersion),
        "cuDeviceGetCount" => f!(2000, dev::cuDeviceGetCount),
        "cuDeviceGet" => f!(2000, dev::cuDeviceGet),
        "cuDeviceGetName" => f!(2000, dev::cuDeviceGetName),
        "cuDeviceGetAttribute" => f!(2000, dev::cuDeviceGetAttribute),
        "cuDeviceTotalMem" => f!(3020, dev::cuDeviceTotalMem),
        "cuDeviceGetUuid" => f!(9020, dev::cuDeviceGetUuid),
        "cuDeviceGetPCIBusId" => f!(4010, dev::cuDeviceGetPCIBusId),
        "cuDeviceCanAccessPeer" => f!(4000, dev::cuDeviceCanAccessPeer),
        "cuDeviceGetP2PAttribute" => f!(8000, dev::cuDeviceGetP2PAttribute),
        "cuGetErrorName" => f!(6000, errors::cuGetErrorName),
        "cuGetErrorString" => f!(6000, errors::cuGetErrorString),

        "cuDevicePrimaryCtxRetain" => f!(7000, ctx::cuDevicePrimaryCtxRetain),
        "cuDevicePrimaryCtxRelease" => f!(7000, ctx::cuDevicePrimaryCtxRelease),
        "cuDevicePrimaryCtxGetState" => f!(7000, ctx::cuDevicePrimaryCtxGetState),
        "cuCtxSetCurrent" => f!(4000, ctx::cuCtxSetCurrent),
        "cuCtxGetCurrent" => f!(4000, ctx::cuCtxGetCurrent),
        "cuCtxPushCurrent" => f!(4000, ctx::cuCtxPushCurrent),
        "cuCtxPopCurrent" => f!(4000, ctx::cuCtxPopCurrent),
        "cuCtxGetDevice" => f!(2000, ctx::cuCtxGetDevice),
        "cuCtxSynchronize" => f!(2000, ctx::cuCtxSynchronize),
        "cuCtxGetStreamPriorityRange" => f!(5050, ctx::cuCtxGetStreamPriorityRange),
        "cuCtxEnablePeerAccess" => f!(4000, ctx::cuCtxEnablePeerAccess),
        "cuCtxDisablePeerAccess" => f!(4000, ctx::cuCtxDisablePeerAccess),

        "cuStreamCreate" => f!(2000, stream::cuStreamCreate),
        "cuStreamCreateWithPriority" => f!(5050, stream::cuStreamCreateWithPriority),
        "cuStreamDestroy" => f!(4000, stream::cuStreamDestroy),
        "cuStreamSynchronize" => f!(2000, stream::cuStreamSynchronize),
        "cuStreamQuery" => f!(2000, stream::cuStreamQuery),
        "cuStreamWaitEvent" => f!(3020, stream::cuStreamWaitEvent),
        "cuStreamGetId" => f!(12000, stream::cuStreamGetId),
        "cuLaunchHostFunc" => f!(10000, stream::cuLaunchHostFunc),
        "cuEventCreate" => f!(2000, stream::cuEventCreate),
        "cuEventRecord" => f!(2000, stream::cuEventRecord),
        "cuEventRecordWithFlags" => f!(11010, stream::cuEventRecordWithFlags),
        "cuEventQuery" => f!(2000, stream::cuEventQuery),
        "cuEventSynchronize" => f!(2000, stream::cuEventSynchronize),
        "cuEventElapsedTime" => f!(2000, stream::cuEventElapsedTime),
        "cuEventDestroy" => f!(4000, stream::cuEventDestroy),

        "cuMemAlloc" => f!(3020, mem::cuMemAlloc),
        "cuMemFree" => f!(3020, mem::cuMemFree),
        "cuMemAllocHost" => f!(3020, mem::cuMemAllocHost),
        "cuMemHostAlloc" => f!(2020, mem::cuMemHostAlloc),
        "cuMemHostGetDevicePointer" => f!(2020, mem::cuMemHostGetDevicePointer),
        "cuMemFreeHost" => f!(2000, mem::cuMemFreeHost),
        "cuMemGetInfo" => f!(3020, mem::cuMemGetInfo),
        "cuDeviceGetDefaultMemPool" => f!(11020, mem::cuDeviceGetDefaultMemPool),
        "cuMemPoolCreate" => f!(11020, mem::cuMemPoolCreate),
        "cuMemPoolDestroy" => f!(11020, mem::cuMemPoolDestroy),
        "cuMemPoolSetAttribute" => f!(11020, mem::cuMemPoolSetAttribute),
        "cuMemPoolTrimTo" => f!(11020, mem::cuMemPoolTrimTo),
        "cuMemPoolSetAccess" => f!(11020, mem::cuMemPoolSetAccess),
        "cuMemAllocAsync" => f!(11020, mem::cuMemAllocAsync),
        "cuMemAllocFromPoolAsync" => f!(11020, mem::cuMemAllocFromPoolAsync),
        "cuMemFreeAsync" => f!(11020, mem::cuMemFreeAsync),
        "cuPointerGetAttribute" => f!(4000, mem::cuPointerGetAttribute),

        "cuMemsetD8Async" => f!(3020, xfer::cuMemsetD8Async),
        "cuMemsetD16Async" => f!(3020, xfer::cuMemsetD16Async),
        "cuMemsetD32Async" => f!(3020, xfer::cuMemsetD32Async),
        "cuMemcpyHtoD" => f!(3020, xfer::cuMemcpyHtoD),
        "cuMemcpyDtoH" => f!(3020, xfer::cuMemcpyDtoH),
        "cuMemcpyHtoDAsync" => f!(3020, xfer::cuMemcpyHtoDAsync),
        "cuMemcpyDtoHAsync" => f!(3020, xfer::cuMemcpyDtoHAsync),
        "cuMemcpyDtoDAsync" => f!(3020, xfer::cuMemcpyDtoDAsync),
        "cuMemcpyAsync" => f!(4000, xfer::cuMemcpyAsync),
        "cuMemcpyPeerAsync" => f!(4000, xfer::cuMemcpyPeerAsync),

        "cuGraphCreate" => f!(10000, graph::cuGraphCreate),
        "cuGraphDestroy" => f!(10000, graph::cuGraphDestroy),
        "cuGraphAddKernelNode" => f!(10000, graph::cuGraphAddKernelNode),
        "cuGraphAddMemsetNode" => f!(10000, graph::cuGraphAddMemsetNode),
        "cuGraphAddMemcpyNode" => f!(10000, graph::cuGraphAddMemcpyNode),
        "cuGraphAddEmptyNode" => f!(10000, graph::cuGraphAddEmptyNode),
        "cuGraphAddEventRecordNode" => f!(11010, graph::cuGraphAddEventRecordNode),
        "cuGraphAddEventWaitNode" => f!(11010, graph::cuGraphAddEventWaitNode),
        "cuGraphAddDependencies" => f!(10000, graph::cuGraphAddDependencies),
        "cuGraphInstantiateWithFlags" => f!(11040, graph::cuGraphInstantiateWithFlags),
        "cuGraphLaunch" => f!(10000, graph::cuGraphLaunch),
        "cuGraphUpload" => f!(11010, graph::cuGraphUpload),
        "cuGraphExecDestroy" => f!(10000, graph::cuGraphExecDestroy),
        "cuGraphGetNodes" => f!(10000, graph::cuGraphGetNodes),
        "cuGraphAddChildGraphNode" => f!(10000, graph::cuGraphAddChildGraphNode),
        "cuGraphDestroyNode" => f!(10000, graph::cuGraphDestroyNode),
        "cuStreamBeginCaptureToGraph" => f!(12030, stream::cuStreamBeginCaptureToGraph),
        "cuStreamEndCapture" => f!(10000, stream::cuStreamEndCapture),
        "cuStreamIsCapturing" => f!(10000, stream::cuStreamIsCapturing),
        // The CUDA 12.3 form (with edge data), the one cuhal's table asks for.
        "cuStreamGetCaptureInfo" => f!(12030, stream::cuStreamGetCaptureInfo),
        "cuGraphExecKernelNodeSetParams" => f!(10010, graph::cuGraphExecKernelNodeSetParams),
        "cuGraphExecMemsetNodeSetParams" => f!(10020, graph::cuGraphExecMemsetNodeSetParams),
        "cuGraphExecMemcpyNodeSetParams" => f!(10020, graph::cuGraphExecMemcpyNodeSetParams),
        "cuGraphExecChildGraphNodeSetParams" => {
            f!(11010, graph::cuGraphExecChildGraphNodeSetParams)
        }
        "cuGraphClone" => f!(10000, graph::cuGraphClone),
        "cuGraphNodeFindInClone" => f!(10000, graph::cuGraphNodeFindInClone),
        "cuGraphGetRootNodes" => f!(10000, graph::cuGraphGetRootNodes),
        "cuGraphNodeSetEnabled" => f!(11060, graph::cuGraphNodeSetEnabled),
        "cuGraphNodeGetType" => f!(10000, graph::cuGraphNodeGetType),

        "cuModuleLoadData" => f!(2000, modl::cuModuleLoadData),
        "cuModuleLoadDataEx" => f!(2010, modl::cuModuleLoadDataEx),
        "cuModuleGetFunction" => f!(2000, modl::cuModuleGetFunction),
        "cuModuleUnload" => f!(2000, modl::cuModuleUnload),
        "cuFuncGetAttribute" => f!(2020, modl::cuFuncGetAttribute),
        "cuFuncGetParamInfo" => f!(12040, modl::cuFuncGetParamInfo),
        "cuFuncGetParamCount" => f!(13000, modl::cuFuncGetParamCount),
        "cuFuncSetAttribute" => f!(9000, modl::cuFuncSetAttribute),
        "cuLaunchKernel" => f!(4000, modl::cuLaunchKernel),
        "cuLaunchKernelEx" => f!(11080, modl::cuLaunchKernelEx),
        "cuOccupancyMaxActiveBlocksPerMultiprocessor" => {
            f!(6050, modl::cuOccupancyMaxActiveBlocksPerMultiprocessor)
        }
        "cuOccupancyMaxActiveClusters" => f!(11080, modl::cuOccupancyMaxActiveClusters),
        "cuGraphKernelNodeSetAttribute" => f!(11000, graph::cuGraphKernelNodeSetAttribute),
        "cuGraphKernelNodeGetAttribute" => f!(11000, graph::cuGraphKernelNodeGetAttribute),

        // An entry point newer than CUDA 12.0, to test version-gated lookups.
        "cuFakeSince13" => f!(13000, not_supported),
        _ => return None,
    })
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
    // CUDA 12.3 gave cuGraphAddDependencies edge data: asked for that ABI, the driver returns
    // the newer variant under the same name.
    let versioned = match name.as_str() {
        "cuGraphAddDependencies" if cuda_version >= 12030 => Some((
            12030,
            crate::graph::cuGraphAddDependencies_v2 as *mut c_void,
        )),
        _ => implemented(&name),
    };
    match versioned {
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
