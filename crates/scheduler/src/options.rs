//! [`QueueOptions`]: a queue's label, completion options, in-flight limit and preallocated capacity.

use crate::policy::CompletionOptions;

/// How a [`Queue`](crate::Queue) is set up. Build with [`QueueOptions::new`] and the `with_*`
/// methods.
#[derive(Debug, Clone)]
pub struct QueueOptions {
    pub(crate) label: String,
    pub(crate) completion: CompletionOptions,
    pub(crate) capacity: usize,
    pub(crate) max_in_flight: usize,
}

impl QueueOptions {
    /// Default [`capacity`](Self::with_capacity).
    pub const DEFAULT_CAPACITY: usize = 256;
    /// The most [`with_capacity`](Self::with_capacity) makes up front: 8,192 actions, about
    /// 4 MiB of action storage for a device queue. A larger window grows on demand.
    pub const MAX_CAPACITY: usize = 8_192;
    /// Default [`max_in_flight`](Self::with_max_in_flight).
    pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

    /// Defaults, with `label` naming the queue in errors and thread names.
    pub fn new(label: impl Into<String>) -> Self {
        QueueOptions {
            label: label.into(),
            completion: CompletionOptions::new(),
            capacity: Self::DEFAULT_CAPACITY,
            max_in_flight: Self::DEFAULT_MAX_IN_FLIGHT,
        }
    }

    /// How the completion side spins and gathers (see [`CompletionOptions`] and the completion
    /// [`policy`](crate::policy)).
    pub fn with_completion(mut self, completion: CompletionOptions) -> Self {
        self.completion = completion;
        self
    }

    /// How many pending and in-flight actions the queue's storage holds before it grows, at most
    /// [`MAX_CAPACITY`](Self::MAX_CAPACITY) (all of it is made when the queue starts). Growth
    /// is amortised and kept, so steady state allocates nothing either way.
    pub fn with_capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity.min(Self::MAX_CAPACITY);
        self
    }

    /// How many actions may be handed to the completion side (issued, or failed before issue) and
    /// not yet retired before [`Queue::submit`](crate::Queue::submit) waits for the completion
    /// side to catch up (at least 1). This bounds what a completion side that falls behind costs:
    /// actions, completion events and their memory stay at most this many, instead of growing to
    /// the largest backlog ever seen. Actions issued by other threads (chains, host signals) are
    /// not held back, so the count can pass the limit by what those issue.
    pub fn with_max_in_flight(mut self, limit: usize) -> Self {
        self.max_in_flight = limit.max(1);
        self
    }

    /// The in-flight limit.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// The queue's label.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The completion side's options.
    pub fn completion(&self) -> CompletionOptions {
        self.completion
    }

    /// The preallocated capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl Default for QueueOptions {
    fn default() -> Self {
        Self::new("queue")
    }
}
