//! Caller-provided stream work: a closure handed a stream, recorded as one command.
//!
//! This is how library calls (a cuBLAS GEMM, an NCCL collective, another runtime's kernels, any
//! work a library enqueues on a stream it is given) go into command buffers:
//!
//! - graph command buffers *capture* the closure's work into their own graph
//!   (`cuStreamBeginCaptureToGraph`, CUDA 12.3+, in thread-local mode) after the nodes the
//!   command depends on, and make the captured nodes what later commands depend on; the closure
//!   runs at record time, and again (with a table's addresses) when a binding it names changes;
//! - deferred command buffers call the closure at every replay, on the queue's stream;
//! - stream command buffers call it at once, on their stream.
//!
//! The buffers the work touches are named when it is recorded ([`CommandRecorder::stream_work`]):
//! the command buffer checks their context and keeps them alive, and the closure reads their
//! addresses from [`StreamWork`] rather than capturing raw pointers. That is where binding
//! tables apply: a deferred replay hands the closure the addresses of the table's buffers, and a
//! graph captures the closure again, per executable, when a binding it names changes (at
//! recording, slot ranges are placeholder memory of their length).
//!
//! [`CommandRecorder::stream_work`]: crate::CommandRecorder::stream_work

use std::sync::Arc;

use crate::work_error::{StreamWorkError, WorkError};
use cuhal_sys::{CUdeviceptr, CUstream, PrimaryContext};

/// A stream-work closure: enqueue work on [`StreamWork::stream`], using the addresses in
/// [`StreamWork::ranges`]. It must only enqueue (no synchronization: under capture the driver
/// refuses it, and elsewhere it would stall the queue), and it may run on any thread. A deferred
/// replay calls it while its queue issues: a submission to that queue from inside it is refused
/// with the scheduler's `Error::Reentrant`, and a host wait inside it for work of that queue
/// would wait for itself (use a timeout).
pub type StreamWorkFn = dyn Fn(&StreamWork<'_>) -> Result<(), StreamWorkError> + Send + Sync;

/// One device range a stream-work command names, as the closure sees it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct WorkRange {
    /// The device address of the range's first byte.
    pub ptr: CUdeviceptr,
    /// The length in bytes.
    pub len: usize,
}

/// What a stream-work closure is handed.
#[derive(Debug)]
pub struct StreamWork<'a> {
    pub(crate) stream: CUstream,
    pub(crate) ranges: &'a [WorkRange],
    pub(crate) capturing: bool,
    pub(crate) context: &'a Arc<PrimaryContext>,
}

impl StreamWork<'_> {
    /// The stream to enqueue on (`cublasSetStream`, `ncclAllReduce(..., stream)`, a launch).
    /// Its context is current on the calling thread.
    pub fn stream(&self) -> CUstream {
        self.stream
    }

    /// The ranges named when the command was recorded, in that order.
    pub fn ranges(&self) -> &[WorkRange] {
        self.ranges
    }

    /// The address of range `index` (`None` past the end).
    pub fn ptr(&self, index: usize) -> Option<CUdeviceptr> {
        self.ranges.get(index).map(|r| r.ptr)
    }

    /// Whether the stream is being captured into a graph (graph command buffers): the work runs
    /// at every launch of the graph, not now.
    pub fn is_capturing(&self) -> bool {
        self.capturing
    }

    /// The context of the stream.
    pub fn context(&self) -> &Arc<PrimaryContext> {
        self.context
    }
}

/// The ranges as addresses: slot operands resolved with `table` (empty for kinds without
/// bindings, whose recorder lets no slot through). Inline up to four ranges: no allocation.
pub(crate) fn resolve(
    ranges: &[(crate::binding::Operand, usize)],
    table: &[crate::BufferRange],
) -> smallvec::SmallVec<[WorkRange; 4]> {
    ranges
        .iter()
        .map(|&(operand, len)| WorkRange {
            ptr: operand.resolve(table),
            len,
        })
        .collect()
}

/// Calls `work`, turning an error or a panic into a [`WorkError`].
pub(crate) fn call(work: &StreamWorkFn, on: &StreamWork<'_>) -> Result<(), WorkError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(on))) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(WorkError::from_box(e)),
        Err(_) => Err(WorkError::panicked()),
    }
}
