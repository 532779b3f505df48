//! Where collected zones go.
//!
//! A [`Sink`] receives GPU zones as begin/end pairs with trace-clock timestamps, in the order the
//! zones were recorded: for one track, every end closes the innermost open begin, and one
//! command buffer's zones arrive together, on one thread, after its work completed. Dropped
//! zones arrive as counts with a [`DropReason`]. CPU zones are optional.
//!
//! Sinks: [`MemorySink`] (tests), [`JsonSink`] (Chrome/Perfetto trace-event JSON), [`NullSink`]
//! (benchmarks), [`Fanout`] (several at once) and, with the `tracy` feature, `TracySink`.

mod json;
mod memory;
#[cfg(feature = "tracy")]
mod tracy;

use std::sync::Arc;

pub use json::JsonSink;
pub use memory::{MemoryRecord, MemorySink, MemorySubmission, MemoryZone};
#[cfg(feature = "tracy")]
pub use tracy::TracySink;

use crate::Error;
use crate::clock_sync::ClockSnapshot;

/// A GPU timeline of a sink: one per tracing context (queue).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrackId(pub u32);

/// Why zones were not shown.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// The event pool was at its cap with no free events when the zone began.
    PoolExhausted,
    /// All 65,536 Tracy query ids were in flight.
    QueryIdsExhausted,
    /// The zone's command buffer was dropped without ever being submitted.
    NeverSubmitted,
    /// The command buffer was submitted again before this submission was collected, so its
    /// events now time the later submission (which reports them).
    Superseded,
    /// The driver failed to report the zone's times (a lost context, an event never recorded).
    EventError,
    /// The tracing context went away before the submission completed.
    Abandoned,
    /// A command timed by the driver's activity records (CUPTI) got none that could be matched
    /// to it (records lost, or a submission whose launches did not match its commands).
    ActivityMissing,
    /// A stamped dispatch's zone had no room in the context's stamp ring (full of submissions
    /// not collected yet, or a command buffer with more stamps than the ring holds).
    StampsExhausted,
    /// A stamped dispatch's stamp was empty (the kernel did not run, or never reached its
    /// `CUHAL_ZONE_END`) or inverted (its begin after its end), or could not be read back.
    StampEmpty,
}

impl DropReason {
    /// Every reason, in declaration order.
    pub const ALL: [DropReason; 9] = [
        DropReason::PoolExhausted,
        DropReason::QueryIdsExhausted,
        DropReason::NeverSubmitted,
        DropReason::Superseded,
        DropReason::EventError,
        DropReason::Abandoned,
        DropReason::ActivityMissing,
        DropReason::StampsExhausted,
        DropReason::StampEmpty,
    ];

    /// A short human name.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::PoolExhausted => "pool exhausted",
            DropReason::QueryIdsExhausted => "query ids exhausted",
            DropReason::NeverSubmitted => "never submitted",
            DropReason::Superseded => "superseded",
            DropReason::EventError => "event error",
            DropReason::Abandoned => "abandoned",
            DropReason::ActivityMissing => "activity missing",
            DropReason::StampsExhausted => "stamps exhausted",
            DropReason::StampEmpty => "stamp empty",
        }
    }
}

/// Where and when the host issued a submission: the host side of a submission's zone.
#[derive(Copy, Clone, Debug)]
pub struct HostSpan<'a> {
    /// The submitting thread ([`crate::thread_id`]): the one that called the queue.
    pub thread: u64,
    /// Its name, if it has one.
    pub thread_name: Option<&'a str>,
    /// The thread that issued the work: the submitting one, or (when the submission waited on
    /// the host for its waits) a queue's worker.
    pub issuing_thread: u64,
    /// When the queue took the submission (`Queue::execute`), trace-clock nanoseconds.
    pub submitted_ns: u64,
    /// When the issue began (every wait reached or recorded on the device).
    pub issue_begin_ns: u64,
    /// When the issue ended (the work and its completion event enqueued).
    pub issue_end_ns: u64,
}

/// What a sink may show of one submission, beside its GPU zone.
#[derive(Copy, Clone, Debug)]
pub struct SubmissionDetails<'a> {
    /// The queue (the GPU track's name).
    pub queue: &'a str,
    /// The submission's ordinal among the traced submissions of its queue, from 1.
    pub ordinal: u64,
    /// Its waits, as (semaphore id, value).
    pub waits: &'a [(u64, u64)],
    /// Its signals, as (semaphore id, value).
    pub signals: &'a [(u64, u64)],
    /// The labels of its command buffers, in order.
    pub command_buffers: &'a [&'static str],
    /// Nanoseconds the GPU spent waiting for other queues' work (the waits recorded on the
    /// device) before it started this submission: `Some` when the submission waited on the
    /// device, measured from when its queue could have started it.
    pub device_wait_ns: Option<u64>,
    /// The host side: which thread issued it, and when.
    pub host: HostSpan<'a>,
    /// An id unique in the process linking the host zone to the GPU zones it produced (a flow
    /// arrow in viewers that draw them).
    pub flow: u64,
    /// Whether this replay's command zones were sampled, when FINE samples replays
    /// ([`FineSampling`](crate::FineSampling)) and a command buffer of the submission has
    /// CUPTI-timed commands; `None` otherwise (every replay is timed, or none can be).
    pub fine_sample: Option<FineSample>,
}

/// Whether a submission was one of the replays FINE sampled ([`SubmissionDetails::fine_sample`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct FineSample {
    /// Its commands were timed from CUPTI activity records (otherwise only the submission's and
    /// the command buffers' zones are shown, as COARSE shows them).
    pub sampled: bool,
    /// The replay's index among its executable's replays, from 0 (of the first command buffer
    /// of the submission with CUPTI-timed commands; sampled when any such buffer was).
    pub replay: u64,
    /// The rate it was decided at: one replay in this many.
    pub one_in: u32,
}

/// A consumer of collected zones. All timestamps are trace-clock nanoseconds
/// ([`crate::clock::now_ns`]).
pub trait Sink: Send + Sync {
    /// Opens a GPU track named `name` (a queue); `now_ns` is the trace clock now, for sinks that
    /// calibrate their own GPU clock against it (Tracy).
    fn register_gpu_track(&self, name: &str, now_ns: u64) -> Result<TrackId, Error>;
    /// A zone of `track` began at `timestamp_ns`.
    fn gpu_zone_begin(&self, track: TrackId, name: &str, timestamp_ns: u64);
    /// The innermost open zone of `track` ended at `timestamp_ns`.
    fn gpu_zone_end(&self, track: TrackId, timestamp_ns: u64);
    /// `count` zones of `track` were not shown, for `reason`.
    fn zones_dropped(&self, track: TrackId, reason: DropReason, count: u64);
    /// A whole GPU zone timed by the kernel's own stamps (`cuhal_zone_stamp.cuh`): its
    /// `%globaltimer` start and end, on the trace clock. Nested like any zone. The default
    /// shows it as a begin and an end; a sink may mark where its times came from.
    fn gpu_zone_stamped(&self, track: TrackId, name: &str, begin_ns: u64, end_ns: u64) {
        self.gpu_zone_begin(track, name, begin_ns);
        self.gpu_zone_end(track, end_ns);
    }
    /// A CPU zone on the calling thread. Sinks without CPU tracks ignore it.
    fn cpu_zone(&self, name: &str, begin_ns: u64, end_ns: u64) {
        let _ = (name, begin_ns, end_ns);
    }
    /// A submission's GPU zone began: like [`Sink::gpu_zone_begin`] (closed by a
    /// [`Sink::gpu_zone_end`]), with what produced it. The default shows the zone only.
    fn submission_begin(
        &self,
        track: TrackId,
        name: &str,
        timestamp_ns: u64,
        details: &SubmissionDetails<'_>,
    ) {
        let _ = details;
        self.gpu_zone_begin(track, name, timestamp_ns);
    }
    /// A command buffer's GPU zone began, the `index`-th of submission `ordinal`, labelled
    /// `label`: like [`Sink::gpu_zone_begin`]. The default shows the zone only.
    fn command_buffer_begin(
        &self,
        track: TrackId,
        label: &str,
        timestamp_ns: u64,
        ordinal: u64,
        index: usize,
    ) {
        let _ = (ordinal, index);
        self.gpu_zone_begin(track, label, timestamp_ns);
    }
    /// `track`'s context (re-)calibrated its clock: how its GPU times are put on the trace
    /// clock from now on, and how far they can be off (a clock snapshot). Sent once per
    /// calibration, the first when the context is made. The default ignores it.
    fn clock_snapshot(&self, track: TrackId, snapshot: &ClockSnapshot) {
        let _ = (track, snapshot);
    }
}

impl<S: Sink + ?Sized> Sink for Arc<S> {
    fn register_gpu_track(&self, name: &str, now_ns: u64) -> Result<TrackId, Error> {
        (**self).register_gpu_track(name, now_ns)
    }
    fn gpu_zone_begin(&self, track: TrackId, name: &str, timestamp_ns: u64) {
        (**self).gpu_zone_begin(track, name, timestamp_ns)
    }
    fn gpu_zone_end(&self, track: TrackId, timestamp_ns: u64) {
        (**self).gpu_zone_end(track, timestamp_ns)
    }
    fn zones_dropped(&self, track: TrackId, reason: DropReason, count: u64) {
        (**self).zones_dropped(track, reason, count)
    }
    fn gpu_zone_stamped(&self, track: TrackId, name: &str, begin_ns: u64, end_ns: u64) {
        (**self).gpu_zone_stamped(track, name, begin_ns, end_ns)
    }
    fn cpu_zone(&self, name: &str, begin_ns: u64, end_ns: u64) {
        (**self).cpu_zone(name, begin_ns, end_ns)
    }
    fn submission_begin(
        &self,
        track: TrackId,
        name: &str,
        timestamp_ns: u64,
        details: &SubmissionDetails<'_>,
    ) {
        (**self).submission_begin(track, name, timestamp_ns, details)
    }
    fn command_buffer_begin(
        &self,
        track: TrackId,
        label: &str,
        timestamp_ns: u64,
        ordinal: u64,
        index: usize,
    ) {
        (**self).command_buffer_begin(track, label, timestamp_ns, ordinal, index)
    }
    fn clock_snapshot(&self, track: TrackId, snapshot: &ClockSnapshot) {
        (**self).clock_snapshot(track, snapshot)
    }
}

/// A sink that drops everything: for measuring what tracing costs without a consumer.
#[derive(Copy, Clone, Debug, Default)]
pub struct NullSink;

impl Sink for NullSink {
    fn register_gpu_track(&self, _name: &str, _now_ns: u64) -> Result<TrackId, Error> {
        Ok(TrackId(0))
    }
    fn gpu_zone_begin(&self, _track: TrackId, _name: &str, _timestamp_ns: u64) {}
    fn gpu_zone_end(&self, _track: TrackId, _timestamp_ns: u64) {}
    fn zones_dropped(&self, _track: TrackId, _reason: DropReason, _count: u64) {}
}

/// Sends everything to several sinks (e.g. Tracy and a JSON file).
pub struct Fanout {
    sinks: Vec<Arc<dyn Sink>>,
    /// Per fanned-out track, each sink's own track.
    tracks: std::sync::Mutex<Vec<smallvec::SmallVec<[TrackId; 4]>>>,
}

impl Fanout {
    /// A sink that forwards to every one of `sinks`.
    pub fn new(sinks: Vec<Arc<dyn Sink>>) -> Self {
        Self {
            sinks,
            tracks: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn each(&self, track: TrackId, mut f: impl FnMut(&dyn Sink, TrackId)) {
        let own = crate::lock::lock(&self.tracks)
            .get(track.0 as usize)
            .cloned()
            .unwrap_or_default();
        for (sink, t) in self.sinks.iter().zip(own) {
            f(sink.as_ref(), t);
        }
    }
}

impl Sink for Fanout {
    fn register_gpu_track(&self, name: &str, now_ns: u64) -> Result<TrackId, Error> {
        let own = self
            .sinks
            .iter()
            .map(|s| s.register_gpu_track(name, now_ns))
            .collect::<Result<smallvec::SmallVec<[TrackId; 4]>, _>>()?;
        let mut tracks = crate::lock::lock(&self.tracks);
        tracks.push(own);
        Ok(TrackId(tracks.len() as u32 - 1))
    }
    fn gpu_zone_begin(&self, track: TrackId, name: &str, timestamp_ns: u64) {
        self.each(track, |s, t| s.gpu_zone_begin(t, name, timestamp_ns));
    }
    fn gpu_zone_end(&self, track: TrackId, timestamp_ns: u64) {
        self.each(track, |s, t| s.gpu_zone_end(t, timestamp_ns));
    }
    fn zones_dropped(&self, track: TrackId, reason: DropReason, count: u64) {
        self.each(track, |s, t| s.zones_dropped(t, reason, count));
    }
    fn gpu_zone_stamped(&self, track: TrackId, name: &str, begin_ns: u64, end_ns: u64) {
        self.each(track, |s, t| s.gpu_zone_stamped(t, name, begin_ns, end_ns));
    }
    fn cpu_zone(&self, name: &str, begin_ns: u64, end_ns: u64) {
        for s in &self.sinks {
            s.cpu_zone(name, begin_ns, end_ns);
        }
    }
    fn submission_begin(
        &self,
        track: TrackId,
        name: &str,
        timestamp_ns: u64,
        details: &SubmissionDetails<'_>,
    ) {
        self.each(track, |s, t| {
            s.submission_begin(t, name, timestamp_ns, details)
        });
    }
    fn command_buffer_begin(
        &self,
        track: TrackId,
        label: &str,
        timestamp_ns: u64,
        ordinal: u64,
        index: usize,
    ) {
        self.each(track, |s, t| {
            s.command_buffer_begin(t, label, timestamp_ns, ordinal, index)
        });
    }
    fn clock_snapshot(&self, track: TrackId, snapshot: &ClockSnapshot) {
        self.each(track, |s, t| s.clock_snapshot(t, snapshot));
    }
}
