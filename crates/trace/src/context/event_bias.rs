//! What timing events add to the zone of the command they sit around, and its correction.
//!
//! A FINE command zone timed by events reads from its begin event to its end event. Those
//! events are GPU work of their own: the begin event is written before the command's launch is
//! processed, the end event after the command retired and its writes were flushed. So an event
//! zone reads longer than the command's own span (its first instruction to its last), by an
//! amount that depends on where the events sit ([`EventPlacement`]), not on the command. A
//! context that times commands by events measures that amount once, when it is made: it times
//! [`BIAS_TRIALS`] stamped kernels (each writes its own `%globaltimer` span) between two events
//! at each placement, on its private stream, and keeps the median of zone minus span
//! ([`EventBias`]). Collection then takes that median off every command zone timed by events at
//! that placement ([`correct`]), in one place (`Shared::list_times`), so each zone is corrected
//! once, never below zero length. A measurement that fails leaves its placement uncorrected and
//! is counted ([`TraceStats::event_bias_failures`](crate::TraceStats::event_bias_failures)).
//!
//! Not corrected: zones that are not one command's (debug groups, whole command buffers,
//! submissions: their events bracket gaps between commands that are real time of the stream),
//! and zones from CUPTI's activity records (no events; CUPTI's own definition of a kernel's
//! span, tested against CUPTI's records).

use std::sync::atomic::Ordering;

use cuhal_command::EventPlacement;

use super::shared::Shared;
use crate::list::Record;
use crate::stamped::StampedKernel;

/// Stamped kernels timed per placement.
pub const BIAS_TRIALS: usize = 32;

/// How long each stamped kernel spins (nanoseconds of `%globaltimer`). What events add does not
/// depend on the command's length (checked on the GPU with 100 us spins against this
/// calibration), so a short spin keeps the measurement cheap.
pub const BIAS_SPIN_NS: u64 = 5_000;

/// What a context measured its events to add to a command's zone at one placement: zone minus
/// the kernel's own span, over the stamped kernels that ran.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct EventBias {
    /// The median: what collection takes off each command zone at this placement.
    pub median_ns: u64,
    /// The 95th percentile (how far a single zone may still read long after the correction:
    /// `p95_ns - median_ns`).
    pub p95_ns: u64,
    /// The largest.
    pub max_ns: u64,
    /// Stamped kernels that ran and were counted.
    pub trials: u32,
}

impl EventBias {
    /// The figures of `samples`, or `None` when fewer than half of [`BIAS_TRIALS`] kernels ran
    /// (left stamps of zero) or their events could not be timed: the measurement failed.
    pub(crate) fn from_samples(samples: &[StampedKernel]) -> Option<Self> {
        let mut extra: Vec<u64> = samples
            .iter()
            .filter(|s| s.span_ns > 0 && s.zone_ns > 0)
            .map(|s| s.zone_ns.saturating_sub(s.span_ns))
            .collect();
        if extra.len() * 2 < BIAS_TRIALS {
            return None;
        }
        extra.sort_unstable();
        let at = |q: usize| extra[((extra.len() - 1) * q).div_ceil(100)];
        Some(Self {
            median_ns: at(50),
            p95_ns: at(95),
            max_ns: extra[extra.len() - 1],
            trials: u32::try_from(extra.len()).unwrap_or(u32::MAX),
        })
    }
}

/// The context's measured biases, one per placement (`None`: not measured, or failed).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct EventBiases {
    pub(crate) stream: Option<EventBias>,
    pub(crate) graph: Option<EventBias>,
}

impl EventBiases {
    /// What comes off a command zone whose events sit at `placement`.
    pub(crate) fn correction_ns(&self, placement: EventPlacement) -> Option<u64> {
        match placement {
            EventPlacement::Stream => self.stream,
            EventPlacement::Graph => self.graph,
        }
        .map(|b| b.median_ns)
    }
}

/// Takes the measured bias off each command zone timed by events in `times` (one time per
/// record, as `Shared::list_times` reads them from the events): the zone shrinks by the bias,
/// half from each side (events are timed only against each other, so how the bias splits
/// between begin and end cannot be observed, and a zone's length does not depend on it), and by
/// no more than its length, so it never ends before it begins and stays inside what its events
/// bracket. Every other record's time is left as it was. Returns the zones corrected.
pub(crate) fn correct(records: &[Record], times: &mut [u64], biases: &EventBiases) -> u64 {
    let mut corrected = 0;
    for (i, record) in records.iter().enumerate() {
        let Record::Begin {
            placement: Some(placement),
            ..
        } = record
        else {
            continue;
        };
        let Some(bias) = biases.correction_ns(*placement) else {
            continue;
        };
        // A command's zone is begun and ended together: its end is the next record.
        if !matches!(records.get(i + 1), Some(Record::End { .. })) || i + 1 >= times.len() {
            continue;
        }
        let (begin, end) = (times[i], times[i + 1]);
        let cut = bias.min(end.saturating_sub(begin));
        times[i] = begin + cut / 2;
        times[i + 1] = end - (cut - cut / 2);
        corrected += 1;
    }
    corrected
}

impl Shared {
    /// Measures what events add at each placement (see the module): on the backend's own
    /// stream, with the device current. A placement whose measurement fails stays uncorrected
    /// and is counted.
    pub(crate) fn measure_event_bias(&self) -> EventBiases {
        let mut samples = Vec::with_capacity(BIAS_TRIALS);
        let mut measure = |placement| {
            samples.clear();
            let bias = self
                .backend
                .time_stamped_kernels(placement, BIAS_TRIALS, BIAS_SPIN_NS, &mut samples)
                .ok()
                .and_then(|()| EventBias::from_samples(&samples));
            if bias.is_none() {
                self.counters
                    .event_bias_failures
                    .fetch_add(1, Ordering::Relaxed);
            }
            bias
        };
        EventBiases {
            stream: measure(EventPlacement::Stream),
            graph: measure(EventPlacement::Graph),
        }
    }
}
