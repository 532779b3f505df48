//! Binding tables for graphs: the nodes that name slots, and the small pool of executables that
//! lets one command buffer run with different tables on several streams at once.
//!
//! Launches of one `CUgraphExec` are ordered behind each other by the driver, whatever stream
//! they go to, so two queues launching one shared executable would wait on each other. Each
//! stream therefore gets an executable of its own (instantiated from the same graph on first
//! use), up to a bound; past it, a stream borrows the least recently used one and
//! [`ExecPool::shared_launches`] counts it. Launches on one stream are ordered by the stream
//! anyway, so patching an executable for the next launch never changes one in flight (the
//! driver applies node-parameter changes to later launches only).
//!
//! Each executable remembers the address every slot was bound to at its last launch; a launch
//! patches only the nodes with a slot whose address differs, and an unchanged table costs one
//! comparison per slot.

use cuhal_sys::{
    CUDA_KERNEL_NODE_PARAMS, CUDA_MEMSET_NODE_PARAMS, CUcontext, CUdeviceptr, CUgraph, CUgraphExec,
    CUgraphNode, CUstream, DriverApi, cu,
};

use crate::binding::{Operand, SlotList, with_bound_args};
use crate::{ArgBinding, ArgSlot, BufferRange, Error};

/// How many executables one graph command buffer keeps by default: one per queue that runs it
/// concurrently, for up to this many queues.
pub const DEFAULT_EXECUTABLE_LIMIT: usize = 4;

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
    /// Gives the node in `exec` the addresses of `table`.
    ///
    /// # Safety
    /// `exec` was instantiated from the graph that holds `self.node`; `context` is the
    /// graph's; `table` passed `BindingLayout::check` and covers every slot the node names.
    unsafe fn patch(
        &self,
        api: &DriverApi,
        exec: CUgraphExec,
        context: CUcontext,
        table: &[BufferRange],
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
                        cuGraphExecMemsetNodeSetParams(exec, self.node, &params, context)
                    )
                }?;
            }
            PatchKind::Kernel {
                params,
                bytes,
                slots,
                bindings,
            } => {
                with_bound_args(bytes, slots, bindings, table, |pointers| {
                    let params = CUDA_KERNEL_NODE_PARAMS {
                        kernelParams: pointers,
                        ..*params
                    };
                    // SAFETY: as above; `pointers` holds one pointer per argument into this
                    // thread's scratch, which the driver copies before returning.
                    unsafe {
                        cu!(
                            api,
                            cuGraphExecKernelNodeSetParams(exec, self.node, &params)
                        )
                    }
                })?;
            }
            PatchKind::Work(recapture) => {
                // SAFETY: the caller's contract; the node of stream work is a child graph node.
                unsafe { recapture.patch(exec, self.node, table) }?;
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
        }
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

    /// Adds the executable instantiated at `end()`, for `slots` binding slots.
    pub(crate) fn first(&mut self, exec: CUgraphExec, slots: usize) {
        self.slots = slots;
        self.changed = vec![false; slots];
        self.push(exec);
    }

    fn push(&mut self, exec: CUgraphExec) {
        self.execs.push(Executable {
            exec,
            stream: std::ptr::null_mut(),
            bases: vec![UNBOUND; self.slots].into_boxed_slice(),
            last_use: 0,
        });
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.execs.is_empty()
    }

    /// Executables instantiated so far.
    pub(crate) fn len(&self) -> usize {
        self.execs.len()
    }

    /// Launches that had to reuse an executable last launched on another stream.
    pub(crate) fn shared_launches(&self) -> u64 {
        self.shared_launches
    }

    /// The executable for a launch on `stream`: the one last launched there, else a fresh one,
    /// else a new one while under the limit (if instantiating fails, one is shared instead),
    /// else the least recently used.
    ///
    /// # Safety
    /// `graph` is the live graph the executables were instantiated from; its context is bound.
    unsafe fn choose(&mut self, api: &DriverApi, graph: CUgraph, stream: CUstream) -> usize {
        if let Some(i) = self.execs.iter().position(|e| e.stream == stream) {
            return i;
        }
        if let Some(i) = self.execs.iter().position(|e| e.stream.is_null()) {
            return i;
        }
        if self.execs.len() < self.limit {
            let mut exec: CUgraphExec = std::ptr::null_mut();
            // SAFETY: valid out-pointer; the graph is complete and no longer edited.
            let made = unsafe {
                cu!(
                    api,
                    cuGraphInstantiateWithFlags(&mut exec, graph, self.flags)
                )
            };
            if made.is_ok() && !exec.is_null() {
                self.push(exec);
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
        context: CUcontext,
        nodes: &[PatchNode],
        stream: CUstream,
        table: &[BufferRange],
    ) -> Result<(), Error> {
        if self.execs.is_empty() {
            return Ok(());
        }
        // SAFETY: forwarded contract.
        let index = unsafe { self.choose(api, graph, stream) };
        self.clock += 1;
        let clock = self.clock;
        let Self { execs, changed, .. } = self;
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
            if any {
                for node in nodes {
                    if node.slots.iter().any(|&s| changed[s as usize]) {
                        // SAFETY: forwarded contract.
                        let patched = unsafe { node.patch(api, executable.exec, context, table) };
                        if let Err(e) = patched {
                            // Some nodes may hold the new addresses, some the old: patch
                            // everything next time.
                            executable.bases.fill(UNBOUND);
                            return Err(e);
                        }
                    }
                }
                for (slot, entry) in table.iter().enumerate().take(changed.len()) {
                    executable.bases[slot] = entry.device_ptr();
                }
            }
        }
        // SAFETY: a live executable of this context; the caller guarantees the stream.
        unsafe { cu!(api, cuGraphLaunch(executable.exec, stream)) }?;
        Ok(())
    }

    /// Destroys every executable.
    ///
    /// # Safety
    /// The context is bound; nothing launches any more.
    pub(crate) unsafe fn destroy(&mut self, api: &DriverApi) {
        for e in self.execs.drain(..) {
            // SAFETY: instantiated here, destroyed once. A launch still in flight is not cut
            // short: the driver frees the executable when it completes.
            let _ = unsafe { cu!(api, cuGraphExecDestroy(e.exec)) };
        }
    }
}
