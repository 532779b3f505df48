//! Host waits on one, all or any of several `(semaphore, value)` pairs.
//!
//! The loop: check every entry under its lock (a failure ends the wait); if not satisfied, query the
//! recorded device events of the unsatisfied entries for a bounded time, advancing (or failing) a
//! semaphore whose event completed (or errored); then register this thread's parker on every entry,
//! re-checking under each lock, park until woken or the deadline, deregister, and start over. A
//! wait with events to query parks for a while only ([`REPOLL_FIRST`] at first, doubling up to
//! [`REPOLL_MAX`]) and queries them again when it wakes: whoever would wake it may be waiting for
//! newer work than this wait needs.

use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::error::Error;
use crate::event::DeviceEvent;
use crate::options::SemaphoreOptions;
use crate::semaphore::{Check, Semaphore};
use crate::sync::{Thread, current_thread, park, park_timeout};
use crate::timeout::Timeout;
use crate::traffic::Traffic;

impl<E: DeviceEvent> Semaphore<E> {
    /// Blocks until the value is at least `value` (`Ok`), the semaphore fails (`Err(Failed)`), or the
    /// timeout passes (`Err(Timeout)`). A failed semaphore returns its failure even if the value was
    /// reached before it failed.
    ///
    /// If a device signal for a value `>= value` is recorded, the wait first queries its event for a
    /// bounded time ([`SemaphoreOptions::event_spin`]); on completion it advances the semaphore to
    /// that timepoint itself, on a query error it fails the semaphore with it. Then it parks,
    /// waking to query the event again after 50 us, then after twice as long each time, up to
    /// every 1 ms: the advance that would wake it may wait for newer work than this wait needs.
    pub fn wait(&self, value: u64, timeout: impl Into<Timeout>) -> Result<(), Error> {
        wait_list(&[(self, value)], Mode::All, timeout.into().deadline()).map(|_| ())
    }
}

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

/// How long a wait with device events to query parks at first before it queries them again; each
/// later park lasts twice as long, up to [`REPOLL_MAX`]. A parked thread is woken by the advance
/// that reaches its value, and a completion side that retires in batches makes that advance when
/// the newest work of its batch completes: a wait for the previous submission while the next one
/// runs (a pipelined loop) would otherwise return only when the next one is done.
pub(crate) const REPOLL_FIRST: Duration = Duration::from_micros(50);
/// The longest a wait with device events to query stays parked between two looks at them: about
/// a thousand wake-ups and event queries a second at most, for a wait that sees its event
/// complete at most this late.
pub(crate) const REPOLL_MAX: Duration = Duration::from_millis(1);

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

/// Spin-loop hints between two rounds of event queries, or of looks at the change counters.
/// A round trip's host wait sees its event complete at most this many pauses late (a pause is
/// 40 to 140 cycles, by processor), beside the query's own cost; more pauses would take the
/// driver's lock less often, which matters less than seeing the completion, since the spin is
/// bounded anyway.
const PAUSES_BETWEEN_LOOKS: usize = 4;

/// What a round of event queries found.
enum Spun {
    /// Nothing completed or failed before `until`.
    Nothing,
    /// A semaphore changed (advanced or failed): check the entries again.
    Changed,
    /// This entry's semaphore was advanced here, to at least its value (the wait needs no
    /// second look when it is the only entry).
    Reached(usize),
}

/// Whether work is being submitted to the awaited events' devices: one [`Traffic`] per event,
/// busy when any sees its device's submissions move.
struct Watch(SmallVec<[Traffic; 4]>);

impl Watch {
    fn new<E: DeviceEvent>(events: &Pending<E>, pace: Duration) -> Self {
        Watch(
            events
                .iter()
                .map(|(_, _, e)| Traffic::new(e.submissions(), pace))
                .collect(),
        )
    }

    fn busy<E: DeviceEvent>(&mut self, events: &Pending<E>, now: Instant) -> bool {
        let mut busy = false;
        for ((_, _, event), traffic) in events.iter().zip(self.0.iter_mut()) {
            busy |= traffic.busy(event.submissions(), now);
        }
        busy
    }
}

/// The options of the entries that have an event to query.
fn event_options<'a, E: DeviceEvent>(
    list: &'a [(&Semaphore<E>, u64)],
    events: &'a Pending<E>,
) -> impl Iterator<Item = SemaphoreOptions> + 'a {
    events.iter().map(|(index, _, _)| list[*index].0.options())
}

/// The pace of queries while the devices are busy: the smallest among the entries with an event
/// (zero, no pacing, if any of them asks for none).
fn query_pace<E: DeviceEvent>(list: &[(&Semaphore<E>, u64)], events: &Pending<E>) -> Duration {
    event_options(list, events)
        .map(|options| options.busy_query_pace())
        .min()
        .unwrap_or(Duration::ZERO)
}

/// Queries `events` until one completes or errors (and acts on it), or `until` passes. At least one
/// round of queries. While their devices are busy (see [`Traffic`]), rounds are a pace apart,
/// with the awaited values watched in between.
fn spin_on_events<E: DeviceEvent>(
    list: &[(&Semaphore<E>, u64)],
    events: &Pending<E>,
    until: Instant,
) -> Spun {
    let pace = query_pace(list, events);
    // Made for a second round only: a parked wait's look at its events (one round) makes none.
    let mut watch: Option<Watch> = None;
    loop {
        let mut spun = Spun::Nothing;
        for (index, at, event) in events {
            let (semaphore, value) = list[*index];
            match event.query() {
                Ok(true) => {
                    // Err: failed meanwhile, which the re-check sees. Ok: at least `at` now,
                    // whoever advanced it.
                    spun = match semaphore.advance_to(*at) {
                        Ok(()) if *at >= value => Spun::Reached(*index),
                        _ => Spun::Changed,
                    };
                }
                Ok(false) => {}
                Err(failure) => {
                    semaphore.fail(failure);
                    spun = Spun::Changed;
                }
            }
            if !matches!(spun, Spun::Nothing) {
                return spun;
            }
        }
        let now = Instant::now();
        if now >= until {
            return Spun::Nothing;
        }
        if watch
            .get_or_insert_with(|| Watch::new(events, pace))
            .busy(events, now)
        {
            // Another thread advancing or failing a semaphore whose event is queried here (the
            // completion thread, a host signal) still ends the wait at once; a change to an
            // entry with no event yet is seen at the next round.
            let next = now.checked_add(pace).map_or(until, |t| t.min(until));
            if hold_back(list, events, next) {
                return Spun::Changed;
            }
        } else {
            for _ in 0..PAUSES_BETWEEN_LOOKS {
                std::hint::spin_loop();
            }
        }
    }
}

/// The largest event-spin budget among the entries that have an event to query.
fn spin_budget<E: DeviceEvent>(list: &[(&Semaphore<E>, u64)], events: &Pending<E>) -> Duration {
    event_options(list, events)
        .filter_map(|options| options.event_spin())
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

/// Spins without a driver call until an entry with an event to query reaches its value or
/// fails (returns true), or `until` passes (false). Only values and failures end it: the busy
/// device's submissions record device signals, which move every semaphore's change count.
fn hold_back<E: DeviceEvent>(
    list: &[(&Semaphore<E>, u64)],
    events: &Pending<E>,
    until: Instant,
) -> bool {
    loop {
        for _ in 0..PAUSES_BETWEEN_LOOKS {
            std::hint::spin_loop();
        }
        for (index, _, _) in events {
            let (semaphore, value) = list[*index];
            if semaphore.reached_or_failed(value) {
                return true;
            }
        }
        if Instant::now() >= until {
            return false;
        }
    }
}

/// Spins until some entry's semaphore changes or `until` passes; returns whether one changed.
fn spin_on_changes<E: DeviceEvent>(list: &[(&Semaphore<E>, u64)], until: Instant) -> bool {
    if list.len() > 8 {
        // A long list: not worth an allocation per wait; park instead.
        return false;
    }
    let mut seen: SmallVec<[u64; 8]> = list.iter().map(|(s, _)| s.changes()).collect();
    loop {
        for _ in 0..PAUSES_BETWEEN_LOOKS {
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
    // This thread's handle, taken at the first park: the semaphores unpark it.
    let mut me: Option<Thread> = None;
    let mut repoll = REPOLL_FIRST;
    // Awaited events are told so (`DeviceEvent::awaited`) at the parks until one that told
    // some: the parks after it end in this wait's own looks at its events.
    let mut told = false;
    loop {
        if let Outcome::Done(index) = check_all(list, mode, &mut events)? {
            return Ok(index);
        }
        let queried = !events.is_empty();
        if queried {
            let until = *spin_until.get_or_insert_with(|| {
                let now = Instant::now();
                now.checked_add(spin_budget(list, &events)).unwrap_or(now)
            });
            let until = deadline.map_or(until, |d| d.min(until));
            let spun = spin_on_events(list, &events, until);
            events.clear();
            match spun {
                // The only entry, advanced to its value by this very wait: done, without a
                // second look under the lock (a failure after the advance is after the wait).
                Spun::Reached(index) if list.len() == 1 => return Ok(index),
                Spun::Reached(_) | Spun::Changed => continue,
                Spun::Nothing => {}
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
        let me = me.get_or_insert_with(current_thread);
        // With events to query, wake to query them again (see `REPOLL_FIRST`).
        let wake = if queried {
            let at = Instant::now().checked_add(repoll);
            repoll = (repoll * 2).min(REPOLL_MAX);
            match (at, deadline) {
                (Some(at), Some(deadline)) => Some(at.min(deadline)),
                (at, deadline) => at.or(deadline),
            }
        } else {
            deadline
        };
        if let Some(index) = park_once(list, mode, me, wake, &mut told)? {
            return Ok(index);
        }
    }
}

/// Registers on every entry, parks unless a registration shows the wait satisfied, deregisters.
/// `Ok(Some(index))`: satisfied during registration. `Ok(None)`: woken (or timed out); check again.
/// Unless `told`, each registration tells the entry's awaited event, and `told` is set if one
/// was told.
fn park_once<E: DeviceEvent>(
    list: &[(&Semaphore<E>, u64)],
    mode: Mode,
    me: &Thread,
    deadline: Option<Instant>,
    told: &mut bool,
) -> Result<Option<usize>, Error> {
    let tell = !*told;
    let mut slots: SmallVec<[usize; 8]> = SmallVec::new();
    let mut outcome = Ok(None);
    let mut all_reached = true;
    for (index, (semaphore, value)) in list.iter().enumerate() {
        match semaphore.register_waiter(*value, me, tell, told) {
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
            // The thread's own park: an unpark left over from an earlier wait (or any other
            // use of the thread's token) returns at once, as a spurious wake-up may, and the
            // caller looks again; no unpark meant for this wait is lost, for the token keeps
            // one that comes before the park.
            match deadline {
                Some(deadline) => {
                    let now = Instant::now();
                    if now < deadline {
                        park_timeout(deadline - now);
                    }
                }
                None => park(),
            }
        }
    }
    for (slot, (semaphore, _)) in slots.iter().zip(list) {
        semaphore.remove_waiter(*slot);
    }
    outcome
}
