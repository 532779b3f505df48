//! Bounded spinning: the cheap first part of every wait in the scheduler.

use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;

/// Polls `done` until it returns true or `budget` has passed; returns whether it became true.
/// Spins, then yields (a two-core machine must let the thread it waits for run), never longer than
/// the budget plus one poll.
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
