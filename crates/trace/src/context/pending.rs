//! [`Pending`]: what waits in a context's queue for collection (a list submitted on its own,
//! or a queue's submission), and what one attempt at collecting it gives ([`Outcome`],
//! [`Times`]), and how much of the queue one collection looks at ([`Scope`]). The shared state
//! holds the queue; `collect` works through it.

use std::sync::Arc;

use crate::list::ListInner;

/// What waits for collection.
pub(crate) enum Pending {
    /// A list submitted on its own ([`ZoneList::on_submit`]).
    List {
        list: Arc<ListInner>,
        generation: u64,
    },
    /// A queue's submission ([`TraceContext::submit`]): the index of its slot, and its ordinal
    /// (so a collection of what is known complete passes over later ones without their slot).
    Submission { index: u32, ordinal: u64 },
}

impl Pending {
    /// Whether a collection of [`Scope::Completed`] looks at this entry: a list submitted on its
    /// own always (it is queried), a submission only once known complete (`through`).
    pub(crate) fn in_scope(&self, scope: Scope, through: u64) -> bool {
        match (scope, self) {
            (Scope::All, _) | (_, Pending::List { .. }) => true,
            (Scope::Completed, Pending::Submission { ordinal, .. }) => *ordinal <= through,
        }
    }
}

/// Which queued submissions a collection looks at.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Every one: those not known complete are queried first.
    All,
    /// Only those the completion side said completed ([`TraceContext::completed`]); later ones
    /// stay queued, unlooked at, for the collection their own completion runs.
    Completed,
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
