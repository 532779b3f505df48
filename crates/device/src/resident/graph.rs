//! [`ResidentGraph`]: a graph command buffer instantiated for device launch, what a resident
//! queue submits. It keeps the command buffer (and so the memory and kernels its nodes use)
//! alive, and owns its executable.

use std::sync::Arc;

use cuhal_command::{CommandBuffer, CommandBufferKind};
use cuhal_resident::{ExecutableKind, Launchable, NodeKind, Refusal};
use cuhal_sys::{
    CU_GRAPH_NODE_TYPE_EMPTY, CU_GRAPH_NODE_TYPE_EVENT_RECORD, CU_GRAPH_NODE_TYPE_GRAPH,
    CU_GRAPH_NODE_TYPE_HOST, CU_GRAPH_NODE_TYPE_KERNEL, CU_GRAPH_NODE_TYPE_MEM_ALLOC,
    CU_GRAPH_NODE_TYPE_MEM_FREE, CU_GRAPH_NODE_TYPE_MEMCPY, CU_GRAPH_NODE_TYPE_MEMSET,
    CU_GRAPH_NODE_TYPE_WAIT_EVENT, CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH, CUgraph, CUgraphExec,
    CUgraphNode, PrimaryContext, Stream, cu,
};

use crate::error::{Error, Result};

/// A graph command buffer made launchable from the device
/// ([`ResidentQueue::prepare`](crate::ResidentQueue::prepare)). Submit it any number of times to
/// the queue that prepared it; the device runs one execution of it at a time.
pub struct ResidentGraph {
    context: Arc<PrimaryContext>,
    exec: CUgraphExec,
    nodes: Vec<NodeKind>,
    /// The queue that prepared it (only that one may submit it).
    owner: u64,
    _command_buffer: Arc<dyn CommandBuffer>,
}

// SAFETY: the executable is an owned driver handle, launched only by the device scheduler of
// the queue that prepared it, and destroyed once, in Drop, after every submission holding this
// graph has retired (on a loss, after the scheduler has stopped).
unsafe impl Send for ResidentGraph {}
// SAFETY: as above; `&self` hands out only the handle's value.
unsafe impl Sync for ResidentGraph {}

impl ResidentGraph {
    /// Instantiates `command_buffer` for device launch on `context`, uploading it on `stream`,
    /// or says why it cannot run on a resident queue.
    pub(crate) fn new(
        context: &Arc<PrimaryContext>,
        stream: &Stream,
        command_buffer: &Arc<dyn CommandBuffer>,
        owner: u64,
    ) -> Result<Self> {
        let refuse = |refusal: Refusal| Err(Error::Resident(refusal.into()));
        let graph = match (command_buffer.kind(), command_buffer.template_graph()) {
            (CommandBufferKind::Graph, Some(graph)) => graph,
            _ => {
                return refuse(Refusal::NotAGraph {
                    kind: ExecutableKind::Deferred,
                });
            }
        };
        if let Some(other) = command_buffer.context()
            && !Arc::ptr_eq(other, context)
        {
            return Err(Error::WrongDevice {
                what: "resident queue command buffer",
            });
        }
        if command_buffer.bindings().has_slots() {
            return refuse(Refusal::BindingSlots {
                slots: command_buffer.bindings().slots_used(),
            });
        }
        if command_buffer.checks_completion() {
            return refuse(Refusal::ChecksCompletion);
        }
        if command_buffer.zones().is_some() {
            return refuse(Refusal::Traced);
        }
        let nodes = node_kinds(context, graph)?;
        if let Some((index, &kind)) = nodes
            .iter()
            .enumerate()
            .find(|(_, kind)| !kind.device_launchable())
        {
            return refuse(Refusal::NodeKind { kind, index });
        }
        let api = context.api();
        let _bound = context.enter()?;
        let mut exec: CUgraphExec = std::ptr::null_mut();
        // SAFETY: a live graph (the command buffer, kept below, owns it); valid out-pointer.
        unsafe {
            cu!(
                api,
                cuGraphInstantiateWithFlags(
                    &mut exec,
                    graph,
                    CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH
                )
            )
        }?;
        let this = ResidentGraph {
            context: context.clone(),
            exec,
            nodes,
            owner,
            _command_buffer: command_buffer.clone(),
        };
        // SAFETY: a live executable and stream; device launch needs the upload first.
        unsafe { cu!(api, cuGraphUpload(this.exec, stream.raw())) }?;
        stream.synchronize()?;
        Ok(this)
    }

    /// The graph's node kinds.
    pub fn nodes(&self) -> &[NodeKind] {
        &self.nodes
    }

    pub(crate) fn owner(&self) -> u64 {
        self.owner
    }
}

/// The kinds of `graph`'s nodes, in the driver's order.
fn node_kinds(context: &Arc<PrimaryContext>, graph: CUgraph) -> Result<Vec<NodeKind>> {
    let api = context.api();
    let mut count = 0usize;
    // SAFETY: a live graph; a null node array asks for the count.
    unsafe {
        cu!(
            api,
            cuGraphGetNodes(graph, std::ptr::null_mut(), &mut count)
        )
    }?;
    let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); count];
    // SAFETY: `nodes` holds `count` entries.
    unsafe { cu!(api, cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count)) }?;
    nodes.truncate(count);
    nodes
        .iter()
        .map(|&node| {
            let mut kind = 0;
            // SAFETY: a live node of a live graph; valid out-pointer.
            unsafe { cu!(optional: api, cuGraphNodeGetType(node, &mut kind)) }?;
            Ok(match kind {
                CU_GRAPH_NODE_TYPE_KERNEL => NodeKind::Kernel,
                CU_GRAPH_NODE_TYPE_MEMCPY => NodeKind::Memcpy,
                CU_GRAPH_NODE_TYPE_MEMSET => NodeKind::Memset,
                CU_GRAPH_NODE_TYPE_EMPTY => NodeKind::Empty,
                CU_GRAPH_NODE_TYPE_EVENT_RECORD => NodeKind::EventRecord,
                CU_GRAPH_NODE_TYPE_WAIT_EVENT => NodeKind::EventWait,
                CU_GRAPH_NODE_TYPE_GRAPH => NodeKind::ChildGraph,
                CU_GRAPH_NODE_TYPE_HOST => NodeKind::Host,
                CU_GRAPH_NODE_TYPE_MEM_ALLOC | CU_GRAPH_NODE_TYPE_MEM_FREE => NodeKind::MemoryAlloc,
                _ => NodeKind::Other,
            })
        })
        .collect()
}

impl Launchable for ResidentGraph {
    fn kind(&self) -> ExecutableKind {
        ExecutableKind::Graph
    }
    fn nodes(&self) -> &[NodeKind] {
        &self.nodes
    }
    fn handle(&self) -> u64 {
        self.exec as u64
    }
}

impl Drop for ResidentGraph {
    fn drop(&mut self) {
        let Ok(_bound) = self.context.enter() else {
            return;
        };
        // SAFETY: a live executable, destroyed once; every submission of it has retired (each
        // held this graph until its completion word was read).
        let _ = unsafe { (self.context.api().cuGraphExecDestroy)(self.exec) };
    }
}
