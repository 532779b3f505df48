//! The CUDA backend of the scheduler: one non-blocking stream per queue.
//!
//! `issue` enqueues, in order, a `cuStreamWaitEvent` per device wait (none for an event of this
//! queue's own pool: it was recorded on this stream, whose order already waits for it), the
//! payload, and one completion event from the queue's own pool, which the scheduler also records as the device-signal timepoint of every
//! signal semaphore. The queue's completion thread queries those events (`cuEventQuery`) and,
//! when the scheduler's completion policy says so, blocks on one until the GPU's interrupt (see
//! `CudaBackend::sleep_until`). No driver callback is ever registered.

use std::sync::{Arc, PoisonError};

use cuhal_command::{BufferRange, CommandBuffer, FillPattern, HostBuffer, HostBufferUse};
use cuhal_recycle::Recycled;
use cuhal_scheduler::{Backend, ThreadRole};
use cuhal_semaphore::Failure;
use cuhal_sys::{
    CU_EVENT_BLOCKING_SYNC, CU_EVENT_DISABLE_TIMING, CU_STREAM_NON_BLOCKING, CUstream, Event,
    PrimaryContext, Stream, cu,
};
use cuhal_trace::{IssueStep, StreamBefore, SubmissionInfo, SubmissionTicket, TraceContext};
use smallvec::SmallVec;

use crate::bindings::BindingTables;
use crate::error::Error;
use crate::event_pool::{CudaEvent, EventStash, TimepointEventPool};
use crate::interop::ForeignEvent;
use crate::lost::Lost;
use crate::memory::{Allocation, AllocationUse};
use crate::submissions::IssueCount;

/// The work of one queue operation (crate-private: `Queue` checks every payload it builds, and
/// issuing one unchecked could make the driver touch memory it must not).
// Payloads live in the scheduler's recycled action storage, which holds the largest variant's size
// for every action, and are moved a few times on their way into it: past 128 bytes each move is a
// `memcpy` call. So what only some submissions carry is boxed (recycled boxes, no allocation once
// warm): the traced submission's details and the binding tables of `Execute`.
pub(crate) enum Payload {
    /// Nothing but the ordering: a barrier, a signal-only submission, a host call's slot.
    Nop,
    /// Command buffers, issued in order (`cuGraphLaunch`, or a deferred replay), inside a
    /// submission zone when the queue traces.
    Execute {
        /// The command buffers (inline up to four, the most `Queue::execute` promises to
        /// submit without allocating).
        command_buffers: SmallVec<[Arc<dyn CommandBuffer>; 4]>,
        /// One binding table per command buffer (checked at submission), holding the bound
        /// buffers until the action completes; empty when no command buffer has slots.
        bindings: BindingTables,
        /// What the tracer shows of the submission (COARSE and FINE tracing only).
        trace: Option<Box<SubmissionInfo>>,
        /// The completion event and the tracer's ticket for the submission, when traced: the
        /// ticket tells the tracer the submission completed once the completion side saw it
        /// ([`Backend::completed`]), and the event is kept until the action is released, for
        /// the tracer reads its time in the action's cleanup, which runs after the scheduler
        /// let go of it.
        completion: Option<Traced>,
    },
    /// `cuMemsetD{8,16,32}Async` over a range.
    Fill {
        /// The range to fill.
        target: BufferRange,
        /// The pattern.
        pattern: FillPattern,
    },
    /// `cuMemcpyDtoDAsync` between ranges of equal length.
    Copy {
        /// Read from here.
        source: BufferRange,
        /// Write here.
        target: BufferRange,
        /// The context of the end that lives on another device (a peer copy), if one does.
        peer: Option<Arc<PrimaryContext>>,
    },
    /// `cuMemcpyHtoDAsync` from pinned staging memory.
    Write {
        /// Write here.
        target: BufferRange,
        /// The bytes, copied at submission into pinned memory.
        staging: HostBuffer,
    },
    /// `cuMemcpyDtoHAsync` into pinned host memory.
    Read {
        /// Read from here.
        source: BufferRange,
        /// The destination, kept alive and marked in device use (host reads of it are refused)
        /// until the read completed or failed.
        target: HostBufferUse,
        /// Byte offset in `target`.
        offset: usize,
    },
    /// `cuMemFreeAsync` of a stream-ordered allocation.
    Dealloca(Arc<Allocation>),
    /// `cuStreamWaitEvent` on an event another runtime recorded (kept until completion).
    WaitEvent(Arc<ForeignEvent>),
}

/// A traced submission's completion event and the tracer's ticket for it.
pub(crate) struct Traced {
    /// Held, not read: keeps the event out of its pool until the action is released.
    _event: CudaEvent,
    ticket: SubmissionTicket,
}

/// One queue's stream and its own event pool (crate-private, like [`Payload`]).
pub(crate) struct CudaBackend {
    context: Arc<PrimaryContext>,
    stream: Stream,
    events: TimepointEventPool,
    lost: Arc<Lost>,
    /// Where the completion thread goes to sleep: a private stream that waits for a completion
    /// event on the device, then records `sleep_event`, a blocking-sync event.
    sleep_stream: Stream,
    sleep_event: Event,
    /// Serializes sleepers: the scheduler has one (the completion thread), but `block_on_event`
    /// is public and the sleep event must not be recorded by one thread while another waits on
    /// it.
    sleep_lock: std::sync::Mutex<()>,
    /// This queue's count of issues, which host waits and completion threads watch.
    issues: IssueCount,
    /// The queue's tracing context, if it traces.
    trace: Option<Arc<TraceContext>>,
    /// Work the tracer did not see went onto the stream since its last traced submission: the
    /// next traced submission's start must be timed by an event.
    untraced: std::sync::atomic::AtomicBool,
    /// Boxes for traced submissions' details (`Payload::Execute::trace`), given back when their
    /// actions are released: traced submissions allocate nothing once warm. (Boxes, not
    /// values: a payload holds the box, so the recycled allocation is the box itself.)
    infos: std::sync::Mutex<InfoBoxes>,
    /// Where a stamped command buffer's table is put together at issue (the user's slots, then
    /// its stamp region), emptied after each issue and its room kept: however many slots a
    /// command buffer names, a stamped issue allocates nothing once warm.
    stamped_table: std::sync::Mutex<Vec<BufferRange>>,
}

/// The fewest info boxes a queue's list of spare ones makes room for: it doubles from there.
const MIN_INFO_BOXES: usize = 16;

/// Spare boxes for traced submissions' details.
#[allow(clippy::vec_box)]
type InfoBoxes = Recycled<Vec<Box<SubmissionInfo>>, MIN_INFO_BOXES>;

impl CudaBackend {
    /// The queue's own event pool, which [`Queue::wait_stream`](crate::Queue::wait_stream) also
    /// records on other runtimes' streams (see there why that is sound).
    pub(crate) fn events(&self) -> &TimepointEventPool {
        &self.events
    }

    /// Creates the queue's `CU_STREAM_NON_BLOCKING` stream (with `priority`, lower is higher).
    pub(crate) fn new(
        context: Arc<PrimaryContext>,
        events: TimepointEventPool,
        lost: Arc<Lost>,
        issues: IssueCount,
        priority: i32,
        trace: Option<Arc<TraceContext>>,
    ) -> Result<Self, Error> {
        let stream = Stream::with_priority(&context, CU_STREAM_NON_BLOCKING, priority)?;
        let sleep_stream = Stream::new(&context, CU_STREAM_NON_BLOCKING)?;
        let sleep_event = Event::new(&context, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC)?;
        Ok(Self {
            context,
            stream,
            events,
            lost,
            sleep_stream,
            sleep_event,
            sleep_lock: std::sync::Mutex::new(()),
            issues,
            trace,
            untraced: std::sync::atomic::AtomicBool::new(false),
            infos: std::sync::Mutex::new(InfoBoxes::new()),
            stamped_table: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// `info` in a box for a payload: a recycled one if a released action gave one back.
    pub(crate) fn boxed_info(&self, info: SubmissionInfo) -> Box<SubmissionInfo> {
        let recycled = self
            .infos
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        match recycled {
            Some(mut boxed) => {
                *boxed = info;
                boxed
            }
            None => Box::new(info),
        }
    }

    /// Sleeps until `event` completes, woken by the GPU's interrupt: the sleep stream waits for
    /// `event` on the device and then records the blocking-sync sleep event, on which this
    /// thread blocks.
    ///
    /// Completion events themselves are not blocking-sync: on the H200 such events made every
    /// device-side wait on them 1.3 us slower and every submission slower, while this costs two
    /// driver calls only when a wait outlasts its spin.
    fn sleep_until(&self, event: &CudaEvent) -> Result<bool, cuhal_sys::Error> {
        let _sleeping = self
            .sleep_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // The sleep lock keeps the record and the wait of one sleeper together.
        // SAFETY: the completion event is live while `event` is held.
        unsafe { self.sleep_stream.wait_raw_event(event.raw()) }?;
        self.sleep_event.record(&self.sleep_stream)?;
        self.sleep_event.synchronize()?;
        event.query_raw()
    }

    /// The queue's stream.
    pub(crate) fn stream(&self) -> CUstream {
        self.stream.raw()
    }

    /// Enqueues the device waits, the payload, and the completion event; the tracer's ticket
    /// when the submission is traced.
    fn enqueue_work(
        &self,
        device_waits: &[CudaEvent],
        payload: &mut Payload,
        completion: &CudaEvent,
    ) -> Result<Option<SubmissionTicket>, Error> {
        let api = self.context.api();
        let mut waited = false;
        // Events recorded on this queue's own stream are not here: the scheduler answers such
        // waits as reached (`orders`).
        for event in device_waits {
            // SAFETY: the stream and the event are live; cuStreamWaitEvent captures the event's
            // current record, so the event may be re-recorded once this returns.
            unsafe { self.stream.wait_raw_event(event.raw()) }?;
            waited = true;
        }
        let record_completion = || {
            // SAFETY: the completion event is live while `completion` is held.
            unsafe { self.stream.record_raw_event(completion.raw()) }.map_err(Error::from)
        };
        if let (
            Payload::Execute {
                command_buffers,
                bindings,
                trace: Some(info),
                ..
            },
            Some(trace),
        ) = (&*payload, &self.trace)
        {
            use std::sync::atomic::Ordering::Relaxed;
            let untraced = self.untraced.swap(false, Relaxed);
            let issue = |step: IssueStep| match step {
                IssueStep::CommandBuffer(index) => {
                    // SAFETY: as in the untraced issue below.
                    unsafe {
                        command_buffers[index]
                            .issue_with_bindings(self.stream.raw(), bindings.table(index))
                    }
                    .map_err(Error::from)
                }
                IssueStep::StampedCommandBuffer {
                    index,
                    address,
                    bytes,
                } => {
                    let command_buffer = &command_buffers[index];
                    // SAFETY: the trace context allocated the region in this queue's context,
                    // `bytes` long and zeroed; it keeps it until this submission is collected
                    // (after it completed) and never hands it out again if the submission fails.
                    let region = unsafe { cuhal_command::BufferRange::from_raw(address, bytes) };
                    // The user's table (checked by `Queue::execute`) cut to its slots, then the
                    // region at the hidden stamp slot.
                    let mut table = self
                        .stamped_table
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    command_buffer.bindings().stamped_table_into(
                        bindings.table(index),
                        region,
                        &mut table,
                    );
                    // SAFETY: as in the untraced issue below; the region lives as said above.
                    let issued =
                        unsafe { command_buffer.issue_with_bindings(self.stream.raw(), &table) };
                    // The payload holds the buffers until completion; the scratch keeps none.
                    table.clear();
                    issued.map_err(Error::from)
                }
                IssueStep::Completion => record_completion(),
            };
            // SAFETY: the stream is live and of the trace context's context; the completion
            // event is a timing event (the pool of a traced queue makes those), recorded by
            // `issue`, and kept by the payload until the action is released, after its cleanup
            // (the collection) ran.
            let issued = unsafe {
                trace.submit(
                    self.stream.raw(),
                    info,
                    command_buffers,
                    if waited {
                        StreamBefore::DeviceWait
                    } else if untraced {
                        StreamBefore::Untraced
                    } else {
                        StreamBefore::Traced
                    },
                    completion.raw(),
                    issue,
                )
            };
            if issued.is_err() {
                self.untraced.store(true, Relaxed);
            }
            return issued;
        }
        if self.trace.is_some() && !matches!(payload, Payload::Nop) {
            // Stream work the tracer does not see (a barrier's empty payload aside). Only a
            // traced queue reads the flag, so an untraced one does not write its line on
            // every submission.
            self.untraced
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        match payload {
            Payload::Nop => {}
            Payload::Execute {
                command_buffers,
                bindings,
                ..
            } => {
                for (index, command_buffer) in command_buffers.iter().enumerate() {
                    // SAFETY: the queue's stream is live (destroyed only when the backend
                    // drops, after the scheduler's threads are joined) and belongs to the
                    // device's context, which `Queue::execute` checked is the command buffer's;
                    // it also checked the table, whose buffers the payload holds until the
                    // action completes.
                    unsafe {
                        command_buffer.issue_with_bindings(self.stream.raw(), bindings.table(index))
                    }?;
                }
            }
            Payload::Fill { target, pattern } => {
                let ptr = target.device_ptr();
                let len = target.len();
                // SAFETY: the range was checked against its live buffer (kept alive by the
                // payload until completion) and its offset and length are multiples of the
                // pattern size (checked at submission).
                unsafe { cuhal_command::enqueue_fill(api, self.stream.raw(), ptr, len, *pattern) }?;
            }
            Payload::Copy {
                source,
                target,
                peer: None,
            } => {
                // SAFETY: both ranges are checked, of equal length, and kept alive by the payload.
                unsafe {
                    cu!(
                        api,
                        cuMemcpyDtoDAsync(
                            target.device_ptr(),
                            source.device_ptr(),
                            source.len(),
                            self.stream.raw()
                        )
                    )
                }?;
            }
            Payload::Copy {
                source,
                target,
                peer: Some(peer),
            } => {
                let context_of = |range: &BufferRange| {
                    range
                        .buffer()
                        .map_or(self.context.raw(), |b| b.context().raw())
                };
                // SAFETY: both ranges are checked, of equal length, and kept alive by the payload
                // (the peer's buffer keeps its context alive, and `peer` does too).
                unsafe {
                    cu!(
                        api,
                        cuMemcpyPeerAsync(
                            target.device_ptr(),
                            context_of(target),
                            source.device_ptr(),
                            context_of(source),
                            source.len(),
                            self.stream.raw()
                        )
                    )
                }?;
                // Held only to keep the peer's context alive until the copy completed.
                let _ = peer;
            }
            Payload::Write { target, staging } => {
                // SAFETY: the staging memory is pinned, holds target.len() bytes and lives in
                // the payload until the copy completed.
                unsafe {
                    cu!(
                        api,
                        cuMemcpyHtoDAsync(
                            target.device_ptr(),
                            staging.as_ptr().cast(),
                            target.len(),
                            self.stream.raw()
                        )
                    )
                }?;
            }
            Payload::Read {
                source,
                target,
                offset,
            } => {
                // SAFETY: `offset + source.len()` was checked against the pinned target, which
                // the payload keeps alive until the copy completed.
                unsafe {
                    cu!(
                        api,
                        cuMemcpyDtoHAsync(
                            target.buffer().as_ptr().add(*offset).cast(),
                            source.device_ptr(),
                            source.len(),
                            self.stream.raw()
                        )
                    )
                }?;
            }
            Payload::Dealloca(allocation) => allocation.free_after_uses(self.stream.raw())?,
            Payload::WaitEvent(event) => {
                // SAFETY: the event is live while the payload holds it (ForeignEvent's
                // contract); CUDA takes events of any context here.
                unsafe { self.stream.wait_raw_event(event.raw()) }?;
            }
        }
        record_completion().map(|()| None)
    }
}

impl Backend for CudaBackend {
    type Event = CudaEvent;
    type Payload = Payload;
    type IssueLocal = EventStash;
    /// A stream runs in order, and a device fault is sticky (it poisons the context, so every
    /// later event reports it): the newest completion event of a batch answers for all of it.
    const STICKY_ERRORS: bool = true;

    fn bind_thread(&self, _role: ThreadRole) -> Result<(), Failure> {
        self.context
            .bind()
            .map_err(|e| self.lost.note(Error::from(e)))
    }

    /// Issues one action. The completion event is taken first, so running out of events enqueues
    /// nothing. If a later step fails after something was enqueued, the stream is drained before
    /// the error is returned: the scheduler then releases the action's resources at once, and
    /// work already on the stream may still be using them.
    fn issue(
        &self,
        stash: &mut EventStash,
        device_waits: &[CudaEvent],
        payload: &mut Payload,
    ) -> Result<CudaEvent, Failure> {
        self.issues.count();
        let _bound = self
            .context
            .enter()
            .map_err(|e| self.lost.note(Error::from(e)))?;
        let completion = self
            .events
            .acquire_via(stash)
            .map_err(|e| self.lost.note(e))?;
        match self.enqueue_work(device_waits, payload, &completion) {
            Ok(ticket) => {
                match payload {
                    Payload::Read { target, .. } => {
                        // Host reads of the target succeed once this event completes, even
                        // before the action retires and drops its use.
                        target.complete_when(Box::new(completion.clone()));
                    }
                    Payload::Execute {
                        completion: kept, ..
                    } => {
                        *kept = ticket.map(|ticket| Traced {
                            _event: completion.clone(),
                            ticket,
                        });
                    }
                    _ => {}
                }
                Ok(completion)
            }
            Err(error) => {
                // The result is irrelevant: on a lost context it fails at once, which is also
                // when nothing on the stream runs any more.
                let _ = self.stream.synchronize();
                Err(self.lost.note(error))
            }
        }
    }

    /// Marks the action's uses of stream-ordered allocations issued on this queue's stream: a
    /// dealloca issued on it later is ordered after them (see `memory.rs`).
    fn issued(&self, resources: &[cuhal_scheduler::Resource]) {
        for resource in resources {
            if let Some(used) = resource.downcast_ref::<AllocationUse>() {
                used.issued(self.stream.raw());
            }
        }
    }

    fn issue_local(&self) -> EventStash {
        EventStash::with_capacity(self.events.created())
    }

    fn check_completed(&self, payload: &Payload) -> Result<(), Failure> {
        if let Payload::Execute {
            command_buffers, ..
        } = payload
        {
            for command_buffer in command_buffers.iter() {
                command_buffer
                    .check_completed()
                    .map_err(|e| Failure::new(Error::from(e)))?;
            }
        }
        Ok(())
    }

    /// A traced submission the completion side saw complete: the tracer is told, so the
    /// collection in its cleanup reads its times without querying its completion event again.
    fn completed(&self, payload: &Payload) {
        if let (
            Payload::Execute {
                completion: Some(traced),
                ..
            },
            Some(trace),
        ) = (payload, &self.trace)
        {
            trace.completed(traced.ticket);
        }
    }

    /// An event of the queue's own pool was recorded on the queue's own stream: stream order
    /// already puts later work after it.
    fn orders(&self, event: &CudaEvent) -> bool {
        self.events.owns(event)
    }

    fn checks_completion(&self, payload: &Payload) -> bool {
        matches!(payload, Payload::Execute { command_buffers, .. }
            if command_buffers.iter().any(|cb| cb.checks_completion()))
    }

    fn release(&self, mut payload: Payload) {
        let info = match &mut payload {
            Payload::Execute { trace, .. } => trace.take(),
            _ => None,
        };
        // The rest (command buffers, tables, buffers) goes first: their drops may take time,
        // and the box list's lock is taken by submitters.
        drop(payload);
        if let Some(info) = info {
            self.infos
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(info);
        }
    }

    fn query_event(&self, event: &CudaEvent) -> Result<bool, Failure> {
        event
            .query_raw()
            .map_err(|e| self.lost.note(Error::from(e)))
    }

    fn block_on_event(&self, event: &CudaEvent) -> Result<(), Failure> {
        match self.sleep_until(event) {
            Ok(true) => Ok(()),
            Ok(false) => Err(Failure::new(Error::EventNotComplete {
                after: cuhal_sys::cu_name!(cuEventSynchronize),
            })),
            Err(e) => Err(self.lost.note(Error::from(e))),
        }
    }

    /// Every queue's issues on this device: queries take the driver's lock those issues need.
    fn traffic(&self) -> u64 {
        self.issues.submissions.total()
    }
}

#[cfg(test)]
mod tests {
    use super::Payload;

    /// A payload is moved from `Queue::execute` into its slot through a few calls; x86-64 moves
    /// up to 128 bytes with inline stores and calls `memcpy` past that, on every submission.
    #[test]
    fn a_payload_moves_without_a_memcpy_call() {
        let size = std::mem::size_of::<Payload>();
        assert!(size <= 128, "Payload is {size} bytes");
    }
}
