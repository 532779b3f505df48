//! [`Queue`]: one device queue's scheduler: submit, and the two threads that serve it.

use std::fmt;
use std::sync::Arc;

use cuhal_semaphore::{Failure, Semaphore};

use crate::action::{Cleanups, SlotCleanups, SlotResources};
use crate::backend::{Backend, ThreadRole};
use crate::error::Error;
use crate::hurry::Hurry;
use crate::listen::QueueListener;
use crate::options::QueueOptions;
use crate::resource::Resources;
use crate::shared::Shared;
use crate::sync::thread::{self, JoinHandle};
use crate::sync::{Ordering, Parker, mpsc};
use crate::{completion, worker};

/// A snapshot of a queue's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Actions accepted by [`Queue::submit`].
    pub submitted: u64,
    /// Actions waiting for a semaphore, or behind one that is (not yet issued).
    pub pending: usize,
    /// Actions issued by the submitting thread (the fast path).
    pub issued_on_submit: u64,
    /// Actions issued by the worker thread (they became ready after submission, and the thread
    /// that made them ready found the queue's issue lock taken).
    pub issued_by_worker: u64,
    /// Actions issued by the thread whose semaphore change made them ready (a host signal,
    /// another queue's issue, a waiter or completion thread advancing a value): no hand-off.
    pub issued_on_signal: u64,
    /// Actions retired successfully (signalled, cleaned up, released).
    pub completed: u64,
    /// Actions retired with a failure (failed signals, cleaned up, released).
    pub failed: u64,
    /// Batches the completion thread retired (each waited for one completion event at most).
    pub retire_batches: u64,
    /// The most actions handed to the completion side and not yet retired, as seen when it took
    /// a batch: what [`max_in_flight`](QueueOptions::with_max_in_flight) bounds.
    pub in_flight_high_water: u64,
    /// Times the completion thread parked with nothing to retire.
    pub completion_parks: u64,
    /// Whether the completion thread is parked now (it burns no CPU).
    pub completion_parked: bool,
    /// Times the worker thread parked with nothing to do.
    pub worker_parks: u64,
    /// Whether the worker thread is parked now.
    pub worker_parked: bool,
}

impl QueueStats {
    /// Actions retired either way.
    pub fn retired(&self) -> u64 {
        self.completed + self.failed
    }
}

/// Loses a queue from outside it: a device whose context a sticky error poisoned loses all of
/// its queues at once, so actions pending on a healthy-looking queue fail too instead of waiting
/// for semaphores that nothing will signal. Holds the queue weakly; does nothing once it is gone.
pub struct LossTrigger<B: Backend>(std::sync::Weak<Shared<B>>);

impl<B: Backend> LossTrigger<B> {
    /// Marks the queue lost with `failure` (the first loss wins) and fails everything pending on
    /// it; later submits return [`Error::Lost`]. Never blocks and takes no queue lock, so it may be
    /// called from inside a backend's `issue` or `wait_event`.
    pub fn trigger(&self, failure: &Failure) {
        if let Some(shared) = self.0.upgrade() {
            shared.mark_lost(failure);
        }
    }
}

/// Hurries a queue's completion side from outside it. A backend whose events know their queue
/// calls [`nudge`](CompletionNudge::nudge) from
/// [`DeviceEvent::awaited`](cuhal_semaphore::DeviceEvent::awaited), when a host thread is about
/// to park on a value the queue's issued work reaches; a queue that gathers completions
/// ([`CompletionOptions::gather`](crate::CompletionOptions::gather)) then ends its gather, a
/// completion thread napping on that work polls instead, and the work is retired as soon as it
/// completes (see [`policy`](crate::policy)). Holds the queue weakly; does nothing once it is gone.
#[derive(Clone)]
pub struct CompletionNudge(std::sync::Weak<Hurry>);

impl CompletionNudge {
    /// Ends the completion thread's gather or nap, now or before its next one begins. Takes no lock,
    /// never blocks and makes at most one wake-up, so it may be called from a host wait, under a
    /// semaphore's lock; it holds nothing of the queue but the flags it sets.
    pub fn nudge(&self) {
        if let Some(hurry) = self.0.upgrade() {
            hurry.hurry();
        }
    }
}

impl fmt::Debug for CompletionNudge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CompletionNudge")
    }
}

impl<B: Backend> Clone for LossTrigger<B> {
    fn clone(&self) -> Self {
        LossTrigger(self.0.clone())
    }
}

impl<B: Backend> fmt::Debug for LossTrigger<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LossTrigger")
    }
}

/// The scheduler of one device queue.
///
/// Actions are submitted with [`submit`](Queue::submit) and issued to the [`Backend`] in submission
/// order once every wait is reached or can be waited for on the device. Each queue runs two
/// threads: a worker, which issues actions that become ready after submission, and a completion
/// thread, which retires issued actions in order.
///
/// Dropping the queue shuts it down: the worker issues every pending action that is ready by then
/// and fails the rest with [`Error::ShutDown`] (an action waiting for a semaphore nobody will
/// signal must not keep the drop waiting forever); the completion thread then retires everything
/// issued (waiting for its completion events) and both threads are joined. The wait is bounded by
/// the backend's completion of work already issued.
pub struct Queue<B: Backend> {
    shared: Arc<Shared<B>>,
    worker: Option<JoinHandle<()>>,
    completion: Option<JoinHandle<()>>,
}

impl<B: Backend> Queue<B> {
    /// Starts a queue on `backend`: spawns its worker and completion threads and binds them to
    /// the device ([`Backend::bind_thread`]); fails if either cannot start or bind.
    pub fn new(backend: B, options: QueueOptions) -> Result<Self, Error> {
        let worker_parker = Parker::new();
        let completion_parker = Parker::new();
        let nap_parker = Parker::new();
        let shared = Shared::new(
            backend,
            options,
            worker_parker.unparker().clone(),
            completion_parker.unparker().clone(),
            nap_parker.unparker().clone(),
            QueueListener::shared,
        );
        let mut queue = Queue {
            shared: shared.clone(),
            worker: None,
            completion: None,
        };
        let (bound_tx, bound_rx) = mpsc::channel::<Result<(), (ThreadRole, Failure)>>();
        queue.completion = Some(spawn(
            &shared,
            ThreadRole::Completion,
            bound_tx.clone(),
            move |shared| completion::run(shared, completion_parker, nap_parker),
        )?);
        match spawn(&shared, ThreadRole::Worker, bound_tx, move |shared| {
            worker::run(shared, worker_parker)
        }) {
            Ok(handle) => queue.worker = Some(handle),
            Err(error) => {
                // No worker will ever say it is done: say it for it, so the drop of `queue`
                // lets the completion thread finish.
                shared.worker_done.store(true, Ordering::Release);
                return Err(error);
            }
        }
        for _ in 0..2 {
            match bound_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err((role, failure))) => {
                    // Dropping `queue` shuts down and joins the threads.
                    return Err(Error::Bind {
                        queue: shared.label.clone(),
                        role,
                        failure,
                    });
                }
                // A thread ended without reporting: it panicked while binding.
                Err(_) => {
                    return Err(Error::Bind {
                        queue: shared.label.clone(),
                        role: ThreadRole::Worker,
                        failure: Failure::msg(
                            "a queue thread panicked while binding to the device",
                        ),
                    });
                }
            }
        }
        Ok(queue)
    }

    /// Submits an action: once every `(semaphore, value)` of `waits` is reached or device-waitable,
    /// and every action submitted earlier to this queue is issued, `payload` is issued after device
    /// waits on the waitable ones; when it completes, every signal semaphore is advanced to its value,
    /// the `cleanup` callbacks run, and `resources` and the payload are released.
    ///
    /// If a wait semaphore fails, the action fails: its signal semaphores fail with the same
    /// [`Failure`], its cleanups run with it, and everything is released. Such failures are not
    /// errors of `submit`, which only fails (with [`Error::Lost`], dropping the action) when the queue
    /// is lost.
    ///
    /// An action that is ready at once, with nothing pending ahead of it, is issued on the calling
    /// thread before `submit` returns. When the queue already has
    /// [`max_in_flight`](QueueOptions::with_max_in_flight) actions that the completion side has not
    /// retired, `submit` first waits for it to catch up (never on a completion thread). Steady state allocates nothing (with at most
    /// [`INLINE_SEMAPHORES`](crate::INLINE_SEMAPHORES) waits and signals and a backend payload that
    /// does not allocate).
    #[inline]
    pub fn submit(
        &self,
        waits: &[(&Semaphore<B::Event>, u64)],
        signals: &[(&Semaphore<B::Event>, u64)],
        payload: B::Payload,
        resources: Resources,
        cleanup: Cleanups,
    ) -> Result<(), Error> {
        self.submit_with(waits, signals, move |slot_resources, slot_cleanups| {
            // Entry by entry, into the storage the slot kept: the lists given here may drop with
            // their heap, the slot's stays.
            slot_resources.extend(resources);
            slot_cleanups.extend(cleanup);
            payload
        })
    }

    /// [`submit`](Self::submit), with the action's parts written straight into the slot that
    /// carries it to the completion side: `fill` gets the slot's resources and cleanups (empty)
    /// to add to, and returns the payload. A submission's payload, resources and cleanups (a few
    /// hundred bytes) are then written once, where `submit`'s are moved on the way.
    ///
    /// `fill` runs under the queue's issue lock, so it should only move what the caller has
    /// ready. On a lost queue it is not called, and it is dropped (with what it owns) after the
    /// lock is let go. A panic in it reaches the caller with nothing queued (the slot it was
    /// filling is dropped), and the queue stays usable.
    #[inline]
    pub fn submit_with(
        &self,
        waits: &[(&Semaphore<B::Event>, u64)],
        signals: &[(&Semaphore<B::Event>, u64)],
        fill: impl FnOnce(&mut SlotResources, &mut SlotCleanups) -> B::Payload,
    ) -> Result<(), Error> {
        self.shared.submit(waits, signals, fill)
    }

    /// A handle that can lose this queue from anywhere (see [`LossTrigger`]).
    pub fn loss_trigger(&self) -> LossTrigger<B> {
        LossTrigger(Arc::downgrade(&self.shared))
    }

    /// A handle that hurries this queue's completion side from anywhere (see
    /// [`CompletionNudge`]).
    pub fn completion_nudge(&self) -> CompletionNudge {
        CompletionNudge(Arc::downgrade(&self.shared.hurry))
    }

    /// The failure that lost the queue, if it is lost.
    pub fn lost(&self) -> Option<Failure> {
        self.shared.lost.get()
    }

    /// The queue's label.
    pub fn label(&self) -> &str {
        &self.shared.label
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.shared.backend
    }

    /// The queue's counters.
    pub fn stats(&self) -> QueueStats {
        let issue = &self.shared.issue_side.counters;
        let read = |counter: &crate::sync::StatU64| counter.load(Ordering::Relaxed);
        let side = &self.shared.completion_side;
        QueueStats {
            submitted: read(&issue.submitted),
            pending: read(&issue.pending) as usize,
            issued_on_submit: read(&issue.issued_on_submit),
            issued_by_worker: read(&issue.issued_by_worker),
            issued_on_signal: read(&issue.issued_on_signal),
            completed: side.completed.load(Ordering::Acquire),
            failed: side.failed.load(Ordering::Acquire),
            retire_batches: side.batches.load(Ordering::Relaxed),
            in_flight_high_water: side.high_water.load(Ordering::Relaxed),
            completion_parks: side.parks.load(Ordering::Relaxed),
            completion_parked: self.shared.completion_parked.load(Ordering::SeqCst),
            worker_parks: self.shared.worker_parks.load(Ordering::Relaxed),
            worker_parked: self.shared.worker_parked.load(Ordering::SeqCst),
        }
    }
}

fn spawn<B: Backend>(
    shared: &Arc<Shared<B>>,
    role: ThreadRole,
    bound: mpsc::Sender<Result<(), (ThreadRole, Failure)>>,
    body: impl FnOnce(Arc<Shared<B>>) + Send + 'static,
) -> Result<JoinHandle<()>, Error> {
    let name = match role {
        ThreadRole::Worker => format!("{}-issue", shared.label),
        // A backend's own threads (`ThreadRole::Device`) are not spawned here.
        ThreadRole::Completion | ThreadRole::Device => format!("{}-complete", shared.label),
    };
    let thread_shared = shared.clone();
    thread::Builder::new()
        .name(name)
        .spawn(move || {
            if let Err(failure) = thread_shared.backend.bind_thread(role) {
                // Leave at once; the creator sees the error and drops the queue.
                thread_shared.mark_lost(&failure);
                let _ = bound.send(Err((role, failure)));
                if role == ThreadRole::Worker {
                    thread_shared.worker_done.store(true, Ordering::Release);
                    thread_shared.hurry.wake();
                    return;
                }
            } else {
                let _ = bound.send(Ok(()));
            }
            drop(bound);
            body(thread_shared);
        })
        .map_err(|error| Error::Spawn {
            queue: shared.label.clone(),
            role,
            error: Arc::new(error),
        })
}

impl<B: Backend> Drop for Queue<B> {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.notifier.wake();
        let this = thread::current().id();
        // Dropped from one of its own threads (a cleanup owning the queue): they finish on their own.
        let worker_gone = match self.worker.take() {
            Some(worker) if worker.thread().id() == this => false,
            Some(worker) => {
                let _ = worker.join();
                true
            }
            None => true,
        };
        if worker_gone {
            // It can push nothing more. Said here too because a worker that panicked (while
            // binding, say) never said it, and the completion thread waits for it.
            self.shared.worker_done.store(true, Ordering::Release);
        }
        self.shared.hurry.wake();
        // The completion thread ends once the worker is done: dropped on the worker thread, the
        // worker is not done until this returns, so joining here would wait for ever.
        if let Some(completion) = self.completion.take()
            && completion.thread().id() != this
            && worker_gone
        {
            let _ = completion.join();
        }
    }
}

impl<B: Backend> fmt::Debug for Queue<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue")
            .field("label", &self.shared.label)
            .field("lost", &self.shared.lost.get())
            .field("stats", &self.stats())
            .finish()
    }
}
