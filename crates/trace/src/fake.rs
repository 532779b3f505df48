//! A CPU stand-in for a GPU, for tests and examples: events with simulated completion times.
//!
//! [`FakeGpu`] implements [`EventBackend`] with a settable host clock. The GPU's clock (its
//! events and `%globaltimer`) follows it, by default exactly; a test can give it an offset and
//! a drift ([`FakeGpu::set_gpu_clock`]). Recording an event stamps it with the current time; a
//! test can also stamp an event at any time (given in host time), or leave it pending to play
//! work that is still running. The clock exchange answers every round at the current time,
//! with the legs a test sets ([`FakeGpu::set_exchange_legs`]; by default none, so calibration
//! is exact), and can be made to fail.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuhal_sys::{CUevent, CUgraph, CUgraphNode, CUresult, CUstream};

use cuhal_command::EventPlacement;

use crate::backend::EventBackend;
use crate::clock_sync::{ExchangeRound, GpuBracket};
use crate::lock::lock;
use crate::{Error, StampedKernel};

#[derive(Copy, Clone, Debug)]
struct FakeEvent {
    /// The time of the latest record, once it has "executed" (on the GPU's clock).
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
    /// The GPU clock: host time plus this offset...
    gpu_offset_ns: AtomicI64,
    /// ...plus this many parts per billion of host time.
    gpu_drift_ppb: AtomicI64,
    /// Each exchange round's legs (host to GPU, GPU to host), taken in turn.
    exchange_legs: Mutex<Vec<(u64, u64)>>,
    /// Whether the clock exchange fails.
    exchange_fails: AtomicBool,
    /// Whether stamping base events fails (after re-recording the first one).
    stamps_fail: AtomicBool,
    /// Half the `%globaltimer` bracket of each stamped base event.
    stamp_half_width_ns: AtomicU64,
    /// Clock exchanges run so far.
    exchanges: AtomicU64,
    /// Device memory ([`EventBackend::alloc_device`]): base address to bytes.
    memory: Mutex<std::collections::BTreeMap<u64, Vec<u8>>>,
    /// The next address handed out.
    next_address: AtomicU64,
    /// Device allocations made so far.
    device_allocations: AtomicU64,
    /// Whether device memory operations fail.
    memory_fails: AtomicBool,
}

/// The bytes `address..address + len` of the allocation in `memory` (base address to bytes)
/// that holds them all, if one does.
fn locate(
    memory: &mut std::collections::BTreeMap<u64, Vec<u8>>,
    address: u64,
    len: usize,
) -> Option<&mut [u8]> {
    let (&base, data) = memory.range_mut(..=address).next_back()?;
    let at = usize::try_from(address - base).ok()?;
    data.get_mut(at..at.checked_add(len)?)
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
            gpu_offset_ns: AtomicI64::new(0),
            gpu_drift_ppb: AtomicI64::new(0),
            exchange_legs: Mutex::new(vec![(0, 0)]),
            exchange_fails: AtomicBool::new(false),
            stamps_fail: AtomicBool::new(false),
            stamp_half_width_ns: AtomicU64::new(0),
            exchanges: AtomicU64::new(0),
            memory: Mutex::new(std::collections::BTreeMap::new()),
            next_address: AtomicU64::new(0x7f00_0000_0000),
            device_allocations: AtomicU64::new(0),
            memory_fails: AtomicBool::new(false),
        })
    }

    /// Sets the GPU's clock (events and `%globaltimer`): host time `t` reads
    /// `t + offset_ns + t * drift_ppb / 1e9` on the GPU.
    pub fn set_gpu_clock(&self, offset_ns: i64, drift_ppb: i64) {
        self.gpu_offset_ns.store(offset_ns, Ordering::SeqCst);
        self.gpu_drift_ppb.store(drift_ppb, Ordering::SeqCst);
    }

    /// The GPU clock's reading at host time `host_ns`.
    pub fn gpu_time(&self, host_ns: u64) -> u64 {
        let t = i128::from(host_ns);
        let g = t
            + i128::from(self.gpu_offset_ns.load(Ordering::SeqCst))
            + t * i128::from(self.gpu_drift_ppb.load(Ordering::SeqCst)) / 1_000_000_000;
        u64::try_from(g.max(0)).unwrap_or(u64::MAX)
    }

    /// Sets each clock-exchange round's legs, used in turn: the GPU reads its timer at the
    /// current host time, `to_gpu_ns` after the host asked, and the host sees the answer
    /// `to_host_ns` after that. The default is one pair of zeros (an exact exchange); an empty
    /// list answers no round.
    pub fn set_exchange_legs(&self, legs: Vec<(u64, u64)>) {
        *lock(&self.exchange_legs) = legs;
    }

    /// Makes the clock exchange fail (or work again).
    pub fn fail_clock_exchange(&self, fail: bool) {
        self.exchange_fails.store(fail, Ordering::SeqCst);
    }

    /// Makes stamping the base events fail after the first is re-recorded (or work again).
    pub fn fail_event_stamps(&self, fail: bool) {
        self.stamps_fail.store(fail, Ordering::SeqCst);
    }

    /// Sets half the `%globaltimer` bracket each stamped base event gets (default 0).
    pub fn set_stamp_half_width(&self, ns: u64) {
        self.stamp_half_width_ns.store(ns, Ordering::SeqCst);
    }

    /// Clock exchanges run so far (failed ones included).
    pub fn exchanges(&self) -> u64 {
        self.exchanges.load(Ordering::SeqCst)
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

    /// Plays the device executing a record of `event` at host time `time_ns` (recorded and
    /// complete; stamped with the GPU clock's reading then).
    pub fn complete_at(&self, event: CUevent, time_ns: u64) {
        let gpu = self.gpu_time(time_ns);
        if let Some(e) = lock(&self.events).get_mut(&id(event)) {
            e.recorded = true;
            e.time = Some(gpu);
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

    /// Writes `bytes` into device memory at `address` (as a kernel would), if it lies in an
    /// allocation; returns whether it did.
    pub fn write_device(&self, address: u64, bytes: &[u8]) -> bool {
        locate(&mut lock(&self.memory), address, bytes.len())
            .map(|span| span.copy_from_slice(bytes))
            .is_some()
    }

    /// Reads `len` bytes of device memory at `address`, if it lies in an allocation.
    pub fn device_bytes(&self, address: u64, len: usize) -> Option<Vec<u8>> {
        locate(&mut lock(&self.memory), address, len).map(|span| span.to_vec())
    }

    /// Device allocations made so far ([`EventBackend::alloc_device`]).
    pub fn device_allocations(&self) -> u64 {
        self.device_allocations.load(Ordering::Relaxed)
    }

    /// Device allocations live now.
    pub fn live_device_allocations(&self) -> usize {
        lock(&self.memory).len()
    }

    /// Makes device memory operations (allocate, read, zero) fail, or succeed again.
    pub fn fail_device_memory(&self, fail: bool) {
        self.memory_fails.store(fail, Ordering::Relaxed);
    }

    /// The span `address..address + len` of an allocation, or an error.
    fn span<T>(
        &self,
        address: u64,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> T,
    ) -> Result<T, Error> {
        if self.memory_fails.load(Ordering::Relaxed) {
            return Err(invalid_handle("device memory"));
        }
        let mut memory = lock(&self.memory);
        let span =
            locate(&mut memory, address, len).ok_or_else(|| invalid_handle("device memory"))?;
        Ok(f(span))
    }

    fn call(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    fn stamp(&self, event: CUevent) -> Result<(), Error> {
        let pending = self.records_pending.load(Ordering::SeqCst);
        let now = self.gpu_time(self.now());
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
            // The difference first: GPU clock values may be too large for an f64 to hold
            // to the nanosecond.
            (Some(a), Some(b)) => Ok(Some(((i128::from(b) - i128::from(a)) as f64 / 1e6) as f32)),
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

    fn alloc_device(&self, bytes: usize) -> Result<u64, Error> {
        if self.memory_fails.load(Ordering::Relaxed) {
            return Err(invalid_handle(cuhal_sys::cu_name!(cuMemAlloc)));
        }
        let len = bytes.max(1) as u64;
        let address = self
            .next_address
            .fetch_add(len.next_multiple_of(256) + 256, Ordering::Relaxed);
        // Not zeroed, as cuMemAlloc: a pattern the tracer must clear before use.
        lock(&self.memory).insert(address, vec![0xa5; bytes]);
        self.device_allocations.fetch_add(1, Ordering::Relaxed);
        Ok(address)
    }

    unsafe fn free_device(&self, address: u64) {
        lock(&self.memory).remove(&address);
    }

    unsafe fn read_device(&self, address: u64, out: &mut [u8]) -> Result<(), Error> {
        self.span(address, out.len(), |span| out.copy_from_slice(span))
    }

    unsafe fn zero_device(&self, address: u64, bytes: usize) -> Result<(), Error> {
        self.span(address, bytes, |span| span.fill(0))
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

    fn exchange_clocks(
        &self,
        rounds: usize,
        _timeout: Duration,
        out: &mut Vec<ExchangeRound>,
    ) -> Result<(), Error> {
        self.call();
        self.exchanges.fetch_add(1, Ordering::SeqCst);
        if self.exchange_fails.load(Ordering::SeqCst) {
            return Err(Error::ClockSync {
                reason: "the exchange kernel did not answer in time",
            });
        }
        let legs = lock(&self.exchange_legs).clone();
        let now = self.now();
        let gpu_ns = self.gpu_time(now);
        out.extend(
            legs.iter()
                .cycle()
                .take(rounds)
                .map(|&(to_gpu, to_host)| ExchangeRound {
                    host_before_ns: now.saturating_sub(to_gpu),
                    gpu_ns,
                    host_after_ns: now.saturating_add(to_host),
                }),
        );
        Ok(())
    }

    unsafe fn stamp_events(
        &self,
        events: &[CUevent],
        _timeout: Duration,
        out: &mut Vec<GpuBracket>,
    ) -> Result<(), Error> {
        self.call();
        let gpu_ns = self.gpu_time(self.now());
        let half = self.stamp_half_width_ns.load(Ordering::SeqCst);
        for (i, &event) in events.iter().enumerate() {
            if i == 1 && self.stamps_fail.load(Ordering::SeqCst) {
                return Err(invalid_handle(cuhal_sys::cu_name!(cuLaunchKernel)));
            }
            match lock(&self.events).get_mut(&id(event)) {
                Some(e) => {
                    e.recorded = true;
                    e.time = Some(gpu_ns);
                }
                None => return Err(invalid_handle(cuhal_sys::cu_name!(cuEventRecord))),
            }
            out.push(GpuBracket {
                after_ns: gpu_ns.saturating_sub(half),
                before_ns: gpu_ns.saturating_add(half),
            });
        }
        Ok(())
    }
}
