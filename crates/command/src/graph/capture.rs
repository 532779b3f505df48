//! Capturing stream work into a graph of its own, at recording and again at launch.
//!
//! The work is captured into a scratch graph, which becomes (or replaces) one child-graph node of
//! the command buffer's graph. Capturing into the command buffer's graph directly is not safe:
//! when a capture is invalidated the driver destroys the graph captured into, also one handed to
//! `cuStreamBeginCaptureToGraph`, and with it everything recorded so far.
//!
//! Stream work that names binding slots bakes the addresses it was handed into the nodes it
//! enqueued (a library's kernel arguments are opaque to cuhal). So each executable re-captures
//! it with the addresses of a submission's table, before its first launch and whenever a slot
//! the work names is bound elsewhere than at that executable's last launch, and swaps the new
//! capture into its child node (`cuGraphExecChildGraphNodeSetParams`, which takes effect from
//! the next launch and leaves launches in flight alone).

use std::sync::Arc;

use cuhal_sys::{
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CUgraph, CUgraphExec, CUgraphNode, CUresult, DriverApi,
    PrimaryContext, Stream, cu,
};
use smallvec::SmallVec;

use crate::binding::Operand;
use crate::stream_work::{self, StreamWork, StreamWorkFn};
use crate::{BufferRange, Error};

/// A captured graph that the capture made and nobody else holds; destroyed on drop.
pub(super) struct Captured {
    graph: CUgraph,
    api: Arc<DriverApi>,
}

impl Captured {
    pub(super) fn raw(&self) -> CUgraph {
        self.graph
    }
}

impl Drop for Captured {
    fn drop(&mut self) {
        destroy_graph(&self.api, self.graph);
    }
}

/// Destroys a graph cuhal created and no longer needs; a failure leaks it and changes nothing
/// else (the graph is in no executable).
pub(super) fn destroy_graph(api: &DriverApi, graph: CUgraph) {
    // SAFETY: `graph` is a live graph created by the caller and not used afterwards.
    let _ = unsafe { cu!(api, cuGraphDestroy(graph)) };
}

/// Whether a failed `cuStreamEndCapture` ended the capture and destroyed the graph captured
/// into: an invalidated or unjoined capture ends all the same and takes the graph with it, also
/// one handed to `cuStreamBeginCaptureToGraph`.
fn ends_capture_and_graph(result: Option<CUresult>) -> bool {
    matches!(
        result,
        Some(CUresult::ERROR_STREAM_CAPTURE_INVALIDATED | CUresult::ERROR_STREAM_CAPTURE_UNJOINED)
    )
}

/// Cleans up after a `cuStreamEndCapture` that failed for another reason (the driver may not
/// have ended the capture): ends it once more, so the stream is out of capture mode, and
/// destroys the scratch graph once, whoever hands it back. The stream not capturing any more
/// (`CUDA_ERROR_ILLEGAL_STATE`) means the graph was left to us; any other failure of the second
/// end (a lost context) leaves the graph to the context's teardown, since destroying a graph a
/// stream may still capture into is not allowed.
///
/// # Safety
/// The context is current; `stream` is live; `scratch` is the graph its capture began with,
/// not used by the caller afterwards.
unsafe fn abandon_capture(api: &DriverApi, stream: &Stream, scratch: CUgraph) {
    let mut returned: CUgraph = std::ptr::null_mut();
    // SAFETY: as the caller guarantees; `returned` is a valid out-pointer.
    let again = unsafe { cu!(api, cuStreamEndCapture(stream.raw(), &mut returned)) };
    match again {
        Ok(()) if !returned.is_null() => destroy_graph(api, returned),
        Ok(()) => destroy_graph(api, scratch),
        Err(e) if ends_capture_and_graph(e.result()) => {}
        Err(e) if e.result() == Some(CUresult::ERROR_ILLEGAL_STATE) => destroy_graph(api, scratch),
        Err(_) => {}
    }
}

/// Captures `work` over `ranges` on `stream` into a new graph.
///
/// Refused with [`Error::Capture`] (the driver's complaint, the closure's error, or both) when
/// the capture cannot begin, the closure fails or panics, or the driver invalidated the capture
/// (the closure synchronized, or called something else capture forbids). Nothing is left
/// behind: the stream is no longer capturing, and the scratch graph is gone.
///
/// # Safety
/// The context is current on this thread; `stream` is a live stream of it that is not
/// capturing; the ranges are device memory the closure may name.
pub(super) unsafe fn capture(
    context: &Arc<PrimaryContext>,
    stream: &Stream,
    ranges: &[stream_work::WorkRange],
    work: &StreamWorkFn,
) -> Result<Option<Captured>, Error> {
    let api = context.api();
    if api.cuStreamBeginCaptureToGraph.is_none() {
        return Err(Error::CaptureUnsupported {
            driver_version: api.driver_version(),
        });
    }
    let mut scratch: CUgraph = std::ptr::null_mut();
    // SAFETY: valid out-pointer and flags; the context is current (caller's contract).
    unsafe { cu!(api, cuGraphCreate(&mut scratch, 0)) }?;
    // Thread-local mode: forbidden calls fail on this thread only; cuhal's own threads (and
    // other runtimes' threads) keep working while the closure runs.
    // SAFETY: the stream and the scratch graph are live; no dependencies, no edge data.
    let began = unsafe {
        cu!(
            optional: api,
            cuStreamBeginCaptureToGraph(
                stream.raw(),
                scratch,
                std::ptr::null(),
                std::ptr::null(),
                0,
                CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        )
    };
    if let Err(e) = began {
        destroy_graph(api, scratch);
        return Err(Error::Capture {
            cuda: Some(e),
            work: None,
        });
    }
    let on = StreamWork {
        stream: stream.raw(),
        ranges,
        capturing: true,
        context,
    };
    let outcome = stream_work::call(work, &on);
    let mut captured: CUgraph = std::ptr::null_mut();
    // SAFETY: the stream is capturing (begun above); `captured` is a valid out-pointer. The
    // capture is ended whatever the closure did, so the stream is usable again.
    let ended = unsafe { cu!(api, cuStreamEndCapture(stream.raw(), &mut captured)) };
    if let Err(e) = ended {
        if !captured.is_null() {
            // Handed back with the error: ours to destroy.
            destroy_graph(api, captured);
        } else if !ends_capture_and_graph(e.result()) {
            // SAFETY: the context is current, `stream` is live, `scratch` is the graph it was
            // capturing into and is not used afterwards.
            unsafe { abandon_capture(api, stream, scratch) };
        }
        return Err(Error::Capture {
            cuda: Some(e),
            work: outcome.err(),
        });
    }
    // `captured` is the scratch graph, still ours.
    let scratch = Captured {
        graph: scratch,
        api: Arc::clone(api),
    };
    if let Err(work) = outcome {
        return Err(Error::Capture {
            cuda: None,
            work: Some(work),
        });
    }
    let mut count = 0usize;
    // SAFETY: the graph is live; with a null array the driver only writes the count (a non-null
    // array needs room for at least one node).
    unsafe {
        cu!(
            api,
            cuGraphGetNodes(scratch.raw(), std::ptr::null_mut(), &mut count)
        )
    }?;
    Ok((count > 0).then_some(scratch))
}

/// Where stream work that names slots is re-captured at launch.
pub(crate) struct Recapture {
    /// The ranges as recorded (slot operands resolved with each table).
    pub(super) ranges: SmallVec<[(Operand, usize); 4]>,
    pub(super) work: Arc<StreamWorkFn>,
    pub(super) context: Arc<PrimaryContext>,
    /// The command buffer's capture stream (launches of one command buffer are serialized by
    /// its executable pool's lock, so one stream serves them all).
    pub(super) stream: Arc<Stream>,
}

impl Recapture {
    /// Captures the work again with `table`'s addresses and puts it into `node` of `exec`.
    ///
    /// A re-capture the driver refuses as the node's new child (the work enqueued something of
    /// another shape than at recording: the work's shape must not depend on the addresses) is
    /// [`Error::Capture`] naming `cuGraphExecChildGraphNodeSetParams` and its complaint.
    ///
    /// # Safety
    /// The context is current; `exec` holds `node`, a child graph node; `table` passed
    /// `BindingLayout::check` and covers the slots the work names.
    pub(super) unsafe fn patch(
        &self,
        exec: CUgraphExec,
        node: CUgraphNode,
        table: &[BufferRange],
    ) -> Result<(), Error> {
        let ranges = stream_work::resolve(&self.ranges, table);
        // SAFETY: the caller's contract; the capture stream is the command buffer's own and
        // is not capturing (every capture is ended before `capture` returns).
        let captured = unsafe { capture(&self.context, &self.stream, &ranges, &*self.work) }?;
        let Some(captured) = captured else {
            // The recording captured nodes, this capture none: not the node's shape.
            return Err(Error::Capture {
                cuda: None,
                work: Some(crate::WorkError::from_box(
                    "re-captured with a submission's bindings, the stream work enqueued nothing \
                     (at recording it enqueued work)"
                        .into(),
                )),
            });
        };
        let api = self.context.api();
        // SAFETY: `exec` holds `node` (caller's contract); the captured graph is live and the
        // driver copies it.
        unsafe {
            cu!(
                api,
                cuGraphExecChildGraphNodeSetParams(exec, node, captured.raw())
            )
        }
        .map_err(|e| Error::Capture {
            cuda: Some(e),
            work: None,
        })
    }
}
