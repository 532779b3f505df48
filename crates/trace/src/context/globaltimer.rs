//! Calibration through `%globaltimer`: the clock exchange ties the GPU's timer to the host
//! clock, the base events are stamped between two `%globaltimer` kernels, and the tightest
//! base's bracket midpoint, mapped through the exchange, becomes the base's trace-clock time.
//! `calibration` runs it first at every (re-)calibration and falls back to its host bracket
//! when it fails; the arithmetic is [`crate::clock_sync`]'s.

use std::time::Duration;

use smallvec::SmallVec;

use super::calibration::CALIBRATION_TRIES;
use super::collect::CollectState;
use super::shared::Shared;
use crate::Error;
use crate::clock_sync::{ClockSync, GpuBracket};
use crate::pool::Ev;
use crate::timebase::Calibration;

/// Rounds per clock exchange: a round takes a PCIe round trip or two (about 1-3 us), so an
/// exchange takes well under a millisecond, and hundreds of rounds make it likely that one of
/// them had both legs at their shortest.
pub const EXCHANGE_ROUNDS: usize = 256;

/// How long the host waits for the exchange, kernel launch included, before it gives up and
/// falls back (and as long again for the kernels that stamp the base events): far above a
/// launch on an idle device (tens of microseconds), short enough that a device too busy to
/// start the kernels stalls collection only this long.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_millis(20);

impl Shared {
    /// Runs the exchange and stamps the base events; returns the base, its calibration and
    /// the exchange's map. A stamping failure may have re-recorded base events, so it marks
    /// the calibration broken (the caller's fallback mends it).
    pub(crate) fn calibrate_on_globaltimer(
        &self,
        cs: &mut CollectState,
    ) -> Result<(Ev, Calibration, ClockSync), Error> {
        cs.rounds.clear();
        self.backend
            .exchange_clocks(EXCHANGE_ROUNDS, EXCHANGE_TIMEOUT, &mut cs.rounds)?;
        let sync = ClockSync::from_rounds(&cs.rounds).ok_or(Error::ClockSync {
            reason: "no usable round",
        })?;
        let events: [_; CALIBRATION_TRIES] = std::array::from_fn(|i| cs.bases[i].0);
        let mut brackets: Vec<GpuBracket> = Vec::with_capacity(CALIBRATION_TRIES);
        // SAFETY: the candidates were created by this backend and live as long as `self`.
        let stamped = unsafe {
            self.backend
                .stamp_events(&events, EXCHANGE_TIMEOUT, &mut brackets)
        };
        if let Err(error) = stamped {
            cs.calibration_broken = true;
            return Err(error);
        }
        let candidates: SmallVec<[(Ev, GpuBracket); CALIBRATION_TRIES]> =
            cs.bases.iter().copied().zip(brackets).collect();
        let Some((base, bracket)) = candidates
            .into_iter()
            .filter(|(_, b)| b.is_valid())
            .min_by_key(|(_, b)| b.half_width_ns())
        else {
            cs.calibration_broken = true;
            return Err(Error::ClockSync {
                reason: "no base event was stamped",
            });
        };
        let calibration = Calibration {
            base_ns: sync.to_trace_ns(bracket.midpoint_ns()),
            uncertainty_ns: sync.uncertainty_ns.saturating_add(bracket.half_width_ns()),
            taken_at_ns: self.backend.now_ns(),
        };
        Ok((base, calibration, sync))
    }
}
