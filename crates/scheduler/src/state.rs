//! [`State`]: what a queue keeps under its issue lock.

use crate::action::{Spare, Spares};
use crate::backend::Backend;
use crate::notifier::Notified;
use crate::pending::PendingList;

/// Everything under the issue lock.
pub(crate) struct State<B: Backend> {
    pub(crate) pending: PendingList<B>,
    /// The notification keys being handled, swapped with the notifier's list (both keep their
    /// capacity, so draining allocates nothing).
    pub(crate) keys: Vec<Notified<B::Event>>,
    /// Empty body slots for the next submissions (see [`Boxed`](crate::action::Boxed)).
    pub(crate) spare: Spares<B>,
    /// Body slots in rotation: every one is spare, returned, or holds a live action.
    pub(crate) boxes: usize,
    /// Body slots made when the queue started (its `capacity`) and not in rotation yet: a
    /// rotation that must grow takes these before it allocates. Kept apart so that the slots
    /// in rotation (which the submitter walks through, the spares first, then those given back)
    /// stay as few as the queue's in-flight high-water mark, not all that were made.
    pub(crate) reserve: Vec<Spare<B>>,
    /// The backend's state for this queue's issues.
    pub(crate) local: B::IssueLocal,
}

impl<B: Backend> State<B> {
    /// The state of a new queue that keeps up to `capacity` actions without allocating.
    pub(crate) fn new(local: B::IssueLocal, capacity: usize) -> Self {
        State {
            pending: PendingList::with_capacity(capacity),
            keys: Vec::with_capacity(capacity),
            spare: Spares::with_capacity(capacity),
            boxes: 0,
            reserve: (0..capacity).map(|_| Spare::new()).collect(),
            local,
        }
    }
}
