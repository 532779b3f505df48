//! Case 9, an alternating chain across two queues: `STEPS` dependent submissions, step `i` on
//! queue `i % 2` waiting for step `i - 1` on the other, all submitted before the first one's wait
//! is met, then released by one host signal; the time from the signal to the host's return on
//! the last step's signal, per step.
//!
//! Floor: two raw non-blocking streams and the same kernels: step `i` is `cuStreamWaitEvent` (on
//! step `i - 1`'s event, recorded on the other stream) + `cuGraphLaunch` (a one-node graph) +
//! `cuEventRecord`, all issued back to back, then a spinning `cuEventSynchronize` on the last
//! event; from the first call to the return, per step. The step kernel checks the alternation
//! (period 2) and counts its launches.
//!
//! cuhal: a device with two queues, one graph command buffer each; step 0 waits for a host
//! semaphore, step `i` for the chain semaphore's value `i`. The host signal issues the whole
//! chain on the signalling thread (each step's device signal makes the next ready), so the
//! figure holds the driver calls and the GPU's work, and no thread wake. The queues' counters
//! say how many steps went through a worker instead (the note under the table). The cuhal side
//! also runs without completion gathering (`completion_gather` zero; the device queues gather by
//! default), reported for comparison.

use anyhow::{Context as _, Result};
use cuhal::DeviceOptions;
use cuhal_sys::cu;

use super::{Env, progress, summarize};
use crate::gpu::StepCounter;
use crate::gpu::raw::{GraphExec, KernelNode, SyncMode};
use crate::hal::{Hal, wait};
use crate::report::{Comparison, Goal, Report};
use cuhal_sys::{Event, Stream};

/// Steps per chain.
pub const STEPS: usize = 100;
/// Chains measured (warm-up on top).
pub const CHAINS: usize = 200;
/// The goal: at most this many times the floor, per step.
pub const GOAL_RATIO: f64 = 1.2;

/// Runs case 9.
pub fn run(env: &Env<'_>, report: &mut Report) -> Result<()> {
    let n = env.scaled(CHAINS);
    let warm = env.scaled(20);
    progress(&format!(
        "case 9 (chain): floor, {n} chains of {STEPS} steps"
    ));
    let mut floor = floor(env, warm, n)?;
    let floor = summarize("case 9 floor", &mut floor)?.per_item(STEPS as f64);
    report.measured(
        "9",
        "floor: two streams, per step cuStreamWaitEvent + cuGraphLaunch (1 node) + cuEventRecord, issued back to back, then a spinning sync",
        floor,
    );
    progress(&format!(
        "case 9 (chain): cuhal, {n} chains of {STEPS} steps"
    ));
    let (mut cuhal, by_worker) = cuhal_side(env, DeviceOptions::default(), warm, n)?;
    let cuhal = summarize("case 9 cuhal", &mut cuhal)?.per_item(STEPS as f64);
    report.comparisons.push(
        Comparison::new(
            "9",
            "chain: two queues, dependent submissions alternating, all submitted before a host signal releases them; per step",
            Some(cuhal),
            Some(floor),
            Goal::RatioAtMost(GOAL_RATIO),
        )
        .note(format!(
            "case 9: {by_worker} of {} steps were issued by a queue's worker thread (a hand-off) rather than by the thread that made them ready",
            (warm + n) * STEPS
        )),
    );
    progress(&format!(
        "case 9 (chain): cuhal without completion gathering, {n} chains of {STEPS} steps"
    ));
    let ungathered_options = DeviceOptions {
        completion_gather: std::time::Duration::ZERO,
        ..DeviceOptions::default()
    };
    let (mut ungathered, _) = cuhal_side(env, ungathered_options, warm, n)?;
    let ungathered =
        summarize("case 9 cuhal, no gathering", &mut ungathered)?.per_item(STEPS as f64);
    report.comparisons.push(Comparison::new(
        "9",
        format!(
            "chain: per step; without completion gathering (default {} us; for comparison)",
            DeviceOptions::DEFAULT_COMPLETION_GATHER.as_micros()
        ),
        Some(ungathered),
        Some(floor),
        Goal::Report,
    ));
    Ok(())
}

/// Times `warm + n` raw chains; returns the last `n`, each for the whole chain.
fn floor(env: &Env<'_>, warm: usize, n: usize) -> Result<Vec<f64>> {
    let gpu = env.gpu;
    let api = gpu.api();
    let clock = env.clock;
    let streams = [
        Stream::new(&gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?,
        Stream::new(&gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?,
    ];
    let events = (0..STEPS)
        .map(|_| Event::new(&gpu.ctx, SyncMode::Spin.flags()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut counter = StepCounter::new(gpu)?;
    let execs = (0..2u32)
        .map(|q| {
            GraphExec::chain(
                &gpu.ctx,
                &mut [KernelNode {
                    function: gpu.kernels.step,
                    args: counter.args(q, 2),
                }],
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let mut samples = Vec::with_capacity(n);
    for chain in 0..warm + n {
        let t0 = clock.now_ns();
        for i in 0..STEPS {
            let q = i % 2;
            let s = streams[q].raw();
            if i > 0 {
                // SAFETY: a live stream and a live event recorded on the other stream.
                unsafe { cu!(api, cuStreamWaitEvent(s, events[i - 1].raw(), 0)) }?;
            }
            // SAFETY: a live executable graph and stream.
            unsafe { cu!(api, cuGraphLaunch(execs[q].raw(), s)) }?;
            // SAFETY: a live event and stream.
            unsafe { cu!(api, cuEventRecord(events[i].raw(), s)) }?;
        }
        // SAFETY: a live, recorded event (spinning: created without blocking sync).
        unsafe { cu!(api, cuEventSynchronize(events[STEPS - 1].raw())) }?;
        let t1 = clock.now_ns();
        if chain >= warm {
            samples.push((t1 - t0) as f64);
        }
    }
    for stream in &streams {
        stream.synchronize()?;
    }
    counter.expect_more(((warm + n) * STEPS) as u64);
    counter.check("case 9 floor")?;
    Ok(samples)
}

/// Times `warm + n` cuhal chains; returns the last `n` (each for the whole chain) and how many
/// steps a worker thread issued.
fn cuhal_side(
    env: &Env<'_>,
    options: DeviceOptions,
    warm: usize,
    n: usize,
) -> Result<(Vec<f64>, u64)> {
    let hal = Hal::open(DeviceOptions {
        queues: 2,
        ..options
    })?;
    let mut counter = StepCounter::new(env.gpu)?;
    let cbs = [
        hal.command_buffer(0, &[counter.args(0, 2)])?,
        hal.command_buffer(1, &[counter.args(1, 2)])?,
    ];
    let gate = hal.semaphore();
    let step = hal.semaphore();
    let clock = env.clock;
    let mut samples = Vec::with_capacity(n);
    for chain in 0..warm + n {
        let base = (chain * STEPS) as u64;
        let release = chain as u64 + 1;
        for i in 0..STEPS {
            let value = base + i as u64;
            let waits = if i == 0 {
                [(&gate, release)]
            } else {
                [(&step, value)]
            };
            hal.device
                .queue(i % 2)
                .execute(&waits, &[(&step, value + 1)], &[&cbs[i % 2]])
                .context("cuhal: Queue::execute")?;
        }
        let t0 = clock.now_ns();
        gate.signal(release).context("cuhal: releasing the chain")?;
        wait(&step, base + STEPS as u64)?;
        let t1 = clock.now_ns();
        if chain >= warm {
            samples.push((t1 - t0) as f64);
        }
    }
    let by_worker = (0..2)
        .map(|q| hal.device.queue(q).stats().issued_by_worker)
        .sum();
    counter.expect_more(((warm + n) * STEPS) as u64);
    counter.check("case 9 cuhal")?;
    Ok((samples, by_worker))
}
