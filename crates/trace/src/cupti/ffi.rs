//! The few CUPTI declarations cuhal uses, written from CUPTI's public headers (`cupti_activity.h`,
//! `cupti_callbacks.h`, `cupti_result.h`) for CUDA 13.
//!
//! Activity records are versioned structs (`CUpti_ActivityKernel10` in CUDA 13.0,
//! `CUpti_ActivityKernel11` later, ...). Every new version appends fields and keeps the earlier
//! ones where they were, so cuhal declares only the *prefix* of each record it reads, up to the
//! last field it needs (the graph ids), and never reads past it. The library walks the buffer
//! itself (`cuptiActivityGetNextRecord`), so the full record size never matters here. The
//! offsets are checked in the tests against the numbers in the headers.

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_void};

use cuhal_sys::{CUcontext, CUgraphNode};

/// `CUptiResult`.
pub type CUptiResult = u32;
/// `CUPTI_SUCCESS`.
pub const CUPTI_SUCCESS: CUptiResult = 0;
/// `CUPTI_ERROR_INVALID_PARAMETER`.
pub const CUPTI_ERROR_INVALID_PARAMETER: CUptiResult = 1;
/// `CUPTI_ERROR_MAX_LIMIT_REACHED`: `cuptiActivityGetNextRecord` at the end of a buffer.
pub const CUPTI_ERROR_MAX_LIMIT_REACHED: CUptiResult = 12;
/// `CUPTI_ERROR_NOT_INITIALIZED`.
pub const CUPTI_ERROR_NOT_INITIALIZED: CUptiResult = 15;
/// `CUPTI_ERROR_INSUFFICIENT_PRIVILEGES`.
pub const CUPTI_ERROR_INSUFFICIENT_PRIVILEGES: CUptiResult = 35;
/// `CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED`: another tool holds CUPTI's one subscriber.
pub const CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: CUptiResult = 39;

/// The name of a CUPTI status code cuhal knows, for messages.
pub fn result_name(result: CUptiResult) -> &'static str {
    match result {
        CUPTI_SUCCESS => "CUPTI_SUCCESS",
        CUPTI_ERROR_INVALID_PARAMETER => "CUPTI_ERROR_INVALID_PARAMETER",
        CUPTI_ERROR_MAX_LIMIT_REACHED => "CUPTI_ERROR_MAX_LIMIT_REACHED",
        CUPTI_ERROR_NOT_INITIALIZED => "CUPTI_ERROR_NOT_INITIALIZED",
        CUPTI_ERROR_INSUFFICIENT_PRIVILEGES => "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES",
        CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED => {
            "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
        }
        _ => "CUPTI_ERROR (unnamed)",
    }
}

/// `CUpti_ActivityKind`.
pub type CUpti_ActivityKind = u32;
/// `CUPTI_ACTIVITY_KIND_MEMCPY`.
pub const CUPTI_ACTIVITY_KIND_MEMCPY: CUpti_ActivityKind = 1;
/// `CUPTI_ACTIVITY_KIND_MEMSET`.
pub const CUPTI_ACTIVITY_KIND_MEMSET: CUpti_ActivityKind = 2;
/// `CUPTI_ACTIVITY_KIND_KERNEL` (serializes kernels; cuhal never enables it, but parses it).
pub const CUPTI_ACTIVITY_KIND_KERNEL: CUpti_ActivityKind = 3;
/// `CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL`.
pub const CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: CUpti_ActivityKind = 10;

/// `CUpti_CallbackDomain`.
pub type CUpti_CallbackDomain = u32;
/// `CUPTI_CB_DOMAIN_DRIVER_API`.
pub const CUPTI_CB_DOMAIN_DRIVER_API: CUpti_CallbackDomain = 1;
/// `CUPTI_CB_DOMAIN_RESOURCE`.
pub const CUPTI_CB_DOMAIN_RESOURCE: CUpti_CallbackDomain = 3;

/// `CUpti_CallbackId`.
pub type CUpti_CallbackId = u32;
/// `CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED`: a node was cloned (also when a graph is instantiated).
pub const CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED: CUpti_CallbackId = 20;

/// Driver API callback ids (`CUpti_driver_api_trace_cbid`) of the calls that put GPU work on a
/// stream, the only ones whose correlation ids cuhal captures.
pub mod cbid {
    use super::CUpti_CallbackId;
    /// `cuMemsetD8Async`.
    pub const MEMSET_D8_ASYNC: CUpti_CallbackId = 216;
    /// `cuMemsetD16Async`.
    pub const MEMSET_D16_ASYNC: CUpti_CallbackId = 218;
    /// `cuMemsetD32Async`.
    pub const MEMSET_D32_ASYNC: CUpti_CallbackId = 220;
    /// `cuMemcpyHtoDAsync_v2`.
    pub const MEMCPY_HTOD_ASYNC: CUpti_CallbackId = 277;
    /// `cuMemcpyDtoHAsync_v2`.
    pub const MEMCPY_DTOH_ASYNC: CUpti_CallbackId = 279;
    /// `cuMemcpyDtoDAsync_v2`.
    pub const MEMCPY_DTOD_ASYNC: CUpti_CallbackId = 281;
    /// `cuMemcpyAsync`.
    pub const MEMCPY_ASYNC: CUpti_CallbackId = 306;
    /// `cuLaunchKernel`.
    pub const LAUNCH_KERNEL: CUpti_CallbackId = 307;
    /// `cuGraphLaunch`.
    pub const GRAPH_LAUNCH: CUpti_CallbackId = 514;
    /// `cuLaunchKernelEx`.
    pub const LAUNCH_KERNEL_EX: CUpti_CallbackId = 652;
    /// Every id above.
    pub const LAUNCHES: [CUpti_CallbackId; 10] = [
        MEMSET_D8_ASYNC,
        MEMSET_D16_ASYNC,
        MEMSET_D32_ASYNC,
        MEMCPY_HTOD_ASYNC,
        MEMCPY_DTOH_ASYNC,
        MEMCPY_DTOD_ASYNC,
        MEMCPY_ASYNC,
        LAUNCH_KERNEL,
        GRAPH_LAUNCH,
        LAUNCH_KERNEL_EX,
    ];
}

/// `CUpti_ApiCallbackSite`: `CUPTI_API_EXIT`.
pub const CUPTI_API_EXIT: u32 = 1;

/// `CUpti_SubscriberHandle`.
pub type CUpti_SubscriberHandle = *mut c_void;

/// `CUpti_CallbackData`: what a driver-API callback receives.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUpti_CallbackData {
    /// `CUpti_ApiCallbackSite`: enter (0) or exit (1).
    pub callbackSite: u32,
    /// The API function's name.
    pub functionName: *const c_char,
    /// The call's parameter struct.
    pub functionParams: *const c_void,
    /// Points to the call's return value (a `CUresult`), valid at exit.
    pub functionReturnValue: *mut c_void,
    /// The kernel's name for launches, else null.
    pub symbolName: *const c_char,
    /// The context of the call.
    pub context: CUcontext,
    /// That context's unique id.
    pub contextUid: u32,
    /// Per-call scratch the subscriber may use between enter and exit.
    pub correlationData: *mut u64,
    /// The correlation id the activity records of this call carry.
    pub correlationId: u32,
}

/// `CUpti_ResourceData`: what a resource-domain callback receives.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUpti_ResourceData {
    /// The context.
    pub context: CUcontext,
    /// A union of resource handles (a stream); unused here.
    pub resourceHandle: *mut c_void,
    /// For graph callbacks, a `CUpti_GraphData`.
    pub resourceDescriptor: *mut c_void,
}

/// `CUpti_GraphData`: the graph objects of a graph resource callback.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUpti_GraphData {
    /// The graph.
    pub graph: *mut c_void,
    /// The graph it was cloned from.
    pub originalGraph: *mut c_void,
    /// The node (the clone, for GRAPHNODE_CLONED).
    pub node: CUgraphNode,
    /// The node it was cloned from.
    pub originalNode: CUgraphNode,
    /// `CUgraphNodeType`.
    pub nodeType: u32,
    /// A dependency (for dependency callbacks).
    pub dependency: CUgraphNode,
    /// The executable graph, when the clone belongs to one.
    pub graphExec: *mut c_void,
}

/// The header every record starts with (`CUpti_Activity`).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct CUpti_Activity {
    /// The record's kind.
    pub kind: CUpti_ActivityKind,
}

/// The prefix of `CUpti_ActivityKernel5` .. `CUpti_ActivityKernel11` that cuhal reads (through
/// `graphId`); identical in every one of those versions.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct KernelRecordPrefix {
    /// `CUPTI_ACTIVITY_KIND_KERNEL` or `_CONCURRENT_KERNEL`.
    pub kind: u32,
    /// Cache configuration, requested and executed (4 bits each).
    pub cacheConfig: u8,
    /// Shared memory configuration.
    pub sharedMemoryConfig: u8,
    /// Registers per thread.
    pub registersPerThread: u16,
    /// `CUpti_ActivityPartitionedGlobalCacheConfig`.
    pub partitionedGlobalCacheRequested: u32,
    /// `CUpti_ActivityPartitionedGlobalCacheConfig`.
    pub partitionedGlobalCacheExecuted: u32,
    /// Start, CUPTI nanoseconds.
    pub start: u64,
    /// End, CUPTI nanoseconds.
    pub end: u64,
    /// Completion time (for CDP kernels), else `end`.
    pub completed: u64,
    /// Device id.
    pub deviceId: u32,
    /// Context id.
    pub contextId: u32,
    /// Stream id.
    pub streamId: u32,
    /// Grid and block sizes.
    pub grid: [i32; 3],
    /// Block size.
    pub block: [i32; 3],
    /// Static shared memory.
    pub staticSharedMemory: i32,
    /// Dynamic shared memory.
    pub dynamicSharedMemory: i32,
    /// Local memory per thread.
    pub localMemoryPerThread: u32,
    /// Local memory total.
    pub localMemoryTotal: u32,
    /// The correlation id of the launching API call (`cuLaunchKernel`, `cuGraphLaunch`).
    pub correlationId: u32,
    /// Grid id.
    pub gridId: i64,
    /// The kernel's (mangled) name, owned by CUPTI.
    pub name: *const c_char,
    /// Reserved.
    pub reserved0: *mut c_void,
    /// Queued timestamp (when enabled), else unknown.
    pub queued: u64,
    /// Submitted timestamp (when enabled), else unknown.
    pub submitted: u64,
    /// Launch type.
    pub launchType: u8,
    /// Whether a shared memory carveout was requested.
    pub isSharedMemoryCarveoutRequested: u8,
    /// The carveout requested.
    pub sharedMemoryCarveoutRequested: u8,
    /// Padding.
    pub padding: u8,
    /// Shared memory executed.
    pub sharedMemoryExecuted: u32,
    /// The graph node that launched the kernel (0 outside graphs): the node of the *executable*
    /// graph, a clone of the node cuhal added.
    pub graphNodeId: u64,
    /// `CUpti_FuncShmemLimitConfig`.
    pub shmemLimitConfig: u32,
    /// The graph (0 outside graphs).
    pub graphId: u32,
}

impl Default for KernelRecordPrefix {
    fn default() -> Self {
        // SAFETY: every field is an integer or a raw pointer, for which all-zero bits are a
        // valid value (null pointers).
        unsafe { std::mem::zeroed() }
    }
}

/// The prefix of `CUpti_ActivityMemcpy5`/`6` that cuhal reads (through `graphId`).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct MemcpyRecordPrefix {
    /// `CUPTI_ACTIVITY_KIND_MEMCPY`.
    pub kind: u32,
    /// `CUpti_ActivityMemcpyKind`.
    pub copyKind: u8,
    /// Source memory kind.
    pub srcKind: u8,
    /// Destination memory kind.
    pub dstKind: u8,
    /// Flags.
    pub flags: u8,
    /// Bytes copied.
    pub bytes: u64,
    /// Start, CUPTI nanoseconds.
    pub start: u64,
    /// End, CUPTI nanoseconds.
    pub end: u64,
    /// Device id.
    pub deviceId: u32,
    /// Context id.
    pub contextId: u32,
    /// Stream id.
    pub streamId: u32,
    /// The correlation id of the API call that issued the copy.
    pub correlationId: u32,
    /// The runtime API's correlation id.
    pub runtimeCorrelationId: u32,
    /// Padding.
    pub pad: u32,
    /// Reserved.
    pub reserved0: usize,
    /// The executable graph's node (0 outside graphs).
    pub graphNodeId: u64,
    /// The graph (0 outside graphs).
    pub graphId: u32,
}

/// The prefix of `CUpti_ActivityMemset4`/`5` that cuhal reads (through `graphId`).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct MemsetRecordPrefix {
    /// `CUPTI_ACTIVITY_KIND_MEMSET`.
    pub kind: u32,
    /// The value set.
    pub value: u32,
    /// Bytes set.
    pub bytes: u64,
    /// Start, CUPTI nanoseconds.
    pub start: u64,
    /// End, CUPTI nanoseconds.
    pub end: u64,
    /// Device id.
    pub deviceId: u32,
    /// Context id.
    pub contextId: u32,
    /// Stream id.
    pub streamId: u32,
    /// The correlation id of the API call that issued the memset.
    pub correlationId: u32,
    /// Flags.
    pub flags: u16,
    /// Memory kind.
    pub memoryKind: u16,
    /// Padding.
    pub pad: u32,
    /// Reserved.
    pub reserved0: usize,
    /// The executable graph's node (0 outside graphs).
    pub graphNodeId: u64,
    /// The graph (0 outside graphs).
    pub graphId: u32,
}

/// `CUpti_CallbackFunc`.
pub type CUpti_CallbackFunc = unsafe extern "C" fn(
    userdata: *mut c_void,
    domain: CUpti_CallbackDomain,
    cbid: CUpti_CallbackId,
    cbdata: *const c_void,
);
/// `CUpti_BuffersCallbackRequestFunc`.
pub type BufferRequestFunc =
    unsafe extern "C" fn(buffer: *mut *mut u8, size: *mut usize, max_records: *mut usize);
/// `CUpti_BuffersCallbackCompleteFunc`.
pub type BufferCompleteFunc = unsafe extern "C" fn(
    context: CUcontext,
    stream_id: u32,
    buffer: *mut u8,
    size: usize,
    valid_size: usize,
);

/// The CUPTI entry points cuhal calls, resolved from the library (or supplied by a fake).
///
/// Calling one is `unsafe`: the caller upholds that function's contract from the CUPTI
/// reference.
#[derive(Copy, Clone, Debug)]
pub struct CuptiApi {
    /// `cuptiSubscribe(&subscriber, callback, userdata)`.
    pub cuptiSubscribe: unsafe extern "C" fn(
        *mut CUpti_SubscriberHandle,
        CUpti_CallbackFunc,
        *mut c_void,
    ) -> CUptiResult,
    /// `cuptiUnsubscribe(subscriber)`.
    pub cuptiUnsubscribe: unsafe extern "C" fn(CUpti_SubscriberHandle) -> CUptiResult,
    /// `cuptiEnableCallback(enable, subscriber, domain, cbid)`.
    pub cuptiEnableCallback: unsafe extern "C" fn(
        u32,
        CUpti_SubscriberHandle,
        CUpti_CallbackDomain,
        CUpti_CallbackId,
    ) -> CUptiResult,
    /// `cuptiActivityRegisterCallbacks(request, complete)`.
    pub cuptiActivityRegisterCallbacks:
        unsafe extern "C" fn(BufferRequestFunc, BufferCompleteFunc) -> CUptiResult,
    /// `cuptiActivityEnable(kind)`.
    pub cuptiActivityEnable: unsafe extern "C" fn(CUpti_ActivityKind) -> CUptiResult,
    /// `cuptiActivityDisable(kind)`.
    pub cuptiActivityDisable: unsafe extern "C" fn(CUpti_ActivityKind) -> CUptiResult,
    /// `cuptiActivityFlushAll(flag)`.
    pub cuptiActivityFlushAll: unsafe extern "C" fn(u32) -> CUptiResult,
    /// `cuptiActivityGetNextRecord(buffer, validSize, &record)`.
    pub cuptiActivityGetNextRecord:
        unsafe extern "C" fn(*mut u8, usize, *mut *mut CUpti_Activity) -> CUptiResult,
    /// `cuptiActivityGetNumDroppedRecords(context, streamId, &dropped)`.
    pub cuptiActivityGetNumDroppedRecords:
        unsafe extern "C" fn(CUcontext, u32, *mut usize) -> CUptiResult,
    /// `cuptiGetTimestamp(&ns)`.
    pub cuptiGetTimestamp: unsafe extern "C" fn(*mut u64) -> CUptiResult,
    /// `cuptiGetGraphNodeId(node, &id)`.
    pub cuptiGetGraphNodeId: unsafe extern "C" fn(CUgraphNode, *mut u64) -> CUptiResult,
    /// `cuptiGetResultString(result, &text)`.
    pub cuptiGetResultString: unsafe extern "C" fn(CUptiResult, *mut *const c_char) -> CUptiResult,
}

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    /// Offsets from `cupti_activity.h` (CUDA 13.0, `CUpti_ActivityKernel10`; the same in
    /// `CUpti_ActivityKernel5` through `11` up to `graphId`).
    #[test]
    fn kernel_record_prefix_matches_the_header() {
        assert_eq!(offset_of!(KernelRecordPrefix, kind), 0);
        assert_eq!(
            offset_of!(KernelRecordPrefix, partitionedGlobalCacheRequested),
            8
        );
        assert_eq!(offset_of!(KernelRecordPrefix, start), 16);
        assert_eq!(offset_of!(KernelRecordPrefix, end), 24);
        assert_eq!(offset_of!(KernelRecordPrefix, completed), 32);
        assert_eq!(offset_of!(KernelRecordPrefix, deviceId), 40);
        assert_eq!(offset_of!(KernelRecordPrefix, contextId), 44);
        assert_eq!(offset_of!(KernelRecordPrefix, streamId), 48);
        assert_eq!(offset_of!(KernelRecordPrefix, grid), 52);
        assert_eq!(offset_of!(KernelRecordPrefix, staticSharedMemory), 76);
        assert_eq!(offset_of!(KernelRecordPrefix, correlationId), 92);
        assert_eq!(offset_of!(KernelRecordPrefix, gridId), 96);
        assert_eq!(offset_of!(KernelRecordPrefix, name), 104);
        assert_eq!(offset_of!(KernelRecordPrefix, queued), 120);
        assert_eq!(offset_of!(KernelRecordPrefix, submitted), 128);
        assert_eq!(offset_of!(KernelRecordPrefix, launchType), 136);
        assert_eq!(offset_of!(KernelRecordPrefix, sharedMemoryExecuted), 140);
        assert_eq!(offset_of!(KernelRecordPrefix, graphNodeId), 144);
        assert_eq!(offset_of!(KernelRecordPrefix, shmemLimitConfig), 152);
        assert_eq!(offset_of!(KernelRecordPrefix, graphId), 156);
        assert_eq!(size_of::<KernelRecordPrefix>(), 160);
    }

    /// Offsets from `CUpti_ActivityMemcpy5`/`6` (`graphNodeId` follows `reserved0`).
    #[test]
    fn memcpy_record_prefix_matches_the_header() {
        assert_eq!(offset_of!(MemcpyRecordPrefix, bytes), 8);
        assert_eq!(offset_of!(MemcpyRecordPrefix, start), 16);
        assert_eq!(offset_of!(MemcpyRecordPrefix, end), 24);
        assert_eq!(offset_of!(MemcpyRecordPrefix, deviceId), 32);
        assert_eq!(offset_of!(MemcpyRecordPrefix, streamId), 40);
        assert_eq!(offset_of!(MemcpyRecordPrefix, correlationId), 44);
        assert_eq!(offset_of!(MemcpyRecordPrefix, reserved0), 56);
        assert_eq!(offset_of!(MemcpyRecordPrefix, graphNodeId), 64);
        assert_eq!(offset_of!(MemcpyRecordPrefix, graphId), 72);
    }

    /// Offsets from `CUpti_ActivityMemset4`/`5`.
    #[test]
    fn memset_record_prefix_matches_the_header() {
        assert_eq!(offset_of!(MemsetRecordPrefix, value), 4);
        assert_eq!(offset_of!(MemsetRecordPrefix, bytes), 8);
        assert_eq!(offset_of!(MemsetRecordPrefix, start), 16);
        assert_eq!(offset_of!(MemsetRecordPrefix, end), 24);
        assert_eq!(offset_of!(MemsetRecordPrefix, streamId), 40);
        assert_eq!(offset_of!(MemsetRecordPrefix, correlationId), 44);
        assert_eq!(offset_of!(MemsetRecordPrefix, flags), 48);
        assert_eq!(offset_of!(MemsetRecordPrefix, reserved0), 56);
        assert_eq!(offset_of!(MemsetRecordPrefix, graphNodeId), 64);
        assert_eq!(offset_of!(MemsetRecordPrefix, graphId), 72);
    }

    /// `CUpti_CallbackData`, `CUpti_ResourceData` and `CUpti_GraphData` on LP64.
    #[test]
    fn callback_structs_match_the_header() {
        assert_eq!(offset_of!(CUpti_CallbackData, functionName), 8);
        assert_eq!(offset_of!(CUpti_CallbackData, functionReturnValue), 24);
        assert_eq!(offset_of!(CUpti_CallbackData, context), 40);
        assert_eq!(offset_of!(CUpti_CallbackData, contextUid), 48);
        assert_eq!(offset_of!(CUpti_CallbackData, correlationData), 56);
        assert_eq!(offset_of!(CUpti_CallbackData, correlationId), 64);
        assert_eq!(offset_of!(CUpti_ResourceData, resourceDescriptor), 16);
        assert_eq!(offset_of!(CUpti_GraphData, node), 16);
        assert_eq!(offset_of!(CUpti_GraphData, originalNode), 24);
        assert_eq!(offset_of!(CUpti_GraphData, nodeType), 32);
        assert_eq!(offset_of!(CUpti_GraphData, graphExec), 48);
    }
}
