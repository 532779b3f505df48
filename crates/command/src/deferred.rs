//! The deferred command buffer: recorded once into an arena, replayed onto a stream each time
//! it is issued.
//!
//! The arena is a `Vec` of compact [`Op`]s plus one 16-byte-aligned byte vector holding every
//! update's bytes and every dispatch's packed arguments. `end()` freezes it and computes the
//! `void**` argument arrays once, so a replay walks the ops and makes one driver call each,
//! with no allocation. Barriers vanish: a stream already runs its work in order.

use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

use cuhal_sys::{CUdeviceptr, CUevent, CUfunction, CUstream, PrimaryContext};

use crate::arena::{AlignedBytes, MAX_ALIGN};
use crate::binding::{ArgScratches, Operand, with_bound_args};
use crate::encoder::Encoder;
use crate::error::out_of_host_memory;
use crate::indirect::{Indirect, IndirectGraph, IndirectLaunch};
use crate::launch::{AttributePath, LaunchAttributes};
use crate::recorded::Recorded;
use crate::recorder::Recorder;
use crate::stream_ops::{self, LaunchShape};
use crate::stream_work::{self, StreamWork, StreamWorkFn};
use crate::zone_hooks::CommandZone;
use crate::{
    ArgBinding, ArgSlot, BindingLayout, BufferRange, CommandBuffer, CommandBufferKind,
    CommandEncoder, CommandRecorder, Dispatch, Error, FillPattern, KernelArgs, ZoneRecorder,
};
use smallvec::SmallVec;

/// One encoded command.
#[derive(Copy, Clone, Debug, PartialEq)]
pub(crate) enum Op {
    Fill {
        target: CUdeviceptr,
        length: usize,
        pattern: FillPattern,
    },
    Update {
        target: CUdeviceptr,
        /// Offset of the bytes in the arena.
        offset: usize,
        length: usize,
    },
    Copy {
        source: CUdeviceptr,
        target: CUdeviceptr,
        length: usize,
    },
    Dispatch {
        function: CUfunction,
        shape: LaunchShape,
        /// 0 for a plain launch, else 1 + the index of its attributes in `attributes` (kept
        /// aside so the common op stays small).
        attributes: u32,
        /// Index of the first argument pointer in `arg_pointers`.
        first_arg: u32,
        args: u32,
    },
    Event(CUevent),
    /// Stream work: index into `works`.
    StreamWork(u32),
    /// An indirect dispatch: graph `index` of `indirect_graphs`.
    Indirect(u32),
}

/// A recorded stream-work closure and the ranges it was recorded with.
pub(crate) struct DeferredWork {
    work: Arc<StreamWorkFn>,
    /// Addresses, or slots resolved at each replay from its binding table.
    ranges: SmallVec<[(Operand, usize); 4]>,
}

/// The slot operands of one op, substituted at replay. Ops without any have no entry, so a
/// replay without a table walks exactly the ops it walked before binding tables existed.
#[derive(Copy, Clone, Debug, PartialEq)]
pub(crate) struct BoundOp {
    /// Index of the op in `ops`.
    op: u32,
    /// Fill, update and copy target; copy source (`Operand::Address` where not a slot).
    target: Operand,
    source: Operand,
    /// Dispatch: the argument block in the arena and its bound arguments.
    args: BoundArgs,
}

#[derive(Copy, Clone, Debug, Default, PartialEq)]
struct BoundArgs {
    /// Arena offset and length of the packed argument block.
    block: u32,
    block_len: u32,
    /// Range of `arg_slots` (argument layout relative to the block) and `arg_bindings`.
    first_slot: u32,
    slots: u32,
    first_binding: u32,
    bindings: u32,
}

#[derive(Default)]
pub(crate) struct DeferredEncoder {
    pub(crate) ops: Vec<Op>,
    pub(crate) bytes: AlignedBytes,
    /// Arena offset of each dispatch argument, in op order.
    pub(crate) arg_offsets: Vec<u32>,
    /// The graphs of indirect dispatches.
    pub(crate) indirect_graphs: Vec<IndirectGraph>,
    /// Launch attributes of the dispatches that have any.
    pub(crate) attributes: Vec<LaunchAttributes>,
    /// `arg_offsets` turned into addresses by `end()`, when the arena stops moving.
    arg_pointers: Vec<*mut c_void>,
    /// Stream work, called at every replay.
    works: Vec<DeferredWork>,
    /// Ops with slot operands, in op order.
    bound: Vec<BoundOp>,
    /// Argument layouts and bound arguments of bound dispatches.
    arg_slots: Vec<ArgSlot>,
    arg_bindings: Vec<ArgBinding>,
}

impl DeferredEncoder {
    /// Notes the slot operands of the op about to be pushed (after its begin zone event).
    fn bind(&mut self, zone: CommandZone, target: Operand, source: Operand, args: BoundArgs) {
        if target.slot().is_none() && source.slot().is_none() && args.bindings == 0 {
            return;
        }
        let op = (self.ops.len() + usize::from(zone.begin.is_some())) as u32;
        self.bound.push(BoundOp {
            op,
            target,
            source,
            args,
        });
    }

    fn zone(&mut self, event: Option<CUevent>) {
        if let Some(event) = event {
            self.ops.push(Op::Event(event));
        }
    }

    fn push(&mut self, zone: CommandZone, op: Op) {
        self.zone(zone.begin);
        self.ops.push(op);
        self.zone(zone.end);
    }

    /// The closure of the stream-work op at `index`, if that op is one.
    fn stream_work_at(&self, index: usize) -> Option<&Arc<StreamWorkFn>> {
        match self.ops.get(index)? {
            Op::StreamWork(work) => self.works.get(*work as usize).map(|w| &w.work),
            _ => None,
        }
    }

    /// The attributes of a dispatch op.
    pub(crate) fn launch_attributes(&self, index: u32) -> &LaunchAttributes {
        static PLAIN: LaunchAttributes = LaunchAttributes {
            cluster: None,
            cooperative: false,
            programmatic: false,
            priority: None,
        };
        match index.checked_sub(1) {
            Some(i) => &self.attributes[i as usize],
            None => &PLAIN,
        }
    }

    /// The argument pointers of a dispatch op (valid after `end()`).
    pub(crate) fn pointers(&self, first: u32, count: u32) -> *mut *mut c_void {
        if count == 0 {
            return std::ptr::null_mut();
        }
        let start = first as usize;
        // The driver takes `void**` but only reads the array.
        self.arg_pointers[start..start + count as usize]
            .as_ptr()
            .cast_mut()
    }
}

impl DeferredEncoder {
    /// Copies the packed arguments into the arena and records where each one lives.
    pub(crate) fn encode_dispatch(
        &mut self,
        function: CUfunction,
        shape: LaunchShape,
        attributes: LaunchAttributes,
        args: &KernelArgs,
        zone: CommandZone,
    ) -> Result<(), Error> {
        let too_big = || Error::BadKernelArgument {
            reason: "a deferred command buffer's arena is limited to 4 GiB of arguments",
        };
        // The packed block keeps its internal layout (each value aligned) because it starts at
        // an offset aligned to the largest alignment the builder uses.
        let base = self
            .bytes
            .try_push(args.bytes(), MAX_ALIGN)
            .ok_or_else(|| out_of_host_memory("kernel arguments", args.bytes().len()))?;
        let first_arg = u32::try_from(self.arg_offsets.len()).map_err(|_| too_big())?;
        let mut offsets = Vec::with_capacity(args.len());
        for slot in args.slots() {
            offsets.push(u32::try_from(base + slot.offset as usize).map_err(|_| too_big())?);
        }
        self.arg_offsets.extend_from_slice(&offsets);
        let attributes = if attributes.is_plain() {
            0
        } else {
            self.attributes.push(attributes);
            u32::try_from(self.attributes.len()).map_err(|_| too_big())?
        };
        if !args.bindings().is_empty() {
            let bound = BoundArgs {
                block: u32::try_from(base).map_err(|_| too_big())?,
                block_len: args.bytes().len() as u32,
                first_slot: self.arg_slots.len() as u32,
                slots: args.len() as u32,
                first_binding: self.arg_bindings.len() as u32,
                bindings: args.bindings().len() as u32,
            };
            self.arg_slots.extend_from_slice(args.slots());
            self.arg_bindings.extend_from_slice(args.bindings());
            let none = Operand::Address(0);
            self.bind(zone, none, none, bound);
        }
        self.push(
            zone,
            Op::Dispatch {
                function,
                shape,
                attributes,
                first_arg,
                args: args.len() as u32,
            },
        );
        Ok(())
    }
}

impl Encoder for DeferredEncoder {
    const ATTRIBUTE_PATH: AttributePath = AttributePath::Launch;
    const BINDS_STREAM_WORK: bool = true;

    fn fill(
        &mut self,
        target: Operand,
        length: usize,
        pattern: FillPattern,
        zone: CommandZone,
    ) -> Result<(), Error> {
        self.bind(zone, target, Operand::Address(0), BoundArgs::default());
        self.push(
            zone,
            Op::Fill {
                target: target.recorded(),
                length,
                pattern,
            },
        );
        Ok(())
    }

    fn update(&mut self, target: Operand, data: &[u8], zone: CommandZone) -> Result<(), Error> {
        let offset = self
            .bytes
            .try_push(data, 1)
            .ok_or_else(|| out_of_host_memory("update's bytes", data.len()))?;
        self.bind(zone, target, Operand::Address(0), BoundArgs::default());
        self.push(
            zone,
            Op::Update {
                target: target.recorded(),
                offset,
                length: data.len(),
            },
        );
        Ok(())
    }

    fn copy(
        &mut self,
        source: Operand,
        target: Operand,
        length: usize,
        zone: CommandZone,
    ) -> Result<(), Error> {
        self.bind(zone, target, source, BoundArgs::default());
        self.push(
            zone,
            Op::Copy {
                source: source.recorded(),
                target: target.recorded(),
                length,
            },
        );
        Ok(())
    }

    fn dispatch(&mut self, dispatch: &Dispatch<'_>, zone: CommandZone) -> Result<(), Error> {
        let shape = LaunchShape {
            grid: dispatch.grid,
            block: dispatch.block,
            shared_memory: dispatch.shared_memory_bytes,
        };
        self.encode_dispatch(
            dispatch.function.raw(),
            shape,
            dispatch.attributes,
            dispatch.args,
            zone,
        )
    }

    fn dispatch_indirect(
        &mut self,
        launch: &IndirectLaunch<'_>,
        indirect: &Indirect,
        zone: CommandZone,
    ) -> Result<(), Error> {
        let graph = IndirectGraph::new(launch.dispatch.function.context(), launch, indirect)?;
        let index =
            u32::try_from(self.indirect_graphs.len()).map_err(|_| Error::IndirectCounts {
                reason: "too many indirect dispatches in one command buffer",
            })?;
        self.indirect_graphs.push(graph);
        self.push(zone, Op::Indirect(index));
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), Error> {
        Ok(())
    }

    fn stream_work(
        &mut self,
        ranges: &[(Operand, usize)],
        work: &Arc<StreamWorkFn>,
    ) -> Result<(), Error> {
        let index = u32::try_from(self.works.len()).map_err(|_| Error::BadKernelArgument {
            reason: "a deferred command buffer holds at most 2^32 stream-work commands",
        })?;
        self.works.push(DeferredWork {
            work: Arc::clone(work),
            ranges: ranges.iter().copied().collect(),
        });
        self.ops.push(Op::StreamWork(index));
        Ok(())
    }

    fn zone_event(&mut self, event: CUevent) -> Result<(), Error> {
        self.zone(Some(event));
        Ok(())
    }

    fn set_stamp_slot(&mut self, slot: u32) {
        for binding in &mut self.arg_bindings {
            if binding.slot == crate::binding::STAMP_SLOT_PENDING {
                binding.slot = slot;
            }
        }
    }

    fn end(&mut self) -> Result<(), Error> {
        let base = self.bytes.base();
        self.arg_pointers = self
            .arg_offsets
            .iter()
            // SAFETY: every offset was returned by a push into `bytes`, so it is in bounds.
            .map(|&o| unsafe { base.add(o as usize) }.cast_mut().cast::<c_void>())
            .collect();
        self.ops.shrink_to_fit();
        Ok(())
    }
}

/// A command buffer being recorded into an arena; [`end`](Self::end) gives the
/// [`DeferredExec`] that replays it onto a stream at each issue.
///
/// Recording needs no GPU and makes no driver call.
pub struct DeferredCommandBuffer {
    recorder: Recorder<DeferredEncoder>,
}

// SAFETY: the raw pointers (function handles, events) are only stored while recording, through
// `&mut self`; CUDA handles may be used from any thread; the zone recorder is Send + Sync.
unsafe impl Send for DeferredCommandBuffer {}
// SAFETY: as above: `&self` methods only read.
unsafe impl Sync for DeferredCommandBuffer {}

impl DeferredCommandBuffer {
    /// Starts recording without a context: the first buffer or function recorded sets it, and
    /// every later one must belong to the same. Records without any GPU.
    pub fn new(zones: Option<Arc<dyn ZoneRecorder>>) -> Result<Self, Error> {
        Self::begin(None, zones)
    }

    /// Starts recording for `context` (needed to replay a buffer that records only raw ranges).
    pub fn with_context(
        context: &Arc<PrimaryContext>,
        zones: Option<Arc<dyn ZoneRecorder>>,
    ) -> Result<Self, Error> {
        Self::begin(Some(Arc::clone(context)), zones)
    }

    /// Starts recording for `context` with `capacity` binding slots: commands may name slots
    /// below it ([`BufferRange::slot`], [`KernelArgs::push_binding`]), and each submission
    /// passes a binding table whose addresses are substituted at replay.
    pub fn with_bindings(
        context: &Arc<PrimaryContext>,
        zones: Option<Arc<dyn ZoneRecorder>>,
        capacity: u32,
    ) -> Result<Self, Error> {
        let mut this = Self::begin(Some(Arc::clone(context)), zones)?;
        this.recorder.set_binding_capacity(capacity)?;
        Ok(this)
    }

    fn begin(
        context: Option<Arc<PrimaryContext>>,
        zones: Option<Arc<dyn ZoneRecorder>>,
    ) -> Result<Self, Error> {
        Ok(Self {
            recorder: Recorder::begin(DeferredEncoder::default(), context, zones, None)?,
        })
    }

    /// Finishes recording (every debug group must be closed) and freezes the arena: the
    /// returned [`DeferredExec`] replays it, any number of times. This recording is left
    /// ended; an error (an unclosed debug group) leaves it recording.
    pub fn end(&mut self) -> Result<DeferredExec, Error> {
        let (encoder, recorded) = self.recorder.end()?;
        Ok(DeferredExec {
            encoder,
            recorded,
            scratches: ArgScratches::default(),
        })
    }

    /// What the commands recorded so far use of each binding slot.
    pub fn bindings(&self) -> &BindingLayout {
        self.recorder.bindings()
    }

    /// Number of commands encoded so far (zone events included, barriers excluded; 0 once
    /// ended: see [`DeferredExec::command_count`]).
    pub fn command_count(&self) -> usize {
        self.recorder.encoder().map_or(0, |e| e.ops.len())
    }

    /// Bytes of update data and kernel arguments in the arena so far.
    pub fn arena_bytes(&self) -> usize {
        self.recorder.encoder().map_or(0, |e| e.bytes.len())
    }

    /// The closure of the stream-work command recorded at `index` (see
    /// [`Self::command_count`]), or `None` when the command there is something else (or the
    /// recording has ended: see [`DeferredExec::stream_work_at`]).
    pub fn stream_work_at(&self, index: usize) -> Option<&Arc<StreamWorkFn>> {
        self.recorder.encoder()?.stream_work_at(index)
    }

    #[cfg(test)]
    pub(crate) fn recorder(&self) -> &Recorder<DeferredEncoder> {
        &self.recorder
    }
}

crate::forward_recording::forward_recording!(DeferredCommandBuffer);

impl CommandEncoder for DeferredCommandBuffer {
    fn kind(&self) -> CommandBufferKind {
        CommandBufferKind::Deferred
    }
    fn end(&mut self) -> Result<Arc<dyn CommandBuffer>, Error> {
        Ok(Arc::new(DeferredCommandBuffer::end(self)?))
    }
}

impl fmt::Debug for DeferredCommandBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeferredCommandBuffer")
            .field("state", &self.recorder.state())
            .field("commands", &self.command_count())
            .field("arena_bytes", &self.arena_bytes())
            .finish()
    }
}

/// An ended deferred command buffer: its arena, replayed onto a stream at each issue.
///
/// Replays may run any number of times and concurrently from several threads; each is one
/// driver call per command. Share it as `Arc<DeferredExec>` (or `Arc<dyn CommandBuffer>`) to
/// submit it to a queue, which holds it until the submission completes.
pub struct DeferredExec {
    encoder: DeferredEncoder,
    recorded: Recorded,
    /// Where replays write kernel arguments with their slots' addresses.
    scratches: ArgScratches,
}

// SAFETY: the raw pointers (function handles, events, argument pointers into the owned arena)
// are only read: the arena no longer changes once ended; CUDA handles may be used from any
// thread; the zone recorder is Send + Sync; the argument scratches are behind their lock.
unsafe impl Send for DeferredExec {}
// SAFETY: as above: every method takes `&self` and only reads, apart from the scratches, taken
// and given back under their lock.
unsafe impl Sync for DeferredExec {}

impl DeferredExec {
    /// Enqueues every recorded command on `stream`, in order (stream-work closures are called
    /// with `stream`). Only for a command buffer that recorded no binding slot (see
    /// [`Self::replay_with_bindings`]).
    ///
    /// # Safety
    /// `stream` must be a live stream of the command buffer's context (given at creation or
    /// adopted from the first resource recorded), and the command buffer must not be dropped
    /// before the replayed work completes (it owns the bytes the copies read, the buffers and
    /// the kernels). With tracing on, replays of one buffer must not overlap in time: they
    /// record the same timing events.
    pub unsafe fn replay(&self, stream: CUstream) -> Result<(), Error> {
        // SAFETY: forwarded contract.
        unsafe { self.replay_with_bindings(stream, &[]) }
    }

    /// Enqueues every recorded command on `stream`, in order, with each slot operand replaced
    /// by the address of its binding in `bindings` (plus the recorded offset).
    ///
    /// # Safety
    /// As [`Self::replay`]; and `bindings` must have passed [`BindingLayout::check`] for the
    /// stream's context, and its memory must stay allocated until the replayed work completes
    /// (a queue holds the table's buffers until then). A table shorter than the slots used is
    /// refused; nothing else about it is checked here.
    pub unsafe fn replay_with_bindings(
        &self,
        stream: CUstream,
        bindings: &[BufferRange],
    ) -> Result<(), Error> {
        // SAFETY: forwarded contract.
        unsafe { self.replay_commands(stream, bindings, 0..usize::MAX) }
    }

    /// Enqueues the recorded commands whose indices lie in `commands` (clamped to
    /// [`Self::command_count`]) on `stream`, in order, as [`Self::replay_with_bindings`] does
    /// for all of them. A caller that replays several command buffers in lockstep (each up to a
    /// command it must issue together with the others', such as one rank's part of a NCCL
    /// collective) replays consecutive ranges; together they enqueue what one replay would.
    ///
    /// # Safety
    /// As [`Self::replay_with_bindings`].
    pub unsafe fn replay_commands(
        &self,
        stream: CUstream,
        bindings: &[BufferRange],
        commands: std::ops::Range<usize>,
    ) -> Result<(), Error> {
        self.recorded.check_table_length(bindings)?;
        let encoder = &self.encoder;
        if encoder.ops.is_empty() {
            return Ok(());
        }
        let Some(context) = self.recorded.context() else {
            return Err(Error::NoContext);
        };
        let _bound = context.enter()?;
        let api = context.api();
        let end = commands.end.min(encoder.ops.len());
        let start = commands.start.min(end);
        // The slot operands of the ops before `start` are skipped (they are in op order).
        let first_bound = encoder.bound.partition_point(|b| (b.op as usize) < start);
        let mut bound = encoder.bound[first_bound..].iter().peekable();
        // Taken at the first launch with bound arguments, given back when the replay ends.
        let mut scratch = None;
        for (index, op) in encoder.ops[start..end]
            .iter()
            .enumerate()
            .map(|(i, op)| (start + i, op))
        {
            let slots = bound.next_if(|b| b.op as usize == index);
            let target = |recorded| slots.map_or(recorded, |b| b.target.resolve(bindings));
            let source = |recorded| slots.map_or(recorded, |b| b.source.resolve(bindings));
            // SAFETY: (all arms) every range was checked when recorded and its buffer is
            // retained by this command buffer (raw ranges: the caller's contract; slot ranges:
            // a checked table whose memory the caller keeps); update bytes and argument values
            // live in the arena, frozen since `end()`; functions' modules are retained; events
            // belong to the zone recorder, which outlives this buffer.
            unsafe {
                match *op {
                    Op::Fill {
                        target: recorded,
                        length,
                        pattern,
                    } => stream_ops::fill(api, stream, target(recorded), length, pattern)?,
                    Op::Update {
                        target: recorded,
                        offset,
                        length,
                    } => {
                        let bytes = encoder.bytes.base().add(offset);
                        stream_ops::update(api, stream, target(recorded), bytes, length)?
                    }
                    Op::Copy {
                        source: from,
                        target: to,
                        length,
                    } => stream_ops::copy(api, stream, source(from), target(to), length)?,
                    Op::Dispatch {
                        function,
                        shape,
                        attributes,
                        first_arg,
                        args,
                    } => match slots {
                        Some(b) if b.args.bindings > 0 => {
                            let a = b.args;
                            let block = a.block as usize;
                            let bytes =
                                &encoder.bytes.as_slice()[block..block + a.block_len as usize];
                            let first_slot = a.first_slot as usize;
                            let first_binding = a.first_binding as usize;
                            let scratch = scratch.get_or_insert_with(|| self.scratches.take());
                            with_bound_args(
                                scratch.scratch(),
                                bytes,
                                &encoder.arg_slots[first_slot..first_slot + a.slots as usize],
                                &encoder.arg_bindings
                                    [first_binding..first_binding + a.bindings as usize],
                                bindings,
                                |pointers| {
                                    stream_ops::launch(
                                        api,
                                        stream,
                                        function,
                                        shape,
                                        encoder.launch_attributes(attributes),
                                        pointers,
                                    )
                                },
                            )?
                        }
                        _ => stream_ops::launch(
                            api,
                            stream,
                            function,
                            shape,
                            encoder.launch_attributes(attributes),
                            encoder.pointers(first_arg, args),
                        )?,
                    },
                    Op::Event(event) => stream_ops::record_event(api, stream, event)?,
                    Op::Indirect(index) => {
                        encoder.indirect_graphs[index as usize].launch(stream)?
                    }
                    Op::StreamWork(index) => {
                        let recorded = &encoder.works[index as usize];
                        let ranges = stream_work::resolve(&recorded.ranges, bindings);
                        let on = StreamWork {
                            stream,
                            ranges: &ranges,
                            capturing: false,
                            context,
                        };
                        stream_work::call(&*recorded.work, &on).map_err(Error::StreamWork)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// What the recorded commands use of each binding slot.
    pub fn bindings(&self) -> &BindingLayout {
        &self.recorded.layout
    }

    /// The closure of the stream-work command at `index` (see [`Self::command_count`]), or
    /// `None` when the command there is something else.
    pub fn stream_work_at(&self, index: usize) -> Option<&Arc<StreamWorkFn>> {
        self.encoder.stream_work_at(index)
    }

    /// Number of encoded commands (zone events included, barriers excluded).
    pub fn command_count(&self) -> usize {
        self.encoder.ops.len()
    }

    /// Bytes of update data and kernel arguments in the arena.
    pub fn arena_bytes(&self) -> usize {
        self.encoder.bytes.len()
    }

    #[cfg(test)]
    pub(crate) fn parts(&self) -> (&DeferredEncoder, &Recorded) {
        (&self.encoder, &self.recorded)
    }
}

impl CommandBuffer for DeferredExec {
    fn kind(&self) -> CommandBufferKind {
        CommandBufferKind::Deferred
    }
    fn recorded(&self) -> &Recorded {
        &self.recorded
    }
    unsafe fn issue_with_bindings(
        &self,
        stream: CUstream,
        bindings: &[BufferRange],
    ) -> Result<(), Error> {
        // SAFETY: the caller upholds `issue_with_bindings`' contract, which is this one's.
        unsafe { self.replay_with_bindings(stream, bindings) }
    }
}

impl fmt::Debug for DeferredExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeferredExec")
            .field("commands", &self.encoder.ops.len())
            .field("arena_bytes", &self.encoder.bytes.len())
            .finish()
    }
}
