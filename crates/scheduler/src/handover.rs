//! The completion thread's side of the hand-over of issued (or failed) actions: its last look
//! before it sleeps, and the take of everything handed over. The issue side's push, and its
//! decision to wake this thread, is `Shared::push_finished` (issue.rs), the last step of an
//! issue.

use std::collections::VecDeque;
use std::sync::PoisonError;

use crate::action::Finished;
use crate::backend::Backend;
use crate::shared::Shared;
use crate::sync::Ordering;

impl<B: Backend> Shared<B> {
    /// The completion thread's last look before it sleeps, having raised `completion_parked`
    /// or begun a gather (`Hurry::begin_gather`): how many finished actions wait, and how many of them are
    /// urgent, read under the lock that `push_finished` reads the flags under.
    pub(crate) fn finished_waiting(&self) -> (usize, usize) {
        let queue = self.finished.lock().unwrap_or_else(PoisonError::into_inner);
        (queue.len(), self.urgent.load(Ordering::Relaxed))
    }

    /// Moves every finished action into `batch` (empty, its capacity kept), oldest first.
    /// Returns whether the round is urgent (see `urgent`, [`Hurry`]): one of them must not
    /// wait out a gather, or a host thread parked on this queue's work since the last take. Such
    /// a round retires what it has at once, polls fast, and does not gather after it.
    pub(crate) fn take_finished(&self, batch: &mut VecDeque<Finished<B>>) -> bool {
        let mut queue = self.finished.lock().unwrap_or_else(PoisonError::into_inner);
        queue.swap_storage(batch);
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
}
