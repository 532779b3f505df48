//! A queue's tracing context: the event pool, the submitted lists, and collection.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuhal_sys::PrimaryContext;
use smallvec::SmallVec;

use crate::Error;
use crate::backend::{CudaEvents, EventBackend};
use crate::hook::{Verbosity, ZoneRecorder};
use crate::list::{ListInner, Record, ZoneList};
use crate::lock::lock;
use crate::pool::{Ev, EventPool, PoolLimits};
use crate::sink::{DropReason, Sink, TrackId};
use crate::timebase::{self, Calibration, DEFAULT_REBASE_AFTER_NS};

/// How a queue traces.
#[derive(Clone, Debug)]
pub struct TraceConfig {
    /// Off, Coarse or Fine; fixed for the context's life.
    pub verbosity: Verbosity,
    /// The GPU track's name in the sink (e.g. "GPU 0 queue 1").
    pub name: String,
    /// The event pool's sizes.
    pub pool: PoolLimits,
    /// Re-base when the base event is older than this (default 8 s: a step of 0.49 us).
    pub rebase_after: Duration,
}

impl Default for TraceConfig {
    fn default() -> Self {
        Self {
            verbosity: Verbosity::Coarse,
            name: "GPU".to_owned(),
            pool: PoolLimits::default(),
            rebase_after: Duration::from_nanos(DEFAULT_REBASE_AFTER_NS),
        }
    }
}

impl TraceConfig {
    /// The default configuration at `verbosity`, with the track named `name`.
    pub fn new(verbosity: Verbosity, name: impl Into<String>) -> Self {
        Self {
            verbosity,
            name: name.into(),
            ..Self::default()
        }
    }
}

/// Zone counts per [`DropReason`].
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DropCounts([u64; DropReason::ALL.len()]);

impl DropCounts {
    fn index(reason: DropReason) -> usize {
        DropReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0)
    }

    /// Zones dropped for `reason`.
    pub fn get(&self, reason: DropReason) -> u64 {
        self.0[Self::index(reason)]
    }

    /// Zones dropped for any reason.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// A snapshot of a tracing context's counters.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceStats {
    /// The context's verbosity.
    pub verbosity: Verbosity,
    /// Timing events created (they live until the context and its lists are gone).
    pub events_created: usize,
    /// Timing events on the free list.
    pub events_free: usize,
    /// Times the driver refused to create an event (the pool then stops growing).
    pub event_create_failures: u64,
    /// Zones that got events.
    pub zones_recorded: u64,
    /// Zones handed to the sink.
    pub zones_collected: u64,
    /// Zones not shown, by reason.
    pub dropped: DropCounts,
    /// Submissions waiting for collection.
    pub pending_submissions: usize,
    /// Calibrations taken (the first one included).
    pub calibrations: u64,
    /// Half the host-time bracket of the current calibration, in nanoseconds.
    pub calibration_uncertainty_ns: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) zones_recorded: AtomicU64,
    zones_collected: AtomicU64,
    dropped: [AtomicU64; DropReason::ALL.len()],
    calibrations: AtomicU64,
    uncertainty_ns: AtomicU64,
}

/// A submitted list waiting for collection.
struct Pending {
    list: Arc<ListInner>,
    generation: u64,
}

enum Outcome {
    /// Collected, or given up on (counted); the entry is done.
    Done,
    /// Some event has not completed: keep it for a later collection.
    NotReady,
}

/// Calibration attempts per (re-)calibration: the bracket of one attempt varies with how fast
/// the host notices the record (8 to 17 us seen on an H200), so the tightest of three is kept.
const CALIBRATION_TRIES: usize = 3;

/// State of the (one at a time) collector.
struct CollectState {
    /// Candidate base events; a calibration records each and keeps the tightest bracket.
    bases: [Ev; CALIBRATION_TRIES],
    /// The base event of the current calibration.
    base: Ev,
    calibration: Calibration,
    /// A calibration failed half-way: the base may have been re-recorded, so `calibration`
    /// must not be used until a new one succeeds.
    calibration_broken: bool,
    /// Entries being collected now; reused.
    work: VecDeque<Pending>,
    /// Entries to put back; reused.
    retry: Vec<Pending>,
    /// Timestamps of one list's records; reused.
    times: Vec<u64>,
    /// Drops already handed to the sink, per reason.
    reported: [u64; DropReason::ALL.len()],
}

pub(crate) struct Shared {
    pub(crate) backend: Arc<dyn EventBackend>,
    sink: Arc<dyn Sink>,
    track: TrackId,
    pub(crate) verbosity: Verbosity,
    pub(crate) pool: EventPool,
    names: Mutex<HashSet<Arc<str>>>,
    pending: Mutex<VecDeque<Pending>>,
    collect: Mutex<CollectState>,
    closed: AtomicBool,
    rebase_after_ns: u64,
    pub(crate) counters: Counters,
}

impl Shared {
    pub(crate) fn intern(&self, name: &str) -> Arc<str> {
        let mut names = lock(&self.names);
        if let Some(n) = names.get(name) {
            return n.clone();
        }
        let n: Arc<str> = Arc::from(name);
        names.insert(n.clone());
        n
    }

    pub(crate) fn count_dropped(&self, reason: DropReason, count: u64) {
        self.counters.dropped[DropCounts::index(reason)].fetch_add(count, Ordering::Relaxed);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(crate) fn enqueue(&self, list: Arc<ListInner>, generation: u64) {
        lock(&self.pending).push_back(Pending { list, generation });
    }

    /// Takes a fresh calibration: each candidate base event is recorded on an idle stream and
    /// waited for, and the one with the tightest host-time bracket becomes the base.
    fn calibrate(&self, cs: &mut CollectState) -> Result<(), Error> {
        let mut best: Option<(Ev, Calibration)> = None;
        for candidate in cs.bases {
            let before = self.backend.now_ns();
            // SAFETY: the candidates were created by this backend and live as long as `self`.
            if let Err(error) = unsafe { self.backend.calibrate(candidate.0) } {
                // The current base may have been re-recorded already: its calibration no longer
                // holds until a new one succeeds.
                cs.calibration_broken = true;
                return Err(error);
            }
            let after = self.backend.now_ns();
            let c = Calibration::from_bracket(before, after);
            if best.is_none_or(|(_, b)| c.uncertainty_ns < b.uncertainty_ns) {
                best = Some((candidate, c));
            }
        }
        let Some((base, calibration)) = best else {
            return Ok(());
        };
        cs.base = base;
        cs.calibration = calibration;
        cs.calibration_broken = false;
        self.counters.calibrations.fetch_add(1, Ordering::Relaxed);
        self.counters
            .uncertainty_ns
            .store(cs.calibration.uncertainty_ns, Ordering::Relaxed);
        Ok(())
    }

    /// Collects every queued submission whose events have all completed, in submission order,
    /// and reports new drops. Returns the number of zones handed to the sink.
    pub(crate) fn collect(&self) -> u64 {
        let mut cs = lock(&self.collect);
        {
            let mut pending = lock(&self.pending);
            std::mem::swap(&mut *pending, &mut cs.work);
        }
        let mut zones = 0;
        if !cs.work.is_empty() {
            let bound = self.backend.enter();
            let stale = cs.calibration_broken
                || cs
                    .calibration
                    .is_stale(self.backend.now_ns(), self.rebase_after_ns);
            let ready = bound.is_ok() && (!stale || self.calibrate(&mut cs).is_ok());
            while let Some(entry) = cs.work.pop_front() {
                let outcome = if ready {
                    self.collect_one(&mut cs, &entry, &mut zones)
                } else {
                    self.give_up(&entry, DropReason::EventError)
                };
                match outcome {
                    // Dropping the entry may return the list's events to the pool.
                    Outcome::Done => drop(entry),
                    Outcome::NotReady => cs.retry.push(entry),
                }
            }
            if !cs.retry.is_empty() {
                // Back in front of anything queued meanwhile, in their original order.
                let mut pending = lock(&self.pending);
                while let Some(entry) = cs.retry.pop() {
                    pending.push_front(entry);
                }
            }
        }
        self.counters
            .zones_collected
            .fetch_add(zones, Ordering::Relaxed);
        self.report_drops(&mut cs);
        zones
    }

    fn give_up(&self, entry: &Pending, reason: DropReason) -> Outcome {
        let state = lock(&entry.list.state);
        if state.submissions == entry.generation {
            self.count_dropped(reason, state.timed_zones);
        } else {
            self.count_dropped(DropReason::Superseded, state.timed_zones);
        }
        Outcome::Done
    }

    fn collect_one(&self, cs: &mut CollectState, entry: &Pending, zones: &mut u64) -> Outcome {
        let state = lock(&entry.list.state);
        if state.submissions != entry.generation {
            // Submitted again since: the events now time the later submission, which reports them.
            self.count_dropped(DropReason::Superseded, state.timed_zones);
            return Outcome::Done;
        }
        let Some(anchor) = state.records.iter().find_map(|r| match r {
            Record::Begin { begin, .. } => Some(*begin),
            Record::End { .. } => None,
        }) else {
            return Outcome::Done;
        };
        let event_of = |r: &Record| match r {
            Record::Begin { begin, .. } => *begin,
            Record::End { end } => *end,
        };
        // The last event recorded is, on a stream, the last to complete: a cheap early out.
        if let Some(last) = state.records.last().map(event_of) {
            // SAFETY: the list's events come from this context's pool and stay alive while the
            // list (held by `entry`) does.
            match unsafe { self.backend.query(last.0) } {
                Ok(true) => {}
                Ok(false) => return Outcome::NotReady,
                Err(_) => {
                    self.count_dropped(DropReason::EventError, state.timed_zones);
                    return Outcome::Done;
                }
            }
        }
        // SAFETY: the base event lives as long as `self`; the anchor as long as the list.
        let base_to_anchor = match unsafe { self.backend.elapsed_ms(cs.base.0, anchor.0) } {
            Ok(Some(ms)) => ms,
            Ok(None) => return Outcome::NotReady,
            Err(_) => {
                self.count_dropped(DropReason::EventError, state.timed_zones);
                return Outcome::Done;
            }
        };
        // Every event's time first, so a list is shown whole or not at all. `elapsed_ms` answers
        // `None` (CUDA_ERROR_NOT_READY) for any event not complete yet, exactly as cuEventQuery.
        cs.times.clear();
        let base_ns = cs.calibration.base_ns;
        for record in &state.records {
            // SAFETY: as above, both events belong to the list.
            match unsafe { self.backend.elapsed_ms(anchor.0, event_of(record).0) } {
                Ok(Some(ms)) => cs
                    .times
                    .push(timebase::event_ns(base_ns, base_to_anchor, ms)),
                Ok(None) => return Outcome::NotReady,
                Err(_) => {
                    self.count_dropped(DropReason::EventError, state.timed_zones);
                    return Outcome::Done;
                }
            }
        }
        let mut open = 0u64;
        let mut latest = 0u64;
        for (record, &ns) in state.records.iter().zip(&cs.times) {
            latest = latest.max(ns);
            match record {
                Record::Begin { name, .. } => {
                    self.sink.gpu_zone_begin(self.track, name, ns);
                    open += 1;
                }
                Record::End { .. } => {
                    self.sink.gpu_zone_end(self.track, ns);
                    open -= 1;
                    *zones += 1;
                }
            }
        }
        // Zones never ended when submitted are closed at the list's last time, so the sink's
        // nesting stays balanced.
        for _ in 0..open {
            self.sink.gpu_zone_end(self.track, latest);
            *zones += 1;
        }
        Outcome::Done
    }

    fn report_drops(&self, cs: &mut CollectState) {
        for (i, reason) in DropReason::ALL.iter().enumerate() {
            let now = self.counters.dropped[i].load(Ordering::Relaxed);
            if now > cs.reported[i] {
                self.sink
                    .zones_dropped(self.track, *reason, now - cs.reported[i]);
                cs.reported[i] = now;
            }
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let bases = lock(&self.collect).bases;
        if let Ok(_bound) = self.backend.enter() {
            for base in bases {
                // SAFETY: the base events were created by this backend and are destroyed once,
                // here.
                unsafe { self.backend.destroy_event(base.0) };
            }
        }
    }
}

/// A queue's tracing context.
///
/// At [`Verbosity::Off`] it holds nothing: no events, no sink track, no locks; every method
/// answers at once. Otherwise it owns a pool of timing events, a GPU track in the sink, and the
/// queue of submitted lists that [`TraceContext::collect`] (or any collector returned by
/// [`ZoneList::on_submit`]) turns into zones once their work completed.
pub struct TraceContext {
    shared: Option<Arc<Shared>>,
}

impl std::fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceContext")
            .field("verbosity", &self.verbosity())
            .finish_non_exhaustive()
    }
}

impl TraceContext {
    /// A context on the CUDA primary context `context`, sending zones to `sink`. At `Off` it
    /// touches neither the driver nor the sink.
    pub fn new(
        context: Arc<PrimaryContext>,
        config: TraceConfig,
        sink: Arc<dyn Sink>,
    ) -> Result<Self, Error> {
        if config.verbosity == Verbosity::Off {
            return Ok(Self::off());
        }
        let backend = Arc::new(CudaEvents::new(context)?);
        Self::with_backend(backend, config, sink)
    }

    /// A context at [`Verbosity::Off`].
    pub const fn off() -> Self {
        Self { shared: None }
    }

    /// A context over any [`EventBackend`] (a fake device in tests).
    pub fn with_backend(
        backend: Arc<dyn EventBackend>,
        config: TraceConfig,
        sink: Arc<dyn Sink>,
    ) -> Result<Self, Error> {
        if config.verbosity == Verbosity::Off {
            return Ok(Self::off());
        }
        let _bound = backend.enter()?;
        let mut created: SmallVec<[Ev; CALIBRATION_TRIES]> = SmallVec::new();
        let mut failure = None;
        for _ in 0..CALIBRATION_TRIES {
            match backend.create_event() {
                Ok(e) => created.push(Ev(e)),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let track = match failure {
            None => sink.register_gpu_track(&config.name, backend.now_ns()),
            Some(e) => Err(e),
        };
        let track = match track {
            Ok(track) => track,
            Err(e) => {
                for ev in created {
                    // SAFETY: just created by this backend, never shared.
                    unsafe { backend.destroy_event(ev.0) };
                }
                return Err(e);
            }
        };
        // All were created (no failure above), so every index is in range.
        let bases: [Ev; CALIBRATION_TRIES] = std::array::from_fn(|i| created[i]);
        let shared = Shared {
            pool: EventPool::new(backend.clone(), config.pool),
            backend,
            sink,
            track,
            verbosity: config.verbosity,
            names: Mutex::new(HashSet::new()),
            pending: Mutex::new(VecDeque::new()),
            collect: Mutex::new(CollectState {
                bases,
                base: bases[0],
                calibration: Calibration::from_bracket(0, 0),
                work: VecDeque::new(),
                retry: Vec::new(),
                times: Vec::new(),
                reported: [0; DropReason::ALL.len()],
                calibration_broken: false,
            }),
            closed: AtomicBool::new(false),
            rebase_after_ns: u64::try_from(config.rebase_after.as_nanos()).unwrap_or(u64::MAX),
            counters: Counters::default(),
        };
        // From here `shared` owns the base events and destroys them on any failure.
        {
            let mut cs = lock(&shared.collect);
            shared.calibrate(&mut cs)?;
        }
        Ok(Self {
            shared: Some(Arc::new(shared)),
        })
    }

    /// The context's verbosity.
    pub fn verbosity(&self) -> Verbosity {
        match &self.shared {
            Some(s) => s.verbosity,
            None => Verbosity::Off,
        }
    }

    /// A new zone list, e.g. for a command buffer or for stream-level zones around a submission;
    /// `None` at `Off`.
    pub fn zone_list(&self) -> Option<ZoneList> {
        self.shared.as_ref().map(|s| ZoneList::new(s.clone()))
    }

    /// A recorder for a new command buffer; `None` at `Off` (the command buffer then records no
    /// zones at the cost of one branch per command).
    pub fn recorder(&self) -> Option<Arc<dyn ZoneRecorder>> {
        self.zone_list()
            .map(|l| Arc::new(l) as Arc<dyn ZoneRecorder>)
    }

    /// Collects every submitted list whose work completed, now, on this thread; returns the
    /// number of zones handed to the sink. Lists not complete stay queued.
    pub fn collect(&self) -> u64 {
        match &self.shared {
            Some(s) => s.collect(),
            None => 0,
        }
    }

    /// A collector for this context, like the one [`ZoneList::on_submit`] returns.
    pub fn collector(&self) -> Option<Box<dyn FnOnce() + Send>> {
        let shared = self.shared.clone()?;
        Some(Box::new(move || {
            shared.collect();
        }))
    }

    /// Takes a fresh calibration now (on the calling thread: a few microseconds on an idle
    /// stream). Collection does this by itself when the base is older than the re-base age.
    pub fn recalibrate(&self) -> Result<(), Error> {
        let Some(s) = &self.shared else {
            return Ok(());
        };
        let _bound = s.backend.enter()?;
        let mut cs = lock(&s.collect);
        s.calibrate(&mut cs)
    }

    /// The context's counters now.
    pub fn stats(&self) -> TraceStats {
        let Some(s) = &self.shared else {
            return TraceStats::default();
        };
        let pool = s.pool.counts();
        let c = &s.counters;
        let mut dropped = DropCounts::default();
        for (i, d) in c.dropped.iter().enumerate() {
            dropped.0[i] = d.load(Ordering::Relaxed);
        }
        TraceStats {
            verbosity: s.verbosity,
            events_created: pool.created,
            events_free: pool.free,
            event_create_failures: pool.create_failures,
            zones_recorded: c.zones_recorded.load(Ordering::Relaxed),
            zones_collected: c.zones_collected.load(Ordering::Relaxed),
            dropped,
            pending_submissions: lock(&s.pending).len(),
            calibrations: c.calibrations.load(Ordering::Relaxed),
            calibration_uncertainty_ns: c.uncertainty_ns.load(Ordering::Relaxed),
        }
    }

    /// The sink's track of this context (`None` at `Off`).
    pub fn track(&self) -> Option<TrackId> {
        self.shared.as_ref().map(|s| s.track)
    }
}

impl Drop for TraceContext {
    /// Collects what has completed, then gives up on the rest (counted as
    /// [`DropReason::Abandoned`]); never waits for the device.
    fn drop(&mut self) {
        let Some(s) = self.shared.take() else {
            return;
        };
        s.closed.store(true, Ordering::Release);
        s.collect();
        let abandoned: Vec<Pending> = lock(&s.pending).drain(..).collect();
        for entry in &abandoned {
            s.give_up(entry, DropReason::Abandoned);
        }
        drop(abandoned);
        let mut cs = lock(&s.collect);
        s.report_drops(&mut cs);
    }
}
