//! Case 7, scheduler scaling (CPU only): the cost of an action flowing through cuhal-scheduler's
//! host backend while 100, then 100,000, other actions are pending.
//!
//! The pending actions sit on a second queue and wait for the very semaphore the flowing
//! actions signal, at a value the measurement never reaches. So every signal of the flowing
//! chain advances a semaphore with that many pending waiters behind it: a scheduler that
//! rescanned its pending actions (IREE's seed does, on every completion) or a semaphore that
//! walked all its listeners on every advance would slow down in proportion. The flowing actions
//! are a chain on their own queue (each waits for the one before), with a no-op payload, so the
//! figure is the scheduler's own cost: submit, readiness, issue, completion, signal.
//!
//! Two figures at each size: the host cost of one `submit` call, and the per-action time of a
//! round of `ROUND` chained actions from the first submit to the host seeing the last signal.
//! The comparison puts the 100,000-pending figure beside the 100-pending one; the goal is flat
//! scaling (`GOAL_RATIO`). After each measurement the pending actions are released and waited
//! for, which proves they were really pending and really ran.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use cuhal_scheduler::host::{self, HostPayload, HostSemaphore};
use cuhal_scheduler::{Cleanups, QueueOptions, Resources};

use super::{progress, scaled, summarize};
use crate::clock::Clock;
use crate::report::{Comparison, Goal, Report};
use crate::stats::Summary;

/// Pending actions of the two measurements.
pub const PENDING: [usize; 2] = [100, 100_000];
/// Chained actions per timed round.
pub const ROUND: usize = 1_000;
/// Timed rounds per size (warm-up on top).
pub const ROUNDS: usize = 200;
/// The goal: per-action cost at 100,000 pending at most this many times the cost at 100.
pub const GOAL_RATIO: f64 = 1.5;
/// The value the pending actions wait for; the chain stays far below it.
const PARKED_AT: u64 = 1 << 62;
/// Bound on every host wait: a scheduler that lost an action fails the case, never hangs it.
const WAIT: Duration = Duration::from_secs(60);

/// One size's figures.
struct Figures {
    /// Host cost of one submit call.
    submit: Summary,
    /// Per action, submit to the host seeing its signal, over rounds of `ROUND`.
    flow: Summary,
}

/// Runs case 7.
pub fn run(quick: bool, clock: Clock, report: &mut Report) -> Result<()> {
    let rounds = scaled(quick, ROUNDS);
    let mut figures = Vec::new();
    for pending in PENDING {
        progress(&format!(
            "case 7 (scheduler): {pending} pending, {rounds} rounds of {ROUND} chained actions"
        ));
        let f = measure(pending, rounds, clock)?;
        report.measured(
            "7",
            format!("submit call, host cost, {pending} pending"),
            f.submit,
        );
        report.measured(
            "7",
            format!("per action, submit to signal seen (rounds of {ROUND}), {pending} pending"),
            f.flow,
        );
        figures.push(f);
    }
    let (small, large) = (&figures[0], &figures[1]);
    report.comparisons.push(Comparison::new(
        "7",
        format!(
            "scheduler: per action, submit to signal, at {} pending (floor column: at {} pending)",
            PENDING[1], PENDING[0]
        ),
        Some(large.flow),
        Some(small.flow),
        Goal::RatioAtMost(GOAL_RATIO),
    ));
    report.comparisons.push(Comparison::new(
        "7",
        format!(
            "scheduler: submit call at {} pending (floor column: at {} pending)",
            PENDING[1], PENDING[0]
        ),
        Some(large.submit),
        Some(small.submit),
        Goal::RatioAtMost(GOAL_RATIO),
    ));
    Ok(())
}

fn measure(pending: usize, rounds: usize, clock: Clock) -> Result<Figures> {
    let parked_queue = host::queue(QueueOptions::new("bench-parked").with_capacity(pending + 64))?;
    let queue = host::queue(QueueOptions::new("bench-flow"))?;
    let chain = HostSemaphore::new(0);
    let parked_done = HostSemaphore::new(0);
    for i in 0..pending as u64 {
        parked_queue.submit(
            &[(&chain, PARKED_AT)],
            &[(&parked_done, i + 1)],
            HostPayload::Nop,
            Resources::new(),
            Cleanups::new(),
        )?;
    }
    let parked = parked_queue.stats().pending;
    if parked != pending {
        bail!("case 7: {parked} actions pending where {pending} were parked");
    }

    let warm = 5;
    let mut submit = Vec::with_capacity(rounds * ROUND);
    let mut flow = Vec::with_capacity(rounds);
    let mut value = 0u64;
    for round in 0..warm + rounds {
        let start = clock.now_ns();
        for _ in 0..ROUND {
            let t0 = clock.now_ns();
            queue.submit(
                &[(&chain, value)],
                &[(&chain, value + 1)],
                HostPayload::Nop,
                Resources::new(),
                Cleanups::new(),
            )?;
            let t1 = clock.now_ns();
            value += 1;
            if round >= warm {
                submit.push((t1 - t0) as f64);
            }
        }
        chain.wait(value, WAIT)?;
        let end = clock.now_ns();
        if round >= warm {
            flow.push((end - start) as f64 / ROUND as f64);
        }
    }

    let parked = parked_queue.stats().pending;
    if parked != pending {
        bail!("case 7: {parked} actions still pending where {pending} should be");
    }
    // The completion thread counts an action after it signals, so the count may trail the
    // value the host just saw by a moment.
    let deadline = Instant::now() + WAIT;
    let mut stats = queue.stats();
    while stats.retired() < value && Instant::now() < deadline {
        std::thread::yield_now();
        stats = queue.stats();
    }
    if stats.completed != value || stats.failed != 0 {
        bail!(
            "case 7: {} actions completed and {} failed where {value} were submitted",
            stats.completed,
            stats.failed
        );
    }
    // Release the parked actions and see every one of them run.
    chain.signal(PARKED_AT)?;
    parked_done.wait(pending as u64, WAIT)?;
    Ok(Figures {
        submit: summarize("case 7 submit", &mut submit)?,
        flow: summarize("case 7 flow", &mut flow)?,
    })
}
