//! [`CommandRecorder`]: the recording API every command buffer kind shares, with each
//! command's contract. [`Recorder`](crate::recorder::Recorder) implements it once; the command
//! buffer types forward to theirs with `forward_recording!`.

use std::sync::Arc;

use crate::{BufferRange, CommandBufferState, Dispatch, Error, FillPattern};

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
