//! A queue's tracing context: the event pool, the submitted lists, and collection.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuhal_sys::{CUevent, PrimaryContext};
use smallvec::SmallVec;

use crate::Error;
use crate::backend::{CudaEvents, EventBackend};
use crate::cupti::{CuptiApi, CuptiError, CuptiSession};
use crate::hook::{Verbosity, ZoneRecorder};
use crate::list::{ListInner, ListState, Record, ZoneList};
use crate::lock::lock;
use crate::pool::{Ev, PoolLimits, TimingEventPool};
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
    /// Where FINE command zones get their times (default: CUPTI when it can be had).
    pub cupti: CuptiChoice,
}

/// Whether FINE zones of commands come from CUPTI's activity records or from timing events.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub enum CuptiChoice {
    /// Timing events around every command (extra graph nodes or stream records).
    Off,
    /// CUPTI when it loads and no other profiler holds it; otherwise timing events, said once
    /// on stderr and in [`TraceStats::cupti_unavailable`].
    #[default]
    Auto,
    /// CUPTI or an error ([`Error::Cupti`]) naming why it cannot be had.
    Required,
    /// Loads CUPTI from this path (else as [`CuptiChoice::Auto`] does); `required` as
    /// [`CuptiChoice::Required`].
    Library {
        /// The library to open.
        path: std::path::PathBuf,
        /// Fail instead of falling back.
        required: bool,
    },
    /// Uses these entry points instead of loading the library (a fake CUPTI in tests).
    Api {
        /// The entry points.
        api: CuptiApi,
        /// Fail instead of falling back.
        required: bool,
    },
}

/// Where a context's FINE command zones get their times.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum FineSource {
    /// Not FINE: no command zones.
    #[default]
    None,
    /// Timing events around each command.
    Events,
    /// CUPTI activity records.
    Cupti,
}

/// Says once per process why FINE tracing fell back to events.
fn report_fallback(error: &CuptiError) {
    static REPORTED: AtomicBool = AtomicBool::new(false);
    if !REPORTED.swap(true, Ordering::Relaxed) {
        eprintln!("cuhal: FINE tracing uses timing events, not CUPTI: {error}");
    }
}

/// Opens the CUPTI session `choice` asks for. `Ok(Err(reason))`: fell back to events.
fn open_cupti(choice: &CuptiChoice) -> Result<Result<Arc<CuptiSession>, &'static str>, Error> {
    let (result, required) = match choice {
        CuptiChoice::Off => return Ok(Err("turned off")),
        CuptiChoice::Auto => (CuptiSession::acquire(None), false),
        CuptiChoice::Required => (CuptiSession::acquire(None), true),
        CuptiChoice::Library { path, required } => (CuptiSession::acquire(Some(path)), *required),
        CuptiChoice::Api { api, required } => (CuptiSession::acquire_with(*api), *required),
    };
    match result {
        Ok(session) => Ok(Ok(session)),
        Err(e) if required => Err(Error::Cupti(e)),
        Err(e) => {
            report_fallback(&e);
            Ok(Err(e.reason()))
        }
    }
}

impl Default for TraceConfig {
    fn default() -> Self {
        Self {
            verbosity: Verbosity::Coarse,
            name: "GPU".to_owned(),
            pool: PoolLimits::default(),
            rebase_after: Duration::from_nanos(DEFAULT_REBASE_AFTER_NS),
            cupti: CuptiChoice::default(),
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
    /// Where FINE command zones get their times.
    pub fine_source: FineSource,
    /// Why CUPTI is not used, when FINE fell back to events ("library not found", ...).
    pub cupti_unavailable: Option<&'static str>,
    /// Command zones timed from CUPTI activity records and handed to the sink.
    pub activity_zones: u64,
    /// Submission slots made so far: they are recycled, so this stops growing once the number
    /// of submissions in flight does.
    pub submission_slots: usize,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) zones_recorded: AtomicU64,
    zones_collected: AtomicU64,
    dropped: [AtomicU64; DropReason::ALL.len()],
    calibrations: AtomicU64,
    uncertainty_ns: AtomicU64,
    activity_zones: AtomicU64,
}

/// What waits for collection.
pub(crate) enum Pending {
    /// A list submitted on its own ([`ZoneList::on_submit`]).
    List {
        list: Arc<ListInner>,
        generation: u64,
    },
    /// A queue's submission ([`TraceContext::submit`]): the index of its slot.
    Submission(u32),
}

pub(crate) enum Outcome {
    /// Collected, or given up on (counted); the entry is done.
    Done,
    /// Some event has not completed: keep it for a later collection.
    NotReady,
}

/// Whether a list's event times could be read.
pub(crate) enum Times {
    /// All read.
    Ready,
    /// Some event has not completed.
    NotReady,
    /// The driver failed to report one.
    Failed,
}

/// Collections a list with activity-timed commands waits for its records once its events
/// completed, before its command zones are given up on.
pub(crate) const ACTIVITY_PATIENCE: u32 = 16;

/// The time of the `End` that closes the zone enclosing record `at`, if it has one.
fn enclosing_end(records: &[Record], times: &[u64], at: usize) -> Option<u64> {
    let mut depth = 0i32;
    for (record, &ns) in records.iter().zip(times).skip(at + 1) {
        match record {
            Record::Begin { .. } => depth += 1,
            Record::End { .. } if depth == 0 => return Some(ns),
            Record::End { .. } => depth -= 1,
            Record::Command { .. } => {}
        }
    }
    None
}

/// Calibration attempts per (re-)calibration: the bracket of one attempt varies with how fast
/// the host notices the record (8 to 17 us seen on an H200), so the tightest of three is kept.
const CALIBRATION_TRIES: usize = 3;

/// State of the (one at a time) collector.
pub(crate) struct CollectState {
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
    pub(crate) times: Vec<u64>,
    /// Begin and end of each activity-timed command of one list (`None`: no record); reused.
    command_times: Vec<Option<(u64, u64)>>,
    /// One list's launch ids, sorted; reused.
    pub(crate) launch_ids: Vec<u32>,
    /// The arrived records of one list's launches: (key, index into the arrived records),
    /// sorted; reused.
    candidates: Vec<(u64, usize)>,
    /// Which of `candidates` a command took; reused.
    used: Vec<bool>,
    /// Indices of the records matched to one list's commands; reused.
    matched: Vec<usize>,
    /// Indices of the records to remove, highest first; reused.
    taken: Vec<usize>,
    /// Whether this collection flushed CUPTI already.
    pub(crate) flushed: bool,
    /// CUPTI's clock mapped onto the backend's host clock.
    cupti_clock: Option<crate::cupti::ClockMap>,
    /// Drops already handed to the sink, per reason.
    reported: [u64; DropReason::ALL.len()],
    /// When the last submission collected completed: the earliest the next one on the same
    /// stream can have started (trace clock).
    pub(crate) last_end_ns: u64,
}

pub(crate) struct Shared {
    pub(crate) backend: Arc<dyn EventBackend>,
    pub(crate) sink: Arc<dyn Sink>,
    pub(crate) track: TrackId,
    /// The track's (queue's) name.
    pub(crate) name: String,
    /// Storage of the submissions in flight, recycled.
    pub(crate) slots: crate::submission::Slots,
    /// Submissions traced so far (their ordinals).
    pub(crate) ordinals: AtomicU64,
    pub(crate) verbosity: Verbosity,
    pub(crate) pool: TimingEventPool,
    names: Mutex<HashSet<Arc<str>>>,
    pub(crate) pending: Mutex<VecDeque<Pending>>,
    pub(crate) collect: Mutex<CollectState>,
    closed: AtomicBool,
    rebase_after_ns: u64,
    pub(crate) counters: Counters,
    /// The CUPTI session FINE command zones are timed from, if any.
    pub(crate) cupti: Option<Arc<CuptiSession>>,
    fine_source: FineSource,
    cupti_unavailable: Option<&'static str>,
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
        lock(&self.pending).push_back(Pending::List { list, generation });
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
            // CUPTI is flushed only when a list's events completed and its records are not in yet
            // (at most once per collection), not on every collection: a flush costs far more
            // than a look at the records already delivered.
            cs.flushed = false;
            if let Some(session) = &self.cupti {
                let now = self.backend.now_ns();
                let stale = cs.cupti_clock.is_none_or(|c| {
                    now.saturating_sub(c.taken_at_ns) > crate::cupti::REBASE_AFTER_NS
                });
                if stale && let Ok(map) = session.calibrate_against(|| self.backend.now_ns()) {
                    cs.cupti_clock = Some(map);
                }
            }
            while let Some(entry) = cs.work.pop_front() {
                let outcome = if ready {
                    self.collect_entry(&mut cs, &entry, &mut zones)
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

    pub(crate) fn give_up(&self, entry: &Pending, reason: DropReason) -> Outcome {
        match entry {
            Pending::List { list, generation } => {
                let state = lock(&list.state);
                if state.submissions == *generation {
                    self.count_dropped(reason, state.timed_zones);
                } else {
                    self.count_dropped(DropReason::Superseded, state.timed_zones);
                }
            }
            Pending::Submission(index) => self.give_up_submission(*index, reason),
        }
        Outcome::Done
    }

    fn collect_entry(&self, cs: &mut CollectState, entry: &Pending, zones: &mut u64) -> Outcome {
        match entry {
            Pending::List { list, generation } => {
                let mut state = lock(&list.state);
                if state.submissions != *generation {
                    // Submitted again since: the events now time the later submission, which
                    // reports them.
                    self.count_dropped(DropReason::Superseded, state.timed_zones);
                    return Outcome::Done;
                }
                match self.list_times(cs, &state, false) {
                    Times::Ready => {}
                    Times::NotReady => return Outcome::NotReady,
                    Times::Failed => {
                        self.count_dropped(DropReason::EventError, state.timed_zones);
                        return Outcome::Done;
                    }
                }
                if self.activity_pending(cs, &mut state) {
                    return Outcome::NotReady;
                }
                self.emit_list(cs, &mut state, (0, u64::MAX), zones);
                Outcome::Done
            }
            Pending::Submission(index) => self.collect_submission(cs, *index, zones),
        }
    }

    /// Puts the times of `state`'s records (trace clock) in `cs.times`, from its events; an
    /// activity-timed command gets a placeholder. `Ready` only when every event completed.
    ///
    /// `known_complete`: the caller knows every event of the list completed (an event recorded
    /// after them on the stream did). Otherwise each event is queried before its time is asked
    /// for: `cuEventElapsedTime` on an event not complete yet answers `CUDA_ERROR_NOT_READY`,
    /// which compute-sanitizer reports as an API error.
    pub(crate) fn list_times(
        &self,
        cs: &mut CollectState,
        state: &ListState,
        known_complete: bool,
    ) -> Times {
        cs.times.clear();
        let Some(anchor) = state.records.iter().find_map(Record::event) else {
            cs.times.resize(state.records.len(), 0);
            return Times::Ready;
        };
        if !known_complete {
            // The last event recorded first: on a stream it is the last to complete, a cheap
            // early out. In a graph, zones between two barriers run concurrently, so the others
            // may still run when it completed: each is asked too.
            for event in state.records.iter().rev().filter_map(Record::event) {
                // SAFETY: the list's events come from this context's pool and stay alive while
                // the list does (the caller holds it).
                match unsafe { self.backend.query(event.0) } {
                    Ok(true) => {}
                    Ok(false) => return Times::NotReady,
                    Err(_) => return Times::Failed,
                }
            }
        }
        // SAFETY: the base event lives as long as `self`; the anchor as long as the list.
        let base_to_anchor = match unsafe { self.backend.elapsed_ms(cs.base.0, anchor.0) } {
            Ok(Some(ms)) => ms,
            Ok(None) => return Times::NotReady,
            Err(_) => return Times::Failed,
        };
        // Every event's time first, so a list is shown whole or not at all. Every event is
        // complete by now; `None` (CUDA_ERROR_NOT_READY) would only mean a caller that claimed
        // so wrongly, and keeps the list for later.
        let base_ns = cs.calibration.base_ns;
        for record in &state.records {
            let Some(event) = record.event() else {
                cs.times.push(0);
                continue;
            };
            // SAFETY: as above, both events belong to the list.
            match unsafe { self.backend.elapsed_ms(anchor.0, event.0) } {
                Ok(Some(ms)) => cs
                    .times
                    .push(timebase::event_ns(base_ns, base_to_anchor, ms)),
                Ok(None) => return Times::NotReady,
                Err(_) => return Times::Failed,
            }
        }
        Times::Ready
    }

    /// The trace-clock time of one event of this context, or why not.
    pub(crate) fn event_time(&self, cs: &CollectState, event: CUevent) -> Result<Option<u64>, ()> {
        // SAFETY: the caller passes a live timing event of this context; the base lives as long
        // as `self`.
        match unsafe { self.backend.elapsed_ms(cs.base.0, event) } {
            Ok(Some(ms)) => Ok(Some(timebase::event_ns(cs.calibration.base_ns, ms, 0.0))),
            Ok(None) => Ok(None),
            Err(_) => Err(()),
        }
    }

    /// Whether the list's activity-timed commands still wait for their records (counted, up to
    /// [`ACTIVITY_PATIENCE`] collections). Fills `cs.command_times` when they arrived.
    pub(crate) fn activity_pending(&self, cs: &mut CollectState, state: &mut ListState) -> bool {
        cs.command_times.clear();
        if state.commands == 0 {
            return false;
        }
        match self.command_times_flushing(cs, state) {
            Some(true) => false,
            Some(false) => {
                state.activity_waits += 1;
                if state.activity_waits < ACTIVITY_PATIENCE {
                    return true;
                }
                // Records that never came (lost by CUPTI, or a submission whose launches did
                // not match its commands): the command zones are dropped, the rest shown.
                cs.command_times.clear();
                false
            }
            None => false,
        }
    }

    /// Hands the zones of `state` to the sink, with the times `list_times` and
    /// `activity_pending` found; activity-timed commands are kept within `outer` (the zone
    /// enclosing the list) as well as their own enclosing zone.
    pub(crate) fn emit_list(
        &self,
        cs: &mut CollectState,
        state: &mut ListState,
        outer: (u64, u64),
        zones: &mut u64,
    ) {
        if state.commands > 0 && cs.command_times.is_empty() {
            self.count_dropped(DropReason::ActivityMissing, u64::from(state.commands));
        }
        let mut open: SmallVec<[u64; 8]> = SmallVec::new();
        let mut latest = 0u64;
        let mut command = 0usize;
        let mut activity_zones = 0u64;
        for (i, (record, &ns)) in state.records.iter().zip(&cs.times).enumerate() {
            match record {
                Record::Begin { name, .. } => {
                    latest = latest.max(ns);
                    self.sink.gpu_zone_begin(self.track, name, ns);
                    open.push(ns);
                }
                Record::End { .. } => {
                    latest = latest.max(ns);
                    self.sink.gpu_zone_end(self.track, ns);
                    open.pop();
                    *zones += 1;
                }
                Record::Command { name, .. } => {
                    let Some(&times) = cs.command_times.get(command) else {
                        continue;
                    };
                    command += 1;
                    let Some((begin, end)) = times else {
                        self.count_dropped(DropReason::ActivityMissing, 1);
                        continue;
                    };
                    // Event and activity times come from two calibrations: keep the command
                    // inside its enclosing zone so viewers nest it.
                    let floor = open.last().copied().unwrap_or(outer.0);
                    let ceiling = enclosing_end(&state.records, &cs.times, i).unwrap_or(outer.1);
                    let begin = begin.clamp(floor, ceiling.max(floor));
                    let end = end.clamp(begin, ceiling.max(begin));
                    latest = latest.max(end);
                    self.sink.gpu_zone_begin(self.track, name, begin);
                    self.sink.gpu_zone_end(self.track, end);
                    *zones += 1;
                    activity_zones += 1;
                }
            }
        }
        // Zones never ended when submitted are closed at the list's last time, so the sink's
        // nesting stays balanced.
        for _ in 0..open.len() {
            self.sink.gpu_zone_end(self.track, latest);
            *zones += 1;
        }
        self.counters
            .activity_zones
            .fetch_add(activity_zones, Ordering::Relaxed);
    }

    /// As [`Shared::command_times`], flushing CUPTI first when the records are not all in yet
    /// (once per collection: a flush is only worth its cost when a list is waiting for it).
    fn command_times_flushing(&self, cs: &mut CollectState, state: &mut ListState) -> Option<bool> {
        let found = self.command_times(cs, state);
        if found != Some(false) || cs.flushed {
            return found;
        }
        let session = self.cupti.as_ref()?;
        cs.flushed = true;
        // A failure leaves the records for a later collection.
        if session.flush().is_err() {
            return found;
        }
        self.command_times(cs, state)
    }

    /// Finds the activity records of `state`'s commands among those CUPTI delivered, takes them,
    /// and puts each command's times (trace clock) in `cs.command_times`. `Some(false)`: not all
    /// arrived yet; `None`: they can never match (no CUPTI, or launches and commands differ).
    ///
    /// Records are keyed (graph: the node cuhal added; otherwise: the launch's correlation id),
    /// sorted once, and each command looks its key up: O(n log n) in the list's records, no
    /// allocation once the scratch vectors have grown.
    fn command_times(&self, cs: &mut CollectState, state: &mut ListState) -> Option<bool> {
        let session = self.cupti.as_ref()?;
        let ids = &state.ids;
        let commands = state.commands as usize;
        // A graph is one launch whose records carry node ids; a deferred replay is one launch
        // per command, in order.
        let graph = ids.len() == 1
            && state
                .records
                .iter()
                .any(|r| matches!(r, Record::Command { node_id, .. } if *node_id != 0));
        if !graph && ids.len() != commands {
            return None;
        }
        let clock = cs.cupti_clock?;
        cs.launch_ids.clear();
        cs.launch_ids.extend_from_slice(ids);
        cs.launch_ids.sort_unstable();
        session.with_arrived(|arrived| {
            cs.candidates.clear();
            for (i, a) in arrived.iter().enumerate() {
                if cs.launch_ids.binary_search(&a.correlation_id).is_ok() {
                    let key = if graph {
                        a.node_id
                    } else {
                        u64::from(a.correlation_id)
                    };
                    cs.candidates.push((key, i));
                }
            }
            if cs.candidates.len() < commands {
                return Some(false);
            }
            cs.candidates.sort_unstable();
            cs.used.clear();
            cs.used.resize(cs.candidates.len(), false);
            cs.matched.clear();
            let mut ordinal = 0usize;
            for record in &state.records {
                let Record::Command { node_id, .. } = record else {
                    continue;
                };
                let key = if graph {
                    *node_id
                } else {
                    u64::from(ids[ordinal])
                };
                ordinal += 1;
                let found = if graph && key == 0 {
                    None
                } else {
                    let first = cs.candidates.partition_point(|&(k, _)| k < key);
                    (first..cs.candidates.len())
                        .take_while(|&c| cs.candidates[c].0 == key)
                        .find(|&c| !cs.used[c])
                };
                match found {
                    Some(c) => {
                        cs.used[c] = true;
                        cs.matched.push(cs.candidates[c].1);
                    }
                    // A graph command whose node has no record of its own (an indirect
                    // dispatch's, whose node is not reported): its zone alone is dropped.
                    None if graph => cs.matched.push(usize::MAX),
                    None => return Some(false),
                }
            }
            if graph && cs.matched.iter().all(|&i| i == usize::MAX) {
                // Nothing matched: the records may be late.
                return Some(false);
            }
            for &i in &cs.matched {
                cs.command_times.push(
                    arrived
                        .get(i)
                        .map(|a| (clock.to_trace_ns(a.start), clock.to_trace_ns(a.end))),
                );
            }
            // Take every record of the list's launches (matched or not), highest index first so
            // the lower ones stay valid.
            cs.taken.clear();
            cs.taken.extend(cs.candidates.iter().map(|&(_, i)| i));
            cs.taken.sort_unstable_by(|a, b| b.cmp(a));
            for &i in &cs.taken {
                arrived.swap_remove(i);
            }
            Some(true)
        })
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

    pub(crate) fn shared(&self) -> Option<&Arc<Shared>> {
        self.shared.as_ref()
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
        let (cupti, fine_source, cupti_unavailable) = if config.verbosity == Verbosity::Fine {
            match open_cupti(&config.cupti)? {
                Ok(session) => (Some(session), FineSource::Cupti, None),
                Err(reason) => (None, FineSource::Events, Some(reason)),
            }
        } else {
            (None, FineSource::None, None)
        };
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
            pool: TimingEventPool::new(backend.clone(), config.pool),
            backend,
            sink,
            track,
            name: config.name.clone(),
            slots: crate::submission::Slots::default(),
            ordinals: AtomicU64::new(0),
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
                command_times: Vec::new(),
                launch_ids: Vec::new(),
                candidates: Vec::new(),
                used: Vec::new(),
                matched: Vec::new(),
                taken: Vec::new(),
                flushed: false,
                cupti_clock: None,
                reported: [0; DropReason::ALL.len()],
                calibration_broken: false,
                last_end_ns: 0,
            }),
            closed: AtomicBool::new(false),
            rebase_after_ns: u64::try_from(config.rebase_after.as_nanos()).unwrap_or(u64::MAX),
            counters: Counters::default(),
            cupti,
            fine_source,
            cupti_unavailable,
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
            fine_source: s.fine_source,
            cupti_unavailable: s.cupti_unavailable,
            activity_zones: c.activity_zones.load(Ordering::Relaxed),
            submission_slots: s.slots.created(),
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
