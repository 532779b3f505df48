//! The driver's function table, resolved once at load time.
//!
//! Every entry is looked up with `cuGetProcAddress` (the `_v2` form where the driver has it)
//! under [`TABLE_CUDA_VERSION`], the CUDA version whose signatures this table was written
//! from. The driver then hands back the variant with exactly those signatures (the `_v2`
//! `cuMemAlloc`, CUDA 12's `cuGraphExecUpdate`, ...), whichever newer variants it also has;
//! this is how IREE's `cuda_dynamic_symbols.c` resolves, and it is why the table never names
//! a suffixed symbol. Only `cuGetProcAddress` itself comes from `dlsym`.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::fmt;
use std::path::{Path, PathBuf};

use libloading::Library;

use crate::CUresult;
use crate::error::Error;
use crate::types::*;

/// The CUDA version the table's signatures are written for (12.0).
pub const TABLE_CUDA_VERSION: i32 = 12000;

/// The environment variable that names the driver library to load instead of the defaults.
pub const LIBRARY_ENV: &str = "CUHAL_CUDA_LIBRARY";

/// Library names tried, in order, when [`LIBRARY_ENV`] is not set.
pub const DEFAULT_LIBRARIES: &[&str] = &["libcuda.so.1", "libcuda.so"];

type GetProcAddressV2 = unsafe extern "C" fn(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut CUdriverProcAddressQueryResult,
) -> CUresult;
type GetProcAddressV1 = unsafe extern "C" fn(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult;

/// How symbols are resolved: the driver's `cuGetProcAddress`, in whichever form it has.
#[derive(Copy, Clone)]
enum Resolver {
    V2(GetProcAddressV2),
    V1(GetProcAddressV1),
}

impl Resolver {
    /// Returns the entry point for `name` under `version`, or null if the driver has none.
    fn resolve(self, name: &CStr, version: c_int) -> *mut c_void {
        let mut pfn: *mut c_void = std::ptr::null_mut();
        let result = match self {
            Resolver::V2(get) => {
                let mut status = CU_GET_PROC_ADDRESS_SUCCESS;
                // SAFETY: `get` is the driver's cuGetProcAddress_v2 with the signature from
                // cuda.h; `name` is NUL-terminated and both out-pointers are valid locals.
                let r = unsafe {
                    get(
                        name.as_ptr(),
                        &mut pfn,
                        version,
                        CU_GET_PROC_ADDRESS_DEFAULT,
                        &mut status,
                    )
                };
                if status != CU_GET_PROC_ADDRESS_SUCCESS {
                    return std::ptr::null_mut();
                }
                r
            }
            // SAFETY: as above, for the v1 signature (no status out-parameter).
            Resolver::V1(get) => unsafe {
                get(
                    name.as_ptr(),
                    &mut pfn,
                    version,
                    CU_GET_PROC_ADDRESS_DEFAULT,
                )
            },
        };
        if result.is_success() {
            pfn
        } else {
            std::ptr::null_mut()
        }
    }
}

/// The driver symbol an optional entry resolves: its field name, or the name after `as` when
/// the field is a newer variant of a symbol the table already has under its own name.
macro_rules! symbol_name {
    ($field:ident) => {
        stringify!($field)
    };
    ($field:ident, $symbol:literal) => {
        $symbol
    };
}

macro_rules! driver_api {
    (
        required {
            $( $(#[$rdoc:meta])* fn $rname:ident ( $($rarg:ident : $rty:ty),* $(,)? ); )*
        }
        optional {
            $( $(#[$odoc:meta])* fn $oname:ident ( $($oarg:ident : $oty:ty),* $(,)? ) since $over:literal $(as $osym:literal)?; )*
        }
    ) => {
        /// The driver's function table.
        ///
        /// Fields are the driver's entry points, named as in `cuda.h` without version suffixes.
        /// Calling one is `unsafe`: the caller upholds that function's contract from the CUDA
        /// driver API reference. Optional entries (newer than CUDA 12.0) are `None` on drivers
        /// that lack them. The library stays loaded for the rest of the process.
        #[allow(non_snake_case)]
        pub struct DriverApi {
            $( $(#[$rdoc])* pub $rname: unsafe extern "C" fn($($rty),*) -> CUresult, )*
            $( $(#[$odoc])* pub $oname: Option<unsafe extern "C" fn($($oty),*) -> CUresult>, )*
            driver_version: i32,
            path: String,
            resolver: Resolver,
            // Never unloaded: every pointer above points into it.
            _library: &'static Library,
        }

        impl DriverApi {
            /// Resolves every entry of the table through `resolver`.
            fn resolve_table(
                resolver: Resolver,
                library: &'static Library,
                path: String,
                driver_version: i32,
            ) -> Result<Self, Error> {
                $(
                    let ptr = resolver.resolve(
                        // SAFETY: the literal ends in the NUL that concat! adds.
                        unsafe { CStr::from_bytes_with_nul_unchecked(concat!(stringify!($rname), "\0").as_bytes()) },
                        TABLE_CUDA_VERSION,
                    );
                    if ptr.is_null() {
                        return Err(Error::MissingSymbol {
                            symbol: stringify!($rname),
                            library: path,
                            driver_version: (driver_version > 0).then_some(driver_version),
                        });
                    }
                    // SAFETY: the driver returned this entry point for the CUDA version whose
                    // signature the field declares; fn pointers and data pointers have the same
                    // size and representation on every platform CUDA supports.
                    #[allow(non_snake_case)]
                    let $rname = unsafe {
                        std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($rty),*) -> CUresult>(ptr)
                    };
                )*
                $(
                    let ptr = resolver.resolve(
                        // SAFETY: the literal ends in the NUL that concat! adds.
                        unsafe { CStr::from_bytes_with_nul_unchecked(concat!(symbol_name!($oname $(, $osym)?), "\0").as_bytes()) },
                        $over,
                    );
                    // A driver older than the entry's version may hand back an older variant
                    // with another signature: such an entry is absent.
                    #[allow(non_snake_case)]
                    let $oname = if ptr.is_null() || driver_version < $over {
                        None
                    } else {
                        // SAFETY: as for required entries, under the version named in the table.
                        Some(unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($oty),*) -> CUresult>(ptr)
                        })
                    };
                )*
                Ok(Self {
                    $($rname,)*
                    $($oname,)*
                    driver_version,
                    path,
                    resolver,
                    _library: library,
                })
            }

            /// The names of every required entry, in table order.
            pub const REQUIRED_SYMBOLS: &'static [&'static str] = &[$(stringify!($rname)),*];
            /// The driver symbols of every optional entry, in table order.
            pub const OPTIONAL_SYMBOLS: &'static [&'static str] = &[$(symbol_name!($oname $(, $osym)?)),*];
        }
    };
}

driver_api! {
    required {
        /// `cuGetErrorName(result, &name)`.
        fn cuGetErrorName(error: CUresult, name: *mut *const c_char);
        /// `cuGetErrorString(result, &description)`.
        fn cuGetErrorString(error: CUresult, description: *mut *const c_char);
        /// `cuInit(flags)`: must be 0.
        fn cuInit(flags: c_uint);
        /// `cuDriverGetVersion(&version)`.
        fn cuDriverGetVersion(version: *mut c_int);

        /// `cuDeviceGetCount(&count)`.
        fn cuDeviceGetCount(count: *mut c_int);
        /// `cuDeviceGet(&device, ordinal)`.
        fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int);
        /// `cuDeviceGetName(buffer, len, device)`.
        fn cuDeviceGetName(name: *mut c_char, len: c_int, device: CUdevice);
        /// `cuDeviceGetUuid(&uuid, device)`.
        fn cuDeviceGetUuid(uuid: *mut CUuuid, device: CUdevice);
        /// `cuDeviceTotalMem(&bytes, device)`.
        fn cuDeviceTotalMem(bytes: *mut usize, device: CUdevice);
        /// `cuDeviceGetAttribute(&value, attribute, device)`.
        fn cuDeviceGetAttribute(value: *mut c_int, attribute: CUdevice_attribute, device: CUdevice);
        /// `cuDeviceGetPCIBusId(buffer, len, device)`.
        fn cuDeviceGetPCIBusId(bus_id: *mut c_char, len: c_int, device: CUdevice);
        /// `cuDeviceCanAccessPeer(&can, device, peer)`.
        fn cuDeviceCanAccessPeer(can_access: *mut c_int, device: CUdevice, peer: CUdevice);

        /// `cuDevicePrimaryCtxRetain(&context, device)`.
        fn cuDevicePrimaryCtxRetain(context: *mut CUcontext, device: CUdevice);
        /// `cuDevicePrimaryCtxRelease(device)`.
        fn cuDevicePrimaryCtxRelease(device: CUdevice);
        /// `cuDevicePrimaryCtxGetState(device, &flags, &active)`.
        fn cuDevicePrimaryCtxGetState(device: CUdevice, flags: *mut c_uint, active: *mut c_int);
        /// `cuCtxSetCurrent(context)`.
        fn cuCtxSetCurrent(context: CUcontext);
        /// `cuCtxGetCurrent(&context)`.
        fn cuCtxGetCurrent(context: *mut CUcontext);
        /// `cuCtxPushCurrent(context)`.
        fn cuCtxPushCurrent(context: CUcontext);
        /// `cuCtxPopCurrent(&context)`.
        fn cuCtxPopCurrent(context: *mut CUcontext);
        /// `cuCtxGetDevice(&device)`.
        fn cuCtxGetDevice(device: *mut CUdevice);
        /// `cuCtxSynchronize()`.
        fn cuCtxSynchronize();
        /// `cuCtxGetStreamPriorityRange(&least, &greatest)`.
        fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int);
        /// `cuCtxEnablePeerAccess(peer_context, flags)`.
        fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint);
        /// `cuCtxDisablePeerAccess(peer_context)`.
        fn cuCtxDisablePeerAccess(peer: CUcontext);
        /// `cuDeviceGetP2PAttribute(&value, attribute, source, destination)`.
        fn cuDeviceGetP2PAttribute(value: *mut c_int, attribute: CUdevice_P2PAttribute, source: CUdevice, destination: CUdevice);
        /// `cuMemcpyPeerAsync(dst, dst_context, src, src_context, bytes, stream)`: a copy
        /// between two devices' memory (direct over the link when peer access is enabled).
        fn cuMemcpyPeerAsync(dst: CUdeviceptr, dst_context: CUcontext, src: CUdeviceptr, src_context: CUcontext, bytes: usize, stream: CUstream);

        /// `cuStreamCreate(&stream, flags)`.
        fn cuStreamCreate(stream: *mut CUstream, flags: c_uint);
        /// `cuStreamCreateWithPriority(&stream, flags, priority)`.
        fn cuStreamCreateWithPriority(stream: *mut CUstream, flags: c_uint, priority: c_int);
        /// `cuStreamDestroy(stream)`.
        fn cuStreamDestroy(stream: CUstream);
        /// `cuStreamSynchronize(stream)`.
        fn cuStreamSynchronize(stream: CUstream);
        /// `cuStreamQuery(stream)`: `CUDA_SUCCESS` when idle, `CUDA_ERROR_NOT_READY` when busy.
        fn cuStreamQuery(stream: CUstream);
        /// `cuStreamWaitEvent(stream, event, flags)`.
        fn cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint);

        /// `cuEventCreate(&event, flags)`.
        fn cuEventCreate(event: *mut CUevent, flags: c_uint);
        /// `cuEventRecord(event, stream)`.
        fn cuEventRecord(event: CUevent, stream: CUstream);
        /// `cuEventRecordWithFlags(event, stream, flags)`.
        fn cuEventRecordWithFlags(event: CUevent, stream: CUstream, flags: c_uint);
        /// `cuEventQuery(event)`: `CUDA_SUCCESS` when complete, `CUDA_ERROR_NOT_READY` when not.
        fn cuEventQuery(event: CUevent);
        /// `cuEventSynchronize(event)`.
        fn cuEventSynchronize(event: CUevent);
        /// `cuEventElapsedTime(&milliseconds, start, end)`.
        fn cuEventElapsedTime(milliseconds: *mut f32, start: CUevent, end: CUevent);
        /// `cuEventDestroy(event)`.
        fn cuEventDestroy(event: CUevent);

        /// `cuGraphCreate(&graph, flags)`.
        fn cuGraphCreate(graph: *mut CUgraph, flags: c_uint);
        /// `cuGraphDestroy(graph)`.
        fn cuGraphDestroy(graph: CUgraph);
        /// `cuGraphAddKernelNode(&node, graph, deps, num_deps, &params)`.
        fn cuGraphAddKernelNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, num_deps: usize, params: *const CUDA_KERNEL_NODE_PARAMS);
        /// `cuGraphAddMemsetNode(&node, graph, deps, num_deps, &params, context)`.
        fn cuGraphAddMemsetNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, num_deps: usize, params: *const CUDA_MEMSET_NODE_PARAMS, context: CUcontext);
        /// `cuGraphAddMemcpyNode(&node, graph, deps, num_deps, &params, context)`.
        fn cuGraphAddMemcpyNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, num_deps: usize, params: *const CUDA_MEMCPY3D, context: CUcontext);
        /// `cuGraphAddEmptyNode(&node, graph, deps, num_deps)`.
        fn cuGraphAddEmptyNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, num_deps: usize);
        /// `cuGraphAddChildGraphNode(&node, graph, deps, num_deps, child)`: clones `child`.
        fn cuGraphAddChildGraphNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, num_deps: usize, child: CUgraph);
        /// `cuGraphAddEventWaitNode(&node, graph, deps, num_deps, event)`.
        fn cuGraphAddEventWaitNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, num_deps: usize, event: CUevent);
        /// `cuGraphAddDependencies(graph, from, to, count)`.
        fn cuGraphAddDependencies(graph: CUgraph, from: *const CUgraphNode, to: *const CUgraphNode, count: usize);
        /// `cuGraphInstantiateWithFlags(&exec, graph, flags)`.
        fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: u64);
        /// `cuGraphLaunch(exec, stream)`.
        fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream);
        /// `cuGraphUpload(exec, stream)`.
        fn cuGraphUpload(exec: CUgraphExec, stream: CUstream);
        /// `cuGraphExecUpdate(exec, graph, &result_info)` (CUDA 12 signature).
        fn cuGraphExecUpdate(exec: CUgraphExec, graph: CUgraph, result_info: *mut CUgraphExecUpdateResultInfo);
        /// `cuGraphExecKernelNodeSetParams(exec, node, &params)`.
        fn cuGraphExecKernelNodeSetParams(exec: CUgraphExec, node: CUgraphNode, params: *const CUDA_KERNEL_NODE_PARAMS);
        /// `cuGraphExecMemcpyNodeSetParams(exec, node, &params, context)`.
        fn cuGraphExecMemcpyNodeSetParams(exec: CUgraphExec, node: CUgraphNode, params: *const CUDA_MEMCPY3D, context: CUcontext);
        /// `cuGraphExecMemsetNodeSetParams(exec, node, &params, context)`.
        fn cuGraphExecMemsetNodeSetParams(exec: CUgraphExec, node: CUgraphNode, params: *const CUDA_MEMSET_NODE_PARAMS, context: CUcontext);
        /// `cuGraphExecChildGraphNodeSetParams(exec, node, child)`: the child graph node `node`
        /// of `exec` runs (a copy of) `child` from the next launch; `child` must have the
        /// node's topology.
        fn cuGraphExecChildGraphNodeSetParams(exec: CUgraphExec, node: CUgraphNode, child: CUgraph);
        /// `cuGraphExecDestroy(exec)`.
        fn cuGraphExecDestroy(exec: CUgraphExec);

        /// `cuMemAlloc(&address, bytes)`.
        fn cuMemAlloc(address: *mut CUdeviceptr, bytes: usize);
        /// `cuMemFree(address)`.
        fn cuMemFree(address: CUdeviceptr);
        /// `cuMemAllocHost(&pointer, bytes)`: pinned host memory.
        fn cuMemAllocHost(pointer: *mut *mut c_void, bytes: usize);
        /// `cuMemHostAlloc(&pointer, bytes, flags)`.
        fn cuMemHostAlloc(pointer: *mut *mut c_void, bytes: usize, flags: c_uint);
        /// `cuMemFreeHost(pointer)`.
        fn cuMemFreeHost(pointer: *mut c_void);
        /// `cuMemHostRegister(pointer, bytes, flags)`.
        fn cuMemHostRegister(pointer: *mut c_void, bytes: usize, flags: c_uint);
        /// `cuMemHostUnregister(pointer)`.
        fn cuMemHostUnregister(pointer: *mut c_void);
        /// `cuMemHostGetDevicePointer(&address, pointer, flags)`.
        fn cuMemHostGetDevicePointer(address: *mut CUdeviceptr, pointer: *mut c_void, flags: c_uint);
        /// `cuMemGetInfo(&free, &total)`.
        fn cuMemGetInfo(free: *mut usize, total: *mut usize);
        /// `cuMemsetD8Async(address, value, count, stream)`.
        fn cuMemsetD8Async(address: CUdeviceptr, value: u8, count: usize, stream: CUstream);
        /// `cuMemsetD16Async(address, value, count, stream)`.
        fn cuMemsetD16Async(address: CUdeviceptr, value: u16, count: usize, stream: CUstream);
        /// `cuMemsetD32Async(address, value, count, stream)`.
        fn cuMemsetD32Async(address: CUdeviceptr, value: c_uint, count: usize, stream: CUstream);
        /// `cuMemcpyHtoD(dst, src, bytes)`: synchronous.
        fn cuMemcpyHtoD(dst: CUdeviceptr, src: *const c_void, bytes: usize);
        /// `cuMemcpyDtoH(dst, src, bytes)`: synchronous.
        fn cuMemcpyDtoH(dst: *mut c_void, src: CUdeviceptr, bytes: usize);
        /// `cuMemcpyHtoDAsync(dst, src, bytes, stream)`.
        fn cuMemcpyHtoDAsync(dst: CUdeviceptr, src: *const c_void, bytes: usize, stream: CUstream);
        /// `cuMemcpyDtoHAsync(dst, src, bytes, stream)`.
        fn cuMemcpyDtoHAsync(dst: *mut c_void, src: CUdeviceptr, bytes: usize, stream: CUstream);
        /// `cuMemcpyDtoDAsync(dst, src, bytes, stream)`.
        fn cuMemcpyDtoDAsync(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: CUstream);
        /// `cuMemcpyAsync(dst, src, bytes, stream)`: unified addressing.
        fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: CUstream);
        /// `cuDeviceGetDefaultMemPool(&pool, device)`.
        fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, device: CUdevice);
        /// `cuMemPoolCreate(&pool, &props)`.
        fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps);
        /// `cuMemPoolDestroy(pool)`.
        fn cuMemPoolDestroy(pool: CUmemoryPool);
        /// `cuMemPoolSetAttribute(pool, attribute, &value)`.
        fn cuMemPoolSetAttribute(pool: CUmemoryPool, attribute: CUmemPool_attribute, value: *mut c_void);
        /// `cuMemPoolTrimTo(pool, min_bytes_to_keep)`.
        fn cuMemPoolTrimTo(pool: CUmemoryPool, min_bytes_to_keep: usize);
        /// `cuMemPoolSetAccess(pool, descs, count)`: which other devices reach the pool's memory.
        fn cuMemPoolSetAccess(pool: CUmemoryPool, descs: *const CUmemAccessDesc, count: usize);
        /// `cuMemAllocAsync(&address, bytes, stream)`.
        fn cuMemAllocAsync(address: *mut CUdeviceptr, bytes: usize, stream: CUstream);
        /// `cuMemAllocFromPoolAsync(&address, bytes, pool, stream)`.
        fn cuMemAllocFromPoolAsync(address: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream);
        /// `cuMemFreeAsync(address, stream)`.
        fn cuMemFreeAsync(address: CUdeviceptr, stream: CUstream);

        /// `cuModuleLoadData(&module, image)`.
        fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void);
        /// `cuModuleLoadDataEx(&module, image, num_options, options, values)`.
        fn cuModuleLoadDataEx(module: *mut CUmodule, image: *const c_void, num_options: c_uint, options: *mut CUjit_option, values: *mut *mut c_void);
        /// `cuModuleGetFunction(&function, module, name)`.
        fn cuModuleGetFunction(function: *mut CUfunction, module: CUmodule, name: *const c_char);
        /// `cuModuleUnload(module)`.
        fn cuModuleUnload(module: CUmodule);
        /// `cuFuncGetAttribute(&value, attribute, function)`.
        fn cuFuncGetAttribute(value: *mut c_int, attribute: CUfunction_attribute, function: CUfunction);
        /// `cuFuncSetAttribute(function, attribute, value)`.
        fn cuFuncSetAttribute(function: CUfunction, attribute: CUfunction_attribute, value: c_int);

        /// `cuLaunchKernel(f, grid xyz, block xyz, shared_bytes, stream, params, extra)`.
        fn cuLaunchKernel(function: CUfunction, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint, block_x: c_uint, block_y: c_uint, block_z: c_uint, shared_bytes: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void);
        /// `cuLaunchHostFunc(stream, fn, user_data)`. cuhal never calls the driver from one.
        fn cuLaunchHostFunc(stream: CUstream, function: CUhostFn, user_data: *mut c_void);

        /// `cuPointerGetAttribute(&data, attribute, pointer)`: what the driver knows of an address.
        fn cuPointerGetAttribute(data: *mut c_void, attribute: CUpointer_attribute, pointer: CUdeviceptr);
        /// `cuStreamEndCapture(stream, &graph)`: ends a capture (also an invalidated one).
        fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph);
        /// `cuStreamIsCapturing(stream, &status)`.
        fn cuStreamIsCapturing(stream: CUstream, status: *mut CUstreamCaptureStatus);
        /// `cuGraphGetNodes(graph, nodes, &count)`: with null `nodes`, only the count.
        fn cuGraphGetNodes(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize);
        /// `cuGraphDestroyNode(node)`: removes a node and its edges from its graph.
        fn cuGraphDestroyNode(node: CUgraphNode);
    }
    optional {
        /// `cuGraphAddEventRecordNode(&node, graph, deps, num_deps, event)` (CUDA 11.1 drivers and
        /// later): only tracing zones inside graphs need it, so a driver without it still loads
        /// and graph tracing is refused with [`Error::MissingSymbol`] naming it.
        fn cuGraphAddEventRecordNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, num_deps: usize, event: CUevent) since 11010;
        /// `cuFuncGetParamInfo(function, index, &offset, &size)` (CUDA 12.4 drivers and later):
        /// the layout of a kernel's parameters, for checking arguments before a launch.
        fn cuFuncGetParamInfo(function: CUfunction, index: usize, offset: *mut usize, size: *mut usize) since 12040;
        /// `cuFuncGetParamCount(function, &count)` (CUDA 13.0 drivers): how many parameters a
        /// kernel has, so their layout is read without probing past the last one (each failing
        /// probe is an API error that compute-sanitizer reports).
        fn cuFuncGetParamCount(function: CUfunction, count: *mut usize) since 13000;
        /// `cuStreamGetId(stream, &id)` (CUDA 12.0 drivers and later).
        fn cuStreamGetId(stream: CUstream, id: *mut u64) since 12000;
        /// `cuStreamWriteValue32(stream, address, value, flags)`, the CUDA 12 form (no device
        /// attribute needed): writes a 32-bit word in stream order.
        fn cuStreamWriteValue32(stream: CUstream, address: CUdeviceptr, value: c_uint, flags: c_uint) since 12000;
        /// `cuStreamWaitValue32(stream, address, value, flags)`, the CUDA 12 form: later work on
        /// the stream waits until the word compares to `value` as `flags` says.
        fn cuStreamWaitValue32(stream: CUstream, address: CUdeviceptr, value: c_uint, flags: c_uint) since 12000;
        /// `cuGraphDebugDotPrint(graph, path, flags)`: writes a graph as Graphviz DOT, for debugging.
        fn cuGraphDebugDotPrint(graph: CUgraph, path: *const c_char, flags: c_uint) since 12000;
        /// `cuStreamBeginCaptureToGraph(stream, graph, deps, edge_data, num_deps, mode)` (CUDA 12.3
        /// drivers and later): captures a stream's work into an existing graph, after `deps`.
        fn cuStreamBeginCaptureToGraph(stream: CUstream, graph: CUgraph, deps: *const CUgraphNode, edge_data: *const CUgraphEdgeData, num_deps: usize, mode: CUstreamCaptureMode) since 12030;
        /// `cuStreamGetCaptureInfo(stream, &status, &id, &graph, &deps, &edge_data, &num_deps)`,
        /// the CUDA 12.3 form: the nodes the next captured operation would depend on.
        fn cuStreamGetCaptureInfo(stream: CUstream, status: *mut CUstreamCaptureStatus, id: *mut u64, graph: *mut CUgraph, deps: *mut *const CUgraphNode, edge_data: *mut *const CUgraphEdgeData, num_deps: *mut usize) since 12030;
        /// `cuLaunchKernelEx(&config, f, params, extra)` (CUDA 11.8): a launch with attributes
        /// (clusters, cooperative, programmatic dependent launch, priority).
        fn cuLaunchKernelEx(config: *const CUlaunchConfig, function: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) since 11080;
        /// `cuGraphKernelNodeSetAttribute(node, id, &value)` (CUDA 11.0; clusters, priority and
        /// device-updatable nodes need newer drivers).
        fn cuGraphKernelNodeSetAttribute(node: CUgraphNode, id: CUlaunchAttributeID, value: *const CUlaunchAttributeValue) since 11000;
        /// `cuGraphKernelNodeGetAttribute(node, id, &value)` (CUDA 11.0): reads back, among
        /// others, a device-updatable node's device handle.
        fn cuGraphKernelNodeGetAttribute(node: CUgraphNode, id: CUlaunchAttributeID, value: *mut CUlaunchAttributeValue) since 11000;
        /// `cuGraphAddDependencies_v2(graph, from, to, edge_data, count)` (CUDA 12.3): edges with
        /// a type, for programmatic dependencies between kernel nodes.
        fn cuGraphAddDependencies_v2(graph: CUgraph, from: *const CUgraphNode, to: *const CUgraphNode, edge_data: *const CUgraphEdgeData, count: usize) since 12030 as "cuGraphAddDependencies";
        /// `cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, block_size, dynamic_shared)`:
        /// the cooperative launch limit is this times the multiprocessor count.
        fn cuOccupancyMaxActiveBlocksPerMultiprocessor(blocks: *mut c_int, function: CUfunction, block_size: c_int, dynamic_shared: usize) since 6050;
        /// `cuOccupancyMaxActiveClusters(&clusters, f, &config)` (CUDA 11.8): 0 when a cluster of
        /// that shape cannot be resident at all.
        fn cuOccupancyMaxActiveClusters(clusters: *mut c_int, function: CUfunction, config: *const CUlaunchConfig) since 11080;
        /// `cuGraphClone(&clone, graph)` (CUDA 10.0): a graph per executable when a graph can
        /// be instantiated only once (device-updatable nodes, for binding patches on the device).
        fn cuGraphClone(clone: *mut CUgraph, graph: CUgraph) since 10000;
        /// `cuGraphNodeFindInClone(&node, original, clone)` (CUDA 10.0).
        fn cuGraphNodeFindInClone(node: *mut CUgraphNode, original: CUgraphNode, clone: CUgraph) since 10000;
        /// `cuGraphGetRootNodes(graph, nodes, &count)` (CUDA 10.0): with null `nodes`, the count.
        fn cuGraphGetRootNodes(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize) since 10000;
        /// `cuGraphNodeSetEnabled(exec, node, enabled)` (CUDA 11.6): later launches of `exec` skip
        /// a disabled kernel, memset or memcpy node.
        fn cuGraphNodeSetEnabled(exec: CUgraphExec, node: CUgraphNode, enabled: c_uint) since 11060;
        /// `cuGraphNodeGetType(node, &type)` (CUDA 10.0): the node's `CU_GRAPH_NODE_TYPE_*`.
        fn cuGraphNodeGetType(node: CUgraphNode, kind: *mut c_uint) since 10000;
    }
}

impl DriverApi {
    /// Loads the driver from [`LIBRARY_ENV`] if set, else from [`DEFAULT_LIBRARIES`], resolves
    /// the table and initializes the driver (`cuInit(0)`).
    pub fn load() -> Result<Self, Error> {
        match std::env::var_os(LIBRARY_ENV) {
            Some(path) if !path.is_empty() => Self::load_from(PathBuf::from(path)),
            _ => Self::load_first(DEFAULT_LIBRARIES.iter().map(PathBuf::from)),
        }
    }

    /// Loads the driver from exactly `path`, resolves the table and calls `cuInit(0)`.
    pub fn load_from(path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::load_first(std::iter::once(path.as_ref().to_path_buf()))
    }

    fn load_first(candidates: impl Iterator<Item = PathBuf>) -> Result<Self, Error> {
        // Never unloaded (as CUPTI and cuBLAS are not): `cuInit` starts driver threads and
        // registers exit-time work that point into the library.
        // SAFETY: opening the library runs its initializers; the CUDA driver's (and the test
        // driver's) have no preconditions on the calling program.
        match unsafe { crate::library::open_first(candidates) } {
            Ok((library, path)) => Self::from_library(library, path),
            Err(tried) => Err(Error::LibraryNotFound { tried }),
        }
    }

    fn from_library(library: &'static Library, path: String) -> Result<Self, Error> {
        // SAFETY: the symbol types match the declarations of cuGetProcAddress_v2 and
        // cuGetProcAddress in cuda.h; the pointers are copied out while `library` lives and
        // `library` is moved into the table that uses them.
        let resolver = unsafe {
            if let Ok(v2) = library.get::<GetProcAddressV2>(b"cuGetProcAddress_v2\0") {
                Resolver::V2(*v2)
            } else if let Ok(v1) = library.get::<GetProcAddressV1>(b"cuGetProcAddress\0") {
                Resolver::V1(*v1)
            } else {
                return Err(Error::MissingSymbol {
                    symbol: "cuGetProcAddress",
                    library: path,
                    driver_version: None,
                });
            }
        };
        let get_version = resolver.resolve(c"cuDriverGetVersion", TABLE_CUDA_VERSION);
        let mut driver_version = 0;
        if !get_version.is_null() {
            // SAFETY: the driver returned cuDriverGetVersion, whose signature is
            // `CUresult (int*)`; `driver_version` is a valid out-pointer.
            let r = unsafe {
                let f = std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(*mut c_int) -> CUresult,
                >(get_version);
                f(&mut driver_version)
            };
            if !r.is_success() {
                driver_version = 0;
            }
        }
        let api = Self::resolve_table(resolver, library, path, driver_version)?;
        // SAFETY: cuInit takes a flags word that must be 0.
        unsafe { crate::cu!(api, cuInit(0)) }?;
        Ok(api)
    }

    /// The driver's CUDA version as `cuDriverGetVersion` reports it (e.g. 13000 for 13.0), or 0
    /// if the driver could not say.
    pub fn driver_version(&self) -> i32 {
        self.driver_version
    }

    /// The error for an optional entry that this driver lacks, for the feature that needs it.
    pub fn missing_symbol(&self, symbol: &'static str) -> Error {
        Error::MissingSymbol {
            symbol,
            library: self.path.clone(),
            driver_version: (self.driver_version > 0).then_some(self.driver_version),
        }
    }

    /// The library the table was loaded from.
    pub fn library_path(&self) -> &str {
        &self.path
    }

    /// `Ok(())` for `CUDA_SUCCESS`, else an [`Error::Cuda`] naming `call` with the driver's
    /// name and description of `result`.
    #[inline]
    pub fn check(&self, call: &'static str, result: CUresult) -> Result<(), Error> {
        if result.is_success() {
            Ok(())
        } else {
            Err(self.error(call, result))
        }
    }

    /// `Ok(true)` for `CUDA_SUCCESS`, `Ok(false)` for `CUDA_ERROR_NOT_READY` (a query's "not
    /// yet"), else an [`Error::Cuda`] naming `call`.
    #[inline]
    pub fn check_ready(&self, call: &'static str, result: CUresult) -> Result<bool, Error> {
        match result {
            CUresult::SUCCESS => Ok(true),
            CUresult::ERROR_NOT_READY => Ok(false),
            other => Err(self.error(call, other)),
        }
    }

    /// Builds the [`Error::Cuda`] for a failed `call`.
    #[cold]
    pub fn error(&self, call: &'static str, result: CUresult) -> Error {
        Error::Cuda {
            call,
            result,
            name: self.error_name(result),
            description: self.error_description(result),
        }
    }

    /// The driver's name for `result` (`cuGetErrorName`), or this crate's if the driver has none.
    pub fn error_name(&self, result: CUresult) -> String {
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a pointer to a static string (or leaves it null).
        let r = unsafe { (self.cuGetErrorName)(result, &mut text) };
        // SAFETY: on success the driver returned a NUL-terminated static string.
        match unsafe { static_text(r, text) } {
            Some(name) => name,
            None => result
                .known_name()
                .map(str::to_owned)
                .unwrap_or_else(|| format!("CUresult({})", result.0)),
        }
    }

    /// The driver's description of `result` (`cuGetErrorString`).
    pub fn error_description(&self, result: CUresult) -> String {
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorString writes a pointer to a static string (or leaves it null).
        let r = unsafe { (self.cuGetErrorString)(result, &mut text) };
        // SAFETY: on success the driver returned a NUL-terminated static string.
        unsafe { static_text(r, text) }.unwrap_or_else(|| "unrecognized error code".to_owned())
    }

    /// Resolves one more symbol by name under `cuda_version`, for callers that need an entry
    /// point this table lacks. The pointer must be transmuted to the signature that version of
    /// `cuda.h` declares.
    pub fn raw_symbol(&self, name: &str, cuda_version: i32) -> Option<*mut c_void> {
        let name = CString::new(name).ok()?;
        let ptr = self.resolver.resolve(&name, cuda_version);
        (!ptr.is_null()).then_some(ptr)
    }
}

/// Reads a driver-owned static C string after a successful call.
///
/// # Safety
/// If `result` is success and `text` is non-null, `text` must point to a NUL-terminated
/// string that outlives this call.
unsafe fn static_text(result: CUresult, text: *const c_char) -> Option<String> {
    if !result.is_success() || text.is_null() {
        return None;
    }
    // SAFETY: guaranteed by the caller.
    Some(
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned(),
    )
}

impl fmt::Debug for DriverApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DriverApi")
            .field("library", &self.path)
            .field("driver_version", &self.driver_version)
            .finish_non_exhaustive()
    }
}
