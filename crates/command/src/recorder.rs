//! The recording API all three command buffers share, and the front end that implements it
//! once: state machine, validation, retention of resources and tracing zones. Each kind only
//! supplies an [`Encoder`] that turns checked commands into graph nodes, stream calls or arena
//! entries.

use std::fmt;
use std::sync::Arc;

use cuhal_sys::{CUcontext, CUevent, CUgraphNode, PrimaryContext};

use crate::binding::{BindingError, BindingLayout, Operand};
use crate::executable::{validate_arguments, validate_dispatch};
use crate::indirect::{INDIRECT_COUNT_BYTES, Indirect, IndirectLaunch};
use crate::launch::{AttributePath, LaunchAttributes, check_attributes};
use crate::range::check_non_empty;
use crate::{
    Buffer, BufferRange, Error, Function, KernelArgs, StreamWorkFn, Verbosity, ZoneRecorder,
};
use smallvec::SmallVec;

/// Where a command buffer is in its life.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum CommandBufferState {
    /// Commands may be recorded (from creation until `end()`).
    Recording,
    /// `end()` succeeded: it may be issued.
    Ended,
    /// A driver call failed while recording or ending; it can be neither recorded nor issued.
    Failed,
}

impl fmt::Display for CommandBufferState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CommandBufferState::Recording => "recording",
            CommandBufferState::Ended => "ended",
            CommandBufferState::Failed => "failed",
        })
    }
}

/// A fill pattern: 1, 2 or 4 bytes, repeated over the target range.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum FillPattern {
    /// One byte.
    U8(u8),
    /// Two bytes (native byte order); offset and length must be multiples of 2.
    U16(u16),
    /// Four bytes (native byte order); offset and length must be multiples of 4.
    U32(u32),
}

impl FillPattern {
    /// A pattern from its bytes (in memory order); 1, 2 or 4 of them.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, Error> {
        match *bytes {
            [a] => Ok(FillPattern::U8(a)),
            [a, b] => Ok(FillPattern::U16(u16::from_ne_bytes([a, b]))),
            [a, b, c, d] => Ok(FillPattern::U32(u32::from_ne_bytes([a, b, c, d]))),
            _ => Err(Error::BadPattern {
                length: bytes.len(),
            }),
        }
    }

    /// The pattern's size in bytes.
    pub fn size(self) -> usize {
        match self {
            FillPattern::U8(_) => 1,
            FillPattern::U16(_) => 2,
            FillPattern::U32(_) => 4,
        }
    }

    /// The value widened to 32 bits, as memset nodes take it.
    pub fn value(self) -> u32 {
        match self {
            FillPattern::U8(v) => v.into(),
            FillPattern::U16(v) => v.into(),
            FillPattern::U32(v) => v,
        }
    }
}

/// One kernel launch: function, grid and block shape, dynamic shared memory, arguments and
/// launch attributes.
#[derive(Copy, Clone, Debug)]
pub struct Dispatch<'a> {
    /// The kernel.
    pub function: &'a Function,
    /// Grid size in blocks (x, y, z).
    pub grid: [u32; 3],
    /// Block size in threads (x, y, z).
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared_memory_bytes: u32,
    /// The kernel's arguments (copied at record time).
    pub args: &'a KernelArgs,
    /// Clusters, cooperative launch, programmatic dependency, priority (default: none).
    pub attributes: LaunchAttributes,
}

impl<'a> Dispatch<'a> {
    /// A dispatch with no dynamic shared memory.
    pub fn new(
        function: &'a Function,
        grid: [u32; 3],
        block: [u32; 3],
        args: &'a KernelArgs,
    ) -> Self {
        Self {
            function,
            grid,
            block,
            shared_memory_bytes: 0,
            args,
            attributes: LaunchAttributes::default(),
        }
    }

    /// Sets the dynamic shared memory per block. Above the function's current limit (48 KiB by
    /// default) recording raises the limit, up to the device's opt-in maximum.
    pub fn with_shared_memory(mut self, bytes: u32) -> Self {
        self.shared_memory_bytes = bytes;
        self
    }

    /// Launches in thread-block clusters of `dims` blocks (see [`LaunchAttributes::cluster`]).
    pub fn with_cluster(mut self, dims: [u32; 3]) -> Self {
        self.attributes.cluster = Some(dims);
        self
    }

    /// Launches cooperatively (see [`LaunchAttributes::cooperative`]).
    pub fn cooperative(mut self) -> Self {
        self.attributes.cooperative = true;
        self
    }

    /// Depends programmatically on the dispatch before the preceding barrier (see
    /// [`LaunchAttributes::programmatic`]).
    pub fn programmatic(mut self) -> Self {
        self.attributes.programmatic = true;
        self
    }

    /// Sets the dispatch's priority (see [`LaunchAttributes::priority`]).
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.attributes.priority = Some(priority);
        self
    }

    /// Sets every launch attribute at once.
    pub fn with_attributes(mut self, attributes: LaunchAttributes) -> Self {
        self.attributes = attributes;
        self
    }
}

/// The recording API of every command buffer kind.
///
/// A command buffer records from creation until its `end()`
/// ([`CommandEncoder::end`](crate::CommandEncoder::end) for the graph and deferred kinds, which
/// returns what a queue submits). Each command is checked when recorded; a rejected command
/// records nothing and the command buffer stays usable. A driver failure while recording moves it to [`CommandBufferState::Failed`].
pub trait CommandRecorder {
    /// The command buffer's state.
    fn state(&self) -> CommandBufferState;

    /// Fills `target` with `pattern`. For 2 and 4 byte patterns the range's offset and length
    /// must be multiples of the pattern size (the rule of the driver's memset).
    fn fill(&mut self, target: &BufferRange, pattern: FillPattern) -> Result<(), Error>;

    /// Writes `data` (copied now) into `target`; `data.len()` must equal `target.len()`.
    fn update(&mut self, target: &BufferRange, data: &[u8]) -> Result<(), Error>;

    /// Copies `source` to `target` (same length, no overlap).
    fn copy(&mut self, source: &BufferRange, target: &BufferRange) -> Result<(), Error>;

    /// A peer copy: as [`CommandRecorder::copy`], but one end may be a buffer of another device
    /// (the copy goes device to device, over the link when peer access is enabled); the other
    /// end must be this command buffer's device's. Kept apart from `copy` so that a buffer of
    /// the wrong device is still caught there.
    fn copy_peer(&mut self, source: &BufferRange, target: &BufferRange) -> Result<(), Error>;

    /// Launches a kernel. The block size is checked against the function's limit.
    fn dispatch(&mut self, dispatch: &Dispatch<'_>) -> Result<(), Error>;

    /// Launches a kernel whose grid is read from `counts` (three `u32`s: x, y, z, 4-byte
    /// aligned) when the command runs, on the device, with no host round trip. The dispatch's
    /// own `grid` is not used. A count with a zero axis runs nothing; a count over the device's
    /// grid limits (or not a multiple of the cluster) runs nothing and fails the submission
    /// with [`Error::IndirectCountOutOfRange`]. Clusters and priority are allowed; cooperative and
    /// programmatic launches are not (their checks need the grid at recording). Neither `counts`
    /// nor the kernel's arguments may name binding slots (`BindingError::SlotRangeNotBound`):
    /// the launch is set up from raw addresses when it is recorded.
    fn dispatch_indirect(
        &mut self,
        dispatch: &Dispatch<'_>,
        counts: &BufferRange,
    ) -> Result<(), Error>;

    /// Everything recorded before the barrier completes before anything recorded after it
    /// starts. Commands between two barriers may run concurrently.
    fn barrier(&mut self) -> Result<(), Error>;

    /// Records caller-provided stream work (a library call: cuBLAS, NCCL, any work enqueued on a
    /// stream it is handed). `ranges` are the device ranges the work touches: their context is
    /// checked, they are kept alive with the command buffer, and the closure reads their
    /// addresses from [`StreamWork::ranges`](crate::StreamWork::ranges).
    ///
    /// - graph: the work is captured into the graph now (`cuStreamBeginCaptureToGraph`, CUDA
    ///   12.3+, else [`Error::CaptureUnsupported`]), after the current group's dependencies, as
    ///   one command of the group. A closure that synchronizes or does something else capture
    ///   forbids is [`Error::Capture`] naming the driver's complaint; what it captured is removed
    ///   again and the command buffer stays recording;
    /// - deferred: the closure is kept and called at every replay, on the queue's stream (an
    ///   error then fails the submission: [`Error::StreamWork`]);
    /// - stream: the closure is called now, on the command buffer's stream.
    ///
    /// Like every command, the work runs after the last barrier's commands and before the next
    /// barrier's. FINE tracing does not time it on its own (its enclosing debug group does).
    ///
    /// A closure called at a replay or a re-capture runs while the submitting queue issues, under
    /// that queue's issue lock: it must only enqueue work on the stream it is handed, never call
    /// back into a cuhal queue, semaphore or device (a call that needs that queue's lock, even
    /// `Queue::stats`, would wait for ever).
    ///
    /// Slot ranges ([`BufferRange::slot`]) are accepted by graph and deferred command buffers
    /// with a binding capacity. A deferred replay hands the closure that submission's
    /// addresses. A graph captures the closure at recording over placeholder memory of each
    /// slot range's length, and again, with a table's addresses, before an executable's first
    /// launch and whenever a slot the work names is bound elsewhere than at that executable's
    /// last launch; the new capture replaces the old in the executable
    /// (`cuGraphExecChildGraphNodeSetParams`). So the closure runs on the submitting thread at
    /// such launches, and the work it enqueues must have the same shape (the same nodes in the
    /// same order) whatever the addresses: a re-capture the driver refuses, or that fails,
    /// fails that submission with [`Error::Capture`]. A stream command buffer runs the closure
    /// at recording, when a slot has no address: a slot range there is refused
    /// (`BindingError::SlotRangeNotBound`), nothing recorded.
    fn stream_work(
        &mut self,
        ranges: &[BufferRange],
        work: Arc<crate::StreamWorkFn>,
    ) -> Result<(), Error>;

    /// Opens a named debug group (a tracing zone when tracing is on).
    fn begin_debug_group(&mut self, name: &str) -> Result<(), Error>;

    /// Closes the innermost debug group.
    fn end_debug_group(&mut self) -> Result<(), Error>;
}

/// Implements [`CommandRecorder`] for a command buffer type by forwarding every method to its
/// `recorder: Recorder<_>` field, where validation, state and tracing live for all three kinds.
macro_rules! forward_recording {
    ($ty:ty) => {
        impl $crate::CommandRecorder for $ty {
            fn state(&self) -> $crate::CommandBufferState {
                self.recorder.state()
            }
            fn fill(
                &mut self,
                target: &$crate::BufferRange,
                pattern: $crate::FillPattern,
            ) -> Result<(), $crate::Error> {
                self.recorder.fill(target, pattern)
            }
            fn update(
                &mut self,
                target: &$crate::BufferRange,
                data: &[u8],
            ) -> Result<(), $crate::Error> {
                self.recorder.update(target, data)
            }
            fn copy(
                &mut self,
                source: &$crate::BufferRange,
                target: &$crate::BufferRange,
            ) -> Result<(), $crate::Error> {
                self.recorder.copy(source, target)
            }
            fn copy_peer(
                &mut self,
                source: &$crate::BufferRange,
                target: &$crate::BufferRange,
            ) -> Result<(), $crate::Error> {
                self.recorder.copy_peer(source, target)
            }
            fn dispatch(&mut self, dispatch: &$crate::Dispatch<'_>) -> Result<(), $crate::Error> {
                self.recorder.dispatch(dispatch)
            }
            fn dispatch_indirect(
                &mut self,
                dispatch: &$crate::Dispatch<'_>,
                counts: &$crate::BufferRange,
            ) -> Result<(), $crate::Error> {
                self.recorder.dispatch_indirect(dispatch, counts)
            }
            fn barrier(&mut self) -> Result<(), $crate::Error> {
                self.recorder.barrier()
            }
            fn stream_work(
                &mut self,
                ranges: &[$crate::BufferRange],
                work: ::std::sync::Arc<$crate::StreamWorkFn>,
            ) -> Result<(), $crate::Error> {
                self.recorder.stream_work(ranges, work)
            }
            fn begin_debug_group(&mut self, name: &str) -> Result<(), $crate::Error> {
                self.recorder.begin_debug_group(name)
            }
            fn end_debug_group(&mut self) -> Result<(), $crate::Error> {
                self.recorder.end_debug_group()
            }
        }
    };
}
pub(crate) use forward_recording;

/// The tracing events around one command (FINE verbosity).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CommandZone {
    pub(crate) begin: Option<CUevent>,
    pub(crate) end: Option<CUevent>,
    /// Timed from activity records: no events, and the tracer wants the command's graph node.
    pub(crate) by_activity: bool,
}

/// What a command buffer kind does with checked commands. Operands are addresses, or slots
/// (only in command buffers with a binding capacity) bound at each submission.
pub(crate) trait Encoder {
    /// How this kind passes launch attributes to the driver.
    const ATTRIBUTE_PATH: AttributePath;
    /// Whether stream work may name slot ranges: kinds that call the closure at each
    /// submission (deferred) or capture it again when a binding it names changes (graph).
    const BINDS_STREAM_WORK: bool;
    /// Whether a tracer may time this kind's commands from activity records (no events): only
    /// kinds a queue issues, where the launches of an issue are captured.
    const ACTIVITY_TIMING: bool = true;

    fn fill(
        &mut self,
        target: Operand,
        length: usize,
        pattern: FillPattern,
        zone: CommandZone,
    ) -> Result<(), Error>;
    fn update(&mut self, target: Operand, data: &[u8], zone: CommandZone) -> Result<(), Error>;
    fn copy(
        &mut self,
        source: Operand,
        target: Operand,
        length: usize,
        zone: CommandZone,
    ) -> Result<(), Error>;
    fn dispatch(&mut self, dispatch: &Dispatch<'_>, zone: CommandZone) -> Result<(), Error>;
    /// An indirect dispatch: the fragment of [`crate::indirect::add_fragment`], in command order.
    fn dispatch_indirect(
        &mut self,
        launch: &IndirectLaunch<'_>,
        indirect: &Indirect,
        zone: CommandZone,
    ) -> Result<(), Error>;
    fn barrier(&mut self) -> Result<(), Error>;
    /// Records stream work over `ranges` (checked, retained by the recorder). An
    /// [`Error::Capture`] or [`Error::CaptureUnsupported`] means nothing was recorded (the
    /// encoder undid what it had started); any other error leaves the command buffer failed.
    fn stream_work(
        &mut self,
        ranges: &[(Operand, usize)],
        work: &Arc<StreamWorkFn>,
    ) -> Result<(), Error>;
    /// Records a coarse zone edge (command buffer or debug group begin/end). Everything before
    /// it happens before it, everything after it happens after it.
    fn zone_event(&mut self, event: CUevent) -> Result<(), Error>;
    fn end(&mut self) -> Result<(), Error>;
    /// The graph node the last command was recorded as (graph command buffers only).
    fn last_command_node(&self) -> Option<CUgraphNode> {
        None
    }
}

/// The tracer attached to a command buffer, with its verbosity read once.
pub(crate) struct ZoneHooks {
    recorder: Option<Arc<dyn ZoneRecorder>>,
    verbosity: Verbosity,
}

impl ZoneHooks {
    pub(crate) fn new(recorder: Option<Arc<dyn ZoneRecorder>>) -> Self {
        let verbosity = recorder.as_ref().map_or(Verbosity::Off, |r| r.verbosity());
        Self {
            recorder,
            verbosity,
        }
    }

    /// Takes the tracer out, leaving tracing off.
    fn take(&mut self) -> Option<Arc<dyn ZoneRecorder>> {
        self.verbosity = Verbosity::Off;
        self.recorder.take()
    }

    /// Opens a coarse zone if tracing is on: `Some(event)` to record.
    fn begin_coarse(&self, name: &str) -> Option<CUevent> {
        match &self.recorder {
            Some(r) if self.verbosity >= Verbosity::Coarse => r.begin_zone(name),
            _ => None,
        }
    }

    fn end_coarse(&self) -> Option<CUevent> {
        match &self.recorder {
            Some(r) if self.verbosity >= Verbosity::Coarse => r.end_zone(),
            _ => None,
        }
    }

    /// Opens and closes the zone of one command at FINE verbosity. Both events are taken
    /// before the command is encoded; the encoder records them around it.
    fn command(&self, name: &str, activity: bool) -> CommandZone {
        match &self.recorder {
            Some(r) if self.verbosity >= Verbosity::Fine && !activity => CommandZone {
                begin: r.begin_zone(name),
                end: r.end_zone(),
                by_activity: false,
            },
            Some(r) if self.verbosity >= Verbosity::Fine => {
                let timing = r.command_zone(name);
                CommandZone {
                    begin: timing.begin,
                    end: timing.end,
                    by_activity: timing.by_activity,
                }
            }
            _ => CommandZone::default(),
        }
    }

    /// Tells the tracer which graph node an activity-timed command became.
    fn command_node(&self, zone: CommandZone, node: Option<CUgraphNode>) {
        if let (true, Some(r), Some(node)) = (zone.by_activity, &self.recorder, node) {
            // SAFETY: the encoder just added `node` to its graph, which lives as long as the
            // command buffer.
            unsafe { r.command_node(node) };
        }
    }
}

/// Resources the recorded commands refer to, kept alive as long as the command buffer.
#[derive(Default)]
pub(crate) struct Retained {
    buffers: Vec<Arc<Buffer>>,
    functions: Vec<Function>,
    /// Stream-work closures: kept so the resources they hold outlive the recorded work.
    works: Vec<Arc<StreamWorkFn>>,
}

impl Retained {
    /// Every buffer the recorded commands use (each once after `end()`).
    pub(crate) fn buffers(&self) -> &[Arc<Buffer>] {
        &self.buffers
    }

    fn buffer(&mut self, buffer: &Arc<Buffer>) {
        if !self.buffers.last().is_some_and(|b| Arc::ptr_eq(b, buffer)) {
            self.buffers.push(Arc::clone(buffer));
        }
    }

    fn function(&mut self, function: &Function) {
        if !self.functions.last().is_some_and(|f| f.same(function)) {
            self.functions.push(function.clone());
        }
    }

    /// Drops duplicate references once recording is over.
    fn compact(&mut self) {
        self.buffers.sort_by_key(|b| Arc::as_ptr(b) as usize);
        self.buffers.dedup_by(|a, b| Arc::ptr_eq(a, b));
        self.functions.sort_by_key(Function::identity);
        self.functions.dedup_by(|a, b| a.same(b));
        self.buffers.shrink_to_fit();
        self.functions.shrink_to_fit();
    }

    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, usize) {
        (self.buffers.len(), self.functions.len())
    }
}

/// The shape of the commands recorded since the last barriers, for programmatic dispatches:
/// one may only follow a barrier that closed a group of exactly one dispatch.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Groups {
    /// Commands recorded since the last barrier.
    current: u32,
    /// The current group is exactly one dispatch.
    current_is_one_dispatch: bool,
    /// The group the last barrier closed was exactly one dispatch, with nothing (no tracing
    /// zone edge) recorded after it.
    previous_is_one_dispatch: bool,
}

impl Groups {
    pub(crate) fn command(&mut self, dispatch: bool) {
        self.current += 1;
        self.current_is_one_dispatch = self.current == 1 && dispatch;
    }

    pub(crate) fn barrier(&mut self) {
        if self.current > 0 {
            self.previous_is_one_dispatch = self.current_is_one_dispatch;
            self.current = 0;
            self.current_is_one_dispatch = false;
        }
    }

    /// A tracing zone edge: a serialization point between whatever came before and after.
    pub(crate) fn zone_edge(&mut self) {
        self.barrier();
        self.previous_is_one_dispatch = false;
    }

    pub(crate) fn check_programmatic(&self) -> Result<(), Error> {
        if self.current > 0 {
            return Err(Error::NoProgrammaticPredecessor {
                reason: "it must be the first command after a barrier",
            });
        }
        if !self.previous_is_one_dispatch {
            return Err(Error::NoProgrammaticPredecessor {
                reason: "the group before the barrier must be exactly one dispatch",
            });
        }
        Ok(())
    }
}

/// What an ended command buffer keeps of its recording besides its encoder: its context,
/// tracer, the resources its commands use, the indirect-dispatch state and the binding layout.
/// Every kind's submittable form holds one; [`CommandBuffer`](crate::CommandBuffer)'s methods
/// that do not issue read it.
#[doc(hidden)]
pub struct Recorded {
    pub(crate) context: Option<Arc<PrimaryContext>>,
    pub(crate) zones: Option<Arc<dyn ZoneRecorder>>,
    pub(crate) retained: Retained,
    pub(crate) indirect: Option<Indirect>,
    pub(crate) layout: BindingLayout,
}

impl Recorded {
    pub(crate) fn context(&self) -> Option<&Arc<PrimaryContext>> {
        self.context.as_ref()
    }

    /// Whether a submission that completed without a driver error did what it should: an
    /// indirect dispatch whose count was out of range is reported here, once.
    pub(crate) fn check_completed(&self) -> Result<(), Error> {
        self.indirect.as_ref().map_or(Ok(()), Indirect::check)
    }

    /// Whether [`Recorded::check_completed`] can fail: an indirect dispatch was recorded.
    pub(crate) fn checks_completion(&self) -> bool {
        self.indirect.is_some()
    }

    /// Refuses a binding table shorter than the slots the commands use.
    pub(crate) fn check_table_length(&self, bindings: &[BufferRange]) -> Result<(), Error> {
        let needed = self.layout.slots_used();
        if bindings.len() < needed {
            return Err(crate::BindingError::TableTooShort {
                given: bindings.len(),
                needed,
            }
            .into());
        }
        Ok(())
    }
}

/// The shared front end: checks, state, retention and zones around an [`Encoder`].
pub(crate) struct Recorder<E> {
    /// Moved out by `end()`, into the command buffer's ended form.
    encoder: Option<E>,
    state: CommandBufferState,
    /// The context every resource must belong to. Graph and stream command buffers are given
    /// theirs; a deferred one adopts the context of the first resource it records.
    context: Option<Arc<PrimaryContext>>,
    zones: ZoneHooks,
    open_groups: u32,
    retained: Retained,
    groups: Groups,
    /// Created by the first indirect dispatch.
    indirect: Option<Indirect>,
    /// The binding capacity and what the commands use of each slot.
    layout: BindingLayout,
    /// A whole-command-buffer zone was opened at `begin` (stream command buffers only).
    whole_zone: bool,
}

impl<E: Encoder> Recorder<E> {
    /// Starts recording; opens the whole-command-buffer zone named `whole`, if given. Graph and
    /// deferred command buffers give none: the tracer times a submitted command buffer from
    /// the submission's own events (no graph node, no extra event). A stream command buffer,
    /// whose work runs as it is recorded, times itself.
    pub(crate) fn begin(
        encoder: E,
        context: Option<Arc<PrimaryContext>>,
        zones: Option<Arc<dyn ZoneRecorder>>,
        whole: Option<&'static str>,
    ) -> Result<Self, Error> {
        let mut this = Self {
            encoder: Some(encoder),
            state: CommandBufferState::Recording,
            context,
            zones: ZoneHooks::new(zones),
            open_groups: 0,
            retained: Retained::default(),
            groups: Groups::default(),
            indirect: None,
            layout: BindingLayout::default(),
            whole_zone: whole.is_some(),
        };
        if let Some(name) = whole
            && let Some(event) = this.zones.begin_coarse(name)
        {
            this.encode(|e| e.zone_event(event))?;
        }
        Ok(this)
    }

    /// [`Recorded::check_completed`] for the commands recorded so far.
    pub(crate) fn check_completed(&self) -> Result<(), Error> {
        self.indirect.as_ref().map_or(Ok(()), Indirect::check)
    }

    /// The encoder, while recording (`None` once `end()` moved it out).
    pub(crate) fn encoder(&self) -> Option<&E> {
        self.encoder.as_ref()
    }

    pub(crate) fn encoder_mut(&mut self) -> Option<&mut E> {
        self.encoder.as_mut()
    }

    /// Lets the commands recorded from now on name slots below `capacity` (at most
    /// [`MAX_BINDING_CAPACITY`](crate::MAX_BINDING_CAPACITY)).
    pub(crate) fn set_binding_capacity(&mut self, capacity: u32) -> Result<(), Error> {
        self.layout = BindingLayout::with_capacity(capacity)?;
        Ok(())
    }

    /// What the commands use of each binding slot.
    pub(crate) fn bindings(&self) -> &BindingLayout {
        &self.layout
    }

    fn recording(&self, operation: &'static str) -> Result<(), Error> {
        if self.state == CommandBufferState::Recording {
            Ok(())
        } else {
            Err(Error::InvalidState {
                operation,
                state: self.state,
            })
        }
    }

    /// Checks that `context` is the command buffer's (adopting it if there is none yet).
    fn same_context(&mut self, context: &Arc<PrimaryContext>) -> Result<(), Error> {
        match &self.context {
            Some(mine) if raw(mine) == raw(context) => Ok(()),
            Some(_) => Err(Error::ContextMismatch),
            None => {
                self.context = Some(Arc::clone(context));
                Ok(())
            }
        }
    }

    fn check_range(&mut self, range: &BufferRange) -> Result<(), Error> {
        self.layout.check_range(range)?;
        if let Some(buffer) = range.buffer() {
            self.same_context(buffer.context())?;
        }
        Ok(())
    }

    fn retain_range(&mut self, range: &BufferRange) {
        if let Some(buffer) = range.buffer() {
            self.retained.buffer(buffer);
        }
    }

    /// Encodes a checked copy and retains both ends.
    fn encode_copy(&mut self, source: &BufferRange, target: &BufferRange) -> Result<(), Error> {
        let zone = self.zones.command("copy", E::ACTIVITY_TIMING);
        self.encode(|e| e.copy(Operand::of(source), Operand::of(target), source.len(), zone))?;
        self.zones.command_node(zone, self.last_command_node());
        self.groups.command(false);
        self.retain_range(source);
        self.retain_range(target);
        self.layout.use_range(source, 1);
        self.layout.use_range(target, 1);
        self.layout.use_copy(source, target);
        Ok(())
    }

    /// Runs an encoder step, moving to `Failed` if the driver rejects it.
    fn encode(&mut self, step: impl FnOnce(&mut E) -> Result<(), Error>) -> Result<(), Error> {
        let Some(encoder) = self.encoder.as_mut() else {
            return Err(self.no_encoder());
        };
        let result = step(encoder);
        if result.is_err() {
            self.state = CommandBufferState::Failed;
        }
        result
    }

    /// The error for a step that finds the encoder gone: only after `end()`, which every
    /// recording call checks for first, so never seen in practice.
    fn no_encoder(&self) -> Error {
        Error::InvalidState {
            operation: "record",
            state: self.state,
        }
    }

    /// The graph node the last command was recorded as.
    fn last_command_node(&self) -> Option<CUgraphNode> {
        self.encoder.as_ref().and_then(E::last_command_node)
    }

    /// Finishes recording: every debug group must be closed. Returns the encoder and what the
    /// ended command buffer keeps; the recorder is left `Ended`, and every later call on it is
    /// an [`Error::InvalidState`].
    pub(crate) fn end(&mut self) -> Result<(E, Recorded), Error> {
        self.recording("end")?;
        if self.open_groups > 0 {
            return Err(Error::UnclosedDebugGroups {
                open: self.open_groups,
            });
        }
        if self.whole_zone
            && let Some(event) = self.zones.end_coarse()
        {
            self.encode(|e| e.zone_event(event))?;
        }
        self.encode(|e| e.end())?;
        let Some(encoder) = self.encoder.take() else {
            return Err(self.no_encoder());
        };
        self.retained.compact();
        self.state = CommandBufferState::Ended;
        let recorded = Recorded {
            context: self.context.take(),
            // Moved, not shared: an ended recording keeps nothing alive (the tracer's events
            // included), however long its owner holds it.
            zones: self.zones.take(),
            retained: std::mem::take(&mut self.retained),
            indirect: self.indirect.take(),
            layout: std::mem::take(&mut self.layout),
        };
        Ok((encoder, recorded))
    }
}

fn raw(context: &PrimaryContext) -> CUcontext {
    context.raw()
}

impl<E: Encoder> CommandRecorder for Recorder<E> {
    fn state(&self) -> CommandBufferState {
        self.state
    }

    fn fill(&mut self, target: &BufferRange, pattern: FillPattern) -> Result<(), Error> {
        self.recording("fill")?;
        target.check_fill(pattern)?;
        self.check_range(target)?;
        let zone = self.zones.command("fill", E::ACTIVITY_TIMING);
        self.encode(|e| e.fill(Operand::of(target), target.len(), pattern, zone))?;
        self.zones.command_node(zone, self.last_command_node());
        self.groups.command(false);
        self.retain_range(target);
        self.layout.use_range(target, pattern.size());
        Ok(())
    }

    fn update(&mut self, target: &BufferRange, data: &[u8]) -> Result<(), Error> {
        self.recording("update")?;
        check_non_empty("update", data.len())?;
        if data.len() != target.len() {
            return Err(Error::LengthMismatch {
                what: "update",
                target: target.len(),
                source: data.len(),
            });
        }
        self.check_range(target)?;
        let zone = self.zones.command("update", E::ACTIVITY_TIMING);
        self.encode(|e| e.update(Operand::of(target), data, zone))?;
        self.zones.command_node(zone, self.last_command_node());
        self.groups.command(false);
        self.retain_range(target);
        self.layout.use_range(target, 1);
        Ok(())
    }

    fn copy(&mut self, source: &BufferRange, target: &BufferRange) -> Result<(), Error> {
        self.recording("copy")?;
        source.check_copy_to(target)?;
        self.check_range(source)?;
        self.check_range(target)?;
        self.encode_copy(source, target)
    }

    fn copy_peer(&mut self, source: &BufferRange, target: &BufferRange) -> Result<(), Error> {
        self.recording("copy")?;
        source.check_copy_to(target)?;
        // A slot range at either end must name one of the command buffer's slots, whichever
        // end the context check below looks at.
        self.layout.check_range(source)?;
        self.layout.check_range(target)?;
        // One end must be this command buffer's (checked first: a deferred command buffer
        // adopts its context); unified addressing routes the copy to or from the other.
        if target.buffer().is_none() || self.check_range(target).is_err() {
            self.check_range(source)?;
        }
        self.encode_copy(source, target)
    }

    fn dispatch(&mut self, dispatch: &Dispatch<'_>) -> Result<(), Error> {
        self.recording("dispatch")?;
        let function = dispatch.function;
        self.same_context(function.context())?;
        function.ensure_dynamic_shared_memory(dispatch.shared_memory_bytes)?;
        validate_dispatch(
            function.name(),
            function.limits(),
            dispatch.grid,
            dispatch.block,
            dispatch.shared_memory_bytes,
        )?;
        validate_arguments(function.name(), function.parameter_sizes(), dispatch.args)?;
        self.layout.check_args(dispatch.args.bindings())?;
        for buffer in dispatch.args.buffers() {
            self.same_context(buffer.context())?;
        }
        let mut attributes = check_attributes(
            function,
            dispatch.grid,
            dispatch.block,
            dispatch.shared_memory_bytes,
            &dispatch.attributes,
            E::ATTRIBUTE_PATH,
        )?;
        if attributes.programmatic {
            self.groups.check_programmatic()?;
            // FINE zones put timing events between the two kernels: the dependency stays
            // correct but becomes a full one.
            if self.zones.verbosity >= Verbosity::Fine {
                attributes.programmatic = false;
            }
        }
        let dispatch = Dispatch {
            attributes,
            ..*dispatch
        };
        let zone = self.zones.command(function.name(), E::ACTIVITY_TIMING);
        self.encode(|e| e.dispatch(&dispatch, zone))?;
        self.zones.command_node(zone, self.last_command_node());
        self.groups.command(true);
        self.retained.function(function);
        for buffer in dispatch.args.buffers() {
            self.retained.buffer(buffer);
        }
        self.layout.use_args(dispatch.args.bindings());
        Ok(())
    }

    fn dispatch_indirect(
        &mut self,
        dispatch: &Dispatch<'_>,
        counts: &BufferRange,
    ) -> Result<(), Error> {
        self.recording("indirect dispatch")?;
        // The helper that reads the counts and the node it sets up take raw addresses when
        // they are recorded: neither can be given memory at submission.
        counts.check_not_slot("indirect dispatch counts")?;
        if let Some(binding) = dispatch.args.bindings().first() {
            return Err(BindingError::SlotRangeNotBound {
                what: "kernel argument of an indirect dispatch",
                slot: binding.slot,
            }
            .into());
        }
        if counts.len() < INDIRECT_COUNT_BYTES {
            return Err(Error::IndirectCounts {
                reason: "the counts range is shorter than three u32s",
            });
        }
        if !counts.device_ptr().is_multiple_of(4) {
            return Err(Error::Misaligned {
                what: "indirect counts address",
                value: counts.device_ptr(),
                alignment: 4,
            });
        }
        self.check_range(counts)?;
        let function = dispatch.function;
        self.same_context(function.context())?;
        if dispatch.attributes.cooperative || dispatch.attributes.programmatic {
            return Err(Error::UnsupportedAttribute {
                attribute: if dispatch.attributes.cooperative {
                    "cooperative"
                } else {
                    "programmatic"
                },
                reason: "not with an indirect dispatch: its checks need the grid at recording",
            });
        }
        function.ensure_dynamic_shared_memory(dispatch.shared_memory_bytes)?;
        let cluster = dispatch
            .attributes
            .cluster
            .or(function.capabilities().required_cluster)
            .unwrap_or([1; 3]);
        // The placeholder grid the node is created with until the device sets the real one.
        validate_dispatch(
            function.name(),
            function.limits(),
            cluster,
            dispatch.block,
            dispatch.shared_memory_bytes,
        )?;
        validate_arguments(function.name(), function.parameter_sizes(), dispatch.args)?;
        for buffer in dispatch.args.buffers() {
            self.same_context(buffer.context())?;
        }
        let attributes = check_attributes(
            function,
            cluster,
            dispatch.block,
            dispatch.shared_memory_bytes,
            &dispatch.attributes,
            AttributePath::GraphNode,
        )?;
        if self.indirect.is_none() {
            self.indirect = Some(Indirect::new(function.context())?);
        }
        let Some(indirect) = self.indirect.as_mut() else {
            unreachable!("created above")
        };
        let index = indirect.push(cluster)?;
        let placed = Dispatch {
            grid: cluster,
            attributes,
            ..*dispatch
        };
        let launch = IndirectLaunch {
            dispatch: &placed,
            counts: counts.device_ptr(),
            index,
        };
        let zone = self.zones.command(function.name(), E::ACTIVITY_TIMING);
        let Some(indirect) = self.indirect.as_ref() else {
            unreachable!("created above")
        };
        let Some(encoder) = self.encoder.as_mut() else {
            return Err(self.no_encoder());
        };
        if let Err(e) = encoder.dispatch_indirect(&launch, indirect, zone) {
            self.state = CommandBufferState::Failed;
            return Err(e);
        }
        self.groups.command(false);
        self.retained.function(function);
        for buffer in dispatch.args.buffers() {
            self.retained.buffer(buffer);
        }
        self.retain_range(counts);
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), Error> {
        self.recording("barrier")?;
        self.encode(|e| e.barrier())?;
        self.groups.barrier();
        Ok(())
    }

    fn stream_work(
        &mut self,
        ranges: &[BufferRange],
        work: Arc<StreamWorkFn>,
    ) -> Result<(), Error> {
        self.recording("stream work")?;
        for range in ranges {
            if !E::BINDS_STREAM_WORK {
                // Stream command buffers run the closure now; a slot has no address until
                // submission.
                range.check_not_slot("stream work in a stream command buffer")?;
            }
            self.check_range(range)?;
        }
        let operands: SmallVec<[(Operand, usize); 4]> =
            ranges.iter().map(|r| (Operand::of(r), r.len())).collect();
        let Some(encoder) = self.encoder.as_mut() else {
            return Err(self.no_encoder());
        };
        match encoder.stream_work(&operands, &work) {
            Ok(()) => {}
            // Undone by the encoder: nothing was recorded, the command buffer stays usable.
            Err(e @ (Error::Capture { .. } | Error::CaptureUnsupported { .. })) => return Err(e),
            Err(e) => {
                self.state = CommandBufferState::Failed;
                return Err(e);
            }
        }
        // Captured work may be several nodes: never a programmatic predecessor.
        self.groups.command(false);
        for range in ranges {
            self.retain_range(range);
            self.layout.use_range(range, 1);
        }
        self.retained.works.push(work);
        Ok(())
    }

    fn begin_debug_group(&mut self, name: &str) -> Result<(), Error> {
        self.recording("begin a debug group")?;
        self.open_groups += 1;
        if let Some(event) = self.zones.begin_coarse(name) {
            self.encode(|e| e.zone_event(event))?;
            self.groups.zone_edge();
        }
        Ok(())
    }

    fn end_debug_group(&mut self) -> Result<(), Error> {
        self.recording("end a debug group")?;
        if self.open_groups == 0 {
            return Err(Error::NoOpenDebugGroup);
        }
        self.open_groups -= 1;
        if let Some(event) = self.zones.end_coarse() {
            self.encode(|e| e.zone_event(event))?;
            self.groups.zone_edge();
        }
        Ok(())
    }
}
