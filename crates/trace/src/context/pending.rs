//! [`Pending`]: what waits in a context's queue for collection (a list submitted on its own,
//! or a queue's submission), and what one attempt at collecting it gives ([`Outcome`],
//! [`Times`]). The shared state holds the queue; `collect` works through it.

use std::sync::Arc;

use crate::list::ListInner;

/// What waits for collection.
pub(crate) enum Pending {
    /// A list submitted on its own ([`ZoneList::on_submit`]).
    List {
        list: Arc<ListInner>,
        generation: u64,
    },
    /// A queue's submission ([`TraceContext::submit`]): the index of its slot.
    Submission(u32),
}

pub(crate) enum Outcome {
    /// Collected, or given up on (counted); the entry is done.
    Done,
    /// Some event has not completed: keep it for a later collection.
    NotReady,
}

/// Whether a list's event times could be read.
pub(crate) enum Times {
    /// All read.
    Ready,
    /// Some event has not completed.
    NotReady,
    /// The driver failed to report one.
    Failed,
}
