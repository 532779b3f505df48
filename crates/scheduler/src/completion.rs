//! The completion thread: retires finished actions in batches, in issue order.
//!
//! It takes every action handed over since its last look at once (one lock), and waits only for
//! the newest completion event among them: a queue's events complete in issue order, so that one
//! completing proves the others have. It tells the backend of each action so known complete
//! ([`Backend::completed`]), then advances each signal semaphore once (to the highest
//! value the batch signals on it), runs the cleanup callbacks, releases the resources and gives
//! the payloads back to the backend, in issue order. A backend whose errors are not sticky
//! ([`Backend::STICKY_ERRORS`]) has each earlier event's outcome read too (without waiting: they
//! are complete); when the newest event reports an error, the batch falls back to one wait per
//! action, so that exactly the failed action (and what depends on it) fails.
//!
//! When it looks and how it waits (spin, nap, block; gather, defer; who may hurry it) is the
//! completion policy's ([`policy`](crate::policy)); this module does the retiring.
//! Nothing here runs inside a driver callback.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use cuhal_semaphore::{Failure, Semaphore};

use crate::action::{Body, Finished, Spare, upstream_failure};
use crate::backend::Backend;
use crate::policy::{self, Need};
use crate::shared::Shared;
use crate::sync::{Ordering, Parker};

pub(crate) fn run<B: Backend>(shared: Arc<Shared<B>>, parker: Parker, nap: Parker) {
    shared.completion_thread_started();
    let mut batch: VecDeque<Finished<B>> = VecDeque::with_capacity(shared.options.capacity);
    let mut scratch = Scratch {
        advanced: Vec::with_capacity(16),
        outcomes: Vec::with_capacity(shared.options.capacity),
        released: Vec::with_capacity(shared.options.capacity),
        spares: Vec::with_capacity(shared.options.capacity),
    };
    // A batch whose newest work was still running when it was taken, and that nobody needed:
    // retired first in the next round (see `may_defer`).
    let mut deferred: VecDeque<Finished<B>> = VecDeque::with_capacity(shared.options.capacity);
    loop {
        // An urgent round (a parked host waiter, work only this thread can see done) neither
        // defers nor gathers: the waiter may need any of the actions, not only the newest.
        let urgent = shared.take_finished(&mut batch);
        if !batch.is_empty() || !deferred.is_empty() {
            let mut wanted = false;
            if !deferred.is_empty() {
                wanted |= retire_batch(&shared, &nap, &mut deferred, &mut scratch, urgent);
            }
            if !batch.is_empty() {
                if !urgent && policy::may_defer(&shared, &batch) {
                    std::mem::swap(&mut deferred, &mut batch);
                } else {
                    wanted |= retire_batch(&shared, &nap, &mut batch, &mut scratch, urgent);
                }
            }
            if !wanted {
                policy::gather(&shared, &parker);
            }
            continue;
        }
        // The worker pushes its last action before it says it is done, so once it is done an
        // empty queue stays empty (and nothing is deferred: both lists were empty above).
        if shared.worker_done.load(Ordering::Acquire)
            && shared.finished_len.load(Ordering::Acquire) == 0
        {
            break;
        }
        let ready = || {
            shared.finished_len.load(Ordering::Acquire) > 0
                || shared.worker_done.load(Ordering::Acquire)
        };
        if !policy::idle_spin(ready) {
            let side = &shared.completion_side;
            shared.completion_parked.store(true, Ordering::Relaxed);
            // Under the list's lock, as `push_finished` reads `parked`: either the pusher sees
            // `parked` and unparks, or this sees its item. The worker unparks once it is done.
            if shared.finished_waiting().0 == 0 && !shared.worker_done.load(Ordering::Acquire) {
                side.parks.fetch_add(1, Ordering::Relaxed);
                parker.park();
            }
            shared.completion_parked.store(false, Ordering::Relaxed);
            // Every push that saw `parked` raised before it was lowered unparked this thread:
            // the first woke it, the others left a token that would end its next gather at
            // once. What they pushed is in the list, which this thread reads next; drop the
            // token.
            parker.park_timeout(Duration::ZERO);
        }
    }
}

/// Lists a batch's retirement needs, kept (with their capacity) from batch to batch so that
/// steady state allocates nothing.
struct Scratch<B: Backend> {
    /// Each signal semaphore of the batch's successful actions, with the highest value to reach.
    advanced: Vec<(Semaphore<B::Event>, u64)>,
    /// Each action's failure, if it failed.
    outcomes: Vec<Option<Failure>>,
    /// The device-signal events an advance released, dropped once the semaphore's lock is let go.
    released: Vec<B::Event>,
    /// The body slots the batch emptied, given back to the issue side at once.
    spares: Vec<Spare<B>>,
}

/// Retires every action of `batch` (which it leaves empty); returns whether somebody needed its
/// newest action's completion (see [`wanted`]), as they do in an `urgent` round.
fn retire_batch<B: Backend>(
    shared: &Shared<B>,
    nap: &Parker,
    batch: &mut VecDeque<Finished<B>>,
    scratch: &mut Scratch<B>,
    urgent: bool,
) -> bool {
    let side = &shared.completion_side;
    side.batches.fetch_add(1, Ordering::Relaxed);
    let in_flight = shared
        .issue_side
        .pushed
        .load(Ordering::Relaxed)
        .saturating_sub(side.retired.load(Ordering::Relaxed));
    side.high_water.fetch_max(in_flight, Ordering::Relaxed);

    let newest = batch
        .iter()
        .rposition(|f| matches!(f, Finished::Issued { .. }));
    let mut newest_wanted = false;
    let newest_outcome = newest.map(|index| {
        let Finished::Issued {
            body,
            event,
            checked,
            ..
        } = &batch[index]
        else {
            unreachable!("found as issued")
        };
        let need = if urgent || policy::wanted(shared, body, *checked) {
            newest_wanted = true;
            Need::Now
        } else {
            Need::Lazily
        };
        policy::wait(shared, nap, event, need)
    });
    let ordered = matches!(newest_outcome, Some(Ok(()))) && B::STICKY_ERRORS;

    // Advance each signal semaphore once, to the highest value the batch's successful actions
    // signal on it, before any cleanup runs: that is when a waiter may see the work done.
    let Scratch {
        advanced,
        outcomes,
        released,
        spares,
    } = scratch;
    for (index, finished) in batch.iter().enumerate() {
        let outcome = match finished {
            Finished::Failed { failure, .. } => Some(failure.clone()),
            Finished::Issued {
                body,
                event,
                device_waits,
                checked,
            } => {
                let result = if ordered {
                    Ok(())
                } else if Some(index) == newest {
                    newest_outcome.clone().unwrap_or(Ok(()))
                } else if matches!(newest_outcome, Some(Ok(()))) {
                    // Complete (the newest is): read how it ended, without waiting.
                    policy::wait(shared, nap, event, Need::Lazily)
                } else {
                    policy::wait(shared, nap, event, Need::Now)
                };
                if result.is_ok() {
                    // The backend's own bookkeeping of completed work, before any cleanup runs.
                    let _ = catch_unwind(AssertUnwindSafe(|| {
                        shared.backend.completed(body.payload());
                    }));
                }
                let result = match result {
                    Ok(()) if *checked => {
                        check_completed(shared, body).map_err(|failure| (failure, false))
                    }
                    Ok(()) => Ok(()),
                    Err(error) => Err((error, true)),
                };
                match result {
                    Ok(()) => {
                        for (semaphore, value) in &body.signals {
                            match advanced.iter_mut().find(|(s, _)| s.ptr_eq(semaphore)) {
                                Some((_, highest)) => *highest = (*highest).max(*value),
                                None => advanced.push((semaphore.clone(), *value)),
                            }
                        }
                        None
                    }
                    Err((failure, false)) => {
                        // The work failed on its own (the device is fine).
                        body.fail_signals(&failure);
                        Some(failure)
                    }
                    Err((error, true)) => {
                        // An event the action waited on failed: the failure came from upstream and
                        // this queue is fine. Otherwise this queue's device failed.
                        let failure = upstream_failure(device_waits).unwrap_or_else(|| {
                            shared.mark_lost(&error);
                            error
                        });
                        body.fail_signals(&failure);
                        Some(failure)
                    }
                }
            }
        };
        outcomes.push(outcome);
    }
    for (semaphore, value) in advanced.drain(..) {
        // Err only if someone else failed the semaphore first; that failure stands. A batch
        // releases as many timepoints as it retired actions; their events go back to their
        // pools here, after the semaphore's lock is let go, not while a submitter may be waiting
        // for that lock.
        let _ = semaphore.advance_to_releasing(value, released);
        released.clear();
    }

    let mut completed = 0;
    let mut failed = 0;
    for (finished, outcome) in batch.drain(..).zip(outcomes.drain(..)) {
        let body = match finished {
            Finished::Issued { body, event, .. } => {
                drop(event);
                body
            }
            Finished::Failed { body, .. } => body,
        };
        match &outcome {
            None => completed += 1,
            Some(_) => failed += 1,
        }
        spares.push(
            body.release(outcome.as_ref().map_or(Ok(()), Err), |payload| {
                shared.backend.release(payload)
            }),
        );
    }
    shared.give_back(spares);
    // Counted after release, so a count that includes an action means it is fully retired.
    side.completed.fetch_add(completed, Ordering::Release);
    side.failed.fetch_add(failed, Ordering::Release);
    side.retired
        .fetch_add(completed + failed, Ordering::Release);
    shared.notify_room();
    newest_wanted
}

fn check_completed<B: Backend>(shared: &Shared<B>, body: &Body<B>) -> Result<(), Failure> {
    catch_unwind(AssertUnwindSafe(|| {
        shared.backend.check_completed(body.payload())
    }))
    .unwrap_or_else(|_| {
        Err(Failure::msg(
            "the backend panicked while checking completed work",
        ))
    })
}
