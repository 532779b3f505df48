//! Graphs: nodes with dependencies, checked at instantiation, run in dependency order at
//! launch.
//!
//! Memset and memcpy nodes move bytes, event-record nodes record, event-wait nodes check their
//! event still exists, and kernel nodes (which a CPU cannot run) are counted per function,
//! like `cuLaunchKernel`. An executable graph is a snapshot: later edits of its graph do not
//! change it, as in CUDA.
// Functions carry the driver's names so a reader can match them to cuda.h.
#![allow(non_snake_case)]

use std::collections::{HashSet, VecDeque};
use std::ffi::{c_int, c_uint, c_void};

use cuhal_sys::{
    CU_GRAPH_DEPENDENCY_TYPE_DEFAULT, CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC,
    CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC, CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE,
    CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_UNIFIED, CUDA_KERNEL_NODE_PARAMS,
    CUDA_MEMCPY3D, CUDA_MEMSET_NODE_PARAMS, CUcontext, CUevent, CUgraph, CUgraphEdgeData,
    CUgraphExec, CUgraphNode, CUlaunchAttributeID, CUlaunchAttributeValue, CUstream,
};

use crate::entry::{Status, ensure, entry, put};
use crate::memory::fill;
use crate::module::KernelCall;
use crate::status;
use crate::transfer::End;
use crate::world::{World, handle, host_address, id, lookup, lookup_mut, world};

/// One end of a memcpy node, remembered as integers (host addresses with exposed provenance).
#[derive(Copy, Clone, Debug)]
enum Place {
    Device(u64),
    Host(usize),
    Unified(u64),
}

impl Place {
    fn end(self) -> End {
        match self {
            Place::Device(address) => End::Device(address),
            Place::Host(address) => End::Host(std::ptr::with_exposed_provenance_mut(address)),
            Place::Unified(address) => End::Unified(address),
        }
    }
}

/// A memcpy node: `depth` slices of `height` rows of `width` bytes.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Copy3d {
    source: Place,
    source_offset: usize,
    source_pitch: usize,
    source_height: usize,
    target: Place,
    target_offset: usize,
    target_pitch: usize,
    target_height: usize,
    width: usize,
    height: usize,
    depth: usize,
}

/// What a node does.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    Kernel {
        function: usize,
        grid: [c_uint; 3],
        block: [c_uint; 3],
        shared: c_uint,
        /// Set through `cuGraphKernelNodeSetAttribute`.
        device_updatable: bool,
        /// The arguments of a kernel the fake runs.
        call: Option<KernelCall>,
    },
    Memset {
        params: CUDA_MEMSET_NODE_PARAMS,
    },
    Memcpy(Copy3d),
    Empty,
    EventRecord {
        event: usize,
    },
    EventWait {
        event: usize,
    },
    IndirectApply(IndirectApply),
    BindingsApply(BindingsApply),
    /// cuhal's resident scheduler kernel, emulated when its graph is launched.
    ResidentSchedule(crate::resident::ResidentSchedule),
    /// A child graph node: the child's operations, cloned in dependency order when added.
    Child(Vec<Op>),
    /// A NCCL collective captured into the graph (see `nccl.rs`): it waits for the other
    /// ranks, so a graph holding one runs on a thread of its own when launched.
    Nccl(crate::nccl::CapturedRound),
}

impl Op {
    /// Whether the operation is, or holds, a captured NCCL collective.
    fn has_nccl(&self) -> bool {
        match self {
            Op::Nccl(_) => true,
            Op::Child(ops) => ops.iter().any(Op::has_nccl),
            _ => false,
        }
    }
}

/// Launches of graphs holding NCCL collectives still running on their own threads, with the
/// address of the stream each was launched on.
static IN_FLIGHT: std::sync::Mutex<Vec<(usize, std::thread::JoinHandle<()>)>> =
    std::sync::Mutex::new(Vec::new());

/// Waits for the launches in flight on `stream` (every stream: `None`) to finish. Every driver
/// entry but `cuGraphLaunch` (which settles only its own stream) and NCCL's calls does this
/// first, so the fake stays a synchronous GPU for everything else: a program that waits on the
/// host for a collective whose peers it has not launched yet hangs here as it would on GPUs.
pub(crate) fn settle(stream: Option<usize>) {
    let running: Vec<std::thread::JoinHandle<()>> = {
        let mut in_flight = IN_FLIGHT.lock().unwrap_or_else(|e| e.into_inner());
        let (mine, others) = std::mem::take(&mut *in_flight)
            .into_iter()
            .partition(|(s, _)| stream.is_none_or(|wanted| *s == wanted));
        *in_flight = others;
        mine.into_iter().map(|(_, handle)| handle).collect()
    };
    for handle in running {
        // The thread catches its own panics; a join error cannot happen.
        let _ = handle.join();
    }
}

/// Runs a launched graph's operations holding NCCL collectives, in order, on the calling
/// thread (a launch's own): the world is locked per operation, never across a collective,
/// which waits for the other ranks' launches.
fn run_launched(ops: &[Op]) -> Status {
    for op in ops {
        match op {
            Op::Nccl(round) => round.run()?,
            Op::Child(ops) => run_launched(ops)?,
            op => world().run(op)?,
        }
    }
    Ok(())
}

impl Op {
    /// A kernel node of this shape, not device-updatable.
    pub(crate) fn kernel(
        function: usize,
        grid: [c_uint; 3],
        block: [c_uint; 3],
        shared: c_uint,
    ) -> Self {
        Op::Kernel {
            function,
            grid,
            block,
            shared,
            device_updatable: false,
            call: None,
        }
    }

    /// The kernel node with the arguments of a kernel the fake runs.
    pub(crate) fn with_call(mut self, new: Option<KernelCall>) -> Self {
        if let Op::Kernel { call, .. } = &mut self {
            *call = new;
        }
        self
    }
}

/// The name of cuhal's indirect-dispatch helper kernel, which the fake runs (emulated by the
/// graph's `IndirectApply` node).
pub const INDIRECT_HELPER: &str = "cuhal_indirect_apply";

/// A node of cuhal's indirect-dispatch helper, emulated: it reads three counts from device
/// memory and updates its device-updatable target node in the executable graph, as the real
/// helper does on the GPU with the device runtime (zero count: disabled; over the limits or not
/// a multiple of the cluster: disabled and the failure recorded in `status`).
#[derive(Copy, Clone, Debug)]
pub(crate) struct IndirectApply {
    function: usize,
    counts: u64,
    node: usize,
    max: [u32; 3],
    cluster: [u32; 3],
    status: u64,
    index: u32,
}

impl IndirectApply {
    /// Reads the helper's arguments (its parameter list in `indirect.cu`).
    ///
    /// # Safety
    /// `params` holds ten pointers, each to a value of that parameter's size.
    unsafe fn read(function: usize, params: *mut *mut c_void) -> Result<Self, c_int> {
        ensure(!params.is_null(), status::INVALID_VALUE)?;
        // SAFETY: the caller's contract: ten pointers to values of the parameters' sizes.
        unsafe {
            let arg = |i: usize| *params.add(i);
            let u64_at = |i: usize| arg(i).cast::<u64>().read_unaligned();
            let u32_at = |i: usize| arg(i).cast::<u32>().read_unaligned();
            Ok(Self {
                function,
                counts: u64_at(0),
                node: u64_at(1) as usize,
                max: [u32_at(2), u32_at(3), u32_at(4)],
                cluster: [u32_at(5), u32_at(6), u32_at(7)],
                status: u64_at(8),
                index: u32_at(9),
            })
        }
    }
}

/// The name of cuhal's binding-table patch helper kernel, which the fake runs (emulated by the
/// graph's `BindingsApply` node).
pub const BINDINGS_HELPER: &str = "cuhal_bindings_apply";

/// Bytes of one patch of the bindings helper: device node, parameter offset, 8-byte value.
pub const BINDINGS_PATCH_BYTES: usize = 24;

/// A node of cuhal's binding-table patch helper, emulated: it reads `count` patches from
/// (host-mapped) memory and writes each 8-byte value into its device-updatable kernel node's
/// parameters in the executable graph, then writes 1 to `done`, as the real helper does on the
/// GPU with the device runtime. A patch of a node that is not a device-updatable kernel node of
/// the executable, or past its parameters, writes 2 + `CUDA_ERROR_INVALID_VALUE` to `done` and
/// fails the launch (the real helper traps).
#[derive(Copy, Clone, Debug)]
pub(crate) struct BindingsApply {
    function: usize,
    patches: u64,
    count: u32,
    done: u64,
}

impl BindingsApply {
    /// Reads the helper's arguments (`patches`, `count`, `done` in `bindings.cu`).
    ///
    /// # Safety
    /// `params` holds three pointers, to a u64, a u32 and a u64.
    unsafe fn read(function: usize, params: *mut *mut c_void) -> Result<Self, c_int> {
        ensure(!params.is_null(), status::INVALID_VALUE)?;
        // SAFETY: the caller's contract: three pointers to values of the parameters' sizes.
        unsafe {
            let arg = |i: usize| *params.add(i);
            Ok(Self {
                function,
                patches: arg(0).cast::<u64>().read_unaligned(),
                count: arg(1).cast::<u32>().read_unaligned(),
                done: arg(2).cast::<u64>().read_unaligned(),
            })
        }
    }
}

/// One node and the nodes it depends on.
#[derive(Debug)]
struct Node {
    id: usize,
    op: Op,
    deps: Vec<usize>,
}

/// A graph under construction.
#[derive(Debug, Default)]
pub(crate) struct Graph {
    nodes: Vec<Node>,
    /// For a clone (`cuGraphClone`): each original node and its copy here.
    cloned: Vec<(usize, usize)>,
}

/// An instantiated graph: its operations (with their node ids) in an order that respects every
/// dependency, and the device-side updates of its device-updatable nodes.
#[derive(Debug)]
pub(crate) struct Exec {
    pub(crate) order: Vec<(usize, Op)>,
    /// Kernel nodes disabled from the device, and grids set from the device.
    disabled: HashSet<usize>,
    /// Whether `cuGraphUpload` ran (needed before the first launch when the graph updates its
    /// own nodes from the device, and before any launch from the device).
    pub(crate) uploaded: bool,
    /// Instantiated with `CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH`.
    pub(crate) device_launch: bool,
    /// The graph it was instantiated from, when that holds device-updatable kernel nodes: such
    /// a graph has at most one executable at a time.
    updatable_source: Option<usize>,
    /// Its last launch: the stream, and when that launch completes on the model clock.
    last_launch: Option<(usize, std::time::Instant)>,
    /// Set when its parameters were changed while its last launch was still running: the
    /// stream of that launch (a later launch elsewhere then ran with parameters changed for it
    /// while the other stream's launch was in flight).
    patched_in_flight_on: Option<usize>,
}

impl Exec {
    /// The stream of its launch still running on the model clock, if any.
    fn running_on(&self) -> Option<usize> {
        self.last_launch
            .filter(|&(_, done)| done > std::time::Instant::now())
            .map(|(stream, _)| stream)
    }
}

/// One `cuGraphLaunch`: which executable went to which stream, and whether that executable
/// was still running (on the model clock) from a launch on another stream.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct GraphLaunch {
    /// The `CUgraphExec`, as an address.
    pub exec: usize,
    /// The `CUstream`, as an address.
    pub stream: usize,
    /// 1 if a launch of the executable on another stream had not completed yet.
    pub running_elsewhere: u8,
    /// 1 if the executable's parameters were changed while a launch of it on another stream
    /// had not completed.
    pub patched_while_running_elsewhere: u8,
}

impl World {
    /// Completes every graph launch now (see [`World::finish_work`]).
    pub(crate) fn finish_graph_launches(&mut self) {
        let now = std::time::Instant::now();
        for exec in self.execs.values_mut() {
            if let Some((_, done)) = exec.last_launch.as_mut() {
                *done = (*done).min(now);
            }
        }
    }

    /// Runs one node's operation.
    pub(crate) fn run(&mut self, op: &Op) -> Status {
        match *op {
            Op::Kernel { function, call, .. } => {
                let name = lookup(&self.functions, function)?.name.clone();
                if let Some(call) = call {
                    self.run_call(call)?;
                }
                *self.launches.entry(name).or_insert(0) += 1;
            }
            Op::Memset { params } => {
                let size = params.elementSize as usize;
                for row in 0..params.height {
                    let start = params.dst + (row * params.pitch) as u64;
                    let span = self.device_span(start, params.width * size)?;
                    // SAFETY: `span` holds `width` elements inside a live allocation.
                    unsafe { fill(span, params.value, size, params.width) };
                }
            }
            Op::Memcpy(c) => {
                for z in 0..c.depth {
                    for y in 0..c.height {
                        let source = c.source_offset + (z * c.source_height + y) * c.source_pitch;
                        let target = c.target_offset + (z * c.target_height + y) * c.target_pitch;
                        // SAFETY: host ends were vouched for when the node was added and must
                        // stay valid while the graph can launch (cuda.h's contract).
                        unsafe {
                            self.copy(offset(c.target, target), offset(c.source, source), c.width)
                        }?;
                    }
                }
            }
            Op::Empty => {}
            Op::EventRecord { event } => self.record(event, std::time::Instant::now())?,
            Op::EventWait { event } => lookup(&self.events, event).map(drop)?,
            Op::IndirectApply(_) | Op::BindingsApply(_) | Op::ResidentSchedule(_) | Op::Nccl(_) => {
                return Err(status::INVALID_VALUE);
            }
            Op::Child(ref ops) => {
                for op in ops {
                    self.run(op)?;
                }
            }
        }
        Ok(())
    }

    /// Runs the indirect-dispatch helper: updates `disabled` for its target node.
    fn apply_indirect(&mut self, apply: &IndirectApply, disabled: &mut HashSet<usize>) -> Status {
        let name = lookup(&self.functions, apply.function)?.name.clone();
        *self.launches.entry(name).or_insert(0) += 1;
        let counts = self.mapped_span(apply.counts, 12)?;
        // SAFETY: 12 bytes of a live allocation (checked above).
        let count: [u32; 3] =
            std::array::from_fn(|i| unsafe { counts.cast::<u32>().add(i).read_unaligned() });
        if count.contains(&0) {
            disabled.insert(apply.node);
            return Ok(());
        }
        let over = count.iter().zip(apply.max).any(|(&c, m)| c > m);
        let untiled = count
            .iter()
            .zip(apply.cluster)
            .any(|(&c, k)| k == 0 || c % k != 0);
        if over || untiled {
            disabled.insert(apply.node);
            let status = self.mapped_span(apply.status, 16)?.cast::<u32>();
            // SAFETY: 16 bytes of a live (host-mapped) allocation, checked above.
            unsafe {
                if status.read() == 0 {
                    status.write(apply.index + 1);
                    for (i, c) in count.iter().enumerate() {
                        status.add(i + 1).write(*c);
                    }
                }
            }
            return Ok(());
        }
        disabled.remove(&apply.node);
        Ok(())
    }

    /// Runs the bindings helper: writes each patch into its node's parameters in `order` (the
    /// executable's operations), then marks the list consumed.
    fn apply_bindings(&mut self, apply: &BindingsApply, order: &mut [(usize, Op)]) -> Status {
        let name = lookup(&self.functions, apply.function)?.name.clone();
        *self.launches.entry(name).or_insert(0) += 1;
        let count = apply.count as usize;
        let list = self.mapped_span(apply.patches, (count * BINDINGS_PATCH_BYTES).max(1))?;
        let done = self.mapped_span(apply.done, 4)?.cast::<u32>();
        let mut failed = false;
        for i in 0..count {
            // SAFETY: `count` patches of 24 bytes lie in a live allocation (checked above).
            let (node, offset, value) = unsafe {
                let at = list.add(i * BINDINGS_PATCH_BYTES);
                (
                    at.cast::<u64>().read_unaligned() as usize,
                    at.add(8).cast::<u64>().read_unaligned() as usize,
                    at.add(16).cast::<u64>().read_unaligned(),
                )
            };
            let target = order.iter_mut().find(|(id, _)| *id == node);
            let Some((
                _,
                Op::Kernel {
                    function,
                    device_updatable: true,
                    call,
                    ..
                },
            )) = target
            else {
                failed = true;
                break;
            };
            // The helper writes an 8-byte address: it must land on an 8-byte parameter, at the
            // offset the driver gives it (anything else overwrites other arguments' bytes).
            let parameters = &lookup(&self.functions, *function)?.parameters;
            if !parameters
                .iter()
                .any(|&(at, size)| at == offset && size == 8)
            {
                failed = true;
                break;
            }
            if let Some(call) = call
                && call.patch(offset, value).is_err()
            {
                failed = true;
                break;
            }
        }
        let word = if failed {
            2 + status::INVALID_VALUE as u32
        } else {
            1
        };
        // SAFETY: 4 bytes of a live (host-mapped) allocation, checked above.
        unsafe { done.write_volatile(word) };
        // The real helper traps: a sticky launch failure.
        ensure(!failed, status::LAUNCH_FAILED)
    }

    /// Checks that what `op` refers to still exists.
    pub(crate) fn check(&self, op: &Op) -> Status {
        match *op {
            Op::Kernel { function, .. } => lookup(&self.functions, function).map(drop),
            Op::EventRecord { event } | Op::EventWait { event } => {
                lookup(&self.events, event).map(drop)
            }
            Op::Memset { .. } | Op::Memcpy(_) | Op::Empty | Op::Nccl(_) => Ok(()),
            Op::IndirectApply(apply) => lookup(&self.functions, apply.function).map(drop),
            Op::BindingsApply(apply) => lookup(&self.functions, apply.function).map(drop),
            Op::ResidentSchedule(s) => lookup(&self.functions, s.function).map(drop),
            Op::Child(ref ops) => ops.iter().try_for_each(|op| self.check(op)),
        }
    }

    /// Adds a node to `graph` after `deps`.
    ///
    /// # Safety
    /// `deps` is null or points to `count` node handles; `out` is null or valid for one write.
    unsafe fn add_node(
        &mut self,
        out: *mut CUgraphNode,
        graph: CUgraph,
        deps: *const CUgraphNode,
        count: usize,
        op: Op,
    ) -> Status {
        ensure(
            !out.is_null() && (count == 0 || !deps.is_null()),
            status::INVALID_VALUE,
        )?;
        let graph = id(graph)?;
        lookup(&self.graphs, graph)?;
        self.check(&op)?;
        // SAFETY: checked non-null above unless `count` is 0; `count` handles by the caller's
        // contract.
        let deps = unsafe { node_ids(deps, count) };
        // Every dependency must be a node of this graph.
        let node = self.insert_node(graph, deps, op)?;
        // SAFETY: forwarded caller contract (checked non-null above).
        unsafe { put(out, handle(node)) }
    }
}

/// The ids of the `count` node handles at `nodes` (none when `count` is 0).
///
/// # Safety
/// When `count` is not 0, `nodes` is non-null and points to `count` handles.
pub(crate) unsafe fn node_ids(nodes: *const CUgraphNode, count: usize) -> Vec<usize> {
    if count == 0 {
        return Vec::new();
    }
    // SAFETY: non-null and pointing to `count` handles by this function's contract.
    unsafe { std::slice::from_raw_parts(nodes, count) }
        .iter()
        .map(|n| n.addr())
        .collect()
}

impl Op {
    /// A captured 1D copy of `len` bytes.
    pub(crate) fn linear_copy(target: End, source: End, len: usize) -> Op {
        let place = |end: End| match end {
            End::Device(address) => Place::Device(address),
            End::Host(pointer) => Place::Host(pointer.expose_provenance()),
            End::Unified(address) => Place::Unified(address),
        };
        Op::Memcpy(Copy3d {
            source: place(source),
            source_offset: 0,
            source_pitch: len,
            source_height: 1,
            target: place(target),
            target_offset: 0,
            target_pitch: len,
            target_height: 1,
            width: len,
            height: 1,
            depth: 1,
        })
    }

    /// A captured 1D fill of `count` elements of `size` bytes.
    pub(crate) fn linear_fill(target: u64, value: u32, size: usize, count: usize) -> Op {
        Op::Memset {
            params: CUDA_MEMSET_NODE_PARAMS {
                dst: target,
                pitch: 0,
                value,
                elementSize: size as u32,
                width: count,
                height: 1,
            },
        }
    }
}

impl World {
    /// Adds a node to `graph` (which must exist) after `deps` (nodes of it); returns its id.
    pub(crate) fn insert_node(
        &mut self,
        graph: usize,
        deps: Vec<usize>,
        op: Op,
    ) -> Result<usize, c_int> {
        lookup(&self.graphs, graph)?;
        ensure(
            deps.iter().all(|d| self.nodes.get(d) == Some(&graph)),
            status::INVALID_VALUE,
        )?;
        let node = self.new_handle();
        self.nodes.insert(node, graph);
        lookup_mut(&mut self.graphs, graph)?
            .nodes
            .push(Node { id: node, op, deps });
        Ok(node)
    }
}

impl World {
    /// The operation of a kernel node of `function` with `params`: one of cuhal's helpers the
    /// fake emulates, else a kernel checked as a launch.
    ///
    /// # Safety
    /// `params.kernelParams` as cuda.h requires of a launch.
    unsafe fn node_op(
        &self,
        function: usize,
        params: &CUDA_KERNEL_NODE_PARAMS,
    ) -> Result<Op, c_int> {
        let name = lookup(&self.functions, function)?.name.as_str();
        Ok(match name {
            INDIRECT_HELPER => {
                // SAFETY: cuhal passes the helper's ten arguments (cuda.h's contract for
                // kernelParams: one pointer per parameter).
                let apply = unsafe { IndirectApply::read(function, params.kernelParams) }?;
                Op::IndirectApply(apply)
            }
            BINDINGS_HELPER => {
                // SAFETY: cuhal passes the helper's three arguments, as above.
                let apply = unsafe { BindingsApply::read(function, params.kernelParams) }?;
                Op::BindingsApply(apply)
            }
            crate::resident::RESIDENT_SCHEDULER => {
                // SAFETY: cuhal passes the scheduler's one argument, its parameter block.
                let schedule = unsafe {
                    crate::resident::ResidentSchedule::read(function, params.kernelParams)
                }?;
                Op::ResidentSchedule(schedule)
            }
            // SAFETY: forwarded caller contract.
            _ => unsafe { self.kernel_op(params) }?,
        })
    }

    /// A kernel node's operation, checked as a launch.
    ///
    /// # Safety
    /// `params.kernelParams` as cuda.h requires of a launch.
    unsafe fn kernel_op(&self, params: &CUDA_KERNEL_NODE_PARAMS) -> Result<Op, c_int> {
        let function = id(params.func)?;
        self.check_launch(
            function,
            [params.gridDimX, params.gridDimY, params.gridDimZ],
            [params.blockDimX, params.blockDimY, params.blockDimZ],
            params.sharedMemBytes,
        )?;
        let name = &lookup(&self.functions, function)?.name;
        // SAFETY: forwarded caller contract.
        let call = unsafe { KernelCall::read(name, params.kernelParams) }?;
        let grid = [params.gridDimX, params.gridDimY, params.gridDimZ];
        let block = [params.blockDimX, params.blockDimY, params.blockDimZ];
        Ok(Op::kernel(function, grid, block, params.sharedMemBytes).with_call(call))
    }

    /// A memset node's operation: a live context, 1, 2 or 4 byte elements, aligned, inside a
    /// live allocation.
    fn memset_op(&self, params: CUDA_MEMSET_NODE_PARAMS, context: CUcontext) -> Result<Op, c_int> {
        self.active_context(id(context)?)
            .ok_or(status::INVALID_CONTEXT)?;
        let size = params.elementSize as usize;
        ensure(
            matches!(size, 1 | 2 | 4)
                && params.dst.is_multiple_of(size as u64)
                && params.width > 0
                && params.height > 0
                && (params.height == 1 || params.pitch >= params.width * size),
            status::INVALID_VALUE,
        )?;
        for row in 0..params.height {
            self.device_span(
                params.dst + (row * params.pitch) as u64,
                params.width * size,
            )?;
        }
        Ok(Op::Memset { params })
    }

    /// A memcpy node's operation: host, device and unified ends (no arrays), device ends
    /// inside live allocations.
    fn memcpy_op(&self, p: &CUDA_MEMCPY3D, context: CUcontext) -> Result<Op, c_int> {
        self.active_context(id(context)?)
            .ok_or(status::INVALID_CONTEXT)?;
        let place = |kind, host: usize, device: u64| match kind {
            CU_MEMORYTYPE_HOST => Ok(Place::Host(host)),
            CU_MEMORYTYPE_DEVICE => Ok(Place::Device(device)),
            CU_MEMORYTYPE_UNIFIED => Ok(Place::Unified(device)),
            _ => Err(status::NOT_SUPPORTED),
        };
        let rows = |pitch: usize, height: usize| {
            (p.Height <= 1 || pitch >= p.WidthInBytes) && (p.Depth <= 1 || height >= p.Height)
        };
        ensure(
            p.WidthInBytes > 0
                && p.Height > 0
                && p.Depth > 0
                && p.srcLOD == 0
                && p.dstLOD == 0
                && rows(p.srcPitch, p.srcHeight)
                && rows(p.dstPitch, p.dstHeight),
            status::INVALID_VALUE,
        )?;
        let copy = Copy3d {
            source: place(p.srcMemoryType, host_address(p.srcHost), p.srcDevice)?,
            source_offset: p.srcXInBytes + (p.srcZ * p.srcHeight + p.srcY) * p.srcPitch,
            source_pitch: p.srcPitch,
            source_height: p.srcHeight,
            target: place(
                p.dstMemoryType,
                host_address(p.dstHost.cast_const()),
                p.dstDevice,
            )?,
            target_offset: p.dstXInBytes + (p.dstZ * p.dstHeight + p.dstY) * p.dstPitch,
            target_pitch: p.dstPitch,
            target_height: p.dstHeight,
            width: p.WidthInBytes,
            height: p.Height,
            depth: p.Depth,
        };
        for (place, offset_bytes) in [
            (copy.source, copy.source_offset),
            (copy.target, copy.target_offset),
        ] {
            if let Place::Device(_) = place {
                self.resolve(offset(place, offset_bytes), copy.width)?;
            }
        }
        // SAFETY: forwarded caller contract.
        Ok(Op::Memcpy(copy))
    }
}

/// `place` moved on by `bytes`.
fn offset(place: Place, bytes: usize) -> End {
    match place {
        Place::Device(a) => Place::Device(a + bytes as u64),
        Place::Host(a) => Place::Host(a + bytes),
        Place::Unified(a) => Place::Unified(a + bytes as u64),
    }
    .end()
}

/// The operations of `graph` in dependency order (Kahn's algorithm, stable), or
/// `CUDA_ERROR_INVALID_VALUE` for a cycle.
fn order(graph: &Graph) -> Result<Vec<(usize, Op)>, c_int> {
    let index = |id: usize| graph.nodes.iter().position(|n| n.id == id);
    let mut waiting: Vec<usize> = graph.nodes.iter().map(|n| n.deps.len()).collect();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); graph.nodes.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        for &dep in &node.deps {
            dependents[index(dep).ok_or(status::INVALID_VALUE)?].push(i);
        }
    }
    let mut ready: VecDeque<usize> = (0..graph.nodes.len())
        .filter(|&i| waiting[i] == 0)
        .collect();
    let mut order = Vec::with_capacity(graph.nodes.len());
    while let Some(i) = ready.pop_front() {
        order.push((graph.nodes[i].id, graph.nodes[i].op.clone()));
        for &next in &dependents[i] {
            waiting[next] -= 1;
            if waiting[next] == 0 {
                ready.push_back(next);
            }
        }
    }
    ensure(order.len() == graph.nodes.len(), status::INVALID_VALUE)?;
    Ok(order)
}

/// `CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)`.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuGraphCreate(out: *mut CUgraph, flags: c_uint) -> c_int {
    entry("cuGraphCreate", || {
        ensure(flags == 0 && !out.is_null(), status::INVALID_VALUE)?;
        let mut world = world();
        let graph = world.new_handle();
        world.graphs.insert(graph, Graph::default());
        // SAFETY: forwarded caller contract (checked non-null above).
        unsafe { put(out, handle(graph)) }
    })
}

/// `CUresult cuGraphDestroy(CUgraph hGraph)`: its executables live on.
pub extern "C" fn cuGraphDestroy(graph: CUgraph) -> c_int {
    entry("cuGraphDestroy", || {
        let graph = id(graph)?;
        let mut world = world();
        world.graphs.remove(&graph).ok_or(status::INVALID_HANDLE)?;
        world.nodes.retain(|_, g| *g != graph);
        Ok(())
    })
}

/// `CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode
/// *dependencies, size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS *nodeParams)`.
///
/// # Safety
/// Pointers as in cuda.h: `deps` holds `count` handles, `params` is null or readable.
pub unsafe extern "C" fn cuGraphAddKernelNode(
    out: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *const CUDA_KERNEL_NODE_PARAMS,
) -> c_int {
    entry("cuGraphAddKernelNode", || {
        ensure(!params.is_null(), status::INVALID_VALUE)?;
        // SAFETY: non-null and readable by the caller's contract.
        let params = unsafe { params.read() };
        let mut world = world();
        let function = id(params.func)?;
        world.check_launch(
            function,
            [params.gridDimX, params.gridDimY, params.gridDimZ],
            [params.blockDimX, params.blockDimY, params.blockDimZ],
            params.sharedMemBytes,
        )?;
        // SAFETY: forwarded caller contract.
        let op = unsafe { world.node_op(function, &params) }?;
        // SAFETY: forwarded caller contract.
        unsafe { world.add_node(out, graph, deps, count, op) }
    })
}

/// `CUresult cuGraphAddMemsetNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode
/// *dependencies, size_t numDependencies, const CUDA_MEMSET_NODE_PARAMS *memsetParams,
/// CUcontext ctx)`.
///
/// # Safety
/// Pointers as in cuda.h.
pub unsafe extern "C" fn cuGraphAddMemsetNode(
    out: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *const CUDA_MEMSET_NODE_PARAMS,
    context: CUcontext,
) -> c_int {
    entry("cuGraphAddMemsetNode", || {
        ensure(!params.is_null(), status::INVALID_VALUE)?;
        // SAFETY: non-null and readable by the caller's contract.
        let params = unsafe { params.read() };
        let mut world = world();
        let op = world.memset_op(params, context)?;
        // SAFETY: forwarded caller contract.
        unsafe { world.add_node(out, graph, deps, count, op) }
    })
}

/// `CUresult cuGraphAddMemcpyNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode
/// *dependencies, size_t numDependencies, const CUDA_MEMCPY3D *copyParams, CUcontext ctx)`.
/// Host, device and unified ends; arrays are not supported.
///
/// # Safety
/// Pointers as in cuda.h; host ends stay valid while the graph can launch.
pub unsafe extern "C" fn cuGraphAddMemcpyNode(
    out: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    params: *const CUDA_MEMCPY3D,
    context: CUcontext,
) -> c_int {
    entry("cuGraphAddMemcpyNode", || {
        ensure(!params.is_null(), status::INVALID_VALUE)?;
        // SAFETY: non-null and readable by the caller's contract.
        let p = unsafe { params.read() };
        let mut world = world();
        let op = world.memcpy_op(&p, context)?;
        // SAFETY: forwarded caller contract.
        unsafe { world.add_node(out, graph, deps, count, op) }
    })
}

/// `CUresult cuGraphAddEmptyNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode
/// *dependencies, size_t numDependencies)`.
///
/// # Safety
/// Pointers as in cuda.h.
pub unsafe extern "C" fn cuGraphAddEmptyNode(
    out: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
) -> c_int {
    // SAFETY: forwarded caller contract.
    entry("cuGraphAddEmptyNode", || unsafe {
        world().add_node(out, graph, deps, count, Op::Empty)
    })
}

/// `CUresult cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph, const
/// CUgraphNode *dependencies, size_t numDependencies, CUgraph childGraph)`: the child is cloned
/// (its operations in dependency order); later changes to the child do not reach the node. A
/// child that updates its own nodes from the device is refused.
///
/// # Safety
/// Pointers as in cuda.h.
pub unsafe extern "C" fn cuGraphAddChildGraphNode(
    out: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    child: CUgraph,
) -> c_int {
    entry("cuGraphAddChildGraphNode", || {
        let mut world = world();
        let ops: Vec<Op> = order(lookup(&world.graphs, id(child)?)?)?
            .into_iter()
            .map(|(_, op)| op)
            .collect();
        ensure(
            !ops.iter().any(|op| matches!(op, Op::IndirectApply(_))),
            status::INVALID_VALUE,
        )?;
        // SAFETY: forwarded caller contract.
        unsafe { world.add_node(out, graph, deps, count, Op::Child(ops)) }
    })
}

/// `CUresult cuGraphAddEventRecordNode(CUgraphNode *phGraphNode, CUgraph hGraph, const
/// CUgraphNode *dependencies, size_t numDependencies, CUevent event)`.
///
/// # Safety
/// Pointers as in cuda.h.
pub unsafe extern "C" fn cuGraphAddEventRecordNode(
    out: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    event: CUevent,
) -> c_int {
    entry("cuGraphAddEventRecordNode", || {
        let event = id(event)?;
        // SAFETY: forwarded caller contract.
        unsafe { world().add_node(out, graph, deps, count, Op::EventRecord { event }) }
    })
}

/// `CUresult cuGraphAddEventWaitNode(CUgraphNode *phGraphNode, CUgraph hGraph, const
/// CUgraphNode *dependencies, size_t numDependencies, CUevent event)`.
///
/// # Safety
/// Pointers as in cuda.h.
pub unsafe extern "C" fn cuGraphAddEventWaitNode(
    out: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    event: CUevent,
) -> c_int {
    entry("cuGraphAddEventWaitNode", || {
        let event = id(event)?;
        // SAFETY: forwarded caller contract.
        unsafe { world().add_node(out, graph, deps, count, Op::EventWait { event }) }
    })
}

/// `CUresult cuGraphAddDependencies(CUgraph hGraph, const CUgraphNode *from, const CUgraphNode
/// *to, size_t numDependencies)`.
///
/// # Safety
/// `from` and `to` each hold `count` handles (or are null with `count` 0).
pub unsafe extern "C" fn cuGraphAddDependencies(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    count: usize,
) -> c_int {
    entry("cuGraphAddDependencies", || {
        if count == 0 {
            return Ok(());
        }
        ensure(!from.is_null() && !to.is_null(), status::INVALID_VALUE)?;
        // SAFETY: non-null and holding `count` handles by the caller's contract.
        let (from, to) = unsafe {
            (
                std::slice::from_raw_parts(from, count),
                std::slice::from_raw_parts(to, count),
            )
        };
        let mut world = world();
        let graph = id(graph)?;
        lookup(&world.graphs, graph)?;
        let ours = |n: &CUgraphNode| world.nodes.get(&n.addr()) == Some(&graph);
        ensure(from.iter().chain(to).all(ours), status::INVALID_VALUE)?;
        let graph = lookup_mut(&mut world.graphs, graph)?;
        for (from, to) in from.iter().zip(to) {
            if let Some(node) = graph.nodes.iter_mut().find(|n| n.id == to.addr()) {
                node.deps.push(from.addr());
            }
        }
        Ok(())
    })
}

/// `CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)`: with null
/// `nodes`, only the count; else up to `*numNodes` handles, in creation order, and the count.
/// As on the real driver, a non-null `nodes` with `*numNodes == 0` is `CUDA_ERROR_INVALID_VALUE`
/// (also for an empty graph).
///
/// # Safety
/// `count` is null or valid for a read and a write; `nodes` is null or holds `*count` handles.
pub unsafe extern "C" fn cuGraphGetNodes(
    graph: CUgraph,
    nodes: *mut CUgraphNode,
    count: *mut usize,
) -> c_int {
    entry("cuGraphGetNodes", || {
        ensure(!count.is_null(), status::INVALID_VALUE)?;
        let world = world();
        // A destroyed graph is CUDA_ERROR_INVALID_VALUE here on the real driver.
        let graph = lookup(&world.graphs, id(graph)?).map_err(|_| status::INVALID_VALUE)?;
        if !nodes.is_null() {
            // SAFETY: non-null and readable by the caller's contract.
            let room = unsafe { count.read() };
            ensure(room > 0, status::INVALID_VALUE)?;
            for (i, node) in graph.nodes.iter().take(room).enumerate() {
                // SAFETY: `i < room`, the length the caller vouches for.
                unsafe { nodes.add(i).write(handle(node.id)) };
            }
        }
        // SAFETY: forwarded caller contract (checked non-null above).
        unsafe { put(count, graph.nodes.len()) }
    })
}

/// `CUresult cuGraphDestroyNode(CUgraphNode hNode)`: removes the node and every edge to or from it.
pub extern "C" fn cuGraphDestroyNode(node: CUgraphNode) -> c_int {
    entry("cuGraphDestroyNode", || {
        let node = id(node)?;
        let mut world = world();
        let graph = world.nodes.remove(&node).ok_or(status::INVALID_VALUE)?;
        let graph = lookup_mut(&mut world.graphs, graph)?;
        graph.nodes.retain(|n| n.id != node);
        for other in &mut graph.nodes {
            other.deps.retain(|&d| d != node);
        }
        Ok(())
    })
}

/// `CUresult cuGraphAddDependencies_v2(CUgraph hGraph, const CUgraphNode *from, const
/// CUgraphNode *to, const CUgraphEdgeData *edgeData, size_t numDependencies)`: a default edge
/// is as in [`cuGraphAddDependencies`]; a programmatic one must join two kernel nodes from the
/// programmatic port and is counted ([`crate::control::Counts::programmatic_edges`]).
///
/// # Safety
/// `from` and `to` each hold `count` handles; `edges` is null or holds `count` entries.
pub unsafe extern "C" fn cuGraphAddDependencies_v2(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    edges: *const CUgraphEdgeData,
    count: usize,
) -> c_int {
    if count > 0 && !edges.is_null() {
        // SAFETY: non-null and holding `count` entries by the caller's contract.
        let edges = unsafe { std::slice::from_raw_parts(edges, count) };
        let r = entry("cuGraphAddDependencies", || {
            let mut world = world();
            // SAFETY: `from` and `to` hold `count` handles by the caller's contract.
            let (sources, targets) = unsafe {
                ensure(!from.is_null() && !to.is_null(), status::INVALID_VALUE)?;
                (
                    std::slice::from_raw_parts(from, count),
                    std::slice::from_raw_parts(to, count),
                )
            };
            let graph_id = id(graph)?;
            let g = lookup(&world.graphs, graph_id)?;
            let is_kernel = |n: &CUgraphNode| {
                g.nodes
                    .iter()
                    .any(|node| node.id == n.addr() && matches!(node.op, Op::Kernel { .. }))
            };
            let mut programmatic = 0;
            for ((edge, source), target) in edges.iter().zip(sources).zip(targets) {
                match (edge.type_, edge.from_port, edge.to_port) {
                    (CU_GRAPH_DEPENDENCY_TYPE_DEFAULT, 0, 0) => {}
                    (
                        CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC,
                        CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC,
                        0,
                    ) => {
                        ensure(
                            is_kernel(source) && is_kernel(target),
                            status::INVALID_VALUE,
                        )?;
                        programmatic += 1;
                    }
                    _ => return Err(status::INVALID_VALUE),
                }
                ensure(edge.reserved == [0; 5], status::INVALID_VALUE)?;
            }
            world.programmatic_edges += programmatic;
            Ok(())
        });
        if r != status::SUCCESS {
            return r;
        }
    }
    // SAFETY: forwarded caller contract.
    unsafe { cuGraphAddDependencies(graph, from, to, count) }
}

/// Finds kernel node `node` of any graph.
fn kernel_node(world: &mut World, node: CUgraphNode) -> Result<&mut Op, c_int> {
    let graph = *world.nodes.get(&id(node)?).ok_or(status::INVALID_HANDLE)?;
    let graph = lookup_mut(&mut world.graphs, graph)?;
    let node = graph
        .nodes
        .iter_mut()
        .find(|n| n.id == node.addr())
        .ok_or(status::INVALID_HANDLE)?;
    ensure(matches!(node.op, Op::Kernel { .. }), status::INVALID_VALUE)?;
    Ok(&mut node.op)
}

/// `CUresult cuGraphKernelNodeSetAttribute(CUgraphNode hNode, CUkernelNodeAttrID attr, const
/// CUkernelNodeAttrValue *value)`: checked against the node's shape like a launch attribute.
///
/// # Safety
/// `value` is null or readable.
pub unsafe extern "C" fn cuGraphKernelNodeSetAttribute(
    node: CUgraphNode,
    attribute: CUlaunchAttributeID,
    value: *const CUlaunchAttributeValue,
) -> c_int {
    entry("cuGraphKernelNodeSetAttribute", || {
        ensure(!value.is_null(), status::INVALID_VALUE)?;
        // SAFETY: non-null and readable by the caller's contract.
        let value = unsafe { value.read() };
        let mut world = world();
        let Op::Kernel {
            function,
            grid,
            block,
            shared,
            ..
        } = kernel_node(&mut world, node)?.clone()
        else {
            return Err(status::INVALID_VALUE);
        };
        world.check_attribute(function, grid, block, shared, attribute, &value, true)?;
        if attribute == CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE
            && let Op::Kernel {
                device_updatable, ..
            } = kernel_node(&mut world, node)?
        {
            *device_updatable = true;
        }
        Ok(())
    })
}

/// `CUresult cuGraphKernelNodeGetAttribute(CUgraphNode hNode, CUkernelNodeAttrID attr,
/// CUkernelNodeAttrValue *value)`: only whether the node is device-updatable, and its device
/// handle (the node's own handle in the fake).
///
/// # Safety
/// `value` is null or valid for one write.
pub unsafe extern "C" fn cuGraphKernelNodeGetAttribute(
    node: CUgraphNode,
    attribute: CUlaunchAttributeID,
    value: *mut CUlaunchAttributeValue,
) -> c_int {
    entry("cuGraphKernelNodeGetAttribute", || {
        ensure(
            attribute == CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE,
            status::INVALID_VALUE,
        )?;
        let mut world = world();
        let Op::Kernel {
            device_updatable, ..
        } = *kernel_node(&mut world, node)?
        else {
            return Err(status::INVALID_VALUE);
        };
        let mut out = CUlaunchAttributeValue::int(i32::from(device_updatable));
        if device_updatable {
            out.bytes[8..16].copy_from_slice(&(node.addr() as u64).to_ne_bytes());
        }
        // SAFETY: forwarded caller contract.
        unsafe { put(value, out) }
    })
}

/// `CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long
/// long flags)`: checks the graph (no cycle, every event and function alive) and snapshots it.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    out: *mut CUgraphExec,
    graph: CUgraph,
    flags: u64,
) -> c_int {
    entry("cuGraphInstantiateWithFlags", || {
        // AUTO_FREE_ON_LAUNCH | UPLOAD | DEVICE_LAUNCH | USE_NODE_PRIORITY.
        ensure(flags & !0xf == 0 && !out.is_null(), status::INVALID_VALUE)?;
        let mut world = world();
        world.current_context()?;
        let order = order(lookup(&world.graphs, id(graph)?)?)?;
        order.iter().try_for_each(|(_, op)| world.check(op))?;
        // An indirect helper's target must be a device-updatable kernel node of this graph.
        for (_, op) in &order {
            if let Op::IndirectApply(apply) = op {
                ensure(
                    order.iter().any(|(id, target)| {
                        *id == apply.node
                            && matches!(
                                target,
                                Op::Kernel {
                                    device_updatable: true,
                                    ..
                                }
                            )
                    }),
                    status::INVALID_VALUE,
                )?;
            }
        }
        // A graph with device-updatable kernel nodes has at most one executable at a time.
        let source = id(graph)?;
        let updatable = order.iter().any(|(_, op)| {
            matches!(
                op,
                Op::Kernel {
                    device_updatable: true,
                    ..
                }
            )
        });
        ensure(
            !updatable
                || !world
                    .execs
                    .values()
                    .any(|e| e.updatable_source == Some(source)),
            status::INVALID_VALUE,
        )?;
        let exec = world.new_handle();
        world.execs.insert(
            exec,
            Exec {
                order,
                disabled: HashSet::new(),
                uploaded: false,
                device_launch: flags & cuhal_sys::CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH != 0,
                updatable_source: updatable.then_some(source),
                last_launch: None,
                patched_in_flight_on: None,
            },
        );
        // SAFETY: forwarded caller contract (checked non-null above).
        unsafe { put(out, handle(exec)) }
    })
}

/// `CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)`: runs every node now.
pub extern "C" fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> c_int {
    entry("cuGraphLaunch", || {
        // Stream order: an earlier launch on this stream still running on its own thread
        // finishes first. Launches on other streams may still be running: they wait for this
        // one's collectives.
        settle(Some(stream.addr()));
        let mut world = world();
        world.stream_device(stream)?;
        let state = lookup_mut(&mut world.execs, id(exec)?)?;
        let running = state.running_on();
        let patched = state.patched_in_flight_on.take();
        let launch = GraphLaunch {
            exec: exec.addr(),
            stream: stream.addr(),
            running_elsewhere: u8::from(running.is_some_and(|s| s != stream.addr())),
            patched_while_running_elsewhere: u8::from(patched.is_some_and(|s| s != stream.addr())),
        };
        world.graph_launches.push(launch);
        let state = lookup_mut(&mut world.execs, id(exec)?)?;
        if state.order.iter().any(|(_, op)| op.has_nccl()) {
            ensure(
                !state
                    .order
                    .iter()
                    .any(|(_, op)| matches!(op, Op::IndirectApply(_) | Op::BindingsApply(_))),
                status::NOT_SUPPORTED,
            )?;
            let ops: Vec<Op> = state.order.iter().map(|(_, op)| op.clone()).collect();
            drop(world);
            let launch = std::thread::Builder::new()
                .name("fake-graph-launch".into())
                .spawn(move || {
                    // A failure was recorded as the communicator's asynchronous error; a panic
                    // (a bug of the fake) must not take the process down.
                    let _ = std::panic::catch_unwind(|| run_launched(&ops));
                })
                .map_err(|_| status::OUT_OF_MEMORY)?;
            IN_FLIGHT
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((stream.addr(), launch));
            return Ok(());
        }
        let mut order = std::mem::take(&mut state.order);
        let mut disabled = std::mem::take(&mut state.disabled);
        let uploaded = state.uploaded;
        let updates_itself = order
            .iter()
            .any(|(_, op)| matches!(op, Op::IndirectApply(_) | Op::BindingsApply(_)));
        // CUDA: a graph that updates its own nodes from the device must be uploaded first.
        let mut result = ensure(uploaded || !updates_itself, status::INVALID_VALUE);
        let mut i = 0;
        while result.is_ok() && i < order.len() {
            let (id, op) = order[i].clone();
            i += 1;
            result = match op {
                _ if disabled.contains(&id) => Ok(()),
                Op::IndirectApply(apply) => world.apply_indirect(&apply, &mut disabled),
                // Device-side updates persist in the executable, as on the GPU.
                Op::BindingsApply(apply) => world.apply_bindings(&apply, &mut order),
                Op::ResidentSchedule(schedule) => world.run_resident(&schedule),
                _ => world.run(&op),
            };
        }
        if let Some(exec) = world.execs.get_mut(&exec.addr()) {
            exec.order = order;
            exec.disabled = disabled;
        }
        if result.is_ok() && !world.is_capturing(stream) {
            world.occupy(stream);
            let done = world.stream_done_at(stream);
            if let Some(exec) = world.execs.get_mut(&exec.addr()) {
                exec.last_launch = Some((stream.addr(), done));
            }
        }
        result
    })
}

/// `CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream)`: nothing to upload.
pub extern "C" fn cuGraphUpload(exec: CUgraphExec, stream: CUstream) -> c_int {
    entry("cuGraphUpload", || {
        let mut world = world();
        world.stream_device(stream)?;
        lookup_mut(&mut world.execs, id(exec)?)?.uploaded = true;
        Ok(())
    })
}

/// `CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)`.
pub extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> c_int {
    entry("cuGraphExecDestroy", || {
        let exec = id(exec)?;
        world()
            .execs
            .remove(&exec)
            .map(drop)
            .ok_or(status::INVALID_HANDLE)
    })
}

impl World {
    /// Replaces the operation of `node` in `exec` by `op`, which `same_shape` must accept
    /// against the operation there now (same node kind, and what the driver refuses to change).
    /// A copy of the operation of `node` in `exec`.
    fn exec_node(&self, exec: CUgraphExec, node: CUgraphNode) -> Result<Op, c_int> {
        let exec = lookup(&self.execs, id(exec)?)?;
        let node = id(node)?;
        exec.order
            .iter()
            .find(|(n, _)| *n == node)
            .map(|(_, op)| op.clone())
            .ok_or(status::INVALID_VALUE)
    }

    fn set_exec_node(
        &mut self,
        exec: CUgraphExec,
        node: CUgraphNode,
        mut op: Op,
        same_shape: impl Fn(&Op, &mut Op) -> bool,
    ) -> Status {
        let exec = lookup_mut(&mut self.execs, id(exec)?)?;
        if let Some(stream) = exec.running_on() {
            exec.patched_in_flight_on = Some(stream);
        }
        let node = id(node)?;
        let (_, current) = exec
            .order
            .iter_mut()
            .find(|(n, _)| *n == node)
            .ok_or(status::INVALID_VALUE)?;
        ensure(same_shape(current, &mut op), status::INVALID_VALUE)?;
        *current = op;
        Ok(())
    }
}

/// `CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec hGraphExec, CUgraphNode hNode, const
/// CUDA_KERNEL_NODE_PARAMS *nodeParams)`: later launches of the executable use the new
/// function, shape and argument values (read now, as the driver copies them).
///
/// # Safety
/// `params` is null or readable, with `kernelParams` as cuda.h requires of a launch.
pub unsafe extern "C" fn cuGraphExecKernelNodeSetParams(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const CUDA_KERNEL_NODE_PARAMS,
) -> c_int {
    entry("cuGraphExecKernelNodeSetParams", || {
        ensure(!params.is_null(), status::INVALID_VALUE)?;
        // SAFETY: non-null and readable by the caller's contract.
        let params = unsafe { params.read() };
        let mut world = world();
        let function = id(params.func)?;
        // SAFETY: forwarded caller contract.
        let op = unsafe { world.node_op(function, &params) }?;
        world.set_exec_node(exec, node, op, |current, new| match (current, new) {
            (Op::BindingsApply(_), Op::BindingsApply(_)) => true,
            (
                Op::Kernel {
                    device_updatable: kept,
                    ..
                },
                Op::Kernel {
                    device_updatable, ..
                },
            ) => {
                // Node attributes are not node parameters: they stay.
                *device_updatable = *kept;
                true
            }
            _ => false,
        })
    })
}

/// `CUresult cuGraphExecMemsetNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode, const
/// CUDA_MEMSET_NODE_PARAMS *memsetParams, CUcontext ctx)`: a new address and value; the shape
/// (element size, width, height) must stay, as the driver requires of 1D memsets.
///
/// # Safety
/// `params` is null or readable.
pub unsafe extern "C" fn cuGraphExecMemsetNodeSetParams(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const CUDA_MEMSET_NODE_PARAMS,
    context: CUcontext,
) -> c_int {
    entry("cuGraphExecMemsetNodeSetParams", || {
        ensure(!params.is_null(), status::INVALID_VALUE)?;
        // SAFETY: non-null and readable by the caller's contract.
        let params = unsafe { params.read() };
        let mut world = world();
        let op = world.memset_op(params, context)?;
        world.set_exec_node(exec, node, op, |current, new| match (current, new) {
            (Op::Memset { params: a }, Op::Memset { params: b }) => {
                (a.elementSize, a.width, a.height) == (b.elementSize, b.width, b.height)
            }
            _ => false,
        })
    })
}

/// `CUresult cuGraphExecMemcpyNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode, const
/// CUDA_MEMCPY3D *copyParams, CUcontext ctx)`: new ends of the same kinds and the same extent.
///
/// # Safety
/// `params` is null or readable; host ends stay valid while the executable can launch.
pub unsafe extern "C" fn cuGraphExecMemcpyNodeSetParams(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const CUDA_MEMCPY3D,
    context: CUcontext,
) -> c_int {
    entry("cuGraphExecMemcpyNodeSetParams", || {
        ensure(!params.is_null(), status::INVALID_VALUE)?;
        // SAFETY: non-null and readable by the caller's contract.
        let p = unsafe { params.read() };
        let mut world = world();
        let op = world.memcpy_op(&p, context)?;
        let kind = |p: Place| std::mem::discriminant(&p);
        // Device ends must stay mapped as they were (pool memory stays pool memory, and
        // `cuMemAlloc` memory stays such), as the driver requires; it answers
        // `CUDA_ERROR_INVALID_VALUE` otherwise.
        let mapping = |p: Place| match p {
            Place::Device(a) | Place::Unified(a) => world.in_pool_memory(a),
            Place::Host(_) => None,
        };
        // (An end whose memory is gone since is not compared: the fake keeps no record of it.)
        let same = |a: Place, b: Place| match (mapping(a), mapping(b)) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        let mapped_alike =
            |a: &Copy3d, b: &Copy3d| same(a.source, b.source) && same(a.target, b.target);
        let current = world.exec_node(exec, node)?;
        let alike = match (&current, &op) {
            (Op::Memcpy(a), Op::Memcpy(b)) => mapped_alike(a, b),
            _ => true,
        };
        ensure(alike, status::INVALID_VALUE)?;
        world.set_exec_node(exec, node, op, |current, new| match (current, new) {
            (Op::Memcpy(a), Op::Memcpy(b)) => {
                (a.width, a.height, a.depth) == (b.width, b.height, b.depth)
                    && kind(a.source) == kind(b.source)
                    && kind(a.target) == kind(b.target)
            }
            _ => false,
        })
    })
}

/// `CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
/// CUgraph childGraph)`: later launches run (a copy of) `childGraph` in the child graph node.
/// As the driver requires, the new child must have the node's topology: here, the same
/// operations in the same order, node kind by node kind (kernels may change function and
/// arguments, copies and fills their addresses); anything else is `CUDA_ERROR_INVALID_VALUE`
/// and leaves the node as it was.
///
/// # Safety
/// Handles as in cuda.h.
pub unsafe extern "C" fn cuGraphExecChildGraphNodeSetParams(
    exec: CUgraphExec,
    node: CUgraphNode,
    child: CUgraph,
) -> c_int {
    entry("cuGraphExecChildGraphNodeSetParams", || {
        let mut world = world();
        let ops: Vec<Op> = order(lookup(&world.graphs, id(child)?)?)?
            .into_iter()
            .map(|(_, op)| op)
            .collect();
        let kind = |op: &Op| std::mem::discriminant(op);
        world.set_exec_node(exec, node, Op::Child(ops), |current, new| {
            match (current, new) {
                (Op::Child(a), Op::Child(b)) => {
                    a.len() == b.len() && a.iter().zip(b.iter()).all(|(x, y)| kind(x) == kind(y))
                }
                _ => false,
            }
        })
    })
}

/// `CUresult cuGraphClone(CUgraph *phGraphClone, CUgraph originalGraph)`: a copy with nodes of
/// its own (`cuGraphNodeFindInClone` maps them). A graph with device-updatable kernel nodes is
/// refused, as cuhal assumes of the driver (it never clones one).
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuGraphClone(out: *mut CUgraph, original: CUgraph) -> c_int {
    entry("cuGraphClone", || {
        ensure(!out.is_null(), status::INVALID_VALUE)?;
        let mut world = world();
        let original = lookup(&world.graphs, id(original)?)?;
        let copied: Vec<(usize, Op, Vec<usize>)> = original
            .nodes
            .iter()
            .map(|n| (n.id, n.op.clone(), n.deps.clone()))
            .collect();
        ensure(
            !copied.iter().any(|(_, op, _)| {
                matches!(
                    op,
                    Op::Kernel {
                        device_updatable: true,
                        ..
                    }
                )
            }),
            status::NOT_SUPPORTED,
        )?;
        let graph = world.new_handle();
        let mut clone = Graph::default();
        for (old, _, _) in &copied {
            clone.cloned.push((*old, world.new_handle()));
        }
        let new_id = |old: usize| {
            clone
                .cloned
                .iter()
                .find(|(o, _)| *o == old)
                .map(|&(_, n)| n)
        };
        let mut nodes = Vec::with_capacity(copied.len());
        for (old, op, deps) in copied {
            let deps = deps
                .into_iter()
                .map(|d| new_id(d).ok_or(status::INVALID_VALUE))
                .collect::<Result<Vec<_>, _>>()?;
            let id = new_id(old).ok_or(status::INVALID_VALUE)?;
            nodes.push(Node { id, op, deps });
        }
        clone.nodes = nodes;
        for node in &clone.nodes {
            world.nodes.insert(node.id, graph);
        }
        world.graphs.insert(graph, clone);
        // SAFETY: forwarded caller contract (checked non-null above).
        unsafe { put(out, handle(graph)) }
    })
}

/// `CUresult cuGraphNodeFindInClone(CUgraphNode *phNode, CUgraphNode hOriginalNode, CUgraph
/// hClonedGraph)`.
///
/// # Safety
/// `out` is null or valid for one write.
pub unsafe extern "C" fn cuGraphNodeFindInClone(
    out: *mut CUgraphNode,
    original: CUgraphNode,
    clone: CUgraph,
) -> c_int {
    entry("cuGraphNodeFindInClone", || {
        ensure(!out.is_null(), status::INVALID_VALUE)?;
        let world = world();
        let clone = lookup(&world.graphs, id(clone)?)?;
        let original = id(original)?;
        let found = clone
            .cloned
            .iter()
            .find(|(o, _)| *o == original)
            .map(|&(_, n)| n)
            .ok_or(status::INVALID_VALUE)?;
        // SAFETY: forwarded caller contract (checked non-null above).
        unsafe { put(out, handle(found)) }
    })
}

/// `CUresult cuGraphGetRootNodes(CUgraph hGraph, CUgraphNode *rootNodes, size_t *numRootNodes)`:
/// the nodes without dependencies; with null `rootNodes`, only their count.
///
/// # Safety
/// `count` is null or valid for a read and a write; `nodes` is null or holds `*count` handles.
pub unsafe extern "C" fn cuGraphGetRootNodes(
    graph: CUgraph,
    nodes: *mut CUgraphNode,
    count: *mut usize,
) -> c_int {
    entry("cuGraphGetRootNodes", || {
        ensure(!count.is_null(), status::INVALID_VALUE)?;
        let world = world();
        let graph = lookup(&world.graphs, id(graph)?).map_err(|_| status::INVALID_VALUE)?;
        let roots: Vec<usize> = graph
            .nodes
            .iter()
            .filter(|n| n.deps.is_empty())
            .map(|n| n.id)
            .collect();
        if !nodes.is_null() {
            // SAFETY: non-null and readable by the caller's contract.
            let room = unsafe { count.read() };
            for (i, root) in roots.iter().take(room).enumerate() {
                // SAFETY: `i < room`, the length the caller vouches for.
                unsafe { nodes.add(i).write(handle(*root)) };
            }
        }
        // SAFETY: forwarded caller contract (checked non-null above).
        unsafe { put(count, roots.len()) }
    })
}

/// `CUresult cuGraphNodeSetEnabled(CUgraphExec hGraphExec, CUgraphNode hNode, unsigned int
/// isEnabled)`: kernel, memset and memcpy nodes only; later launches skip a disabled node.
pub extern "C" fn cuGraphNodeSetEnabled(
    exec: CUgraphExec,
    node: CUgraphNode,
    enabled: c_uint,
) -> c_int {
    entry("cuGraphNodeSetEnabled", || {
        let mut world = world();
        let exec = lookup_mut(&mut world.execs, id(exec)?)?;
        let node = id(node)?;
        let (_, op) = exec
            .order
            .iter()
            .find(|(n, _)| *n == node)
            .ok_or(status::INVALID_VALUE)?;
        ensure(
            matches!(
                op,
                Op::Kernel { .. }
                    | Op::IndirectApply(_)
                    | Op::BindingsApply(_)
                    | Op::Memset { .. }
                    | Op::Memcpy(_)
            ),
            status::INVALID_VALUE,
        )?;
        if enabled == 0 {
            exec.disabled.insert(node);
        } else {
            exec.disabled.remove(&node);
        }
        Ok(())
    })
}

/// `CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type)`.
///
/// # Safety
/// `out` is null or writable.
pub unsafe extern "C" fn cuGraphNodeGetType(node: CUgraphNode, out: *mut c_uint) -> c_int {
    entry("cuGraphNodeGetType", || {
        ensure(!out.is_null(), status::INVALID_VALUE)?;
        let world = world();
        let node = id(node)?;
        let graph = *world.nodes.get(&node).ok_or(status::INVALID_VALUE)?;
        let op = &lookup(&world.graphs, graph)?
            .nodes
            .iter()
            .find(|n| n.id == node)
            .ok_or(status::INVALID_VALUE)?
            .op;
        let kind = match op {
            Op::Kernel { .. }
            | Op::IndirectApply(_)
            | Op::BindingsApply(_)
            | Op::ResidentSchedule(_) => cuhal_sys::CU_GRAPH_NODE_TYPE_KERNEL,
            Op::Memset { .. } => cuhal_sys::CU_GRAPH_NODE_TYPE_MEMSET,
            Op::Memcpy(_) => cuhal_sys::CU_GRAPH_NODE_TYPE_MEMCPY,
            Op::Empty => cuhal_sys::CU_GRAPH_NODE_TYPE_EMPTY,
            Op::EventRecord { .. } => cuhal_sys::CU_GRAPH_NODE_TYPE_EVENT_RECORD,
            Op::EventWait { .. } => cuhal_sys::CU_GRAPH_NODE_TYPE_WAIT_EVENT,
            Op::Child(_) | Op::Nccl(_) => cuhal_sys::CU_GRAPH_NODE_TYPE_GRAPH,
        };
        // SAFETY: checked non-null; the caller's contract.
        unsafe { put(out, kind) }
    })
}
