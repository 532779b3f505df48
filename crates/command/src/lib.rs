//! Command recording for cuhal: what users record once and replay many times.
//!
//! The pieces, in the order a program meets them:
//! - [`Buffer`] and [`HostBuffer`]: device and pinned host allocations; [`BufferRange`]: a
//!   checked `(offset, length)` of a buffer. Every range is checked against its buffer when
//!   made, and each command checks what it adds (alignment, lengths, overlap, context) when
//!   recorded, with an [`Error`] that carries the numbers.
//! - [`Executable`]: a module loaded from PTX (compiled by the driver's JIT; a compile error
//!   carries the JIT's log) or cubin; [`Function`]: one kernel and its attributes.
//! - [`CommandRecorder`]: the recording API every command buffer shares: fill (1, 2 or 4 byte
//!   patterns), update (host bytes copied at record time), copy, dispatch ([`Dispatch`] with
//!   [`KernelArgs`] packed at their ABI alignment), execution barrier, debug groups, `end()`.
//!   Commands are validated before they reach the driver; a rejected command records nothing.
//! - Three kinds of command buffer. Two end in a [`CommandBuffer`], the only type a queue
//!   submits (the device crate holds it as `Arc<dyn CommandBuffer>` and
//!   [`issue`](CommandBuffer::issue)s it onto its queue's stream), as wgpu-hal's
//!   `end_encoding` turns an encoder into a command buffer:
//!   - [`GraphCommandBuffer`]: a `CUgraph` whose nodes between barriers run concurrently;
//!     `end()` instantiates it once and returns a [`GraphExec`], launched any number of times
//!     (`cuGraphLaunch`);
//!   - [`DeferredCommandBuffer`]: recorded into an arena without touching the GPU; `end()`
//!     returns a [`DeferredExec`], replayed onto a stream at every issue;
//!   - [`StreamCommandBuffer`]: each command goes to a stream as it is recorded (one shot); its
//!     `end()` returns nothing to submit.
//!
//!   [`CommandEncoder`] is the first two behind one object type (`Box<dyn CommandEncoder>`),
//!   whose `end()` returns `Arc<dyn CommandBuffer>`.
//! - Stream work ([`CommandRecorder::stream_work`]): a closure handed a stream, for library
//!   calls (cuBLAS, NCCL, another runtime's kernels): captured into a graph command buffer's
//!   graph, called at every replay of a deferred one, called at once by a stream one.
//! - Binding tables ([`BindingLayout`]): a graph or deferred command buffer created with a
//!   binding capacity records [`BufferRange::slot`] ranges and [`KernelArgs::push_binding`]
//!   arguments instead of memory, and each issue passes a table of ranges for its slots
//!   ([`CommandBuffer::issue_with_bindings`]): one recording replayed on new buffers every time.
//! - [`ZoneRecorder`]: the hook `cuhal-trace` implements to time command buffers with GPU
//!   events (zones at debug groups, and around each command at [`Verbosity::Fine`]). Without
//!   one, tracing costs a branch per command.
//!
//! A command buffer keeps every buffer and function it records alive until it is dropped, and
//! the queue keeps the command buffer until its submissions complete, so nothing recorded is
//! freed under running work.
//!
//! ```no_run
//! use std::sync::Arc;
//! use cuhal_command::*;
//! use cuhal_sys::cu;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let (context, stream): (Arc<cuhal_sys::PrimaryContext>, cuhal_sys::CUstream) = todo!();
//! let data = Buffer::new(&context, 1024)?;
//! let mut cb = GraphCommandBuffer::new(&context, None)?;
//! cb.fill(&data.range(0, 512)?, FillPattern::U32(7))?;
//! cb.update(&data.range(512, 4)?, &[1, 2, 3, 4])?;
//! cb.barrier()?;
//! cb.copy(&data.range(0, 256)?, &data.range(768, 256)?)?;
//! let cb: Arc<dyn CommandBuffer> = Arc::new(cb.end()?);
//! let _current = context.enter()?;
//! // SAFETY: `stream` is a live stream of `context`, which is current, and `cb` lives until the
//! // stream is synchronized below.
//! unsafe {
//!     cb.issue(stream)?;
//!     cb.issue(stream)?; // graphs and deferred buffers run again on every issue
//! }
//! let api = context.api();
//! // SAFETY: `stream` is live; waits for both launches before `cb` and `data` can drop.
//! unsafe { cu!(api, cuStreamSynchronize(stream)) }?;
//! # Ok(()) }
//! ```
//!
//! Only an ended graph or deferred command buffer is a [`CommandBuffer`]:
//!
//! ```
//! # use std::sync::Arc;
//! # use cuhal_command::*;
//! fn submittable(graph: GraphExec, deferred: DeferredExec) -> [Arc<dyn CommandBuffer>; 2] {
//!     [Arc::new(graph), Arc::new(deferred)]
//! }
//! ```
//!
//! A recording that has not ended cannot be submitted (or issued):
//!
//! ```compile_fail,E0277
//! # use std::sync::Arc;
//! # use cuhal_command::*;
//! fn submittable(recording: GraphCommandBuffer) -> Arc<dyn CommandBuffer> {
//!     Arc::new(recording)
//! }
//! ```
//!
//! ```compile_fail,E0277
//! # use std::sync::Arc;
//! # use cuhal_command::*;
//! fn submittable(recording: DeferredCommandBuffer) -> Arc<dyn CommandBuffer> {
//!     Arc::new(recording)
//! }
//! ```
//!
//! and neither can a stream command buffer, ended or not: its work ran as it was recorded.
//!
//! ```compile_fail,E0277
//! # use std::sync::Arc;
//! # use cuhal_command::*;
//! fn submittable(mut stream: StreamCommandBuffer) -> Arc<dyn CommandBuffer> {
//!     stream.end().unwrap();
//!     Arc::new(stream)
//! }
//! ```

mod arena;
mod barrier_groups;
mod binding;
mod binding_error;
mod bounds;
mod buffer;
mod capabilities;
mod command_recorder;
mod deferred;
mod device_ptr;
mod dispatch;
mod encoder;
mod error;
mod executable;
mod fill_pattern;
mod forward_recording;
mod graph;
mod image;
mod indirect;
mod kernel_args;
mod launch;
mod param_count;
mod range;
mod recorded;
mod recorder;
mod retained;
mod state;
mod stream;
mod stream_ops;
mod stream_work;
pub mod testing;
pub use stream_ops::fill as enqueue_fill;
mod trace_hook;
mod work_error;
mod zone_hooks;

pub use binding::{BindingLayout, MAX_BINDING_CAPACITY};
pub use binding_error::BindingError;
pub use buffer::{Buffer, HostAccess, HostBuffer, HostBufferUse, WorkDone};
pub use command_recorder::CommandRecorder;
pub use deferred::{DeferredCommandBuffer, DeferredExec};
pub use device_ptr::DevicePtr;
pub use dispatch::Dispatch;
pub use error::Error;
pub use executable::{Executable, Function, FunctionAttributes, MAX_PARAMETER_BYTES};
pub use fill_pattern::FillPattern;
pub use graph::{
    BINDINGS_HELPER, DEFAULT_EXECUTABLE_LIMIT, DEVICE_PATCH_MIN_NODES, DEVICE_PATCH_RING,
    GraphCommandBuffer, GraphExec, PatchMethod,
};
pub use image::check_image;
pub use indirect::{INDIRECT_COUNT_BYTES, INDIRECT_HELPER, INDIRECT_HELPER_DIR_ENV};
pub use kernel_args::{ArgBinding, ArgSlot, KernelArg, KernelArgs, ZONE_STAMP_BYTES};
pub use launch::{LaunchAttributes, MAX_NON_PORTABLE_CLUSTER, MAX_PORTABLE_CLUSTER};
pub use param_count::{ParameterCounts, cubin_parameter_counts, ptx_parameter_counts};
pub use range::BufferRange;
use recorded::Recorded;
pub use state::CommandBufferState;
pub use stream::StreamCommandBuffer;
pub use stream_work::{StreamWork, StreamWorkFn, WorkRange};
pub use trace_hook::{CommandTiming, EventPlacement, Verbosity, ZoneInfo, ZoneRecorder};
pub use work_error::{StreamWorkError, WorkError};

use std::sync::Arc;

use cuhal_sys::{CUstream, PrimaryContext};

/// Which kind a command buffer is.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum CommandBufferKind {
    /// [`GraphCommandBuffer`].
    Graph,
    /// [`StreamCommandBuffer`].
    Stream,
    /// [`DeferredCommandBuffer`].
    Deferred,
}

/// A command buffer a queue can submit: what `end()` of a graph or deferred command buffer
/// returns ([`GraphExec`], [`DeferredExec`]), shared as `Arc<dyn CommandBuffer>`. A recording
/// that has not ended is not one, and neither is a stream command buffer (its work ran as it
/// was recorded), so neither can be submitted.
pub trait CommandBuffer: Send + Sync {
    /// The kind ([`CommandBufferKind::Graph`] or [`CommandBufferKind::Deferred`]).
    fn kind(&self) -> CommandBufferKind;

    /// What the command buffer keeps of its recording (the methods below that do not issue
    /// read it). Only this crate's command buffers have one.
    #[doc(hidden)]
    fn recorded(&self) -> &Recorded;

    /// [`CommandBuffer::issue`] with `bindings` giving memory to the slots the command buffer
    /// recorded: a graph patches its executable's nodes whose bindings changed since that
    /// executable's last launch, a deferred buffer substitutes the addresses as it replays. A
    /// command buffer without slots takes only an empty table (and then is `issue`).
    ///
    /// # Safety
    /// As [`CommandBuffer::issue`]; and `bindings` must have passed
    /// [`BindingLayout::check`] against [`CommandBuffer::bindings`] for the stream's context,
    /// with its memory allocated until the issued work completes. A table too short for the
    /// slots used is refused rather than read out of bounds.
    unsafe fn issue_with_bindings(
        &self,
        stream: CUstream,
        bindings: &[BufferRange],
    ) -> Result<(), Error>;

    /// Enqueues the recorded work on `stream`, after the stream's earlier work, any number of
    /// times: a graph with `cuGraphLaunch`, a deferred buffer by replaying every command.
    ///
    /// # Safety
    /// `stream` must be a live stream of the command buffer's context (a dangling stream handle
    /// is not something the driver can be relied on to reject), and the command buffer must not
    /// be dropped before the issued work completes: the work reads the bytes, buffers and
    /// kernels it owns. A queue keeps the command buffer alive until then. The command buffer's
    /// context must be current on the calling thread: a queue makes it current once per
    /// submission, and a graph launch does not check it again.
    unsafe fn issue(&self, stream: CUstream) -> Result<(), Error> {
        // SAFETY: forwarded contract; an empty table is what a buffer without slots takes.
        unsafe { self.issue_with_bindings(stream, &[]) }
    }

    /// Called by the queue when a submission of this command buffer completed without a driver
    /// error: an error here (an indirect dispatch whose count was out of range, which the device
    /// recorded instead of running it) fails that submission. Reported once; a failure of a
    /// later submission that completed in the same batch is reported with the first.
    fn check_completed(&self) -> Result<(), Error> {
        self.recorded().check_completed()
    }

    /// Whether [`check_completed`](CommandBuffer::check_completed) can fail (the command buffer
    /// recorded an indirect dispatch). The queue then signals a submission only after checking
    /// it, never straight from its completion event.
    fn checks_completion(&self) -> bool {
        self.recorded().checks_completion()
    }

    /// What the recorded commands use of each binding slot: check a table against it
    /// ([`BindingLayout::check`]) before issuing with it.
    fn bindings(&self) -> &BindingLayout {
        &self.recorded().layout
    }

    /// The zone recorder given at creation, so the queue's tracer can collect the zones of
    /// each submission.
    fn zones(&self) -> Option<&Arc<dyn ZoneRecorder>> {
        self.recorded().zones.as_ref()
    }

    /// Every buffer the recorded commands use (raw ranges aside), so that a queue can check
    /// each one at submission: that it belongs to the queue's device and is still allocated.
    fn buffers(&self) -> &[Arc<Buffer>] {
        self.recorded().retained.buffers()
    }

    /// The graph a graph command buffer was recorded into (its template: a queue instantiates it
    /// into the executables it launches; a resident queue, for device launch). `None` for a
    /// deferred command buffer. The graph lives as long as the command buffer.
    fn template_graph(&self) -> Option<cuhal_sys::CUgraph> {
        None
    }

    /// The context the command buffer records for; `None` for a deferred buffer that recorded
    /// nothing that names one (it can only be issued if it recorded nothing at all, not even
    /// tracing zones).
    fn context(&self) -> Option<&Arc<PrimaryContext>> {
        self.recorded().context()
    }
}

/// A recording that ends in a [`CommandBuffer`]: graph and deferred command buffers, as a queue
/// hands them out (`Box<dyn CommandEncoder>`). Record through [`CommandRecorder`], then
/// [`end`](CommandEncoder::end) (as wgpu-hal's `end_encoding`) gives the command buffer to
/// submit. [`StreamCommandBuffer`] is not one: it runs as it records.
pub trait CommandEncoder: CommandRecorder + Send + Sync {
    /// The kind of command buffer `end()` returns.
    fn kind(&self) -> CommandBufferKind;

    /// Finishes recording (every debug group must be closed) and returns the command buffer to
    /// submit, any number of times. The recording is left ended: every later call on it is an
    /// [`Error::InvalidState`]. An error (an unclosed debug group) leaves it recording, or
    /// (a driver failure, e.g. instantiating the graph) failed.
    fn end(&mut self) -> Result<Arc<dyn CommandBuffer>, Error>;
}

#[cfg(test)]
mod tests;

/// The README's examples, compiled (and run where they need no GPU) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
