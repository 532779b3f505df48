//! Device-signal timepoints: events recorded for values a semaphore has not reached yet.

use std::collections::VecDeque;

use cuhal_recycle::Recycled;
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
///
/// The first record makes room for [`INITIAL_TIMEPOINTS`] at once, and the ring doubles from
/// there and keeps its room ([`Recycled`]); a semaphore that only the host signals never
/// allocates any.
pub(crate) struct Timepoints<E> {
    list: Recycled<VecDeque<(u64, E)>, INITIAL_TIMEPOINTS>,
}

/// The room a ring makes at its first record. A value is reached only when the host retires the
/// work that signals it, and a lazy completion side retires in batches (256 actions on a CUDA
/// device queue by default, and the batch it defers), so a busy queue's signal semaphore holds
/// up to a couple of batches of timepoints whose work the device has long finished, unless a
/// host waiter's own advance passes them first (bench case 1, waiting every 250 submissions,
/// counted no allocation with this room in 22 passes at batches of 256). A ring that
/// started small doubled at each new high-water mark of that pile: one allocation every few
/// thousand submissions of a queue that never goes deeper than its batches. A deeper pile still
/// doubles the ring, which then keeps its room.
pub(crate) const INITIAL_TIMEPOINTS: usize = 256;

impl<E: DeviceEvent> Timepoints<E> {
    pub(crate) fn new() -> Self {
        Timepoints {
            list: Recycled::new(),
        }
    }

    pub(crate) fn insert(&mut self, value: u64, event: E) {
        // Values are almost always recorded in increasing order: append without a search.
        if self.list.back().is_none_or(|(v, _)| *v <= value) {
            self.list.push((value, event));
            // The completion side drained that part of the ring last.
            self.list.prefetch_next_push();
            return;
        }
        let at = self.list.partition_point(|(v, _)| *v <= value);
        self.list.insert(at, (value, event));
    }

    /// The timepoint with the smallest value `>= value`.
    pub(crate) fn at_least(&self, value: u64) -> Option<&(u64, E)> {
        // The common waits without a search: on the oldest in-flight value, or on the newest (a
        // chain waits for what the submission before it signals).
        let len = self.list.len();
        match (self.list.front(), self.list.back()) {
            (None, _) | (_, None) => return None,
            (Some(front), _) if front.0 >= value => return Some(front),
            (_, Some(back)) if back.0 < value => return None,
            (_, Some(back)) if self.list[len - 2].0 < value => return Some(back),
            _ => {}
        }
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

    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.list.capacity()
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::Timepoints;
    use crate::testing::FlagEvent;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64),
        AtLeast(u64),
        Release(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..40).prop_map(Op::Insert),
            (0u64..40).prop_map(Op::AtLeast),
            (0u64..40).prop_map(Op::Release),
        ]
    }

    proptest! {
        /// Against a sorted list: the shortcuts for recording at the back and for waits on the
        /// oldest or newest value answer what a full search answers.
        #[test]
        fn timepoints_match_a_sorted_list(ops in proptest::collection::vec(op(), 1..80)) {
            let mut timepoints = Timepoints::<FlagEvent>::new();
            let mut model: Vec<u64> = Vec::new();
            for op in ops {
                match op {
                    Op::Insert(v) => {
                        timepoints.insert(v, FlagEvent::new());
                        let at = model.partition_point(|m| *m <= v);
                        model.insert(at, v);
                    }
                    Op::AtLeast(v) => {
                        let got = timepoints.at_least(v).map(|(value, _)| *value);
                        let want = model.iter().copied().find(|m| *m >= v);
                        prop_assert_eq!(got, want);
                    }
                    Op::Release(v) => {
                        let mut out = Vec::new();
                        timepoints.release_through_into(v, &mut out);
                        let n = model.partition_point(|m| *m <= v);
                        prop_assert_eq!(out.len(), n);
                        model.drain(..n);
                    }
                }
                prop_assert_eq!(timepoints.len(), model.len());
                prop_assert_eq!(timepoints.max_value(), model.last().copied());
            }
        }
    }

    /// A ring allocates nothing until its first record, then room for `INITIAL_TIMEPOINTS` at
    /// once: records and releases that never hold more than that never reallocate it.
    #[test]
    fn the_first_record_makes_room_for_a_busy_queue() {
        let mut timepoints = Timepoints::<FlagEvent>::new();
        assert_eq!(timepoints.capacity(), 0);
        let mut value = 0;
        let mut out = Vec::new();
        let mut previous = 0;
        for round in 0..10 {
            // Pile up a different depth each round, as lazy retirement does, then retire it.
            let depth = super::INITIAL_TIMEPOINTS - round * 7;
            for _ in 0..depth {
                value += 1;
                timepoints.insert(value, FlagEvent::new());
                assert!(timepoints.capacity() >= super::INITIAL_TIMEPOINTS);
            }
            let capacity = timepoints.capacity();
            assert!(capacity >= super::INITIAL_TIMEPOINTS);
            if round > 0 {
                assert_eq!(capacity, previous, "round {round} reallocated the ring");
            }
            timepoints.release_through_into(value - 3, &mut out);
            out.clear();
            previous = capacity;
        }
        assert_eq!(previous, super::INITIAL_TIMEPOINTS);
        // A deeper pile doubles the ring once, and a release keeps that room.
        for _ in 0..super::INITIAL_TIMEPOINTS + 1 {
            value += 1;
            timepoints.insert(value, FlagEvent::new());
        }
        assert_eq!(timepoints.capacity(), 2 * super::INITIAL_TIMEPOINTS);
        timepoints.release_through_into(value, &mut out);
        assert_eq!(timepoints.len(), 0);
        assert_eq!(timepoints.capacity(), 2 * super::INITIAL_TIMEPOINTS);
    }
}
