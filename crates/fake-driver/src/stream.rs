//! Streams and events of a synchronous GPU.
//!
//! Work runs when it is enqueued, in call order, so a stream is always idle, an event is
//! complete as soon as it is recorded, and waits return at once. An event remembers the
//! monotonic time of its last record, which `cuEventElapsedTime` reports.
// Functions carry the driver's names so a reader can match them to cuda.h.
#![allow(non_snake_case)]

use std::ffi::{c_int, c_uint, c_void};
use std::time::Instant;

use cuhal_sys::{CU_EVENT_DISABLE_TIMING, CUevent, CUhostFn, CUstream};

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
}

/// A created event.
#[derive(Debug)]
pub(crate) struct Event {
    pub device: i32,
    pub flags: c_uint,
    /// When it was last recorded.
    pub recorded: Option<Instant>,
}

impl World {
    /// The device of `stream`; the null, legacy and per-thread streams are those of the
    /// current context.
    pub fn stream_device(&self, stream: CUstream) -> Result<i32, c_int> {
        match stream.addr() {
            0 | STREAM_LEGACY | STREAM_PER_THREAD => self.current_context().map(|(_, d)| d),
            stream => lookup(&self.streams, stream).map(|s| s.device),
        }
    }

    /// Records `event` now (on any stream: every stream is idle).
    pub fn record(&mut self, event: usize) -> Result<(), c_int> {
        lookup_mut(&mut self.events, event)?.recorded = Some(Instant::now());
        Ok(())
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
        world.streams.insert(stream, Stream { device });
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
pub extern "C" fn cuStreamSynchronize(stream: CUstream) -> c_int {
    entry("cuStreamSynchronize", || {
        world().stream_device(stream).map(drop)
    })
}

/// `CUresult cuStreamQuery(CUstream hStream)`: every stream is idle.
pub extern "C" fn cuStreamQuery(stream: CUstream) -> c_int {
    entry("cuStreamQuery", || world().stream_device(stream).map(drop))
}

/// `CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int flags)`: the
/// event's work is done, so there is nothing to wait for.
pub extern "C" fn cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint) -> c_int {
    entry("cuStreamWaitEvent", || {
        let world = world();
        world.stream_device(stream)?;
        lookup(&world.events, id(event)?)?;
        // CU_EVENT_WAIT_DEFAULT or CU_EVENT_WAIT_EXTERNAL.
        ensure(flags <= 1, status::INVALID_VALUE)
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
    world.record(event)
}

/// `CUresult cuEventQuery(CUevent hEvent)`: complete, recorded or not (as the real driver
/// says of an event never recorded).
pub extern "C" fn cuEventQuery(event: CUevent) -> c_int {
    entry("cuEventQuery", || {
        lookup(&world().events, id(event)?).map(drop)
    })
}

/// `CUresult cuEventSynchronize(CUevent hEvent)`: returns at once.
pub extern "C" fn cuEventSynchronize(event: CUevent) -> c_int {
    entry("cuEventSynchronize", || {
        lookup(&world().events, id(event)?).map(drop)
    })
}

/// `CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)`: the
/// time between the two records, by the host's monotonic clock.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuEventElapsedTime(out: *mut f32, start: CUevent, end: CUevent) -> c_int {
    entry("cuEventElapsedTime", || {
        let world = world();
        let timed = |event: CUevent| -> Result<Instant, c_int> {
            let event = lookup(&world.events, id(event)?)?;
            // Timing-disabled and never-recorded events are "invalid handles" here, as in cuda.h.
            ensure(
                event.flags & CU_EVENT_DISABLE_TIMING == 0,
                status::INVALID_HANDLE,
            )?;
            event.recorded.ok_or(status::INVALID_HANDLE)
        };
        let (start, end) = (timed(start)?, timed(end)?);
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
