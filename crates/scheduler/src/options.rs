//! [`QueueOptions`]: a queue's label, spin budgets and preallocated capacity.

use std::time::Duration;

/// How a [`Queue`](crate::Queue) is set up. Build with [`QueueOptions::new`] and the `with_*`
/// methods.
#[derive(Debug, Clone)]
pub struct QueueOptions {
    pub(crate) label: String,
    pub(crate) completion_spin: Duration,
    pub(crate) idle_spin: Duration,
    pub(crate) completion_gather: Duration,
    pub(crate) gather_batch: usize,
    pub(crate) capacity: usize,
    pub(crate) max_in_flight: usize,
    pub(crate) eager_completion: bool,
}

impl QueueOptions {
    /// Default [`completion_spin`](Self::with_completion_spin). On an H200 a spinning wait saw a
    /// kernel finish 4.9 us after it did and a blocking one 36.5 us: a busy queue should spin, an
    /// idle one must not burn a core, and 50 us covers back-to-back short work.
    pub const DEFAULT_COMPLETION_SPIN: Duration = Duration::from_micros(50);
    /// Default [`idle_spin`](Self::with_idle_spin).
    pub const DEFAULT_IDLE_SPIN: Duration = Duration::from_micros(100);
    /// Default [`completion_gather`](Self::with_completion_gather): none. A backend whose
    /// completion waits are cheap and do not contend with its issue (the host backend) gains
    /// nothing from gathering; cuhal's CUDA device queues gather (800 us with batches of 256 by
    /// default, twice [`SUGGESTED_COMPLETION_GATHER`](Self::SUGGESTED_COMPLETION_GATHER) and
    /// [`DEFAULT_GATHER_BATCH`](Self::DEFAULT_GATHER_BATCH), chosen by bench case 1).
    pub const DEFAULT_COMPLETION_GATHER: Duration = Duration::ZERO;
    /// A gather for devices whose completion queries contend with the issue (a CUDA event query
    /// takes the driver's lock): a fast submitter (a chained 1-dispatch submission every 1-3 us
    /// on an H200) fills a batch of 128 first, which ends the gather; a slow one is retired at
    /// least every 400 us.
    pub const SUGGESTED_COMPLETION_GATHER: Duration = Duration::from_micros(400);
    /// Default [`gather_batch`](Self::with_gather_batch).
    pub const DEFAULT_GATHER_BATCH: usize = 128;
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
            completion_spin: Self::DEFAULT_COMPLETION_SPIN,
            idle_spin: Self::DEFAULT_IDLE_SPIN,
            completion_gather: Self::DEFAULT_COMPLETION_GATHER,
            gather_batch: Self::DEFAULT_GATHER_BATCH,
            capacity: Self::DEFAULT_CAPACITY,
            max_in_flight: Self::DEFAULT_MAX_IN_FLIGHT,
            eager_completion: false,
        }
    }

    /// How long the completion thread polls a completion event before it asks the backend to
    /// block ([`Backend::wait_event`](crate::Backend::wait_event)'s `spin`), when somebody needs
    /// the answer (a host thread parked on a semaphore the work signals, a submitter waiting for
    /// room) or [`eager_completion`](Self::with_eager_completion) is on; otherwise it blocks at
    /// once. Longer: completions seen sooner under load; shorter: less CPU burnt while long work
    /// runs.
    pub fn with_completion_spin(mut self, spin: Duration) -> Self {
        self.completion_spin = spin;
        self
    }

    /// How long the worker and completion threads look for new work before they park when their
    /// queue is empty. A parked thread takes microseconds to wake (5.6 us p50 on an H200 host);
    /// a spinning one a fraction of one.
    pub fn with_idle_spin(mut self, spin: Duration) -> Self {
        self.idle_spin = spin;
        self
    }

    /// How long the completion thread lets finished actions gather after it retired a batch that
    /// nobody waited for (no host thread parked on its signals, no submitter waiting for room,
    /// [`eager_completion`](Self::with_eager_completion) off), before it takes the next: it
    /// sleeps meanwhile, and is woken early by a submitter that needs room, by work only it
    /// can complete (work checked on completion) or that signals a semaphore a host thread is
    /// parked on, by a [`CompletionNudge`](crate::CompletionNudge), or by the push that makes
    /// [`gather_batch`](Self::with_gather_batch) actions wait.
    /// Without it (the default), a queue fed faster than the completion thread wakes retires a
    /// batch of one or two actions every few microseconds:
    /// one event query (the driver's lock, which the submitter needs), one semaphore lock and
    /// one pool return per action, on a core that never rests. Zero: no gathering. Host waiters
    /// are not held up: they poll the events they wait for themselves, and one that outlasts
    /// its spin and parks ends the gather, through its event if the backend passes
    /// [`DeviceEvent::awaited`](cuhal_semaphore::DeviceEvent::awaited) on to the queue's
    /// [`CompletionNudge`](crate::CompletionNudge) (else it waits out up to one gather).
    pub fn with_completion_gather(mut self, gather: Duration) -> Self {
        self.completion_gather = gather;
        self
    }

    /// How many finished actions end a [gather](Self::with_completion_gather) early (at least
    /// 1): the push that makes this many wait wakes the gathering completion thread, and a
    /// thread that finds this many waiting does not gather. So a fast submitter's batches hold
    /// about this many actions whatever the gather's length. Larger: fewer wake-ups per action
    /// on the completion side, more actions and completion events in flight.
    pub fn with_gather_batch(mut self, batch: usize) -> Self {
        self.gather_batch = batch.max(1);
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

    /// Whether the completion thread polls every batch's newest event for its
    /// [`completion_spin`](Self::with_completion_spin) even when nobody waits for it (off by
    /// default: then it blocks at once, and host waiters poll the events they need themselves).
    /// On: values reach the host sooner without a waiter's help, at the cost of a core while work
    /// flows.
    pub fn with_eager_completion(mut self, eager: bool) -> Self {
        self.eager_completion = eager;
        self
    }

    /// The in-flight limit.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// Whether completion polls eagerly.
    pub fn eager_completion(&self) -> bool {
        self.eager_completion
    }

    /// The queue's label.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The completion spin budget.
    pub fn completion_spin(&self) -> Duration {
        self.completion_spin
    }

    /// The idle spin budget.
    pub fn idle_spin(&self) -> Duration {
        self.idle_spin
    }

    /// How long finished actions gather after a batch nobody waited for.
    pub fn completion_gather(&self) -> Duration {
        self.completion_gather
    }

    /// How many finished actions end a gather.
    pub fn gather_batch(&self) -> usize {
        self.gather_batch
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
