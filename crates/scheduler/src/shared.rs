//! The state one queue's submitters, worker and completion thread share, and the scheduling
//! logic that runs under its issue lock.
//!
//! Lock order (a thread holding one may take those after it, never before):
//! `state` -> a semaphore's internal lock -> `Notifier::keys`; `state` -> `finished`;
//! `state` -> the backend's own locks. No semaphore lock is held across the backend's issue (a
//! driver call there would make the completion side and other queues wait for it): an action's
//! waits are looked at, then it is issued, then its signals are recorded, each semaphore lock
//! taken for the look or the record alone. Listeners run outside semaphore locks; a listener may run
//! while its thread holds another queue's `state` (an issue there recorded a device signal), so it
//! only ever *tries* to take its own queue's `state` and never waits for it. Nothing user-supplied
//! is dropped or called under `state` (bodies are handed to the completion thread).
//!
//! Who issues: the submitting thread when the action is ready at once; the thread whose semaphore
//! change made a pending action ready (a host `signal`, another queue's issue recording a device
//! signal, a host waiter or completion thread advancing a value), if no other thread holds the
//! queue's issue lock at that moment; otherwise the holder, which drains every notification before
//! it lets go of the lock, or the worker, woken only when the lock was taken by another thread.

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, PoisonError, TryLockError, Weak};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use cuhal_semaphore::{Failure, Listener, Notice, Semaphore, SemaphoreId, WaitPoint};

use crate::action::{Boxed, Cleanups, EventList, Finished, Resources, Spare};
use crate::backend::Backend;
use crate::burst;
use crate::error::Error;
pub(crate) use crate::hurry::Hurry;
use crate::notifier::{Notified, Notifier};
use crate::options::QueueOptions;
use crate::pending::{PendingList, Waiting};
use crate::readiness::{Collect, Hint, Readiness, examine, examine_borrowed};
use crate::sync::{
    AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard, Once, Ordering, StatBool,
    StatU64, Unparker, thread_local,
};

/// Everything under the issue lock.
pub(crate) struct State<B: Backend> {
    pub(crate) pending: PendingList<B>,
    /// The notification keys being handled, swapped with the notifier's list (both keep their
    /// capacity, so draining allocates nothing).
    keys: Vec<Notified<B::Event>>,
    /// Empty body slots for the next submissions (see [`Boxed`]).
    spare: Vec<Spare<B>>,
    /// Body slots in rotation: every one is spare, returned, or holds a live action.
    boxes: usize,
    /// Body slots made when the queue started (its `capacity`) and not in rotation yet: a
    /// rotation that must grow takes these before it allocates. Kept apart so that the slots
    /// in rotation (which the submitter walks through, the spares first, then those given back)
    /// stay as few as the queue's in-flight high-water mark, not all that were made.
    reserve: Vec<Spare<B>>,
    /// The backend's state for this queue's issues.
    local: B::IssueLocal,
    /// The device signal this queue recorded last, on an event the backend [orders] its later
    /// work after: its semaphore and value. A wait for that value or a lower one on that
    /// semaphore then needs no look at the semaphore (a chain on one queue), unless it failed.
    ///
    /// [orders]: Backend::orders
    last_signal: Option<(SemaphoreId, u64)>,
}

impl<B: Backend> State<B> {
    /// Whether stream order alone satisfies every one of `waits` (see `last_signal`).
    fn ordered(&self, waits: &[(&Semaphore<B::Event>, u64)]) -> bool {
        let Some((id, recorded)) = self.last_signal else {
            return false;
        };
        waits.iter().all(|(semaphore, value)| {
            semaphore.id() == id && *value <= recorded && !semaphore.has_failed()
        })
    }
}

/// The issue side's counters and flags, on cache lines of their own: the submitting thread
/// writes them, the completion thread only reads them when it must.
pub(crate) struct IssueSide {
    /// Actions handed to the completion side (issued or failed), ever.
    pub(crate) pushed: AtomicU64,
    /// The last value of `CompletionSide::retired` a submitter read: while `pushed` minus this
    /// stays under the in-flight limit, a submitter needs no look at the completion side's line.
    pub(crate) retired_seen: AtomicU64,
    /// A token of the thread holding `state` through an [`IssueGuard`] (0: none).
    pub(crate) holder: AtomicUsize,
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
fn bump(counter: &StatU64) {
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

pub(crate) struct Shared<B: Backend> {
    pub(crate) backend: B,
    pub(crate) options: QueueOptions,
    pub(crate) label: Arc<str>,
    /// On lines of its own: the completion thread takes `finished` (beside it) once per batch,
    /// and must not take the line of the lock every submission takes with it.
    pub(crate) state: CachePadded<Mutex<State<B>>>,
    /// Issued (or failed) actions in issue order, for the completion thread. Preallocated; the
    /// completion thread swaps the whole list out, so it takes this lock once per batch.
    pub(crate) finished: Mutex<VecDeque<Finished<B>>>,
    pub(crate) finished_len: AtomicUsize,
    /// Body slots the completion side emptied, given back once per batch; the issue side takes
    /// them all at once when its own spares run out. Each list's capacity covers every slot, so
    /// moving slots between them allocates nothing.
    pub(crate) returned: Mutex<Vec<Spare<B>>>,
    pub(crate) notifier: Notifier<B::Event>,
    /// What the semaphores call: a weak handle back to this state.
    pub(crate) listener: Arc<dyn Listener>,
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

/// The fewest body slots made at once when a queue runs out.
const MIN_NEW_BOXES: usize = 16;

/// Who is issuing, for the statistics.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Issuer {
    Submitter,
    Worker,
    /// A thread whose semaphore change made the action ready.
    Signaller,
}

#[cfg(not(loom))]
thread_local! {
    /// This thread's token (0: not taken yet), from `NEXT_TOKEN`.
    static THREAD_TOKEN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Set on a queue's completion thread: such a thread never waits for room (it is what makes room).
    pub(crate) static COMPLETION_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

// The same under loom, whose macro takes no `const` initialiser (each loom thread has its own).
#[cfg(loom)]
thread_local! {
    static THREAD_TOKEN: std::cell::Cell<usize> = std::cell::Cell::new(0);
    pub(crate) static COMPLETION_THREAD: std::cell::Cell<bool> = std::cell::Cell::new(false);
}

/// Thread tokens are handed out once and never reused, so a stale `holder` value (a thread that
/// ended while some other thread's view of `holder` still shows it) can never match a later
/// thread. (A token made from a thread-local's address could: a new thread may get a dead one's
/// address.) Identity only, so a plain std counter in every build.
static NEXT_TOKEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

fn thread_token() -> usize {
    THREAD_TOKEN.with(|token| match token.get() {
        0 => {
            let fresh = NEXT_TOKEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            token.set(fresh);
            fresh
        }
        taken => taken,
    })
}

/// The queue's semaphore listener: tries to handle the notification on the notifying thread.
struct QueueListener<B: Backend>(Weak<Shared<B>>);

impl<B: Backend> Listener for QueueListener<B> {
    fn notify(&self, semaphore: SemaphoreId, key: u64) {
        self.notice(semaphore, key, Notice::Changed);
    }

    fn notice(&self, semaphore: SemaphoreId, key: u64, notice: Notice<'_>) {
        if let Some(shared) = self.0.upgrade() {
            shared.on_listener(key, Hint::from_notice(semaphore, notice));
        }
    }
}

/// The issue lock, held by a thread that may issue. Before the lock is let go every notification
/// recorded meanwhile is handled (one the holder's own issues caused, or one another thread
/// recorded because it found the lock taken), so none waits for the worker needlessly.
pub(crate) struct IssueGuard<'a, B: Backend> {
    shared: &'a Shared<B>,
    state: Option<MutexGuard<'a, State<B>>>,
    issuer: Issuer,
}

impl<B: Backend> Deref for IssueGuard<'_, B> {
    type Target = State<B>;
    fn deref(&self) -> &State<B> {
        self.state.as_deref().expect("held until drop")
    }
}

impl<B: Backend> DerefMut for IssueGuard<'_, B> {
    fn deref_mut(&mut self) -> &mut State<B> {
        self.state.as_deref_mut().expect("held until drop")
    }
}

impl<B: Backend> Drop for IssueGuard<'_, B> {
    fn drop(&mut self) {
        let shared = self.shared;
        if let Some(mut state) = self.state.take() {
            shared.drain(&mut state, self.issuer);
            let pending = state.pending.len() as u64;
            shared
                .issue_side
                .counters
                .pending
                .store(pending, Ordering::Relaxed);
            shared.issue_side.holder.store(0, Ordering::Release);
            drop(state);
        }
        burst::leave();
    }
}

impl<B: Backend> Shared<B> {
    pub(crate) fn new(
        backend: B,
        options: QueueOptions,
        worker: Unparker,
        completion: Unparker,
        nap: Unparker,
    ) -> Arc<Self> {
        let capacity = options.capacity;
        let local = backend.issue_local();
        Arc::new_cyclic(|weak: &Weak<Shared<B>>| {
            let listener: Arc<dyn Listener> = Arc::new(QueueListener(weak.clone()));
            Shared {
                backend,
                label: Arc::from(options.label.as_str()),
                options,
                state: CachePadded::new(Mutex::new(State {
                    pending: PendingList::with_capacity(capacity),
                    keys: Vec::with_capacity(capacity),
                    spare: Vec::with_capacity(capacity),
                    boxes: 0,
                    reserve: (0..capacity).map(|_| Spare::new()).collect(),
                    local,
                    last_signal: None,
                })),
                finished: Mutex::new(VecDeque::with_capacity(capacity)),
                finished_len: AtomicUsize::new(0),
                returned: Mutex::new(Vec::with_capacity(capacity)),
                notifier: Notifier::new(worker, capacity),
                listener,
                lost: Once::new(),
                shutdown: AtomicBool::new(false),
                worker_done: AtomicBool::new(false),
                issue_side: CachePadded::new(IssueSide {
                    pushed: AtomicU64::new(0),
                    retired_seen: AtomicU64::new(0),
                    holder: AtomicUsize::new(0),
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
                hurry: Arc::new(Hurry::new(completion, nap)),
                urgent: AtomicUsize::new(0),
                room_waiters: AtomicUsize::new(0),
                room: (Mutex::new(()), Condvar::new()),
                worker_parks: StatU64::new(0),
                worker_parked: StatBool::new(false),
            }
        })
    }

    /// Takes the issue lock, waiting for it.
    pub(crate) fn lock_issue(&self, issuer: Issuer) -> IssueGuard<'_, B> {
        // Backend calls under the lock are caught, so a poisoned lock still guards consistent state.
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.guard(state, issuer)
    }

    /// Whether this thread holds the issue lock: it is inside this queue's backend issue (a
    /// deferred replay's stream work, say), and waiting for the lock would wait for itself.
    pub(crate) fn issuing_here(&self) -> bool {
        self.issue_side.holder.load(Ordering::Relaxed) == thread_token()
    }

    fn guard<'a>(&'a self, state: MutexGuard<'a, State<B>>, issuer: Issuer) -> IssueGuard<'a, B> {
        burst::enter();
        self.issue_side
            .holder
            .store(thread_token(), Ordering::Relaxed);
        IssueGuard {
            shared: self,
            state: Some(state),
            issuer,
        }
    }

    /// A semaphore that a pending action of this queue waits on changed. Handled here, on the
    /// thread that changed it, when the issue lock is free; recorded for the holder when this
    /// thread holds it (an issue here recorded the signal); recorded for the worker, which is
    /// woken, when another thread holds it.
    fn on_listener(&self, key: u64, hint: Option<Hint<B::Event>>) {
        if self.issue_side.holder.load(Ordering::Relaxed) == thread_token() {
            self.notifier.push(key, hint);
            return;
        }
        let state = match self.state.try_lock() {
            Ok(state) => state,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                // The holder may already be past its last look at the notifications.
                self.notifier.push(key, hint);
                self.notifier.wake();
                return;
            }
        };
        let mut guard = self.guard(state, Issuer::Signaller);
        self.on_notify(&mut guard, key, hint, Issuer::Signaller);
        self.pump(&mut guard, Issuer::Signaller);
    }

    /// Handles every recorded notification and issues what became ready, until none is left.
    fn drain(&self, state: &mut State<B>, issuer: Issuer) {
        while self.notifier.has_keys() {
            let mut keys = std::mem::take(&mut state.keys);
            self.notifier.take(&mut keys);
            for (key, hint) in keys.drain(..) {
                self.on_notify(state, key, hint, issuer);
            }
            state.keys = keys;
            self.pump(state, issuer);
        }
    }

    /// Waits, outside every lock, while the queue has `max_in_flight` actions handed to the
    /// completion side and not yet retired: a completion side that falls behind slows the
    /// submitter down instead of letting memory (actions, completion events) grow with the
    /// backlog. Never waits on a completion thread (it is what makes room) nor once the queue
    /// is lost or shutting down (what is in flight is then being failed or drained).
    pub(crate) fn wait_for_room(&self) {
        let limit = self.options.max_in_flight as u64;
        let side = &*self.issue_side;
        let pushed = side.pushed.load(Ordering::Relaxed);
        if pushed.saturating_sub(side.retired_seen.load(Ordering::Relaxed)) < limit {
            return;
        }
        let full = || {
            let retired = self.completion_side.retired.load(Ordering::Acquire);
            side.retired_seen.store(retired, Ordering::Relaxed);
            side.pushed.load(Ordering::Relaxed).saturating_sub(retired) >= limit
                && !self.lost.is_set()
                && !self.shutdown.load(Ordering::Relaxed)
        };
        if !full() || COMPLETION_THREAD.with(std::cell::Cell::get) {
            return;
        }
        // Other queues' completion threads whose wakes this thread held back (a listener that
        // submits, called inside a burst) are not left parked while it waits.
        burst::wake_held();
        self.room_waiters.fetch_add(1, Ordering::SeqCst);
        // Needed now: ends a gather or a nap, and wakes a parked completion thread.
        self.hurry.hurry();
        self.hurry.wake();
        let (lock, condvar) = &self.room;
        let mut room = lock.lock().unwrap_or_else(PoisonError::into_inner);
        while full() {
            // The completion thread notifies after every batch while someone waits; the timeout
            // only bounds the cost of a notification that raced with this check.
            room = condvar
                .wait_timeout(room, Duration::from_millis(1))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        drop(room);
        self.room_waiters.fetch_sub(1, Ordering::SeqCst);
    }

    /// Wakes submitters waiting for room (after a batch was retired).
    pub(crate) fn notify_room(&self) {
        if self.room_waiters.load(Ordering::SeqCst) > 0 {
            let (lock, condvar) = &self.room;
            drop(lock.lock().unwrap_or_else(PoisonError::into_inner));
            condvar.notify_all();
        }
    }

    pub(crate) fn lost_error(&self) -> Option<Error> {
        self.lost.get().map(|failure| Error::Lost {
            queue: self.label.clone(),
            failure,
        })
    }

    /// Accepts a submitted action: issues it at once if it is ready and nothing is pending ahead
    /// of it (the fast path: no thread hand-off), else makes it pending.
    ///
    /// `body` comes without its waits, which are `waits`: an action issued at once never needs
    /// its wait semaphores again, so they are cloned into it only if it goes pending.
    pub(crate) fn enqueue(
        &self,
        state: &mut State<B>,
        mut body: Boxed<B>,
        waits: &[(&Semaphore<B::Event>, u64)],
    ) {
        bump(&self.issue_side.counters.submitted);
        if state.pending.is_empty() {
            if state.ordered(waits) {
                self.issue_ready(state, body, EventList::new(), Issuer::Submitter);
                return;
            }
            let mut device_waits = EventList::new();
            match examine_borrowed(
                waits.iter().map(|(s, v)| (*s, *v)),
                0,
                Some(Collect {
                    events: &mut device_waits,
                    ordered: &|event| self.backend.orders(event),
                }),
            ) {
                Readiness::Ready => self.issue_ready(state, body, device_waits, Issuer::Submitter),
                Readiness::Failed(failure) => self.fail_unissued(body, failure),
                Readiness::Blocked(index) => {
                    body.own_waits(waits);
                    self.make_pending(state, body, index);
                }
            }
        } else {
            body.own_waits(waits);
            match examine(&body.waits, 0, None, None) {
                Readiness::Ready => {
                    state.pending.push_back(body, Waiting::Ready);
                    // The actions ahead may be ready too, waiting for the worker: issue them here.
                    self.pump(state, Issuer::Submitter);
                }
                Readiness::Failed(failure) => self.fail_unissued(body, failure),
                Readiness::Blocked(index) => self.make_pending(state, body, index),
            }
        }
    }

    /// Appends a blocked action and listens on the semaphore it is blocked on.
    fn make_pending(&self, state: &mut State<B>, body: Boxed<B>, index: usize) {
        let (semaphore, value) = body.waits[index].clone();
        // A placeholder until the token exists; no notification can be handled before the state
        // lock is released.
        let (slot, key) = state.pending.push_back(body, Waiting::Ready);
        let token = semaphore.listen(value, &self.listener, key);
        state.pending.get_mut(slot).waiting = Waiting::Listening { index, token };
    }

    /// Looks again at the action `key` names, whose awaited semaphore changed. The head of the
    /// list is issued right here if it is ready (its waits looked at once, not once to find it
    /// ready and again to issue it); any other action is only marked ready, to be issued in order.
    /// The wait it listened on is answered by `hint` where that can (see [`Hint`]).
    pub(crate) fn on_notify(
        &self,
        state: &mut State<B>,
        key: u64,
        hint: Option<Hint<B::Event>>,
        issuer: Issuer,
    ) {
        let Some(slot) = state.pending.find(key) else {
            return; // issued, failed, or removed since: a stale notification
        };
        let pending = state.pending.get_mut(slot);
        let Waiting::Listening { index, .. } = pending.waiting else {
            return;
        };
        let (semaphore, value) = &pending.body.waits[index];
        let known = hint.and_then(|hint| hint.point_for(semaphore, *value));
        if state.pending.head() == Some(slot) {
            let body = state.pending.remove(slot).body;
            let known = known.map(|point| (index, point));
            if let Some((body, index)) = self.issue_if_ready(state, body, known, issuer) {
                self.pend_at_head(state, body, index);
            }
            return;
        }
        let pending = state.pending.get_mut(slot);
        // The waits before `index` were looked at before, and the hint may answer for `index`.
        let from = index + usize::from(known.is_some());
        match examine(&pending.body.waits, from, None, None) {
            Readiness::Ready => pending.waiting = Waiting::Ready,
            Readiness::Blocked(index) => {
                let (semaphore, value) = &pending.body.waits[index];
                let token = semaphore.listen(*value, &self.listener, key);
                pending.waiting = Waiting::Listening { index, token };
            }
            Readiness::Failed(failure) => {
                let pending = state.pending.remove(slot);
                self.fail_unissued(pending.body, failure);
            }
        }
    }

    /// Issues ready actions from the head of the pending list, in submission order.
    pub(crate) fn pump(&self, state: &mut State<B>, issuer: Issuer) {
        while let Some(slot) = state.pending.ready_head() {
            let body = state.pending.remove(slot).body;
            if let Some((body, index)) = self.issue_if_ready(state, body, None, issuer) {
                // Waits never move backwards, so a conforming semaphore only gets here from
                // `on_notify`'s look at the head; waiting again is the answer either way.
                self.pend_at_head(state, body, index);
                return;
            }
        }
    }

    /// Puts an action taken from the head back there, listening on its blocked wait `index`.
    fn pend_at_head(&self, state: &mut State<B>, body: Boxed<B>, index: usize) {
        let (semaphore, value) = body.waits[index].clone();
        let (slot, key) = state.pending.push_front(body, Waiting::Ready);
        let token = semaphore.listen(value, &self.listener, key);
        state.pending.get_mut(slot).waiting = Waiting::Listening { index, token };
    }

    /// Looks at every wait of `body` (but the one `known` answers for) and issues it if each is
    /// reached or device-waitable (or fails it if a wait semaphore failed); gives it back, with
    /// the index of the first wait that is neither, otherwise.
    ///
    /// Each wait's semaphore lock is taken for its look, and each signal's for its record after
    /// the backend's issue: an action that waits on a semaphore it also signals (a chain: wait
    /// for `v`, signal `v + 1`) takes that lock twice, but never holds it across the driver's
    /// calls, where it would make the completion side's advance and every other queue's look at
    /// that semaphore wait for them.
    fn issue_if_ready(
        &self,
        state: &mut State<B>,
        body: Boxed<B>,
        known: Option<(usize, WaitPoint<B::Event>)>,
        issuer: Issuer,
    ) -> Option<(Boxed<B>, usize)> {
        let mut device_waits = EventList::new();
        let ordered = |event: &B::Event| self.backend.orders(event);
        let skip = known.map(|(index, point)| {
            // Stream order may already give the known device signal, as a look would find.
            if let WaitPoint::Device { event, .. } = point
                && !ordered(&event)
            {
                device_waits.push(event);
            }
            index
        });
        let collect = Collect {
            events: &mut device_waits,
            ordered: &ordered,
        };
        match examine(&body.waits, 0, Some(collect), skip) {
            Readiness::Ready => self.issue_ready(state, body, device_waits, issuer),
            Readiness::Failed(failure) => self.fail_unissued(body, failure),
            Readiness::Blocked(index) => return Some((body, index)),
        }
        None
    }

    /// Issues an action whose waits are all reached or device-waitable (`device_waits`).
    fn issue_ready(
        &self,
        state: &mut State<B>,
        mut body: Boxed<B>,
        device_waits: EventList<B::Event>,
        issuer: Issuer,
    ) {
        if let Some(failure) = self.lost.get() {
            self.fail_unissued(body, failure);
            return;
        }
        let issued = self.call_backend(&mut state.local, &device_waits, body.payload_mut());
        let checked = self.backend.checks_completion(body.payload());
        if let Ok(event) = &issued {
            if !body.resources.is_empty() {
                self.backend.issued(&body.resources);
            }
            // Work that is checked when it completes signals only from the completion side.
            if !checked {
                let ordered = self.backend.orders(event);
                for (semaphore, value) in &body.signals {
                    // Err only if the semaphore already failed: nothing to record then.
                    if semaphore
                        .record_device_signal(*value, event.clone())
                        .is_ok()
                        && ordered
                    {
                        state.last_signal = Some((semaphore.id(), *value));
                    }
                }
            }
        }
        self.after_issue(state, body, issued, device_waits, issuer, checked);
    }

    /// The backend's issue, a panic in it counted as a failure.
    fn call_backend(
        &self,
        local: &mut B::IssueLocal,
        device_waits: &[B::Event],
        payload: &mut B::Payload,
    ) -> Result<B::Event, Failure> {
        catch_unwind(AssertUnwindSafe(|| {
            self.backend.issue(local, device_waits, payload)
        }))
        .unwrap_or_else(|_| Err(Failure::msg("the backend panicked while issuing an action")))
    }

    /// After the backend's issue of an action (whose completion event is already recorded as
    /// the device-signal timepoint of its signal semaphores, under the issue lock, so timepoints
    /// are recorded in issue order, unless the work is `checked` on completion): hands it to the
    /// completion thread, or on a backend error fails it and loses the queue.
    fn after_issue(
        &self,
        state: &mut State<B>,
        body: Boxed<B>,
        issued: Result<B::Event, Failure>,
        device_waits: EventList<B::Event>,
        issuer: Issuer,
        checked: bool,
    ) {
        match issued {
            Ok(event) => {
                match issuer {
                    Issuer::Submitter => bump(&self.issue_side.counters.issued_on_submit),
                    Issuer::Worker => bump(&self.issue_side.counters.issued_by_worker),
                    Issuer::Signaller => bump(&self.issue_side.counters.issued_on_signal),
                }
                self.push_finished(Finished::Issued {
                    body,
                    event,
                    device_waits,
                    checked,
                });
            }
            Err(failure) => {
                self.mark_lost(&failure);
                self.fail_unissued(body, failure.clone());
                self.fail_all_pending(state, &failure);
            }
        }
    }

    /// Fails an action that was never issued: its signals now, its cleanup on the completion thread.
    pub(crate) fn fail_unissued(&self, body: Boxed<B>, failure: Failure) {
        body.fail_signals(&failure);
        self.push_finished(Finished::Failed { body, failure });
    }

    /// Fails every pending action with `failure` (the queue is lost or shutting down).
    pub(crate) fn fail_all_pending(&self, state: &mut State<B>, failure: &Failure) {
        while let Some(slot) = state.pending.head() {
            let pending = state.pending.remove(slot);
            if let Waiting::Listening { index, token } = pending.waiting {
                pending.body.waits[index].0.cancel_listen(token);
            }
            self.fail_unissued(pending.body, failure.clone());
        }
    }

    /// Hands `finished` to the completion thread.
    fn push_finished(&self, finished: Finished<B>) {
        let gathers = !self.options.completion.gather.is_zero();
        let batch = self.options.completion.batch();
        let (wake, urgent, may_wait) = {
            let mut queue = self.finished.lock().unwrap_or_else(PoisonError::into_inner);
            // Work checked on completion signals only from the completion thread: nobody else
            // can poll for it, so it must not wait out a gather. Nor must work that a host thread
            // parked on (a wait that parked before this signal was recorded had no event to
            // nudge the queue through, see `Hurry`). Looked at under this lock: a waiter that
            // registers after this look hurries after it, and the take that sees the hurry (it
            // reads it under this lock) finds this action in the list.
            let urgent = gathers
                && match &finished {
                    Finished::Issued { checked: true, .. } => true,
                    Finished::Issued { body, .. } => body.has_parked_waiters(),
                    Finished::Failed { .. } => false,
                };
            queue.push_back(finished);
            // The completion thread read the next slot last, in its previous batch.
            cuhal_semaphore::prefetch::next_slot(&queue);
            let len = queue.len();
            self.finished_len.store(len, Ordering::Release);
            if urgent {
                // Written under this lock only: no locked add needed.
                let urgent = self.urgent.load(Ordering::Relaxed);
                self.urgent.store(urgent + 1, Ordering::Relaxed);
            }
            // Only a parked completion thread needs the wake (a syscall), or a gathering one for
            // urgent work or once a full batch waits (one wake per batch); one that is retiring
            // or spinning sees `finished_len`. Read under this lock: the completion thread raises
            // `parked` (or `gathering`) before its last look at the list, which it takes under
            // this lock too (see `Shared::finished_waiting`), so either it sees this item or
            // this sees its flag.
            let wake = self.completion_parked.load(Ordering::Relaxed)
                || (len == batch && self.hurry.gathering());
            // A parked thread's wake for work nobody needs yet may wait for the end of this
            // thread's burst (see `burst`), unless a full batch waits.
            (wake, urgent, !urgent && len < batch)
        };
        let side = &*self.issue_side;
        side.pushed
            .store(side.pushed.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        if urgent {
            // Ends a gather or a nap at once (see `Hurry`): the pushed work is needed now. Raised
            // after the count above: a gather that looked before it sees this hurry.
            self.hurry.hurry();
        }
        if wake && !(may_wait && burst::hold_wake(&self.hurry)) {
            self.hurry.wake();
        }
    }

    /// The completion thread's last look before it sleeps, having raised `completion_parked`
    /// or `hurry.gathering`: how many finished actions wait, and how many of them are
    /// urgent, read under the lock that `push_finished` reads the flags under.
    pub(crate) fn finished_waiting(&self) -> (usize, usize) {
        let queue = self.finished.lock().unwrap_or_else(PoisonError::into_inner);
        (queue.len(), self.urgent.load(Ordering::Relaxed))
    }

    /// A recycled slot (one of the issue side's spares, else, taking every slot the completion
    /// side gave back since, a returned one, else one more put in rotation) filled with an
    /// action's parts (see [`Spare::fill`]). The rotation grows by as many slots as it holds
    /// already, taken from the reserve made at start, else made new: a queue whose in-flight
    /// count grows past its capacity allocates a logarithmic number of times, as a growing
    /// vector would.
    #[inline]
    pub(crate) fn boxed(
        &self,
        state: &mut State<B>,
        signals: &[(&Semaphore<B::Event>, u64)],
        fill: impl FnOnce(&mut Resources, &mut Cleanups) -> B::Payload,
    ) -> Boxed<B> {
        if state.spare.is_empty() {
            let mut returned = self.returned.lock().unwrap_or_else(PoisonError::into_inner);
            std::mem::swap(&mut state.spare, &mut *returned);
            if state.spare.is_empty() {
                // Doubling, but never past the reserve while it lasts: a capacity that is not a
                // power of two would otherwise make new slots (and grow both lists) for a
                // backlog within it.
                let doubling = state.boxes.max(MIN_NEW_BOXES);
                let reserved = state.reserve.len();
                let more = if reserved > 0 {
                    doubling.min(reserved)
                } else {
                    doubling
                };
                state.boxes += more;
                // Every slot in rotation may be in either list at once: room for all of them
                // (within the capacity made at start, this allocates nothing).
                state.spare.reserve(state.boxes);
                returned.reserve(state.boxes);
                if reserved > 0 {
                    state.spare.extend(state.reserve.drain(reserved - more..));
                } else {
                    state.spare.extend((0..more).map(|_| Spare::new()));
                }
            }
        }
        // Refilled above when it was empty.
        let spare = state.spare.pop().unwrap_or_else(Spare::new);
        if let Some(next) = state.spare.last() {
            next.prefetch();
        }
        spare.fill(signals, fill)
    }

    /// Gives the body slots a batch emptied back to the issue side (`spares` is left empty, its
    /// capacity kept).
    pub(crate) fn give_back(&self, spares: &mut Vec<Spare<B>>) {
        if !spares.is_empty() {
            self.returned
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .append(spares);
        }
    }

    /// Moves every finished action into `batch` (empty, its capacity kept), oldest first.
    /// Returns whether the round is urgent (see `urgent`, [`Hurry`]): one of them must not
    /// wait out a gather, or a host thread parked on this queue's work since the last take. Such
    /// a round retires what it has at once, polls fast, and does not gather after it.
    pub(crate) fn take_finished(&self, batch: &mut VecDeque<Finished<B>>) -> bool {
        let mut queue = self.finished.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::swap(&mut *queue, batch);
        self.finished_len.store(0, Ordering::Release);
        let urgent = self.urgent.load(Ordering::Relaxed) > 0;
        if urgent {
            self.urgent.store(0, Ordering::Relaxed);
        }
        // Taken under the list's lock: a hurry consumed here came from a waiter registered
        // before it, so an action pushed after this take (not in `batch`) sees that waiter
        // (`push_finished` looks under this lock) and is urgent itself.
        let hurried = self.hurry.take();
        drop(queue);
        urgent || hurried
    }

    /// Marks the queue lost (the first failure wins) and wakes the worker to fail what is pending.
    pub(crate) fn mark_lost(&self, failure: &Failure) {
        if self.lost.set(failure.clone()) {
            self.notifier.wake();
        }
    }
}
