//! What the tracer needs from a device: timing events, their times, and a clock.
//!
//! The pool, the event lists and the collection logic are written against [`EventBackend`], so
//! they run on the CPU in tests with a fake device, and on CUDA through [`CudaEvents`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuhal_sys::{
    CU_STREAM_NON_BLOCKING, CUdeviceptr, CUevent, CUgraph, CUgraphNode, CUstream, ContextGuard,
    PrimaryContext, Stream, cu,
};

use cuhal_command::EventPlacement;

use crate::clock;
use crate::clock_sync::{ExchangeRound, GpuBracket};
use crate::exchange::ClockExchange;
use crate::lock::lock;
use crate::{Error, StampedKernel};

/// The device operations the tracer uses. Event handles are `CUevent`s; a fake backend may hand
/// out any non-null values it likes, since only the backend itself interprets them.
///
/// # Safety (of the `unsafe` methods)
/// Every event passed in must have been made by this backend's [`EventBackend::create_event`]
/// and not destroyed; streams and graphs must be live objects of the backend's context.
///
/// # Safety
/// Implementing it:
/// The tracer hands the events [`EventBackend::create_event`] returns to command buffers, which
/// record them with the driver directly (`cuEventRecord`, `cuGraphAddEventRecordNode`). So an
/// implementation used with a device must return live CUDA events of its context with timing
/// enabled, which stay live until [`EventBackend::destroy_event`]. (A backend used only with
/// command buffers that never reach a driver, as in CPU tests, may return any non-null values.)
/// A made-up handle would reach the driver, so implementing this trait is `unsafe`:
///
/// ```compile_fail
/// use cuhal_trace::{Error, EventBackend};
/// use cuhal_sys::{CUevent, CUgraph, CUgraphNode, CUstream};
/// struct Forged;
/// impl EventBackend for Forged {
///     fn create_event(&self) -> Result<CUevent, Error> { Ok(0x1234 as CUevent) }
///     unsafe fn destroy_event(&self, _: CUevent) {}
///     unsafe fn query(&self, _: CUevent) -> Result<bool, Error> { Ok(true) }
///     unsafe fn elapsed_ms(&self, _: CUevent, _: CUevent) -> Result<Option<f32>, Error> { Ok(None) }
///     unsafe fn calibrate(&self, _: CUevent) -> Result<(), Error> { Ok(()) }
///     unsafe fn record(&self, _: CUevent, _: CUstream) -> Result<(), Error> { Ok(()) }
///     unsafe fn add_graph_record_node(&self, _: CUgraph, _: &[CUgraphNode], _: CUevent)
///         -> Result<CUgraphNode, Error> { Err(Error::Sink { sink: "none", reason: String::new() }) }
/// }
/// ```
pub unsafe trait EventBackend: Send + Sync {
    /// Creates a timing event (timing enabled: `cuEventCreate(&e, CU_EVENT_DEFAULT)`).
    fn create_event(&self) -> Result<CUevent, Error>;
    /// Destroys an event made by [`EventBackend::create_event`]. Never fails loudly.
    ///
    /// # Safety
    /// See the trait: handles must be live objects of this backend.
    unsafe fn destroy_event(&self, event: CUevent);
    /// Whether the event's latest record has completed (`cuEventQuery`).
    ///
    /// # Safety
    /// See the trait: handles must be live objects of this backend.
    unsafe fn query(&self, event: CUevent) -> Result<bool, Error>;
    /// Milliseconds from `start` to `end` (`cuEventElapsedTime`; negative when `end` came
    /// first), or `None` while either is not complete (`CUDA_ERROR_NOT_READY`).
    ///
    /// # Safety
    /// See the trait: handles must be live objects of this backend.
    unsafe fn elapsed_ms(&self, start: CUevent, end: CUevent) -> Result<Option<f32>, Error>;
    /// Records `event` on a private idle stream and waits for it, so the event's time lies
    /// between the host times just before and just after this call.
    ///
    /// # Safety
    /// See the trait: handles must be live objects of this backend.
    unsafe fn calibrate(&self, event: CUevent) -> Result<(), Error>;
    /// Records `event` on `stream` (`cuEventRecord`).
    ///
    /// # Safety
    /// See the trait: handles must be live objects of this backend.
    unsafe fn record(&self, event: CUevent, stream: CUstream) -> Result<(), Error>;
    /// Adds a node recording `event` to `graph` after `deps` (`cuGraphAddEventRecordNode`).
    ///
    /// # Safety
    /// See the trait: handles must be live objects of this backend.
    unsafe fn add_graph_record_node(
        &self,
        graph: CUgraph,
        deps: &[CUgraphNode],
        event: CUevent,
    ) -> Result<CUgraphNode, Error>;
    /// Allocates `bytes` of device memory for zone stamps (`cuMemAlloc`), not yet zeroed.
    /// The default: no device memory, so the context takes no stamps.
    fn alloc_device(&self, bytes: usize) -> Result<CUdeviceptr, Error> {
        let _ = bytes;
        Err(Error::Stamps {
            reason: "the backend has no device memory for zone stamps",
        })
    }

    /// Frees memory from [`EventBackend::alloc_device`]. Never fails loudly.
    ///
    /// # Safety
    /// `address` came from this backend's `alloc_device`, is freed once, and no work that may
    /// still write it is in flight.
    unsafe fn free_device(&self, address: CUdeviceptr) {
        let _ = address;
    }

    /// Copies `out.len()` bytes of device memory at `address` to `out` and waits for them
    /// (`cuMemcpyDtoHAsync` on a private stream, then a synchronize).
    ///
    /// # Safety
    /// `address..address + out.len()` lies in memory from this backend's `alloc_device`.
    unsafe fn read_device(&self, address: CUdeviceptr, out: &mut [u8]) -> Result<(), Error> {
        let _ = (address, out);
        Err(Error::Stamps {
            reason: "the backend has no device memory for zone stamps",
        })
    }

    /// Zeroes `bytes` of device memory at `address` and waits for it (`cuMemsetD8Async` on a
    /// private stream, then a synchronize).
    ///
    /// # Safety
    /// As [`EventBackend::read_device`].
    unsafe fn zero_device(&self, address: CUdeviceptr, bytes: usize) -> Result<(), Error> {
        let _ = (address, bytes);
        Err(Error::Stamps {
            reason: "the backend has no device memory for zone stamps",
        })
    }
    /// Makes the device current on the calling thread, if the device needs that, until the
    /// returned guard drops (then whatever was current before is current again).
    fn enter(&self) -> Result<Option<ContextGuard>, Error> {
        Ok(None)
    }
    /// The host clock timestamps are expressed on (the trace clock).
    fn now_ns(&self) -> u64 {
        clock::now_ns()
    }
    /// Times `trials` kernels that each spin `spin_ns` and stamp their own span with
    /// `%globaltimer`, each between two timing events recorded right around it at `placement`
    /// (as a command buffer records a FINE command zone's), on a private stream, and appends one
    /// [`StampedKernel`] per kernel to `out`. The device is current (see
    /// [`EventBackend::enter`]). A tracing context calls it once per placement when it is made,
    /// to measure what its events add to a command's zone. The default measures nothing: such a
    /// backend's zones are shown uncorrected, and the failed measurement counted.
    fn time_stamped_kernels(
        &self,
        placement: EventPlacement,
        trials: usize,
        spin_ns: u64,
        out: &mut Vec<StampedKernel>,
    ) -> Result<(), Error> {
        let _ = (placement, trials, spin_ns, out);
        Ok(())
    }
    /// Runs the host <-> `%globaltimer` clock exchange ([`clock_sync`](crate::clock_sync)) on
    /// a private stream: up to `rounds` rounds, appending one [`ExchangeRound`] per answered
    /// round to `out`, giving up after `timeout` (its kernel then exits by itself). The device
    /// is current. A tracing context runs it at every (re-)calibration; when it fails, the
    /// context calibrates from a host bracket instead ([`EventBackend::calibrate`]) and counts
    /// the failure. The default has no exchange (an [`Error::ClockSync`]).
    fn exchange_clocks(
        &self,
        rounds: usize,
        timeout: Duration,
        out: &mut Vec<ExchangeRound>,
    ) -> Result<(), Error> {
        let _ = (rounds, timeout, out);
        Err(Error::ClockSync {
            reason: "the backend has no clock exchange",
        })
    }
    /// Records each of `events` on a private stream between two kernels that stamp
    /// `%globaltimer` (kernel, event, kernel, event, ..., kernel), waits for them (at most
    /// `timeout`), and appends each event's [`GpuBracket`] to `out`: the base events of a
    /// calibration through `%globaltimer`. The device is current. The default has none (an
    /// [`Error::ClockSync`]).
    ///
    /// # Safety
    /// See the trait: handles must be live objects of this backend.
    unsafe fn stamp_events(
        &self,
        events: &[CUevent],
        timeout: Duration,
        out: &mut Vec<GpuBracket>,
    ) -> Result<(), Error> {
        let _ = (events, timeout, out);
        Err(Error::ClockSync {
            reason: "the backend has no stamping kernels",
        })
    }
}

/// [`EventBackend`] on a CUDA primary context: default-flag (timing) events, and a private
/// non-blocking stream used only to calibrate, so calibrating never waits for a queue's work.
pub struct CudaEvents {
    /// The clock exchange's kernels, stream and memory, made on the first exchange.
    clock: Mutex<Option<ClockExchange>>,
    context: Arc<PrimaryContext>,
    calibration_stream: Stream,
}

impl CudaEvents {
    /// Creates the calibration stream in `context` (made current on this thread).
    pub fn new(context: Arc<PrimaryContext>) -> Result<Self, Error> {
        let stream = Stream::new(&context, CU_STREAM_NON_BLOCKING)?;
        Ok(Self {
            clock: Mutex::new(None),
            context,
            calibration_stream: stream,
        })
    }

    /// Runs `f` on the clock exchange, made first if it is not yet.
    fn with_clock<T>(
        &self,
        f: impl FnOnce(&mut ClockExchange) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut clock = lock(&self.clock);
        if clock.is_none() {
            *clock = Some(ClockExchange::new(&self.context)?);
        }
        match clock.as_mut() {
            Some(c) => f(c),
            None => Err(Error::ClockSync {
                reason: "the clock exchange could not be made",
            }),
        }
    }

    /// The context the events live in.
    pub fn context(&self) -> &Arc<PrimaryContext> {
        &self.context
    }
}

// SAFETY: every event comes from cuEventCreate with default flags (timing enabled) in the
// backend's context, and lives until destroy_event.
unsafe impl EventBackend for CudaEvents {
    fn create_event(&self) -> Result<CUevent, Error> {
        let api = self.context.api();
        let mut event: CUevent = std::ptr::null_mut();
        // SAFETY: `event` is a valid out-pointer; flags 0 is CU_EVENT_DEFAULT (timing enabled).
        unsafe { cu!(api, cuEventCreate(&mut event, 0)) }?;
        Ok(event)
    }

    unsafe fn destroy_event(&self, event: CUevent) {
        let api = self.context.api();
        // Destroying can only fail on a lost or deinitialized context; the event is gone either way.
        // SAFETY: `event` was created by `create_event` in this context and is destroyed once
        // (the pool owns it); cuEventDestroy is safe to call while a record is pending.
        let _ = unsafe { cu!(api, cuEventDestroy(event)) };
    }

    unsafe fn query(&self, event: CUevent) -> Result<bool, Error> {
        let api = self.context.api();
        // SAFETY: `event` is a live event of this context.
        Ok(unsafe { cu!(ready: api, cuEventQuery(event)) }?)
    }

    unsafe fn elapsed_ms(&self, start: CUevent, end: CUevent) -> Result<Option<f32>, Error> {
        // SAFETY: both events are live timing events of this context.
        Ok(unsafe { cuhal_sys::elapsed_ms(self.context.api(), start, end) }?)
    }

    unsafe fn calibrate(&self, event: CUevent) -> Result<(), Error> {
        let api = self.context.api();
        // SAFETY: both handles are live objects of this context.
        unsafe { cu!(api, cuEventRecord(event, self.calibration_stream.raw())) }?;
        // The stream is private and idle, so this waits only for the record itself.
        // SAFETY: `event` is live and was just recorded.
        unsafe { cu!(api, cuEventSynchronize(event)) }?;
        Ok(())
    }

    unsafe fn record(&self, event: CUevent, stream: CUstream) -> Result<(), Error> {
        let api = self.context.api();
        // SAFETY: `event` is a live event of this context; the caller passes a live stream of it.
        unsafe { cu!(api, cuEventRecord(event, stream)) }?;
        Ok(())
    }

    ///
    /// # Safety
    /// See the trait: handles must be live objects of this backend.
    unsafe fn add_graph_record_node(
        &self,
        graph: CUgraph,
        deps: &[CUgraphNode],
        event: CUevent,
    ) -> Result<CUgraphNode, Error> {
        let api = self.context.api();
        let mut node: CUgraphNode = std::ptr::null_mut();
        // SAFETY: `node` is a valid out-pointer; `deps` is a live slice of nodes of `graph`
        // (the caller's contract), passed with its length; `event` is live.
        unsafe {
            cu!(
                optional: api,
                cuGraphAddEventRecordNode(&mut node, graph, deps.as_ptr(), deps.len(), event)
            )
        }?;
        Ok(node)
    }

    fn enter(&self) -> Result<Option<ContextGuard>, Error> {
        Ok(Some(self.context.enter()?))
    }

    fn alloc_device(&self, bytes: usize) -> Result<CUdeviceptr, Error> {
        let _bound = self.context.enter()?;
        let mut address: CUdeviceptr = 0;
        // SAFETY: `address` is a valid out-pointer; the context is current.
        unsafe { cu!(self.context.api(), cuMemAlloc(&mut address, bytes.max(1))) }?;
        Ok(address)
    }

    unsafe fn free_device(&self, address: CUdeviceptr) {
        if let Ok(_bound) = self.context.enter() {
            // SAFETY: the caller passes memory of this backend, freed once, no longer written.
            let _ = unsafe { cu!(self.context.api(), cuMemFree(address)) };
        }
    }

    unsafe fn read_device(&self, address: CUdeviceptr, out: &mut [u8]) -> Result<(), Error> {
        let _bound = self.context.enter()?;
        let api = self.context.api();
        let stream = self.calibration_stream.raw();
        // SAFETY: `out` is writable for its length and outlives the copy (synchronized below);
        // the caller vouches for the device range; the stream is this context's.
        unsafe {
            cu!(
                api,
                cuMemcpyDtoHAsync(out.as_mut_ptr().cast(), address, out.len(), stream)
            )
        }?;
        self.calibration_stream.synchronize()?;
        Ok(())
    }

    unsafe fn zero_device(&self, address: CUdeviceptr, bytes: usize) -> Result<(), Error> {
        let _bound = self.context.enter()?;
        let stream = self.calibration_stream.raw();
        // SAFETY: the caller vouches for the device range; the stream is this context's.
        unsafe {
            cu!(
                self.context.api(),
                cuMemsetD8Async(address, 0, bytes, stream)
            )
        }?;
        self.calibration_stream.synchronize()?;
        Ok(())
    }

    fn time_stamped_kernels(
        &self,
        placement: EventPlacement,
        trials: usize,
        spin_ns: u64,
        out: &mut Vec<StampedKernel>,
    ) -> Result<(), Error> {
        crate::stamped::time_stamped_kernels(
            &self.context,
            &self.calibration_stream,
            placement,
            trials,
            spin_ns,
            out,
        )
    }

    fn exchange_clocks(
        &self,
        rounds: usize,
        timeout: Duration,
        out: &mut Vec<ExchangeRound>,
    ) -> Result<(), Error> {
        let now = || self.now_ns();
        self.with_clock(|c| c.run(rounds, timeout, &now, out))
    }

    unsafe fn stamp_events(
        &self,
        events: &[CUevent],
        timeout: Duration,
        out: &mut Vec<GpuBracket>,
    ) -> Result<(), Error> {
        self.with_clock(|c| {
            // SAFETY: the caller passes live events of this context (the trait's contract).
            unsafe { c.stamp_events(events, timeout, out) }
        })
    }
}
