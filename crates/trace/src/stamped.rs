//! Stamped kernels timed between events, on CUDA: how [`CudaEvents`](crate::CudaEvents)
//! measures what timing events add to a command's zone (see `context::event_bias`).
//!
//! Each trial is a one-thread kernel that reads `%globaltimer` as its first instruction, spins,
//! stores its readings and takes a last reading once they reached memory (`membar.gl`): its own
//! span, first instruction to last. Around it sit two timing events placed as a command buffer
//! places a FINE command zone's: `cuEventRecord` on the stream right before and after the launch,
//! or, in a graph, an event-record node, the kernel node after it and an event-record node after
//! that, trial after trial in one chain. On the stream, a gate kernel that spins long enough for
//! the host to enqueue every trial runs first, so no trial's begin event runs before the host has
//! issued its kernel: what is measured is the GPU's work between the events, not the host's call.

use std::ffi::c_void;
use std::sync::Arc;

use cuhal_command::EventPlacement;
use cuhal_sys::{
    CUDA_KERNEL_NODE_PARAMS, CUdeviceptr, CUfunction, CUgraph, CUgraphExec, CUgraphNode, CUstream,
    Event, Module, PrimaryContext, Stream, cu,
};

use crate::Error;

/// One stamped kernel timed between two events: what the events read, and what the kernel read
/// of itself.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct StampedKernel {
    /// From the begin event to the end event (`cuEventElapsedTime`), in nanoseconds.
    pub zone_ns: u64,
    /// The kernel's own span: its first `%globaltimer` reading to one taken after its stores
    /// reached memory, in nanoseconds. 0: the kernel did not run (no stamps).
    pub span_ns: u64,
}

/// `cuhal_stamped_spin(u64 ns, u64 *out)`: one thread reads `%globaltimer` as its first
/// instruction, spins until `ns` have passed since then, stores that first reading to `out[0]`
/// and `out[1]` and the loop's last to `out[2]`, waits for the stores to reach memory
/// (`membar.gl`) and stores a last reading to `out[3]`. `out[3] - out[0]` is the kernel's own
/// span.
const STAMPED_SPIN_PTX: &str = include_str!("stamped_spin.ptx");

/// The entry point of [`STAMPED_SPIN_PTX`].
const STAMPED_SPIN_NAME: &str = "cuhal_stamped_spin";

/// Bytes of stamps per kernel.
const STAMP_BYTES: usize = 32;

/// How long the gate kernel spins per trial queued behind it: far above what the host takes to
/// enqueue a trial's two records and launch (a few microseconds).
const GATE_NS_PER_TRIAL: u64 = 25_000;

/// Device memory (`cuMemAlloc`), freed on drop.
struct DeviceMemory<'a> {
    context: &'a Arc<PrimaryContext>,
    address: CUdeviceptr,
}

impl<'a> DeviceMemory<'a> {
    fn zeroed(context: &'a Arc<PrimaryContext>, bytes: usize) -> Result<Self, Error> {
        let api = context.api();
        let mut address: CUdeviceptr = 0;
        // SAFETY: a valid out-pointer; the context is current (the caller entered it).
        unsafe { cu!(api, cuMemAlloc(&mut address, bytes)) }?;
        let memory = Self { context, address };
        let zeros = vec![0u8; bytes];
        // SAFETY: `zeros` holds `bytes` bytes and outlives the (synchronous) call; the
        // allocation holds as many.
        unsafe { cu!(api, cuMemcpyHtoD(address, zeros.as_ptr().cast(), bytes)) }?;
        Ok(memory)
    }

    /// Reads `out.len()` words from the start (synchronous: after the work that wrote them).
    fn read(&self, out: &mut [u64]) -> Result<(), Error> {
        let bytes = std::mem::size_of_val(out);
        // SAFETY: `out` has room for `bytes`; the allocation holds at least as many (the caller
        // sized both from the trial count).
        unsafe {
            cu!(
                self.context.api(),
                cuMemcpyDtoH(out.as_mut_ptr().cast(), self.address, bytes)
            )
        }?;
        Ok(())
    }
}

impl Drop for DeviceMemory<'_> {
    fn drop(&mut self) {
        // SAFETY: allocated by `zeroed` and freed once; the work that used it was waited for
        // (or never issued), and a free fails only on a lost context.
        let _ = unsafe { cu!(self.context.api(), cuMemFree(self.address)) };
    }
}

/// A graph and its executable, destroyed on drop.
struct Graph<'a> {
    context: &'a Arc<PrimaryContext>,
    graph: CUgraph,
    exec: CUgraphExec,
}

impl Drop for Graph<'_> {
    fn drop(&mut self) {
        let api = self.context.api();
        // SAFETY: made by `graph_trials`, destroyed once; its launch was waited for (or never
        // made).
        unsafe {
            if !self.exec.is_null() {
                let _ = cu!(api, cuGraphExecDestroy(self.exec));
            }
            let _ = cu!(api, cuGraphDestroy(self.graph));
        }
    }
}

/// See [`EventBackend::time_stamped_kernels`](crate::EventBackend::time_stamped_kernels).
pub(crate) fn time_stamped_kernels(
    context: &Arc<PrimaryContext>,
    stream: &Stream,
    placement: EventPlacement,
    trials: usize,
    spin_ns: u64,
    out: &mut Vec<StampedKernel>,
) -> Result<(), Error> {
    if trials == 0 {
        return Ok(());
    }
    let module = Module::load_ptx(context, STAMPED_SPIN_PTX)?;
    let function = module.function(STAMPED_SPIN_NAME)?;
    // One slot per trial, and one for the gate.
    let stamps = DeviceMemory::zeroed(context, STAMP_BYTES * (trials + 1))?;
    let events = (0..2 * trials)
        .map(|_| Event::new(context, 0))
        .collect::<Result<Vec<_>, _>>()?;
    let slot = |i: usize| stamps.address + (STAMP_BYTES * i) as CUdeviceptr;
    match placement {
        EventPlacement::Stream => {
            let gate = GATE_NS_PER_TRIAL.saturating_mul(trials as u64);
            launch(context, function, stream.raw(), gate, slot(trials))?;
            for (i, pair) in events.chunks_exact(2).enumerate() {
                pair[0].record(stream)?;
                launch(context, function, stream.raw(), spin_ns, slot(i))?;
                pair[1].record(stream)?;
            }
            stream.synchronize()?;
        }
        EventPlacement::Graph => {
            let graph = graph_trials(context, function, &events, spin_ns, &slot)?;
            // SAFETY: both handles are live objects of this context.
            unsafe { cu!(context.api(), cuGraphLaunch(graph.exec, stream.raw())) }?;
            stream.synchronize()?;
        }
    }
    let mut words = vec![0u64; 4 * trials];
    stamps.read(&mut words)?;
    for (pair, stamp) in events.chunks_exact(2).zip(words.chunks_exact(4)) {
        let zone_ns = match pair[0].elapsed_ms(&pair[1])? {
            Some(ms) if ms.is_finite() && ms > 0.0 => (f64::from(ms) * 1e6).round() as u64,
            _ => 0,
        };
        let span_ns = if stamp[0] == 0 {
            0
        } else {
            stamp[3].saturating_sub(stamp[0])
        };
        out.push(StampedKernel { zone_ns, span_ns });
    }
    Ok(())
}

/// Launches one thread of `function` (the stamped spin) on `stream`.
fn launch(
    context: &Arc<PrimaryContext>,
    function: CUfunction,
    stream: CUstream,
    spin_ns: u64,
    out: CUdeviceptr,
) -> Result<(), Error> {
    let (mut ns, mut out) = (spin_ns, out);
    let mut params: [*mut c_void; 2] = [(&raw mut ns).cast(), (&raw mut out).cast()];
    // SAFETY: the kernel takes (u64, u64) and `params` points at one of each, read during the
    // call; the function and stream are live objects of the current context.
    unsafe {
        cu!(
            context.api(),
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
                params.as_mut_ptr(),
                std::ptr::null_mut()
            )
        )
    }?;
    Ok(())
}

/// A graph of one chain: for each trial an event-record node, the stamped kernel after it and
/// an event-record node after that, the next trial after the last; instantiated.
fn graph_trials<'a>(
    context: &'a Arc<PrimaryContext>,
    function: CUfunction,
    events: &[Event],
    spin_ns: u64,
    slot: &dyn Fn(usize) -> CUdeviceptr,
) -> Result<Graph<'a>, Error> {
    let api = context.api();
    let mut raw: CUgraph = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; flags must be 0.
    unsafe { cu!(api, cuGraphCreate(&mut raw, 0)) }?;
    let mut graph = Graph {
        context,
        graph: raw,
        exec: std::ptr::null_mut(),
    };
    let mut tail: Option<CUgraphNode> = None;
    for (i, pair) in events.chunks_exact(2).enumerate() {
        let begin = add_event_node(context, graph.graph, tail, pair[0].raw())?;
        let (mut ns, mut out) = (spin_ns, slot(i));
        let mut params: [*mut c_void; 2] = [(&raw mut ns).cast(), (&raw mut out).cast()];
        let node_params = CUDA_KERNEL_NODE_PARAMS::one_thread(function, params.as_mut_ptr());
        let mut kernel: CUgraphNode = std::ptr::null_mut();
        // SAFETY: the parameters are copied into the graph during the call; `begin` is a node
        // of this graph, passed with its count; every handle is live.
        unsafe {
            cu!(
                api,
                cuGraphAddKernelNode(&mut kernel, graph.graph, &begin, 1, &node_params)
            )
        }?;
        tail = Some(add_event_node(
            context,
            graph.graph,
            Some(kernel),
            pair[1].raw(),
        )?);
    }
    // SAFETY: a valid out-pointer; the graph is complete.
    unsafe {
        cu!(
            api,
            cuGraphInstantiateWithFlags(&mut graph.exec, graph.graph, 0)
        )
    }?;
    Ok(graph)
}

/// Adds a node recording `event` to `graph` after `dep` (none: a root).
fn add_event_node(
    context: &Arc<PrimaryContext>,
    graph: CUgraph,
    dep: Option<CUgraphNode>,
    event: cuhal_sys::CUevent,
) -> Result<CUgraphNode, Error> {
    let mut node: CUgraphNode = std::ptr::null_mut();
    let (deps, count): (*const CUgraphNode, usize) = match &dep {
        Some(d) => (d, 1),
        None => (std::ptr::null(), 0),
    };
    // SAFETY: a valid out-pointer; `deps` points at `count` nodes of `graph` that outlive the
    // call (or is null with none); the event is a live timing event of this context.
    unsafe {
        cu!(
            optional: context.api(),
            cuGraphAddEventRecordNode(&mut node, graph, deps, count, event)
        )
    }?;
    Ok(node)
}
