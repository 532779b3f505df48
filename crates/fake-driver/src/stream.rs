//! Streams and events of a synchronous GPU.
//!
//! Work runs when it is enqueued, in call order, so a stream is always idle, an event is
//! complete as soon as it is recorded, and waits return at once. An event remembers the
//! monotonic time of its last record, which `cuEventElapsedTime` reports.
//!
//! Unless the instance is given a [`Timing`]: then each kernel launch and graph launch keeps its
//! stream busy for a while on a model clock (the work itself still runs at once), an event
//! completes when the work recorded before it would have, a device wait on an event that is
//! not complete holds the waiting stream until it is (plus a cross-stream gap), and
//! `cuEventQuery` and `cuEventElapsedTime` say `CUDA_ERROR_NOT_READY` until then, while
//! `cuEventSynchronize` and `cuStreamSynchronize` sleep until then. This is what host-side cost measurements of a
//! scheduler need from a GPU: completions that come later than submissions.
// Functions carry the driver's names so a reader can match them to cuda.h.
#![allow(non_snake_case)]

use std::ffi::{c_int, c_uint, c_void};
use std::time::Instant;

use cuhal_sys::{
    CU_EVENT_DISABLE_TIMING, CUevent, CUgraph, CUgraphEdgeData, CUgraphNode, CUhostFn, CUstream,
};

use crate::entry::{ensure, entry, put};
use crate::status;
use crate::world::{World, handle, id, lookup, lookup_mut, world};

/// The lowest stream priority (the default).
pub const LEAST_PRIORITY: c_int = 0;
/// The highest stream priority.
pub const GREATEST_PRIORITY: c_int = -5;

/// `CU_STREAM_LEGACY`.
const STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD`.
const STREAM_PER_THREAD: usize = 0x2;
/// `CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS`.
const EVENT_FLAGS: c_uint = 0x7;

/// A created stream.
#[derive(Debug)]
pub(crate) struct Stream {
    pub device: i32,
    /// Under a [`Timing`]: when the work enqueued so far would be done.
    pub busy_until: Option<Instant>,
    /// The capture under way on this stream, if any.
    pub capture: Option<Capture>,
}

/// A stream capture (`cuStreamBeginCaptureToGraph`): work enqueued on the stream becomes nodes
/// of `graph` instead of running.
#[derive(Debug)]
pub(crate) struct Capture {
    pub graph: usize,
    /// The nodes the next captured operation depends on. Node handles are their ids, so this
    /// has the layout of a `CUgraphNode` array (`cuStreamGetCaptureInfo` hands it out).
    pub deps: Vec<usize>,
    pub mode: c_uint,
    /// The thread that began the capture (thread-local mode forbids unsafe calls there).
    pub thread: std::thread::ThreadId,
    pub id: u64,
    /// A forbidden call invalidated it: later captured work fails, and ending it fails.
    pub invalidated: bool,
}

/// A created event.
#[derive(Debug)]
pub(crate) struct Event {
    pub device: i32,
    pub flags: c_uint,
    /// When it was last recorded.
    pub recorded: Option<Instant>,
    /// When the work recorded before it completes (later than `recorded` only under a
    /// [`Timing`]).
    pub complete_at: Option<Instant>,
}

/// How long device work takes on the model clock (see the module's documentation). Zero
/// durations (the default) keep the fake synchronous.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timing {
    /// How long each kernel launch (`cuLaunchKernel`) or graph launch (`cuGraphLaunch`) keeps its
    /// stream busy.
    pub launch: std::time::Duration,
    /// How much later than the event a stream that waited for a not yet complete event
    /// (`cuStreamWaitEvent`) can go on: the GPU's cross-stream dependency gap.
    pub cross_stream: std::time::Duration,
}

/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`.
pub(crate) const STREAM_CAPTURE_UNSUPPORTED: c_int = 900;
/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`.
pub(crate) const STREAM_CAPTURE_INVALIDATED: c_int = 901;
/// `CUDA_ERROR_STREAM_CAPTURE_ISOLATION`.
pub(crate) const STREAM_CAPTURE_ISOLATION: c_int = 905;
/// `CUDA_ERROR_ILLEGAL_STATE`.
const ILLEGAL_STATE: c_int = 401;

impl World {
    /// Whether `stream` (a created stream) is capturing.
    pub(crate) fn is_capturing(&self, stream: CUstream) -> bool {
        self.streams
            .get(&stream.addr())
            .is_some_and(|s| s.capture.is_some())
    }

    /// Invalidates `stream`'s capture, if it has one.
    pub(crate) fn invalidate_capture(&mut self, stream: CUstream) {
        if let Some(capture) = self
            .streams
            .get_mut(&stream.addr())
            .and_then(|s| s.capture.as_mut())
        {
            capture.invalidated = true;
        }
    }

    /// A synchronizing call on `stream`: refused (and the capture invalidated) while it captures.
    pub(crate) fn forbid_while_capturing(&mut self, stream: CUstream) -> Result<(), c_int> {
        if self.is_capturing(stream) {
            self.invalidate_capture(stream);
            return Err(STREAM_CAPTURE_UNSUPPORTED);
        }
        Ok(())
    }

    /// A potentially unsafe call (synchronization, synchronous copies, allocation) on this
    /// thread: refused, invalidating them, while this thread has a capture in global or
    /// thread-local mode under way.
    pub(crate) fn forbid_on_capturing_thread(&mut self) -> Result<(), c_int> {
        let me = std::thread::current().id();
        let mut forbidden = false;
        for capture in self.streams.values_mut().filter_map(|s| s.capture.as_mut()) {
            if capture.thread == me && capture.mode != cuhal_sys::CU_STREAM_CAPTURE_MODE_RELAXED {
                capture.invalidated = true;
                forbidden = true;
            }
        }
        ensure(!forbidden, STREAM_CAPTURE_UNSUPPORTED)
    }

    /// If `stream` is capturing, adds the node `op` makes to the capture's graph after the
    /// capture's frontier (which it becomes) and returns `true`; else `false`: run the work now.
    /// Work on an invalidated capture is `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`.
    pub(crate) fn captured(
        &mut self,
        stream: CUstream,
        op: impl FnOnce() -> crate::graph::Op,
    ) -> Result<bool, c_int> {
        let Some(capture) = self
            .streams
            .get(&stream.addr())
            .and_then(|s| s.capture.as_ref())
        else {
            return Ok(false);
        };
        ensure(!capture.invalidated, STREAM_CAPTURE_INVALIDATED)?;
        let (graph, deps) = (capture.graph, capture.deps.clone());
        let node = self.insert_node(graph, deps, op())?;
        if let Some(capture) = self
            .streams
            .get_mut(&stream.addr())
            .and_then(|s| s.capture.as_mut())
        {
            capture.deps = vec![node];
        }
        Ok(true)
    }

    /// The device of `stream`; the null, legacy and per-thread streams are those of the
    /// current context.
    pub fn stream_device(&self, stream: CUstream) -> Result<i32, c_int> {
        match stream.addr() {
            0 | STREAM_LEGACY | STREAM_PER_THREAD => self.current_context().map(|(_, d)| d),
            stream => lookup(&self.streams, stream).map(|s| s.device),
        }
    }

    /// Records `event` now, complete at `complete_at` (now, unless a [`Timing`] keeps the
    /// stream it is recorded on busy).
    pub fn record(&mut self, event: usize, complete_at: Instant) -> Result<(), c_int> {
        let event = lookup_mut(&mut self.events, event)?;
        event.recorded = Some(Instant::now());
        event.complete_at = Some(complete_at);
        Ok(())
    }

    /// When the work enqueued on `stream` so far completes on the model clock: now for the
    /// null, legacy and per-thread streams and without a [`Timing`].
    pub fn stream_done_at(&self, stream: CUstream) -> Instant {
        let now = Instant::now();
        self.streams
            .get(&stream.addr())
            .and_then(|s| s.busy_until)
            .map_or(now, |t| t.max(now))
    }

    /// A launch on `stream` (not capturing): under a [`Timing`], the stream is busy for one
    /// more launch.
    pub fn occupy(&mut self, stream: CUstream) {
        let launch = self.timing.launch;
        if launch.is_zero() {
            return;
        }
        let start = self.stream_done_at(stream);
        if let Some(s) = self.streams.get_mut(&stream.addr()) {
            s.busy_until = Some(start + launch);
        }
    }

    /// `stream` waits on the device for `event`: under a [`Timing`], it is busy until the event
    /// completes plus the cross-stream gap, if the event is not complete yet.
    fn wait_on_device(&mut self, stream: CUstream, event: usize) {
        let Some(complete_at) = self.events.get(&event).and_then(|e| e.complete_at) else {
            return;
        };
        let now = Instant::now();
        if complete_at <= now {
            return;
        }
        let ready = complete_at + self.timing.cross_stream;
        if let Some(s) = self.streams.get_mut(&stream.addr()) {
            s.busy_until = Some(s.busy_until.map_or(ready, |t| t.max(ready)));
        }
    }
}

/// # Safety
/// `out` is null or valid for one write.
unsafe fn create_stream(name: &'static str, out: *mut CUstream, flags: c_uint) -> c_int {
    entry(name, || {
        // CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING.
        ensure(flags <= 1 && !out.is_null(), status::INVALID_VALUE)?;
        let mut world = world();
        let (_, device) = world.current_context()?;
        let stream = world.new_handle();
        world.streams.insert(
            stream,
            Stream {
                device,
                busy_until: None,
                capture: None,
            },
        );
        // SAFETY: forwarded caller contract (checked non-null above).
        unsafe { put(out, handle(stream)) }
    })
}

/// `CUresult cuStreamCreate(CUstream *phStream, unsigned int flags)`.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuStreamCreate(out: *mut CUstream, flags: c_uint) -> c_int {
    // SAFETY: forwarded caller contract.
    unsafe { create_stream("cuStreamCreate", out, flags) }
}

/// `CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)`.
/// Any priority is accepted (the real driver clamps it): work never waits behind other work.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    out: *mut CUstream,
    flags: c_uint,
    _priority: c_int,
) -> c_int {
    // SAFETY: forwarded caller contract.
    unsafe { create_stream("cuStreamCreateWithPriority", out, flags) }
}

/// `CUresult cuStreamDestroy_v2(CUstream hStream)`.
pub extern "C" fn cuStreamDestroy(stream: CUstream) -> c_int {
    entry("cuStreamDestroy", || {
        let stream = id(stream)?;
        world()
            .streams
            .remove(&stream)
            .map(drop)
            .ok_or(status::INVALID_HANDLE)
    })
}

/// `CUresult cuStreamSynchronize(CUstream hStream)`: every stream is idle.
///
/// On a capturing stream it is `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates the
/// capture, as in CUDA.
pub extern "C" fn cuStreamSynchronize(stream: CUstream) -> c_int {
    entry("cuStreamSynchronize", || {
        let done_at = {
            let mut world = world();
            world.stream_device(stream)?;
            world.forbid_while_capturing(stream)?;
            world.stream_done_at(stream)
        };
        // Under a `Timing`, the stream's work is done then; the lock is not held meanwhile.
        sleep_until(Some(done_at), || Some(world().stream_done_at(stream)));
        Ok(())
    })
}

/// `CUresult cuStreamQuery(CUstream hStream)`: every stream is idle.
/// Forbidden on a capturing stream, like synchronization.
pub extern "C" fn cuStreamQuery(stream: CUstream) -> c_int {
    entry("cuStreamQuery", || {
        let mut world = world();
        world.stream_device(stream)?;
        world.forbid_while_capturing(stream)
    })
}

/// `CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int flags)`: the
/// event's work is done, so there is nothing to wait for.
///
/// On a capturing stream: `CU_EVENT_WAIT_EXTERNAL` becomes an event-wait node; a plain wait on an
/// event recorded outside the capture is `CUDA_ERROR_STREAM_CAPTURE_ISOLATION` and invalidates it.
pub extern "C" fn cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint) -> c_int {
    entry("cuStreamWaitEvent", || {
        let mut world = world();
        world.stream_device(stream)?;
        let event = id(event)?;
        lookup(&world.events, event)?;
        // CU_EVENT_WAIT_DEFAULT or CU_EVENT_WAIT_EXTERNAL.
        ensure(flags <= 1, status::INVALID_VALUE)?;
        if world.is_capturing(stream) && flags == 0 {
            world.invalidate_capture(stream);
            return Err(STREAM_CAPTURE_ISOLATION);
        }
        if !world.captured(stream, || crate::graph::Op::EventWait { event })? {
            world.wait_on_device(stream, event);
        }
        Ok(())
    })
}

/// `CUresult cuStreamGetId(CUstream hStream, unsigned long long *streamId)`.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuStreamGetId(stream: CUstream, out: *mut u64) -> c_int {
    entry("cuStreamGetId", || {
        world().stream_device(stream)?;
        // SAFETY: forwarded caller contract.
        unsafe { put(out, stream.addr() as u64) }
    })
}

/// `CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)`: runs `function`
/// now, on the calling thread, since the stream's earlier work is done (and without the
/// fake's lock, so a function that breaks CUDA's rules and calls the driver does not deadlock).
///
/// # Safety
/// `function` is null or a function that may be called with `user_data`.
pub unsafe extern "C" fn cuLaunchHostFunc(
    stream: CUstream,
    function: CUhostFn,
    user_data: *mut c_void,
) -> c_int {
    entry("cuLaunchHostFunc", || {
        world().stream_device(stream)?;
        let function = function.ok_or(status::INVALID_VALUE)?;
        // SAFETY: the caller vouches for calling `function` with `user_data`.
        unsafe { function(user_data) };
        Ok(())
    })
}

/// `CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)`.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuEventCreate(out: *mut CUevent, flags: c_uint) -> c_int {
    entry("cuEventCreate", || {
        ensure(
            flags & !EVENT_FLAGS == 0 && !out.is_null(),
            status::INVALID_VALUE,
        )?;
        let mut world = world();
        let (_, device) = world.current_context()?;
        let event = world.new_handle();
        world.events.insert(
            event,
            Event {
                device,
                flags,
                recorded: None,
                complete_at: None,
            },
        );
        // SAFETY: forwarded caller contract (checked non-null above).
        unsafe { put(out, handle(event)) }
    })
}

/// `CUresult cuEventRecord(CUevent hEvent, CUstream hStream)`.
pub extern "C" fn cuEventRecord(event: CUevent, stream: CUstream) -> c_int {
    entry("cuEventRecord", || record_on(event, stream))
}

/// `CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)`.
pub extern "C" fn cuEventRecordWithFlags(event: CUevent, stream: CUstream, flags: c_uint) -> c_int {
    entry("cuEventRecordWithFlags", || {
        // CU_EVENT_RECORD_DEFAULT or CU_EVENT_RECORD_EXTERNAL.
        ensure(flags <= 1, status::INVALID_VALUE)?;
        record_on(event, stream)
    })
}

fn record_on(event: CUevent, stream: CUstream) -> Result<(), c_int> {
    let mut world = world();
    let event = id(event)?;
    let device = world.stream_device(stream)?;
    // An event records only on streams of its own context.
    ensure(
        lookup(&world.events, event)?.device == device,
        status::INVALID_HANDLE,
    )?;
    if world.captured(stream, || crate::graph::Op::EventRecord { event })? {
        return Ok(());
    }
    let complete_at = world.stream_done_at(stream);
    world.record(event, complete_at)
}

/// `CUresult cuEventQuery(CUevent hEvent)`: complete, recorded or not (as the real driver
/// says of an event never recorded), unless a [`Timing`] still runs the work before it:
/// `CUDA_ERROR_NOT_READY` then.
pub extern "C" fn cuEventQuery(event: CUevent) -> c_int {
    entry("cuEventQuery", || {
        let complete_at = lookup(&world().events, id(event)?)?.complete_at;
        ensure(
            complete_at.is_none_or(|t| t <= Instant::now()),
            status::NOT_READY,
        )
    })
}

/// `CUresult cuEventSynchronize(CUevent hEvent)`: returns at once, or (under a [`Timing`]) once
/// the work before the event is done, sleeping without the fake's lock meanwhile.
pub extern "C" fn cuEventSynchronize(event: CUevent) -> c_int {
    entry("cuEventSynchronize", || {
        let event = id(event)?;
        let complete_at = lookup(&world().events, event)?.complete_at;
        sleep_until(complete_at, || {
            world().events.get(&event).and_then(|e| e.complete_at)
        });
        Ok(())
    })
}

/// Sleeps until `at` (model-clock completions), if it is still ahead, in short steps that
/// re-read the model clock through `again`, so that [`World::finish_work`] ends the sleep.
fn sleep_until(mut at: Option<Instant>, again: impl Fn() -> Option<Instant>) {
    const STEP: std::time::Duration = std::time::Duration::from_micros(200);
    while let Some(until) = at {
        let now = Instant::now();
        if until <= now {
            return;
        }
        std::thread::sleep((until - now).min(STEP));
        at = again();
    }
}

impl World {
    /// Completes every event and idles every stream now, whatever the [`Timing`] said.
    pub fn finish_work(&mut self) {
        let now = Instant::now();
        for event in self.events.values_mut() {
            if let Some(at) = event.complete_at.as_mut() {
                *at = (*at).min(now);
            }
        }
        for stream in self.streams.values_mut() {
            stream.busy_until = None;
        }
        self.finish_graph_launches();
    }
}

/// `CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)`: the
/// time between the two records, by the host's monotonic clock; `CUDA_ERROR_NOT_READY` while
/// either is not complete (under a [`Timing`]), as the driver answers, counted in
/// [`crate::control::cuhal_fake_elapsed_not_ready`]: compute-sanitizer reports such a call as an
/// API error.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuEventElapsedTime(out: *mut f32, start: CUevent, end: CUevent) -> c_int {
    entry("cuEventElapsedTime", || {
        let mut world = world();
        let now = Instant::now();
        let timed = |event: CUevent| -> Result<(Instant, bool), c_int> {
            let event = lookup(&world.events, id(event)?)?;
            // Timing-disabled and never-recorded events are "invalid handles" here, as in cuda.h.
            ensure(
                event.flags & CU_EVENT_DISABLE_TIMING == 0,
                status::INVALID_HANDLE,
            )?;
            let recorded = event.recorded.ok_or(status::INVALID_HANDLE)?;
            Ok((recorded, event.complete_at.is_none_or(|t| t <= now)))
        };
        let ((start, start_done), (end, end_done)) = (timed(start)?, timed(end)?);
        if !(start_done && end_done) {
            world.elapsed_not_ready += 1;
            return Err(status::NOT_READY);
        }
        let ms = if end >= start {
            end.duration_since(start).as_secs_f64() * 1e3
        } else {
            -(start.duration_since(end).as_secs_f64() * 1e3)
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(out, ms as f32) }
    })
}

/// `CUresult cuEventDestroy_v2(CUevent hEvent)`.
pub extern "C" fn cuEventDestroy(event: CUevent) -> c_int {
    entry("cuEventDestroy", || {
        let event = id(event)?;
        world()
            .events
            .remove(&event)
            .map(drop)
            .ok_or(status::INVALID_HANDLE)
    })
}

/// `CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph, const CUgraphNode
/// *dependencies, const CUgraphEdgeData *dependencyData, size_t numDependencies,
/// CUstreamCaptureMode mode)`: a created stream only (the legacy stream cannot capture), not
/// already capturing; edge data must be null or all default edges.
///
/// # Safety
/// `deps` holds `count` handles (or is null with `count` 0); `edges` is null or holds `count`
/// edge records.
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph(
    stream: CUstream,
    graph: CUgraph,
    deps: *const CUgraphNode,
    edges: *const CUgraphEdgeData,
    count: usize,
    mode: c_uint,
) -> c_int {
    entry("cuStreamBeginCaptureToGraph", || {
        let mut world = world();
        ensure(mode <= 2, status::INVALID_VALUE)?;
        ensure(count == 0 || !deps.is_null(), status::INVALID_VALUE)?;
        let graph = id(graph)?;
        // A destroyed graph is CUDA_ERROR_INVALID_VALUE here on the real driver.
        lookup(&world.graphs, graph).map_err(|_| status::INVALID_VALUE)?;
        // SAFETY: checked non-null above unless `count` is 0; `count` handles by the caller's
        // contract.
        let deps = unsafe { crate::graph::node_ids(deps, count) };
        if !edges.is_null() && count > 0 {
            // SAFETY: non-null and holding `count` records by the caller's contract.
            let edges = unsafe { std::slice::from_raw_parts(edges, count) };
            ensure(
                edges.iter().all(|e| *e == CUgraphEdgeData::default()),
                status::NOT_SUPPORTED,
            )?;
        }
        ensure(
            deps.iter().all(|d| world.nodes.get(d) == Some(&graph)),
            status::INVALID_VALUE,
        )?;
        let capture_id = world.new_handle() as u64;
        let stream = lookup_mut(&mut world.streams, id(stream)?)?;
        ensure(stream.capture.is_none(), ILLEGAL_STATE)?;
        stream.capture = Some(Capture {
            graph,
            deps,
            mode,
            thread: std::thread::current().id(),
            id: capture_id,
            invalidated: false,
        });
        Ok(())
    })
}

/// `CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)`: the graph captured into,
/// or null and `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` for an invalidated capture (which ends
/// all the same). A stream that is not capturing is `CUDA_ERROR_ILLEGAL_STATE`.
///
/// As on the real driver, an invalidated capture destroys the graph it captured into, also one
/// handed to `cuStreamBeginCaptureToGraph` by the caller: its handle and every node handle of it
/// are invalid afterwards (`CUDA_ERROR_INVALID_VALUE` from the graph calls).
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuStreamEndCapture(stream: CUstream, out: *mut CUgraph) -> c_int {
    entry("cuStreamEndCapture", || {
        ensure(!out.is_null(), status::INVALID_VALUE)?;
        let mut world = world();
        let stream = lookup_mut(&mut world.streams, id(stream)?)?;
        let capture = stream.capture.take().ok_or(ILLEGAL_STATE)?;
        if capture.invalidated {
            world.graphs.remove(&capture.graph);
            world.nodes.retain(|_, g| *g != capture.graph);
            // SAFETY: non-null and writable by the caller's contract.
            unsafe { put(out, std::ptr::null_mut()) }?;
            return Err(STREAM_CAPTURE_INVALIDATED);
        }
        // SAFETY: as above.
        unsafe { put(out, handle(capture.graph)) }
    })
}

/// `CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)`.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuStreamIsCapturing(stream: CUstream, out: *mut c_uint) -> c_int {
    entry("cuStreamIsCapturing", || {
        let world = world();
        world.stream_device(stream)?;
        let status = match world
            .streams
            .get(&stream.addr())
            .and_then(|s| s.capture.as_ref())
        {
            None => cuhal_sys::CU_STREAM_CAPTURE_STATUS_NONE,
            Some(c) if c.invalidated => cuhal_sys::CU_STREAM_CAPTURE_STATUS_INVALIDATED,
            Some(_) => cuhal_sys::CU_STREAM_CAPTURE_STATUS_ACTIVE,
        };
        // SAFETY: forwarded caller contract.
        unsafe { put(out, status) }
    })
}

/// `CUresult cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
/// cuuint64_t *id_out, CUgraph *graph_out, const CUgraphNode **dependencies_out, const
/// CUgraphEdgeData **edgeData_out, size_t *numDependencies_out)`. Every out-pointer but the
/// status may be null. The dependency array stays valid until the stream's next captured call,
/// as in CUDA; edge data is always null (default edges).
///
/// # Safety
/// Each out-pointer is null or valid for one write.
pub unsafe extern "C" fn cuStreamGetCaptureInfo(
    stream: CUstream,
    status_out: *mut c_uint,
    id_out: *mut u64,
    graph_out: *mut CUgraph,
    deps_out: *mut *const CUgraphNode,
    edges_out: *mut *const CUgraphEdgeData,
    count_out: *mut usize,
) -> c_int {
    entry("cuStreamGetCaptureInfo", || {
        let world = world();
        world.stream_device(stream)?;
        let capture = world
            .streams
            .get(&stream.addr())
            .and_then(|s| s.capture.as_ref());
        let status = match capture {
            None => cuhal_sys::CU_STREAM_CAPTURE_STATUS_NONE,
            Some(c) if c.invalidated => cuhal_sys::CU_STREAM_CAPTURE_STATUS_INVALIDATED,
            Some(_) => cuhal_sys::CU_STREAM_CAPTURE_STATUS_ACTIVE,
        };
        // SAFETY: forwarded caller contract; each optional pointer is written only if non-null.
        unsafe {
            put(status_out, status)?;
            if let Some(capture) = capture {
                if !id_out.is_null() {
                    put(id_out, capture.id)?;
                }
                if !graph_out.is_null() {
                    put(graph_out, handle(capture.graph))?;
                }
                if !deps_out.is_null() {
                    // The ids are the handles: same size and layout as a CUgraphNode array.
                    put(deps_out, capture.deps.as_ptr().cast::<CUgraphNode>())?;
                }
                if !edges_out.is_null() {
                    put(edges_out, std::ptr::null())?;
                }
                if !count_out.is_null() {
                    put(count_out, capture.deps.len())?;
                }
            }
        }
        Ok(())
    })
}
