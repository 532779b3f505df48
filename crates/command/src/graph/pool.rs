//! Binding tables for graphs: the nodes that name slots, and the small pool of executables that
//! lets one command buffer run with different tables on several streams at once.
//!
//! Launches of one `CUgraphExec` are ordered behind each other by the driver, whatever stream
//! they go to, so two queues launching one shared executable would wait on each other. A launch
//! therefore never takes an executable whose last launch, on another stream, may still run:
//! it takes the executable last launched on its own stream (the stream orders the two launches
//! anyway, and the driver applies node-parameter changes to later launches only), else one that
//! is idle, else a new one (instantiated from the same graph), up to a bound; only past the
//! bound does a stream borrow the least recently used one, which
//! [`ExecPool::shared_launches`] counts.
//!
//! Idle means never launched, or its completion event (recorded on the stream after each of its
//! launches, once the command buffer has been launched on a second stream) has completed. A
//! command buffer launched on one stream only records nothing more than the launch; on several
//! streams, each launch costs one `cuEventRecord` more, and a launch on a stream without an
//! executable of its own queries the others' events.
//!
//! Each executable remembers the address every slot was bound to at its last launch; a launch
//! patches only the nodes with a slot whose address differs, and an unchanged table costs one
//! comparison per slot.

use std::sync::Arc;

use cuhal_sys::{
    CU_EVENT_DISABLE_TIMING, CUDA_KERNEL_NODE_PARAMS, CUDA_MEMSET_NODE_PARAMS, CUcontext,
    CUdeviceptr, CUgraph, CUgraphExec, CUgraphNode, CUstream, DriverApi, Event, PrimaryContext, cu,
};

use super::device_patch::{DevicePatcher, DeviceSide};
use crate::binding::{ArgScratch, Operand, SlotList, with_bound_args};
use crate::{ArgBinding, ArgSlot, BufferRange, Error};

/// How many executables one graph command buffer may keep by default: one per stream that runs
/// it concurrently, for up to this many streams (more queues than a device is usually opened
/// with). Executables are made only when every one is busy on another stream, so a command
/// buffer run by two queues keeps two.
pub const DEFAULT_EXECUTABLE_LIMIT: usize = 16;

/// A slot address no binding has: every slot differs from it, so a fresh executable is patched
/// in full before its first launch.
const UNBOUND: CUdeviceptr = CUdeviceptr::MAX;

/// What a node with slot operands needs to be given new addresses.
pub(crate) enum PatchKind {
    Memset {
        params: CUDA_MEMSET_NODE_PARAMS,
        target: Operand,
    },
    Kernel {
        /// Everything but `kernelParams`, which is rebuilt at each patch.
        params: CUDA_KERNEL_NODE_PARAMS,
        /// The packed arguments as recorded, their layout, and the bound ones.
        bytes: Box<[u8]>,
        slots: Box<[ArgSlot]>,
        bindings: Box<[ArgBinding]>,
        /// Each argument's offset in the kernel's own parameter buffer, where a patch applied
        /// on the device writes it: the driver's offset where it reports one, else the packed
        /// offset (`slots`), which a less aligned argument type can make differ.
        param_offsets: Box<[u32]>,
    },
    /// Stream work captured into a child graph node: captured again with the table's
    /// addresses.
    Work(Box<super::capture::Recapture>),
}

/// A graph node that names slots.
pub(crate) struct PatchNode {
    pub(crate) node: CUgraphNode,
    /// The slots its operands name.
    pub(crate) slots: SlotList,
    pub(crate) kind: PatchKind,
}

impl PatchNode {
    /// Gives the node's stamp bindings (recorded with `STAMP_SLOT_PENDING`) their slot.
    pub(crate) fn set_stamp_slot(&mut self, slot: u32) {
        use crate::binding::STAMP_SLOT_PENDING;
        let PatchKind::Kernel { bindings, .. } = &mut self.kind else {
            return;
        };
        if !bindings.iter().any(|b| b.slot == STAMP_SLOT_PENDING) {
            return;
        }
        for binding in bindings.iter_mut() {
            if binding.slot == STAMP_SLOT_PENDING {
                binding.slot = slot;
            }
        }
        self.slots.retain(|s| *s != STAMP_SLOT_PENDING);
        if !self.slots.contains(&slot) {
            self.slots.push(slot);
        }
    }

    /// Whether the node names a slot `changed` marks.
    fn changed(&self, changed: &[bool]) -> bool {
        self.slots.iter().any(|&s| changed[s as usize])
    }

    /// Gives the node in `exec` (`node`: this node, or its copy in the clone `exec` was
    /// instantiated from) the addresses of `table`.
    ///
    /// # Safety
    /// `exec` was instantiated from the graph that holds `node`; `context` is the graph's;
    /// `table` passed `BindingLayout::check` and covers every slot the node names.
    unsafe fn patch(
        &self,
        api: &DriverApi,
        exec: CUgraphExec,
        node: CUgraphNode,
        context: CUcontext,
        table: &[BufferRange],
        scratch: &mut ArgScratch,
    ) -> Result<(), Error> {
        match &self.kind {
            PatchKind::Memset { params, target } => {
                let params = CUDA_MEMSET_NODE_PARAMS {
                    dst: target.resolve(table),
                    ..*params
                };
                // SAFETY: the caller's contract; the range was checked against the binding's
                // length and alignment at submission.
                unsafe {
                    cu!(
                        api,
                        cuGraphExecMemsetNodeSetParams(exec, node, &params, context)
                    )
                }?;
            }
            PatchKind::Kernel {
                params,
                bytes,
                slots,
                bindings,
                ..
            } => {
                with_bound_args(scratch, bytes, slots, bindings, table, |pointers| {
                    let params = CUDA_KERNEL_NODE_PARAMS {
                        kernelParams: pointers,
                        ..*params
                    };
                    // SAFETY: as above; `pointers` holds one pointer per argument into the
                    // executable's scratch, which the driver copies before returning.
                    unsafe { cu!(api, cuGraphExecKernelNodeSetParams(exec, node, &params)) }
                })?;
            }
            PatchKind::Work(recapture) => {
                // SAFETY: the caller's contract; the node of stream work is a child graph node.
                unsafe { recapture.patch(exec, node, table) }?;
            }
        }
        Ok(())
    }
}

/// One executable of the graph and what it was last launched with.
struct Executable {
    exec: CUgraphExec,
    /// The stream it was last launched on (null: never launched).
    stream: CUstream,
    /// The address of each slot's binding at its last launch.
    bases: Box<[CUdeviceptr]>,
    last_use: u64,
    /// Its clone, helper node and patch lists, when it patches on the device.
    device: Option<DeviceSide>,
    /// Recorded on the stream after its launches once the pool tracks completions (made on
    /// the first launch that records it).
    done: Option<Event>,
    /// Whether `done` was recorded after its last launch.
    done_recorded: bool,
    /// Where host patches write kernel arguments with their slots' addresses.
    scratch: ArgScratch,
}

impl Executable {
    /// Whether no launch of it may still run: never launched, or its completion event after its
    /// last launch has completed. Unknown (no event recorded, or a failed query) counts as busy.
    fn idle(&self) -> bool {
        if self.stream.is_null() {
            return true;
        }
        match &self.done {
            Some(done) if self.done_recorded => matches!(done.query(), Ok(true)),
            _ => false,
        }
    }

    /// Records its completion event on `stream` after a launch there (creating the event on
    /// first use). A failure leaves it unknown, so busy: another stream then takes another
    /// executable, which is only slower.
    ///
    /// # Safety
    /// `stream` is a live stream of `context`, which is bound.
    unsafe fn record_done(&mut self, context: &Arc<PrimaryContext>, stream: CUstream) {
        self.done_recorded = false;
        if self.done.is_none() {
            self.done = Event::new(context, CU_EVENT_DISABLE_TIMING).ok();
        }
        if let Some(done) = &self.done {
            // SAFETY: the caller's contract.
            self.done_recorded = unsafe { done.record_raw(stream) }.is_ok();
        }
    }

    /// Patches the nodes whose slots `changed` for `table`: on the device when `patcher` wants
    /// that many kernel nodes and a patch list is free, else on the host.
    ///
    /// # Safety
    /// As [`ExecPool::launch`].
    #[allow(clippy::too_many_arguments)] // the launch's whole state, borrowed apart
    unsafe fn patch(
        &mut self,
        api: &DriverApi,
        patcher: Option<&DevicePatcher>,
        context: CUcontext,
        nodes: &[PatchNode],
        table: &[BufferRange],
        changed: &[bool],
        device_launches: &mut u64,
    ) -> Result<(), Error> {
        let exec = self.exec;
        if let (Some(patcher), Some(side)) = (patcher, self.device.as_mut()) {
            let kernels = nodes
                .iter()
                .filter(|n| matches!(n.kind, PatchKind::Kernel { .. }) && n.changed(changed))
                .count();
            if patcher.wants(kernels)
                && let Some(mut list) = side.take_list()
            {
                for (i, node) in nodes.iter().enumerate() {
                    if node.changed(changed) {
                        list.push_node(i, node, table, changed);
                    }
                }
                let count = list.count();
                // Memset and stream-work nodes are not kernels: always the host.
                for (i, node) in nodes.iter().enumerate() {
                    if !matches!(node.kind, PatchKind::Kernel { .. }) && node.changed(changed) {
                        // SAFETY: forwarded contract; `side.node(i)` is the node's copy in the
                        // graph `exec` was instantiated from.
                        unsafe {
                            node.patch(api, exec, side.node(i), context, table, &mut self.scratch)
                        }?;
                    }
                }
                // SAFETY: `exec` was instantiated from the side's clone; forwarded contract.
                unsafe { side.arm(api, exec, patcher, count) }?;
                *device_launches += 1;
                return Ok(());
            }
        }
        if let Some(side) = self.device.as_mut() {
            // SAFETY: as above.
            unsafe { side.disarm(api, exec) }?;
        }
        for (i, node) in nodes.iter().enumerate() {
            if node.changed(changed) {
                let handle = self.device.as_ref().map_or(node.node, |side| side.node(i));
                // SAFETY: forwarded contract; `handle` is a node of the graph `exec` came from.
                unsafe { node.patch(api, exec, handle, context, table, &mut self.scratch) }?;
            }
        }
        Ok(())
    }
}

/// The executables of one graph command buffer.
pub(crate) struct ExecPool {
    execs: Vec<Executable>,
    limit: usize,
    clock: u64,
    slots: usize,
    /// Scratch: which slots changed for the launch being prepared.
    changed: Vec<bool>,
    shared_launches: u64,
    /// `cuGraphInstantiateWithFlags` flags of every executable.
    flags: u64,
    /// Set when the executables patch on the device (each then has a [`DeviceSide`]).
    patcher: Option<DevicePatcher>,
    /// Launches that patched on the device.
    device_launches: u64,
    /// Set once the command buffer was launched on a second stream: from then on every launch
    /// records its executable's completion event, so other streams can tell when it is idle.
    tracking: bool,
}

impl ExecPool {
    pub(crate) fn new() -> Self {
        Self {
            execs: Vec::new(),
            limit: DEFAULT_EXECUTABLE_LIMIT,
            clock: 0,
            slots: 0,
            changed: Vec::new(),
            shared_launches: 0,
            flags: 0,
            patcher: None,
            device_launches: 0,
            tracking: false,
        }
    }

    /// Makes later executables patch on the device (before the first is instantiated).
    pub(crate) fn set_patcher(&mut self, patcher: Option<DevicePatcher>) {
        self.patcher = patcher;
    }

    /// Whether any executable patches on the device.
    pub(crate) fn patches_on_device(&self) -> bool {
        self.execs.iter().any(|e| e.device.is_some())
    }

    /// Launches that patched on the device.
    pub(crate) fn device_launches(&self) -> u64 {
        self.device_launches
    }

    /// A new executable of `graph`: of a clone with the helper node when patching on the
    /// device (a failure there falls back to the plain graph), else of `graph` itself.
    ///
    /// # Safety
    /// `graph` is complete, live, and holds the nodes of `nodes`; its context is current.
    unsafe fn instantiate(
        &mut self,
        api: &DriverApi,
        graph: CUgraph,
        nodes: &[PatchNode],
    ) -> Result<(CUgraphExec, Option<DeviceSide>), Error> {
        if let Some(patcher) = &self.patcher {
            // SAFETY: forwarded contract.
            match unsafe { patcher.instantiate(graph, nodes, self.flags) } {
                Ok((exec, side)) => return Ok((exec, Some(side))),
                Err(_) if self.execs.is_empty() => {
                    // The driver refused the device-updatable form: host patching only.
                    self.patcher = None;
                }
                Err(_) => {}
            }
        }
        let mut exec: CUgraphExec = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the graph is complete and no longer edited.
        unsafe {
            cu!(
                api,
                cuGraphInstantiateWithFlags(&mut exec, graph, self.flags)
            )
        }?;
        Ok((exec, None))
    }

    /// Instantiates the first executable (at `end()`), for `slots` binding slots.
    ///
    /// # Safety
    /// As [`Self::instantiate`].
    pub(crate) unsafe fn first_of(
        &mut self,
        api: &DriverApi,
        graph: CUgraph,
        nodes: &[PatchNode],
        slots: usize,
    ) -> Result<CUgraphExec, Error> {
        self.slots = slots;
        self.changed = vec![false; slots];
        // SAFETY: forwarded contract.
        let (exec, device) = unsafe { self.instantiate(api, graph, nodes) }?;
        self.push(exec, device);
        Ok(exec)
    }

    /// Sets the instantiation flags of the executables made later (those of the one made at
    /// `end()`).
    pub(crate) fn set_flags(&mut self, flags: u64) {
        self.flags = flags;
    }

    /// Sets the bound on executables (at least 1).
    pub(crate) fn set_limit(&mut self, limit: usize) {
        self.limit = limit.max(1);
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    fn push(&mut self, exec: CUgraphExec, device: Option<DeviceSide>) {
        self.execs.push(Executable {
            exec,
            stream: std::ptr::null_mut(),
            bases: vec![UNBOUND; self.slots].into_boxed_slice(),
            last_use: 0,
            device,
            done: None,
            done_recorded: false,
            scratch: ArgScratch::default(),
        });
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.execs.is_empty()
    }

    /// Executables instantiated so far.
    pub(crate) fn len(&self) -> usize {
        self.execs.len()
    }

    /// Launches that had to take an executable that was not idle, last launched on another
    /// stream (the limit was reached, or instantiating another failed).
    pub(crate) fn shared_launches(&self) -> u64 {
        self.shared_launches
    }

    /// The index of the executable last launched on `stream`, if any.
    pub(crate) fn executable_on(&self, stream: CUstream) -> Option<usize> {
        self.execs.iter().position(|e| e.stream == stream)
    }

    /// The executable for a launch on `stream`: the one last launched there, else an idle one
    /// (never launched, or its last launch completed), else a new one while under the limit,
    /// else (the limit reached, or instantiating failed) the least recently used, counted as
    /// shared.
    ///
    /// # Safety
    /// `graph` is the live graph the executables were instantiated from; its context is bound.
    unsafe fn choose(
        &mut self,
        api: &DriverApi,
        graph: CUgraph,
        nodes: &[PatchNode],
        stream: CUstream,
    ) -> usize {
        if let Some(i) = self.execs.iter().position(|e| e.stream == stream) {
            return i;
        }
        if let Some(i) = self.execs.iter().position(|e| e.stream.is_null()) {
            return i;
        }
        // A second stream: from now on, each launch tells when its executable is idle again.
        self.tracking = true;
        if let Some(i) = self.execs.iter().position(Executable::idle) {
            return i;
        }
        if self.execs.len() < self.limit {
            // SAFETY: forwarded contract.
            let made = unsafe { self.instantiate(api, graph, nodes) };
            if let Ok((exec, device)) = made
                && !exec.is_null()
            {
                self.push(exec, device);
                return self.execs.len() - 1;
            }
        }
        self.shared_launches += 1;
        (0..self.execs.len())
            .min_by_key(|&i| self.execs[i].last_use)
            .unwrap_or(0)
    }

    /// Patches an executable for `table` and launches it on `stream`.
    ///
    /// # Safety
    /// `graph` is the live graph behind every executable and `nodes` are its nodes with slots;
    /// the context is bound; `stream` is a live stream of it; `table` passed
    /// `BindingLayout::check` (or is empty for a graph without slots) and its memory stays
    /// allocated until the launch completes.
    pub(crate) unsafe fn launch(
        &mut self,
        api: &DriverApi,
        graph: CUgraph,
        context: &Arc<PrimaryContext>,
        nodes: &[PatchNode],
        stream: CUstream,
        table: &[BufferRange],
    ) -> Result<(), Error> {
        if self.execs.is_empty() {
            return Ok(());
        }
        // SAFETY: forwarded contract.
        let index = unsafe { self.choose(api, graph, nodes, stream) };
        self.clock += 1;
        let clock = self.clock;
        let Self {
            execs,
            changed,
            patcher,
            device_launches,
            tracking,
            ..
        } = self;
        let raw_context = context.raw();
        let executable = &mut execs[index];
        executable.stream = stream;
        executable.last_use = clock;
        if !nodes.is_empty() {
            let mut any = false;
            for (slot, entry) in table.iter().enumerate().take(changed.len()) {
                let differs = executable.bases[slot] != entry.device_ptr();
                changed[slot] = differs;
                any |= differs;
            }
            let patched = if any {
                // SAFETY: forwarded contract.
                unsafe {
                    executable.patch(
                        api,
                        patcher.as_ref(),
                        raw_context,
                        nodes,
                        table,
                        changed,
                        device_launches,
                    )
                }
            } else if let Some(side) = executable.device.as_mut() {
                // Nothing to patch: the helper must not run.
                // SAFETY: the executable was instantiated from the side's clone.
                unsafe { side.disarm(api, executable.exec) }
            } else {
                Ok(())
            };
            if let Err(e) = patched {
                // Some nodes may hold the new addresses, some the old: patch everything next
                // time (on the host or the device).
                executable.bases.fill(UNBOUND);
                if let Some(side) = executable.device.as_mut() {
                    side.release();
                }
                return Err(e);
            }
            if any {
                for (slot, entry) in table.iter().enumerate().take(changed.len()) {
                    executable.bases[slot] = entry.device_ptr();
                }
            }
        }
        // SAFETY: a live executable of this context; the caller guarantees the stream.
        let launched = unsafe { cu!(api, cuGraphLaunch(executable.exec, stream)) };
        if launched.is_ok() && *tracking {
            // SAFETY: the caller guarantees the stream; the context is bound.
            unsafe { executable.record_done(context, stream) };
        } else {
            executable.done_recorded = false;
        }
        if let Some(side) = executable.device.as_mut() {
            if launched.is_ok() {
                side.launched();
            } else {
                // The helper will not run: its list is free again, and the nodes it would have
                // patched keep their old addresses.
                side.release();
                executable.bases.fill(UNBOUND);
            }
        }
        launched?;
        Ok(())
    }

    /// Destroys every executable.
    ///
    /// # Safety
    /// The context is bound; nothing launches any more.
    pub(crate) unsafe fn destroy(&mut self, api: &DriverApi) {
        for mut e in self.execs.drain(..) {
            // SAFETY: instantiated here, destroyed once. A launch still in flight is not cut
            // short: the driver frees the executable when it completes.
            let _ = unsafe { cu!(api, cuGraphExecDestroy(e.exec)) };
            if let Some(side) = e.device.as_mut() {
                // SAFETY: its executable is destroyed; the context is bound.
                unsafe { side.destroy(api) };
            }
            // The side's patch lists are freed as it drops, after the executable.
        }
    }
}
