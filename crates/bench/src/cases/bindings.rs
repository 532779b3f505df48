//! Case 11, binding tables: case 4's 100 dependent dispatches and case 5's one dispatch, each
//! submission bound to other buffers than the one before.
//!
//! The `step` kernels name their counter and error words as binding slots; each submission
//! passes the table of the other of two counters, so every binding differs from the
//! executable's last launch and a graph patches all 100 kernel nodes
//! (`cuGraphExecKernelNodeSetParams`) before launching. The device checks that every chain ran
//! in order on the counter its table named.
//!
//! Rows, all submit + host wait per submission:
//! - graph, every binding changed, against the same graph with an unchanged table (goal: at
//!   most 1.1x) and against the raw `cuGraphLaunch` floor of case 4 (reported);
//! - graph, every binding changed, against the deferred command buffer replayed with the same
//!   alternating tables (goal: at least 3x faster, i.e. at most 0.33x);
//! - graph, every binding changed, against what a caller does without binding tables: record a
//!   new command buffer for the new buffers, `end()` (instantiate), submit (reported);
//! - the cost of patching per node: (changed - unchanged median) / 100, with the default
//!   method (`PatchMethod::Auto`: 100 changed kernel nodes are patched on the device, by the
//!   `cuhal_bindings_apply` node at the graph's head), and again for each method forced: on the
//!   host (`cuGraphExecKernelNodeSetParams` per node) and on the device, each against its own
//!   unchanged replay; and the host-patched replay against its unchanged one (reported);
//! - heap allocations per submission of the changed-table replay, whole process (goal: 0; only
//!   where the program installs the counting allocator);
//! - one dispatch with a new table each call, against case 5's raw graph round trip (goal: at
//!   most 1.1x), against the raw floor that rebinds the node each call like for like
//!   (`cuGraphExecKernelNodeSetParams` + `cuGraphLaunch` + `cuEventRecord` + spinning sync,
//!   reported), and against case 5's cuhal round trip without a table (reported).

use std::sync::Arc;

use anyhow::{Context as _, Result};
use cuhal::{BufferRange, CommandBuffer, CommandBufferMode, DeviceOptions, PatchMethod};

use super::{Env, progress, summarize};
use crate::alloc_count::{allocations, is_counting};
use crate::clock::Clock;
use crate::gpu::StepCounter;
use crate::hal::{Hal, WAIT};
use crate::report::{Comparison, Goal, Report, Unit};

use super::replay::CHAIN;
use super::round_trip::{self, Submit};

/// Submissions per variant of the chain (warm-up on top).
pub const REPLAYS: usize = 2_000;
/// Re-record-and-instantiate submissions (each costs milliseconds).
pub const RERECORDS: usize = 200;
/// Round trips with a new table (warm-up on top).
pub const CALLS: usize = 5_000;
/// The goal against the unchanged replay.
pub const GOAL_CHANGED_RATIO: f64 = 1.1;
/// The goal against deferred replay: at least 3x faster.
pub const GOAL_AGAINST_DEFERRED: f64 = 1.0 / 3.0;

/// Runs case 11.
pub fn run(env: &Env<'_>, report: &mut Report) -> Result<()> {
    let n = env.scaled(REPLAYS);
    let warm = env.scaled(50);
    progress(&format!("case 11 (bindings): graph floor, {n} replays"));
    let floors = super::replay::floors(env)?;

    progress(&format!(
        "case 11 (bindings): graph, every binding changed, {n} replays"
    ));
    let (changed, changed_allocations) =
        bound_chain(env, CommandBufferMode::Graph, None, 2, warm, n)?;
    let changed_summary = summarize("case 11 graph changed", &mut changed.clone())?;
    progress(&format!(
        "case 11 (bindings): graph, unchanged table, {n} replays"
    ));
    let mut unchanged = bound_chain(env, CommandBufferMode::Graph, None, 1, warm, n)?.0;
    let unchanged = summarize("case 11 graph unchanged", &mut unchanged)?;
    // Each patch method forced, against its own unchanged replay.
    let mut methods = Vec::new();
    for (method, name) in [(PatchMethod::Host, "host"), (PatchMethod::Device, "device")] {
        progress(&format!(
            "case 11 (bindings): graph patched on the {name}, changed and unchanged, {n} replays each"
        ));
        let changed = bound_chain(env, CommandBufferMode::Graph, Some(method), 2, warm, n)?.0;
        let mut same = bound_chain(env, CommandBufferMode::Graph, Some(method), 1, warm, n)?.0;
        let same = summarize(&format!("case 11 {name} unchanged"), &mut same)?;
        methods.push((name, changed, same));
    }
    progress(&format!(
        "case 11 (bindings): deferred, every binding changed, {n} replays"
    ));
    let mut deferred = bound_chain(env, CommandBufferMode::Deferred, None, 2, warm, n)?.0;
    let deferred = summarize("case 11 deferred", &mut deferred)?;
    let r = env.scaled(RERECORDS);
    progress(&format!(
        "case 11 (bindings): re-record and instantiate, {r} submissions"
    ));
    let mut rerecord = rerecord(env, env.scaled(5), r)?;
    let rerecord = summarize("case 11 re-record", &mut rerecord)?;

    report.measured(
        "11",
        "100 dependent dispatches, graph with an unchanged binding table, submit + host wait",
        unchanged,
    );
    report.comparisons.push(Comparison::new(
        "11",
        "bindings: 100 dependent dispatches, graph, every binding changed, against the same graph unchanged",
        Some(changed_summary),
        Some(unchanged),
        Goal::RatioAtMost(GOAL_CHANGED_RATIO),
    ));
    report.comparisons.push(Comparison::new(
        "11",
        "bindings: 100 dependent dispatches, graph, every binding changed, against the raw graph floor",
        Some(changed_summary),
        Some(floors.graph),
        Goal::Report,
    ));
    report.comparisons.push(Comparison::new(
        "11",
        "bindings: 100 dependent dispatches, graph, every binding changed, against deferred replay with the tables (goal: 3x faster)",
        Some(changed_summary),
        Some(deferred),
        Goal::RatioAtMost(GOAL_AGAINST_DEFERRED),
    ));
    report.comparisons.push(Comparison::new(
        "11",
        "bindings: 100 dependent dispatches, graph, every binding changed, against re-recording and instantiating for new buffers",
        Some(changed_summary),
        Some(rerecord),
        Goal::Report,
    ));
    let mut per_node: Vec<f64> = changed
        .iter()
        .map(|c| (c - unchanged.median) / f64::from(CHAIN))
        .collect();
    report.measured(
        "11",
        "patching, per kernel node: (every binding changed - unchanged median) / 100",
        summarize("case 11 patch per node", &mut per_node)?,
    );
    for (name, changed, same) in &methods {
        let mut per_node: Vec<f64> = changed
            .iter()
            .map(|c| (c - same.median) / f64::from(CHAIN))
            .collect();
        report.measured(
            "11",
            format!(
                "patching on the {name}, per kernel node: (every binding changed - unchanged median) / 100, both patched on the {name}"
            ),
            summarize(&format!("case 11 {name} patch per node"), &mut per_node)?,
        );
        report.comparisons.push(Comparison::new(
            "11",
            format!(
                "bindings: 100 dependent dispatches, graph patched on the {name}, every binding changed, against its unchanged replay"
            ),
            Some(summarize(
                &format!("case 11 {name} changed"),
                &mut changed.clone(),
            )?),
            Some(*same),
            Goal::Report,
        ));
    }

    // Only where counted: a program without the counting allocator would report zero.
    if is_counting() {
        report.comparisons.push(Comparison {
            unit: Unit::Count,
            ..Comparison::new(
                "11",
                "bindings: 100 dependent dispatches, graph, every binding changed: heap allocations per submission, whole process (submission and wait)",
                Some(summarize(
                    "case 11 allocations",
                    &mut [changed_allocations],
                )?),
                None,
                Goal::AtMost(0.0),
            )
        });
    }

    let calls = env.scaled(CALLS);
    let warm = env.scaled(500);
    progress(&format!(
        "case 11 (bindings): one dispatch, new table each call, {calls} calls"
    ));
    let mut floor = round_trip::measure(env, Submit::Graph, warm, calls)?;
    let floor = summarize("case 11 round-trip floor", &mut floor)?;
    let mut bound = bound_round_trip(env, 2, warm, calls)?;
    let bound = summarize("case 11 round trip, new table", &mut bound)?;
    let mut plain = bound_round_trip(env, 0, warm, calls)?;
    let plain = summarize("case 11 round trip, no table", &mut plain)?;
    report.comparisons.push(Comparison::new(
        "11",
        "bindings: 1 dispatch round trip, new table each call, against case 5's raw graph floor",
        Some(bound),
        Some(floor),
        Goal::RatioAtMost(round_trip::GOAL_RATIO),
    ));
    let mut rebound = round_trip::measure_rebound(env, warm, calls)?;
    let rebound = summarize("case 11 rebound round-trip floor", &mut rebound)?;
    report.comparisons.push(Comparison::new(
        "11",
        "bindings: 1 dispatch round trip, new table each call, against the raw floor with the node rebound each call (cuGraphExecKernelNodeSetParams + cuGraphLaunch + cuEventRecord + spinning sync)",
        Some(bound),
        Some(rebound),
        Goal::Report,
    ));
    report.comparisons.push(Comparison::new(
        "11",
        "bindings: 1 dispatch round trip, new table each call, against case 5's cuhal round trip without a table",
        Some(bound),
        Some(plain),
        Goal::Report,
    ));
    Ok(())
}

/// Submits `cb` with `tables[i % tables.len()]` (no table when empty) and waits, `warm + n`
/// times; returns the last `n` submit-to-return times and the heap allocations per measured
/// submission (whole process, submission and wait).
fn time_bound(
    hal: &Hal,
    cb: &Arc<dyn CommandBuffer>,
    tables: &[[BufferRange; 2]],
    clock: Clock,
    warm: usize,
    n: usize,
) -> Result<(Vec<f64>, f64)> {
    let queue = hal.device.queue(0);
    let semaphore = hal.semaphore();
    let mut samples = Vec::with_capacity(n);
    let mut allocations_at_warm = 0;
    for i in 0..warm + n {
        if i == warm {
            allocations_at_warm = allocations();
        }
        let value = (i + 1) as u64;
        let t0 = clock.now_ns();
        let submitted = match tables {
            [] => queue.execute(&[], &[(&semaphore, value)], &[cb]),
            _ => {
                let table = &tables[i % tables.len()];
                queue.execute_with_bindings(&[], &[(&semaphore, value)], &[(cb, table)])
            }
        };
        submitted.context("cuhal: Queue::execute_with_bindings")?;
        let waited = semaphore.wait(value, WAIT);
        let t1 = clock.now_ns();
        waited.context("cuhal: waiting for the semaphore")?;
        if i >= warm {
            samples.push((t1 - t0) as f64);
        }
    }
    let allocations = (allocations() - allocations_at_warm) as f64 / n.max(1) as f64;
    Ok((samples, allocations))
}

/// The 100-dispatch chain bound to `counters` step counters in turn (1: an unchanged table);
/// a graph patched with `method` when given (it must then patch where asked).
fn bound_chain(
    env: &Env<'_>,
    mode: CommandBufferMode,
    method: Option<PatchMethod>,
    counters: usize,
    warm: usize,
    n: usize,
) -> Result<(Vec<f64>, f64)> {
    let hal = Hal::open(DeviceOptions {
        command_buffer_mode: mode,
        ..DeviceOptions::default()
    })?;
    let mut steps = (0..counters)
        .map(|_| StepCounter::new(env.gpu))
        .collect::<Result<Vec<_>>>()?;
    let tables: Vec<_> = steps.iter().map(StepCounter::table).collect();
    let cb = match method {
        Some(method) => {
            let graph = hal.bound_step_graph(CHAIN, method)?;
            anyhow::ensure!(
                graph.patches_on_device() == (method != PatchMethod::Host),
                "case 11: the graph for {method:?} {} patch on the device (no helper cubin for this GPU?)",
                if graph.patches_on_device() {
                    "does"
                } else {
                    "cannot"
                }
            );
            graph as Arc<dyn CommandBuffer>
        }
        None => hal.bound_step_chain(0, CHAIN)?,
    };
    let (samples, allocations) = time_bound(&hal, &cb, &tables, env.clock, warm, n)?;
    let total = warm + n;
    for (i, step) in steps.iter_mut().enumerate() {
        let submissions = total / counters + usize::from(i < total % counters);
        step.expect_more((submissions * CHAIN as usize) as u64);
        step.check(&format!(
            "case 11 ({mode:?}, {counters} tables), counter {i}"
        ))?;
    }
    Ok((samples, allocations))
}

/// Without binding tables: for each submission, a new graph command buffer recorded for the
/// other counter, ended (instantiated), submitted and waited for; timed together.
fn rerecord(env: &Env<'_>, warm: usize, n: usize) -> Result<Vec<f64>> {
    let hal = Hal::open(DeviceOptions::default())?;
    let mut steps = [StepCounter::new(env.gpu)?, StepCounter::new(env.gpu)?];
    let queue = hal.device.queue(0);
    let semaphore = hal.semaphore();
    let clock = env.clock;
    let mut samples = Vec::with_capacity(n);
    for i in 0..warm + n {
        let value = (i + 1) as u64;
        let step = &steps[i % 2];
        let t0 = clock.now_ns();
        let dispatches: Vec<_> = (0..CHAIN).map(|k| step.args(k, CHAIN)).collect();
        let cb = hal.command_buffer(0, &dispatches)?;
        queue
            .execute(&[], &[(&semaphore, value)], &[&cb])
            .context("cuhal: Queue::execute")?;
        let waited = semaphore.wait(value, WAIT);
        let t1 = clock.now_ns();
        waited.context("cuhal: waiting for the semaphore")?;
        if i >= warm {
            samples.push((t1 - t0) as f64);
        }
    }
    let total = warm + n;
    for (i, step) in steps.iter_mut().enumerate() {
        let submissions = total / 2 + usize::from(i < total % 2);
        step.expect_more((submissions * CHAIN as usize) as u64);
        step.check(&format!("case 11 re-record, counter {i}"))?;
    }
    Ok(samples)
}

/// One `step` dispatch bound to `counters` counters in turn (0: a plain command buffer with the
/// address recorded, no table).
fn bound_round_trip(env: &Env<'_>, counters: usize, warm: usize, n: usize) -> Result<Vec<f64>> {
    let hal = Hal::open(DeviceOptions::default())?;
    let mut steps = (0..counters.max(1))
        .map(|_| StepCounter::new(env.gpu))
        .collect::<Result<Vec<_>>>()?;
    let (cb, tables) = if counters == 0 {
        (hal.command_buffer(0, &[steps[0].args(0, 1)])?, Vec::new())
    } else {
        let tables: Vec<_> = steps.iter().map(StepCounter::table).collect();
        (hal.bound_step_chain(0, 1)?, tables)
    };
    let (samples, _) = time_bound(&hal, &cb, &tables, env.clock, warm, n)?;
    let total = warm + n;
    let k = counters.max(1);
    for (i, step) in steps.iter_mut().enumerate() {
        let submissions = total / k + usize::from(i < total % k);
        step.expect_more(submissions as u64);
        step.check(&format!("case 11 round trip, counter {i}"))?;
    }
    Ok(samples)
}
