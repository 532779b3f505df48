//! [`Recorder`]: the front end every command buffer kind records through. It implements
//! [`CommandRecorder`] once: the state machine, each command's validation, retention of what
//! the commands use ([`Retained`]), tracing zones ([`ZoneHooks`]), debug groups and the
//! barrier groups of programmatic dispatches ([`Groups`]). Each kind only supplies an
//! [`Encoder`]; `end()` gives back the encoder and the [`Recorded`] state.

use std::sync::Arc;

use cuhal_sys::{CUcontext, CUgraphNode, PrimaryContext};

use crate::barrier_groups::Groups;
use crate::binding::{BindingLayout, Operand, STAMP_SLOT_PENDING};
use crate::binding_error::BindingError;
use crate::encoder::Encoder;
use crate::executable::{validate_arguments, validate_dispatch};
use crate::indirect::{INDIRECT_COUNT_BYTES, Indirect, IndirectLaunch};
use crate::launch::{AttributePath, check_attributes};
use crate::range::check_non_empty;
use crate::recorded::Recorded;
use crate::retained::Retained;
use crate::zone_hooks::{CommandZone, ZoneHooks};
use crate::{
    BufferRange, CommandBufferState, CommandRecorder, Dispatch, Error, FillPattern, StreamWorkFn,
    Verbosity, ZONE_STAMP_BYTES, ZoneRecorder,
};
use smallvec::SmallVec;

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
        let zone = self
            .zones
            .command("copy", E::ACTIVITY_TIMING, E::EVENT_PLACEMENT);
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
        if let Some(slot) = self.layout.stamp_slot() {
            self.encode(|e| {
                e.set_stamp_slot(slot);
                Ok(())
            })?;
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
        let zone = self
            .zones
            .command("fill", E::ACTIVITY_TIMING, E::EVENT_PLACEMENT);
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
        let zone = self
            .zones
            .command("update", E::ACTIVITY_TIMING, E::EVENT_PLACEMENT);
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
        let stamp_arg = dispatch.args.zone_stamp()?;
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
        let user_args = dispatch.args;
        let mut dispatch = Dispatch {
            attributes,
            ..*dispatch
        };
        // A stamped dispatch: no zone events, its stamp argument bound to its stamp's 16 bytes
        // of the stamp slot (known when recording ends).
        let stamp = match stamp_arg {
            Some(arg) if E::BINDS_STAMPS => {
                self.zones.stamp(function.name()).map(|index| (arg, index))
            }
            _ => None,
        };
        let stamped_args;
        let zone = match stamp {
            Some((arg, index)) => {
                let offset = u64::from(index) * ZONE_STAMP_BYTES;
                stamped_args = user_args.with_stamp_binding(arg, STAMP_SLOT_PENDING, offset);
                dispatch.args = &stamped_args;
                CommandZone::default()
            }
            None => self
                .zones
                .command(function.name(), E::ACTIVITY_TIMING, E::EVENT_PLACEMENT),
        };
        self.encode(|e| e.dispatch(&dispatch, zone))?;
        self.zones.command_node(zone, self.last_command_node());
        self.groups.command(true);
        self.retained.function(function);
        for buffer in user_args.buffers() {
            self.retained.buffer(buffer);
        }
        self.layout.use_args(user_args.bindings());
        if let Some((_, index)) = stamp {
            self.layout.use_stamp(index);
        }
        Ok(())
    }

    fn dispatch_indirect(
        &mut self,
        dispatch: &Dispatch<'_>,
        counts: &BufferRange,
    ) -> Result<(), Error> {
        self.recording("indirect dispatch")?;
        // An indirect dispatch's arguments cannot be bound: its stamp stays null, but a second
        // one is refused as anywhere else.
        dispatch.args.zone_stamp()?;
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
        let zone = self
            .zones
            .command(function.name(), E::ACTIVITY_TIMING, E::EVENT_PLACEMENT);
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
