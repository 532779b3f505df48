//! The stream command buffer: every command goes to the stream as it is recorded.
//!
//! It is the immediate form, for work recorded at the moment it should run (IREE uses it to
//! replay deferred command buffers and for one-off transfers). It cannot run twice, and is not a
//! command buffer a queue submits: its work is on the stream once recorded.

use std::fmt;
use std::sync::Arc;

use cuhal_sys::{CUevent, CUstream, PrimaryContext};

use crate::arena::StableArena;
use crate::binding::Operand;
use crate::encoder::Encoder;
use crate::error::out_of_host_memory;
use crate::indirect::{Indirect, IndirectGraph, IndirectLaunch};
use crate::launch::AttributePath;
use crate::recorded::Recorded;
use crate::recorder::Recorder;
use crate::stream_ops::{self, LaunchShape};
use crate::stream_work::{self, StreamWork, StreamWorkFn};
use crate::zone_hooks::CommandZone;
use crate::{CommandRecorder, Dispatch, Error, FillPattern, ZoneRecorder};

pub(crate) struct StreamEncoder {
    context: Arc<PrimaryContext>,
    stream: CUstream,
    /// Update bytes, kept until the command buffer is dropped (the copies read them
    /// asynchronously; the owner keeps the command buffer until its work completes).
    host_bytes: StableArena,
    /// The graphs of indirect dispatches, kept until the command buffer is dropped.
    indirect_graphs: Vec<IndirectGraph>,
}

impl StreamEncoder {
    fn zone(&self, event: Option<CUevent>) -> Result<(), Error> {
        if let Some(event) = event {
            // SAFETY: the recorder's event lives as long as this command buffer; the stream is
            // live (contract of StreamCommandBuffer::new); the context is bound.
            unsafe { stream_ops::record_event(self.context.api(), self.stream, event) }?;
        }
        Ok(())
    }

    /// Binds the context, records the zone's begin, runs `op`, records the zone's end.
    fn around(
        &mut self,
        zone: CommandZone,
        op: impl FnOnce(&mut Self) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let _bound = self.context.enter()?;
        self.zone(zone.begin)?;
        op(self)?;
        self.zone(zone.end)
    }
}

impl Encoder for StreamEncoder {
    const ATTRIBUTE_PATH: AttributePath = AttributePath::Launch;
    const BINDS_STREAM_WORK: bool = false;
    // Issued as recorded, with no per-submission table: stamp arguments stay null.
    const BINDS_STAMPS: bool = false;
    // Executed as recorded, never issued by a queue: no launch capture, so events.
    const ACTIVITY_TIMING: bool = false;

    fn fill(
        &mut self,
        target: Operand,
        length: usize,
        pattern: FillPattern,
        zone: CommandZone,
    ) -> Result<(), Error> {
        // A stream command buffer has no binding capacity: the recorder let no slot through.
        let target = target.address("a stream command buffer")?;
        self.around(zone, |this| {
            // SAFETY: the range was checked against a live, retained allocation and for the
            // pattern's alignment; stream and context as above.
            unsafe { stream_ops::fill(this.context.api(), this.stream, target, length, pattern) }
        })
    }

    fn update(&mut self, target: Operand, data: &[u8], zone: CommandZone) -> Result<(), Error> {
        let target = target.address("a stream command buffer")?;
        self.around(zone, |this| {
            let source = this
                .host_bytes
                .copy(data)
                .ok_or_else(|| out_of_host_memory("update's bytes", data.len()))?;
            // SAFETY: `source` holds `data.len()` bytes that live as long as this command
            // buffer; the target range was checked and is retained.
            unsafe {
                stream_ops::update(this.context.api(), this.stream, target, source, data.len())
            }
        })
    }

    fn copy(
        &mut self,
        source: Operand,
        target: Operand,
        length: usize,
        zone: CommandZone,
    ) -> Result<(), Error> {
        let source = source.address("a stream command buffer")?;
        let target = target.address("a stream command buffer")?;
        self.around(zone, |this| {
            // SAFETY: both ranges were checked, do not overlap, and are retained.
            unsafe { stream_ops::copy(this.context.api(), this.stream, source, target, length) }
        })
    }

    fn dispatch(&mut self, dispatch: &Dispatch<'_>, zone: CommandZone) -> Result<(), Error> {
        self.around(zone, |this| {
            let mut pointers = dispatch.args.pointers();
            let params = if pointers.is_empty() {
                std::ptr::null_mut()
            } else {
                pointers.as_mut_ptr()
            };
            let shape = LaunchShape {
                grid: dispatch.grid,
                block: dispatch.block,
                shared_memory: dispatch.shared_memory_bytes,
            };
            // SAFETY: the function's module is retained; `params` points into `dispatch.args`,
            // borrowed for this call, one pointer per argument.
            unsafe {
                stream_ops::launch(
                    this.context.api(),
                    this.stream,
                    dispatch.function.raw(),
                    shape,
                    &dispatch.attributes,
                    params,
                )
            }
        })
    }

    fn dispatch_indirect(
        &mut self,
        launch: &IndirectLaunch<'_>,
        indirect: &Indirect,
        zone: CommandZone,
    ) -> Result<(), Error> {
        self.around(zone, |this| {
            let graph = IndirectGraph::new(&this.context, launch, indirect)?;
            // SAFETY: the stream is live while recording (contract of `new`) and the context
            // is bound; the graph is kept with the command buffer, which outlives its work.
            unsafe { graph.launch(this.stream) }?;
            this.indirect_graphs.push(graph);
            Ok(())
        })
    }

    fn barrier(&mut self) -> Result<(), Error> {
        // A stream runs its work in order: every command is already behind the ones before.
        Ok(())
    }

    fn stream_work(
        &mut self,
        ranges: &[(Operand, usize)],
        work: &Arc<StreamWorkFn>,
    ) -> Result<(), Error> {
        // The recorder let no slot through (BINDS_STREAM_WORK is false).
        let ranges = &stream_work::resolve(ranges, &[]);
        let _bound = self.context.enter()?;
        let on = StreamWork {
            stream: self.stream,
            ranges,
            capturing: false,
            context: &self.context,
        };
        stream_work::call(&**work, &on).map_err(Error::StreamWork)
    }

    fn zone_event(&mut self, event: CUevent) -> Result<(), Error> {
        let _bound = self.context.enter()?;
        self.zone(Some(event))
    }

    fn end(&mut self) -> Result<(), Error> {
        Ok(())
    }
}

/// A command buffer that enqueues each command on its stream as it is recorded (one shot).
///
/// It is not a [`CommandBuffer`](crate::CommandBuffer): its work is on the stream already, so
/// there is nothing a queue could submit. [`end`](Self::end) closes its tracing zone. Keep it
/// until the stream's work is done: the work reads update bytes and indirect-dispatch graphs it
/// owns, and the buffers and kernels it keeps alive.
pub struct StreamCommandBuffer {
    recorder: Recorder<StreamEncoder>,
    stream: CUstream,
    /// What `end()` moved out of the recorder, kept until the command buffer drops.
    ended: Option<(StreamEncoder, Recorded)>,
}

// SAFETY: the stream handle is only used while recording (`&mut self`); the zone recorder is
// Send + Sync.
unsafe impl Send for StreamCommandBuffer {}
// SAFETY: `&self` methods read immutable fields.
unsafe impl Sync for StreamCommandBuffer {}

impl StreamCommandBuffer {
    /// Starts recording onto `stream`.
    ///
    /// # Safety
    /// `stream` must be a live stream of `context` for as long as commands are recorded.
    pub unsafe fn new(
        context: &Arc<PrimaryContext>,
        stream: CUstream,
        zones: Option<Arc<dyn ZoneRecorder>>,
    ) -> Result<Self, Error> {
        let encoder = StreamEncoder {
            context: Arc::clone(context),
            stream,
            host_bytes: StableArena::default(),
            indirect_graphs: Vec::new(),
        };
        Ok(Self {
            recorder: Recorder::begin(
                encoder,
                Some(Arc::clone(context)),
                zones,
                Some("stream command buffer"),
            )?,
            stream,
            ended: None,
        })
    }

    /// Finishes recording (every debug group must be closed): closes the command buffer's
    /// tracing zone on the stream. Its work needs no other step to run; every later recording
    /// call is an [`Error::InvalidState`].
    pub fn end(&mut self) -> Result<(), Error> {
        self.ended = Some(self.recorder.end()?);
        Ok(())
    }

    /// The stream the commands were enqueued on.
    pub fn stream(&self) -> CUstream {
        self.stream
    }

    /// Whether the work has done what it should, once the stream has completed it: an indirect
    /// dispatch whose count was out of range (which the device recorded instead of running it)
    /// is an error here, reported once.
    pub fn check_completed(&self) -> Result<(), Error> {
        match &self.ended {
            Some((_, recorded)) => recorded.check_completed(),
            None => self.recorder.check_completed(),
        }
    }
}

crate::forward_recording::forward_recording!(StreamCommandBuffer);

impl fmt::Debug for StreamCommandBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamCommandBuffer")
            .field("state", &self.recorder.state())
            .field("stream", &self.stream)
            .finish()
    }
}
