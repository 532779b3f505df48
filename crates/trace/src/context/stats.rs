//! [`TraceStats`] and [`DropCounts`]: a snapshot of a context's counters, and [`Counters`],
//! the atomics collection and zone lists count into. [`TraceContext::stats`](super::TraceContext::stats)
//! turns the one into the other.

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use super::event_bias::EventBias;
use super::fine_source::FineSource;
use crate::clock_sync::ClockSync;
use crate::hook::Verbosity;
use crate::sink::DropReason;

/// Zone counts per [`DropReason`].
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DropCounts(pub(crate) [u64; DropReason::ALL.len()]);

impl DropCounts {
    pub(crate) fn index(reason: DropReason) -> usize {
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
    /// How far the current calibration's event times can be off the trace clock, either way,
    /// in nanoseconds: through `%globaltimer`, the clock exchange's uncertainty plus half the
    /// base event's `%globaltimer` bracket; from the fallback, half the host-time bracket.
    pub calibration_uncertainty_ns: u64,
    /// The current calibration's map between `%globaltimer` and the trace clock (its offset and
    /// uncertainty, [`ClockSync::uncertainty_ns`]); `None` while the current calibration is the
    /// fallback's host bracket. [`ClockSync::to_trace_ns`] puts a kernel's own `%globaltimer`
    /// stamps on the trace clock.
    pub clock_sync: Option<ClockSync>,
    /// Clock exchanges that succeeded and calibrated (one per calibration through
    /// `%globaltimer`).
    pub clock_syncs: u64,
    /// Calibrations that fell back to the host bracket because the clock exchange or the
    /// stamping of the base events failed.
    pub clock_sync_failures: u64,
    /// Why the last of those failed.
    pub clock_sync_failure: Option<&'static str>,
    /// At the last re-calibration through `%globaltimer` that followed another, how far the
    /// earlier map had drifted ([`ClockSync::drift_since`]: positive when it read late).
    pub clock_drift_ns: Option<i64>,
    /// Where FINE command zones get their times.
    pub fine_source: FineSource,
    /// Why CUPTI is not used, when FINE fell back to events ("library not found", ...).
    pub cupti_unavailable: Option<&'static str>,
    /// Command zones timed from CUPTI activity records and handed to the sink.
    pub activity_zones: u64,
    /// Submission slots made so far: they are recycled, so this stops growing once the number
    /// of submissions in flight does.
    pub submission_slots: usize,
    /// What timing events measured to add to a command's zone recorded with stream events
    /// (`cuEventRecord` around it), which collection takes off each such zone; `None` when not
    /// measured (not FINE from events) or the measurement failed.
    pub event_bias_stream: Option<EventBias>,
    /// The same for event-record nodes around a command in a graph.
    pub event_bias_graph: Option<EventBias>,
    /// Bias measurements that failed (one per placement at most, when the context was made):
    /// those placements' zones are shown as their events read, uncorrected.
    pub event_bias_failures: u64,
    /// Command zones handed to the sink with the measured bias taken off.
    pub bias_corrected_zones: u64,
    /// Replays of command buffers with CUPTI-timed commands, issued by a queue, that were
    /// sampled ([`FineSampling`](crate::FineSampling): timed from CUPTI records); 0 under
    /// [`FineSampling::Every`](crate::FineSampling::Every), which samples nothing out.
    pub sampled_replays: u64,
    /// Such replays that were not sampled: traced as COARSE is.
    pub unsampled_replays: u64,
    /// Zones handed to the sink from kernels' own stamps (`cuhal_zone_stamp.cuh`).
    pub stamp_zones: u64,
    /// Stamp regions of the context's ring held by submissions not collected yet.
    pub stamp_regions_in_use: usize,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) zones_recorded: AtomicU64,
    pub(crate) zones_collected: AtomicU64,
    pub(crate) dropped: [AtomicU64; DropReason::ALL.len()],
    pub(crate) calibrations: AtomicU64,
    pub(crate) uncertainty_ns: AtomicU64,
    pub(crate) activity_zones: AtomicU64,
    pub(crate) event_bias_failures: AtomicU64,
    pub(crate) bias_corrected_zones: AtomicU64,
    pub(crate) sampled_replays: AtomicU64,
    pub(crate) unsampled_replays: AtomicU64,
    pub(crate) stamp_zones: AtomicU64,
    pub(crate) clock_syncs: AtomicU64,
    pub(crate) clock_sync_failures: AtomicU64,
    /// The clock figures that are not counts.
    pub(crate) clock: Mutex<ClockFigures>,
}

/// [`TraceStats::clock_sync`], [`TraceStats::clock_sync_failure`] and
/// [`TraceStats::clock_drift_ns`], as calibration leaves them.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct ClockFigures {
    pub(crate) sync: Option<ClockSync>,
    pub(crate) failure: Option<&'static str>,
    pub(crate) drift_ns: Option<i64>,
}
