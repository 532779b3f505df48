//! [`IssueGuard`]: a queue's issue lock, held by a thread that may issue, with the burst of the
//! loop it issues in.
//!
//! Whoever takes the lock owns a [`Burst`] (a value on its stack) or lends the one of the loop
//! it runs in, and the guard carries it: the device signals recorded while the lock is held,
//! and the failures, put the listeners they make due into it, and the completion wakes nobody
//! needs yet are held in it. The lock is let go first; then the burst's owner runs it, and each
//! listener there (another queue's, say) tries that queue's lock and issues into the same burst,
//! or hands its key to that queue's worker. A chain across queues is so issued by one loop, with
//! at most one issue lock held at a time.

use std::ops::{Deref, DerefMut};
use std::sync::{PoisonError, TryLockError};

use cuhal_semaphore::Burst;

use crate::backend::Backend;
use crate::shared::Shared;
use crate::state::State;
use crate::sync::{MutexGuard, Ordering, thread_key};

/// Who is issuing, for the statistics.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Issuer {
    Submitter,
    Worker,
    /// A thread whose semaphore change made the action ready.
    Signaller,
}

/// The issue lock, held by a thread that may issue. Before the lock is let go every notification
/// recorded meanwhile is handled (one another thread recorded because it found the lock taken),
/// so none waits for the worker needlessly.
pub(crate) struct IssueGuard<'a, B: Backend> {
    shared: &'a Shared<B>,
    state: Option<MutexGuard<'a, State<B>>>,
    burst: &'a mut Burst<B::Event>,
    issuer: Issuer,
}

impl<B: Backend> IssueGuard<'_, B> {
    /// The state under the lock, and the burst of the loop issuing.
    pub(crate) fn parts(&mut self) -> (&mut State<B>, &mut Burst<B::Event>) {
        let state = self.state.as_deref_mut().expect("held until drop");
        (state, self.burst)
    }
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
            shared.drain(&mut state, self.burst, self.issuer);
            let pending = state.pending.len() as u64;
            shared
                .issue_side
                .counters
                .pending
                .store(pending, Ordering::Relaxed);
            shared.issue_side.holder.store(0, Ordering::Release);
            drop(state);
        }
    }
}

impl<B: Backend> Shared<B> {
    /// Takes the issue lock, waiting for it; what the issues make due goes into `burst`.
    pub(crate) fn lock_issue<'a>(
        &'a self,
        issuer: Issuer,
        burst: &'a mut Burst<B::Event>,
    ) -> IssueGuard<'a, B> {
        self.lock_issue_as(thread_key(), issuer, burst)
    }

    /// [`lock_issue`](Self::lock_issue) for the thread whose [`thread_key`] is `me`.
    pub(crate) fn lock_issue_as<'a>(
        &'a self,
        me: u64,
        issuer: Issuer,
        burst: &'a mut Burst<B::Event>,
    ) -> IssueGuard<'a, B> {
        // Backend calls under the lock are caught, so a poisoned lock still guards consistent state.
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.guard(state, me, issuer, burst)
    }

    /// Takes the issue lock if it is free, for the thread whose [`thread_key`] is `me`; `None`
    /// when another thread holds it (or this one).
    pub(crate) fn try_lock_issue_as<'a>(
        &'a self,
        me: u64,
        issuer: Issuer,
        burst: &'a mut Burst<B::Event>,
    ) -> Option<IssueGuard<'a, B>> {
        let state = match self.state.try_lock() {
            Ok(state) => state,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        Some(self.guard(state, me, issuer, burst))
    }

    /// Whether the thread whose [`thread_key`] is `me` holds the issue lock: it is inside this
    /// queue's backend issue (a deferred replay's stream work, say) or a submission's `fill`,
    /// and waiting for the lock would wait for itself.
    pub(crate) fn held_by(&self, me: u64) -> bool {
        self.issue_side.holder.load(Ordering::Relaxed) == me
    }

    fn guard<'a>(
        &'a self,
        state: MutexGuard<'a, State<B>>,
        me: u64,
        issuer: Issuer,
        burst: &'a mut Burst<B::Event>,
    ) -> IssueGuard<'a, B> {
        self.issue_side.holder.store(me, Ordering::Relaxed);
        IssueGuard {
            shared: self,
            state: Some(state),
            burst,
            issuer,
        }
    }

    /// Handles every recorded notification and issues what became ready, until none is left.
    fn drain(&self, state: &mut State<B>, burst: &mut Burst<B::Event>, issuer: Issuer) {
        while self.notifier.has_keys() {
            let mut keys = std::mem::take(&mut state.keys);
            self.notifier.take(&mut keys);
            for (key, hint) in keys.drain(..) {
                self.on_notify(state, burst, key, hint, issuer);
            }
            state.keys = keys;
            self.pump(state, burst, issuer);
        }
    }
}
