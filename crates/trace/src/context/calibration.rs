//! The context's clock: calibrating a base event against the host clock (through
//! `%globaltimer`, see `globaltimer`, or else the tightest of [`CALIBRATION_TRIES`] host
//! brackets), and turning a list's events into trace-clock times from
//! that base ([`Shared::list_times`], [`Shared::event_time`]). Collection re-calibrates when
//! the base is older than the re-base age; the arithmetic is `timebase`'s.

use std::sync::atomic::Ordering;

use cuhal_sys::CUevent;

use super::collect::CollectState;
use super::event_bias;
use super::pending::Times;
use super::shared::Shared;
use crate::Error;
use crate::clock_sync::{ClockSnapshot, ClockSource};
use crate::list::{ListState, Record};
use crate::lock::lock;
use crate::pool::Ev;
use crate::timebase::{self, Calibration};

/// Calibration attempts per (re-)calibration: the bracket of one attempt varies with how fast
/// the host notices the record (8 to 17 us seen on an H200), so the tightest of three is kept.
pub(crate) const CALIBRATION_TRIES: usize = 3;

impl Shared {
    /// Takes a fresh calibration: through `%globaltimer` when the backend's clock exchange
    /// works (`globaltimer`), else from the tightest host bracket of the candidate base events
    /// (the failure counted). Either way the sink gets a [`ClockSnapshot`] and the counters
    /// the figures.
    pub(crate) fn calibrate(&self, cs: &mut CollectState) -> Result<(), Error> {
        let (base, calibration, source) = match self.calibrate_on_globaltimer(cs) {
            Ok((base, calibration, sync)) => (base, calibration, ClockSource::GlobalTimer(sync)),
            Err(error) => {
                self.counters
                    .clock_sync_failures
                    .fetch_add(1, Ordering::Relaxed);
                lock(&self.counters.clock).failure = Some(match error {
                    Error::ClockSync { reason } => reason,
                    _ => "a driver call failed",
                });
                let Some((base, calibration)) = self.calibrate_from_bracket(cs)? else {
                    return Ok(());
                };
                (base, calibration, ClockSource::HostBracket)
            }
        };
        cs.base = base;
        cs.calibration = calibration;
        cs.calibration_broken = false;
        let number = self.counters.calibrations.fetch_add(1, Ordering::Relaxed) + 1;
        self.counters
            .uncertainty_ns
            .store(calibration.uncertainty_ns, Ordering::Relaxed);
        let sync = match source {
            ClockSource::GlobalTimer(sync) => Some(sync),
            ClockSource::HostBracket => None,
        };
        let drift_ns = sync.and_then(|s| cs.last_sync.map(|earlier| s.drift_since(&earlier)));
        if let Some(sync) = sync {
            self.counters.clock_syncs.fetch_add(1, Ordering::Relaxed);
            cs.last_sync = Some(sync);
        }
        {
            let mut figures = lock(&self.counters.clock);
            figures.sync = sync;
            if drift_ns.is_some() {
                figures.drift_ns = drift_ns;
            }
        }
        self.sink.clock_snapshot(
            self.track,
            &ClockSnapshot {
                calibration: number,
                taken_at_ns: calibration.taken_at_ns,
                source,
                base_ns: calibration.base_ns,
                uncertainty_ns: calibration.uncertainty_ns,
                drift_ns,
            },
        );
        Ok(())
    }

    /// The fallback: each candidate base event is recorded on an idle stream and waited for,
    /// and the one with the tightest host-time bracket is returned with its calibration.
    fn calibrate_from_bracket(
        &self,
        cs: &mut CollectState,
    ) -> Result<Option<(Ev, Calibration)>, Error> {
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
        Ok(best)
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
        // The one place event zones are corrected: every list's times are read here, from
        // its events, whichever collection path shows them (a snapshot taken before a new
        // issue keeps corrected times and is not read again).
        event_bias::correct(&state.records, &mut cs.times, &self.event_biases);
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
}
