//! Case 10, host signal to host waiter: a 1-dispatch submission waits for a host semaphore; a
//! host thread already waits for the submission's signal; the time from the host `signal` that
//! releases the submission to that waiter's return.
//!
//! Floor: the raw round trip of the same work, `cuGraphLaunch` (one-node graph) +
//! `cuEventRecord` + spinning `cuEventSynchronize` (case 5's floor, measured again here). Goal:
//! at most the floor plus 2 us: the signal issues the submission on the signalling thread, and
//! the waiter, which had nothing to poll when it began, sees the device signal recorded and polls
//! its event itself, so no thread is woken on the way.
//!
//! cuhal: per call, the submission is made (pending on the gate), the waiter thread is told the
//! value and starts `Semaphore::wait`, and after a short pause (so it is inside its wait) the
//! main thread stamps and signals the gate; the waiter stamps when its wait returns.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use cuhal::DeviceOptions;

use super::round_trip::{Submit, measure};
use super::{Env, progress, summarize};
use crate::gpu::StepCounter;
use crate::hal::{Hal, WAIT};
use crate::report::{Comparison, Goal, Report};

/// Calls measured (warm-up on top).
pub const CALLS: usize = 2_000;
/// The goal: at most the floor plus this.
pub const GOAL_ADDED_NS: f64 = 2_000.0;
/// How long the main thread lets the waiter settle into its wait before it signals.
const SETTLE: Duration = Duration::from_micros(20);

/// Runs case 10.
pub fn run(env: &Env<'_>, report: &mut Report) -> Result<()> {
    let n = env.scaled(CALLS);
    let warm = env.scaled(200);
    progress(&format!("case 10 (signal): floor, {n} round trips"));
    let mut floor = measure(env, Submit::Graph, warm, n)?;
    let floor = summarize("case 10 floor", &mut floor)?;
    report.measured(
        "10",
        "floor: cuGraphLaunch (1 node) + cuEventRecord + cuEventSynchronize (spinning)",
        floor,
    );
    progress(&format!("case 10 (signal): cuhal, {n} calls"));
    let mut cuhal = cuhal_side(env, warm, n)?;
    report.comparisons.push(Comparison::new(
        "10",
        "host signal releases a pending 1-dispatch submission; signal to a waiting host thread's return",
        Some(summarize("case 10 cuhal", &mut cuhal)?),
        Some(floor),
        Goal::AddedAtMost(GOAL_ADDED_NS),
    ));
    Ok(())
}

/// Spins until `done` or `WAIT` passes.
fn spin_for(what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    while !done() {
        if Instant::now() > deadline {
            bail!("case 10: timed out waiting for {what}");
        }
        std::hint::spin_loop();
    }
    Ok(())
}

fn cuhal_side(env: &Env<'_>, warm: usize, n: usize) -> Result<Vec<f64>> {
    let hal = Hal::open(DeviceOptions::default())?;
    let queue = hal.device.queue(0);
    let mut counter = StepCounter::new(env.gpu)?;
    let cb = hal.command_buffer(0, &[counter.args(0, 1)])?;
    let gate = hal.semaphore();
    let out = hal.semaphore();
    let clock = env.clock;
    // The waiter's side of the hand-shake: the value to wait for (u64::MAX: stop), the value it
    // is about to wait for, and when (and whether) its wait returned.
    let want = AtomicU64::new(0);
    let waiting = AtomicU64::new(0);
    let returned_at = AtomicU64::new(0);
    let returned = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let mut samples = Vec::with_capacity(n);
    std::thread::scope(|scope| -> Result<()> {
        let waiter = scope.spawn(|| {
            let mut last = 0;
            loop {
                let value = want.load(Ordering::Acquire);
                if value == u64::MAX {
                    return;
                }
                if value == last {
                    std::hint::spin_loop();
                    continue;
                }
                last = value;
                waiting.store(value, Ordering::Release);
                let result = out.wait(value, WAIT);
                returned_at.store(clock.now_ns(), Ordering::Relaxed);
                if result.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                returned.store(value, Ordering::Release);
            }
        });
        let mut run = || -> Result<()> {
            for i in 0..warm + n {
                let value = i as u64 + 1;
                queue
                    .execute(&[(&gate, value)], &[(&out, value)], &[&cb])
                    .context("cuhal: Queue::execute")?;
                want.store(value, Ordering::Release);
                spin_for("the waiter to start", || {
                    waiting.load(Ordering::Acquire) == value
                })?;
                let settle = Instant::now() + SETTLE;
                while Instant::now() < settle {
                    std::hint::spin_loop();
                }
                let t0 = clock.now_ns();
                gate.signal(value).context("cuhal: signalling the gate")?;
                spin_for("the waiter to return", || {
                    returned.load(Ordering::Acquire) == value
                })?;
                if failed.load(Ordering::Relaxed) {
                    bail!("case 10: the host wait for value {value} failed");
                }
                if i >= warm {
                    samples.push((returned_at.load(Ordering::Relaxed) - t0) as f64);
                }
            }
            Ok(())
        };
        let result = run();
        want.store(u64::MAX, Ordering::Release);
        // A waiter still inside a wait returns within WAIT.
        let _ = waiter.join();
        result
    })?;
    counter.expect_more((warm + n) as u64);
    counter.check("case 10 cuhal")?;
    Ok(samples)
}
