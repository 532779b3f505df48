//! Backpressure: a submitter waits for room while the queue has its limit of actions in flight.

use std::sync::PoisonError;
use std::time::Duration;

use crate::backend::Backend;
use crate::issue_lock::thread_key;
use crate::shared::Shared;
use crate::sync::Ordering;

impl<B: Backend> Shared<B> {
    /// Called first on the completion thread: it never waits for room on this queue.
    pub(crate) fn completion_thread_started(&self) {
        self.completion_thread
            .store(thread_key(), Ordering::Relaxed);
    }

    /// Waits, outside every lock, while the queue has `max_in_flight` actions handed to the
    /// completion side and not yet retired: a completion side that falls behind slows the
    /// submitter down instead of letting memory (actions, completion events) grow with the
    /// backlog. Never waits on a completion thread (it is what makes room) nor once the queue
    /// is lost or shutting down (what is in flight is then being failed or drained).
    ///
    /// The slow path only: [`lock_to_submit`](Self::lock_to_submit) calls it when its fast test
    /// (pushed minus the retired count it last saw, against the limit) finds the queue full.
    #[cold]
    #[inline(never)]
    pub(crate) fn wait_for_room(&self) {
        let limit = self.options.max_in_flight as u64;
        let side = &*self.issue_side;
        let full = || {
            let retired = self.completion_side.retired.load(Ordering::Acquire);
            side.retired_seen.store(retired, Ordering::Relaxed);
            side.pushed.load(Ordering::Relaxed).saturating_sub(retired) >= limit
                && !self.lost.is_set()
                && !self.shutdown.load(Ordering::Relaxed)
        };
        if !full() || self.completion_thread.load(Ordering::Relaxed) == thread_key() {
            return;
        }
        // Wakes of other queues' completion threads that a loop this thread runs holds back (a
        // listener that submits, fired from a burst) stay held while it waits: the room it waits
        // for is made by this queue's completion thread alone, woken here.
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
}
