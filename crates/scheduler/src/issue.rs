//! What a queue does under its issue lock: accept a submission, look again at an action whose
//! semaphore changed, issue ready actions in submission order, fail what cannot run.
//!
//! A submission takes the lock here (`submit`); every other function runs with it held (see
//! `issue_lock`), and is handed the state under it and the burst of the loop issuing: device
//! signals are recorded, and signal semaphores failed, into the burst, so no listener runs under
//! the lock.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::PoisonError;

use cuhal_semaphore::{Burst, DeviceEvent, Failure, Semaphore, WaitPoint};

use crate::action::{Boxed, EventList, Finished, SlotCleanups, SlotResources};
use crate::backend::Backend;
use crate::error::Error;
use crate::guard;
use crate::issue_lock::Issuer;
use crate::pending::Waiting;
use crate::readiness::{Collect, Hint, Readiness, examine, examine_borrowed};
use crate::shared::{Shared, bump};
use crate::state::State;
use crate::sync::Ordering;

/// Refuses a submission to `queue` that would signal a semaphore to a value it has already
/// reached: timeline values only rise, so the signal could never take effect (as a host signal
/// backwards is refused). One unlocked load per signal; a value reached just after the check is
/// not caught. [`Queue::submit`](crate::Queue::submit) checks its signals with this, and so
/// must an operation that signals on its own (a device's host call, from its cleanup).
pub fn check_signals<E: DeviceEvent>(
    queue: &str,
    signals: &[(&Semaphore<E>, u64)],
) -> Result<(), Error> {
    for (semaphore, value) in signals {
        let current = semaphore.value_hint();
        if *value <= current {
            return Err(Error::SignalNotAbove {
                queue: queue.into(),
                value: *value,
                current,
            });
        }
    }
    Ok(())
}

impl<B: Backend> Shared<B> {
    /// Accepts a submission ([`Queue::submit_with`](crate::Queue::submit_with)): takes the issue
    /// lock, writes the action into a recycled slot, and issues it at once if it is ready and
    /// nothing is pending ahead of it (the fast path: no thread hand-off), else makes it pending.
    ///
    /// The slot is filled without the waits: an action issued at once never needs its wait
    /// semaphores again, so they are cloned into it only if it goes pending.
    #[inline]
    pub(crate) fn submit(
        &self,
        waits: &[(&Semaphore<B::Event>, u64)],
        signals: &[(&Semaphore<B::Event>, u64)],
        fill: impl FnOnce(&mut SlotResources, &mut SlotCleanups) -> B::Payload,
    ) -> Result<(), Error> {
        check_signals(&self.label, signals)?;
        // What the issue makes due (other queues' work its signals release) and the completion
        // wake it holds back: run when it drops, once the lock is let go.
        let mut burst = Burst::new();
        // On an error (a reentrant submission, a lost queue) `fill` drops on return, outside the
        // lock: a resource's Drop may do anything, even submit.
        let mut guard = self.lock_to_submit(&mut burst)?;
        let (state, burst) = guard.parts();
        let mut body = self.fill_slot(state, signals, fill);
        bump(&self.issue_side.counters.submitted);
        if state.pending.is_empty() {
            let mut device_waits = EventList::new();
            match examine_borrowed(
                waits.iter().map(|(s, v)| (*s, *v)),
                0,
                Some(Collect {
                    events: &mut device_waits,
                    ordered: &|event| guard::orders(&self.backend, event),
                }),
                None,
            ) {
                Readiness::Ready => {
                    self.issue_ready(state, burst, body, device_waits, Issuer::Submitter)
                }
                Readiness::Failed(failure) => self.fail_unissued(burst, body, failure),
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
                    self.pump(state, burst, Issuer::Submitter);
                }
                Readiness::Failed(failure) => self.fail_unissued(burst, body, failure),
                Readiness::Blocked(index) => self.make_pending(state, body, index),
            }
        }
        Ok(())
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
        burst: &mut Burst<B::Event>,
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
            if let Some((body, index)) = self.issue_if_ready(state, burst, body, known, issuer) {
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
                self.fail_unissued(burst, pending.body, failure);
            }
        }
    }

    /// Issues ready actions from the head of the pending list, in submission order.
    pub(crate) fn pump(&self, state: &mut State<B>, burst: &mut Burst<B::Event>, issuer: Issuer) {
        while let Some(slot) = state.pending.ready_head() {
            let body = state.pending.remove(slot).body;
            if let Some((body, index)) = self.issue_if_ready(state, burst, body, None, issuer) {
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
        burst: &mut Burst<B::Event>,
        body: Boxed<B>,
        known: Option<(usize, WaitPoint<B::Event>)>,
        issuer: Issuer,
    ) -> Option<(Boxed<B>, usize)> {
        let mut device_waits = EventList::new();
        let ordered = |event: &B::Event| guard::orders(&self.backend, event);
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
            Readiness::Ready => self.issue_ready(state, burst, body, device_waits, issuer),
            Readiness::Failed(failure) => self.fail_unissued(burst, body, failure),
            Readiness::Blocked(index) => return Some((body, index)),
        }
        None
    }

    /// Issues an action whose waits are all reached or device-waitable (`device_waits`): the
    /// backend's issue (a panic in it counted as a failure), then, under the issue lock so that
    /// timepoints are recorded in issue order, its completion event as the device-signal
    /// timepoint of every signal semaphore (the listeners those records make due go into
    /// `burst`), unless the work is checked when it completes, which signals only from the
    /// completion side; then the hand-over to the completion thread ([`push_finished`]). On a
    /// backend error it fails the action, loses the queue and fails everything pending.
    ///
    /// [`push_finished`]: Self::push_finished
    fn issue_ready(
        &self,
        state: &mut State<B>,
        burst: &mut Burst<B::Event>,
        mut body: Boxed<B>,
        device_waits: EventList<B::Event>,
        issuer: Issuer,
    ) {
        if let Some(failure) = self.lost.get() {
            self.fail_unissued(burst, body, failure);
            return;
        }
        // The slot itself, not through `Boxed`'s `Deref`: one step fewer on the submitting path.
        let action = &mut *body.0;
        let Some(payload) = action.payload.as_mut() else {
            unreachable!("a filled body slot holds a payload")
        };
        let local = &mut state.local;
        let issued = guard::checks_completion(&self.backend, payload).and_then(|checked| {
            catch_unwind(AssertUnwindSafe(|| {
                self.backend.issue(local, &device_waits, payload)
            }))
            .unwrap_or_else(|_| Err(Failure::msg("the backend panicked while issuing an action")))
            .map(|event| (event, checked))
        });
        let (event, checked) = match issued {
            Ok(event) => event,
            Err(failure) => {
                self.mark_lost(&failure);
                self.fail_unissued(burst, body, failure.clone());
                self.fail_all_pending(state, burst, &failure);
                return;
            }
        };
        if !action.resources.is_empty()
            && let Err(failure) = guard::issued(&self.backend, &action.resources)
        {
            // The action was issued and completes as ever; later ones find the queue lost.
            self.mark_lost(&failure);
        }
        if !checked {
            for (semaphore, value) in &action.signals {
                // Err only if the semaphore already failed: nothing to record then.
                let _ = semaphore.record_device_signal_into(*value, event.clone(), burst);
            }
        }
        let counters = &self.issue_side.counters;
        bump(match issuer {
            Issuer::Submitter => &counters.issued_on_submit,
            Issuer::Worker => &counters.issued_by_worker,
            Issuer::Signaller => &counters.issued_on_signal,
        });
        let finished = Finished::Issued {
            body,
            event,
            device_waits,
            checked,
        };
        self.push_finished(finished, burst);
    }

    /// Fails an action that was never issued: its signals now (their listeners into `burst`),
    /// its cleanup on the completion thread.
    pub(crate) fn fail_unissued(
        &self,
        burst: &mut Burst<B::Event>,
        body: Boxed<B>,
        failure: Failure,
    ) {
        body.fail_signals_into(&failure, burst);
        self.push_finished(Finished::Failed { body, failure }, burst);
    }

    /// Fails every pending action with `failure` (the queue is lost or shutting down).
    pub(crate) fn fail_all_pending(
        &self,
        state: &mut State<B>,
        burst: &mut Burst<B::Event>,
        failure: &Failure,
    ) {
        while let Some(slot) = state.pending.head() {
            let pending = state.pending.remove(slot);
            if let Waiting::Listening { index, token } = pending.waiting {
                pending.body.waits[index].0.cancel_listen(token);
            }
            self.fail_unissued(burst, pending.body, failure.clone());
        }
    }

    /// Hands `finished` to the completion thread: the last step of an issue (or a failure).
    /// Every wake decision of the issue side is here; the completion side takes with
    /// `take_finished` (handover.rs).
    pub(crate) fn push_finished(&self, finished: Finished<B>, burst: &mut Burst<B::Event>) {
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
            queue.push(finished);
            // The completion thread read the next slot last, in its previous batch.
            queue.prefetch_next_push();
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
            // A parked thread's wake for work nobody needs yet waits for the end of the issuing
            // loop (see `issue_lock`), unless a full batch waits.
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
        if wake {
            if may_wait {
                burst.hold_wake(&self.completion_waker);
            } else {
                self.hurry.wake();
            }
        }
    }
}
