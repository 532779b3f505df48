//! The completion thread: retires finished actions in batches, in issue order.
//!
//! It takes every action handed over since its last look at once (one lock), and waits only for
//! the newest completion event among them: a queue's events complete in issue order, so that one
//! completing proves the others have. Then it advances each signal semaphore once (to the highest
//! value the batch signals on it), runs the cleanup callbacks, releases the resources and gives
//! the payloads back to the backend, in issue order. A backend whose errors are not sticky
//! ([`Backend::STICKY_ERRORS`]) has each earlier event's outcome read too (without waiting: they
//! are complete); when the newest event reports an error, the batch falls back to one wait per
//! action, so that exactly the failed action (and what depends on it) fails.
//!
//! It polls fast (the queue's `completion_spin`) only while somebody needs the answer: a host
//! thread parked on a semaphore the batch signals, a submitter waiting for room. Otherwise it asks
//! the backend to block at once: host waiters poll recorded events themselves, so values seen on
//! the host lag only while nobody waits for them. A queue that gathers (`completion_gather`) goes
//! further: a batch nobody needs whose newest work is still running is not waited for but kept
//! for the next round, which retires it first ([`may_defer`]). A host thread that parks on such
//! work ends the gather ([`CompletionNudge`](crate::CompletionNudge)): this thread's advance is
//! what wakes it (its own looks at its event come 50 us to 1 ms apart). With nothing to retire
//! it looks for work for the queue's `idle_spin`, then parks, so an idle queue burns no core.
//! Nothing here runs inside a driver callback.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use cuhal_semaphore::{DeviceEvent, Failure, Semaphore};

use crate::action::{Body, Finished, Spare, upstream_failure};
use crate::backend::Backend;
use crate::shared::Shared;
use crate::spin::spin_until;
use crate::sync::{Ordering, Parker};

pub(crate) fn run<B: Backend>(shared: Arc<Shared<B>>, parker: Parker) {
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
                wanted |= retire_batch(&shared, &mut deferred, &mut scratch, urgent);
            }
            if !batch.is_empty() {
                if !urgent && may_defer(&shared, &batch) {
                    std::mem::swap(&mut deferred, &mut batch);
                } else {
                    wanted |= retire_batch(&shared, &mut batch, &mut scratch, urgent);
                }
            }
            if !wanted {
                gather(&shared, &parker);
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
        if !spin_until(shared.options.idle_spin, ready) {
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

/// After a batch nobody waited for: sleeps for the queue's `completion_gather` (or until woken by
/// a submitter that needs room, by work only this thread can complete or that a host thread
/// parked on, by a host thread about to park on this queue's work (`Hurry`),
/// or by the push that makes the queue's `gather_batch` actions wait), so that the next batch
/// holds the actions of many submissions instead of one or two. Skipped when enough actions
/// already wait, or once the worker is done (shutdown drains at once).
fn gather<B: Backend>(shared: &Shared<B>, parker: &Parker) {
    let gather = shared.options.completion_gather;
    if gather.is_zero()
        || shared.finished_len.load(Ordering::Acquire) >= shared.options.gather_batch
        || shared.room_waiters.load(Ordering::Relaxed) > 0
        || shared.worker_done.load(Ordering::Acquire)
    {
        return;
    }
    // Under loom, which has no time, a gather that timed out at once is one of the runs the real
    // thread can have (a loom timed park would wait for an unpark that may never come).
    #[cfg(not(loom))]
    {
        shared.hurry.gathering.store(true, Ordering::SeqCst);
        // Under the list's lock, as `push_finished` reads `gathering`: either the pusher of work
        // that needs this thread sees `gathering` and wakes it, or this sees that work. And
        // after `gathering` is raised, as a hurry raises `hurried` before it reads `gathering`
        // (see `Hurry`): either it unparks this thread, or this sees it hurried.
        let (waiting, urgent) = shared.finished_waiting();
        if urgent == 0
            && waiting < shared.options.gather_batch
            && !shared.hurry.hurried.load(Ordering::SeqCst)
        {
            parker.park_timeout(gather);
        }
        shared.hurry.gathering.store(false, Ordering::Relaxed);
    }
    #[cfg(loom)]
    let _ = parker;
}

/// Whether `batch` may wait for the next round instead of being retired now: the queue gathers
/// (see [`gather`]) and is not shutting down, nobody needs the batch's newest action (see
/// [`wanted`]), and its completion event has not completed yet (one query, no wait). Such a
/// batch was mostly taken the moment its last action was handed over, so its newest work has
/// barely started: waiting for it would cost a nap and a wake-up per batch, while one gather
/// later it is done and the next round retires it (first, in issue order) without a wait.
fn may_defer<B: Backend>(shared: &Shared<B>, batch: &VecDeque<Finished<B>>) -> bool {
    if shared.options.completion_gather.is_zero() || shared.worker_done.load(Ordering::Acquire) {
        return false;
    }
    let newest = batch.iter().rev().find_map(|f| match f {
        Finished::Issued {
            body,
            event,
            checked,
            ..
        } => Some((body, event, *checked)),
        Finished::Failed { .. } => None,
    });
    match newest {
        Some((body, event, checked)) => {
            !wanted(shared, body, checked)
                && matches!(
                    catch_unwind(AssertUnwindSafe(|| event.query())),
                    Ok(Ok(false))
                )
        }
        None => false,
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
        let spin = if urgent || wanted(shared, body, *checked) {
            newest_wanted = true;
            shared.options.completion_spin
        } else {
            Duration::ZERO
        };
        wait(shared, event, spin)
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
                    wait(shared, event, Duration::ZERO)
                } else {
                    let spin = shared.options.completion_spin;
                    wait(shared, event, spin)
                };
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

/// Whether someone needs this action's completion seen soon: a host thread parked on one of its
/// signal semaphores, a submitter waiting for room, or anybody at all when its work is `checked`
/// on completion (it recorded no device signal, so nobody else can poll it).
fn wanted<B: Backend>(shared: &Shared<B>, body: &Body<B>, checked: bool) -> bool {
    shared.room_waiters.load(Ordering::Relaxed) > 0
        || body.has_parked_waiters()
        || shared.options.eager_completion
        || checked
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

fn wait<B: Backend>(shared: &Shared<B>, event: &B::Event, spin: Duration) -> Result<(), Failure> {
    catch_unwind(AssertUnwindSafe(|| shared.backend.wait_event(event, spin))).unwrap_or_else(|_| {
        Err(Failure::msg(
            "the backend panicked while waiting for a completion event",
        ))
    })
}
