//! The state one queue's submitters, worker and completion thread share, and the scheduling
//! logic that runs under its issue lock.
//!
//! Lock order (a thread holding one may take those after it, never before):
//! `state` -> a semaphore's internal lock -> `Notifier::keys`; `state` -> `finished`;
//! `state` -> the backend's own locks. Listeners run outside semaphore locks and take only the
//! notifier's leaf lock, so calling semaphores under `state` cannot deadlock, and nothing
//! user-supplied is dropped or called under `state` (bodies are handed to the completion thread).

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use crossbeam_utils::sync::Unparker;
use cuhal_semaphore::{Failure, Listener};

use crate::action::{Body, EventList, Finished};
use crate::backend::Backend;
use crate::error::Error;
use crate::notifier::Notifier;
use crate::options::QueueOptions;
use crate::pending::{PendingList, Waiting};
use crate::readiness::{Readiness, examine};

/// Everything under the issue lock.
pub(crate) struct State<B: Backend> {
    pub(crate) pending: PendingList<B>,
    pub(crate) submitted: u64,
    pub(crate) issued_on_submit: u64,
    pub(crate) issued_by_worker: u64,
}

pub(crate) struct Shared<B: Backend> {
    pub(crate) backend: B,
    pub(crate) options: QueueOptions,
    pub(crate) label: Arc<str>,
    pub(crate) state: Mutex<State<B>>,
    /// Issued (or failed) actions in issue order, for the completion thread. Preallocated.
    pub(crate) finished: Mutex<VecDeque<Finished<B>>>,
    pub(crate) finished_len: AtomicUsize,
    pub(crate) notifier: Arc<Notifier>,
    /// The same object as `notifier`, as the semaphores take it.
    pub(crate) listener: Arc<dyn Listener>,
    pub(crate) completion: Unparker,
    /// The backend failure that lost the queue; set once.
    pub(crate) lost: OnceLock<Failure>,
    pub(crate) shutdown: AtomicBool,
    pub(crate) worker_done: AtomicBool,
    pub(crate) completed: AtomicU64,
    pub(crate) failed: AtomicU64,
}

/// Who is issuing, for the statistics.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Issuer {
    Submitter,
    Worker,
}

impl<B: Backend> Shared<B> {
    pub(crate) fn new(
        backend: B,
        options: QueueOptions,
        worker: Unparker,
        completion: Unparker,
    ) -> Self {
        let capacity = options.capacity;
        let notifier = Arc::new(Notifier::new(worker, capacity));
        let listener: Arc<dyn Listener> = notifier.clone();
        Shared {
            backend,
            label: Arc::from(options.label.as_str()),
            options,
            state: Mutex::new(State {
                pending: PendingList::with_capacity(capacity),
                submitted: 0,
                issued_on_submit: 0,
                issued_by_worker: 0,
            }),
            finished: Mutex::new(VecDeque::with_capacity(capacity)),
            finished_len: AtomicUsize::new(0),
            notifier,
            listener,
            completion,
            lost: OnceLock::new(),
            shutdown: AtomicBool::new(false),
            worker_done: AtomicBool::new(false),
            completed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    pub(crate) fn lock_state(&self) -> MutexGuard<'_, State<B>> {
        // Backend calls under the lock are caught, so a poisoned lock still guards consistent state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn lost_error(&self) -> Option<Error> {
        self.lost.get().map(|failure| Error::Lost {
            queue: self.label.clone(),
            failure: failure.clone(),
        })
    }

    /// Accepts a submitted action: issues it at once if it is ready and nothing is pending ahead
    /// of it (the fast path: no thread hand-off), else makes it pending.
    pub(crate) fn enqueue(&self, state: &mut State<B>, body: Body<B>) {
        state.submitted += 1;
        if state.pending.is_empty() {
            let mut device_waits = EventList::new();
            match examine(&body.waits, 0, Some(&mut device_waits)) {
                Readiness::Ready => self.issue(state, body, device_waits, Issuer::Submitter),
                Readiness::Failed(failure) => self.fail_unissued(body, failure),
                Readiness::Blocked(index) => self.make_pending(state, body, index),
            }
        } else {
            match examine(&body.waits, 0, None) {
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
    fn make_pending(&self, state: &mut State<B>, body: Body<B>, index: usize) {
        let (semaphore, value) = body.waits[index].clone();
        // A placeholder until the token exists; no notification can be handled before the state
        // lock is released.
        let (slot, key) = state.pending.push_back(body, Waiting::Ready);
        let token = semaphore.listen(value, &self.listener, key);
        state.pending.get_mut(slot).waiting = Waiting::Listening { index, token };
    }

    /// Looks again at the action `key` names, whose awaited semaphore changed.
    pub(crate) fn on_notify(&self, state: &mut State<B>, key: u64) {
        let Some(slot) = state.pending.find(key) else {
            return; // issued, failed, or removed since: a stale notification
        };
        let pending = state.pending.get_mut(slot);
        let Waiting::Listening { index, .. } = pending.waiting else {
            return;
        };
        match examine(&pending.body.waits, index, None) {
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
            let mut device_waits = EventList::new();
            match examine(&body.waits, 0, Some(&mut device_waits)) {
                Readiness::Ready => self.issue(state, body, device_waits, issuer),
                Readiness::Failed(failure) => self.fail_unissued(body, failure),
                Readiness::Blocked(index) => {
                    // Waits never move backwards, so this does not happen with a conforming
                    // semaphore; if it did, waiting again is the safe answer.
                    let (semaphore, value) = body.waits[index].clone();
                    let (slot, key) = state.pending.push_front(body, Waiting::Ready);
                    let token = semaphore.listen(value, &self.listener, key);
                    state.pending.get_mut(slot).waiting = Waiting::Listening { index, token };
                    return;
                }
            }
        }
    }

    /// Issues one ready action and records its completion event as the device-signal timepoint
    /// of each of its signal semaphores (under the issue lock, so timepoints are recorded in issue
    /// order), then hands it to the completion thread.
    fn issue(
        &self,
        state: &mut State<B>,
        mut body: Body<B>,
        device_waits: EventList<B::Event>,
        issuer: Issuer,
    ) {
        if let Some(failure) = self.lost.get() {
            self.fail_unissued(body, failure.clone());
            return;
        }
        let issued = catch_unwind(AssertUnwindSafe(|| {
            self.backend.issue(&device_waits, &mut body.payload)
        }))
        .unwrap_or_else(|_| Err(Failure::msg("the backend panicked while issuing an action")));
        match issued {
            Ok(event) => {
                for (semaphore, value) in &body.signals {
                    // Err only if the semaphore already failed: nothing to record then.
                    let _ = semaphore.record_device_signal(*value, event.clone());
                }
                match issuer {
                    Issuer::Submitter => state.issued_on_submit += 1,
                    Issuer::Worker => state.issued_by_worker += 1,
                }
                self.push_finished(Finished::Issued {
                    body,
                    event,
                    device_waits,
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
    pub(crate) fn fail_unissued(&self, body: Body<B>, failure: Failure) {
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

    fn push_finished(&self, finished: Finished<B>) {
        {
            let mut queue = self.finished.lock().unwrap_or_else(PoisonError::into_inner);
            queue.push_back(finished);
            self.finished_len.store(queue.len(), Ordering::Release);
        }
        self.completion.unpark();
    }

    pub(crate) fn pop_finished(&self) -> Option<Finished<B>> {
        let mut queue = self.finished.lock().unwrap_or_else(PoisonError::into_inner);
        let next = queue.pop_front();
        self.finished_len.store(queue.len(), Ordering::Release);
        next
    }

    /// Marks the queue lost (the first failure wins) and wakes the worker to fail what is pending.
    pub(crate) fn mark_lost(&self, failure: &Failure) {
        if self.lost.set(failure.clone()).is_ok() {
            self.notifier.wake();
        }
    }
}
