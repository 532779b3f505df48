//! Device-signal timepoints: events recorded for values a semaphore has not reached yet.

use std::collections::VecDeque;

use smallvec::SmallVec;

use crate::event::DeviceEvent;

/// What a wait for a value needs, as seen at one instant ([`Semaphore::wait_point`](crate::Semaphore::wait_point)).
#[derive(Debug, Clone)]
pub enum WaitPoint<E> {
    /// The value is reached: nothing to wait for.
    Reached,
    /// Not reached, but a device signal is recorded for `value >= ` the wanted one: wait on `event`
    /// on the device. The clone keeps the event out of its pool until dropped.
    Device {
        /// The timepoint's value (the smallest recorded one at least the wanted value).
        value: u64,
        /// The event that completes when `value` is reached.
        event: E,
    },
    /// Not reached and no device signal recorded for it yet.
    Pending,
}

/// The recorded device-signal timepoints of one semaphore, sorted by value, all above its current
/// value (those at or below it are released as soon as the value gets there).
///
/// A ring: timepoints are recorded at the back (values grow) and released from the front, under
/// the semaphore's lock, which submitters need too. A list that shifted what remains on every
/// release moved up to a whole window of in-flight timepoints each time.
pub(crate) struct Timepoints<E> {
    list: VecDeque<(u64, E)>,
}

impl<E: DeviceEvent> Timepoints<E> {
    pub(crate) fn new() -> Self {
        Timepoints {
            list: VecDeque::new(),
        }
    }

    pub(crate) fn insert(&mut self, value: u64, event: E) {
        let at = self.list.partition_point(|(v, _)| *v <= value);
        self.list.insert(at, (value, event));
    }

    /// The timepoint with the smallest value `>= value`.
    pub(crate) fn at_least(&self, value: u64) -> Option<&(u64, E)> {
        let at = self.list.partition_point(|(v, _)| *v < value);
        self.list.get(at)
    }

    /// The highest recorded value, if any.
    pub(crate) fn max_value(&self) -> Option<u64> {
        self.list.back().map(|(v, _)| *v)
    }

    /// Moves the events of every timepoint `<= value` into `out`, to be dropped outside the lock.
    pub(crate) fn release_through<const N: usize>(
        &mut self,
        value: u64,
        out: &mut SmallVec<[E; N]>,
    ) {
        let n = self.list.partition_point(|(v, _)| *v <= value);
        if n > 0 {
            keep_inline(out, self.list.drain(..n).map(|(_, e)| e));
        }
    }

    /// Moves the events of every timepoint `<= value` into `out`, all of them (`out` grows as
    /// needed; a caller that keeps it from call to call allocates only at new high-water marks).
    pub(crate) fn release_through_into(&mut self, value: u64, out: &mut Vec<E>) {
        let n = self.list.partition_point(|(v, _)| *v <= value);
        if n > 0 {
            out.extend(self.list.drain(..n).map(|(_, e)| e));
        }
    }

    /// Moves every event into `out`.
    pub(crate) fn release_all<const N: usize>(&mut self, out: &mut SmallVec<[E; N]>) {
        keep_inline(out, self.list.drain(..).map(|(_, e)| e));
    }

    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }
}

/// Moves `events` into `out` while it has inline room and drops the rest where they are: under
/// the semaphore's lock, which is allowed (see [`DeviceEvent`](crate::DeviceEvent)'s contract on
/// dropping) and keeps a release of many timepoints at once from allocating.
fn keep_inline<E, const N: usize>(out: &mut SmallVec<[E; N]>, events: impl Iterator<Item = E>) {
    for event in events {
        if out.len() < N {
            out.push(event);
        } else {
            drop(event);
        }
    }
}
