//! Case 14, a waiter beside a submitter: the host cost of chained submissions on one queue (as
//! case 1's, of a chain of `STEPS` dependent one-thread dispatches, so that the GPU falls behind
//! the host and a wait for the newest submission lasts) while another thread of the process
//! keeps waiting on the host for the newest of them.
//!
//! Every CUDA event query takes the driver's lock that a thread launching work needs, and a
//! waiter that spins on an event queries it back to back. Floor: case 1's raw loop
//! (`cuGraphLaunch` of the same chain as a graph + `cuEventRecord` from a ring of events) with a
//! second thread calling `cuEventSynchronize` (a spinning event) on the event recorded last,
//! each time a newer one is recorded: hand-written code waiting for its newest work. cuhal:
//! chained `Queue::execute` of the same chain as a graph command buffer, with a second thread
//! calling `Semaphore::wait` for the value signalled last, each time a newer one is signalled. A wait that sees the device's
//! queues keep issuing queries once per `completion_policy::BUSY_QUERY_PACE` (see
//! `docs/decisions/semaphore.md`); for comparison, cuhal also runs with waiters' semaphores paced
//! at zero (queries back to back, as a hand-written wait does), 2 and 40 us (the completion side
//! keeps the policy's pace). Goal: the submitter at most
//! the floor's cost, waiter and all.
//!
//! Figures: the submitting thread's median host cost per submission, each side against the
//! floor; in the notes, how many waits the waiting thread completed per 1,000 submissions (what
//! a pace costs the waiter: it sees completions later, so it returns less often). Sides take
//! turns of `TURN` submissions, who goes first rotating, as case 1's do; each turn starts its
//! own waiting thread and stops it at the turn's end; a cuhal side settles after its turn.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use cuhal::{DeviceOptions, completion_policy};
use cuhal_semaphore::SemaphoreOptions;
use cuhal_sys::{Event, Stream, cu};

use super::submit::BATCH;
use super::{Env, in_turns, progress, summarize};
use crate::gpu::StepCounter;
use crate::gpu::raw::{GraphExec, KernelNode, SyncMode};
use crate::hal::{Hal, WAIT, wait};
use crate::report::{Comparison, Goal, Report};

/// Measured submissions per side (warm-up on top).
pub const SUBMISSIONS: usize = 5_000;
/// The goal: the submitter at most this many times the floor's cost.
pub const GOAL_RATIO: f64 = 1.0;
/// The submissions of one side's turn.
const TURN: usize = 250;
/// Events in the floor's ring.
const RING: usize = 64;
/// Dependent dispatches per submission: on the H200 about 1 us of GPU time each, so the GPU
/// runs behind a submitter that takes 2 to 4 us per submission.
const STEPS: u32 = 8;

/// What the submitting thread tells the waiting thread, and what the waiter counts.
#[derive(Default)]
struct Beside {
    /// The newest submission's number plus one (0: none yet).
    latest: AtomicU64,
    stop: AtomicBool,
    /// Waits completed.
    returns: AtomicU64,
}

impl Beside {
    /// Runs `wait_for(n)` for each newest `n` it sees, until told to stop.
    fn wait_loop(&self, mut wait_for: impl FnMut(u64) -> Result<()>) -> Result<()> {
        let mut waited = 0;
        while !self.stop.load(Ordering::Acquire) {
            let latest = self.latest.load(Ordering::Acquire);
            if latest <= waited {
                std::hint::spin_loop();
                continue;
            }
            wait_for(latest)?;
            waited = latest;
            self.returns.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Runs `submit` on this thread while another thread calls `wait_for(n)` for each newest
/// submission `n` it announces; returns how many waits that thread completed.
fn with_waiter(
    wait_for: impl FnMut(u64) -> Result<()> + Send,
    submit: impl FnOnce(&Beside) -> Result<()>,
) -> Result<u64> {
    let beside = Beside::default();
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| beside.wait_loop(wait_for));
        let submitted = submit(&beside);
        beside.stop.store(true, Ordering::Release);
        let waited = waiter.join().expect("the waiting thread panicked");
        submitted.and(waited)
    })?;
    Ok(beside.returns.load(Ordering::Relaxed))
}

/// One side of the case: what it submits and how it waits for the GPU between batches (the
/// thread beside it waits through the side's own `waiter`).
trait Side {
    /// Submission `i` (timed).
    fn submit(&self, i: usize) -> Result<()>;
    /// Waits, untimed, until the GPU is done with every submission up to `newest` (the last
    /// one's number plus one).
    fn drain(&self, newest: u64) -> Result<()>;
    /// After a turn, untimed.
    fn settle(&self) -> Result<()> {
        Ok(())
    }
}

/// A turn of `side`: submissions `range`, each timed alone (pushed to `times` from `warm` on)
/// and then announced to the thread beside, which calls `wait_for(n)` for the newest `n`; every
/// `BATCH` and at the end, the side drains, untimed. Returns how many waits that thread
/// completed.
fn turn(
    side: &impl Side,
    wait_for: impl FnMut(u64) -> Result<()> + Send,
    clock: crate::clock::Clock,
    range: std::ops::Range<usize>,
    warm: usize,
    times: &mut Vec<f64>,
) -> Result<u64> {
    let waits = with_waiter(wait_for, |beside| {
        let mut newest = None;
        for i in range {
            let t0 = clock.now_ns();
            let result = side.submit(i);
            let t1 = clock.now_ns();
            result?;
            let n = i as u64 + 1;
            beside.latest.store(n, Ordering::Release);
            if i >= warm {
                times.push((t1 - t0) as f64);
            }
            if (i + 1) % BATCH == 0 {
                side.drain(n)?;
            }
            newest = Some(n);
        }
        match newest {
            Some(n) => side.drain(n),
            None => Ok(()),
        }
    })?;
    side.settle()?;
    Ok(waits)
}

/// The raw side: one stream, a ring of spinning events, the step graph.
struct Floor {
    api: std::sync::Arc<cuhal_sys::DriverApi>,
    context: std::sync::Arc<cuhal_sys::PrimaryContext>,
    stream: Stream,
    events: Vec<Event>,
    exec: GraphExec,
    counter: StepCounter,
}

impl Floor {
    fn new(env: &Env<'_>) -> Result<Self> {
        let gpu = env.gpu;
        let counter = StepCounter::new(gpu)?;
        let mut nodes: Vec<KernelNode> = (0..STEPS)
            .map(|i| KernelNode {
                function: gpu.kernels.step,
                args: counter.args(i, STEPS),
            })
            .collect();
        let exec = GraphExec::chain(&gpu.ctx, &mut nodes)?;
        Ok(Self {
            api: gpu.ctx.api().clone(),
            context: gpu.ctx.clone(),
            stream: Stream::new(&gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?,
            events: (0..RING)
                .map(|_| Event::new(&gpu.ctx, SyncMode::Spin.flags()))
                .collect::<Result<_, _>>()?,
            exec,
            counter,
        })
    }

    /// What the thread beside does: `cuEventSynchronize` on the newest submission's event.
    fn waiter(&self) -> impl FnMut(u64) -> Result<()> + Send + '_ {
        let (api, events, context) = (&*self.api, &self.events, &self.context);
        move |latest| {
            // Current on the waiting thread from its first call on.
            let _bound = context.enter()?;
            let event = &events[(latest as usize - 1) % RING];
            // SAFETY: a live event of the current context.
            unsafe { cu!(api, cuEventSynchronize(event.raw())) }?;
            Ok(())
        }
    }
}

impl Side for Floor {
    fn submit(&self, i: usize) -> Result<()> {
        let api = &*self.api;
        let (stream, exec) = (self.stream.raw(), self.exec.raw());
        let event = self.events[i % RING].raw();
        // SAFETY: a live executable graph, stream and event of the current context.
        let launched = unsafe { cu!(api, cuGraphLaunch(exec, stream)) };
        // SAFETY: as above.
        let recorded = unsafe { cu!(api, cuEventRecord(event, stream)) };
        launched?;
        recorded?;
        Ok(())
    }

    fn drain(&self, _newest: u64) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }
}

/// A cuhal side: a device of one queue, the step command buffer, one semaphore for the chain.
struct Cuhal {
    hal: Hal,
    cb: std::sync::Arc<dyn cuhal::CommandBuffer>,
    semaphore: cuhal::Semaphore,
    counter: StepCounter,
}

impl Cuhal {
    fn new(env: &Env<'_>, pace: Duration) -> Result<Self> {
        let hal = Hal::open(DeviceOptions::default())?;
        let counter = StepCounter::new(env.gpu)?;
        let steps: Vec<_> = (0..STEPS).map(|i| counter.args(i, STEPS)).collect();
        let cb = hal.command_buffer(0, &steps)?;
        // The waiter's pace is its semaphore's (the device's semaphores take the policy's).
        let semaphore = cuhal::Semaphore::with_options(
            0,
            SemaphoreOptions::new()
                .with_event_spin(completion_policy::HOST_WAIT_SPIN)
                .with_busy_query_pace(pace),
        );
        Ok(Self {
            hal,
            cb,
            semaphore,
            counter,
        })
    }

    /// What the thread beside does: `Semaphore::wait` for the newest submission's signal.
    fn waiter(&self) -> impl FnMut(u64) -> Result<()> + Send + '_ {
        let semaphore = &self.semaphore;
        move |latest| {
            semaphore
                .wait(latest, WAIT)
                .with_context(|| format!("case 14: waiting for {latest}"))
        }
    }
}

impl Side for Cuhal {
    fn submit(&self, i: usize) -> Result<()> {
        let value = i as u64;
        self.hal
            .device
            .queue(0)
            .execute(
                &[(&self.semaphore, value)],
                &[(&self.semaphore, value + 1)],
                &[&self.cb],
            )
            .context("case 14 cuhal: Queue::execute")
    }

    fn drain(&self, newest: u64) -> Result<()> {
        wait(&self.semaphore, newest)
    }

    fn settle(&self) -> Result<()> {
        self.hal.settle("case 14 cuhal")
    }
}

/// Runs case 14.
pub fn run(env: &Env<'_>, report: &mut Report) -> Result<()> {
    let n = env.scaled(SUBMISSIONS);
    let warm = env.scaled(500);
    let total = warm + n;
    let default = completion_policy::BUSY_QUERY_PACE;
    let variants = [
        (
            "queries back to back (busy query pace 0, for comparison)",
            Duration::ZERO,
        ),
        (
            "busy query pace 2 us (for comparison)",
            Duration::from_micros(2),
        ),
        (
            "busy query pace 40 us (for comparison)",
            Duration::from_micros(40),
        ),
    ];
    progress(&format!(
        "case 14 (waiter): the floor and {} cuhal sides in turns of {TURN}, {n} submissions each, a thread waiting beside",
        variants.len() + 1
    ));
    let mut floor = Floor::new(env)?;
    let mut sides = vec![Cuhal::new(env, default)?];
    for (_, pace) in &variants {
        sides.push(Cuhal::new(env, *pace)?);
    }
    let mut returns = [0u64; 5];
    let samples = in_turns::<5>(total.div_ceil(TURN), n, |round, side, times| {
        let range = round * TURN..((round + 1) * TURN).min(total);
        let waits = match side {
            0 => turn(&floor, floor.waiter(), env.clock, range, warm, times)?,
            k => {
                let cuhal = &sides[k - 1];
                turn(cuhal, cuhal.waiter(), env.clock, range, warm, times)?
            }
        };
        returns[side] += waits;
        Ok(())
    })?;
    let launches = (total * STEPS as usize) as u64;
    floor.counter.expect_more(launches);
    floor.counter.check("case 14 floor")?;
    for side in &mut sides {
        side.counter.expect_more(launches);
        side.counter.check("case 14 cuhal")?;
    }

    let [mut floor_times, mut cuhal_times, rest @ ..] = samples;
    let floor = summarize("case 14 floor", &mut floor_times)?;
    report.measured(
        "14",
        format!("floor: cuGraphLaunch ({STEPS}-node chain) + cuEventRecord, chained, per submission, while a thread calls cuEventSynchronize on the newest event"),
        floor,
    );
    let per_thousand = |k: usize| returns[k] as f64 * 1_000.0 / total as f64;
    report.notes.push(format!(
        "case 14 (waiter): waits completed per 1,000 submissions: floor {:.0}, cuhal {:.0} (busy query pace {} us); {}",
        per_thousand(0),
        per_thousand(1),
        default.as_micros(),
        variants
            .iter()
            .enumerate()
            .map(|(i, (_, pace))| format!("{:.0} at {} us", per_thousand(i + 2), pace.as_micros()))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let what = format!(
        "a waiter beside a submitter: queue execute, {STEPS}-dispatch graph, chained, while a thread waits on the host for the newest signal; submitter's host cost per submission"
    );
    report.comparisons.push(Comparison::new(
        "14",
        what.clone(),
        Some(summarize("case 14 cuhal", &mut cuhal_times)?),
        Some(floor),
        Goal::RatioAtMost(GOAL_RATIO),
    ));
    for ((variant, _), mut times) in variants.iter().zip(rest) {
        report.comparisons.push(Comparison::new(
            "14",
            format!("{what}; {variant}"),
            Some(summarize("case 14 cuhal variant", &mut times)?),
            Some(floor),
            Goal::Report,
        ));
    }
    Ok(())
}
