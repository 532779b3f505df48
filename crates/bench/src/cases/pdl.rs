//! Case 12, programmatic dependent launch: 100 dependent dispatches of a kernel written for it
//! (`griddepcontrol.launch_dependents` first, then `griddepcontrol.wait` before it touches
//! memory), as a graph with and without programmatic edges; GPU time per step.
//!
//! Every kernel bumps a sequence counter and counts a violation when it sees the counter out of
//! order, so an edge that did not order the kernels shows. The first kernel stamps
//! `%globaltimer` after its wait, the last after its work: GPU time per step is
//! `(end - start) / 99`, with no host in it.
//!
//! Floors: the raw driver builds the same 100-node chain (1 block of 32 threads each) with full
//! edges (`cuGraphAddKernelNode` after its predecessor) and with programmatic edges
//! (`cuGraphAddDependencies_v2`, programmatic port), launches it and waits (spinning event).
//!
//! cuhal: a graph command buffer of the same dispatches with a barrier between consecutive ones,
//! the dispatches after the first marked `programmatic()` (or not); `Queue::execute` and a host
//! wait. Goals: programmatic edges at most 0.7x the plain graph's time per step, and cuhal within
//! 1.05x of the raw driver for both.

use std::sync::Arc;

use anyhow::{Context as _, Result, bail};
use cuhal::{CommandBuffer, CommandBufferMode, DeviceOptions, Dispatch, Driver, KernelArgs};
use cuhal_sys::{
    CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC, CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC, CUdeviceptr,
    CUfunction, CUgraph, CUgraphEdgeData, CUgraphExec, CUgraphNode, PrimaryContext, cu,
};

use super::{Env, progress, summarize};
use crate::gpu::raw::{DeviceWords, SyncMode, add_kernel_node};
use crate::hal::WAIT;
use crate::report::{Comparison, Goal, Report};
use cuhal_sys::{Event, Module, Stream};

/// Dispatches per chain.
pub const CHAIN: u32 = 100;
/// Replays per variant (warm-up on top).
pub const REPLAYS: usize = 1_000;
/// Programmatic edges at most this many times the plain graph's time per step.
pub const GOAL_PDL_RATIO: f64 = 0.7;
/// cuhal at most this many times the raw driver.
pub const GOAL_RATIO: f64 = 1.05;

/// `pdl_stamp(u64 *stamps, u32 *seq, u32 index, u32 last)`: see the module documentation.
/// `seq[0]` is the sequence counter, `seq[1]` the violations.
pub const PDL_PTX: &str = include_str!("pdl.ptx");

/// Runs case 12.
pub fn run(env: &Env<'_>, report: &mut Report) -> Result<()> {
    let n = env.scaled(REPLAYS);
    let warm = env.scaled(50);
    let mut raw = [0.0; 2].map(|_| None);
    let mut hal = [0.0; 2].map(|_| None);
    for (i, programmatic) in [false, true].into_iter().enumerate() {
        let what = edges(programmatic);
        progress(&format!("case 12 (pdl): raw graph, {what}, {n} replays"));
        let mut samples = raw_side(env, programmatic, warm, n)?;
        let summary = summarize("case 12 raw", &mut samples)?;
        report.measured(
            "12",
            format!("floor: GPU time per step, raw 100-node graph, {what}"),
            summary,
        );
        raw[i] = Some(summary);
        progress(&format!(
            "case 12 (pdl): cuhal graph command buffer, {what}, {n} replays"
        ));
        let mut samples = cuhal_side(env, programmatic, warm, n)?;
        hal[i] = Some(summarize("case 12 cuhal", &mut samples)?);
    }
    for (i, programmatic) in [false, true].into_iter().enumerate() {
        report.comparisons.push(Comparison::new(
            "12",
            format!(
                "pdl: GPU time per step, 100 dependent dispatches, graph command buffer, {}",
                edges(programmatic)
            ),
            hal[i],
            raw[i],
            Goal::RatioAtMost(GOAL_RATIO),
        ));
    }
    report.comparisons.push(Comparison::new(
        "12",
        "pdl: GPU time per step, raw graph, programmatic edges against full edges",
        raw[1],
        raw[0],
        Goal::RatioAtMost(GOAL_PDL_RATIO),
    ));
    report.comparisons.push(Comparison::new(
        "12",
        "pdl: GPU time per step, cuhal, programmatic dispatches against plain ones",
        hal[1],
        hal[0],
        Goal::RatioAtMost(GOAL_PDL_RATIO),
    ));
    Ok(())
}

fn edges(programmatic: bool) -> &'static str {
    if programmatic {
        "programmatic edges"
    } else {
        "full edges"
    }
}

/// GPU nanoseconds per step from the two stamps; checks the chain's order.
fn per_step(stamps: [u64; 2], violations: u32, what: &str) -> Result<f64> {
    if violations != 0 {
        bail!("{what}: {violations} kernels ran out of order");
    }
    if stamps[1] <= stamps[0] {
        bail!(
            "{what}: the last kernel's stamp {} is not after the first's {}",
            stamps[1],
            stamps[0]
        );
    }
    Ok((stamps[1] - stamps[0]) as f64 / f64::from(CHAIN - 1))
}

fn raw_side(env: &Env<'_>, programmatic: bool, warm: usize, n: usize) -> Result<Vec<f64>> {
    let gpu = env.gpu;
    let api = gpu.api();
    let module = Module::load_ptx(&gpu.ctx, PDL_PTX)?;
    let function = module.function("pdl_stamp")?;
    let stamps = DeviceWords::zeroed(&gpu.ctx, 2)?;
    let seq = DeviceWords::zeroed(&gpu.ctx, 1)?;
    let exec = chain(&gpu.ctx, function, stamps.ptr(), seq.ptr(), programmatic)?;
    let stream = Stream::new(&gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?;
    let event = Event::new(&gpu.ctx, SyncMode::Spin.flags())?;
    let mut samples = Vec::with_capacity(n);
    for i in 0..warm + n {
        // SAFETY: a live executable graph and stream of the current context.
        unsafe { cu!(api, cuGraphLaunch(exec.raw, stream.raw())) }?;
        event.record_and_synchronize(&stream)?;
        if i >= warm {
            let s = stamps.read()?;
            let violations = (seq.read()?[0] >> 32) as u32;
            samples.push(per_step([s[0], s[1]], violations, "raw chain")?);
        }
    }
    Ok(samples)
}

/// An executable 100-node chain of `pdl_stamp`, with full or programmatic edges.
struct Chain {
    ctx: Arc<PrimaryContext>,
    graph: CUgraph,
    raw: CUgraphExec,
}

impl Drop for Chain {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        let api = self.ctx.api();
        // SAFETY: created in `chain`, destroyed once, after the benchmark synchronized.
        unsafe {
            if !self.raw.is_null() {
                let _ = cu!(api, cuGraphExecDestroy(self.raw));
            }
            let _ = cu!(api, cuGraphDestroy(self.graph));
        }
    }
}

fn chain(
    ctx: &Arc<PrimaryContext>,
    function: CUfunction,
    stamps: CUdeviceptr,
    seq: CUdeviceptr,
    programmatic: bool,
) -> Result<Chain> {
    let api = ctx.api();
    let mut graph: CUgraph = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; flags must be 0.
    unsafe { cu!(api, cuGraphCreate(&mut graph, 0)) }?;
    let mut this = Chain {
        ctx: ctx.clone(),
        graph,
        raw: std::ptr::null_mut(),
    };
    if api.cuGraphAddDependencies_v2.is_none() {
        bail!("the driver has no typed graph edges (CUDA 12.3)");
    }
    let mut prev: Option<CUgraphNode> = None;
    for index in 0..CHAIN {
        let (mut a, mut b, mut c, mut d) = (stamps, seq, index, CHAIN - 1);
        let mut pointers: [*mut std::ffi::c_void; 4] = [
            (&mut a as *mut u64).cast(),
            (&mut b as *mut u64).cast(),
            (&mut c as *mut u32).cast(),
            (&mut d as *mut u32).cast(),
        ];
        let full = prev.filter(|_| !programmatic);
        // SAFETY: a live graph; `full` is a node of it; `pointers` points to locals that live
        // across the call, which copies them.
        let node = unsafe { add_kernel_node(api, graph, function, 32, &mut pointers, full) }?;
        if let (Some(p), true) = (prev, programmatic) {
            let edge = CUgraphEdgeData {
                from_port: CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC,
                to_port: 0,
                type_: CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC,
                reserved: [0; 5],
            };
            // SAFETY: both are kernel nodes of `graph`; one-element arrays of locals.
            unsafe { cu!(optional: api, cuGraphAddDependencies_v2(graph, &p, &node, &edge, 1)) }?;
        }
        prev = Some(node);
    }
    let mut raw: CUgraphExec = std::ptr::null_mut();
    // SAFETY: a complete graph; a valid out-pointer.
    unsafe { cu!(api, cuGraphInstantiateWithFlags(&mut raw, graph, 0)) }?;
    this.raw = raw;
    Ok(this)
}

fn cuhal_side(env: &Env<'_>, programmatic: bool, warm: usize, n: usize) -> Result<Vec<f64>> {
    let _ = env;
    let driver = Driver::load().context("cuhal: loading the driver")?;
    let device = driver
        .open(
            0,
            DeviceOptions {
                command_buffer_mode: CommandBufferMode::Graph,
                ..DeviceOptions::default()
            },
        )
        .context("cuhal: opening device 0")?;
    let module = device.load_ptx(PDL_PTX)?;
    let function = module.function("pdl_stamp")?;
    let stamps = device.create_buffer(16)?;
    let seq = device.create_buffer(8)?;
    seq.write(0, &[0; 8])?;
    let queue = device.queue(0);
    let mut cb = queue.create_command_buffer()?;
    for index in 0..CHAIN {
        let args = KernelArgs::new()
            .with(stamps.device_ptr())
            .with(seq.device_ptr())
            .with(index)
            .with(CHAIN - 1);
        let mut d = Dispatch::new(&function, [1, 1, 1], [32, 1, 1], &args);
        if index > 0 {
            cb.barrier()?;
            if programmatic {
                d = d.programmatic();
            }
        }
        cb.dispatch(&d)?;
    }
    let cb: Arc<dyn CommandBuffer> = cb.end()?;
    let semaphore = device.create_semaphore(0);
    let mut samples = Vec::with_capacity(n);
    for i in 0..warm + n {
        let value = (i + 1) as u64;
        queue.execute(&[], &[(&semaphore, value)], &[&cb])?;
        semaphore
            .wait(value, WAIT)
            .context("cuhal: waiting for the chain")?;
        if i >= warm {
            let mut s = [0u8; 16];
            stamps.read(0, &mut s)?;
            let mut q = [0u8; 8];
            seq.read(0, &mut q)?;
            let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]));
            let violations = u32::from_ne_bytes(q[4..8].try_into().unwrap_or([0; 4]));
            samples.push(per_step(
                [word(&s[..8]), word(&s[8..])],
                violations,
                "cuhal chain",
            )?);
        }
    }
    Ok(samples)
}
