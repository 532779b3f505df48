//! [`Queue`]: every operation of a device queue, ordered only by semaphores.
//!
//! Each operation becomes one scheduler action on the queue's stream (see `backend.rs` for what
//! issuing does). The action retains what it touches (command buffers, buffers, staging memory)
//! until it completes or fails, so callers may drop their handles at once.

use std::sync::Arc;

use cuhal_command::{
    Buffer, BufferRange, CommandBuffer, CommandEncoder, DeferredCommandBuffer, FillPattern,
    GraphCommandBuffer, HostBuffer, PatchMethod,
};
use cuhal_scheduler::{
    Cleanup, Cleanups, Outcome, QueueOptions, QueueStats, Resources, SlotCleanups, SlotResources,
};
use cuhal_semaphore::Failure;
use cuhal_sys::{CUstream, PrimaryContext};
use cuhal_trace::{SubmissionInfo, TraceContext, Verbosity};
use smallvec::SmallVec;

use crate::Semaphore;
use crate::backend::{CudaBackend, Payload};
use crate::bindings::{BindingTables, TablePool};
use crate::device::DeviceShared;
use crate::error::{Error, Result};
use crate::event_pool::TimepointEventPool;
use crate::lost::Lost;
use crate::memory::{HostCopies, MemoryPool, allocation_of, use_allocation};
use crate::submissions::IssueCount;

/// How a queue's command buffers are built.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum CommandBufferMode {
    /// A CUDA graph, instantiated once at `end()` and launched on every submission.
    #[default]
    Graph,
    /// Recorded into an arena and replayed onto the stream on every submission.
    Deferred,
}

/// A `(semaphore, value)` list as queue operations take it.
pub type SemaphoreValues<'a> = [(&'a Semaphore, u64)];

/// A command buffer and the binding table for its slots (one range per slot), as
/// [`Queue::execute_with_bindings`] takes them.
pub type BoundCommandBuffer<'a> = (&'a Arc<dyn CommandBuffer>, &'a [BufferRange]);

/// A cleanup callback shared by every submission of a queue.
type SharedCleanup = Arc<dyn Fn(Outcome<'_>) + Send + Sync>;

/// One queue's own settings, beside what it shares with its device ([`DeviceShared`]).
pub(crate) struct QueueSetup {
    /// The scheduler's options (label, completion options, in-flight limit, capacity).
    pub(crate) options: QueueOptions,
    /// The queue's own completion and timepoint events.
    pub(crate) events: TimepointEventPool,
    /// The queue's count among its device's issues.
    pub(crate) issues: IssueCount,
    /// The stream's priority (lower runs first).
    pub(crate) priority: i32,
    /// How command buffers are built.
    pub(crate) mode: CommandBufferMode,
    /// How graph command buffers with slots are patched.
    pub(crate) patch_method: PatchMethod,
    /// The queue's tracing context, if it traces.
    pub(crate) trace: Option<TraceContext>,
}

/// One queue of a device: a stream, its worker and completion threads, and optional tracing.
pub struct Queue {
    inner: cuhal_scheduler::Queue<CudaBackend>,
    context: Arc<PrimaryContext>,
    lost: Arc<Lost>,
    memory: Arc<MemoryPool>,
    mode: CommandBufferMode,
    patch_method: PatchMethod,
    trace: Option<Arc<TraceContext>>,
    /// Collects the trace context's completed zones; one shared cleanup for every traced
    /// submission.
    collect: Option<SharedCleanup>,
    /// Storage for the binding tables of submissions in flight.
    tables: Arc<TablePool>,
}

impl Queue {
    /// Starts a queue of the device whose shared state is `device`.
    pub(crate) fn new(device: &DeviceShared, setup: QueueSetup) -> Result<Self> {
        let QueueSetup {
            options,
            events,
            issues,
            priority,
            mode,
            patch_method,
            trace,
        } = setup;
        let context = device.context.clone();
        let lost = device.lost.clone();
        let memory = device.memory.clone();
        let trace = trace
            .filter(|t| t.verbosity() != Verbosity::Off)
            .map(Arc::new);
        let pool = events.clone();
        let backend = CudaBackend::new(
            context.clone(),
            events,
            lost.clone(),
            issues,
            priority,
            trace.clone(),
        )
        .map_err(|e| lost.filter(e))?;
        let inner = cuhal_scheduler::Queue::new(backend, options)?;
        pool.set_nudge(inner.completion_nudge());
        let trigger = inner.loss_trigger();
        lost.add_queue(Box::new(move |failure| trigger.trigger(failure)));
        // A submission that completed was just reported complete to the tracer (the backend's
        // `completed`), so its collection queries nothing; one that failed is looked at the
        // long way (its events may never complete).
        let collect = trace.clone().map(|trace| {
            Arc::new(move |outcome: Outcome<'_>| {
                match outcome {
                    Ok(()) => trace.collect_completed(),
                    Err(_) => trace.collect(),
                };
            }) as SharedCleanup
        });
        Ok(Self {
            inner,
            context,
            lost,
            memory,
            mode,
            patch_method,
            trace,
            collect,
            tables: Arc::default(),
        })
    }

    /// The queue's device's primary context (its raw handle tells whether another runtime's
    /// stream or memory belongs to the same context).
    pub fn context(&self) -> &Arc<PrimaryContext> {
        &self.context
    }

    /// The queue's label.
    pub fn label(&self) -> &str {
        self.inner.label()
    }

    /// The queue's stream (for interoperation; cuhal issues on it from its own threads).
    pub fn stream(&self) -> CUstream {
        self.inner.backend().stream()
    }

    /// The queue's counters.
    pub fn stats(&self) -> QueueStats {
        self.inner.stats()
    }

    /// The queue's tracing context, when tracing is on.
    pub fn trace(&self) -> Option<&TraceContext> {
        self.trace.as_deref()
    }

    /// The failure that lost the queue or its device, if either is lost.
    pub fn lost(&self) -> Option<Failure> {
        self.lost.get().cloned().or_else(|| self.inner.lost())
    }

    fn check_alive(&self) -> Result<()> {
        self.lost.check()
    }

    /// Fails when the queue's device is lost.
    pub(crate) fn check_usable(&self) -> Result<()> {
        self.check_alive()
    }

    /// Checks that `range` may be used by new work of this queue: its buffer belongs to the
    /// queue's device and, if `Queue::alloca` made it, `Queue::dealloca` has not released it (a
    /// use of it is then added to `resources`, which keeps its memory until the work is done).
    /// Raw ranges (`BufferRange::from_raw`) are the caller's contract.
    fn check_range(
        &self,
        range: &BufferRange,
        what: &'static str,
        resources: &mut Resources,
    ) -> Result<()> {
        // Only a command buffer with binding slots can record a slot range.
        range.check_not_slot(what)?;
        match range.buffer() {
            Some(buffer) => self.check_buffer(buffer, what, resources),
            None => Ok(()),
        }
    }

    /// [`Queue::check_range`] for a whole buffer.
    fn check_buffer(
        &self,
        buffer: &Arc<Buffer>,
        what: &'static str,
        resources: &mut Resources,
    ) -> Result<()> {
        if buffer.context().raw() != self.context.raw() {
            return Err(Error::WrongDevice { what });
        }
        use_allocation(buffer, what, resources)
    }

    /// A new command buffer of the queue's mode, traced at the queue's verbosity. Record into it;
    /// its `end()` returns the `Arc<dyn CommandBuffer>` to submit with [`Queue::execute`], any
    /// number of times.
    pub fn create_command_buffer(&self) -> Result<Box<dyn CommandEncoder>> {
        self.create_command_buffer_with_bindings(0)
    }

    /// A new command buffer of the queue's mode whose commands may name binding slots below
    /// `capacity` instead of buffers ([`BufferRange::slot`], [`KernelArgs::push_binding`]).
    /// Submit it with [`Queue::execute_with_bindings`], giving memory to its slots each time.
    ///
    /// [`KernelArgs::push_binding`]: cuhal_command::KernelArgs::push_binding
    pub fn create_command_buffer_with_bindings(
        &self,
        capacity: u32,
    ) -> Result<Box<dyn CommandEncoder>> {
        self.create_command_buffer_as(self.mode, capacity)
    }

    /// A new command buffer of the kind `mode` chooses, whatever the queue's default
    /// ([`DeviceOptions`](crate::DeviceOptions)'s mode): a graph replays with one launch, a
    /// deferred buffer replays its commands onto the stream (for work a graph cannot hold, or
    /// that changes shape between submissions). Commands may name binding slots below
    /// `capacity` (0 for none), as with [`Queue::create_command_buffer_with_bindings`].
    pub fn create_command_buffer_as(
        &self,
        mode: CommandBufferMode,
        capacity: u32,
    ) -> Result<Box<dyn CommandEncoder>> {
        self.check_alive()?;
        let zones = self.trace.as_deref().and_then(TraceContext::recorder);
        let created: Result<Box<dyn CommandEncoder>, cuhal_command::Error> = match mode {
            CommandBufferMode::Graph => {
                GraphCommandBuffer::with_bindings(&self.context, zones, capacity).and_then(
                    |mut cb| {
                        cb.set_patch_method(self.patch_method)?;
                        Ok(Box::new(cb) as Box<dyn CommandEncoder>)
                    },
                )
            }
            CommandBufferMode::Deferred => {
                DeferredCommandBuffer::with_bindings(&self.context, zones, capacity)
                    .map(|cb| Box::new(cb) as Box<dyn CommandEncoder>)
            }
        };
        created.map_err(|e| self.lost.filter(e.into()))
    }

    #[inline]
    fn submit(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        payload: Payload,
        resources: Resources,
        cleanups: Cleanups,
    ) -> Result<()> {
        self.check_alive()?;
        self.inner
            .submit(waits, signals, payload, resources, cleanups)
            .map_err(|e| self.queue_error(e))
    }

    /// A scheduler error as this queue reports it: the loss's own failure once it is lost.
    fn queue_error(&self, error: cuhal_scheduler::Error) -> Error {
        match self.lost.get() {
            Some(failure) => Error::Lost(failure.clone()),
            None => Error::Queue(error),
        }
    }

    /// Executes `command_buffers` in order once every wait is reached, then signals.
    ///
    /// Only ended graph and deferred command buffers are [`CommandBuffer`]s, so a recording that
    /// has not ended, or a stream command buffer, cannot be passed here at all. A command buffer
    /// recorded for another device is [`Error::WrongDevice`].
    ///
    /// With tracing off, and at most four command buffers, waits and signals, this allocates
    /// nothing once the queue is warm. Command buffers that recorded binding slots go through
    /// [`Queue::execute_with_bindings`].
    pub fn execute(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        command_buffers: &[&Arc<dyn CommandBuffer>],
    ) -> Result<()> {
        self.execute_tables(waits, signals, command_buffers.len(), |i| {
            (command_buffers[i], &[][..])
        })
    }

    /// Executes command buffers in order, each with a binding table that gives memory to its
    /// slots, once every wait is reached, then signals. A command buffer without slots takes
    /// an empty table.
    ///
    /// Every table is checked here, before anything is queued: long enough for the slots
    /// used and no longer than the binding capacity, every entry memory of this device (not a
    /// slot range), at least as long as the largest extent recorded for its slot, aligned for
    /// the slot's fills, and no copy overlapping itself; none given to a command buffer with
    /// slots, or one given to a command buffer without, is an error too. Each is an
    /// [`Error::Command`] with a [`cuhal_command::BindingError`], and the queue stays usable.
    /// The submission holds the tables' buffers until it completes, so callers may drop theirs.
    ///
    /// Graph command buffers patch only the nodes whose slots are bound to other addresses than
    /// at the last launch of the executable used; the same command buffer may run on several
    /// queues at once with different tables (each queue's stream gets its own executable).
    /// With tracing off, at most four command buffers, waits and signals, this allocates
    /// nothing once the queue is warm, whatever the tables' sizes.
    pub fn execute_with_bindings(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        command_buffers: &[BoundCommandBuffer<'_>],
    ) -> Result<()> {
        self.execute_tables(waits, signals, command_buffers.len(), |i| {
            command_buffers[i]
        })
    }

    /// [`execute`](Self::execute) and [`execute_with_bindings`](Self::execute_with_bindings):
    /// checks every command buffer and table, then submits with the parts written straight into
    /// the scheduler's slot ([`cuhal_scheduler::Queue::submit_with`]).
    fn execute_tables<'a>(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        count: usize,
        nth: impl Fn(usize) -> BoundCommandBuffer<'a>,
    ) -> Result<()> {
        let mut command_buffers = SmallVec::<[Arc<dyn CommandBuffer>; 4]>::new();
        let mut resources = Resources::new();
        let mut any_table = false;
        // One pass: everything `issue` could reject is rejected here (an issue error loses the
        // queue); a use of a stream-ordered allocation tracked before a later check fails ends
        // when `resources` drops.
        for (command_buffer, table) in (0..count).map(&nth) {
            // Its type already guarantees an ended graph or deferred command buffer; its device
            // is known only now.
            match command_buffer.context() {
                Some(context) if context.raw() == self.context.raw() => {}
                Some(_) => {
                    return Err(Error::WrongDevice {
                        what: "command buffer",
                    });
                }
                None => return Err(Error::Command(cuhal_command::Error::NoContext)),
            }
            command_buffer
                .bindings()
                .check(table, self.context.raw())
                .map_err(Error::Command)?;
            if command_buffer.bindings().stamp_count() > 0 && self.trace.is_none() {
                // Its stamp slot is bound only from a tracer's ring: issued with the user's
                // table alone it would be missing, or be a user's buffer.
                return Err(Error::InvalidArgument(
                    "a command buffer with zone stamps (recorded for a queue that traces at \
                     FINE) runs only on a traced queue"
                        .to_owned(),
                ));
            }
            // The recorder checked every buffer's device (another device's only gets in through
            // a peer copy, `copy_peer`). What can change since is whether the memory is still
            // there, and only memory with a keeper can go while the buffer lives: a
            // stream-ordered allocation that `Queue::dealloca` released. (`use_allocation`
            // looks for the keeper too; this look is the fast path past every other buffer.)
            for buffer in command_buffer.buffers() {
                if buffer.keeper().is_some() {
                    let what = if buffer.context().raw() == self.context.raw() {
                        "command buffer's buffer"
                    } else {
                        "command buffer's peer buffer"
                    };
                    use_allocation(buffer, what, &mut resources)?;
                }
            }
            for entry in table {
                self.check_range(entry, "binding table entry", &mut resources)?;
            }
            any_table |= !table.is_empty();
            command_buffers.push(Arc::clone(command_buffer));
        }
        let bindings = if any_table {
            BindingTables::copy(&self.tables, (0..count).map(|i| nth(i).1))
        } else {
            BindingTables::none()
        };
        // What the tracer shows of the submission; its zones are collected on the completion
        // side, by the queue's one cleanup.
        let trace = self.trace.as_ref().map(|_| {
            self.inner.backend().boxed_info(SubmissionInfo::new(
                waits.iter().map(|(s, v)| (s.id().get(), *v)),
                signals.iter().map(|(s, v)| (s.id().get(), *v)),
            ))
        });
        self.lost.check()?;
        let fill = |slot_resources: &mut SlotResources, slot_cleanups: &mut SlotCleanups| {
            if !resources.is_empty() {
                // The whole list, with its heap if it spilled, rather than its entries one by
                // one; the slot's emptied list (and any heap it kept) comes back in its place and
                // drops with it, after the lock is let go.
                slot_resources.swap_storage(&mut resources);
            }
            if let Some(collect) = &self.collect {
                slot_cleanups.push(Cleanup::shared(collect));
            }
            Payload::Execute {
                command_buffers: std::mem::take(&mut command_buffers),
                bindings,
                trace,
                completion: None,
            }
        };
        self.inner
            .submit_with(waits, signals, fill)
            .map_err(|e| self.queue_error(e))
    }

    /// Signals once every wait is reached: orders nothing else.
    pub fn barrier(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
    ) -> Result<()> {
        self.submit(
            waits,
            signals,
            Payload::Nop,
            Resources::new(),
            Cleanups::new(),
        )
    }

    /// Fills `target` with `pattern` (offset and length multiples of the pattern's size).
    pub fn fill(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        target: &BufferRange,
        pattern: FillPattern,
    ) -> Result<()> {
        target.check_fill(pattern)?;
        let mut resources = Resources::new();
        self.check_range(target, "fill target", &mut resources)?;
        let payload = Payload::Fill {
            target: target.clone(),
            pattern,
        };
        self.submit(waits, signals, payload, resources, Cleanups::new())
    }

    /// Copies `source` to `target` (equal lengths; may be on different buffers or disjoint parts
    /// of one). Both must be this queue's device's buffers; see [`Queue::copy_peer`] for copies
    /// between devices.
    pub fn copy(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        source: &BufferRange,
        target: &BufferRange,
    ) -> Result<()> {
        source.check_copy_to(target)?;
        let mut resources = Resources::new();
        self.check_range(source, "copy source", &mut resources)?;
        self.check_range(target, "copy target", &mut resources)?;
        let payload = Payload::Copy {
            source: source.clone(),
            target: target.clone(),
            peer: None,
        };
        self.submit(waits, signals, payload, resources, Cleanups::new())
    }

    /// A peer copy: as [`Queue::copy`], but one of `source` and `target` may be a buffer of
    /// another device. It runs on this queue, ordered by semaphores like any other operation
    /// (`cuMemcpyPeerAsync`), directly over the link when peer access is enabled
    /// ([`crate::Driver::open_many`] enables it), else staged through host memory by the driver.
    /// The other end must be this queue's device's, so the copy belongs to one of the two.
    pub fn copy_peer(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        source: &BufferRange,
        target: &BufferRange,
    ) -> Result<()> {
        source.check_copy_to(target)?;
        let foreign = |range: &BufferRange| {
            range
                .buffer()
                .is_some_and(|b| b.context().raw() != self.context.raw())
        };
        let peer = match (foreign(source), foreign(target)) {
            (false, false) => None,
            (true, false) => Some(source),
            (false, true) => Some(target),
            (true, true) => {
                return Err(Error::WrongDevice {
                    what: "peer copy's source and target (one must be the queue's device's)",
                });
            }
        };
        let mut resources = Resources::new();
        for (range, what) in [(source, "peer copy source"), (target, "peer copy target")] {
            match range.buffer() {
                Some(buffer) if foreign(range) => use_allocation(buffer, what, &mut resources)?,
                _ => self.check_range(range, what, &mut resources)?,
            }
        }
        let peer = peer
            .and_then(BufferRange::buffer)
            .map(|b| Arc::clone(b.context()));
        let payload = Payload::Copy {
            source: source.clone(),
            target: target.clone(),
            peer,
        };
        self.submit(waits, signals, payload, resources, Cleanups::new())
    }

    /// Writes `data` (copied now, into pinned staging memory) to `target`.
    pub fn write(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        target: &BufferRange,
        data: &[u8],
    ) -> Result<()> {
        if data.len() != target.len() {
            return Err(Error::Command(cuhal_command::Error::LengthMismatch {
                what: "write",
                target: target.len(),
                source: data.len(),
            }));
        }
        if data.is_empty() {
            return Err(Error::Command(cuhal_command::Error::ZeroSize {
                what: "write",
            }));
        }
        let mut resources = Resources::new();
        self.check_range(target, "write target", &mut resources)?;
        self.check_alive()?;
        let mut staging =
            HostBuffer::new(&self.context, data.len()).map_err(|e| self.lost.filter(e.into()))?;
        staging.write(0, data)?;
        let payload = Payload::Write {
            target: target.clone(),
            staging,
        };
        self.submit(waits, signals, payload, resources, Cleanups::new())
    }

    /// Reads `source` into `target[offset..offset + source.len()]` (pinned host memory, kept
    /// alive until the read completes). Wait on a signal before reading `target`: until the read
    /// completed (or failed), [`HostBuffer::read`] of `target` is refused with
    /// `HostBufferBusy`, so the host never reads bytes the device is writing.
    pub fn read(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        source: &BufferRange,
        target: &Arc<HostBuffer>,
        offset: usize,
    ) -> Result<()> {
        match offset.checked_add(source.len()) {
            Some(end) if end <= target.len() => {}
            _ => {
                return Err(Error::Command(cuhal_command::Error::OutOfBounds {
                    offset,
                    length: source.len(),
                    capacity: target.len(),
                }));
            }
        }
        if source.is_empty() {
            return Err(Error::Command(cuhal_command::Error::ZeroSize {
                what: "read",
            }));
        }
        let mut resources = Resources::new();
        self.check_range(source, "read source", &mut resources)?;
        if target.context().raw() != self.context.raw() {
            return Err(Error::WrongDevice {
                what: "read target (host buffer)",
            });
        }
        let payload = Payload::Read {
            source: source.clone(),
            target: target.device_use(),
            offset,
        };
        self.submit(waits, signals, payload, resources, Cleanups::new())
    }

    /// Allocates `len` bytes of device memory in stream order (see `memory.rs`): the buffer's
    /// address is known now and may be recorded at once; the memory may be used by work that
    /// waits on `signals` (or runs later on this queue).
    pub fn alloca(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        len: usize,
    ) -> Result<Arc<Buffer>> {
        if len == 0 {
            return Err(Error::Command(cuhal_command::Error::ZeroSize {
                what: "alloca",
            }));
        }
        self.check_alive()?;
        let allocation = self
            .memory
            .allocate(len, self.stream())
            .map_err(Error::allocating("alloca", len))
            .map_err(|e| self.lost.filter(e))?;
        let keeper: Arc<dyn std::any::Any + Send + Sync> = allocation.clone();
        let access: Arc<dyn cuhal_command::HostAccess> = Arc::new(HostCopies(allocation.clone()));
        // SAFETY: the memory is `len` bytes of this context's device memory, kept allocated by
        // `keeper` until dealloca frees it: in stream order after the work queued before it, and
        // never while a use is left, which every host copy through the buffer takes from
        // `access` (refused once the dealloca released the allocation).
        let buffer = unsafe {
            Buffer::from_raw_releasable(&self.context, allocation.device_ptr(), len, keeper, access)
        };
        let mut resources = Resources::new();
        resources.push(allocation);
        self.submit(waits, signals, Payload::Nop, resources, Cleanups::new())?;
        Ok(buffer)
    }

    /// Frees a buffer made by [`Queue::alloca`] in stream order, once every wait is reached and
    /// every use queued before this call is done: queued work never sees the memory go. New work
    /// that uses the buffer after this call is refused with `Error::Deallocated`; the handle stays
    /// valid.
    pub fn dealloca(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        buffer: &Arc<Buffer>,
    ) -> Result<()> {
        if buffer.context().raw() != self.context.raw() {
            return Err(Error::WrongDevice {
                what: "dealloca buffer",
            });
        }
        let allocation = allocation_of(buffer).ok_or_else(|| {
            Error::InvalidArgument("dealloca of a buffer that queue_alloca did not make".into())
        })?;
        self.check_alive()?;
        if !allocation.release() {
            return Err(Error::Deallocated {
                what: "dealloca buffer",
            });
        }
        self.submit(
            waits,
            signals,
            Payload::Dealloca(allocation),
            Resources::new(),
            Cleanups::new(),
        )
    }

    /// Makes the queue wait, on the device, for `event`, a `CUevent` another runtime recorded
    /// on its own stream, then signals: everything that waits on `signals` (on any queue) runs
    /// after the foreign work, with no host round trip.
    ///
    /// The wait is `cuStreamWaitEvent` on the queue's stream when the operation is issued: at
    /// this call when its waits are already reached and nothing is pending ahead of it on the
    /// queue (the usual case), else later. It covers the event's most recent record *at issue*,
    /// so the foreign side must not re-record the event until the operation is issued (it has
    /// been once any later submission to this queue was issued, or the signals are reached). An
    /// event that was never recorded waits for nothing, as CUDA defines. The queue keeps
    /// `event` until the operation completes.
    pub fn wait_event(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        event: &Arc<crate::ForeignEvent>,
    ) -> Result<()> {
        self.submit(
            waits,
            signals,
            Payload::WaitEvent(Arc::clone(event)),
            Resources::new(),
            Cleanups::new(),
        )
    }

    /// Makes the queue wait, on the device, for everything enqueued so far on `stream`, another
    /// runtime's stream of this device's context, then signals: the stream half of
    /// [`Queue::wait_event`].
    ///
    /// One driver call here, `cuEventRecord` on `stream` (now, whatever the waits) of an event
    /// of the queue's own pool; then the operation is a [`Queue::wait_event`] on that event,
    /// which goes back to the pool once the operation completes, so a warm queue creates none.
    /// The pool's events serve as the queue's completion events too: each is recorded again on
    /// the queue's stream before it stands for anything there, so a foreign record still
    /// pending (the operation failed before its wait was enqueued) is never mistaken for one.
    ///
    /// # Safety
    /// `stream` must be a live stream of this device's context (or null, the legacy default
    /// stream) for the duration of the call. A stream of another context is refused by the
    /// driver (`CUDA_ERROR_INVALID_HANDLE`); a destroyed one is undefined behaviour, as for
    /// any driver call.
    pub unsafe fn wait_stream(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        stream: CUstream,
    ) -> Result<()> {
        self.lost.check()?;
        // SAFETY: forwarded caller contract: `stream` is live and of this context.
        let event =
            unsafe { crate::interop::record_on_stream(self.inner.backend().events(), stream) }
                .map_err(|e| self.lost.filter(e))?;
        self.wait_event(waits, signals, &event)
    }

    /// Runs `call` on the host once every wait is reached and everything submitted earlier to
    /// this queue has completed, then signals (or fails the signals with the call's error).
    ///
    /// It runs on the queue's completion thread, never inside a driver callback; a long call
    /// delays the queue's later completions, as a long kernel would.
    pub fn host_call(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        call: impl FnOnce() -> std::result::Result<(), Failure> + Send + 'static,
    ) -> Result<()> {
        // The signals are the cleanup's, not the scheduler's: checked as the scheduler checks
        // its own.
        cuhal_scheduler::check_signals(self.label(), signals)?;
        let signals: SmallVec<[(Semaphore, u64); 4]> =
            signals.iter().map(|(s, v)| ((*s).clone(), *v)).collect();
        let mut cleanups = Cleanups::new();
        cleanups.push(Cleanup::once(move |outcome| {
            let result = match outcome {
                Ok(()) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(call))
                    .unwrap_or_else(|_| Err(Failure::msg("host call panicked"))),
                Err(failure) => Err(failure.clone()),
            };
            for (semaphore, value) in &signals {
                match &result {
                    Ok(()) => {
                        let _ = semaphore.advance_to(*value);
                    }
                    Err(failure) => semaphore.fail(failure.clone()),
                }
            }
        }));
        self.submit(waits, &[], Payload::Nop, Resources::new(), cleanups)
    }
}
