//! Collection: [`CollectState`], the one collector's state, and the walk through the pending
//! queue that turns completed lists into zones for the sink (in submission order, keeping what
//! is not complete, reporting drops). Calibration and activity matching are its helpers; a
//! queue submission's own collection is in `submission`.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use smallvec::SmallVec;

use super::calibration::CALIBRATION_TRIES;
use super::pending::{Outcome, Pending, Scope, Times};
use super::shared::Shared;
use crate::list::{ListState, Record};
use crate::lock::lock;
use crate::pool::Ev;
use crate::sink::DropReason;
use crate::stamps::{STAMP_BYTES, StampRegion};
use crate::timebase::Calibration;

/// For every record, the time of the `End` that closes the zone enclosing it, if it has one,
/// into `out`: one pass from the back, the `End`s whose `Begin` is not reached yet on a stack
/// (the innermost on top), so a list's commands and stamps cost one look each, not a scan to
/// their zone's end.
fn enclosing_ends(records: &[Record], times: &[u64], out: &mut Vec<Option<u64>>) {
    out.clear();
    out.resize(records.len(), None);
    let mut ends: SmallVec<[u64; 8]> = SmallVec::new();
    for (i, (record, &ns)) in records.iter().zip(times).enumerate().rev() {
        out[i] = ends.last().copied();
        match record {
            Record::End { .. } => ends.push(ns),
            Record::Begin { .. } => {
                ends.pop();
            }
            Record::Command { .. } | Record::Stamp { .. } => {}
        }
    }
}

/// State of the (one at a time) collector.
pub(crate) struct CollectState {
    /// Candidate base events; a calibration records each and keeps the tightest bracket.
    pub(crate) bases: [Ev; CALIBRATION_TRIES],
    /// The base event of the current calibration.
    pub(crate) base: Ev,
    pub(crate) calibration: Calibration,
    /// A calibration failed half-way: the base may have been re-recorded, so `calibration`
    /// must not be used until a new one succeeds.
    pub(crate) calibration_broken: bool,
    /// The rounds of the latest clock exchange; reused.
    pub(crate) rounds: Vec<crate::clock_sync::ExchangeRound>,
    /// The latest clock exchange that calibrated (for the drift of the next).
    pub(crate) last_sync: Option<crate::clock_sync::ClockSync>,
    /// Entries being collected now; reused.
    pub(crate) work: VecDeque<Pending>,
    /// Entries to put back; reused.
    pub(crate) retry: Vec<Pending>,
    /// Timestamps of one list's records; reused.
    pub(crate) times: Vec<u64>,
    /// Begin and end of each activity-timed command of one list (`None`: no record); reused.
    pub(crate) command_times: Vec<Option<(u64, u64)>>,
    /// One list's launch ids, sorted; reused.
    pub(crate) launch_ids: Vec<u32>,
    /// The arrived records of one list's launches: (key, index into the arrived records),
    /// sorted; reused.
    pub(crate) candidates: Vec<(u64, usize)>,
    /// Which of `candidates` a command took; reused.
    pub(crate) used: Vec<bool>,
    /// Indices of the records matched to one list's commands; reused.
    pub(crate) matched: Vec<usize>,
    /// Indices of the records to remove, highest first; reused.
    pub(crate) taken: Vec<usize>,
    /// The times of one command buffer's stamps (trace clock), by stamp index, or why a
    /// stamp shows no zone; empty when its stamps got no region. Reused.
    pub(crate) stamp_times: Vec<Result<(u64, u64), DropReason>>,
    /// Set when `stamp_times` hold raw `%globaltimer` readings (no clock exchange to map them
    /// with): the earliest begin among them.
    pub(crate) stamp_first: Option<u64>,
    /// One stamp region's bytes, as read back; reused.
    pub(crate) stamp_bytes: Vec<u8>,
    /// The end of the zone enclosing each record of the list being emitted
    /// (`enclosing_ends`); reused.
    pub(crate) ceilings: Vec<Option<u64>>,
    /// Whether this collection flushed CUPTI already.
    pub(crate) flushed: bool,
    /// CUPTI's clock mapped onto the backend's host clock.
    pub(crate) cupti_clock: Option<crate::cupti::ClockMap>,
    /// Drops already handed to the sink, per reason.
    pub(crate) reported: [u64; DropReason::ALL.len()],
    /// When the last submission collected completed: the earliest the next one on the same
    /// stream can have started (trace clock).
    pub(crate) last_end_ns: u64,
    /// Submissions up to this ordinal are known complete (read at the start of a collection):
    /// their completion events are not queried.
    pub(crate) complete_through: u64,
}

impl Shared {
    /// Collects every queued entry in `scope` whose events have all completed, in submission
    /// order, and reports new drops. Returns the number of zones handed to the sink.
    pub(crate) fn collect(&self, scope: Scope) -> u64 {
        let mut cs = lock(&self.collect);
        self.collect_locked(&mut cs, scope)
    }

    /// [`Shared::collect`] with the collector's lock already held (`cs` is its state).
    pub(crate) fn collect_locked(&self, cs: &mut CollectState, scope: Scope) -> u64 {
        // Read under the collector's lock: a later collection never sees an older value.
        let through = self.complete_through.load(Ordering::Acquire);
        cs.complete_through = through;
        {
            let mut pending = lock(&self.pending);
            if !pending.iter().any(|entry| entry.in_scope(scope, through)) {
                // Nothing this collection may look at (the batch's earlier cleanup took it, or
                // what is queued is still running): no driver call, not even the context check.
                drop(pending);
                self.report_drops(cs);
                return 0;
            }
            std::mem::swap(&mut *pending, &mut cs.work);
        }
        let mut zones = 0;
        if !cs.work.is_empty() {
            let bound = self.backend.enter();
            let stale = cs.calibration_broken
                || cs
                    .calibration
                    .is_stale(self.backend.now_ns(), self.rebase_after_ns);
            let ready = bound.is_ok() && (!stale || self.calibrate(cs).is_ok());
            // CUPTI is flushed only when a list's events completed and its records are not in yet
            // (at most once per collection), not on every collection: a flush costs far more
            // than a look at the records already delivered.
            cs.flushed = false;
            if !self.sampling.samples() {
                self.refresh_cupti_clock(cs);
            }
            while let Some(entry) = cs.work.pop_front() {
                let outcome = if !entry.in_scope(scope, through) {
                    // Not known complete yet: its own completion collects it.
                    Outcome::NotReady
                } else if ready {
                    self.collect_entry(cs, &entry, &mut zones)
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
        self.report_drops(cs);
        zones
    }

    /// Maps CUPTI's clock onto the backend's again when the mapping is older than
    /// [`REBASE_AFTER_NS`](crate::cupti::REBASE_AFTER_NS) (or missing). Every collection with
    /// work does this first when every replay is sampled; with sampling, only one that matches
    /// a sampled replay's records does, so replays not sampled ask CUPTI nothing.
    pub(crate) fn refresh_cupti_clock(&self, cs: &mut CollectState) {
        let Some(session) = &self.cupti else {
            return;
        };
        let now = self.backend.now_ns();
        let stale = cs
            .cupti_clock
            .is_none_or(|c| now.saturating_sub(c.taken_at_ns) > crate::cupti::REBASE_AFTER_NS);
        if stale && let Ok(map) = session.calibrate_against(|| self.backend.now_ns()) {
            cs.cupti_clock = Some(map);
        }
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
            Pending::Submission { index, .. } => self.give_up_submission(*index, reason),
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
                // A list submitted on its own has no stamp region: its stamps show nothing.
                self.read_stamps(cs, None);
                self.emit_list(cs, &mut state, (0, u64::MAX), zones, true);
                Outcome::Done
            }
            Pending::Submission { index, .. } => self.collect_submission(cs, *index, zones),
        }
    }

    /// Hands the zones of `state` to the sink, with the times `list_times` and
    /// `activity_pending` found; activity-timed commands are kept within `outer` (the zone
    /// enclosing the list) as well as their own enclosing zone. Without `commands` (a replay
    /// not sampled) the activity-timed commands are left out, and not counted as dropped.
    pub(crate) fn emit_list(
        &self,
        cs: &mut CollectState,
        state: &mut ListState,
        outer: (u64, u64),
        zones: &mut u64,
        commands: bool,
    ) {
        if commands && state.commands > 0 && cs.command_times.is_empty() {
            self.count_dropped(DropReason::ActivityMissing, u64::from(state.commands));
        }
        let mut open: SmallVec<[u64; 8]> = SmallVec::new();
        let mut latest = 0u64;
        let mut command = 0usize;
        let mut activity_zones = 0u64;
        let mut corrected = 0u64;
        let mut stamp_zones = 0u64;
        let mut stamp_offset: Option<i128> = None;
        let mut ceilings = std::mem::take(&mut cs.ceilings);
        if state.stamps > 0 || state.commands > 0 {
            enclosing_ends(&state.records, &cs.times, &mut ceilings);
        }
        for (i, (record, &ns)) in state.records.iter().zip(&cs.times).enumerate() {
            match record {
                Record::Begin {
                    name, placement, ..
                } => {
                    if placement.is_some_and(|p| self.event_biases.correction_ns(p).is_some()) {
                        corrected += 1;
                    }
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
                Record::Stamp { name, index } => {
                    let floor = open.last().copied().unwrap_or(outer.0);
                    let ceiling = ceilings[i].unwrap_or(outer.1);
                    if let Some(end) =
                        self.emit_stamp(cs, name, *index, (floor, ceiling), &mut stamp_offset)
                    {
                        latest = latest.max(end);
                        *zones += 1;
                        stamp_zones += 1;
                    }
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
                    let ceiling = ceilings[i].unwrap_or(outer.1);
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
        cs.ceilings = ceilings;
        // Zones never ended when submitted are closed at the list's last time, so the sink's
        // nesting stays balanced.
        for _ in 0..open.len() {
            self.sink.gpu_zone_end(self.track, latest);
            *zones += 1;
        }
        self.counters
            .activity_zones
            .fetch_add(activity_zones, Ordering::Relaxed);
        self.counters
            .bias_corrected_zones
            .fetch_add(corrected, Ordering::Relaxed);
        self.counters
            .stamp_zones
            .fetch_add(stamp_zones, Ordering::Relaxed);
    }

    /// Hands one stamped zone to the sink (`index` into `cs.stamp_times`, which `read_stamps`
    /// filled), inside `within` (its enclosing zone), and returns its end; a stamp that shows
    /// no zone is counted as dropped. `offset` carries, from one stamp of a list to the next,
    /// the offset that places raw `%globaltimer` readings when no clock exchange maps them.
    pub(crate) fn emit_stamp(
        &self,
        cs: &CollectState,
        name: &str,
        index: u32,
        within: (u64, u64),
        offset: &mut Option<i128>,
    ) -> Option<u64> {
        let times = cs
            .stamp_times
            .get(index as usize)
            .copied()
            .unwrap_or(Err(DropReason::StampsExhausted));
        let (begin, end) = match times {
            Ok(times) => times,
            Err(reason) => {
                self.count_dropped(reason, 1);
                return None;
            }
        };
        let (floor, ceiling) = within;
        let (begin, end) = match cs.stamp_first {
            // Raw `%globaltimer` readings, with no clock exchange to map them: the earliest
            // stamp is placed where the first stamped zone's enclosing zone begins (an event
            // time, from the events' base), and the others keep their distance from it.
            Some(first) => {
                let offset = *offset.get_or_insert(i128::from(floor) - i128::from(first));
                let map =
                    |gpu: u64| u64::try_from((i128::from(gpu) + offset).max(0)).unwrap_or(u64::MAX);
                (map(begin), map(end))
            }
            None => (begin, end),
        };
        // Stamps and events come from two clocks' mappings: a zone that starts or ends outside
        // its enclosing zone is moved inside it, its own duration kept (the kernel's reading is
        // the better one) unless the enclosing zone is shorter, so viewers nest it.
        let duration = end - begin;
        let ceiling = ceiling.max(floor);
        let begin = begin
            .clamp(floor, ceiling)
            .min(ceiling.saturating_sub(duration))
            .max(floor);
        let end = begin.saturating_add(duration).min(ceiling);
        self.sink.gpu_zone_stamped(self.track, name, begin, end);
        Some(end)
    }

    /// The stamped zones of a list whose event times are gone (it was submitted again before
    /// this submission was collected): its stamps are this submission's own, so they are shown,
    /// inside `outer`, without the zones that events timed.
    pub(crate) fn emit_stamps_alone(
        &self,
        cs: &CollectState,
        state: &ListState,
        outer: (u64, u64),
        zones: &mut u64,
    ) {
        let mut offset = None;
        let mut shown = 0u64;
        for record in &state.records {
            if let Record::Stamp { name, index } = record
                && self
                    .emit_stamp(cs, name, *index, outer, &mut offset)
                    .is_some()
            {
                shown += 1;
            }
        }
        *zones += shown;
        self.counters
            .stamp_zones
            .fetch_add(shown, Ordering::Relaxed);
    }

    pub(crate) fn report_drops(&self, cs: &mut CollectState) {
        for (i, reason) in DropReason::ALL.iter().enumerate() {
            let now = self.counters.dropped[i].load(Ordering::Relaxed);
            if now > cs.reported[i] {
                self.sink
                    .zones_dropped(self.track, *reason, now - cs.reported[i]);
                cs.reported[i] = now;
            }
        }
    }

    /// Zeroes a collected submission's ring region and gives it back (a discard region needs
    /// nothing); one that cannot be zeroed stays out of the ring (a later submission would read
    /// its old stamps).
    pub(crate) fn release_stamp_region(&self, region: StampRegion) {
        if region.start.is_none() {
            return;
        }
        // SAFETY: the region lies in the ring this backend allocated; its submission completed
        // (it was collected), so no kernel writes it any more.
        if unsafe { self.backend.zero_device(region.address, region.bytes()) }.is_ok() {
            lock(&self.stamps).release(region);
        }
    }

    /// Gives up a region whose submission failed or will not be collected: work that may write
    /// it can still be in flight, so it is neither zeroed nor reused ([`StampRing::quarantine`]).
    ///
    /// [`StampRing::quarantine`]: crate::stamps::StampRing::quarantine
    pub(crate) fn quarantine_stamp_region(&self, region: StampRegion) {
        lock(&self.stamps).quarantine(region);
    }

    /// Reads a completed submission's stamp region into `cs.stamp_times` (trace clock, by
    /// stamp index), then zeroes it and gives it back. No region, or the discard region: the
    /// times stay empty, and each stamp is dropped as [`DropReason::StampsExhausted`].
    ///
    /// A slot whose end is 0 (the kernel did not run) or whose begin is after its end is
    /// dropped as [`DropReason::StampEmpty`]. Readings are `%globaltimer` nanoseconds, mapped
    /// with the context's latest clock exchange ([`crate::ClockSync::to_trace_ns`]). Without
    /// one (calibrated from host brackets only, so `%globaltimer` was never related to the
    /// trace clock), they are left as read and `cs.stamp_first` is set to the earliest: the
    /// zones are then placed from the events' base as `emit_list` says.
    pub(crate) fn read_stamps(&self, cs: &mut CollectState, region: Option<StampRegion>) {
        cs.stamp_times.clear();
        cs.stamp_first = None;
        let Some(region) = region else {
            return;
        };
        if region.start.is_none() {
            return;
        }
        cs.stamp_bytes.clear();
        cs.stamp_bytes.resize(region.bytes(), 0);
        // SAFETY: the region lies in the ring this backend allocated, `bytes()` long.
        let read = unsafe {
            self.backend
                .read_device(region.address, &mut cs.stamp_bytes)
        };
        self.release_stamp_region(region);
        if read.is_err() {
            cs.stamp_times
                .resize(region.count as usize, Err(DropReason::StampEmpty));
            return;
        }
        let word = |bytes: &[u8]| {
            let mut w = [0u8; 8];
            w.copy_from_slice(bytes);
            // The device is little-endian, as every CUDA device.
            u64::from_le_bytes(w)
        };
        let mut first = u64::MAX;
        for stamp in cs.stamp_bytes.chunks_exact(STAMP_BYTES) {
            let begin = !word(&stamp[..8]);
            let end = word(&stamp[8..]);
            if end == 0 || begin > end {
                cs.stamp_times.push(Err(DropReason::StampEmpty));
            } else {
                first = first.min(begin);
                cs.stamp_times.push(Ok((begin, end)));
            }
        }
        let Some(sync) = cs.last_sync else {
            cs.stamp_first = (first != u64::MAX).then_some(first);
            return;
        };
        for times in &mut cs.stamp_times {
            if let Ok((begin, end)) = times {
                *times = Ok((sync.to_trace_ns(*begin), sync.to_trace_ns(*end)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::Ev;

    /// The time of the `End` closing the zone enclosing record `at`, by scanning forward: what
    /// `enclosing_ends` must give for every record.
    fn scanned(records: &[Record], times: &[u64], at: usize) -> Option<u64> {
        let mut depth = 0i32;
        for (record, &ns) in records.iter().zip(times).skip(at + 1) {
            match record {
                Record::Begin { .. } => depth += 1,
                Record::End { .. } if depth == 0 => return Some(ns),
                Record::End { .. } => depth -= 1,
                Record::Command { .. } | Record::Stamp { .. } => {}
            }
        }
        None
    }

    #[test]
    fn enclosing_ends_match_a_forward_scan_for_every_record() {
        let event = Ev(std::ptr::null_mut());
        let name: std::sync::Arc<str> = "z".into();
        let begin = || Record::Begin {
            name: name.clone(),
            begin: event,
            placement: None,
        };
        let end = || Record::End { end: event };
        let stamp = || Record::Stamp {
            name: name.clone(),
            index: 0,
        };
        // Nested, sibling and never-ended zones, stamps at every depth.
        let records = vec![
            stamp(),
            begin(),
            stamp(),
            begin(),
            stamp(),
            end(),
            stamp(),
            begin(),
            end(),
            end(),
            stamp(),
            begin(),
            stamp(),
            begin(),
            stamp(),
            end(),
            stamp(),
        ];
        let times: Vec<u64> = (0..records.len() as u64).map(|i| 100 + i).collect();
        let mut out = Vec::new();
        enclosing_ends(&records, &times, &mut out);
        for (at, ceiling) in out.iter().enumerate() {
            assert_eq!(*ceiling, scanned(&records, &times, at), "record {at}");
        }
    }
}
