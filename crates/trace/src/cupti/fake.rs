//! A fake CUPTI in host memory, so the CUPTI path's logic runs in CI without a GPU: the
//! subscriber rule, callbacks for launches and graph-node clones, activity buffers filled with
//! records in the real layouts, and a clock offset from the trace clock.
//!
//! CUPTI is process-wide, so the fake is too: [`FakeCupti::install`] takes a process-wide lock
//! (tests that use it run one at a time) and resets the fake.
//!
//! ```
//! use cuhal_trace::cupti::{fake::FakeCupti, CaptureGuard, CuptiSession, ActivityKind};
//!
//! let fake = FakeCupti::install();
//! let session = CuptiSession::acquire_with(fake.api())?;
//! let capture = CaptureGuard::start();
//! let id = fake.launch(cuhal_trace::cupti::ffi::cbid::LAUNCH_KERNEL);
//! capture.finish(|ids| assert_eq!(ids, [id]));
//! fake.complete_kernel(id, 1_000, 2_000, 0);
//! session.flush()?;
//! assert_eq!(session.take(id, |a| assert_eq!(a.kind, ActivityKind::Kernel)), 1);
//! # Ok::<(), cuhal_trace::cupti::CuptiError>(())
//! ```

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_void};
use std::sync::{Mutex, MutexGuard};

use cuhal_sys::{CUcontext, CUgraphNode};

use super::ffi::{self, *};
use crate::clock;
use crate::lock::lock;

/// Bytes the fake gives each kernel record (`CUpti_ActivityKernel10`'s size).
const KERNEL_RECORD_BYTES: usize = 216;
/// Bytes the fake gives each copy or fill record.
const MEMORY_RECORD_BYTES: usize = 104;

enum FakeRecord {
    Kernel(KernelRecordPrefix),
    Memcpy(MemcpyRecordPrefix),
    Memset(MemsetRecordPrefix),
}

// SAFETY: the kernel record's pointers are always null in the fake.
unsafe impl Send for FakeRecord {}

#[derive(Default)]
struct State {
    subscribed: bool,
    taken_by_other: bool,
    callback: Option<CUpti_CallbackFunc>,
    callbacks: HashSet<(u32, u32)>,
    request: Option<BufferRequestFunc>,
    complete: Option<BufferCompleteFunc>,
    kinds: HashSet<u32>,
    pending: Vec<FakeRecord>,
    next_correlation: u32,
    node_ids: HashMap<usize, u64>,
    clock_offset_ns: i128,
    fixed_timestamp: Option<u64>,
    dropped: usize,
    flushes: u64,
    /// Calls of each entry point, by name.
    calls: HashMap<&'static str, u64>,
    /// The activity kinds enabled when each launch was made, by correlation id: a record is
    /// produced for work launched while its kind was enabled, as CUPTI instruments a launch
    /// when it is made.
    launched_with: HashMap<u32, HashSet<u32>>,
}

impl State {
    fn count(&mut self, name: &'static str) {
        *self.calls.entry(name).or_insert(0) += 1;
    }

    /// Whether the work of call `correlation_id` produces a record of `kind`: the kind was
    /// enabled when it was launched (through [`FakeCupti::launch`]), else is enabled now.
    fn traces(&self, correlation_id: u32, kind: u32) -> bool {
        self.launched_with
            .get(&correlation_id)
            .map_or_else(|| self.kinds.contains(&kind), |k| k.contains(&kind))
    }
}

static STATE: Mutex<Option<State>> = Mutex::new(None);
static INSTALLED: Mutex<()> = Mutex::new(());

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut s = lock(&STATE);
    f(s.get_or_insert_with(State::default))
}

unsafe extern "C" fn subscribe(
    out: *mut CUpti_SubscriberHandle,
    callback: CUpti_CallbackFunc,
    _userdata: *mut c_void,
) -> CUptiResult {
    with(|s| {
        s.count("cuptiSubscribe");
        if s.taken_by_other || s.subscribed {
            return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
        }
        s.subscribed = true;
        s.callback = Some(callback);
        // SAFETY: CUPTI's contract: a valid out-pointer.
        unsafe { *out = 0x5b5 as *mut c_void };
        CUPTI_SUCCESS
    })
}

unsafe extern "C" fn unsubscribe(_handle: CUpti_SubscriberHandle) -> CUptiResult {
    with(|s| {
        s.count("cuptiUnsubscribe");
        s.subscribed = false;
        s.callback = None;
        s.callbacks.clear();
        CUPTI_SUCCESS
    })
}

unsafe extern "C" fn enable_callback(
    enable: u32,
    _handle: CUpti_SubscriberHandle,
    domain: CUpti_CallbackDomain,
    cbid: CUpti_CallbackId,
) -> CUptiResult {
    with(|s| {
        s.count("cuptiEnableCallback");
        if enable != 0 {
            s.callbacks.insert((domain, cbid));
        } else {
            s.callbacks.remove(&(domain, cbid));
        }
        CUPTI_SUCCESS
    })
}

unsafe extern "C" fn register_callbacks(
    request: BufferRequestFunc,
    complete: BufferCompleteFunc,
) -> CUptiResult {
    with(|s| {
        s.count("cuptiActivityRegisterCallbacks");
        s.request = Some(request);
        s.complete = Some(complete);
        CUPTI_SUCCESS
    })
}

unsafe extern "C" fn activity_enable(kind: CUpti_ActivityKind) -> CUptiResult {
    with(|s| {
        s.count("cuptiActivityEnable");
        s.kinds.insert(kind);
        CUPTI_SUCCESS
    })
}

unsafe extern "C" fn activity_disable(kind: CUpti_ActivityKind) -> CUptiResult {
    with(|s| {
        s.count("cuptiActivityDisable");
        s.kinds.remove(&kind);
        CUPTI_SUCCESS
    })
}

fn record_bytes(kind: u32) -> usize {
    match kind {
        CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL | CUPTI_ACTIVITY_KIND_KERNEL => KERNEL_RECORD_BYTES,
        _ => MEMORY_RECORD_BYTES,
    }
}

unsafe extern "C" fn flush_all(_flag: u32) -> CUptiResult {
    let (records, request, complete) = with(|s| {
        s.count("cuptiActivityFlushAll");
        s.flushes += 1;
        (std::mem::take(&mut s.pending), s.request, s.complete)
    });
    if records.is_empty() {
        return CUPTI_SUCCESS;
    }
    let (Some(request), Some(complete)) = (request, complete) else {
        return CUPTI_ERROR_NOT_INITIALIZED;
    };
    let mut records = records.into_iter().peekable();
    while records.peek().is_some() {
        let (mut buffer, mut size, mut max) = (std::ptr::null_mut::<u8>(), 0usize, 0usize);
        // SAFETY: the registered request callback with valid out-pointers, as CUPTI calls it.
        unsafe { request(&mut buffer, &mut size, &mut max) };
        if buffer.is_null() || size == 0 {
            let n = records.count();
            with(|s| s.dropped += n);
            return CUPTI_SUCCESS;
        }
        let mut valid = 0usize;
        while let Some(record) = records.peek() {
            let (bytes, src): (usize, *const u8) = match record {
                FakeRecord::Kernel(k) => {
                    (KERNEL_RECORD_BYTES, (k as *const KernelRecordPrefix).cast())
                }
                FakeRecord::Memcpy(m) => {
                    (MEMORY_RECORD_BYTES, (m as *const MemcpyRecordPrefix).cast())
                }
                FakeRecord::Memset(m) => {
                    (MEMORY_RECORD_BYTES, (m as *const MemsetRecordPrefix).cast())
                }
            };
            if valid + bytes > size {
                break;
            }
            let prefix = match record {
                FakeRecord::Kernel(_) => size_of::<KernelRecordPrefix>(),
                FakeRecord::Memcpy(_) => size_of::<MemcpyRecordPrefix>(),
                FakeRecord::Memset(_) => size_of::<MemsetRecordPrefix>(),
            };
            // SAFETY: the buffer has `size` bytes and `valid + bytes <= size`; the source is a
            // whole prefix struct of `prefix <= bytes` bytes; the rest of the slot is zeroed.
            unsafe {
                std::ptr::write_bytes(buffer.add(valid), 0, bytes);
                std::ptr::copy_nonoverlapping(src, buffer.add(valid), prefix);
            }
            valid += bytes;
            records.next();
        }
        // SAFETY: the registered completion callback, handed the buffer it gave out.
        unsafe { complete(std::ptr::null_mut(), 0, buffer, size, valid) };
    }
    CUPTI_SUCCESS
}

unsafe extern "C" fn next_record(
    buffer: *mut u8,
    valid: usize,
    record: *mut *mut CUpti_Activity,
) -> CUptiResult {
    with(|s| s.count("cuptiActivityGetNextRecord"));
    // SAFETY: CUPTI's contract: `record` is a valid in/out pointer into `buffer` or null.
    let current = unsafe { *record };
    let offset = if current.is_null() {
        0
    } else {
        // SAFETY: `current` points at a record the fake wrote inside `buffer`.
        let kind = unsafe { (*current).kind };
        current as usize - buffer as usize + record_bytes(kind)
    };
    if offset >= valid {
        return CUPTI_ERROR_MAX_LIMIT_REACHED;
    }
    // SAFETY: `offset < valid`, inside the buffer.
    unsafe { *record = buffer.add(offset).cast() };
    CUPTI_SUCCESS
}

unsafe extern "C" fn dropped_records(_c: CUcontext, _s: u32, out: *mut usize) -> CUptiResult {
    // SAFETY: a valid out-pointer.
    with(|s| unsafe {
        s.count("cuptiActivityGetNumDroppedRecords");
        *out = s.dropped;
    });
    CUPTI_SUCCESS
}

unsafe extern "C" fn get_timestamp(out: *mut u64) -> CUptiResult {
    let (offset, fixed) = with(|s| {
        s.count("cuptiGetTimestamp");
        (s.clock_offset_ns, s.fixed_timestamp)
    });
    let t = fixed.map_or(i128::from(clock::now_ns()) + offset, i128::from);
    // SAFETY: a valid out-pointer.
    unsafe { *out = u64::try_from(t.max(0)).unwrap_or(u64::MAX) };
    CUPTI_SUCCESS
}

unsafe extern "C" fn graph_node_id(node: CUgraphNode, out: *mut u64) -> CUptiResult {
    match with(|s| {
        s.count("cuptiGetGraphNodeId");
        s.node_ids.get(&(node as usize)).copied()
    }) {
        Some(id) => {
            // SAFETY: a valid out-pointer.
            unsafe { *out = id };
            CUPTI_SUCCESS
        }
        None => CUPTI_ERROR_INVALID_PARAMETER,
    }
}

unsafe extern "C" fn result_string(result: CUptiResult, out: *mut *const c_char) -> CUptiResult {
    let text: &'static [u8] = match result {
        CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED => b"multiple subscribers (fake)\0",
        _ => b"fake CUPTI error\0",
    };
    // SAFETY: a valid out-pointer; the string is static.
    unsafe { *out = text.as_ptr().cast() };
    CUPTI_SUCCESS
}

/// The fake CUPTI, installed for the life of this guard (one at a time per process).
pub struct FakeCupti {
    _installed: MutexGuard<'static, ()>,
}

impl std::fmt::Debug for FakeCupti {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeCupti").finish_non_exhaustive()
    }
}

impl FakeCupti {
    /// Installs a fresh fake, waiting for any other user of it in this process to finish.
    pub fn install() -> Self {
        let installed = INSTALLED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *lock(&STATE) = Some(State {
            next_correlation: 1,
            ..State::default()
        });
        Self {
            _installed: installed,
        }
    }

    /// The fake's entry points.
    pub fn api(&self) -> CuptiApi {
        CuptiApi {
            cuptiSubscribe: subscribe,
            cuptiUnsubscribe: unsubscribe,
            cuptiEnableCallback: enable_callback,
            cuptiActivityRegisterCallbacks: register_callbacks,
            cuptiActivityEnable: activity_enable,
            cuptiActivityDisable: activity_disable,
            cuptiActivityFlushAll: flush_all,
            cuptiActivityGetNextRecord: next_record,
            cuptiActivityGetNumDroppedRecords: dropped_records,
            cuptiGetTimestamp: get_timestamp,
            cuptiGetGraphNodeId: graph_node_id,
            cuptiGetResultString: result_string,
        }
    }

    /// Another profiler holds the subscriber: `cuptiSubscribe` fails as CUPTI's does.
    pub fn take_subscriber(&self) {
        with(|s| s.taken_by_other = true);
    }

    /// Whether a subscriber is registered.
    pub fn subscribed(&self) -> bool {
        with(|s| s.subscribed)
    }

    /// Whether activity `kind` is enabled.
    pub fn kind_enabled(&self, kind: CUpti_ActivityKind) -> bool {
        with(|s| s.kinds.contains(&kind))
    }

    /// CUPTI's clock runs `offset_ns` ahead of the trace clock.
    pub fn set_clock_offset(&self, offset_ns: i128) {
        with(|s| s.clock_offset_ns = offset_ns);
    }

    /// `cuptiGetTimestamp` answers `t` from now on (`None`: the trace clock plus the offset).
    pub fn set_timestamp(&self, t: Option<u64>) {
        with(|s| s.fixed_timestamp = t);
    }

    /// `cuptiActivityFlushAll` calls so far.
    pub fn flushes(&self) -> u64 {
        with(|s| s.flushes)
    }

    /// Calls of the entry point named `name` (as [`cupti_name!`](crate::cupti_name!) names
    /// it) so far. `cuptiGetResultString` is not counted: it describes an error, it asks
    /// CUPTI nothing.
    pub fn calls(&self, name: &str) -> u64 {
        with(|s| s.calls.get(name).copied().unwrap_or(0))
    }

    /// Calls of every entry point so far (as [`FakeCupti::calls`] counts them).
    pub fn total_calls(&self) -> u64 {
        with(|s| s.calls.values().sum())
    }

    fn call_api(&self, cbid: u32, result: i32) -> u32 {
        let (id, callback) = with(|s| {
            let id = s.next_correlation;
            s.next_correlation += 1;
            let kinds = s.kinds.clone();
            s.launched_with.insert(id, kinds);
            let cb = s
                .callbacks
                .contains(&(ffi::CUPTI_CB_DOMAIN_DRIVER_API, cbid))
                .then_some(s.callback)
                .flatten();
            (id, cb)
        });
        if let Some(callback) = callback {
            let mut ret = result;
            for site in [0, ffi::CUPTI_API_EXIT] {
                let data = CUpti_CallbackData {
                    callbackSite: site,
                    functionName: c"cuFake".as_ptr(),
                    functionParams: std::ptr::null(),
                    functionReturnValue: (&raw mut ret).cast(),
                    symbolName: std::ptr::null(),
                    context: std::ptr::null_mut(),
                    contextUid: 1,
                    correlationData: std::ptr::null_mut(),
                    correlationId: id,
                };
                // SAFETY: the subscriber's callback, called as CUPTI calls it, with data that
                // lives across the call.
                unsafe {
                    callback(
                        std::ptr::null_mut(),
                        ffi::CUPTI_CB_DOMAIN_DRIVER_API,
                        cbid,
                        (&raw const data).cast(),
                    )
                };
            }
        }
        id
    }

    /// A successful driver call with callback id `cbid` on this thread; returns its
    /// correlation id.
    pub fn launch(&self, cbid: CUpti_CallbackId) -> u32 {
        self.call_api(cbid, 0)
    }

    /// A driver call that fails (it produces no activity).
    pub fn failed_launch(&self, cbid: CUpti_CallbackId) -> u32 {
        self.call_api(cbid, 1)
    }

    /// Gives graph node `node` the CUPTI id `id`.
    pub fn set_node_id(&self, node: CUgraphNode, id: u64) {
        with(|s| s.node_ids.insert(node as usize, id));
    }

    /// Instantiation cloned `original` into `clone` (both need ids): the resource callback.
    pub fn clone_node(&self, original: CUgraphNode, clone: CUgraphNode) {
        let callback = with(|s| {
            s.callbacks
                .contains(&(
                    ffi::CUPTI_CB_DOMAIN_RESOURCE,
                    ffi::CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED,
                ))
                .then_some(s.callback)
                .flatten()
        });
        let Some(callback) = callback else {
            return;
        };
        let mut graph = CUpti_GraphData {
            graph: std::ptr::null_mut(),
            originalGraph: std::ptr::null_mut(),
            node: clone,
            originalNode: original,
            nodeType: 0,
            dependency: std::ptr::null_mut(),
            graphExec: std::ptr::null_mut(),
        };
        let resource = CUpti_ResourceData {
            context: std::ptr::null_mut(),
            resourceHandle: std::ptr::null_mut(),
            resourceDescriptor: (&raw mut graph).cast(),
        };
        // SAFETY: as CUPTI calls a resource callback; the data lives across the call.
        unsafe {
            callback(
                std::ptr::null_mut(),
                ffi::CUPTI_CB_DOMAIN_RESOURCE,
                ffi::CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED,
                (&raw const resource).cast(),
            )
        };
    }

    /// A kernel ran from `start` to `end` (CUPTI clock) for the call `correlation_id`, as graph
    /// node `graph_node_id` (0 outside graphs). Kept until the next flush if kernels are traced:
    /// if the kind was enabled when that call was made ([`FakeCupti::launch`]), or, for a call
    /// the fake did not see, is enabled now.
    pub fn complete_kernel(&self, correlation_id: u32, start: u64, end: u64, graph_node_id: u64) {
        with(|s| {
            if s.traces(correlation_id, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
                s.pending.push(FakeRecord::Kernel(KernelRecordPrefix {
                    kind: CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                    start,
                    end,
                    completed: end,
                    correlationId: correlation_id,
                    graphNodeId: graph_node_id,
                    graphId: u32::from(graph_node_id != 0),
                    ..Default::default()
                }));
            }
        });
    }

    /// A copy, as [`FakeCupti::complete_kernel`].
    pub fn complete_memcpy(&self, correlation_id: u32, start: u64, end: u64, graph_node_id: u64) {
        with(|s| {
            if s.traces(correlation_id, CUPTI_ACTIVITY_KIND_MEMCPY) {
                s.pending.push(FakeRecord::Memcpy(MemcpyRecordPrefix {
                    kind: CUPTI_ACTIVITY_KIND_MEMCPY,
                    start,
                    end,
                    correlationId: correlation_id,
                    graphNodeId: graph_node_id,
                    ..Default::default()
                }));
            }
        });
    }

    /// A fill, as [`FakeCupti::complete_kernel`].
    pub fn complete_memset(&self, correlation_id: u32, start: u64, end: u64, graph_node_id: u64) {
        with(|s| {
            if s.traces(correlation_id, CUPTI_ACTIVITY_KIND_MEMSET) {
                s.pending.push(FakeRecord::Memset(MemsetRecordPrefix {
                    kind: CUPTI_ACTIVITY_KIND_MEMSET,
                    start,
                    end,
                    correlationId: correlation_id,
                    graphNodeId: graph_node_id,
                    ..Default::default()
                }));
            }
        });
    }
}

impl Drop for FakeCupti {
    fn drop(&mut self) {
        *lock(&STATE) = None;
    }
}
