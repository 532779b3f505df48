//! The completion thread: retires actions in issue order.
//!
//! For each action it waits for the completion event (the backend polls for the queue's
//! completion spin, then blocks), signals the semaphores on the host, runs the cleanup callbacks,
//! releases the resources and gives the payload back to the backend. The semaphores' listeners
//! wake the worker for exactly the actions that waited on them. Nothing here runs inside a driver
//! callback.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crossbeam_utils::sync::Parker;
use cuhal_semaphore::Failure;

use crate::action::{Body, Finished, upstream_failure};
use crate::backend::Backend;
use crate::shared::Shared;
use crate::spin::spin_until;

pub(crate) fn run<B: Backend>(shared: Arc<Shared<B>>, parker: Parker) {
    loop {
        if let Some(finished) = shared.pop_finished() {
            retire(&shared, finished);
            continue;
        }
        // The worker pushes its last action before it says it is done, so once it is done an
        // empty queue stays empty.
        if shared.worker_done.load(Ordering::Acquire)
            && shared.finished_len.load(Ordering::Acquire) == 0
        {
            break;
        }
        let idle = shared.options.idle_spin;
        if !spin_until(idle, || {
            shared.finished_len.load(Ordering::Acquire) > 0
                || shared.worker_done.load(Ordering::Acquire)
        }) {
            parker.park();
        }
    }
}

fn retire<B: Backend>(shared: &Shared<B>, finished: Finished<B>) {
    let (body, outcome) = match finished {
        Finished::Issued {
            body,
            event,
            device_waits,
        } => {
            let waited = catch_unwind(AssertUnwindSafe(|| {
                shared
                    .backend
                    .wait_event(&event, shared.options.completion_spin)
            }))
            .unwrap_or_else(|_| {
                Err(Failure::msg(
                    "the backend panicked while waiting for a completion event",
                ))
            });
            drop(event);
            match waited {
                Ok(()) => {
                    for (semaphore, value) in &body.signals {
                        // Err only if someone else failed the semaphore first; that failure stands.
                        let _ = semaphore.advance_to(*value);
                    }
                    (body, Ok(()))
                }
                Err(error) => {
                    // An event the action waited on failed: the failure came from upstream and
                    // this queue is fine. Otherwise this queue's device failed.
                    let failure = upstream_failure(&device_waits).unwrap_or_else(|| {
                        shared.mark_lost(&error);
                        error
                    });
                    body.fail_signals(&failure);
                    (body, Err(failure))
                }
            }
        }
        Finished::Failed { body, failure } => (body, Err(failure)),
    };
    release(shared, body, outcome.as_ref().map(|_| ()));
    // Counted after release, so a count that includes an action means it is fully retired.
    match &outcome {
        Ok(()) => shared.completed.fetch_add(1, Ordering::Release),
        Err(_) => shared.failed.fetch_add(1, Ordering::Release),
    };
}

fn release<B: Backend>(shared: &Shared<B>, body: Body<B>, outcome: Result<(), &Failure>) {
    let Body {
        waits,
        signals,
        payload,
        resources,
        cleanups,
    } = body;
    for cleanup in cleanups {
        // A panicking callback must not stop the queue (every later action would hang).
        let _ = catch_unwind(AssertUnwindSafe(|| cleanup.run(outcome)));
    }
    // Resources are user types whose Drop may panic; that must not stop the queue either.
    let _ = catch_unwind(AssertUnwindSafe(move || drop((resources, waits, signals))));
    let _ = catch_unwind(AssertUnwindSafe(|| shared.backend.release(payload)));
}
