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
use crate::error::Error;
use crate::shared::Shared;
use crate::state::State;
use crate::sync::{MutexGuard, Ordering, thread};

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
///
/// The state under the lock and the burst of the loop issuing are handed straight to what issues
/// ([`parts`](Self::parts)); the lock is released when the guard drops, after its `Drop` ran.
pub(crate) struct IssueGuard<'a, B: Backend> {
    shared: &'a Shared<B>,
    /// The state under the lock.
    state: MutexGuard<'a, State<B>>,
    /// The burst of the loop issuing.
    burst: &'a mut Burst<B::Event>,
    issuer: Issuer,
}

impl<B: Backend> IssueGuard<'_, B> {
    /// The state under the lock, and the burst of the loop issuing.
    #[inline]
    pub(crate) fn parts(&mut self) -> (&mut State<B>, &mut Burst<B::Event>) {
        (&mut self.state, self.burst)
    }
}

impl<B: Backend> Deref for IssueGuard<'_, B> {
    type Target = State<B>;
    fn deref(&self) -> &State<B> {
        &self.state
    }
}

impl<B: Backend> DerefMut for IssueGuard<'_, B> {
    fn deref_mut(&mut self) -> &mut State<B> {
        &mut self.state
    }
}

impl<B: Backend> Drop for IssueGuard<'_, B> {
    /// Handles every recorded notification and issues what became ready, until none is left;
    /// then publishes the pending count and lets go of the holder key. The mutex itself is
    /// released just after, when the `state` field drops.
    fn drop(&mut self) {
        let shared = self.shared;
        let state = &mut *self.state;
        while shared.notifier.has_keys() {
            let mut keys = std::mem::take(&mut state.keys);
            shared.notifier.take(&mut keys);
            for (key, hint) in keys.drain(..) {
                shared.on_notify(state, self.burst, key, hint, self.issuer);
            }
            state.keys = keys;
            shared.pump(state, self.burst, self.issuer);
        }
        let pending = state.pending.len() as u64;
        shared
            .issue_side
            .counters
            .pending
            .store(pending, Ordering::Relaxed);
        shared.issue_side.holder.store(0, Ordering::Release);
    }
}

impl<B: Backend> Shared<B> {
    /// Takes the issue lock for a submission from this thread; what its issue makes due goes
    /// into `burst`. In order: a submission from inside this queue's issue (its `fill`, the
    /// backend's issue, a listener its failures fire) is [`Error::Reentrant`], for it would
    /// wait for the lock its own thread holds; while the queue has its limit of actions in
    /// flight it waits for room first, outside the lock (the fast test is here, the wait out
    /// of line in `room.rs`); on a lost queue the lock is let go again and the error returned.
    #[inline]
    pub(crate) fn lock_to_submit<'a>(
        &'a self,
        burst: &'a mut Burst<B::Event>,
    ) -> Result<IssueGuard<'a, B>, Error> {
        let me = thread_key();
        let side = &*self.issue_side;
        if side.holder.load(Ordering::Relaxed) == me {
            return Err(Error::Reentrant {
                queue: self.label.clone(),
            });
        }
        let limit = self.options.max_in_flight as u64;
        let pushed = side.pushed.load(Ordering::Relaxed);
        if pushed.saturating_sub(side.retired_seen.load(Ordering::Relaxed)) >= limit {
            self.wait_for_room();
        }
        // Backend calls under the lock are caught, so a poisoned lock still guards consistent state.
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        side.holder.store(me, Ordering::Relaxed);
        let guard = IssueGuard {
            shared: self,
            state,
            burst,
            issuer: Issuer::Submitter,
        };
        if self.lost.is_set() {
            drop(guard);
            return Err(self.lost_error());
        }
        Ok(guard)
    }

    /// Takes the issue lock, waiting for it; what the issues make due goes into `burst`.
    pub(crate) fn lock_issue<'a>(
        &'a self,
        issuer: Issuer,
        burst: &'a mut Burst<B::Event>,
    ) -> IssueGuard<'a, B> {
        // Backend calls under the lock are caught, so a poisoned lock still guards consistent state.
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.guard(state, thread_key(), issuer, burst)
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
            state,
            burst,
            issuer,
        }
    }
}

/// A number for the calling thread, the same at every call on it and different from that of
/// every other thread of the process, never 0: its [`ThreadId`](std::thread::ThreadId) as a
/// number, which an atomic can hold (the issue lock's holder, a queue's completion thread).
/// `ThreadId::as_u64` is not stable, so the id is read through its `Hash`, which writes the one
/// number it is (loom's, its parts, folded). `std::thread::current` clones a handle the thread
/// already has: no allocation, no lock.
pub(crate) fn thread_key() -> u64 {
    use std::hash::{Hash, Hasher};

    /// Keeps what a `Hash` writes, folded: a single number comes out as itself.
    struct Fold(u64);

    impl Hasher for Fold {
        fn finish(&self) -> u64 {
            self.0
        }

        fn write(&mut self, bytes: &[u8]) {
            for &byte in bytes {
                self.0 = self.0.rotate_left(8) ^ u64::from(byte);
            }
        }

        fn write_u64(&mut self, n: u64) {
            self.0 = self.0.rotate_left(29) ^ n;
        }

        fn write_usize(&mut self, n: usize) {
            self.write_u64(n as u64);
        }
    }

    let mut fold = Fold(0);
    thread::current().id().hash(&mut fold);
    // A thread's id is never 0 (std's is a `NonZeroU64`); loom's folded could be, in theory.
    fold.finish().max(1)
}
