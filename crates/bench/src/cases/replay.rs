//! Case 4, command buffer replay: 100 tiny dispatches, each depending on the one before, replayed
//! and waited for; wall time per replay, submit to the host's return.
//!
//! The dispatches are `step` kernels with indices 0..100, so a replay whose order broke counts a
//! violation on the device, and the launch count is checked after every variant.
//!
//! Floors: `cuGraphLaunch` of a 100-node chain graph, and 100 `cuLaunchKernel` back to back on
//! one stream; each followed by `cuEventRecord` and `cuEventSynchronize` (spinning event).
//!
//! cuhal: a command buffer of 100 dispatches with a barrier between each, recorded once, as a
//! graph (compared with the graph floor) and as a deferred command buffer replayed onto the
//! stream (compared with the 100 launches); `Queue::execute` with one signal, then a host wait
//! on the semaphore.

use cuhal_sys::cu;
use std::sync::Arc;

use anyhow::Result;
use cuhal::{
    CommandBufferMode, CuptiChoice, DeviceOptions, FineSampling, MemorySink, Sink, Verbosity,
};

use super::{Env, progress, summarize};
use crate::gpu::StepCounter;
use crate::gpu::raw::{Args, GraphExec, KernelNode, SyncMode, launch};
use crate::hal::Hal;
use crate::report::{Comparison, Goal, Report};
use crate::stats::Summary;
use cuhal_sys::{Event, Stream};

/// Dispatches per command buffer.
pub const CHAIN: u32 = 100;
/// Replays per variant (warm-up on top).
pub const REPLAYS: usize = 2_000;
/// The goal: cuhal at most this many times the floor.
pub const GOAL_RATIO: f64 = 1.1;
/// The design's goal for 100 dependent dispatches, submit to host return.
pub const GOAL_100_NS: f64 = 80_000.0;

/// The two floors, for case 6 to reuse.
pub struct Floors {
    /// One graph launch of the chain, then wait.
    pub graph: Summary,
    /// 100 launches, then wait.
    pub stream: Summary,
}

/// Runs case 4.
pub fn run(env: &Env<'_>, report: &mut Report) -> Result<()> {
    let floors = floors(env)?;
    report.measured(
        "4",
        "floor: cuGraphLaunch of a 100-node chain + record + sync, per replay",
        floors.graph,
    );
    report.measured(
        "4",
        "floor: 100 x cuLaunchKernel + record + sync, per replay",
        floors.stream,
    );
    let n = env.scaled(REPLAYS);
    let warm = env.scaled(50);
    progress(&format!(
        "case 4 (replay): cuhal graph command buffer, {n} replays"
    ));
    let mut graph = cuhal_replay(env, CommandBufferMode::Graph, Verbosity::Off, warm, n)?;
    let graph = summarize("case 4 cuhal graph", &mut graph.samples)?;
    progress(&format!(
        "case 4 (replay): cuhal deferred command buffer, {n} replays"
    ));
    let mut deferred = cuhal_replay(env, CommandBufferMode::Deferred, Verbosity::Off, warm, n)?;
    let deferred = summarize("case 4 cuhal deferred", &mut deferred.samples)?;
    for (name, cuhal, floor, goal) in [
        (
            "replay: 100 dependent dispatches as a graph command buffer, submit + host wait",
            graph,
            floors.graph,
            Goal::RatioAtMost(GOAL_RATIO),
        ),
        (
            "replay: 100 dependent dispatches as a deferred (stream) command buffer, submit + host wait",
            deferred,
            floors.stream,
            Goal::RatioAtMost(GOAL_RATIO),
        ),
        (
            "replay: 100 dependent dispatches, graph, against the design's absolute goal",
            graph,
            floors.graph,
            Goal::AtMost(GOAL_100_NS),
        ),
    ] {
        let comparison = Comparison::new("4", name, Some(cuhal), Some(floor), goal);
        report.comparisons.push(comparison);
    }
    Ok(())
}

/// What a cuhal replay run found.
pub struct Replay {
    /// Per replay, submit to the host's return from the semaphore wait.
    pub samples: Vec<f64>,
    /// Zones the queue's tracing recorded, collected and dropped (all 0 untraced).
    pub zones: ZoneCounts,
}

/// Tracing's zone counters after a run.
#[derive(Clone, Copy, Debug, Default)]
pub struct ZoneCounts {
    /// Zones recorded into command buffers.
    pub recorded: u64,
    /// Zones collected and handed to the sink.
    pub collected: u64,
    /// Zones dropped, for any reason.
    pub dropped: u64,
    /// Where FINE command zones got their times (CUPTI or events).
    pub fine_source: cuhal_trace::FineSource,
    /// Why CUPTI was not used, when FINE fell back to events.
    pub cupti_unavailable: Option<&'static str>,
    /// Command zones timed from CUPTI activity records.
    pub activity_zones: u64,
    /// Replays FINE sampled and did not sample ([`cuhal::FineSampling`]; both 0 when every
    /// replay is traced).
    pub sampled_replays: u64,
    /// See `sampled_replays`.
    pub unsampled_replays: u64,
    /// Zones timed by the kernels' own stamps.
    pub stamp_zones: u64,
}

/// cuhal's side: a 100-dispatch command buffer (a barrier between dispatches) of `mode`,
/// executed with one signal and waited for on the host, `warm + n` times; tracing at
/// `verbosity` into a memory sink.
pub fn cuhal_replay(
    env: &Env<'_>,
    mode: CommandBufferMode,
    verbosity: Verbosity,
    warm: usize,
    n: usize,
) -> Result<Replay> {
    cuhal_replay_sampled(env, mode, verbosity, FineSampling::Every, None, warm, n)
}

/// [`cuhal_replay`] with FINE sampling replays as `sampling` says, and the chain's kernels
/// timed by their own zone stamps (`step_stamped`) where `stamp_slots` gives the size of the
/// trace's stamp ring.
pub fn cuhal_replay_sampled(
    env: &Env<'_>,
    mode: CommandBufferMode,
    verbosity: Verbosity,
    sampling: FineSampling,
    stamp_slots: Option<u32>,
    warm: usize,
    n: usize,
) -> Result<Replay> {
    let traced = verbosity != Verbosity::Off;
    let stamped = stamp_slots.is_some();
    let defaults = DeviceOptions::default();
    let hal = Hal::open(DeviceOptions {
        command_buffer_mode: mode,
        tracing: verbosity,
        trace_sink: traced.then(|| Arc::new(MemorySink::new()) as Arc<dyn Sink>),
        fine_sampling: sampling,
        // Stamped kernels time themselves: CUPTI's activity kinds, held on at FINE, would
        // cost every launch its price (case 6's FINE row) for nothing.
        cupti: if stamped {
            CuptiChoice::Off
        } else {
            CuptiChoice::Auto
        },
        trace_stamp_slots: stamp_slots.unwrap_or(defaults.trace_stamp_slots),
        ..defaults
    })?;
    let mut counter = StepCounter::new(env.gpu)?;
    let dispatches: Vec<Args> = (0..CHAIN).map(|i| counter.args(i, CHAIN)).collect();
    let cb = hal.command_buffer_of(0, &dispatches, stamped)?;
    let samples = hal.time_round_trips(0, &cb, env.clock, warm, n)?;
    counter.expect_more(((warm + n) * CHAIN as usize) as u64);
    counter.check(&format!("case 4 cuhal ({mode:?}, tracing {verbosity:?})"))?;
    // The completion thread collects a submission's zones just after it signals.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let zones = hal
        .device
        .queue(0)
        .trace()
        .map_or_else(ZoneCounts::default, |trace| {
            let stats = trace.stats();
            ZoneCounts {
                recorded: stats.zones_recorded,
                collected: stats.zones_collected,
                dropped: stats.dropped.total(),
                fine_source: stats.fine_source,
                cupti_unavailable: stats.cupti_unavailable,
                activity_zones: stats.activity_zones,
                stamp_zones: stats.stamp_zones,
                sampled_replays: stats.sampled_replays,
                unsampled_replays: stats.unsampled_replays,
            }
        });
    Ok(Replay { samples, zones })
}

/// Measures both floors.
pub fn floors(env: &Env<'_>) -> Result<Floors> {
    let n = env.scaled(REPLAYS);
    let warm = env.scaled(50);
    progress(&format!("case 4 (replay): graph floor, {n} replays"));
    let mut graph = graph_floor_with(env, warm, n, || Ok(()))?;
    progress(&format!("case 4 (replay): stream floor, {n} replays"));
    let mut stream = stream_floor(env, warm, n)?;
    Ok(Floors {
        graph: summarize("case 4 graph floor", &mut graph)?,
        stream: summarize("case 4 stream floor", &mut stream)?,
    })
}

/// The graph floor's samples: `cuGraphLaunch` of the 100-node chain, record, sync, then `after`
/// (inside the timed span: case 6 uses it to add a CUPTI flush per replay).
pub fn graph_floor_with(
    env: &Env<'_>,
    warm: usize,
    n: usize,
    mut after: impl FnMut() -> Result<()>,
) -> Result<Vec<f64>> {
    let gpu = env.gpu;
    let api = gpu.api();
    let stream = Stream::new(&gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?;
    let event = Event::new(&gpu.ctx, SyncMode::Spin.flags())?;
    let mut counter = StepCounter::new(gpu)?;
    let mut nodes: Vec<KernelNode> = (0..CHAIN)
        .map(|i| KernelNode {
            function: gpu.kernels.step,
            args: counter.args(i, CHAIN),
        })
        .collect();
    let exec = GraphExec::chain(&gpu.ctx, &mut nodes)?;
    let samples = env.time(warm, n, || {
        // SAFETY: a live executable graph and stream.
        unsafe { cu!(api, cuGraphLaunch(exec.raw(), stream.raw())) }?;
        event.record_and_synchronize(&stream)?;
        after()
    })?;
    stream.synchronize()?;
    counter.expect_more(((warm + n) * CHAIN as usize) as u64);
    counter.check("case 4 graph floor")?;
    Ok(samples)
}

fn stream_floor(env: &Env<'_>, warm: usize, n: usize) -> Result<Vec<f64>> {
    let gpu = env.gpu;
    let api = gpu.api();
    let stream = Stream::new(&gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?;
    let event = Event::new(&gpu.ctx, SyncMode::Spin.flags())?;
    let mut counter = StepCounter::new(gpu)?;
    let mut args: Vec<_> = (0..CHAIN).map(|i| counter.args(i, CHAIN)).collect();
    let samples = env.time(warm, n, || {
        for a in args.iter_mut() {
            launch(api, gpu.kernels.step, stream.raw(), a)?;
        }
        Ok(event.record_and_synchronize(&stream)?)
    })?;
    stream.synchronize()?;
    counter.expect_more(((warm + n) * CHAIN as usize) as u64);
    counter.check("case 4 stream floor")?;
    Ok(samples)
}
