//! One tracing entry per queue submission, and its collection after completion.
//!
//! A queue's backend calls [`TraceContext::submit`] once per submission, handing it the issue
//! as a closure: the entry takes a recycled [`Slot`], notes the host side (thread, times, waits
//! and signals), lets each command buffer's zone list know it is issued again, has the caller
//! issue each command buffer and record the completion event, and queues the slot. The queue's
//! one cleanup collects it on the completion side after the submission completed, as IREE does
//! with its single cleanup callback; the completion side says first how far the stream is known
//! complete ([`TraceContext::completed`]), so a COARSE submission's collection makes no driver
//! call but the one `cuEventElapsedTime` that times its completion event.
//!
//! COARSE adds no GPU work of its own: the submission's zone ends at its completion event
//! (which the queue records anyway, with timing on when the queue traces) and begins when its
//! stream could first run it, the later of the host's issue and the previous traced
//! submission's completion on that stream. Only when that is unknown (the stream waited on
//! other queues' work on the device, or ran work this tracer did not see) is one timing event
//! recorded before the work. A command buffer's zone is the submission's when it is alone; a
//! submission of several records one event between each two. `docs/decisions/trace.md` gives
//! the accuracy of each choice.
//!
//! Nothing here allocates per submission once warm: slots, their lists and the pending queue
//! keep their capacity ([`Recycled`]); a sink may allocate when it writes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cuhal_command::{CommandBuffer, CommandBufferKind};
use cuhal_recycle::Recycled;
use cuhal_sys::{CUevent, CUstream};
use smallvec::SmallVec;

use crate::Error;
use crate::context::{CollectState, Outcome, Pending, Sample, Shared, Times, TraceContext};
use crate::list::{ListInner, ZoneList};
use crate::lock::{lock, try_lock};
use crate::pool::Ev;
use crate::sink::{DropReason, FineSample, HostSpan, SubmissionDetails};
use crate::stamps::StampRegion;

/// How many waits and signals a [`SubmissionInfo`] holds inline.
pub const INLINE_SEMAPHORES: usize = 4;

/// What a queue knows of a submission when it takes it, for the submission's zone details.
/// Built on the submitting thread ([`SubmissionInfo::new`]); inline up to
/// [`INLINE_SEMAPHORES`] waits and signals, so building one allocates nothing.
#[derive(Clone, Debug, Default)]
pub struct SubmissionInfo {
    /// When the queue took it (trace clock).
    pub submitted_ns: u64,
    /// The submitting thread ([`crate::thread_id`]).
    pub thread: u64,
    /// The submitting thread's handle, for its name.
    pub thread_handle: Option<std::thread::Thread>,
    /// Its waits, as (semaphore id, value).
    pub waits: SmallVec<[(u64, u64); INLINE_SEMAPHORES]>,
    /// Its signals, as (semaphore id, value).
    pub signals: SmallVec<[(u64, u64); INLINE_SEMAPHORES]>,
}

impl SubmissionInfo {
    /// A submission taken now, on the calling thread.
    pub fn new(
        waits: impl IntoIterator<Item = (u64, u64)>,
        signals: impl IntoIterator<Item = (u64, u64)>,
    ) -> Self {
        Self {
            submitted_ns: crate::clock::now_ns(),
            thread: crate::thread_id(),
            thread_handle: Some(std::thread::current()),
            waits: waits.into_iter().collect(),
            signals: signals.into_iter().collect(),
        }
    }
}

/// One step of a submission's issue, which [`TraceContext::submit`] asks its caller to take.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum IssueStep {
    /// Issue the command buffer at this index on the stream.
    CommandBuffer(usize),
    /// Issue the command buffer at `index`, which has stamped dispatches
    /// ([`BindingLayout::stamp_count`](cuhal_command::BindingLayout::stamp_count)), with its
    /// stamp region: `bytes` of zeroed device memory at `address`, bound at the command
    /// buffer's stamp slot ([`BindingLayout::stamped_table_into`](cuhal_command::BindingLayout::stamped_table_into)
    /// with `BufferRange::from_raw(address, bytes)`). The context keeps the region until the
    /// submission is collected; if the issue fails, the region is never used again.
    StampedCommandBuffer {
        /// The command buffer.
        index: usize,
        /// The region's first byte.
        address: cuhal_sys::CUdeviceptr,
        /// Its length.
        bytes: usize,
    },
    /// Record the submission's completion event on the stream, after all of its work.
    Completion,
}

/// What ran on the stream right before a submission: how its start is timed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum StreamBefore {
    /// Nothing, or only this context's traced submissions: the submission starts at the later
    /// of its issue and the previous one's completion. No event.
    Traced,
    /// Work this context did not trace (a fill, a copy): the start is timed by an event.
    Untraced,
    /// Waits for other streams' work on the device: the start is timed by an event, and the
    /// wait is shown ([`crate::SubmissionDetails::device_wait_ns`]).
    DeviceWait,
}

/// A traced submission's place in its context's issue order (its ordinal), which
/// [`TraceContext::submit`] returns: the queue hands it back to [`TraceContext::completed`] once
/// it saw the submission complete, so its collection asks the driver nothing more.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SubmissionTicket(pub(crate) u64);

impl SubmissionTicket {
    /// The submission's ordinal on its queue (as [`SubmissionDetails::ordinal`] shows it).
    pub fn ordinal(self) -> u64 {
        self.0
    }
}

/// Flow ids, unique in the process (several contexts may share a sink).
static NEXT_FLOW: AtomicU64 = AtomicU64::new(1);

/// A command buffer of a slot: its zone list (if traced by this context) and which of its
/// submissions this is. Recycled with its slot.
#[derive(Default)]
struct SlotBuffer {
    list: Option<Arc<ListInner>>,
    generation: u64,
    /// The list was issued again before this submission was collected, after its events
    /// completed: their times (and the launch ids) were kept here.
    snapped: bool,
    times: Recycled<Vec<u64>, MIN_ENTRIES>,
    ids: Recycled<Vec<u32>, MIN_ENTRIES>,
    /// Collections this submission has waited for its CUPTI records after its events
    /// completed. Per submission, not per list: a list issued again before an earlier
    /// submission was collected must not inherit that submission's spent patience (it would
    /// give up on its own records at the first look and drop its command zones).
    activity_waits: std::cell::Cell<u32>,
    /// Whether this replay was sampled, when FINE samples ([`crate::FineSampling`]); `None`
    /// when every replay is timed (or the list times nothing by CUPTI).
    sample: Option<Sample>,
    /// The region its stamped dispatches write, until collection reads it back.
    stamps: Option<StampRegion>,
}

/// The room a slot's list takes when it first grows: it doubles from there and is kept.
const MIN_ENTRIES: usize = 4;

/// The fewest submission slots made at once when none is free: the slots made double from
/// there.
const MIN_NEW_SLOTS: usize = 16;

/// One submission in flight. Recycled: its lists keep their room.
#[derive(Default)]
pub(crate) struct Slot {
    ordinal: u64,
    flow: u64,
    info: SubmissionInfo,
    issuing_thread: u64,
    issue_begin_ns: u64,
    issue_end_ns: u64,
    /// The first `count` are this submission's; the rest keep their lists for reuse.
    buffers: Recycled<Vec<SlotBuffer>, MIN_ENTRIES>,
    count: usize,
    labels: Recycled<Vec<&'static str>, MIN_ENTRIES>,
    /// The event between command buffers `i` and `i + 1` (`None`: the pool was empty).
    boundaries: Recycled<Vec<Option<Ev>>, MIN_ENTRIES>,
    /// The event recorded before the work when its start was not known otherwise.
    start: Option<Ev>,
    /// The stream waited on the device for other streams right before the work.
    waited: bool,
    /// The start was timed by an event (not estimated).
    timed_start: bool,
    completion: Option<Ev>,
    /// The times below were read (the events may be reused since).
    resolved: bool,
    begin_ns: u64,
    gpu_start_ns: u64,
    end_ns: u64,
    device_wait_ns: Option<u64>,
    boundary_ns: Recycled<Vec<u64>, MIN_ENTRIES>,
}

impl Slot {
    /// Events the slot holds from the pool, returned to it.
    /// This submission's command buffers.
    fn buffers(&self) -> &[SlotBuffer] {
        &self.buffers[..self.count]
    }

    /// Adds a command buffer, reusing a recycled entry when there is one.
    fn push_buffer(
        &mut self,
        list: Option<Arc<ListInner>>,
        generation: u64,
        sample: Option<Sample>,
        stamps: Option<StampRegion>,
    ) {
        if self.count == self.buffers.len() {
            self.buffers.push(SlotBuffer::default());
        }
        let buffer = &mut self.buffers.as_mut_slice()[self.count];
        buffer.list = list;
        buffer.generation = generation;
        buffer.snapped = false;
        buffer.times.clear();
        buffer.ids.clear();
        buffer.activity_waits.set(0);
        buffer.sample = sample;
        buffer.stamps = stamps;
        self.count += 1;
    }

    /// Hands back the stamp regions the slot still holds. A collected submission's work
    /// completed: each region is zeroed and returned to the ring
    /// ([`Shared::release_stamp_region`]). One that failed or will not be collected may still
    /// be running: its regions are given up ([`Shared::quarantine_stamp_region`]).
    fn end_stamps(&mut self, shared: &Shared, collected: bool) {
        let count = self.count;
        for buffer in &mut self.buffers.as_mut_slice()[..count] {
            match buffer.stamps.take() {
                Some(region) if collected => shared.release_stamp_region(region),
                Some(region) => shared.quarantine_stamp_region(region),
                None => {}
            }
        }
    }

    fn release_events(&mut self, shared: &Shared) {
        if let Some(start) = self.start.take() {
            shared.pool.release(&[start]);
        }
        for boundary in self.boundaries.drain(..).flatten() {
            shared.pool.release(&[boundary]);
        }
    }

    /// Ready for reuse: forgets the submission, keeps the capacity.
    fn clear(&mut self) {
        self.info.waits.clear();
        self.info.signals.clear();
        self.info.thread_handle = None;
        for buffer in &mut self.buffers.as_mut_slice()[..self.count] {
            buffer.list = None;
            buffer.snapped = false;
        }
        self.count = 0;
        self.labels.clear();
        self.boundaries.clear();
        self.boundary_ns.clear();
        self.start = None;
        self.waited = false;
        self.completion = None;
        self.resolved = false;
        self.device_wait_ns = None;
    }
}

/// Recycled submission storage of one context.
#[derive(Default)]
pub(crate) struct Slots {
    table: Mutex<Recycled<Vec<Arc<Mutex<Slot>>>, MIN_NEW_SLOTS>>,
    free: Mutex<Recycled<Vec<u32>, MIN_NEW_SLOTS>>,
}

impl Slots {
    /// A free slot, growing the table when none is (only while warming up).
    fn acquire(&self) -> (u32, Arc<Mutex<Slot>>) {
        if let Some(index) = lock(&self.free).pop() {
            let table = lock(&self.table);
            if let Some(slot) = table.get(index as usize) {
                return (index, slot.clone());
            }
        }
        self.grow()
    }

    /// Makes slots when none is free: as many as were made before (at least
    /// [`MIN_NEW_SLOTS`], see [`Recycled::grown`]), one handed out and the rest put on the free
    /// list, whose room then covers every slot, so releasing never allocates.
    #[cold]
    fn grow(&self) -> (u32, Arc<Mutex<Slot>>) {
        let mut table = lock(&self.table);
        let first = table.len();
        let more = Recycled::<Vec<Arc<Mutex<Slot>>>, MIN_NEW_SLOTS>::grown(first) - first;
        table.refill(more, || Some(Arc::new(Mutex::new(Slot::default()))));
        let len = table.len();
        let slot = table[first].clone();
        drop(table);
        let mut free = lock(&self.free);
        free.reserve_total(len);
        free.extend((first + 1..len).map(|index| index as u32));
        (first as u32, slot)
    }

    fn get(&self, index: u32) -> Option<Arc<Mutex<Slot>>> {
        lock(&self.table).get(index as usize).cloned()
    }

    fn release(&self, index: u32) {
        lock(&self.free).push(index);
    }

    /// Slots made so far (in flight or free).
    pub(crate) fn created(&self) -> usize {
        lock(&self.table).len()
    }
}

/// The name of a command buffer kind, as its zone's label.
fn label(kind: CommandBufferKind) -> &'static str {
    match kind {
        CommandBufferKind::Graph => "graph command buffer",
        CommandBufferKind::Stream => "stream command buffer",
        CommandBufferKind::Deferred => "deferred command buffer",
    }
}

/// The zone list of this context a command buffer records into, if any.
fn list_of<'a>(shared: &Arc<Shared>, cb: &'a Arc<dyn CommandBuffer>) -> Option<&'a ZoneList> {
    let list = cb.zones()?.as_any()?.downcast_ref::<ZoneList>()?;
    Arc::ptr_eq(&list.inner().shared, shared).then_some(list)
}

impl TraceContext {
    /// Issues one submission of `command_buffers` on `stream`, traced: the one tracing call of
    /// a queue's submission. `issue` is called for each [`IssueStep`] in order (every command
    /// buffer, then the completion event) and must enqueue that step on `stream`; its first
    /// error ends the issue and is returned. `before` says what the stream runs right before
    /// the submission, which decides whether its start needs an event ([`StreamBefore`]).
    ///
    /// The zones are collected after completion by [`TraceContext::collect_completed`], which
    /// the queue runs on its completion side once it saw the submission complete and said so
    /// with the returned ticket ([`TraceContext::completed`]); or by [`TraceContext::collect`],
    /// which queries the completion event first. Returns `None` when nothing is traced (at
    /// `Off`, or once the context is closing): this only issued.
    ///
    /// # Safety
    /// `stream` must be a live stream of this context's device. `completion` must be a live
    /// event of it with timing enabled, which `issue(IssueStep::Completion)` records on
    /// `stream`, and which is neither recorded again nor destroyed until the collection that
    /// runs after this submission completed (or failed) has returned.
    pub unsafe fn submit<E: From<Error>>(
        &self,
        stream: CUstream,
        info: &SubmissionInfo,
        command_buffers: &[Arc<dyn CommandBuffer>],
        before: StreamBefore,
        completion: CUevent,
        mut issue: impl FnMut(IssueStep) -> Result<(), E>,
    ) -> Result<Option<SubmissionTicket>, E> {
        let Some(shared) = self.shared().filter(|s| !s.is_closed()) else {
            for i in 0..command_buffers.len() {
                issue(IssueStep::CommandBuffer(i))?;
            }
            return issue(IssueStep::Completion).map(|()| None);
        };
        let issue_begin_ns = shared.backend.now_ns();
        let (index, cell) = shared.slots.acquire();
        let mut slot = lock(&cell);
        slot.ordinal = shared.ordinals.fetch_add(1, Ordering::Relaxed) + 1;
        slot.flow = NEXT_FLOW.fetch_add(1, Ordering::Relaxed);
        slot.info.submitted_ns = info.submitted_ns;
        slot.info.thread = info.thread;
        slot.info.thread_handle.clone_from(&info.thread_handle);
        slot.info.waits.extend_from_slice(&info.waits);
        slot.info.signals.extend_from_slice(&info.signals);
        slot.issuing_thread = crate::thread_id();
        slot.issue_begin_ns = issue_begin_ns;
        let result = Self::issue_into(
            shared,
            &mut slot,
            index,
            stream,
            command_buffers,
            before,
            &mut issue,
        );
        if let Err(error) = result {
            // The submission fails; the queue reports it. Nothing of it is shown. Its command
            // buffers issued before the failure may still run: their stamp regions are given up.
            slot.release_events(shared);
            slot.end_stamps(shared, false);
            slot.clear();
            drop(slot);
            shared.slots.release(index);
            return Err(error);
        }
        slot.completion = Some(Ev(completion));
        slot.issue_end_ns = shared.backend.now_ns();
        let zones = 1 + slot.count as u64;
        let ordinal = slot.ordinal;
        drop(slot);
        shared
            .counters
            .zones_recorded
            .fetch_add(zones, Ordering::Relaxed);
        lock(&shared.pending).push_back(Pending::Submission { index, ordinal });
        Ok(Some(SubmissionTicket(ordinal)))
    }

    /// The issue proper, filling `slot`.
    fn issue_into<E: From<Error>>(
        shared: &Arc<Shared>,
        slot: &mut Slot,
        index: u32,
        stream: CUstream,
        command_buffers: &[Arc<dyn CommandBuffer>],
        before: StreamBefore,
        issue: &mut impl FnMut(IssueStep) -> Result<(), E>,
    ) -> Result<(), E> {
        slot.waited = before == StreamBefore::DeviceWait;
        if before != StreamBefore::Traced
            && let Some(start) = shared.pool.acquire_one()
        {
            slot.start = Some(start);
            // SAFETY: the event comes from the pool; the caller vouches for the stream.
            unsafe { shared.backend.record(start.0, stream) }.map_err(E::from)?;
        }
        let last = command_buffers.len().saturating_sub(1);
        for (i, cb) in command_buffers.iter().enumerate() {
            let list = list_of(shared, cb).map(|l| l.inner());
            let stamps = match cb.bindings().stamp_count() {
                0 => None,
                count => Some(
                    lock(&shared.stamps)
                        .acquire(&*shared.backend, count)
                        .map_err(E::from)?,
                ),
            };
            let (generation, sample) = list.map_or((0, None), |l| l.begin_issue(index));
            let issued = issue(match stamps {
                Some(region) => IssueStep::StampedCommandBuffer {
                    index: i,
                    address: region.address,
                    bytes: region.bytes(),
                },
                None => IssueStep::CommandBuffer(i),
            });
            if let Some(list) = list {
                if issued.is_err() {
                    // Ends the capture, and closes a sampled replay's activity window.
                    list.abort_issue();
                } else {
                    list.end_issue(generation, index);
                }
            }
            if let Err(error) = issued {
                // Part of the command buffer may have been issued before the failure.
                if let Some(region) = stamps {
                    shared.quarantine_stamp_region(region);
                }
                return Err(error);
            }
            slot.push_buffer(list.cloned(), generation, sample, stamps);
            slot.labels.push(label(cb.kind()));
            if i < last {
                let boundary = shared.pool.acquire_one();
                if let Some(event) = boundary {
                    // SAFETY: as above.
                    unsafe { shared.backend.record(event.0, stream) }.map_err(E::from)?;
                }
                slot.boundaries.push(boundary);
            }
        }
        issue(IssueStep::Completion)
    }
}

impl Shared {
    /// Reads the event times of `list`'s submission `generation`, still waiting for collection
    /// in slot `index`, into that slot if its events completed, before the list is issued again
    /// (see `ListInner::begin_issue`).
    pub(crate) fn snapshot(&self, list: &ListInner, index: u32, generation: u64) {
        let Ok(_bound) = self.backend.enter() else {
            return;
        };
        let Some(cell) = self.slots.get(index) else {
            return;
        };
        let mut cs = lock(&self.collect);
        // Not waited for: this thread holds the slot it issues into and now the collector's
        // lock, so waiting here for a slot another thread is issuing into (and which that
        // thread holds while it may come here for the collector's lock) would deadlock. Every
        // other taker of a slot holds the collector's lock, so a slot held now is being issued
        // into: its submission has not completed, and there is nothing to read.
        let Some(mut slot) = try_lock(&cell) else {
            return;
        };
        let state = lock(&list.state);
        if state.queued != generation || state.submissions != generation {
            return; // collected meanwhile
        }
        let count = slot.count;
        let Some(buffer) = slot.buffers.as_mut_slice()[..count].iter_mut().find(|b| {
            b.generation == generation && b.list.as_ref().is_some_and(|l| std::ptr::eq(&**l, list))
        }) else {
            return;
        };
        if !matches!(self.list_times(&mut cs, &state, false), Times::Ready) {
            return; // not complete: the new issue supersedes it
        }
        buffer.times.clear();
        buffer.times.extend_from_slice(&cs.times);
        buffer.ids.clear();
        buffer.ids.extend_from_slice(&state.ids);
        buffer.snapped = true;
    }

    /// Gives up on a queued submission (its zones are counted as dropped for `reason`).
    pub(crate) fn give_up_submission(&self, index: u32, reason: DropReason) {
        let Some(cell) = self.slots.get(index) else {
            return;
        };
        let mut slot = lock(&cell);
        let mut dropped = 1 + slot.count as u64;
        for buffer in slot.buffers() {
            if let Some(list) = &buffer.list {
                let mut state = lock(&list.state);
                dropped += state.timed_zones;
                if state.queued == buffer.generation {
                    state.queued = 0;
                }
            }
        }
        self.count_dropped(reason, dropped);
        slot.release_events(self);
        // Given up, not collected: its work may still be in flight.
        slot.end_stamps(self, false);
        slot.clear();
        drop(slot);
        self.slots.release(index);
    }

    /// Reads the slot's own event times once its completion event completed.
    fn resolve(&self, cs: &mut CollectState, slot: &mut Slot) -> Result<bool, ()> {
        if slot.resolved {
            return Ok(true);
        }
        let Some(completion) = slot.completion else {
            return Err(());
        };
        // Known complete when the queue's completion side said so (`TraceContext::completed`):
        // it queried this event, or a later one of the stream, already. Otherwise asked first:
        // `cuEventElapsedTime` on an event not complete yet answers CUDA_ERROR_NOT_READY, which
        // compute-sanitizer reports as an API error, and a collection that looks at every
        // queued submission meets some still running behind the one that completed.
        if slot.ordinal > cs.complete_through {
            // SAFETY: the completion event stays live until this collection (the `submit`
            // contract).
            match unsafe { self.backend.query(completion.0) } {
                Ok(true) => {}
                Ok(false) => return Ok(false),
                Err(_) => return Err(()),
            }
        }
        let Some(end) = self.event_time(cs, completion.0)? else {
            return Ok(false);
        };
        // Every event recorded before the completion event on the stream has completed.
        let start = match slot.start {
            Some(start) => Some(self.event_time(cs, start.0)?.ok_or(())?),
            None => None,
        };
        slot.boundary_ns.clear();
        for i in 0..slot.boundaries.len() {
            let ns = match slot.boundaries[i] {
                Some(event) => Some(self.event_time(cs, event.0)?.ok_or(())?),
                None => None,
            };
            // A boundary without an event (pool empty) is placed at the next known one.
            slot.boundary_ns.push(ns.unwrap_or(u64::MAX));
        }
        let mut next = end;
        for ns in slot.boundary_ns.as_mut_slice().iter_mut().rev() {
            if *ns == u64::MAX {
                *ns = next;
            }
            next = *ns;
        }
        // The GPU cannot start before the host issued the work, nor before the stream's
        // previous traced submission completed.
        let ready = slot.issue_begin_ns.max(cs.last_end_ns).min(end);
        slot.begin_ns = ready.min(start.unwrap_or(ready));
        slot.gpu_start_ns = start.unwrap_or(ready).min(end);
        slot.timed_start = start.is_some();
        slot.device_wait_ns = if slot.waited {
            // Without a start event (the pool was empty) the wait is unknown: shown as none.
            start.map(|s| s.saturating_sub(ready))
        } else {
            None
        };
        slot.end_ns = end;
        cs.last_end_ns = cs.last_end_ns.max(end);
        slot.resolved = true;
        // The start and boundary events are read: back to the pool.
        slot.release_events(self);
        Ok(true)
    }

    /// Collects one queued submission: its zone, its command buffers' zones, and the zones
    /// each command buffer recorded, nested in that order.
    pub(crate) fn collect_submission(
        &self,
        cs: &mut CollectState,
        index: u32,
        zones: &mut u64,
    ) -> Outcome {
        let Some(cell) = self.slots.get(index) else {
            return Outcome::Done;
        };
        let mut slot = lock(&cell);
        match self.resolve(cs, &mut slot) {
            Ok(true) => {}
            Ok(false) => return Outcome::NotReady,
            Err(()) => {
                drop(slot);
                self.give_up_submission(index, DropReason::EventError);
                return Outcome::Done;
            }
        }
        // Shown whole or not at all: wait until every command buffer's activity records came.
        for buffer in slot.buffers() {
            if let Some(list) = &buffer.list {
                let mut state = lock(&list.state);
                if !self.activity_ready(cs, &mut state, buffer) {
                    return Outcome::NotReady;
                }
            }
        }
        let slot = &mut *slot;
        if !slot.timed_start
            && let Some(first) = slot.buffers[..slot.count]
                .first()
                .and_then(|b| self.first_event_ns(cs, b))
        {
            // The start was estimated on the host clock, whose mapping onto the GPU's is only
            // as good as the calibration: never let it fall after the first thing the GPU did.
            slot.gpu_start_ns = slot.gpu_start_ns.min(first);
            slot.begin_ns = slot.begin_ns.min(first);
        }
        let details = SubmissionDetails {
            queue: &self.name,
            ordinal: slot.ordinal,
            waits: &slot.info.waits,
            signals: &slot.info.signals,
            command_buffers: &slot.labels,
            device_wait_ns: slot.device_wait_ns,
            host: HostSpan {
                thread: slot.info.thread,
                thread_name: slot.info.thread_handle.as_ref().and_then(|t| t.name()),
                issuing_thread: slot.issuing_thread,
                submitted_ns: slot.info.submitted_ns,
                issue_begin_ns: slot.issue_begin_ns,
                issue_end_ns: slot.issue_end_ns,
            },
            flow: slot.flow,
            fine_sample: fine_sample(slot.buffers()),
        };
        self.sink
            .submission_begin(self.track, "submission", slot.begin_ns, &details);
        let count = slot.count;
        for (i, buffer) in slot.buffers.as_mut_slice()[..count].iter_mut().enumerate() {
            let begin = if i == 0 {
                slot.gpu_start_ns
            } else {
                slot.boundary_ns.get(i - 1).copied().unwrap_or(slot.end_ns)
            };
            let end = if i + 1 == count {
                slot.end_ns
            } else {
                slot.boundary_ns.get(i).copied().unwrap_or(slot.end_ns)
            };
            self.sink
                .command_buffer_begin(self.track, slot.labels[i], begin, slot.ordinal, i);
            if let Some(list) = &buffer.list {
                let list = list.clone();
                if let Some(sample) = buffer.sample {
                    lock(&list.state).sampler.observe(
                        &self.sampling,
                        sample.sampled,
                        end.saturating_sub(begin),
                    );
                }
                self.collect_buffer(cs, &list, buffer, (begin, end), zones);
            }
            self.sink.gpu_zone_end(self.track, end);
            *zones += 1;
        }
        self.sink.gpu_zone_end(self.track, slot.end_ns);
        *zones += 1;
        slot.end_stamps(self, true);
        slot.clear();
        self.slots.release(index);
        Outcome::Done
    }

    /// The time of the first event a command buffer's list recorded for its submission, if it
    /// recorded any and its time can be had.
    fn first_event_ns(&self, cs: &CollectState, buffer: &SlotBuffer) -> Option<u64> {
        let list = buffer.list.as_ref()?;
        let state = lock(&list.state);
        let index = state.records.iter().position(|r| r.event().is_some())?;
        if state.submissions == buffer.generation {
            let event = state.records[index].event()?;
            self.event_time(cs, event.0).ok().flatten()
        } else if buffer.snapped {
            buffer.times.get(index).copied()
        } else {
            None
        }
    }

    /// Whether the activity records of `list`'s submission `generation` all came (or will not
    /// be waited for any longer). Takes nothing.
    fn activity_ready(
        &self,
        cs: &mut CollectState,
        state: &mut crate::list::ListState,
        buffer: &SlotBuffer,
    ) -> bool {
        let Some(session) = &self.cupti else {
            return true;
        };
        if buffer.sample.is_some_and(|s| !s.sampled) {
            // Not sampled: no records were asked for, none is waited for.
            return true;
        }
        if state.commands == 0
            || buffer.activity_waits.get() + 1 >= crate::context::ACTIVITY_PATIENCE
        {
            return true;
        }
        let ids = if state.submissions == buffer.generation {
            &state.ids
        } else if buffer.snapped {
            &buffer.ids
        } else {
            return true; // superseded: nothing to wait for
        };
        let commands = state.commands as usize;
        // As `command_times` matches them: a graph is one launch whose records carry node ids,
        // a deferred replay one launch per command; other shapes never match.
        let graph = ids.len() == 1
            && state.records.iter().any(
                |r| matches!(r, crate::list::Record::Command { node_id, .. } if *node_id != 0),
            );
        if !graph && ids.len() != commands {
            return true;
        }
        cs.launch_ids.clear();
        cs.launch_ids.extend_from_slice(ids);
        cs.launch_ids.sort_unstable();
        let launch_ids = &cs.launch_ids;
        let count = || {
            session.with_arrived(|arrived| {
                arrived
                    .iter()
                    .filter(|a| launch_ids.binary_search(&a.correlation_id).is_ok())
                    .count()
            })
        };
        if count() >= commands {
            return true;
        }
        // Flush CUPTI once per collection, and only when a list waits for its records.
        if !cs.flushed {
            cs.flushed = true;
            if session.flush().is_ok() && count() >= commands {
                return true;
            }
        }
        buffer.activity_waits.set(buffer.activity_waits.get() + 1);
        false
    }

    /// Collects the zones `list` recorded for its submission `generation`, inside `outer`.
    fn collect_buffer(
        &self,
        cs: &mut CollectState,
        list: &ListInner,
        buffer: &mut SlotBuffer,
        outer: (u64, u64),
        zones: &mut u64,
    ) {
        let generation = buffer.generation;
        // Read (and zeroed, and given back) first, whatever becomes of the list's zones.
        self.read_stamps(cs, buffer.stamps.take());
        let mut state = lock(&list.state);
        let state = &mut *state;
        if state.queued == generation {
            state.queued = 0;
        }
        if state.timed_zones == 0 {
            return;
        }
        let snapshot = if state.submissions == generation {
            // The slot's completion event completed (`resolve`), and the list's events were
            // recorded before it.
            match self.list_times(cs, state, true) {
                Times::Ready => false,
                Times::NotReady | Times::Failed => {
                    // Complete before the completion event by stream order: a failure here is
                    // the driver's.
                    self.count_dropped(DropReason::EventError, state.timed_zones);
                    return;
                }
            }
        } else if buffer.snapped {
            cs.times.clear();
            cs.times.extend_from_slice(&buffer.times);
            buffer.ids.swap_storage(&mut state.ids);
            true
        } else {
            // The stamps are this submission's own: shown, not dropped.
            let stamps = u64::from(state.stamps);
            self.count_dropped(DropReason::Superseded, state.timed_zones - stamps);
            self.emit_stamps_alone(cs, state, outer, zones);
            return;
        };
        if buffer.sample.is_some_and(|s| !s.sampled) {
            // Not sampled: the zones with events, without the commands' (no record was asked
            // for; they are not counted as dropped), and nothing asked of CUPTI.
            cs.command_times.clear();
            self.emit_list(cs, state, outer, zones, false);
            if snapshot {
                buffer.ids.swap_storage(&mut state.ids);
            }
            return;
        }
        // `activity_ready` already waited for this submission's records: what is missing now
        // stays missing. The list's own count is left as it was, for the list's next
        // submission.
        let waits = state.activity_waits;
        state.activity_waits = crate::context::ACTIVITY_PATIENCE;
        let _ = self.activity_pending(cs, state);
        state.activity_waits = waits;
        self.emit_list(cs, state, outer, zones, true);
        if snapshot {
            buffer.ids.swap_storage(&mut state.ids);
        }
    }
}

/// What a submission's details say of its sampling: sampled when any of its command buffers
/// was, with the replay index and rate of the first that was decided.
fn fine_sample(buffers: &[SlotBuffer]) -> Option<FineSample> {
    let first = buffers.iter().find_map(|b| b.sample)?;
    Some(FineSample {
        sampled: buffers.iter().any(|b| b.sample.is_some_and(|s| s.sampled)),
        replay: first.replay,
        one_in: first.one_in,
    })
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("ordinal", &self.ordinal)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::{MIN_NEW_SLOTS, Slots, lock};

    /// Slots are made in doubling batches from `MIN_NEW_SLOTS` and handed out again once
    /// released: a window of submissions in flight that comes back makes none, and the free
    /// list always has room for every slot made (releasing never allocates).
    #[test]
    fn slots_double_from_the_start_and_are_reused() {
        let slots = Slots::default();
        let mut taken = Vec::new();
        for made in [MIN_NEW_SLOTS, 2 * MIN_NEW_SLOTS, 4 * MIN_NEW_SLOTS] {
            while taken.len() < made {
                taken.push(slots.acquire().0);
                assert_eq!(slots.created(), made);
            }
            assert!(lock(&slots.free).capacity() >= made);
        }
        let mut indices = taken.clone();
        indices.sort_unstable();
        indices.dedup();
        assert_eq!(indices.len(), taken.len(), "a slot was handed out twice");
        for round in 0..3 {
            for index in taken.drain(..) {
                slots.release(index);
            }
            while taken.len() < 4 * MIN_NEW_SLOTS {
                taken.push(slots.acquire().0);
            }
            assert_eq!(
                slots.created(),
                4 * MIN_NEW_SLOTS,
                "round {round} made slots"
            );
        }
    }
}
