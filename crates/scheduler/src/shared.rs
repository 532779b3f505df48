//! [`Shared`]: the state one queue's submitters, worker and completion thread share.
//!
//! Lock order (a thread holding one may take those after it, never before):
//! `state` -> a semaphore's internal lock -> `Notifier::keys`; `state` -> `finished`;
//! `state` -> the backend's own locks. No semaphore lock is held across the backend's issue (a
//! driver call there would make the completion side and other queues wait for it): an action's
//! waits are looked at, then it is issued, then its signals are recorded, each semaphore lock
//! taken for the look or the record alone. No listener is called under `state`: what the records
//! and failures made due goes into the issuing loop's burst, which runs once the lock is let go
//! (see `issue_lock`). Nothing user-supplied is dropped under `state` (bodies are handed to the
//! completion thread).
//!
//! Who issues: the submitting thread when the action is ready at once; the thread whose semaphore
//! change made a pending action ready (a host `signal`, another queue's issue recording a device
//! signal, a host waiter or completion thread advancing a value), if no other thread holds the
//! queue's issue lock at that moment; otherwise the holder, which drains every notification before
//! it lets go of the lock, or the worker, woken only when the lock was taken by another thread.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::task::Waker;

use crossbeam_utils::CachePadded;
use cuhal_recycle::Recycled;
use cuhal_semaphore::{Failure, Listener};

use crate::action::{Finished, MIN_NEW_BOXES, Spares};
use crate::backend::Backend;
use crate::error::Error;
use crate::hurry::Hurry;
use crate::notifier::Notifier;
use crate::options::QueueOptions;
use crate::state::State;
use crate::sync::{
    AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, Once, Ordering, StatBool, StatU64, Unparker,
};

/// The issue side's counters and flags, on cache lines of their own: the submitting thread
/// writes them, the completion thread only reads them when it must.
pub(crate) struct IssueSide {
    /// Actions handed to the completion side (issued or failed), ever.
    pub(crate) pushed: AtomicU64,
    /// The last value of `CompletionSide::retired` a submitter read: while `pushed` minus this
    /// stays under the in-flight limit, a submitter needs no look at the completion side's line.
    pub(crate) retired_seen: AtomicU64,
    /// The [`thread_key`](crate::issue_lock::thread_key) of the thread holding `state` through an
    /// [`IssueGuard`](crate::issue_lock::IssueGuard) (0: none).
    pub(crate) holder: AtomicU64,
    /// The counters [`Queue::stats`](crate::Queue::stats) reads, written by the holder of the
    /// issue lock: stats never waits for the lock (and works from inside a backend's issue,
    /// where the lock is this thread's own).
    pub(crate) counters: IssueCounters,
}

/// The issue side's counters. Each is written only by the holder of the issue lock, so an
/// increment is a plain load and store.
#[derive(Default)]
pub(crate) struct IssueCounters {
    pub(crate) submitted: StatU64,
    /// The pending list's length when the issue lock was last let go.
    pub(crate) pending: StatU64,
    pub(crate) issued_on_submit: StatU64,
    pub(crate) issued_by_worker: StatU64,
    pub(crate) issued_on_signal: StatU64,
}

/// Adds one to a counter that only the issue lock's holder writes.
pub(crate) fn bump(counter: &StatU64) {
    counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// The completion side's counters, written once per retired batch.
pub(crate) struct CompletionSide {
    /// Actions retired (either way), ever.
    pub(crate) retired: AtomicU64,
    pub(crate) completed: StatU64,
    pub(crate) failed: StatU64,
    pub(crate) batches: StatU64,
    /// The most actions seen handed over but not yet retired, when a batch was taken.
    pub(crate) high_water: StatU64,
    /// Times the completion thread parked with nothing to retire.
    pub(crate) parks: StatU64,
}

/// One queue's shared state.
pub(crate) struct Shared<B: Backend> {
    pub(crate) backend: B,
    pub(crate) options: QueueOptions,
    pub(crate) label: Arc<str>,
    /// On lines of its own: the completion thread takes `finished` (beside it) once per batch,
    /// and must not take the line of the lock every submission takes with it.
    pub(crate) state: CachePadded<Mutex<State<B>>>,
    /// Issued (or failed) actions in issue order, for the completion thread. Preallocated; the
    /// completion thread swaps the whole list out, so it takes this lock once per batch.
    pub(crate) finished: Mutex<Recycled<VecDeque<Finished<B>>, MIN_NEW_BOXES>>,
    pub(crate) finished_len: AtomicUsize,
    /// Body slots the completion side emptied, given back once per batch; the issue side takes
    /// them all at once when its own spares run out. Each list's capacity covers every slot, so
    /// moving slots between them allocates nothing.
    pub(crate) returned: Mutex<Spares<B>>,
    pub(crate) notifier: Notifier<B::Event>,
    /// What the semaphores call: a weak handle back to this state.
    pub(crate) listener: Arc<dyn Listener<B::Event>>,
    /// The backend failure that lost the queue; set once.
    pub(crate) lost: Once<Failure>,
    pub(crate) shutdown: AtomicBool,
    pub(crate) worker_done: AtomicBool,
    pub(crate) issue_side: CachePadded<IssueSide>,
    pub(crate) completion_side: CachePadded<CompletionSide>,
    /// Whether the completion thread is parked (or about to): every issue reads it, to know
    /// whether to wake the thread, so it has a line of its own that changes only when the
    /// thread parks or wakes, not with every retired batch.
    pub(crate) completion_parked: CachePadded<AtomicBool>,
    /// Whether the completion thread is gathering, and whether a parking host thread hurried it:
    /// in an allocation of its own, so that a hurry from outside ([`CompletionNudge`]) holds
    /// nothing else of the queue alive.
    ///
    /// [`CompletionNudge`]: crate::CompletionNudge
    pub(crate) hurry: Arc<Hurry>,
    /// `hurry` as a waker: the wake an issuing loop holds back until it ends.
    pub(crate) completion_waker: Waker,
    /// The [`thread_key`](crate::issue_lock::thread_key) of the completion thread (0 until it
    /// starts): that thread never waits for room on this queue (it is what makes room).
    pub(crate) completion_thread: AtomicU64,
    /// Finished actions in `finished` that must not wait out a gather (work checked on
    /// completion, work a host thread parked on): they end a gather. Changed under the
    /// `finished` lock.
    pub(crate) urgent: AtomicUsize,
    /// Submitters waiting for room (backpressure), and where they wait.
    pub(crate) room_waiters: AtomicUsize,
    pub(crate) room: (Mutex<()>, Condvar),
    pub(crate) worker_parks: StatU64,
    pub(crate) worker_parked: StatBool,
}

impl<B: Backend> Shared<B> {
    /// A queue's shared state, with the listener `listener` makes from a weak handle to it.
    pub(crate) fn new(
        backend: B,
        options: QueueOptions,
        worker: Unparker,
        completion: Unparker,
        nap: Unparker,
        listener: impl FnOnce(Weak<Shared<B>>) -> Arc<dyn Listener<B::Event>>,
    ) -> Arc<Self> {
        let capacity = options.capacity;
        let local = backend.issue_local();
        let hurry = Arc::new(Hurry::new(completion, nap));
        let completion_waker = Waker::from(Arc::clone(&hurry));
        Arc::new_cyclic(|weak: &Weak<Shared<B>>| Shared {
            backend,
            label: Arc::from(options.label.as_str()),
            options,
            state: CachePadded::new(Mutex::new(State::new(local, capacity))),
            finished: Mutex::new(Recycled::with_capacity(capacity)),
            finished_len: AtomicUsize::new(0),
            returned: Mutex::new(Spares::with_capacity(capacity)),
            notifier: Notifier::new(worker, capacity),
            listener: listener(weak.clone()),
            lost: Once::new(),
            shutdown: AtomicBool::new(false),
            worker_done: AtomicBool::new(false),
            issue_side: CachePadded::new(IssueSide {
                pushed: AtomicU64::new(0),
                retired_seen: AtomicU64::new(0),
                holder: AtomicU64::new(0),
                counters: IssueCounters::default(),
            }),
            completion_side: CachePadded::new(CompletionSide {
                retired: AtomicU64::new(0),
                completed: StatU64::new(0),
                failed: StatU64::new(0),
                batches: StatU64::new(0),
                high_water: StatU64::new(0),
                parks: StatU64::new(0),
            }),
            completion_parked: CachePadded::new(AtomicBool::new(false)),
            hurry,
            completion_waker,
            completion_thread: AtomicU64::new(0),
            urgent: AtomicUsize::new(0),
            room_waiters: AtomicUsize::new(0),
            room: (Mutex::new(()), Condvar::new()),
            worker_parks: StatU64::new(0),
            worker_parked: StatBool::new(false),
        })
    }

    /// The error a submission to a lost queue gets (called once the queue is lost).
    #[cold]
    pub(crate) fn lost_error(&self) -> Error {
        Error::Lost {
            queue: self.label.clone(),
            failure: self
                .lost
                .get()
                .unwrap_or_else(|| Failure::msg("the queue is lost")),
        }
    }

    /// Marks the queue lost (the first failure wins) and wakes the worker to fail what is pending.
    pub(crate) fn mark_lost(&self, failure: &Failure) {
        if self.lost.set(failure.clone()) {
            self.notifier.wake();
        }
    }
}
