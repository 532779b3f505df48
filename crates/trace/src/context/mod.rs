//! [`TraceContext`]: a queue's tracing context, the owner of everything its zones need. The
//! parts live beside it: its configuration (`config`, `fine_source`), the state it shares with
//! its lists and submissions (`shared`), what waits for collection (`pending`), collection
//! itself (`collect`, with `calibration` and `activity`), and its counters (`stats`).

mod activity;
mod calibration;
mod collect;
mod config;
mod event_bias;
mod fine_source;
mod globaltimer;
mod pending;
mod sampling;
mod shared;
mod stats;

pub(crate) use activity::ACTIVITY_PATIENCE;
pub(crate) use calibration::CALIBRATION_TRIES;
pub(crate) use collect::CollectState;
pub use config::{CuptiChoice, TraceConfig};
pub use event_bias::{BIAS_SPIN_NS, BIAS_TRIALS, EventBias};
pub use fine_source::FineSource;
pub use globaltimer::{EXCHANGE_ROUNDS, EXCHANGE_TIMEOUT};
pub(crate) use pending::{Outcome, Pending, Scope, Times};
pub use sampling::{BUDGET_FIRST_ONE_IN, FineSampling, MAX_ONE_IN};
pub(crate) use sampling::{Sample, Sampler};
pub(crate) use shared::Shared;
pub use stats::{DropCounts, TraceStats};

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cuhal_sys::PrimaryContext;
use smallvec::SmallVec;

use event_bias::EventBiases;
use fine_source::open_cupti;
use stats::Counters;

use crate::Error;
use crate::backend::{CudaEvents, EventBackend};
use crate::hook::{Verbosity, ZoneRecorder};
use crate::list::ZoneList;
use crate::lock::lock;
use crate::pool::{Ev, TimingEventPool};
use crate::sink::{DropReason, Sink, TrackId};
use crate::submission::SubmissionTicket;
use crate::timebase::Calibration;

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
            match open_cupti(&config.cupti, config.fine_sampling.samples())? {
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
        let mut shared = Shared {
            pool: TimingEventPool::new(backend.clone(), config.pool),
            backend,
            sink,
            track,
            name: config.name.clone(),
            slots: crate::submission::Slots::default(),
            ordinals: AtomicU64::new(0),
            complete_through: AtomicU64::new(0),
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
                stamp_times: Vec::new(),
                stamp_bytes: Vec::new(),
                ceilings: Vec::new(),
                stamp_first: None,
                candidates: Vec::new(),
                used: Vec::new(),
                matched: Vec::new(),
                taken: Vec::new(),
                flushed: false,
                cupti_clock: None,
                reported: [0; DropReason::ALL.len()],
                calibration_broken: false,
                rounds: Vec::new(),
                last_sync: None,
                last_end_ns: 0,
                complete_through: 0,
            }),
            closed: AtomicBool::new(false),
            stamps: Mutex::new(crate::stamps::StampRing::new(config.stamp_slots)),
            takes_stamps: config.stamp_slots > 0 && config.verbosity >= Verbosity::Fine,
            rebase_after_ns: u64::try_from(config.rebase_after.as_nanos()).unwrap_or(u64::MAX),
            counters: Counters::default(),
            cupti,
            fine_source,
            cupti_unavailable,
            event_biases: EventBiases::default(),
            sampling: if fine_source == FineSource::Cupti {
                config.fine_sampling
            } else {
                FineSampling::Every
            },
        };
        // From here `shared` owns the base events and destroys them on any failure.
        if fine_source == FineSource::Events {
            shared.event_biases = shared.measure_event_bias();
        }
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
    /// number of zones handed to the sink. Lists not complete stay queued. A queue submission
    /// not known complete ([`TraceContext::completed`]) has its completion event queried first
    /// (`cuEventQuery`).
    pub fn collect(&self) -> u64 {
        match &self.shared {
            Some(s) => s.collect(Scope::All),
            None => 0,
        }
    }

    /// Tells collection that the queue submission `ticket` completed, and with it every
    /// submission of this context issued before it: the caller saw `ticket`'s completion event
    /// (or a later one of the same stream) complete without error, and the context's
    /// submissions share that stream, which runs them in issue order. Their collection then
    /// reads their times without asking the driver again whether they completed. One atomic
    /// operation; a queue's completion side calls it for each submission it retires, before
    /// that submission's collection ([`TraceContext::collect_completed`]).
    ///
    /// A claim that is wrong costs no safety: timing an event still running answers "not
    /// ready" and the submission waits for a later collection (but compute-sanitizer reports
    /// that answer as an API error, which is why collection otherwise queries first).
    pub fn completed(&self, ticket: SubmissionTicket) {
        if let Some(s) = &self.shared {
            s.complete_through.fetch_max(ticket.0, Ordering::AcqRel);
        }
    }

    /// Collects the queue submissions known complete ([`TraceContext::completed`]), without a
    /// driver query each, and every list submitted on its own whose work completed (queried as
    /// by [`TraceContext::collect`]). Later submissions stay queued without a look: the
    /// collection their own completion runs takes them. When nothing is in reach (an earlier
    /// collection of the same completed batch took it all) it returns at once, with no driver
    /// call. Returns the number of zones handed to the sink.
    pub fn collect_completed(&self) -> u64 {
        match &self.shared {
            Some(s) => s.collect(Scope::Completed),
            None => 0,
        }
    }

    /// A collector for this context, like the one [`ZoneList::on_submit`] returns.
    pub fn collector(&self) -> Option<Box<dyn FnOnce() + Send>> {
        let shared = self.shared.clone()?;
        Some(Box::new(move || {
            shared.collect(Scope::All);
        }))
    }

    /// Takes a fresh calibration now, on the calling thread: a clock exchange with the GPU
    /// (under a millisecond; at most [`EXCHANGE_TIMEOUT`] when the device cannot start its
    /// kernel) and the base events stamped, or the host-bracket fallback (a few microseconds on
    /// an idle stream). Collection does this by itself when the base is older than the re-base
    /// age.
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
        let clock = *lock(&c.clock);
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
            clock_sync: clock.sync,
            clock_syncs: c.clock_syncs.load(Ordering::Relaxed),
            clock_sync_failures: c.clock_sync_failures.load(Ordering::Relaxed),
            clock_sync_failure: clock.failure,
            clock_drift_ns: clock.drift_ns,
            fine_source: s.fine_source,
            cupti_unavailable: s.cupti_unavailable,
            activity_zones: c.activity_zones.load(Ordering::Relaxed),
            submission_slots: s.slots.created(),
            event_bias_stream: s.event_biases.stream,
            event_bias_graph: s.event_biases.graph,
            event_bias_failures: c.event_bias_failures.load(Ordering::Relaxed),
            bias_corrected_zones: c.bias_corrected_zones.load(Ordering::Relaxed),
            sampled_replays: c.sampled_replays.load(Ordering::Relaxed),
            unsampled_replays: c.unsampled_replays.load(Ordering::Relaxed),
            stamp_zones: c.stamp_zones.load(Ordering::Relaxed),
            stamp_regions_in_use: lock(&s.stamps).in_use(),
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
        // All under one hold of the collector's lock: a collector still held elsewhere (a
        // list's `on_submit`, `collector`) may run at any time, and one that took the queue
        // between a last collection and the drain would put back what is still running after
        // the drain, never given up (its stamp regions freed with the ring under work that may
        // still write them).
        let mut cs = lock(&s.collect);
        s.collect_locked(&mut cs, Scope::All);
        let abandoned: Vec<Pending> = lock(&s.pending).drain(..).collect();
        for entry in &abandoned {
            s.give_up(entry, DropReason::Abandoned);
        }
        drop(abandoned);
        s.report_drops(&mut cs);
    }
}
