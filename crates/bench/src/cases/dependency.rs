//! Case 3, device-side dependency: B on one queue waits for A on another; the GPU gap between
//! A's end and B's start.
//!
//! Both kernels stamp their start and end with `%globaltimer` into device memory; the gap is
//! `B.start - A.end`, one GPU clock, no host in it. A spins long enough (`A_NS`) that B and its
//! wait are queued before A ends, so the gap is the GPU's own dependency resolution. A's end is
//! dithered by a pseudo-random extra spin so a coarse timer cannot bias the mean (see
//! `gpu::ptx`); when the timer steps coarser than `FINE_TIMER_NS`, the comparison is judged on
//! means, whose precision does not depend on the step.
//!
//! Floor: two raw non-blocking streams, A as a one-node graph on the first, `cuEventRecord`,
//! `cuStreamWaitEvent` on the second, B as a one-node graph: the calls cuhal makes for two
//! one-dispatch graph command buffers. References: the same with plain `cuLaunchKernel`, and A
//! and B back to back on one stream.
//!
//! cuhal: a device with two queues; A's command buffer executes on queue 1 signalling a
//! semaphore, B's on queue 2 waiting for it. Since A is issued first, B's wait finds A's
//! device-signal event and becomes a device wait, as the floor's.

use anyhow::{Context as _, Result};
use cuhal::DeviceOptions;
use cuhal_sys::cu;

use super::{Env, progress, summarize};
use crate::gpu::SpinRecord;
use crate::gpu::raw::{GraphExec, KernelNode, SyncMode, launch};
use crate::hal::{Hal, wait};
use crate::report::{Center, Comparison, Goal, Report};
use cuhal_sys::{Event, Stream};

/// A's spin: far longer than the host needs to queue B behind it.
pub const A_NS: u64 = 30_000;
/// Upper bound of A's extra SM cycles (about 30 us at the H200's clock: many timer steps).
pub const JITTER_CYCLES: u64 = 65_536;
/// Samples per variant (warm-up on top).
pub const SAMPLES: usize = 5_000;
/// The goal: cuhal at most the floor plus this.
pub const GOAL_ADDED_NS: f64 = 500.0;
/// A timer step at or below this is fine enough to judge medians.
pub const FINE_TIMER_NS: u64 = 100;

/// Where B runs, and how A and B are launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    /// One-node graphs on two streams, an event between: what cuhal issues.
    CrossStreamGraphs,
    /// Plain kernel launches on two streams, an event between.
    CrossStreamKernels,
    /// Kernel launches right behind each other on one stream.
    SameStream,
}

/// Runs case 3.
pub fn run(env: &Env<'_>, report: &mut Report) -> Result<()> {
    let n = env.scaled(SAMPLES);
    let warm = env.scaled(100);
    let mut figures = Vec::new();
    for (placement, what) in [
        (
            Placement::CrossStreamGraphs,
            "floor: GPU gap A end -> B start, 1-node graphs on two streams + event",
        ),
        (
            Placement::CrossStreamKernels,
            "reference: GPU gap A end -> B start, kernel launches on two streams + event",
        ),
        (
            Placement::SameStream,
            "reference: GPU gap A end -> B start, kernel launches on one stream",
        ),
    ] {
        progress(&format!("case 3 (dependency): {what}, {n} samples"));
        let mut gaps = measure(env, placement, warm, n)?;
        let summary = summarize("case 3 floor", &mut gaps)?;
        report.measured("3", what, summary);
        figures.push(summary);
    }
    progress(&format!(
        "case 3 (dependency): cuhal, two queues, {n} samples"
    ));
    let mut gaps = cuhal_side(env, warm, n)?;
    let cuhal = summarize("case 3 cuhal", &mut gaps)?;
    let mut c = Comparison::new(
        "3",
        "dependency: B on queue 2 waits for A's signal from queue 1; GPU gap A end -> B start",
        Some(cuhal),
        Some(figures[0]),
        Goal::AddedAtMost(GOAL_ADDED_NS),
    );
    if env.timer.step_ns > FINE_TIMER_NS {
        c.center = Center::Mean;
        report.notes.push(format!(
            "case 3: %globaltimer steps by {} ns on this GPU, so gaps are judged on means of \
             dithered samples (medians are rounded to the step)",
            env.timer.step_ns
        ));
    }
    report.comparisons.push(c);
    Ok(())
}

fn measure(env: &Env<'_>, placement: Placement, warm: usize, n: usize) -> Result<Vec<f64>> {
    let gpu = env.gpu;
    let api = gpu.api();
    let s1 = Stream::new(&gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?;
    let s2 = Stream::new(&gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?;
    let event = Event::new(&gpu.ctx, SyncMode::Spin.flags())?;
    let mut rec_a = SpinRecord::new(gpu)?;
    let mut rec_b = SpinRecord::new(gpu)?;
    let mut a = rec_a.args(A_NS, 0, JITTER_CYCLES);
    let mut b = rec_b.args(0, 0, 0);
    let graph_a = GraphExec::chain(
        &gpu.ctx,
        &mut [KernelNode {
            function: gpu.kernels.spin,
            args: a,
        }],
    )?;
    let graph_b = GraphExec::chain(
        &gpu.ctx,
        &mut [KernelNode {
            function: gpu.kernels.spin,
            args: b,
        }],
    )?;
    let mut gaps = Vec::with_capacity(n);
    for i in 0..warm + n {
        rec_a.count_launch();
        rec_b.count_launch();
        match placement {
            Placement::CrossStreamGraphs => {
                // SAFETY: live graphs, streams and event of the current context.
                unsafe {
                    cu!(api, cuGraphLaunch(graph_a.raw(), s1.raw()))?;
                    cu!(api, cuEventRecord(event.raw(), s1.raw()))?;
                    cu!(api, cuStreamWaitEvent(s2.raw(), event.raw(), 0))?;
                    cu!(api, cuGraphLaunch(graph_b.raw(), s2.raw()))?;
                }
            }
            Placement::CrossStreamKernels => {
                launch(api, gpu.kernels.spin, s1.raw(), &mut a)?;
                // SAFETY: live streams and event of the current context.
                unsafe {
                    cu!(api, cuEventRecord(event.raw(), s1.raw()))?;
                    cu!(api, cuStreamWaitEvent(s2.raw(), event.raw(), 0))?;
                }
                launch(api, gpu.kernels.spin, s2.raw(), &mut b)?;
            }
            Placement::SameStream => {
                launch(api, gpu.kernels.spin, s1.raw(), &mut a)?;
                launch(api, gpu.kernels.spin, s1.raw(), &mut b)?;
            }
        }
        s2.synchronize()?;
        s1.synchronize()?;
        let gap = gap(&rec_a, &rec_b, "case 3 floor")?;
        if i >= warm {
            gaps.push(gap);
        }
    }
    Ok(gaps)
}

/// cuhal's side: A as a one-dispatch command buffer on queue 0 signalling a semaphore, B on
/// queue 1 waiting for it; the host waits for B's signal.
fn cuhal_side(env: &Env<'_>, warm: usize, n: usize) -> Result<Vec<f64>> {
    let gpu = env.gpu;
    let hal = Hal::open(DeviceOptions {
        queues: 2,
        ..DeviceOptions::default()
    })?;
    let mut rec_a = SpinRecord::new(gpu)?;
    let mut rec_b = SpinRecord::new(gpu)?;
    let cb_a = hal.command_buffer(0, &[rec_a.args(A_NS, 0, JITTER_CYCLES)])?;
    let cb_b = hal.command_buffer(1, &[rec_b.args(0, 0, 0)])?;
    let (q1, q2) = (hal.device.queue(0), hal.device.queue(1));
    let (sem_a, sem_b) = (hal.semaphore(), hal.semaphore());
    let mut gaps = Vec::with_capacity(n);
    for i in 0..warm + n {
        let value = (i + 1) as u64;
        rec_a.count_launch();
        rec_b.count_launch();
        q1.execute(&[], &[(&sem_a, value)], &[&cb_a])
            .context("cuhal: Queue::execute of A")?;
        q2.execute(&[(&sem_a, value)], &[(&sem_b, value)], &[&cb_b])
            .context("cuhal: Queue::execute of B")?;
        wait(&sem_b, value)?;
        wait(&sem_a, value)?;
        let gap = gap(&rec_a, &rec_b, "case 3 cuhal")?;
        if i >= warm {
            gaps.push(gap);
        }
    }
    Ok(gaps)
}

/// Reads both records (checking their launch counts) and returns B's start minus A's end.
fn gap(a: &SpinRecord, b: &SpinRecord, what: &str) -> Result<f64> {
    let ta = a.read(what).context("kernel A")?;
    let tb = b.read(what).context("kernel B")?;
    Ok(tb.start as f64 - ta.end as f64)
}
