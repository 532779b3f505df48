//! [`QueueOptions`]: a queue's label, completion options, in-flight limit and preallocated capacity.

use std::time::Duration;

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

/// What a user may tune of a queue's completion side. Everything else is a constant of the
/// policy ([`IDLE_SPIN`](crate::policy::IDLE_SPIN), [`POLL_INTERVAL`](crate::policy::POLL_INTERVAL),
/// [`BUSY_QUERY_PACE`](crate::policy::BUSY_QUERY_PACE), [`NAP`](crate::policy::NAP),
/// [`NAP_STEP`](crate::policy::NAP_STEP), [`HOST_WAIT_SPIN`](crate::policy::HOST_WAIT_SPIN)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletionOptions {
    /// How long a completion somebody needs (a host thread parked on its semaphores, a
    /// submitter waiting for room, work checked on completion) is polled before the completion
    /// thread blocks on the device. Longer: completions seen sooner under load (a spinning wait
    /// saw a kernel end 4.9 us after it did on an H200, a blocking one 36.5 us); shorter: less
    /// CPU burnt while long work runs. A hurried nap polls at least this long too.
    pub spin: Duration,
    /// How long finished work may gather after a batch nobody waited for, before the
    /// completion thread takes the next: fewer, larger batches, so fewer event queries
    /// contending for the driver's lock with the submitters and less CPU per submission, at
    /// the cost of values reaching the host up to this late while nobody waits for them.
    /// Zero: no gathering (each batch is retired as soon as it is seen).
    pub gather: Duration,
    /// How many finished actions end a gather early (at least 1): a fast submitter's batches
    /// hold about this many actions. Larger: fewer wake-ups per action on the completion side,
    /// more actions and completion events in flight.
    pub gather_batch: usize,
}

impl CompletionOptions {
    /// Default [`spin`](Self::spin): the nap window ([`NAP`](crate::policy::NAP)), so a needed
    /// wait polls as long as a hurried nap. A future awaiting a 50 us kernel woke 3.9-4.1 us
    /// after the kernel ended with it and 24.6-34.4 us with a 50 us spin, whose wake the device's
    /// block made (H100, bench case 15; `cuEventSynchronize`: 2.2 us).
    pub const DEFAULT_SPIN: Duration = Duration::from_micros(500);
    /// Default [`gather`](Self::gather): none. A backend whose completion queries are cheap and
    /// do not contend with its issue (the host backend) gains nothing from gathering.
    pub const DEFAULT_GATHER: Duration = Duration::ZERO;
    /// A gather for devices whose completion queries contend with the issue (a CUDA event query
    /// takes the driver's lock): a fast submitter fills a batch first, a slow one is retired at
    /// least this often (bench case 1, docs/decisions/scheduler.md, "Completion gathering").
    pub const SUGGESTED_GATHER: Duration = Duration::from_micros(400);
    /// Default [`gather_batch`](Self::gather_batch).
    pub const DEFAULT_GATHER_BATCH: usize = 128;

    /// The defaults.
    pub const fn new() -> Self {
        CompletionOptions {
            spin: Self::DEFAULT_SPIN,
            gather: Self::DEFAULT_GATHER,
            gather_batch: Self::DEFAULT_GATHER_BATCH,
        }
    }

    /// With [`spin`](Self::spin).
    pub const fn with_spin(mut self, spin: Duration) -> Self {
        self.spin = spin;
        self
    }

    /// With [`gather`](Self::gather).
    pub const fn with_gather(mut self, gather: Duration) -> Self {
        self.gather = gather;
        self
    }

    /// With [`gather_batch`](Self::gather_batch).
    pub const fn with_gather_batch(mut self, batch: usize) -> Self {
        self.gather_batch = batch;
        self
    }

    /// [`gather_batch`](Self::gather_batch), at least 1.
    pub(crate) fn batch(&self) -> usize {
        self.gather_batch.max(1)
    }
}

impl Default for CompletionOptions {
    fn default() -> Self {
        Self::new()
    }
}
