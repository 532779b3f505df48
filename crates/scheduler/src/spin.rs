//! Bounded spinning: the cheap first part of every wait in the scheduler.

use std::time::Duration;
#[cfg(not(loom))]
use std::time::Instant;

#[cfg(not(loom))]
use crossbeam_utils::Backoff;

/// Polls `done` until it returns true or `budget` has passed; returns whether it became true.
///
/// In loom builds (`--cfg loom`, the scheduler's models) it polls once: loom has no time, and a
/// spinner whose budget ran out at once is one of the runs the real function can have.
#[cfg(loom)]
pub fn spin_until(budget: Duration, mut done: impl FnMut() -> bool) -> bool {
    let _ = budget;
    done()
}

/// Polls `done` until it returns true or `budget` has passed; returns whether it became true.
/// Spins, then yields (a two-core machine must let the thread it waits for run), never longer than
/// the budget plus one poll.
#[cfg(not(loom))]
pub fn spin_until(budget: Duration, mut done: impl FnMut() -> bool) -> bool {
    if done() {
        return true;
    }
    if budget.is_zero() {
        return false;
    }
    let start = Instant::now();
    let backoff = Backoff::new();
    loop {
        backoff.snooze();
        if done() {
            return true;
        }
        if start.elapsed() >= budget {
            return false;
        }
    }
}
