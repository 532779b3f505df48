//! The driver's C types, written by hand from `cuda.h` (CUDA 12.0 ABI, unchanged in 13.0).
//!
//! Handles are opaque pointers; enums are plain integers with named constants (the driver may
//! hand back values newer than this file); structs are `#[repr(C)]` with their layouts checked
//! by compile-time assertions against the sizes the C headers give.
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_uint, c_void};

macro_rules! opaque_handles {
    ($($(#[$doc:meta])* $handle:ident => $st:ident;)*) => {$(
        #[doc = concat!("The opaque struct behind [`", stringify!($handle), "`].")]
        #[repr(C)]
        pub struct $st {
            _private: [u8; 0],
        }
        $(#[$doc])*
        pub type $handle = *mut $st;
    )*};
}

opaque_handles! {
    /// A context (cuhal only uses primary contexts).
    CUcontext => CUctx_st;
    /// A loaded module (PTX or cubin).
    CUmodule => CUmod_st;
    /// A kernel entry point in a module.
    CUfunction => CUfunc_st;
    /// A context-independent kernel handle (graph node parameters carry one; cuhal passes null).
    CUkernel => CUkern_st;
    /// A stream.
    CUstream => CUstream_st;
    /// An event.
    CUevent => CUevent_st;
    /// A graph under construction.
    CUgraph => CUgraph_st;
    /// A node of a graph.
    CUgraphNode => CUgraphNode_st;
    /// An instantiated, launchable graph.
    CUgraphExec => CUgraphExec_st;
    /// A device-side handle of a device-updatable kernel node (what device code passes to the
    /// device runtime's node-update calls).
    CUgraphDeviceNode => CUgraphDeviceUpdatableNode_st;
    /// A stream-ordered memory pool.
    CUmemoryPool => CUmemPoolHandle_st;
    /// A CUDA array (unused by cuhal; appears in copy descriptors).
    CUarray => CUarray_st;
}

/// A device ordinal handle.
pub type CUdevice = i32;
/// A device address.
pub type CUdeviceptr = u64;
/// A host function the driver calls from its own thread (`cuLaunchHostFunc`).
pub type CUhostFn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

/// `CUuuid`: 16 bytes identifying a device.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CUuuid {
    /// The raw bytes.
    pub bytes: [u8; 16],
}

/// `CUDA_KERNEL_NODE_PARAMS_v2`: the kernel node parameters of CUDA 12.
///
/// Always this (larger) layout: a driver that resolves the v1 entry point reads only the
/// common prefix, and `kern`/`ctx` stay null so the v2 entry point uses `func`.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUDA_KERNEL_NODE_PARAMS {
    /// The kernel to launch.
    pub func: CUfunction,
    /// Grid width in blocks.
    pub gridDimX: c_uint,
    /// Grid height in blocks.
    pub gridDimY: c_uint,
    /// Grid depth in blocks.
    pub gridDimZ: c_uint,
    /// Block width in threads.
    pub blockDimX: c_uint,
    /// Block height in threads.
    pub blockDimY: c_uint,
    /// Block depth in threads.
    pub blockDimZ: c_uint,
    /// Dynamic shared memory per block in bytes.
    pub sharedMemBytes: c_uint,
    /// Pointers to each kernel argument (the driver copies the values at node creation).
    pub kernelParams: *mut *mut c_void,
    /// Packed argument buffer alternative to `kernelParams`.
    pub extra: *mut *mut c_void,
    /// A `CUkernel` alternative to `func`; null.
    pub kern: CUkernel,
    /// The context of `kern`; null.
    pub ctx: CUcontext,
}

impl CUDA_KERNEL_NODE_PARAMS {
    /// A launch of `func` as one block of one thread, no dynamic shared memory, its arguments
    /// given as `kernelParams` (the driver copies their values when it takes the parameters).
    pub fn one_thread(func: CUfunction, params: *mut *mut c_void) -> Self {
        CUDA_KERNEL_NODE_PARAMS {
            func,
            gridDimX: 1,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: 1,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            kernelParams: params,
            extra: std::ptr::null_mut(),
            kern: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        }
    }
}

/// `CUDA_MEMSET_NODE_PARAMS`: a 2D memset in a graph.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUDA_MEMSET_NODE_PARAMS {
    /// Destination address.
    pub dst: CUdeviceptr,
    /// Row pitch in bytes (ignored when `height` is 1).
    pub pitch: usize,
    /// The value; its low `elementSize` bytes are used.
    pub value: c_uint,
    /// Element size in bytes: 1, 2 or 4.
    pub elementSize: c_uint,
    /// Width in elements.
    pub width: usize,
    /// Number of rows.
    pub height: usize,
}

/// `CUlaunchAttributeID` (also `CUkernelNodeAttrID`): which launch attribute a
/// [`CUlaunchAttribute`] or a kernel node attribute sets.
pub type CUlaunchAttributeID = c_uint;
/// `int cooperative`: the grid may synchronize as a whole (`cuLaunchCooperativeKernel`).
pub const CU_LAUNCH_ATTRIBUTE_COOPERATIVE: CUlaunchAttributeID = 2;
/// `clusterDim {x, y, z}`: thread-block cluster dimensions in blocks.
pub const CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: CUlaunchAttributeID = 4;
/// `int programmaticStreamSerializationAllowed`: the launch may start before the previous
/// kernel in the stream has finished (programmatic dependent launch).
pub const CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: CUlaunchAttributeID = 6;
/// `int priority`: the launch's priority (a stream priority value).
pub const CU_LAUNCH_ATTRIBUTE_PRIORITY: CUlaunchAttributeID = 8;
/// `deviceUpdatableKernelNode {int deviceUpdatable; CUgraphDeviceNode devNode}`: graph kernel
/// nodes only (CUDA 12.4): the node may be updated from the device; `devNode` is returned.
pub const CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE: CUlaunchAttributeID = 13;

/// `CUlaunchAttributeValue`: a 64-byte union; the constructors below write the member each
/// attribute reads.
#[repr(C, align(8))]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CUlaunchAttributeValue {
    /// The union's bytes.
    pub bytes: [u8; 64],
}

impl CUlaunchAttributeValue {
    /// All bytes zero.
    pub const fn zeroed() -> Self {
        Self { bytes: [0; 64] }
    }

    /// A value whose first member is one `int` (cooperative, programmatic serialization,
    /// priority).
    pub fn int(value: i32) -> Self {
        let mut v = Self::zeroed();
        v.bytes[..4].copy_from_slice(&value.to_ne_bytes());
        v
    }

    /// A `clusterDim` value.
    pub fn cluster(dims: [u32; 3]) -> Self {
        let mut v = Self::zeroed();
        for (i, d) in dims.iter().enumerate() {
            v.bytes[i * 4..i * 4 + 4].copy_from_slice(&d.to_ne_bytes());
        }
        v
    }

    /// The first `int` member.
    pub fn as_int(&self) -> i32 {
        i32::from_ne_bytes([self.bytes[0], self.bytes[1], self.bytes[2], self.bytes[3]])
    }

    /// The first three `unsigned int` members (`clusterDim`).
    pub fn as_dims(&self) -> [u32; 3] {
        let at = |i: usize| {
            u32::from_ne_bytes([
                self.bytes[i],
                self.bytes[i + 1],
                self.bytes[i + 2],
                self.bytes[i + 3],
            ])
        };
        [at(0), at(4), at(8)]
    }

    /// The `devNode` member of `deviceUpdatableKernelNode` (at byte 8).
    pub fn device_node(&self) -> CUgraphDeviceNode {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(&self.bytes[8..16]);
        std::ptr::with_exposed_provenance_mut(u64::from_ne_bytes(raw) as usize)
    }
}

/// `CUlaunchAttribute`: one attribute of a `cuLaunchKernelEx` launch.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CUlaunchAttribute {
    /// Which attribute.
    pub id: CUlaunchAttributeID,
    /// Padding to the value's alignment.
    pub pad: [u8; 4],
    /// Its value.
    pub value: CUlaunchAttributeValue,
}

/// `CUlaunchConfig`: the shape, stream and attributes of a `cuLaunchKernelEx` launch.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUlaunchConfig {
    /// Grid width in blocks.
    pub gridDimX: c_uint,
    /// Grid height in blocks.
    pub gridDimY: c_uint,
    /// Grid depth in blocks.
    pub gridDimZ: c_uint,
    /// Block width in threads.
    pub blockDimX: c_uint,
    /// Block height in threads.
    pub blockDimY: c_uint,
    /// Block depth in threads.
    pub blockDimZ: c_uint,
    /// Dynamic shared memory per block in bytes.
    pub sharedMemBytes: c_uint,
    /// The stream.
    pub hStream: CUstream,
    /// `numAttrs` attributes (or null).
    pub attrs: *mut CUlaunchAttribute,
    /// How many attributes.
    pub numAttrs: c_uint,
}

/// A full dependency: the downstream node starts after the upstream one completes.
pub const CU_GRAPH_DEPENDENCY_TYPE_DEFAULT: u8 = 0;
/// A programmatic dependency (kernel to kernel): see `CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC`.
pub const CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC: u8 = 1;
/// Kernel node port: the downstream kernel may start once every block of the upstream one has
/// triggered (`griddepcontrol.launch_dependents`) or exited; it sees the upstream's memory
/// only after `griddepcontrol.wait`.
pub const CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC: u8 = 1;

/// `CUmemorytype`: where a copy endpoint lives.
pub type CUmemorytype = c_uint;
/// Host memory.
pub const CU_MEMORYTYPE_HOST: CUmemorytype = 1;
/// Device memory.
pub const CU_MEMORYTYPE_DEVICE: CUmemorytype = 2;
/// A CUDA array.
pub const CU_MEMORYTYPE_ARRAY: CUmemorytype = 3;
/// Unified addressing: the driver works out host or device from the pointer.
pub const CU_MEMORYTYPE_UNIFIED: CUmemorytype = 4;

/// `CUDA_MEMCPY3D`: a copy descriptor (memcpy graph nodes use it).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUDA_MEMCPY3D {
    /// Source X offset in bytes.
    pub srcXInBytes: usize,
    /// Source Y offset in rows.
    pub srcY: usize,
    /// Source Z offset in slices.
    pub srcZ: usize,
    /// Source mip level (arrays only).
    pub srcLOD: usize,
    /// Source memory type.
    pub srcMemoryType: CUmemorytype,
    /// Source host pointer.
    pub srcHost: *const c_void,
    /// Source device pointer.
    pub srcDevice: CUdeviceptr,
    /// Source array.
    pub srcArray: CUarray,
    /// Must be null.
    pub reserved0: *mut c_void,
    /// Source row pitch in bytes.
    pub srcPitch: usize,
    /// Source rows per slice.
    pub srcHeight: usize,
    /// Destination X offset in bytes.
    pub dstXInBytes: usize,
    /// Destination Y offset in rows.
    pub dstY: usize,
    /// Destination Z offset in slices.
    pub dstZ: usize,
    /// Destination mip level (arrays only).
    pub dstLOD: usize,
    /// Destination memory type.
    pub dstMemoryType: CUmemorytype,
    /// Destination host pointer.
    pub dstHost: *mut c_void,
    /// Destination device pointer.
    pub dstDevice: CUdeviceptr,
    /// Destination array.
    pub dstArray: CUarray,
    /// Must be null.
    pub reserved1: *mut c_void,
    /// Destination row pitch in bytes.
    pub dstPitch: usize,
    /// Destination rows per slice.
    pub dstHeight: usize,
    /// Width of the copy in bytes.
    pub WidthInBytes: usize,
    /// Rows to copy.
    pub Height: usize,
    /// Slices to copy.
    pub Depth: usize,
}

impl CUDA_MEMCPY3D {
    /// A linear copy of `bytes` bytes between two device addresses.
    pub fn linear_device_to_device(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) -> Self {
        Self {
            srcMemoryType: CU_MEMORYTYPE_DEVICE,
            srcDevice: src,
            srcPitch: bytes,
            srcHeight: 1,
            dstMemoryType: CU_MEMORYTYPE_DEVICE,
            dstDevice: dst,
            dstPitch: bytes,
            dstHeight: 1,
            WidthInBytes: bytes,
            Height: 1,
            Depth: 1,
            ..Self::zeroed()
        }
    }

    /// All fields zero or null.
    pub const fn zeroed() -> Self {
        Self {
            srcXInBytes: 0,
            srcY: 0,
            srcZ: 0,
            srcLOD: 0,
            srcMemoryType: 0,
            srcHost: std::ptr::null(),
            srcDevice: 0,
            srcArray: std::ptr::null_mut(),
            reserved0: std::ptr::null_mut(),
            srcPitch: 0,
            srcHeight: 0,
            dstXInBytes: 0,
            dstY: 0,
            dstZ: 0,
            dstLOD: 0,
            dstMemoryType: 0,
            dstHost: std::ptr::null_mut(),
            dstDevice: 0,
            dstArray: std::ptr::null_mut(),
            reserved1: std::ptr::null_mut(),
            dstPitch: 0,
            dstHeight: 0,
            WidthInBytes: 0,
            Height: 0,
            Depth: 0,
        }
    }
}

/// `CUmemLocation`: where a pool's memory lives.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct CUmemLocation {
    /// `CU_MEM_LOCATION_TYPE_DEVICE` and so on.
    pub type_: c_uint,
    /// The device ordinal for device locations.
    pub id: i32,
}
/// A location on a device.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;

/// `CUmemPoolProps`: properties of a memory pool created with `cuMemPoolCreate`.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUmemPoolProps {
    /// `CU_MEM_ALLOCATION_TYPE_PINNED`.
    pub allocType: c_uint,
    /// Exportable handle types; 0 for none.
    pub handleTypes: c_uint,
    /// Where the memory lives.
    pub location: CUmemLocation,
    /// Windows only; null.
    pub win32SecurityAttributes: *mut c_void,
    /// Later fields (`maxSize`, `usage`) and reserved bytes; zero means defaults.
    pub reserved: [u8; 64],
}
/// Pinned (non-migratable) device memory.
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_uint = 1;

/// `CUmemPool_attribute`.
pub type CUmemPool_attribute = c_uint;
/// `u64` bytes the pool keeps reserved instead of releasing at synchronization points.
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: CUmemPool_attribute = 4;

/// `cuStreamWaitValue32`'s comparison: wait until `(int32_t)(*address - value) >= 0`.
pub const CU_STREAM_WAIT_VALUE_GEQ: c_uint = 0;

/// `CUmemAccessDesc`: one device's access to a pool's memory, for `cuMemPoolSetAccess`.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct CUmemAccessDesc {
    /// The device that gains (or loses) access.
    pub location: CUmemLocation,
    /// `CU_MEM_ACCESS_FLAGS_PROT_*`.
    pub flags: c_uint,
}
/// No access.
pub const CU_MEM_ACCESS_FLAGS_PROT_NONE: c_uint = 0;
/// Reads only.
pub const CU_MEM_ACCESS_FLAGS_PROT_READ: c_uint = 1;
/// Reads and writes.
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_uint = 3;

/// `CUgraphExecUpdateResultInfo` (CUDA 12's `cuGraphExecUpdate`).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUgraphExecUpdateResultInfo {
    /// A `CU_GRAPH_EXEC_UPDATE_*` code.
    pub result: c_uint,
    /// The node that failed the update, if any.
    pub errorNode: CUgraphNode,
    /// The node the failing node was expected to depend on, if any.
    pub errorFromNode: CUgraphNode,
}

/// `CUdriverProcAddressQueryResult`, returned by `cuGetProcAddress_v2`.
pub type CUdriverProcAddressQueryResult = c_uint;
/// The symbol was found.
pub const CU_GET_PROC_ADDRESS_SUCCESS: CUdriverProcAddressQueryResult = 0;
/// The driver does not have the symbol.
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: CUdriverProcAddressQueryResult = 1;
/// The symbol exists in a newer CUDA version than the one asked for.
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: CUdriverProcAddressQueryResult = 2;
/// `cuGetProcAddress` flags: the default (legacy default stream) variants.
pub const CU_GET_PROC_ADDRESS_DEFAULT: u64 = 0;

/// `CUdevice_P2PAttribute`.
pub type CUdevice_P2PAttribute = c_uint;
/// `CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK`: relative performance of the link (0 is best).
pub const CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: CUdevice_P2PAttribute = 1;
/// `CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED`.
pub const CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED: CUdevice_P2PAttribute = 2;
/// `CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED`.
pub const CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED: CUdevice_P2PAttribute = 3;

/// `CUdevice_attribute`.
pub type CUdevice_attribute = c_uint;
/// Maximum threads per block.
pub const CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: CUdevice_attribute = 1;
/// Maximum grid width in blocks.
pub const CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: CUdevice_attribute = 5;
/// Maximum grid height in blocks.
pub const CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: CUdevice_attribute = 6;
/// Maximum grid depth in blocks.
pub const CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: CUdevice_attribute = 7;
/// Maximum shared memory per block in bytes.
pub const CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: CUdevice_attribute = 8;
/// Warp size in threads.
pub const CU_DEVICE_ATTRIBUTE_WARP_SIZE: CUdevice_attribute = 10;
/// Peak clock in kHz.
pub const CU_DEVICE_ATTRIBUTE_CLOCK_RATE: CUdevice_attribute = 13;
/// Number of multiprocessors.
pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: CUdevice_attribute = 16;
/// PCI bus id.
pub const CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: CUdevice_attribute = 33;
/// PCI device id.
pub const CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: CUdevice_attribute = 34;
/// Unified addressing with the host.
pub const CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: CUdevice_attribute = 41;
/// PCI domain id.
pub const CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: CUdevice_attribute = 50;
/// Compute capability, major.
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: CUdevice_attribute = 75;
/// Compute capability, minor.
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: CUdevice_attribute = 76;
/// Cooperative launches are supported.
pub const CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: CUdevice_attribute = 95;
/// Maximum opt-in shared memory per block in bytes.
pub const CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: CUdevice_attribute = 97;
/// Stream-ordered allocation (`cuMemAllocAsync`) is supported.
pub const CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: CUdevice_attribute = 115;
/// Thread-block clusters can be launched (compute capability 9.0 and later).
pub const CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: CUdevice_attribute = 120;

/// `CUfunction_attribute`.
pub type CUfunction_attribute = c_uint;
/// Maximum threads per block this function can be launched with.
pub const CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: CUfunction_attribute = 0;
/// Static shared memory in bytes.
pub const CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: CUfunction_attribute = 1;
/// Constant memory in bytes.
pub const CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: CUfunction_attribute = 2;
/// Local memory per thread in bytes.
pub const CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: CUfunction_attribute = 3;
/// Registers per thread.
pub const CU_FUNC_ATTRIBUTE_NUM_REGS: CUfunction_attribute = 4;
/// PTX version the function was compiled for.
pub const CU_FUNC_ATTRIBUTE_PTX_VERSION: CUfunction_attribute = 5;
/// Binary architecture version.
pub const CU_FUNC_ATTRIBUTE_BINARY_VERSION: CUfunction_attribute = 6;
/// Maximum dynamic shared memory in bytes (settable).
pub const CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: CUfunction_attribute = 8;
/// Nonzero when the kernel must be launched with a cluster size.
pub const CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET: CUfunction_attribute = 10;
/// The cluster width the kernel was compiled for (`.reqnctapercluster`); 0 when none.
pub const CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH: CUfunction_attribute = 11;
/// The cluster height the kernel was compiled for; 0 when none.
pub const CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT: CUfunction_attribute = 12;
/// The cluster depth the kernel was compiled for; 0 when none.
pub const CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH: CUfunction_attribute = 13;
/// Nonzero when the kernel may be launched with clusters above the portable size of 8.
pub const CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: CUfunction_attribute = 14;

/// `CUjit_option`.
pub type CUjit_option = c_uint;
/// Buffer for informational JIT output.
pub const CU_JIT_INFO_LOG_BUFFER: CUjit_option = 3;
/// Size of the info buffer in bytes (in), bytes written (out).
pub const CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES: CUjit_option = 4;
/// Buffer for JIT error output.
pub const CU_JIT_ERROR_LOG_BUFFER: CUjit_option = 5;
/// Size of the error buffer in bytes (in), bytes written (out).
pub const CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: CUjit_option = 6;
/// Optimization level 0..=4.
pub const CU_JIT_OPTIMIZATION_LEVEL: CUjit_option = 7;
/// Verbose log output.
pub const CU_JIT_LOG_VERBOSE: CUjit_option = 12;

/// Stream flag: no implicit synchronization with the legacy default stream.
pub const CU_STREAM_NON_BLOCKING: c_uint = 0x1;
/// Event flag: the host blocks (yields) in `cuEventSynchronize` instead of spinning.
pub const CU_EVENT_BLOCKING_SYNC: c_uint = 0x1;
/// Event flag: no timing data; recording is much cheaper.
pub const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `cuEventRecordWithFlags` default.
pub const CU_EVENT_RECORD_DEFAULT: c_uint = 0x0;
/// `cuStreamWaitEvent` default.
pub const CU_EVENT_WAIT_DEFAULT: c_uint = 0x0;
/// `cuMemHostAlloc` flag: portable across contexts.
pub const CU_MEMHOSTALLOC_PORTABLE: c_uint = 0x1;
/// `cuMemHostAlloc` flag: mapped into the device address space.
pub const CU_MEMHOSTALLOC_DEVICEMAP: c_uint = 0x2;
/// `cuMemHostRegister` flag: portable across contexts.
pub const CU_MEMHOSTREGISTER_PORTABLE: c_uint = 0x1;
/// `cuGraphInstantiateWithFlags` flag: free stream-ordered allocations at launch.
pub const CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH: u64 = 1;
/// `cuGraphInstantiateWithFlags` flag: upload the graph as part of instantiation.
pub const CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD: u64 = 2;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH`: the executable may also be launched from the
/// device (upload it first); not with `AUTO_FREE_ON_LAUNCH`.
pub const CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH: u64 = 4;
/// `CU_GRAPH_NODE_TYPE_KERNEL` (`cuGraphNodeGetType`).
pub const CU_GRAPH_NODE_TYPE_KERNEL: c_uint = 0;
/// `CU_GRAPH_NODE_TYPE_MEMCPY`.
pub const CU_GRAPH_NODE_TYPE_MEMCPY: c_uint = 1;
/// `CU_GRAPH_NODE_TYPE_MEMSET`.
pub const CU_GRAPH_NODE_TYPE_MEMSET: c_uint = 2;
/// `CU_GRAPH_NODE_TYPE_HOST`.
pub const CU_GRAPH_NODE_TYPE_HOST: c_uint = 3;
/// `CU_GRAPH_NODE_TYPE_GRAPH` (a child graph).
pub const CU_GRAPH_NODE_TYPE_GRAPH: c_uint = 4;
/// `CU_GRAPH_NODE_TYPE_EMPTY`.
pub const CU_GRAPH_NODE_TYPE_EMPTY: c_uint = 5;
/// `CU_GRAPH_NODE_TYPE_WAIT_EVENT`.
pub const CU_GRAPH_NODE_TYPE_WAIT_EVENT: c_uint = 6;
/// `CU_GRAPH_NODE_TYPE_EVENT_RECORD`.
pub const CU_GRAPH_NODE_TYPE_EVENT_RECORD: c_uint = 7;
/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC`.
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: c_uint = 10;
/// `CU_GRAPH_NODE_TYPE_MEM_FREE`.
pub const CU_GRAPH_NODE_TYPE_MEM_FREE: c_uint = 11;
/// `cuGraphInstantiateWithFlags` flag: run kernel nodes at their own priority attribute rather
/// than the priority of the stream the graph is launched into.
pub const CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY: u64 = 8;

/// `CUpointer_attribute`: what `cuPointerGetAttribute` reports about an address.
pub type CUpointer_attribute = c_uint;
/// The `CUcontext` the memory belongs to (null for memory of no single context).
pub const CU_POINTER_ATTRIBUTE_CONTEXT: CUpointer_attribute = 1;
/// The [`CUmemorytype`] of the memory (`unsigned int`).
pub const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: CUpointer_attribute = 2;
/// The ordinal of the device the memory lives on (`int`).
pub const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: CUpointer_attribute = 9;
/// The first address of the allocation holding the pointer (`CUdeviceptr`).
pub const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: CUpointer_attribute = 11;
/// The size in bytes of the allocation holding the pointer (`size_t`).
pub const CU_POINTER_ATTRIBUTE_RANGE_SIZE: CUpointer_attribute = 12;

/// `CUstreamCaptureMode`: which calls a capture forbids, and on which threads.
pub type CUstreamCaptureMode = c_uint;
/// Unsafe calls are forbidden on every thread while the capture lasts.
pub const CU_STREAM_CAPTURE_MODE_GLOBAL: CUstreamCaptureMode = 0;
/// Unsafe calls are forbidden on the capturing thread only.
pub const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: CUstreamCaptureMode = 1;
/// Nothing is forbidden beyond what cannot be captured at all.
pub const CU_STREAM_CAPTURE_MODE_RELAXED: CUstreamCaptureMode = 2;

/// `CUstreamCaptureStatus`.
pub type CUstreamCaptureStatus = c_uint;
/// The stream is not capturing.
pub const CU_STREAM_CAPTURE_STATUS_NONE: CUstreamCaptureStatus = 0;
/// The stream is capturing.
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: CUstreamCaptureStatus = 1;
/// The capture was invalidated and must be ended.
pub const CU_STREAM_CAPTURE_STATUS_INVALIDATED: CUstreamCaptureStatus = 2;

/// `CUgraphEdgeData` (CUDA 12.3): the kind of one dependency edge. Null arrays of these mean
/// every edge is the default, full dependency; programmatic edges between kernel nodes use
/// `CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC`.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CUgraphEdgeData {
    /// The port of the upstream node the edge leaves from (0: the node's completion).
    pub from_port: u8,
    /// The port of the downstream node the edge enters (0: the node's start).
    pub to_port: u8,
    /// The edge type (0: full dependency).
    pub type_: u8,
    /// Must be zero.
    pub reserved: [u8; 5],
}

// Layout checks against the sizes and offsets of the C headers on LP64 targets.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<CUuuid>() == 16);
    assert!(size_of::<CUDA_KERNEL_NODE_PARAMS>() == 72);
    assert!(offset_of!(CUDA_KERNEL_NODE_PARAMS, kernelParams) == 40);
    assert!(offset_of!(CUDA_KERNEL_NODE_PARAMS, kern) == 56);
    assert!(size_of::<CUDA_MEMSET_NODE_PARAMS>() == 40);
    assert!(offset_of!(CUDA_MEMSET_NODE_PARAMS, width) == 24);
    assert!(size_of::<CUDA_MEMCPY3D>() == 200);
    assert!(offset_of!(CUDA_MEMCPY3D, srcHost) == 40);
    assert!(offset_of!(CUDA_MEMCPY3D, dstMemoryType) == 120);
    assert!(offset_of!(CUDA_MEMCPY3D, WidthInBytes) == 176);
    assert!(size_of::<CUmemPoolProps>() == 88);
    assert!(size_of::<CUmemAccessDesc>() == 12);
    assert!(size_of::<CUgraphExecUpdateResultInfo>() == 24);
    assert!(size_of::<CUlaunchAttributeValue>() == 64);
    assert!(size_of::<CUlaunchAttribute>() == 72);
    assert!(offset_of!(CUlaunchAttribute, value) == 8);
    assert!(size_of::<CUlaunchConfig>() == 56);
    assert!(offset_of!(CUlaunchConfig, hStream) == 32);
    assert!(offset_of!(CUlaunchConfig, attrs) == 40);
    assert!(offset_of!(CUlaunchConfig, numAttrs) == 48);
    assert!(size_of::<CUgraphEdgeData>() == 8);
};
