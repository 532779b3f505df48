//! A CPU stand-in for a GPU, for tests and examples: events with simulated completion times.
//!
//! [`FakeGpu`] implements [`EventBackend`] with a settable clock that serves as both the host
//! clock and the GPU clock (so calibration is exact). Recording an event stamps it with the
//! current time; a test can also stamp an event at any time, or leave it pending to play work
//! that is still running.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cuhal_sys::{CUevent, CUgraph, CUgraphNode, CUresult, CUstream};

use cuhal_command::EventPlacement;

use crate::backend::EventBackend;
use crate::lock::lock;
use crate::{Error, StampedKernel};

#[derive(Copy, Clone, Debug)]
struct FakeEvent {
    /// The time of the latest record, once it has "executed".
    time: Option<u64>,
    recorded: bool,
}

/// A simulated device for [`EventBackend`] users.
#[derive(Debug)]
pub struct FakeGpu {
    events: Mutex<HashMap<usize, FakeEvent>>,
    next_id: AtomicU64,
    now_ns: AtomicU64,
    creates: AtomicU64,
    fail_creates_after: AtomicU64,
    /// Calibrations to let through before the next one fails (`u64::MAX`: never fail).
    fail_calibration_after: AtomicU64,
    records_pending: AtomicBool,
    calls: AtomicU64,
    /// `elapsed_ms` calls on an event not complete yet (the driver's `CUDA_ERROR_NOT_READY`).
    elapsed_not_ready: AtomicU64,
    /// What events add to a stamped kernel's zone, per placement (stream, graph); `None`: the
    /// measurement fails.
    event_bias: Mutex<[Option<u64>; 2]>,
    /// [`EventBackend::time_stamped_kernels`] calls so far.
    bias_measurements: AtomicU64,
}

fn handle(id: usize) -> CUevent {
    // Fake handles are never dereferenced; aligned non-null values keep them looking like pointers.
    std::ptr::without_provenance_mut(id * 16)
}

fn id(event: CUevent) -> usize {
    event as usize / 16
}

fn placement_index(placement: EventPlacement) -> usize {
    match placement {
        EventPlacement::Stream => 0,
        EventPlacement::Graph => 1,
    }
}

fn invalid_handle(call: &'static str) -> Error {
    Error::Driver(cuhal_sys::Error::Cuda {
        call,
        result: CUresult::ERROR_INVALID_HANDLE,
        name: "CUDA_ERROR_INVALID_HANDLE".into(),
        description: "invalid resource handle (fake device)".into(),
    })
}

impl FakeGpu {
    /// A device whose clock reads 1 ms.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            events: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            now_ns: AtomicU64::new(1_000_000),
            creates: AtomicU64::new(0),
            fail_creates_after: AtomicU64::new(u64::MAX),
            fail_calibration_after: AtomicU64::new(u64::MAX),
            records_pending: AtomicBool::new(false),
            calls: AtomicU64::new(0),
            elapsed_not_ready: AtomicU64::new(0),
            event_bias: Mutex::new([Some(0); 2]),
            bias_measurements: AtomicU64::new(0),
        })
    }

    /// The clock, in nanoseconds.
    pub fn now(&self) -> u64 {
        self.now_ns.load(Ordering::SeqCst)
    }

    /// Sets the clock.
    pub fn set_now(&self, ns: u64) {
        self.now_ns.store(ns, Ordering::SeqCst);
    }

    /// Moves the clock forward.
    pub fn advance(&self, ns: u64) {
        self.now_ns.fetch_add(ns, Ordering::SeqCst);
    }

    /// Plays the device executing a record of `event` at `time_ns` (recorded and complete).
    pub fn complete_at(&self, event: CUevent, time_ns: u64) {
        if let Some(e) = lock(&self.events).get_mut(&id(event)) {
            e.recorded = true;
            e.time = Some(time_ns);
        }
    }

    /// Plays a record of `event` that has not executed yet.
    pub fn pend(&self, event: CUevent) {
        if let Some(e) = lock(&self.events).get_mut(&id(event)) {
            e.recorded = true;
            e.time = None;
        }
    }

    /// When set, [`EventBackend::record`] leaves events pending instead of completing them now.
    pub fn set_records_pending(&self, pending: bool) {
        self.records_pending.store(pending, Ordering::SeqCst);
    }

    /// Makes every event creation after the first `n` fail.
    pub fn fail_creates_after(&self, n: u64) {
        self.fail_creates_after.store(n, Ordering::SeqCst);
    }

    /// Lets `n` more calibration records succeed, then fails one (once).
    pub fn fail_calibration_after(&self, n: u64) {
        self.fail_calibration_after.store(n, Ordering::SeqCst);
    }

    /// Sets what timing events add to the zone of a stamped kernel at `placement`, which
    /// [`EventBackend::time_stamped_kernels`] reports (every kernel alike); `None` makes that
    /// measurement fail with a driver error. The default adds nothing (`Some(0)`).
    pub fn set_event_bias(&self, placement: EventPlacement, bias_ns: Option<u64>) {
        lock(&self.event_bias)[placement_index(placement)] = bias_ns;
    }

    /// [`EventBackend::time_stamped_kernels`] calls so far.
    pub fn bias_measurements(&self) -> u64 {
        self.bias_measurements.load(Ordering::SeqCst)
    }

    /// Events created and not destroyed.
    pub fn live_events(&self) -> usize {
        lock(&self.events).len()
    }

    /// Successful event creations so far.
    pub fn creates(&self) -> u64 {
        self.creates.load(Ordering::SeqCst)
    }

    /// Every backend call so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// [`EventBackend::elapsed_ms`] calls so far that found an event not complete yet. The
    /// driver answers those with `CUDA_ERROR_NOT_READY`, which compute-sanitizer reports as an
    /// API error, so the tracer asks for times only of events it knows complete.
    pub fn elapsed_not_ready(&self) -> u64 {
        self.elapsed_not_ready.load(Ordering::SeqCst)
    }

    fn call(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    fn stamp(&self, event: CUevent) -> Result<(), Error> {
        let pending = self.records_pending.load(Ordering::SeqCst);
        let now = self.now();
        match lock(&self.events).get_mut(&id(event)) {
            Some(e) => {
                e.recorded = true;
                e.time = if pending { None } else { Some(now) };
                Ok(())
            }
            None => Err(invalid_handle(cuhal_sys::cu_name!(cuEventRecord))),
        }
    }
}

// SAFETY: the fake's handles never reach a driver: command buffers that record them are CPU
// test doubles (see the trait's contract).
unsafe impl EventBackend for FakeGpu {
    fn create_event(&self) -> Result<CUevent, Error> {
        self.call();
        if self.creates.load(Ordering::SeqCst) >= self.fail_creates_after.load(Ordering::SeqCst) {
            return Err(Error::Driver(cuhal_sys::Error::Cuda {
                call: cuhal_sys::cu_name!(cuEventCreate),
                result: CUresult::ERROR_OUT_OF_MEMORY,
                name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
                description: "out of memory (fake device)".into(),
            }));
        }
        self.creates.fetch_add(1, Ordering::SeqCst);
        let id = self.next_id.fetch_add(1, Ordering::SeqCst) as usize;
        lock(&self.events).insert(
            id,
            FakeEvent {
                time: None,
                recorded: false,
            },
        );
        Ok(handle(id))
    }

    unsafe fn destroy_event(&self, event: CUevent) {
        self.call();
        lock(&self.events).remove(&id(event));
    }

    unsafe fn query(&self, event: CUevent) -> Result<bool, Error> {
        self.call();
        match lock(&self.events).get(&id(event)) {
            Some(e) if e.recorded => Ok(e.time.is_some()),
            // cuEventQuery on a never-recorded event reports success.
            Some(_) => Ok(true),
            None => Err(invalid_handle(cuhal_sys::cu_name!(cuEventQuery))),
        }
    }

    unsafe fn elapsed_ms(&self, start: CUevent, end: CUevent) -> Result<Option<f32>, Error> {
        self.call();
        let events = lock(&self.events);
        let (Some(a), Some(b)) = (events.get(&id(start)), events.get(&id(end))) else {
            return Err(invalid_handle(cuhal_sys::cu_name!(cuEventElapsedTime)));
        };
        if !a.recorded || !b.recorded {
            return Err(invalid_handle(cuhal_sys::cu_name!(cuEventElapsedTime)));
        }
        match (a.time, b.time) {
            (Some(a), Some(b)) => Ok(Some(((b as f64 - a as f64) / 1e6) as f32)),
            _ => {
                self.elapsed_not_ready.fetch_add(1, Ordering::SeqCst);
                Ok(None)
            }
        }
    }

    unsafe fn calibrate(&self, event: CUevent) -> Result<(), Error> {
        self.call();
        let left = self.fail_calibration_after.load(Ordering::SeqCst);
        if left != u64::MAX {
            if left == 0 {
                self.fail_calibration_after
                    .store(u64::MAX, Ordering::SeqCst);
                return Err(invalid_handle(cuhal_sys::cu_name!(cuEventSynchronize)));
            }
            self.fail_calibration_after
                .store(left - 1, Ordering::SeqCst);
        }
        let now = self.now();
        self.complete_at(event, now);
        Ok(())
    }

    unsafe fn record(&self, event: CUevent, _stream: CUstream) -> Result<(), Error> {
        self.call();
        self.stamp(event)
    }

    unsafe fn add_graph_record_node(
        &self,
        _graph: CUgraph,
        _deps: &[CUgraphNode],
        event: CUevent,
    ) -> Result<CUgraphNode, Error> {
        self.call();
        self.stamp(event)?;
        Ok(std::ptr::without_provenance_mut(id(event) * 16))
    }

    fn now_ns(&self) -> u64 {
        self.now()
    }

    fn time_stamped_kernels(
        &self,
        placement: EventPlacement,
        trials: usize,
        spin_ns: u64,
        out: &mut Vec<StampedKernel>,
    ) -> Result<(), Error> {
        self.call();
        self.bias_measurements.fetch_add(1, Ordering::SeqCst);
        let Some(bias) = lock(&self.event_bias)[placement_index(placement)] else {
            return Err(invalid_handle(cuhal_sys::cu_name!(cuLaunchKernel)));
        };
        out.extend((0..trials).map(|_| StampedKernel {
            zone_ns: spin_ns + bias,
            span_ns: spin_ns,
        }));
        Ok(())
    }
}
