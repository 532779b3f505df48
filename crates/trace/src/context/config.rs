//! [`TraceConfig`]: how a queue traces (verbosity, track name, pool sizes, re-base age), and
//! [`CuptiChoice`], where FINE command zones should get their times. The context reads it once
//! at creation; `fine_source` opens the CUPTI session it asks for.

use std::time::Duration;

use super::sampling::FineSampling;
use crate::cupti::CuptiApi;
use crate::hook::Verbosity;
use crate::pool::PoolLimits;
use crate::timebase::DEFAULT_REBASE_AFTER_NS;

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
    /// Which replays of each executable FINE times from CUPTI (default: every one); the others
    /// are traced as COARSE is.
    pub fine_sampling: FineSampling,
    /// The zone-stamp ring's size, in 16-byte stamps (default
    /// [`DEFAULT_STAMP_SLOTS`](crate::DEFAULT_STAMP_SLOTS), 1 MiB of device memory, allocated
    /// at the first submission with stamps). 0: FINE takes no stamps, and stamped dispatches
    /// are timed as any other command.
    pub stamp_slots: u32,
}

/// Whether FINE zones of commands come from CUPTI's activity records or from timing events.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub enum CuptiChoice {
    /// Timing events around every command (extra graph nodes or stream records).
    Off,
    /// CUPTI when it loads and no other profiler holds it; otherwise timing events, said once
    /// on stderr and in [`TraceStats::cupti_unavailable`](crate::TraceStats::cupti_unavailable).
    #[default]
    Auto,
    /// CUPTI or an error ([`Error::Cupti`](crate::Error::Cupti)) naming why it cannot be had.
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

impl Default for TraceConfig {
    fn default() -> Self {
        Self {
            verbosity: Verbosity::Coarse,
            name: "GPU".to_owned(),
            pool: PoolLimits::default(),
            rebase_after: Duration::from_nanos(DEFAULT_REBASE_AFTER_NS),
            cupti: CuptiChoice::default(),
            fine_sampling: FineSampling::Every,
            stamp_slots: crate::stamps::DEFAULT_STAMP_SLOTS,
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
