//! Owned raw driver objects for the floors, besides `cuhal-sys`'s streams, events and modules:
//! each is created and destroyed with the plain driver calls the floor measures, nothing of
//! cuhal's in between.
//!
//! Every object keeps the primary context alive and makes it current before it is destroyed, so
//! drop order never matters. Destruction errors are ignored: a benchmark that already failed
//! has reported why.

use std::ffi::{c_uint, c_void};
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use anyhow::{Context as _, Result, bail};
use cuhal_sys::{
    CU_EVENT_BLOCKING_SYNC, CU_EVENT_DISABLE_TIMING, CUDA_KERNEL_NODE_PARAMS, CUdeviceptr,
    CUfunction, CUgraph, CUgraphExec, CUgraphNode, CUstream, DriverApi, MappedHostMemory,
    PrimaryContext, cu,
};

/// How an event's host waits behave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    /// `cuEventSynchronize` spins (the default; what cuhal's completion events use).
    Spin,
    /// `CU_EVENT_BLOCKING_SYNC`: the waiting thread sleeps in the driver.
    Blocking,
}

impl SyncMode {
    /// The `cuEventCreate` flags of a `CU_EVENT_DISABLE_TIMING` event with this mode.
    pub fn flags(self) -> c_uint {
        match self {
            SyncMode::Spin => CU_EVENT_DISABLE_TIMING,
            SyncMode::Blocking => CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC,
        }
    }
}

/// Device memory holding `u64` words.
pub struct DeviceWords {
    ctx: Arc<PrimaryContext>,
    ptr: CUdeviceptr,
    words: usize,
}

impl DeviceWords {
    /// Allocates `words` zeroed words.
    pub fn zeroed(ctx: &Arc<PrimaryContext>, words: usize) -> Result<Self> {
        let api = ctx.api();
        let mut ptr = 0;
        // SAFETY: `ptr` is a valid out-pointer.
        unsafe { cu!(api, cuMemAlloc(&mut ptr, words * 8)) }?;
        let this = Self {
            ctx: ctx.clone(),
            ptr,
            words,
        };
        this.write(&vec![0; words])?;
        Ok(this)
    }

    /// The device address.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The address of word `i`.
    pub fn word(&self, i: usize) -> CUdeviceptr {
        debug_assert!(i < self.words);
        self.ptr + 8 * i as u64
    }

    /// Reads every word. Synchronous on the legacy stream only: synchronize the streams that
    /// write it first.
    pub fn read(&self) -> Result<Vec<u64>> {
        let mut out = vec![0u64; self.words];
        let api = self.ctx.api();
        // SAFETY: `out` has room for the allocation's `words * 8` bytes.
        unsafe {
            cu!(
                api,
                cuMemcpyDtoH(out.as_mut_ptr().cast(), self.ptr, self.words * 8)
            )
        }?;
        Ok(out)
    }

    /// Overwrites the first `values.len()` words.
    pub fn write(&self, values: &[u64]) -> Result<()> {
        if values.len() > self.words {
            bail!("writing {} words into {}", values.len(), self.words);
        }
        let api = self.ctx.api();
        // SAFETY: the source holds `values.len() * 8` bytes; the allocation is at least as large.
        unsafe {
            cu!(
                api,
                cuMemcpyHtoD(self.ptr, values.as_ptr().cast(), values.len() * 8)
            )
        }?;
        Ok(())
    }
}

impl Drop for DeviceWords {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: a live allocation, freed once.
        let _ = unsafe { cu!(self.ctx.api(), cuMemFree(self.ptr)) };
    }
}

/// Pinned host memory mapped into the device's address space: `u32` flags the GPU writes and a
/// host thread watches.
pub struct MappedFlags {
    memory: MappedHostMemory,
    count: usize,
}

impl MappedFlags {
    /// Allocates `count` zeroed flags.
    pub fn new(ctx: &Arc<PrimaryContext>, count: usize) -> Result<Self> {
        Ok(Self {
            memory: MappedHostMemory::new(ctx, count.max(1) * 4)?,
            count,
        })
    }

    /// The device address of flag `i`.
    pub fn device(&self, i: usize) -> CUdeviceptr {
        assert!(i < self.count);
        self.memory.device_ptr() + 4 * i as u64
    }

    /// Flag `i`, as the host sees it.
    pub fn flag(&self, i: usize) -> &AtomicU32 {
        assert!(i < self.count);
        self.memory.word(i)
    }
}

/// Adds a one-block kernel node of `block_x` threads to `graph`, depending on `dependency` when
/// given, and returns it.
///
/// # Safety
/// `graph` is a live graph of the current context, `dependency` one of its nodes, and
/// `pointers` points to the kernel's argument values (one per parameter, live during the call).
pub unsafe fn add_kernel_node(
    api: &DriverApi,
    graph: CUgraph,
    function: CUfunction,
    block_x: c_uint,
    pointers: &mut [*mut c_void],
    dependency: Option<CUgraphNode>,
) -> Result<CUgraphNode> {
    let params = CUDA_KERNEL_NODE_PARAMS {
        blockDimX: block_x,
        ..CUDA_KERNEL_NODE_PARAMS::one_thread(function, pointers.as_mut_ptr())
    };
    let mut added = std::ptr::null_mut();
    let (deps, count) = match &dependency {
        Some(p) => (p as *const CUgraphNode, 1),
        None => (std::ptr::null(), 0),
    };
    // SAFETY: the caller's guarantees; `deps` points to `count` nodes of the graph and
    // `params` lives across the call (the driver copies it and the argument values).
    unsafe {
        cu!(
            api,
            cuGraphAddKernelNode(&mut added, graph, deps, count, &params)
        )
    }?;
    Ok(added)
}

/// An instantiated graph.
pub struct GraphExec {
    ctx: Arc<PrimaryContext>,
    raw: CUgraphExec,
    /// The graph it was instantiated from, kept until the executable is destroyed: the
    /// executable's node-update calls name nodes of this graph.
    graph: CUgraph,
    /// The kernel nodes, in chain order (nodes of `graph`).
    nodes: Vec<CUgraphNode>,
}

impl GraphExec {
    /// Builds a graph of kernel nodes, each depending on the one before it (a chain; one node
    /// is a one-node graph), and instantiates it. Each node's arguments are copied at creation.
    pub fn chain(ctx: &Arc<PrimaryContext>, nodes: &mut [KernelNode]) -> Result<Self> {
        let api = ctx.api();
        let mut graph: CUgraph = std::ptr::null_mut();
        // SAFETY: `graph` is a valid out-pointer; flags must be 0.
        unsafe { cu!(api, cuGraphCreate(&mut graph, 0)) }?;
        let result = Self::fill_and_instantiate(ctx, graph, nodes);
        if result.is_err() {
            // SAFETY: the graph is live and nothing was instantiated from it.
            let _ = unsafe { cu!(api, cuGraphDestroy(graph)) };
        }
        result
    }

    fn fill_and_instantiate(
        ctx: &Arc<PrimaryContext>,
        graph: CUgraph,
        nodes: &mut [KernelNode],
    ) -> Result<Self> {
        let api = ctx.api();
        let mut prev: Option<CUgraphNode> = None;
        let mut added_nodes = Vec::with_capacity(nodes.len());
        for node in nodes.iter_mut() {
            let mut pointers = node.args.pointers();
            // SAFETY: a live graph; `prev` is a node of it; `pointers` points to the node's
            // argument values, which live across the call (the driver copies them).
            let added =
                unsafe { add_kernel_node(api, graph, node.function, 1, &mut pointers, prev) }?;
            prev = Some(added);
            added_nodes.push(added);
        }
        let mut raw = std::ptr::null_mut();
        // SAFETY: a complete graph; `raw` is a valid out-pointer.
        unsafe { cu!(api, cuGraphInstantiateWithFlags(&mut raw, graph, 0)) }?;
        Ok(Self {
            ctx: ctx.clone(),
            raw,
            graph,
            nodes: added_nodes,
        })
    }

    /// The handle.
    pub fn raw(&self) -> CUgraphExec {
        self.raw
    }

    /// Gives kernel node `index` (of [`GraphExec::chain`]'s nodes) new arguments for the
    /// executable's next launches, with `cuGraphExecKernelNodeSetParams`: what a caller of the
    /// driver does to rebind a recorded dispatch to new buffers.
    pub fn set_kernel_args(&self, index: usize, node: &mut KernelNode) -> Result<()> {
        let graph_node = *self
            .nodes
            .get(index)
            .context("GraphExec::set_kernel_args: no such node")?;
        let mut pointers = node.args.pointers();
        let params = CUDA_KERNEL_NODE_PARAMS::one_thread(node.function, pointers.as_mut_ptr());
        // SAFETY: a live executable and one of its graph's kernel nodes, whose function is
        // unchanged; `params` and the argument values `pointers` points to live across the
        // call (the driver copies them).
        unsafe {
            cu!(
                self.ctx.api(),
                cuGraphExecKernelNodeSetParams(self.raw, graph_node, &params)
            )
        }?;
        Ok(())
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: a live executable graph, destroyed once after its launches completed; then
        // the graph it was instantiated from, which nothing else uses.
        let _ = unsafe { cu!(self.ctx.api(), cuGraphExecDestroy(self.raw)) };
        // SAFETY: see above.
        let _ = unsafe { cu!(self.ctx.api(), cuGraphDestroy(self.graph)) };
    }
}

/// One kernel node of [`GraphExec::chain`].
pub struct KernelNode {
    /// The kernel.
    pub function: CUfunction,
    /// Its arguments.
    pub args: Args,
}

/// A kernel's arguments, by value.
#[derive(Clone, Copy, Debug)]
pub enum Args {
    /// `empty()`.
    None,
    /// `step(counter, errors, index, period)`.
    Step {
        /// Address of the `u32` counter.
        counter: CUdeviceptr,
        /// Address of the `u32` violation count.
        errors: CUdeviceptr,
        /// This launch's place in its chain.
        index: u32,
        /// The chain's length.
        period: u32,
    },
    /// `spin(ns, record, flag, jitter)`.
    Spin {
        /// How long to spin.
        ns: u64,
        /// Address of the three-word record (count, start, end).
        record: CUdeviceptr,
        /// Address of the mapped host flag, or 0.
        flag: CUdeviceptr,
        /// Upper bound of the extra SM cycles spun after `ns` (0 for none).
        jitter: u64,
    },
    /// `timer_probe(out, iters)`.
    Probe {
        /// Address of the three result words.
        out: CUdeviceptr,
        /// Reads to make.
        iters: u32,
    },
}

impl Args {
    /// The `kernelParams` array for these arguments: pointers into `self`, so `self` must stay
    /// where it is until the launch call returns.
    pub fn pointers(&mut self) -> [*mut c_void; 4] {
        fn p<T>(x: &mut T) -> *mut c_void {
            (x as *mut T).cast()
        }
        let null = std::ptr::null_mut();
        match self {
            Args::None => [null; 4],
            Args::Step {
                counter,
                errors,
                index,
                period,
            } => [p(counter), p(errors), p(index), p(period)],
            Args::Spin {
                ns,
                record,
                flag,
                jitter,
            } => [p(ns), p(record), p(flag), p(jitter)],
            Args::Probe { out, iters } => [p(out), p(iters), null, null],
        }
    }
}

/// Launches `function` as one thread on `stream`.
#[inline]
pub fn launch(
    api: &DriverApi,
    function: CUfunction,
    stream: CUstream,
    args: &mut Args,
) -> Result<()> {
    let mut pointers = args.pointers();
    // SAFETY: `pointers` points at argument values in `args` that match the kernel's parameter
    // list (the `Args` variant is chosen per kernel); both outlive the call, which copies them.
    unsafe {
        cu!(
            api,
            cuLaunchKernel(
                function,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream,
                pointers.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        )
    }?;
    Ok(())
}
