//! Case 1, submission overhead: the host cost of one submission of a 1-dispatch graph with one
//! wait and one signal, chained (each waits on the one before).
//!
//! Floor: `cuStreamWaitEvent` (on the previous submission's event) + `cuGraphLaunch` (a
//! one-kernel-node graph) + `cuEventRecord` (a `CU_EVENT_DISABLE_TIMING` event): the driver
//! calls cuhal's issue path makes for such a submission. Each submission is timed alone on the
//! host clock. Every `BATCH` submissions the host waits for the GPU, untimed, so the figure is
//! the host's cost and never back-pressure from a full launch queue. The kernel counts its
//! launches; the count is checked at the end.
//!
//! cuhal: `Queue::execute(&[(s, i)], &[(s, i + 1)], &[&cb])` with a one-dispatch graph command
//! buffer, timed per call the same way, the host waiting on the semaphore every `BATCH`. The
//! process's heap allocations are counted across the measured submissions of both sides
//! (`alloc_count`); the floor's count checks the instrument (it must be 0).

use anyhow::{Context as _, Result};
use cuhal::DeviceOptions;

use super::{Env, progress, summarize};
use crate::bench::alloc_count::allocations;
use crate::bench::gpu::raw::{Event, GraphExec, KernelNode, Stream, SyncMode};
use crate::bench::gpu::{Gpu, StepCounter};
use crate::bench::hal::{Hal, wait};
use crate::bench::report::{Comparison, Goal, Report, Unit};
use crate::bench::stats::Summary;

/// Submissions measured (warm-up comes on top).
pub const SUBMISSIONS: usize = 10_000;
/// The host waits for the GPU after this many submissions (untimed).
pub const BATCH: usize = 250;
/// Events the floor cycles through, as an event pool would.
const RING: usize = 64;

/// The goal: at most this many times the floor.
pub const GOAL_RATIO: f64 = 1.25;

/// Runs case 1.
pub fn run(env: &Env<'_>, report: &mut Report) -> Result<()> {
    let n = env.scaled(SUBMISSIONS);
    let warm = env.scaled(1_000);
    progress(&format!("case 1 (submit): floor, {n} chained submissions"));
    let floor = floor(env, warm, n)?;
    let parts = floor_parts(env, warm, n)?;
    report.measured(
        "1",
        "floor: cuStreamWaitEvent + cuGraphLaunch (1 node) + cuEventRecord, per submission",
        floor.total,
    );
    report.measured("1", "  of which cuStreamWaitEvent", parts.wait);
    report.measured("1", "  of which cuGraphLaunch, 1 kernel node", parts.launch);
    report.measured(
        "1",
        "  of which cuEventRecord, DISABLE_TIMING",
        parts.record,
    );

    progress(&format!("case 1 (submit): cuhal, {n} chained submissions"));
    let cuhal = cuhal_side(env, warm, n)?;
    report.comparisons.push(Comparison::new(
        "1",
        "submit: queue execute, 1-dispatch graph, 1 wait + 1 signal, chained; host cost per submission",
        Some(cuhal.total),
        Some(floor.total),
        Goal::RatioAtMost(GOAL_RATIO),
    ));
    report.comparisons.push(Comparison {
        unit: Unit::Count,
        ..Comparison::new(
            "1",
            "submit: heap allocations per submission, whole process (floor column: the floor's loop)",
            Some(cuhal.allocations),
            Some(floor.allocations),
            Goal::AtMost(0.0),
        )
    });
    Ok(())
}

/// cuhal's side: `Queue::execute` of a one-dispatch graph command buffer, waiting for the
/// previous submission's signal and signalling the next value, timed per call; the host waits
/// for the semaphore every `BATCH` submissions (untimed), as the floor synchronizes.
fn cuhal_side(env: &Env<'_>, warm: usize, n: usize) -> Result<Side> {
    let hal = Hal::open(DeviceOptions::default())?;
    let queue = hal.device.queue(0);
    let mut counter = StepCounter::new(env.gpu)?;
    let cb = hal.command_buffer(0, &[counter.args(0, 1)])?;
    let semaphore = hal.semaphore();
    let clock = env.clock;
    let mut total = Vec::with_capacity(n);
    let mut allocations_at_warm = 0;
    for i in 0..warm + n {
        if i == warm {
            allocations_at_warm = allocations();
        }
        let value = i as u64;
        let t0 = clock.now_ns();
        let result = queue.execute(&[(&semaphore, value)], &[(&semaphore, value + 1)], &[&cb]);
        let t1 = clock.now_ns();
        result.context("cuhal: Queue::execute")?;
        if i >= warm {
            total.push((t1 - t0) as f64);
        }
        if (i + 1) % BATCH == 0 {
            wait(&semaphore, value + 1)?;
        }
    }
    wait(&semaphore, (warm + n) as u64)?;
    let allocations = (allocations() - allocations_at_warm) as f64 / n as f64;
    counter.expect_more((warm + n) as u64);
    counter.check("case 1 cuhal")?;
    Ok(Side {
        total: summarize("case 1 cuhal", &mut total)?,
        allocations: summarize("case 1 cuhal allocations", &mut [allocations])?,
    })
}

/// The figures of one side.
pub struct Side {
    /// Per submission: the three driver calls, or one `Queue::execute`.
    pub total: Summary,
    /// Heap allocations per measured submission, whole process (for the floor, 0 unless the
    /// measuring loop itself allocates: a check of the instrument).
    pub allocations: Summary,
}

/// Per-call figures of the floor, from a second pass with a stamp between calls.
pub struct Parts {
    /// `cuStreamWaitEvent`.
    pub wait: Summary,
    /// `cuGraphLaunch`.
    pub launch: Summary,
    /// `cuEventRecord`.
    pub record: Summary,
}

/// What one pass of the floor recorded.
struct Pass {
    /// Heap allocations per measured submission.
    allocations: f64,
    total: Vec<f64>,
    wait: Vec<f64>,
    launch: Vec<f64>,
    record: Vec<f64>,
}

fn floor(env: &Env<'_>, warm: usize, n: usize) -> Result<Side> {
    let mut pass = floor_pass(env, warm, n, false)?;
    Ok(Side {
        total: summarize("case 1 floor", &mut pass.total)?,
        allocations: summarize("case 1 floor allocations", &mut [pass.allocations])?,
    })
}

fn floor_parts(env: &Env<'_>, warm: usize, n: usize) -> Result<Parts> {
    let mut pass = floor_pass(env, warm, n, true)?;
    Ok(Parts {
        wait: summarize("case 1 cuStreamWaitEvent", &mut pass.wait)?,
        launch: summarize("case 1 cuGraphLaunch", &mut pass.launch)?,
        record: summarize("case 1 cuEventRecord", &mut pass.record)?,
    })
}

/// One chain of `warm + n` submissions. With `parts`, stamps between the calls too (which adds
/// two clock reads to the total, so the total of that pass is not used).
fn floor_pass(env: &Env<'_>, warm: usize, n: usize, parts: bool) -> Result<Pass> {
    let gpu: &Gpu = env.gpu;
    let api = gpu.api();
    let clock = env.clock;
    let stream = Stream::new(&gpu.ctx)?;
    let events = (0..RING)
        .map(|_| Event::new(&gpu.ctx, SyncMode::Spin))
        .collect::<Result<Vec<_>>>()?;
    let mut counter = StepCounter::new(gpu)?;
    let exec = GraphExec::chain(
        &gpu.ctx,
        &mut [KernelNode {
            function: gpu.kernels.step,
            args: counter.args(0, 1),
        }],
    )?;
    let mut pass = Pass {
        allocations: 0.0,
        total: Vec::with_capacity(n),
        wait: Vec::with_capacity(if parts { n } else { 0 }),
        launch: Vec::with_capacity(if parts { n } else { 0 }),
        record: Vec::with_capacity(if parts { n } else { 0 }),
    };
    let s = stream.raw();
    let g = exec.raw();
    let mut allocations_at_warm = 0;
    for i in 0..warm + n {
        if i == warm {
            allocations_at_warm = allocations();
        }
        // The first submission waits on an event never recorded: a no-op, as for a semaphore
        // wait on a value already reached.
        let prev = events[(i + RING - 1) % RING].raw();
        let cur = events[i % RING].raw();
        let t0 = clock.now_ns();
        // SAFETY: live stream and event of the current context.
        let r1 = unsafe { (api.cuStreamWaitEvent)(s, prev, 0) };
        let t1 = if parts { clock.now_ns() } else { 0 };
        // SAFETY: a live executable graph and stream.
        let r2 = unsafe { (api.cuGraphLaunch)(g, s) };
        let t2 = if parts { clock.now_ns() } else { 0 };
        // SAFETY: live event and stream.
        let r3 = unsafe { (api.cuEventRecord)(cur, s) };
        let t3 = clock.now_ns();
        api.check("cuStreamWaitEvent", r1)?;
        api.check("cuGraphLaunch", r2)?;
        api.check("cuEventRecord", r3)?;
        if i >= warm {
            pass.total.push((t3 - t0) as f64);
            if parts {
                pass.wait.push((t1 - t0) as f64);
                pass.launch.push((t2 - t1) as f64);
                pass.record.push((t3 - t2) as f64);
            }
        }
        if (i + 1) % BATCH == 0 {
            stream.sync()?;
        }
    }
    stream.sync()?;
    pass.allocations = (allocations() - allocations_at_warm) as f64 / n as f64;
    counter.expect_more((warm + n) as u64);
    counter.check("case 1 floor")?;
    Ok(pass)
}
