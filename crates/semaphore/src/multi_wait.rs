//! Host waits on one, all or any of several `(semaphore, value)` pairs.
//!
//! The loop: check every entry under its lock (a failure ends the wait); if not satisfied, query the
//! recorded device events of the unsatisfied entries for a bounded time, advancing (or failing) a
//! semaphore whose event completed (or errored); then register this thread's parker on every entry,
//! re-checking under each lock, park until woken or the deadline, deregister, and start over.

use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::error::Error;
use crate::event::DeviceEvent;
use crate::semaphore::{Check, Semaphore};
use crate::timeout::Timeout;
use crate::waiter::ThreadParker;

/// Whether a multi-wait needs every entry or one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    All,
    Any,
}

/// Blocks until every `(semaphore, value)` in `list` is reached.
///
/// `Err(Failed)` as soon as any listed semaphore has failed (the first failed entry's failure),
/// `Err(Timeout)` when the timeout passes first. An empty list is satisfied at once. Recorded device
/// events are queried for a bounded time before parking, as in [`Semaphore::wait`].
pub fn wait_all<E: DeviceEvent>(
    list: &[(&Semaphore<E>, u64)],
    timeout: impl Into<Timeout>,
) -> Result<(), Error> {
    wait_list(list, Mode::All, timeout.into().deadline()).map(|_| ())
}

/// Blocks until one `(semaphore, value)` in `list` is reached and returns its index (the first
/// reached entry, in list order, at the moment the wait saw it).
///
/// `Err(Failed)` as soon as any listed semaphore has failed, `Err(Timeout)` when the timeout passes
/// first, and `Err(EmptyWaitList)` at once for an empty list (it could never be satisfied).
pub fn wait_any<E: DeviceEvent>(
    list: &[(&Semaphore<E>, u64)],
    timeout: impl Into<Timeout>,
) -> Result<usize, Error> {
    wait_list(list, Mode::Any, timeout.into().deadline())
}

/// A recorded device-signal timepoint an unsatisfied entry may be brought up to: `(entry, value, event)`.
type Pending<E> = SmallVec<[(usize, u64, E); 4]>;

enum Outcome {
    Done(usize),
    NotYet,
}

/// Checks every entry. Failure first: a failed semaphore ends any wait it is in.
fn check_all<E: DeviceEvent>(
    list: &[(&Semaphore<E>, u64)],
    mode: Mode,
    events: &mut Pending<E>,
) -> Result<Outcome, Error> {
    events.clear();
    let mut first_reached = None;
    let mut all_reached = true;
    for (index, (semaphore, value)) in list.iter().enumerate() {
        match semaphore.check(*value) {
            Check::Failed(failure) => return Err(Error::Failed(failure)),
            Check::Reached => {
                first_reached.get_or_insert(index);
            }
            Check::Pending(timepoint) => {
                all_reached = false;
                if let Some((at, event)) = timepoint {
                    events.push((index, at, event));
                }
            }
        }
    }
    Ok(match (mode, first_reached) {
        (Mode::All, _) if all_reached => Outcome::Done(0),
        (Mode::Any, Some(index)) => Outcome::Done(index),
        _ => Outcome::NotYet,
    })
}

/// Queries `events` until one completes or errors (and acts on it), or `until` passes. At least one
/// round of queries. Returns whether a semaphore changed.
fn spin_on_events<E: DeviceEvent>(
    list: &[(&Semaphore<E>, u64)],
    events: &Pending<E>,
    until: Instant,
) -> bool {
    loop {
        let mut changed = false;
        for (index, at, event) in events {
            let semaphore = list[*index].0;
            match event.query() {
                Ok(true) => {
                    // Already advanced by someone else, or failed meanwhile: the re-check sees it.
                    let _ = semaphore.advance_to(*at);
                    changed = true;
                }
                Ok(false) => {}
                Err(failure) => {
                    semaphore.fail(failure);
                    changed = true;
                }
            }
        }
        if changed {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        for _ in 0..16 {
            std::hint::spin_loop();
        }
    }
}

/// The largest event-spin budget among the entries that have an event to query.
fn spin_budget<E: DeviceEvent>(list: &[(&Semaphore<E>, u64)], events: &Pending<E>) -> Duration {
    events
        .iter()
        .filter_map(|(index, _, _)| list[*index].0.options().event_spin())
        .max()
        .unwrap_or(Duration::ZERO)
}

/// The largest event-spin budget among all entries (a wait with no event to query yet).
fn change_budget<E: DeviceEvent>(list: &[(&Semaphore<E>, u64)]) -> Duration {
    list.iter()
        .filter_map(|(semaphore, _)| semaphore.options().event_spin())
        .max()
        .unwrap_or(Duration::ZERO)
}

/// Spins until some entry's semaphore changes or `until` passes; returns whether one changed.
fn spin_on_changes<E: DeviceEvent>(list: &[(&Semaphore<E>, u64)], until: Instant) -> bool {
    if list.len() > 8 {
        // A long list: not worth an allocation per wait; park instead.
        return false;
    }
    let mut seen: SmallVec<[u64; 8]> = list.iter().map(|(s, _)| s.changes()).collect();
    loop {
        for _ in 0..16 {
            std::hint::spin_loop();
        }
        for ((semaphore, _), seen) in list.iter().zip(seen.iter_mut()) {
            if semaphore.changes() != *seen {
                return true;
            }
        }
        if Instant::now() >= until {
            return false;
        }
    }
}

pub(crate) fn wait_list<E: DeviceEvent>(
    list: &[(&Semaphore<E>, u64)],
    mode: Mode,
    deadline: Option<Instant>,
) -> Result<usize, Error> {
    if list.is_empty() {
        return match mode {
            Mode::All => Ok(0),
            Mode::Any => Err(Error::EmptyWaitList),
        };
    }
    let mut events: Pending<E> = SmallVec::new();
    // The spin budget is spent once per wait call, however often the wait wakes.
    let mut spin_until: Option<Instant> = None;
    let mut parker: Option<ThreadParker> = None;
    loop {
        if let Outcome::Done(index) = check_all(list, mode, &mut events)? {
            return Ok(index);
        }
        if !events.is_empty() {
            let until = *spin_until.get_or_insert_with(|| {
                let now = Instant::now();
                now.checked_add(spin_budget(list, &events)).unwrap_or(now)
            });
            let until = deadline.map_or(until, |d| d.min(until));
            let changed = spin_on_events(list, &events, until);
            events.clear();
            if changed {
                continue;
            }
        } else if spin_until.is_none_or(|until| Instant::now() < until) {
            // Nothing to query yet: the device signal may be about to be recorded (the action
            // that signals is being issued). Watch for any change without the locks, within the
            // same budget, before parking: a parked thread takes microseconds to wake.
            let until = *spin_until.get_or_insert_with(|| {
                let now = Instant::now();
                now.checked_add(change_budget(list)).unwrap_or(now)
            });
            let until = deadline.map_or(until, |d| d.min(until));
            if spin_on_changes(list, until) {
                continue;
            }
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Error::Timeout);
        }
        let parker = parker.get_or_insert_with(ThreadParker::take);
        if let Some(index) = park_once(list, mode, parker, deadline)? {
            return Ok(index);
        }
    }
}

/// Registers on every entry, parks unless a registration shows the wait satisfied, deregisters.
/// `Ok(Some(index))`: satisfied during registration. `Ok(None)`: woken (or timed out); check again.
fn park_once<E: DeviceEvent>(
    list: &[(&Semaphore<E>, u64)],
    mode: Mode,
    parker: &ThreadParker,
    deadline: Option<Instant>,
) -> Result<Option<usize>, Error> {
    let unparker = parker.parker().unparker();
    let mut slots: SmallVec<[usize; 8]> = SmallVec::new();
    let mut outcome = Ok(None);
    let mut all_reached = true;
    for (index, (semaphore, value)) in list.iter().enumerate() {
        match semaphore.register_waiter(*value, unparker) {
            Ok((slot, reached)) => {
                slots.push(slot);
                if reached && mode == Mode::Any {
                    outcome = Ok(Some(index));
                    break;
                }
                all_reached &= reached;
            }
            Err(failure) => {
                outcome = Err(Error::Failed(failure));
                break;
            }
        }
    }
    if matches!(outcome, Ok(None)) {
        if mode == Mode::All && all_reached {
            outcome = Ok(Some(0));
        } else {
            match deadline {
                Some(deadline) => parker.parker().park_deadline(deadline),
                None => parker.parker().park(),
            }
        }
    }
    for (slot, (semaphore, _)) in slots.iter().zip(list) {
        semaphore.remove_waiter(*slot);
    }
    outcome
}
