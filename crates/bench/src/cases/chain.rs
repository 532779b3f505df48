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
//! also runs without completion gathering (`CompletionOptions::gather` zero; the device queues gather by
//! default), reported for comparison.
//!
//! The three sides take turns, one chain each, who goes first rotating, as case 1's sides do: the
//! host's speed drifts within a run, and sides measured one after the other compared the floor
//! in one state with cuhal in another (single runs gave 1.08x to 1.27x for the same build).
//! After each chain a cuhal side waits, untimed, until its queues' threads are parked.

use anyhow::{Context as _, Result};
use cuhal::DeviceOptions;
use cuhal_sys::cu;

use super::{Env, in_turns, progress, summarize};
use crate::gpu::StepCounter;
use crate::gpu::raw::{GraphExec, SyncMode};
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
        "case 9 (chain): the floor, cuhal and cuhal without completion gathering in turns, {n} chains of {STEPS} steps each"
    ));
    let ungathered_options = DeviceOptions {
        completion: DeviceOptions::DEFAULT_COMPLETION.with_gather(std::time::Duration::ZERO),
        ..DeviceOptions::default()
    };
    let mut floor = FloorChains::new(env)?;
    let mut cuhal = CuhalChains::new(env, DeviceOptions::default())?;
    let mut ungathered = CuhalChains::new(env, ungathered_options)?;
    let [mut floor_times, mut cuhal_times, mut ungathered_times] =
        in_turns(warm + n, n, |chain, side, times| {
            let time = match side {
                0 => floor.chain()?,
                1 => cuhal.chain(chain)?,
                _ => ungathered.chain(chain)?,
            };
            if chain >= warm {
                times.push(time);
            }
            Ok(())
        })?;
    let total = (warm + n) * STEPS;
    floor.finish(total)?;
    let by_worker = cuhal.finish(total)?;
    ungathered.finish(total)?;

    let floor = summarize("case 9 floor", &mut floor_times)?.per_item(STEPS as f64);
    report.measured(
        "9",
        "floor: two streams, per step cuStreamWaitEvent + cuGraphLaunch (1 node) + cuEventRecord, issued back to back, then a spinning sync",
        floor,
    );
    let cuhal = summarize("case 9 cuhal", &mut cuhal_times)?.per_item(STEPS as f64);
    report.comparisons.push(
        Comparison::new(
            "9",
            "chain: two queues, dependent submissions alternating, all submitted before a host signal releases them; per step",
            Some(cuhal),
            Some(floor),
            Goal::RatioAtMost(GOAL_RATIO),
        )
        .note(format!(
            "{by_worker} of {total} steps were issued by a queue's worker thread (a hand-off) rather than by the thread that made them ready",
        )),
    );
    let ungathered =
        summarize("case 9 cuhal, no gathering", &mut ungathered_times)?.per_item(STEPS as f64);
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

/// The floor: two raw streams, an event per step, one executable graph per stream.
struct FloorChains {
    api: std::sync::Arc<cuhal_sys::DriverApi>,
    clock: crate::clock::Clock,
    streams: [Stream; 2],
    events: Vec<Event>,
    counter: StepCounter,
    execs: Vec<GraphExec>,
}

impl FloorChains {
    fn new(env: &Env<'_>) -> Result<Self> {
        let gpu = env.gpu;
        let streams = [
            Stream::new(&gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?,
            Stream::new(&gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?,
        ];
        let events = (0..STEPS)
            .map(|_| Event::new(&gpu.ctx, SyncMode::Spin.flags()))
            .collect::<Result<Vec<_>, _>>()?;
        let counter = StepCounter::new(gpu)?;
        let execs = counter.graphs(gpu, 2, 2)?;
        Ok(Self {
            api: gpu.ctx.api().clone(),
            clock: env.clock,
            streams,
            events,
            counter,
            execs,
        })
    }

    /// One chain, from its first call to the return of the spinning sync on its last event.
    fn chain(&mut self) -> Result<f64> {
        let api = &*self.api;
        let events = &self.events;
        let t0 = self.clock.now_ns();
        for i in 0..STEPS {
            let q = i % 2;
            let s = self.streams[q].raw();
            if i > 0 {
                // SAFETY: a live stream and a live event recorded on the other stream.
                unsafe { cu!(api, cuStreamWaitEvent(s, events[i - 1].raw(), 0)) }?;
            }
            // SAFETY: a live executable graph and stream.
            unsafe { cu!(api, cuGraphLaunch(self.execs[q].raw(), s)) }?;
            // SAFETY: a live event and stream.
            unsafe { cu!(api, cuEventRecord(events[i].raw(), s)) }?;
        }
        // SAFETY: a live, recorded event (spinning: created without blocking sync).
        unsafe { cu!(api, cuEventSynchronize(events[STEPS - 1].raw())) }?;
        let t1 = self.clock.now_ns();
        Ok((t1 - t0) as f64)
    }

    /// Checks the kernels after `steps` steps in all.
    fn finish(mut self, steps: usize) -> Result<()> {
        for stream in &self.streams {
            stream.synchronize()?;
        }
        self.counter.expect_more(steps as u64);
        self.counter.check("case 9 floor")
    }
}

/// cuhal: a device with two queues, one graph command buffer each, a gate semaphore that
/// releases each chain and a step semaphore that chains it.
struct CuhalChains {
    hal: Hal,
    clock: crate::clock::Clock,
    counter: StepCounter,
    cbs: [std::sync::Arc<dyn cuhal::CommandBuffer>; 2],
    gate: cuhal::Semaphore,
    step: cuhal::Semaphore,
}

impl CuhalChains {
    fn new(env: &Env<'_>, options: DeviceOptions) -> Result<Self> {
        let hal = Hal::open(DeviceOptions {
            queues: 2,
            ..options
        })?;
        let counter = StepCounter::new(env.gpu)?;
        let cbs = [
            hal.command_buffer(0, &[counter.args(0, 2)])?,
            hal.command_buffer(1, &[counter.args(1, 2)])?,
        ];
        let gate = hal.semaphore();
        let step = hal.semaphore();
        Ok(Self {
            hal,
            clock: env.clock,
            counter,
            cbs,
            gate,
            step,
        })
    }

    /// Submits chain `index` (all pending on the gate), then times the gate's signal to the
    /// host's return on the chain's last signal.
    fn chain(&mut self, index: usize) -> Result<f64> {
        let base = (index * STEPS) as u64;
        let release = index as u64 + 1;
        let (gate, step) = (&self.gate, &self.step);
        for i in 0..STEPS {
            let value = base + i as u64;
            let waits = if i == 0 {
                [(gate, release)]
            } else {
                [(step, value)]
            };
            self.hal
                .device
                .queue(i % 2)
                .execute(&waits, &[(step, value + 1)], &[&self.cbs[i % 2]])
                .context("cuhal: Queue::execute")?;
        }
        let t0 = self.clock.now_ns();
        gate.signal(release).context("cuhal: releasing the chain")?;
        wait(step, base + STEPS as u64)?;
        let t1 = self.clock.now_ns();
        // Off the clock: its threads' idle spin is not the next side's cost.
        self.hal.settle("case 9 cuhal")?;
        Ok((t1 - t0) as f64)
    }

    /// Checks the kernels after `steps` steps in all; returns how many steps a worker thread
    /// issued.
    fn finish(mut self, steps: usize) -> Result<u64> {
        let by_worker = (0..2)
            .map(|q| self.hal.device.queue(q).stats().issued_by_worker)
            .sum();
        self.counter.expect_more(steps as u64);
        self.counter.check("case 9 cuhal")?;
        Ok(by_worker)
    }
}
