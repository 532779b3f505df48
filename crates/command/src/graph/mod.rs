//! The graph command buffer: commands become nodes of a `CUgraph`, instantiated once at
//! `end()` and launched any number of times.
//!
//! Dependencies follow barriers ([`deps`]): nodes between two barriers share one dependency
//! and run concurrently; a wide group is joined by an empty node. Tracing zones are event-record
//! nodes: a command's FINE zone is a chain `begin -> command -> end` inside its group, and a
//! debug group's or the whole buffer's zone edge is a serialization point (everything before
//! it, then the event, then everything after it).

mod capture;
pub(crate) mod deps;
mod device_patch;
mod pool;

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use cuhal_sys::{
    CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC, CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC,
    CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_HOST, CU_STREAM_NON_BLOCKING,
    CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY, CUDA_MEMCPY3D, CUDA_MEMSET_NODE_PARAMS,
    CUdeviceptr, CUevent, CUgraph, CUgraphEdgeData, CUgraphNode, CUstream, PrimaryContext, Stream,
    cu,
};
use smallvec::SmallVec;

use crate::arena::StableArena;
use crate::binding::{Operand, SlotList, add_slot};
use crate::dispatch::add_dispatch_node;
use crate::encoder::Encoder;
use crate::error::out_of_host_memory;
use crate::indirect::{self, Indirect, IndirectLaunch};
use crate::launch::{AttributePath, kernel_node_params};
use crate::recorded::Recorded;
use crate::recorder::Recorder;
use crate::stream_work::{self, StreamWorkFn};
use crate::zone_hooks::CommandZone;
use crate::{
    BindingLayout, Buffer, BufferRange, CommandBuffer, CommandBufferKind, CommandEncoder,
    CommandRecorder, Dispatch, Error, Executable, FillPattern, Function, KernelArgs, ZoneRecorder,
};
use deps::Dependencies;
use device_patch::DevicePatcher;
pub use device_patch::{BINDINGS_HELPER, DEVICE_PATCH_MIN_NODES, DEVICE_PATCH_RING, PatchMethod};
pub use pool::DEFAULT_EXECUTABLE_LIMIT;
use pool::{ExecPool, PatchKind, PatchNode};

type Deps = SmallVec<[CUgraphNode; 1]>;

fn deps_ptr(deps: &[CUgraphNode]) -> *const CUgraphNode {
    if deps.is_empty() {
        std::ptr::null()
    } else {
        deps.as_ptr()
    }
}

pub(crate) struct GraphEncoder {
    context: Arc<PrimaryContext>,
    graph: CUgraph,
    /// The executables: one at `end()`, more for concurrent launches on other streams.
    pool: Mutex<ExecPool>,
    deps: Dependencies<CUgraphNode>,
    /// Update bytes: memcpy nodes keep the host address, read at every launch.
    host_bytes: StableArena,
    nodes: usize,
    /// The stream stream work is captured on, created at the first stream-work command; shared
    /// with the re-captures of stream work that names slots.
    capture_stream: Option<Arc<Stream>>,
    /// Holds device-updatable nodes (indirect dispatches).
    device_updatable: bool,
    /// A dispatch set its own priority: executables must honour node priorities.
    node_priority: bool,
    /// Nodes with slot operands, patched at launch.
    patches: Vec<PatchNode>,
    /// Device memory standing in for slots in memset and memcpy nodes until the first table
    /// (the driver wants real memory of the context there); the largest is last.
    placeholders: Vec<Arc<Buffer>>,
    /// The node of the last command added (before its FINE zone's end event).
    last_command: Option<CUgraphNode>,
    /// The copy kernel slot copies and updates run as, loaded at the first one.
    copy_kernel: Option<Function>,
    /// Update bytes of slot updates, staged in device memory at recording.
    staged: Vec<Arc<Buffer>>,
    /// How executables are given new bindings (decided at `end()`).
    patch_method: PatchMethod,
}

/// `cuhal_slot_copy(u8 *dst, const u8 *src, u64 n)`: copies `n` bytes, 16 at a time when both
/// addresses and `n` are 16-byte aligned, else byte by byte, over a grid-stride loop.
const SLOT_COPY_PTX: &str = include_str!("slot_copy.ptx");

/// The slot copy kernel's name (the fake driver runs a kernel of this name too).
pub const SLOT_COPY_KERNEL: &str = "cuhal_slot_copy";
/// Threads per block of a slot copy.
const SLOT_COPY_THREADS: u32 = 256;
/// Bytes one block of a slot copy moves per pass (16 per thread), and the most blocks.
const SLOT_COPY_BLOCK_BYTES: usize = SLOT_COPY_THREADS as usize * 16;
const SLOT_COPY_MAX_BLOCKS: usize = 1024;

impl GraphEncoder {
    fn new(context: Arc<PrimaryContext>) -> Result<Self, Error> {
        let _bound = context.enter()?;
        let api = context.api();
        let mut graph: CUgraph = std::ptr::null_mut();
        // SAFETY: `graph` is a valid out-pointer; flags must be 0.
        unsafe { cu!(api, cuGraphCreate(&mut graph, 0)) }?;
        Ok(Self {
            context,
            graph,
            pool: Mutex::new(ExecPool::new()),
            deps: Dependencies::default(),
            host_bytes: StableArena::default(),
            nodes: 0,
            capture_stream: None,
            device_updatable: false,
            node_priority: false,
            patches: Vec::new(),
            placeholders: Vec::new(),
            last_command: None,
            copy_kernel: None,
            staged: Vec::new(),
            patch_method: PatchMethod::default(),
        })
    }

    /// Adds the captured work (a complete graph) as one child-graph node after the current
    /// dependencies, and returns the node.
    fn add_captured(&mut self, captured: &capture::Captured) -> Result<CUgraphNode, Error> {
        let api = self.context.api();
        let deps: Deps = self.deps.frontier().iter().copied().collect();
        let mut node: CUgraphNode = std::ptr::null_mut();
        // SAFETY: both graphs are live; `deps` are nodes of the command buffer's graph. The
        // driver clones the child, so the captured graph may be destroyed afterwards.
        let added = unsafe {
            cu!(
                api,
                cuGraphAddChildGraphNode(
                    &mut node,
                    self.graph,
                    deps_ptr(&deps),
                    deps.len(),
                    captured.raw(),
                )
            )
        };
        // The driver may refuse a captured graph as a child (memory allocation nodes, say):
        // the command is refused and the command buffer keeps recording.
        added.map_err(|e| Error::Capture {
            cuda: Some(e),
            work: None,
        })?;
        self.nodes += 1;
        self.deps.push(node);
        Ok(node)
    }

    /// The addresses stream work is captured over at recording: its own for memory ranges;
    /// for slot ranges, disjoint placeholder memory of their length, at an address with the
    /// slot offset's alignment within 256 bytes (what a library may choose its kernels by,
    /// for a binding at an allocation's start).
    fn recording_ranges(
        &mut self,
        ranges: &[(Operand, usize)],
    ) -> Result<SmallVec<[stream_work::WorkRange; 4]>, Error> {
        const ALIGN: usize = 256;
        let place = |at: &mut usize, offset: u64, len: usize| {
            let start = *at + (offset % ALIGN as u64) as usize;
            *at = (start + len).next_multiple_of(ALIGN);
            start
        };
        let mut total = 0;
        for &(operand, len) in ranges {
            if let Operand::Slot { offset, .. } = operand {
                place(&mut total, offset, len);
            }
        }
        let base = if total > 0 {
            self.placeholder(total)?
        } else {
            0
        };
        let mut at = 0;
        Ok(ranges
            .iter()
            .map(|&(operand, len)| stream_work::WorkRange {
                ptr: match operand {
                    Operand::Address(address) => address,
                    Operand::Slot { offset, .. } => base + place(&mut at, offset, len) as u64,
                },
                len,
            })
            .collect())
    }

    /// The capture stream, created on first use (`CU_STREAM_NON_BLOCKING`: a capture must not
    /// touch the legacy stream).
    fn capture_stream(&mut self) -> Result<Arc<Stream>, Error> {
        let stream = match &self.capture_stream {
            Some(stream) => stream,
            None => self.capture_stream.insert(Arc::new(Stream::new(
                &self.context,
                CU_STREAM_NON_BLOCKING,
            )?)),
        };
        Ok(Arc::clone(stream))
    }

    /// An address of at least `bytes` bytes of device memory of the context, to record where a
    /// memset node's operand is a slot. Never written: every executable is patched
    /// before its first launch.
    fn placeholder(&mut self, bytes: usize) -> Result<CUdeviceptr, Error> {
        if let Some(last) = self.placeholders.last()
            && last.len() >= bytes
        {
            return Ok(last.device_ptr());
        }
        let size = bytes.max(self.placeholders.last().map_or(0, |b| b.len() * 2));
        let buffer = Buffer::new(&self.context, size)?;
        let address = buffer.device_ptr();
        self.placeholders.push(buffer);
        Ok(address)
    }

    /// The address to record for `operand`: its own, or placeholder memory `at` bytes in.
    fn recorded(
        &mut self,
        operand: Operand,
        at: usize,
        length: usize,
    ) -> Result<CUdeviceptr, Error> {
        match operand {
            Operand::Address(address) => Ok(address),
            Operand::Slot { .. } => Ok(self.placeholder(at + length)? + at as u64),
        }
    }

    /// Notes the last added command node as one to patch, if it names slots.
    fn note_patch(&mut self, slots: SlotList, kind: PatchKind) {
        if slots.is_empty() {
            return;
        }
        if let Some(node) = self.last_command {
            self.patches.push(PatchNode { node, slots, kind });
        }
    }

    /// Records a copy with a slot operand as a kernel node of [`SLOT_COPY_KERNEL`], whose
    /// address arguments are patched like any bound kernel argument.
    ///
    /// Memcpy nodes cannot take slots: `cuGraphExecMemcpyNodeSetParams` refuses operands whose
    /// memory is mapped otherwise than at instantiation (`CUDA_ERROR_INVALID_VALUE`), so a
    /// node recorded with `cuMemAlloc` placeholder memory can never be given stream-ordered
    /// pool memory (`Queue::alloca`), nor the reverse. Kernel arguments are opaque to the
    /// driver and take any device address.
    fn slot_copy(
        &mut self,
        source: Operand,
        target: Operand,
        length: usize,
        zone: CommandZone,
    ) -> Result<(), Error> {
        let function = match &self.copy_kernel {
            Some(f) => f.clone(),
            None => {
                let module = Executable::load_ptx(&self.context, SLOT_COPY_PTX)?;
                let f = module.function(SLOT_COPY_KERNEL)?;
                self.copy_kernel = Some(f.clone());
                f
            }
        };
        let mut args = KernelArgs::new();
        for operand in [target, source] {
            match operand {
                Operand::Address(address) => args.push(address),
                Operand::Slot { slot, offset } => args.push_binding(slot, offset),
            };
        }
        args.push(length as u64);
        let blocks = length
            .div_ceil(SLOT_COPY_BLOCK_BYTES)
            .clamp(1, SLOT_COPY_MAX_BLOCKS) as u32;
        let dispatch = Dispatch::new(&function, [blocks, 1, 1], [SLOT_COPY_THREADS, 1, 1], &args);
        self.dispatch(&dispatch, zone)
    }

    fn add_event(&mut self, deps: &[CUgraphNode], event: CUevent) -> Result<CUgraphNode, Error> {
        let api = self.context.api();
        let mut node: CUgraphNode = std::ptr::null_mut();
        // SAFETY: `node` is a valid out-pointer; `deps` are nodes of `self.graph` and the
        // slice outlives the call; the event is owned by the zone recorder, which outlives this
        // graph (contract of ZoneRecorder).
        unsafe {
            cu!(
                optional: api,
                cuGraphAddEventRecordNode(&mut node, self.graph, deps_ptr(deps), deps.len(), event)
            )
        }?;
        self.nodes += 1;
        Ok(node)
    }

    /// Adds a command node (made by `add` from its dependencies) to the current group, inside
    /// its FINE zone's chain if it has one.
    fn add_command(
        &mut self,
        zone: CommandZone,
        add: impl FnOnce(&Self, &[CUgraphNode]) -> Result<CUgraphNode, Error>,
    ) -> Result<(), Error> {
        let _bound = self.context.enter()?;
        let mut deps: Deps = self.deps.frontier().iter().copied().collect();
        if let Some(event) = zone.begin {
            let begin = self.add_event(&deps, event)?;
            deps = smallvec::smallvec![begin];
        }
        let mut tail = add(self, &deps)?;
        self.last_command = Some(tail);
        self.nodes += 1;
        if let Some(event) = zone.end {
            tail = self.add_event(&[tail], event)?;
        }
        self.deps.push(tail);
        Ok(())
    }

    fn join(&mut self) -> Result<(), Error> {
        let (graph, api) = (self.graph, self.context.api().clone());
        let mut added = 0;
        self.deps.barrier(|group| {
            let mut node: CUgraphNode = std::ptr::null_mut();
            // SAFETY: `node` is a valid out-pointer; `group` holds nodes of `graph` and
            // outlives the call.
            unsafe {
                cu!(
                    api,
                    cuGraphAddEmptyNode(&mut node, graph, group.as_ptr(), group.len())
                )
            }?;
            added += 1;
            Ok::<_, Error>(node)
        })?;
        self.nodes += added;
        Ok(())
    }
}

impl Encoder for GraphEncoder {
    const ATTRIBUTE_PATH: AttributePath = AttributePath::GraphNode;
    const BINDS_STREAM_WORK: bool = true;
    const EVENT_PLACEMENT: crate::EventPlacement = crate::EventPlacement::Graph;

    fn last_command_node(&self) -> Option<CUgraphNode> {
        self.last_command
    }

    fn fill(
        &mut self,
        target: Operand,
        length: usize,
        pattern: FillPattern,
        zone: CommandZone,
    ) -> Result<(), Error> {
        let params = CUDA_MEMSET_NODE_PARAMS {
            dst: self.recorded(target, 0, length)?,
            pitch: 0, // unused for one row
            value: pattern.value(),
            elementSize: pattern.size() as u32,
            width: length / pattern.size(),
            height: 1,
        };
        self.add_command(zone, |this, deps| {
            let api = this.context.api();
            let mut node: CUgraphNode = std::ptr::null_mut();
            // SAFETY: out-pointer valid; deps are nodes of the graph; `params` describes a
            // range checked against a live allocation (retained by the command buffer) with
            // the element alignment memset requires.
            unsafe {
                cu!(
                    api,
                    cuGraphAddMemsetNode(
                        &mut node,
                        this.graph,
                        deps_ptr(deps),
                        deps.len(),
                        &params,
                        this.context.raw()
                    )
                )
            }?;
            Ok(node)
        })?;
        let mut slots = SlotList::new();
        add_slot(&mut slots, target.slot());
        self.note_patch(slots, PatchKind::Memset { params, target });
        Ok(())
    }

    fn update(&mut self, target: Operand, data: &[u8], zone: CommandZone) -> Result<(), Error> {
        if target.slot().is_some() {
            // A slot target needs the copy kernel (see `slot_copy`), which reads device memory:
            // stage the bytes there now, kept as long as the graph.
            let staged = Buffer::new(&self.context, data.len())?;
            staged.write(0, data)?;
            let source = Operand::Address(staged.device_ptr());
            self.staged.push(staged);
            return self.slot_copy(source, target, data.len(), zone);
        }
        // The node reads the host bytes at every launch: copy them into storage whose address
        // is fixed for as long as the graph exists.
        let source = self
            .host_bytes
            .copy(data)
            .ok_or_else(|| out_of_host_memory("update's bytes", data.len()))?;
        let params = CUDA_MEMCPY3D {
            srcMemoryType: CU_MEMORYTYPE_HOST,
            srcHost: source.cast(),
            srcPitch: data.len(),
            srcHeight: 1,
            dstMemoryType: CU_MEMORYTYPE_DEVICE,
            dstDevice: self.recorded(target, 0, data.len())?,
            dstPitch: data.len(),
            dstHeight: 1,
            WidthInBytes: data.len(),
            Height: 1,
            Depth: 1,
            ..CUDA_MEMCPY3D::zeroed()
        };
        self.add_command(zone, |this, deps| add_memcpy(this, deps, &params))
    }

    fn copy(
        &mut self,
        source: Operand,
        target: Operand,
        length: usize,
        zone: CommandZone,
    ) -> Result<(), Error> {
        if source.slot().is_some() || target.slot().is_some() {
            return self.slot_copy(source, target, length, zone);
        }
        let params = CUDA_MEMCPY3D::linear_device_to_device(
            self.recorded(target, 0, length)?,
            self.recorded(source, length, length)?,
            length,
        );
        self.add_command(zone, |this, deps| add_memcpy(this, deps, &params))
    }

    fn dispatch(&mut self, dispatch: &Dispatch<'_>, zone: CommandZone) -> Result<(), Error> {
        // A programmatic dependency replaces the full edge from the dispatch before the
        // barrier (the recorder checked it is the frontier's one node, with no zone between).
        let programmatic = dispatch.attributes.programmatic && zone.begin.is_none();
        self.node_priority |= dispatch.attributes.priority.is_some();
        self.add_command(zone, |this, deps| {
            let (deps, upstream) = match deps {
                [upstream] if programmatic => (&[][..], Some(*upstream)),
                _ => (deps, None),
            };
            let api = this.context.api();
            let node = add_dispatch_node(api, this.graph, deps, dispatch)?;
            if let Some(upstream) = upstream {
                add_programmatic_edge(api, this.graph, upstream, node)?;
            }
            Ok(node)
        })?;
        let args = dispatch.args;
        if !args.bindings().is_empty() {
            let mut slots = SlotList::new();
            for b in args.bindings() {
                add_slot(&mut slots, Some(b.slot));
            }
            // The template of the node's patches: its arguments come from `bytes` at patch time.
            let params = kernel_node_params(
                dispatch.function,
                dispatch.grid,
                dispatch.block,
                dispatch.shared_memory_bytes,
                std::ptr::null_mut(),
            );
            let driver = dispatch.function.parameter_offsets();
            let param_offsets = args
                .slots()
                .iter()
                .enumerate()
                .map(|(i, slot)| {
                    driver
                        .and_then(|offsets| offsets.get(i))
                        .and_then(|&offset| u32::try_from(offset).ok())
                        .unwrap_or(slot.offset)
                })
                .collect();
            let kind = PatchKind::Kernel {
                params,
                bytes: args.bytes().into(),
                slots: args.slots().into(),
                bindings: args.bindings().into(),
                param_offsets,
            };
            self.note_patch(slots, kind);
        }
        Ok(())
    }

    fn dispatch_indirect(
        &mut self,
        launch: &IndirectLaunch<'_>,
        indirect: &Indirect,
        zone: CommandZone,
    ) -> Result<(), Error> {
        self.add_command(zone, |this, deps| {
            indirect::add_fragment(this.context.api(), this.graph, deps, launch, indirect)
        })?;
        // The helper node; `add_command` counted the dispatch node.
        self.nodes += 1;
        self.node_priority |= launch.dispatch.attributes.priority.is_some();
        self.device_updatable = true;
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), Error> {
        let _bound = self.context.enter()?;
        self.join()
    }

    fn stream_work(
        &mut self,
        ranges: &[(Operand, usize)],
        work: &Arc<StreamWorkFn>,
    ) -> Result<(), Error> {
        let context = Arc::clone(&self.context);
        if context.api().cuStreamBeginCaptureToGraph.is_none() {
            return Err(Error::CaptureUnsupported {
                driver_version: context.api().driver_version(),
            });
        }
        let _bound = context.enter()?;
        // Slot ranges have no memory yet: the recording captures the work over placeholder
        // memory, and each executable captures it again with a table's addresses before its
        // first launch (see `capture`).
        let resolved = self.recording_ranges(ranges)?;
        let stream = self.capture_stream()?;
        // SAFETY: the context is current; the capture stream is ours and not capturing; the
        // ranges are checked, retained memory or placeholder memory of their length.
        let captured = unsafe { capture::capture(&context, &stream, &resolved, &**work) }?;
        let Some(captured) = captured else {
            // Nothing captured: the dependencies of the next command stay the frontier itself.
            return Ok(());
        };
        let node = self.add_captured(&captured)?;
        let mut slots = SlotList::new();
        for (operand, _) in ranges {
            add_slot(&mut slots, operand.slot());
        }
        if !slots.is_empty() {
            self.patches.push(PatchNode {
                node,
                slots,
                kind: PatchKind::Work(Box::new(capture::Recapture {
                    ranges: ranges.iter().copied().collect(),
                    work: Arc::clone(work),
                    context,
                    stream,
                })),
            });
        }
        Ok(())
    }

    fn zone_event(&mut self, event: CUevent) -> Result<(), Error> {
        let _bound = self.context.enter()?;
        self.join()?;
        let deps: Deps = self.deps.frontier().iter().copied().collect();
        let node = self.add_event(&deps, event)?;
        self.deps.fence(node);
        Ok(())
    }

    fn set_stamp_slot(&mut self, slot: u32) {
        for patch in &mut self.patches {
            patch.set_stamp_slot(slot);
        }
    }

    fn end(&mut self) -> Result<(), Error> {
        if self.nodes == 0 {
            // Nothing to run: launching is a no-op and needs no executable graph.
            return Ok(());
        }
        let _bound = self.context.enter()?;
        let api = self.context.api();
        let flags = if self.node_priority {
            CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY
        } else {
            0
        };
        self.patches.shrink_to_fit();
        // Executables of a graph with bound kernel arguments may patch them on the device.
        let patcher = DevicePatcher::new(
            &self.context,
            self.patch_method,
            &self.patches,
            self.device_updatable,
        );
        let pool = self.pool.get_mut().unwrap_or_else(PoisonError::into_inner);
        pool.set_flags(flags);
        pool.set_patcher(patcher);
        // SAFETY: the graph is complete and not used by any other thread (recording holds
        // `&mut self`); the patch nodes are its nodes; the context is current.
        let exec =
            unsafe { pool.first_of(api, self.graph, &self.patches, slots_named(&self.patches)) }?;
        if self.device_updatable {
            // Nodes updated from inside the graph need it uploaded before the first launch, and
            // such a graph is instantiated once: its launches share that executable.
            indirect::upload(&self.context, exec)?;
            self.pool
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .set_limit(1);
        }
        Ok(())
    }
}

/// Adds `upstream -> downstream` as a programmatic edge: `downstream` may start once every
/// block of `upstream` has triggered (`griddepcontrol.launch_dependents`) or exited.
fn add_programmatic_edge(
    api: &cuhal_sys::DriverApi,
    graph: CUgraph,
    upstream: CUgraphNode,
    downstream: CUgraphNode,
) -> Result<(), Error> {
    if api.cuGraphAddDependencies_v2.is_none() {
        return Err(Error::UnsupportedAttribute {
            attribute: "programmatic",
            reason: "the driver has no typed graph edges (CUDA 12.3)",
        });
    }
    let edge = CUgraphEdgeData {
        from_port: CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC,
        to_port: 0,
        type_: CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC,
        reserved: [0; 5],
    };
    // SAFETY: both nodes are kernel nodes of `graph`; the three one-element arrays are locals
    // that outlive the call.
    unsafe {
        cu!(
            optional: api,
            cuGraphAddDependencies_v2(graph, &upstream, &downstream, &edge, 1)
        )
    }?;
    Ok(())
}

fn add_memcpy(
    this: &GraphEncoder,
    deps: &[CUgraphNode],
    params: &CUDA_MEMCPY3D,
) -> Result<CUgraphNode, Error> {
    let api = this.context.api();
    let mut node: CUgraphNode = std::ptr::null_mut();
    // SAFETY: out-pointer valid; deps are nodes of the graph; `params` describes a 1D copy
    // between a checked, retained device range and a retained device range or host bytes
    // that live as long as the graph.
    unsafe {
        cu!(
            api,
            cuGraphAddMemcpyNode(
                &mut node,
                this.graph,
                deps_ptr(deps),
                deps.len(),
                params,
                this.context.raw()
            )
        )
    }?;
    Ok(node)
}

impl Drop for GraphEncoder {
    fn drop(&mut self) {
        let Ok(_bound) = self.context.enter() else {
            return;
        };
        let api = self.context.api();
        let pool = self.pool.get_mut().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: the context is bound; `&mut self`: nothing launches any more.
        unsafe { pool.destroy(api) };
        // The capture stream (if any) drops with `self`: no capture is open on it (each is
        // ended before `stream_work` returns).
        // SAFETY: `graph` was created here and is destroyed once.
        let _ = unsafe { cu!(api, cuGraphDestroy(self.graph)) };
    }
}

/// A command buffer being recorded into a CUDA graph.
///
/// Record with [`CommandRecorder`], then [`end`](GraphCommandBuffer::end) instantiates the graph
/// (its error is returned there) and gives the [`GraphExec`] to launch or submit.
pub struct GraphCommandBuffer {
    recorder: Recorder<GraphEncoder>,
}

// SAFETY: the raw graph handles are used only through `&mut self` while recording; the zone
// recorder is Send + Sync.
unsafe impl Send for GraphCommandBuffer {}
// SAFETY: as above: no `&self` method touches the graph.
unsafe impl Sync for GraphCommandBuffer {}

impl GraphCommandBuffer {
    /// Creates an empty graph and starts recording.
    pub fn new(
        context: &Arc<PrimaryContext>,
        zones: Option<Arc<dyn ZoneRecorder>>,
    ) -> Result<Self, Error> {
        let traced = zones
            .as_ref()
            .is_some_and(|z| z.verbosity() != crate::Verbosity::Off);
        if traced && context.api().cuGraphAddEventRecordNode.is_none() {
            // Graph tracing needs event record nodes; refuse it up front, naming what is missing.
            return Err(Error::Cuda(
                context
                    .api()
                    .missing_symbol(cuhal_sys::cu_name!(cuGraphAddEventRecordNode)),
            ));
        }
        let encoder = GraphEncoder::new(Arc::clone(context))?;
        Ok(Self {
            recorder: Recorder::begin(encoder, Some(Arc::clone(context)), zones, None)?,
        })
    }

    /// Creates an empty graph whose commands may name binding slots below `capacity`
    /// ([`BufferRange::slot`], [`KernelArgs::push_binding`](crate::KernelArgs::push_binding)).
    /// Fills of slots record placeholder device memory as long as their longest range, which
    /// the graph keeps; copies and updates with a slot run as a built-in copy kernel; stream work
    /// over slots is captured over placeholder memory, and captured again with a table's
    /// addresses whenever an executable's table moves one of its slots
    /// ([`CommandRecorder::stream_work`]).
    pub fn with_bindings(
        context: &Arc<PrimaryContext>,
        zones: Option<Arc<dyn ZoneRecorder>>,
        capacity: u32,
    ) -> Result<Self, Error> {
        let mut this = Self::new(context, zones)?;
        this.recorder.set_binding_capacity(capacity)?;
        Ok(this)
    }

    /// Chooses how executables are given new bindings ([`PatchMethod::Auto`] unless set): on
    /// the host, one `cuGraphExec*NodeSetParams` per changed node, or on the device, by a helper
    /// node at the graph's head. Takes effect at [`end`](Self::end); later, it is a state error.
    pub fn set_patch_method(&mut self, method: PatchMethod) -> Result<(), Error> {
        let state = self.recorder.state();
        let Some(encoder) = self.recorder.encoder_mut() else {
            return Err(Error::InvalidState {
                operation: "choose the patch method",
                state,
            });
        };
        encoder.patch_method = method;
        Ok(())
    }

    /// The patch method chosen ([`Self::set_patch_method`]; the default once ended: see
    /// [`GraphExec::patches_on_device`] for what `end()` decided).
    pub fn patch_method(&self) -> PatchMethod {
        self.recorder
            .encoder()
            .map_or_else(PatchMethod::default, |e| e.patch_method)
    }

    /// Finishes recording (every debug group must be closed) and instantiates the graph: the
    /// returned [`GraphExec`] launches it, any number of times. This recording is left ended;
    /// an error leaves it recording (an unclosed debug group) or failed (the driver refused
    /// the graph).
    pub fn end(&mut self) -> Result<GraphExec, Error> {
        let (encoder, recorded) = self.recorder.end()?;
        Ok(GraphExec { encoder, recorded })
    }

    /// Number of graph nodes so far, including joins and zone events (0 once ended: see
    /// [`GraphExec::node_count`]).
    pub fn node_count(&self) -> usize {
        self.recorder.encoder().map_or(0, |e| e.nodes)
    }
}

crate::forward_recording::forward_recording!(GraphCommandBuffer);

impl CommandEncoder for GraphCommandBuffer {
    fn kind(&self) -> CommandBufferKind {
        CommandBufferKind::Graph
    }
    fn end(&mut self) -> Result<Arc<dyn CommandBuffer>, Error> {
        Ok(Arc::new(GraphCommandBuffer::end(self)?))
    }
}

impl fmt::Debug for GraphCommandBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphCommandBuffer")
            .field("state", &self.recorder.state())
            .field("nodes", &self.node_count())
            .finish()
    }
}

/// An ended graph command buffer: its graph, instantiated.
///
/// [`GraphExec::launch`] enqueues it on a stream, any number of times, from any thread. Share
/// it as `Arc<GraphExec>` (or `Arc<dyn CommandBuffer>` to submit it to a queue): a submission
/// holds an `Arc` until it completes, so the owner may drop theirs at any time.
///
/// Launches of one executable graph wait for each other on the GPU, whatever their streams, so
/// a launch never takes an executable that may still run from a launch on another stream: it
/// takes the one last launched on its own stream, else an idle one, else a new one,
/// instantiated then, up to [`GraphExec::set_executable_limit`] of them; only past that do
/// launches share the least recently used one ([`GraphExec::shared_launches`]).
///
/// One past the highest slot any of `patches` names: the slots an executable tracks (a table
/// may be longer; its further entries patch nothing).
fn slots_named(patches: &[PatchNode]) -> usize {
    patches
        .iter()
        .flat_map(|p| p.slots.iter())
        .map(|&slot| slot as usize + 1)
        .max()
        .unwrap_or(0)
}

/// Recorded [`with_bindings`](GraphCommandBuffer::with_bindings), it has slots, and each launch
/// takes a binding table ([`GraphExec::launch_with_bindings`]): only the nodes whose slots are
/// bound elsewhere than at that executable's last launch are patched.
pub struct GraphExec {
    encoder: GraphEncoder,
    recorded: Recorded,
}

// SAFETY: once ended the raw graph handles are used only under the executable pool's lock; the
// zone recorder is Send + Sync.
unsafe impl Send for GraphExec {}
// SAFETY: as above: no `&self` method touches the graph except under the pool's lock.
unsafe impl Sync for GraphExec {}

impl GraphExec {
    /// Whether the executables carry the helper node and may patch on the device (decided at
    /// `end()`: the method allows it, enough kernel nodes name slots, the driver has
    /// device-updatable nodes and the device a helper cubin).
    pub fn patches_on_device(&self) -> bool {
        self.pool().patches_on_device()
    }

    /// Launches that patched their kernel nodes on the device.
    pub fn device_patched_launches(&self) -> u64 {
        self.pool().device_launches()
    }

    /// The patch method the graph was ended with ([`GraphCommandBuffer::set_patch_method`]).
    pub fn patch_method(&self) -> PatchMethod {
        self.encoder.patch_method
    }

    /// Bounds the executables kept for concurrent launches on different streams (at least 1;
    /// [`DEFAULT_EXECUTABLE_LIMIT`] unless set). A graph with indirect dispatches (nodes the
    /// device updates) keeps one executable whatever the bound.
    pub fn set_executable_limit(&self, limit: usize) {
        if !self.encoder.device_updatable {
            self.pool().set_limit(limit);
        }
    }

    /// The bound on executables.
    pub fn executable_limit(&self) -> usize {
        self.pool().limit()
    }

    /// Executables instantiated so far (0 for an empty graph).
    pub fn executable_count(&self) -> usize {
        self.pool().len()
    }

    /// Launches that found every executable busy on other streams and shared one (so they may
    /// have waited for that stream's launch on the GPU): the limit was reached, or
    /// instantiating another failed.
    pub fn shared_launches(&self) -> u64 {
        self.pool().shared_launches()
    }

    /// Which executable (its index in the pool, in the order they were instantiated) was last
    /// launched on `stream`, if any: two streams showing the same index at once shared it.
    pub fn executable_on(&self, stream: CUstream) -> Option<usize> {
        self.pool().executable_on(stream)
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, ExecPool> {
        // A poisoned lock only means a launch panicked; the pool's bookkeeping is updated in
        // steps that each leave it consistent.
        self.encoder
            .pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Enqueues the graph on `stream` (`cuGraphLaunch`): after the stream's earlier work and
    /// any earlier launch of this graph. Only for a graph that recorded no binding slot (see
    /// [`Self::launch_with_bindings`]).
    ///
    /// # Safety
    /// `stream` must be a live stream of this command buffer's context, and the command buffer
    /// must not be dropped before the launched work completes (the graph reads its update bytes,
    /// buffers and kernels while it runs; a queue keeps it alive until then).
    pub unsafe fn launch(&self, stream: CUstream) -> Result<(), Error> {
        let _bound = self.encoder.context.enter()?;
        // SAFETY: the caller upholds the stream and lifetime contract; the context is current.
        unsafe { self.launch_current(stream, &[]) }
    }

    /// Enqueues the graph on `stream` with `bindings` for its slots: the executable chosen for
    /// the stream is patched where its nodes' bindings changed since its last launch, then
    /// launched.
    ///
    /// # Safety
    /// As [`Self::launch`]; and `bindings` must have passed [`BindingLayout::check`] for this
    /// context, with its memory allocated until the launched work completes (a queue holds the
    /// table's buffers until then).
    pub unsafe fn launch_with_bindings(
        &self,
        stream: CUstream,
        bindings: &[BufferRange],
    ) -> Result<(), Error> {
        let _bound = self.encoder.context.enter()?;
        // SAFETY: forwarded contract; the context is current.
        unsafe { self.launch_current(stream, bindings) }
    }

    /// [`launch_with_bindings`](Self::launch_with_bindings) on a thread where the command
    /// buffer's context is already current: one `cuCtxGetCurrent` fewer per submission. A table
    /// shorter than the slots used is refused.
    ///
    /// # Safety
    /// As [`launch_with_bindings`](Self::launch_with_bindings), and the command buffer's context
    /// is current on this thread.
    unsafe fn launch_current(
        &self,
        stream: CUstream,
        bindings: &[BufferRange],
    ) -> Result<(), Error> {
        self.recorded.check_table_length(bindings)?;
        let encoder = &self.encoder;
        let mut pool = self.pool();
        if pool.is_empty() {
            return Ok(());
        }
        let api = encoder.context.api();
        // SAFETY: the graph is live and complete (ended), the patch nodes are its nodes, the
        // context is current (the caller's contract); the pool's lock serializes launches and
        // patches; the caller guarantees the stream and the table.
        unsafe {
            pool.launch(
                api,
                encoder.graph,
                &encoder.context,
                &encoder.patches,
                stream,
                bindings,
            )
        }
    }

    /// What the recorded commands use of each binding slot.
    pub fn bindings(&self) -> &BindingLayout {
        &self.recorded.layout
    }

    /// Number of graph nodes, including joins and zone events.
    pub fn node_count(&self) -> usize {
        self.encoder.nodes
    }

    /// Number of nodes with slot operands (patched when their bindings change).
    pub fn bound_node_count(&self) -> usize {
        self.encoder.patches.len()
    }

    /// The raw graph (for inspection, e.g. `cuGraphDebugDotPrint`).
    pub fn raw_graph(&self) -> CUgraph {
        self.encoder.graph
    }
}

impl CommandBuffer for GraphExec {
    fn kind(&self) -> CommandBufferKind {
        CommandBufferKind::Graph
    }
    fn template_graph(&self) -> Option<cuhal_sys::CUgraph> {
        Some(self.raw_graph())
    }

    fn recorded(&self) -> &Recorded {
        &self.recorded
    }
    unsafe fn issue_with_bindings(
        &self,
        stream: CUstream,
        bindings: &[BufferRange],
    ) -> Result<(), Error> {
        // SAFETY: the caller upholds `issue_with_bindings`' contract: this one's, and the
        // context is current.
        unsafe { self.launch_current(stream, bindings) }
    }
}

impl fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphExec")
            .field("nodes", &self.encoder.nodes)
            .field("bound_nodes", &self.encoder.patches.len())
            .finish()
    }
}
