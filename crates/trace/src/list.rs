//! A command buffer's list of zones: the events it records, and their bookkeeping.
//!
//! A [`ZoneList`] hands out a begin and an end event per zone from its context's pool (both at
//! `begin_zone`, so a zone is timed whole or dropped whole), remembers the order of begins and
//! ends, and on each submission queues itself on its context for collection. Its events return
//! to the pool when the last holder goes: the command buffer, and every submission of it not yet
//! collected. So an event is never reused while a submission may still record it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use std::cell::RefCell;

use cuhal_command::{CommandTiming, EventPlacement};
use cuhal_sys::{CUevent, CUgraph, CUgraphNode, CUstream};
use smallvec::SmallVec;

use crate::Error;
use crate::context::{Sample, Sampler, Shared};
use crate::cupti::{ActivityWindow, CaptureGuard};
use crate::hook::Verbosity;
use crate::lock::lock;
use crate::pool::Ev;
use crate::sink::DropReason;

/// One step of a list, in recording order.
pub(crate) enum Record {
    /// A timed zone began; `end` is reserved for its end. `placement`: the zone is one
    /// command's FINE zone, its events recorded right around the command there (its `End` is
    /// the next record); `None` for any other zone (a debug group, a whole command buffer).
    Begin {
        name: Arc<str>,
        begin: Ev,
        placement: Option<EventPlacement>,
    },
    /// The innermost timed zone ended.
    End { end: Ev },
    /// One command timed by its activity record (CUPTI): no events. `node_id` is CUPTI's id
    /// of the command's graph node (0 outside graphs).
    Command { name: Arc<str>, node_id: u64 },
    /// One dispatch timed by its own stamp (`cuhal_zone_stamp.cuh`): no events; its times are
    /// read from its command buffer's stamp region at `index`.
    Stamp { name: Arc<str>, index: u32 },
}

impl Record {
    /// The event this record times, if it has one.
    pub(crate) fn event(&self) -> Option<Ev> {
        match self {
            Record::Begin { begin, .. } => Some(*begin),
            Record::End { end } => Some(*end),
            Record::Command { .. } | Record::Stamp { .. } => None,
        }
    }
}

pub(crate) struct ListState {
    pub(crate) records: Vec<Record>,
    /// The reserved end event of each open zone, innermost last; `None` for a dropped zone.
    open: SmallVec<[Option<Ev>; 8]>,
    /// Every event taken from the pool, returned on drop.
    events: Vec<Ev>,
    /// Submissions so far: a queued collection is current only if no later one was issued.
    pub(crate) submissions: u64,
    /// `will_issue` counted the submission being issued; its `on_submit` must not count it again.
    issuing: bool,
    /// Zones with events (begun, whether or not ended), and activity-timed commands.
    pub(crate) timed_zones: u64,
    /// Activity-timed commands in `records`.
    pub(crate) commands: u32,
    /// Stamped dispatches in `records` (their indices are 0 to this).
    pub(crate) stamps: u32,
    /// Correlation ids of the launches of the latest issue, in order (reused).
    pub(crate) ids: Vec<u32>,
    /// Collections that found the latest issue's events complete but not its records.
    pub(crate) activity_waits: u32,
    /// The submission (generation) queued by a queue's submission entry and not collected yet;
    /// 0 for none.
    pub(crate) queued: u64,
    /// The slot of that submission.
    pub(crate) queued_slot: u32,
    /// Which of this executable's replays are sampled ([`crate::FineSampling`]).
    pub(crate) sampler: Sampler,
}

thread_local! {
    /// The list whose issue this thread is capturing launch ids for, the capture, and the
    /// window that keeps CUPTI's activity kinds enabled for it (a sampled replay's).
    static CAPTURING: RefCell<Option<Capturing>> = const { RefCell::new(None) };
}

type Capturing = (Arc<ListInner>, CaptureGuard, Option<ActivityWindow>);

/// Ends the capture open on this thread, if any, handing its ids to its list; then closes its
/// activity window, if it has one.
fn finish_capture() {
    let Some((list, guard, window)) = CAPTURING
        .try_with(|c| c.try_borrow_mut().ok().and_then(|mut c| c.take()))
        .ok()
        .flatten()
    else {
        return;
    };
    guard.finish(|ids| {
        let mut state = lock(&list.state);
        state.ids.clear();
        state.ids.extend_from_slice(ids);
    });
    drop(window);
}

/// Starts capturing this thread's launch ids for `list`, whose issue follows on this thread,
/// with `window` keeping CUPTI's activity kinds enabled until the capture ends. A capture still
/// open belongs to the list issued before, whose launches are all made: it ends first.
fn start_capture(list: Arc<ListInner>, window: Option<ActivityWindow>) {
    finish_capture();
    let guard = CaptureGuard::start();
    let _ = CAPTURING.try_with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            *c = Some((list, guard, window));
        }
    });
}

/// Ends the capture open on this thread if it is `list`'s, whose launches are all made.
fn finish_capture_of(list: &Arc<ListInner>) {
    let mine = CAPTURING
        .try_with(|c| {
            c.try_borrow()
                .ok()
                .and_then(|c| c.as_ref().map(|(l, _, _)| Arc::ptr_eq(l, list)))
        })
        .ok()
        .flatten()
        .unwrap_or(false);
    if mine {
        finish_capture();
    }
}

pub(crate) struct ListInner {
    pub(crate) shared: Arc<Shared>,
    pub(crate) state: std::sync::Mutex<ListState>,
}

impl Drop for ListInner {
    fn drop(&mut self) {
        let state = self
            .state
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.submissions == 0 && state.timed_zones > 0 {
            self.shared
                .count_dropped(DropReason::NeverSubmitted, state.timed_zones);
        }
        self.shared.pool.release(&state.events);
    }
}

/// The zones of one command buffer (or of one submission), implementing
/// [`ZoneRecorder`](crate::ZoneRecorder).
///
/// Made by [`crate::TraceContext::zone_list`] or [`crate::TraceContext::recorder`]. Recording
/// is meant for one thread at a time (a command buffer is recorded by one thread); the methods
/// take `&self` and are safe from any thread.
pub struct ZoneList {
    inner: Arc<ListInner>,
    verbosity: Verbosity,
}

impl std::fmt::Debug for ZoneList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZoneList")
            .field("verbosity", &self.verbosity)
            .finish_non_exhaustive()
    }
}

impl ZoneList {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        let verbosity = shared.verbosity;
        Self {
            inner: Arc::new(ListInner {
                shared,
                state: std::sync::Mutex::new(ListState {
                    records: Vec::new(),
                    open: SmallVec::new(),
                    events: Vec::new(),
                    submissions: 0,
                    issuing: false,
                    timed_zones: 0,
                    commands: 0,
                    stamps: 0,
                    ids: Vec::new(),
                    activity_waits: 0,
                    queued: 0,
                    queued_slot: 0,
                    sampler: Sampler::default(),
                }),
            }),
            verbosity,
        }
    }

    /// How much this list traces (its context's verbosity).
    pub fn verbosity(&self) -> Verbosity {
        self.verbosity
    }

    /// Opens a zone named `name` and returns the event to record where it begins, or `None` when
    /// the zone is dropped (pool exhausted: counted). Every call needs a matching
    /// [`ZoneList::end_zone`].
    pub fn begin_zone(&self, name: &str) -> Option<CUevent> {
        self.begin_placed(name, None)
    }

    /// [`ZoneList::begin_zone`] of a command's zone whose events sit at `placement`, or of any
    /// other zone (`None`).
    fn begin_placed(&self, name: &str, placement: Option<EventPlacement>) -> Option<CUevent> {
        if self.verbosity == Verbosity::Off {
            return None;
        }
        let shared = &self.inner.shared;
        let mut state = lock(&self.inner.state);
        let Some((begin, end)) = shared.pool.acquire_pair() else {
            state.open.push(None);
            drop(state);
            shared.count_dropped(DropReason::PoolExhausted, 1);
            return None;
        };
        let name = shared.intern(name);
        state.events.push(begin);
        state.events.push(end);
        state.records.push(Record::Begin {
            name,
            begin,
            placement,
        });
        state.open.push(Some(end));
        state.timed_zones += 1;
        shared
            .counters
            .zones_recorded
            .fetch_add(1, Ordering::Relaxed);
        Some(begin.0)
    }

    /// Closes the innermost open zone and returns the event to record where it ends, or `None`
    /// when that zone was dropped (or no zone is open).
    pub fn end_zone(&self) -> Option<CUevent> {
        if self.verbosity == Verbosity::Off {
            return None;
        }
        let mut state = lock(&self.inner.state);
        let end = state.open.pop().flatten()?;
        state.records.push(Record::End { end });
        Some(end.0)
    }

    /// Opens and closes the FINE zone of one command. With CUPTI the command is timed by its
    /// activity record: no events, nothing added to the GPU work. Otherwise a begin and an end
    /// event to record right around the command at `placement`, as
    /// [`ZoneList::command_events`].
    pub fn command_zone(&self, name: &str, placement: EventPlacement) -> CommandTiming {
        if self.verbosity == Verbosity::Off {
            return CommandTiming::default();
        }
        let shared = &self.inner.shared;
        if shared.cupti.is_none() {
            return self.command_events(name, placement);
        }
        let name = shared.intern(name);
        let mut state = lock(&self.inner.state);
        state.records.push(Record::Command { name, node_id: 0 });
        state.commands += 1;
        state.timed_zones += 1;
        shared
            .counters
            .zones_recorded
            .fetch_add(1, Ordering::Relaxed);
        CommandTiming {
            begin: None,
            end: None,
            by_activity: true,
        }
    }

    /// Opens and closes the FINE zone of one command timed by events: a begin and an end event
    /// (as [`ZoneList::begin_zone`] and [`ZoneList::end_zone`]) that the caller records right
    /// around the command at `placement`. Collection takes off such a zone what its events add
    /// at that placement, as measured when the context was made
    /// ([`TraceStats::event_bias_stream`](crate::TraceStats::event_bias_stream) and
    /// [`TraceStats::event_bias_graph`](crate::TraceStats::event_bias_graph)).
    pub fn command_events(&self, name: &str, placement: EventPlacement) -> CommandTiming {
        if self.verbosity == Verbosity::Off {
            return CommandTiming::default();
        }
        CommandTiming {
            begin: self.begin_placed(name, Some(placement)),
            end: self.end_zone(),
            by_activity: false,
        }
    }

    /// Opens and closes the FINE zone of a dispatch that stamps itself
    /// ([`ZoneRecorder::stamp_zone`](crate::ZoneRecorder::stamp_zone)): its stamp index in this
    /// list (0, 1, 2, ... in recording order), or `None` when the context takes no stamps (not
    /// FINE, or a stamp ring of 0 slots; then the dispatch is timed as any other command).
    pub fn stamp_zone(&self, name: &str) -> Option<u32> {
        let shared = &self.inner.shared;
        if !shared.takes_stamps {
            return None;
        }
        let name = shared.intern(name);
        let mut state = lock(&self.inner.state);
        let index = state.stamps;
        state.records.push(Record::Stamp { name, index });
        state.stamps += 1;
        state.timed_zones += 1;
        shared
            .counters
            .zones_recorded
            .fetch_add(1, Ordering::Relaxed);
        Some(index)
    }

    /// The graph node the last activity-timed command became: its CUPTI id is how its record
    /// is found.
    ///
    /// # Safety
    /// `node` must be a live graph node.
    pub unsafe fn command_node(&self, node: CUgraphNode) {
        let Some(session) = &self.inner.shared.cupti else {
            return;
        };
        // SAFETY: the caller vouches for the node.
        let id = unsafe { session.graph_node_id(node) }.unwrap_or(0);
        let mut state = lock(&self.inner.state);
        if let Some(Record::Command { node_id, .. }) = state.records.last_mut() {
            *node_id = id;
        }
    }

    /// Marks every earlier submission of this list still waiting for collection as superseded,
    /// before the events are recorded again; the following [`ZoneList::on_submit`] then queues
    /// the new submission under that generation. (Without this call, `on_submit` does both.)
    pub fn will_issue(&self) {
        if self.verbosity == Verbosity::Off {
            return;
        }
        let mut state = lock(&self.inner.state);
        if !state.issuing {
            state.submissions += 1;
            state.issuing = true;
        }
        let capture = state.commands > 0;
        state.activity_waits = 0;
        drop(state);
        if capture {
            // Submitted on its own, a list is traced FINE every time: with sampling, the
            // activity kinds are enabled around its issue (without a session, no command is
            // CUPTI-timed and `capture` is false).
            let shared = &self.inner.shared;
            let window = match &shared.cupti {
                Some(session) if shared.sampling.samples() => session.open_window().ok(),
                _ => None,
            };
            start_capture(self.inner.clone(), window);
        }
    }

    /// Queues this list for collection after the submission just issued (its events must
    /// already be enqueued), and returns the collector to run on the completion thread once that
    /// submission completed. `None` when there is nothing to collect.
    ///
    /// Any collector collects everything of its context that is ready, so running several (one
    /// per command buffer of a submission) costs little and running them late loses nothing.
    pub fn on_submit(&self) -> Option<Box<dyn FnOnce() + Send>> {
        if self.verbosity == Verbosity::Off {
            return None;
        }
        let shared = &self.inner.shared;
        if shared.cupti.is_some() {
            finish_capture_of(&self.inner);
        }
        let generation = {
            let mut state = lock(&self.inner.state);
            let announced = std::mem::take(&mut state.issuing);
            if state.timed_zones == 0 {
                return None;
            }
            if !announced {
                state.submissions += 1;
            }
            if shared.is_closed() {
                drop(state);
                shared.count_dropped(DropReason::Abandoned, self.zone_count());
                return None;
            }
            state.submissions
        };
        shared.enqueue(self.inner.clone(), generation);
        let shared = shared.clone();
        Some(Box::new(move || {
            shared.collect(crate::context::Scope::All);
        }))
    }

    /// The list's shared state (for a queue's submission entry).
    pub(crate) fn inner(&self) -> &Arc<ListInner> {
        &self.inner
    }

    /// Zones with events in this list.
    pub fn zone_count(&self) -> u64 {
        lock(&self.inner.state).timed_zones
    }

    /// Opens a zone by recording its begin event on `stream` (`cuEventRecord`). Returns whether
    /// the zone is timed (false: dropped and counted).
    ///
    /// # Safety
    /// `stream` must be a live stream of the context this list's events belong to.
    pub unsafe fn begin_on_stream(&self, stream: CUstream, name: &str) -> Result<bool, Error> {
        match self.begin_zone(name) {
            Some(event) => {
                // SAFETY: the event comes from the pool; the caller vouches for the stream.
                unsafe { self.inner.shared.backend.record(event, stream)? };
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Closes the innermost zone by recording its end event on `stream`.
    ///
    /// # Safety
    /// As for [`ZoneList::begin_on_stream`].
    pub unsafe fn end_on_stream(&self, stream: CUstream) -> Result<bool, Error> {
        match self.end_zone() {
            Some(event) => {
                // SAFETY: the event comes from the pool; the caller vouches for the stream.
                unsafe { self.inner.shared.backend.record(event, stream)? };
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Opens a zone inside `graph`: adds a node recording its begin event after `deps`. Returns
    /// the node (to make the zone's work depend on it), or `None` when the zone is dropped.
    ///
    /// # Safety
    /// `graph` must be a live graph of the list's context and `deps` nodes of it.
    pub unsafe fn begin_in_graph(
        &self,
        graph: CUgraph,
        deps: &[CUgraphNode],
        name: &str,
    ) -> Result<Option<CUgraphNode>, Error> {
        let event = self.begin_zone(name);
        // SAFETY: the caller's contract is this one's.
        unsafe { self.record_in_graph(graph, deps, event) }
    }

    /// Closes the innermost zone inside `graph`: adds a node recording its end event after
    /// `deps` (the zone's work). Returns the node, or `None` when the zone was dropped.
    ///
    /// # Safety
    /// As for [`ZoneList::begin_in_graph`].
    pub unsafe fn end_in_graph(
        &self,
        graph: CUgraph,
        deps: &[CUgraphNode],
    ) -> Result<Option<CUgraphNode>, Error> {
        let event = self.end_zone();
        // SAFETY: the caller's contract is this one's.
        unsafe { self.record_in_graph(graph, deps, event) }
    }

    /// Adds a node recording `event` (a zone edge's, from the pool) inside `graph` after `deps`;
    /// `None` when there is no event (the zone is dropped).
    ///
    /// # Safety
    /// As for [`ZoneList::begin_in_graph`].
    unsafe fn record_in_graph(
        &self,
        graph: CUgraph,
        deps: &[CUgraphNode],
        event: Option<CUevent>,
    ) -> Result<Option<CUgraphNode>, Error> {
        let Some(event) = event else {
            return Ok(None);
        };
        // SAFETY: the event comes from the pool; the caller vouches for the graph and nodes.
        let node = unsafe {
            self.inner
                .shared
                .backend
                .add_graph_record_node(graph, deps, event)?
        };
        Ok(Some(node))
    }
}

// SAFETY: the events come from the context's pool, made by its backend, whose contract gives
// live timing events of the context; the list owns them until it is dropped.
unsafe impl crate::hook::ZoneRecorder for ZoneList {
    fn verbosity(&self) -> Verbosity {
        ZoneList::verbosity(self)
    }

    fn begin_zone(&self, name: &str) -> Option<CUevent> {
        ZoneList::begin_zone(self, name)
    }

    fn end_zone(&self) -> Option<CUevent> {
        ZoneList::end_zone(self)
    }

    fn command_zone(&self, name: &str, placement: EventPlacement) -> CommandTiming {
        ZoneList::command_zone(self, name, placement)
    }

    fn command_events(&self, name: &str, placement: EventPlacement) -> CommandTiming {
        ZoneList::command_events(self, name, placement)
    }

    fn stamp_zone(&self, name: &str) -> Option<u32> {
        ZoneList::stamp_zone(self, name)
    }

    unsafe fn command_node(&self, node: CUgraphNode) {
        // SAFETY: the caller's contract (a live node) is this method's.
        unsafe { ZoneList::command_node(self, node) }
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

impl ListInner {
    /// Called by a queue's submission entry right before the list's command buffer is issued
    /// again: keeps what the submission still queued needs (its event times, if complete, and
    /// its launch ids), counts the new submission, and starts capturing its launch ids. Returns
    /// the new submission's generation, and, when FINE samples replays and the list has
    /// CUPTI-timed commands, whether this replay is sampled: only a sampled replay is captured,
    /// inside an activity window (the kinds enabled for its launches alone); the others make no
    /// CUPTI call.
    pub(crate) fn begin_issue(self: &Arc<Self>, slot: u32) -> (u64, Option<Sample>) {
        let shared = &self.shared;
        let uncollected = {
            let state = lock(&self.state);
            // Only zones timed by the list's own events or records have times the issue is about
            // to overwrite: a list that times nothing (a COARSE command buffer without debug
            // groups), or only by stamps (each submission has a stamp region of its own), has
            // none to keep, so nothing to read and no lock of the collector's to take on the
            // issue path, where a round trip would wait for the previous submission's stamp
            // read-back.
            (state.timed_zones > u64::from(state.stamps)
                && state.queued != 0
                && state.queued == state.submissions
                && state.queued_slot != slot)
                .then_some((state.queued_slot, state.queued))
        };
        if let Some((queued_slot, generation)) = uncollected {
            // Its events are about to be recorded again: read them now into its slot if the
            // GPU is done with them (the host waited for the submission), so the completion
            // side's collection still shows it, however far behind it is.
            shared.snapshot(self, queued_slot, generation);
        }
        let mut state = lock(&self.state);
        state.submissions += 1;
        state.activity_waits = 0;
        let generation = state.submissions;
        let capture = state.commands > 0 && shared.cupti.is_some();
        let mut sample =
            (capture && shared.sampling.samples()).then(|| state.sampler.decide(&shared.sampling));
        drop(state);
        match (&mut sample, &shared.cupti) {
            (None, _) => {
                if capture {
                    start_capture(self.clone(), None);
                }
            }
            (Some(s), Some(session)) if s.sampled => match session.open_window() {
                Ok(window) => start_capture(self.clone(), Some(window)),
                // The kinds could not be enabled: traced as an unsampled replay.
                Err(_) => s.sampled = false,
            },
            (Some(_), _) => {}
        }
        if let Some(s) = sample {
            let counter = if s.sampled {
                &shared.counters.sampled_replays
            } else {
                &shared.counters.unsampled_replays
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        (generation, sample)
    }

    /// Called when the list's command buffer failed to issue: ends its capture (and its
    /// activity window) now rather than at the next issue on this thread.
    pub(crate) fn abort_issue(self: &Arc<Self>) {
        finish_capture_of(self);
    }

    /// Called once the list's command buffer was issued: its launches are all made, so the
    /// capture of their ids is complete.
    pub(crate) fn end_issue(self: &Arc<Self>, generation: u64, slot: u32) {
        if self.shared.cupti.is_some() {
            finish_capture_of(self);
        }
        let mut state = lock(&self.state);
        state.queued = generation;
        state.queued_slot = slot;
    }
}
