//! The hand-over of issued (or failed) actions from the issue side to the completion thread, and
//! the decision to wake that thread.

use std::collections::VecDeque;
use std::sync::PoisonError;

use cuhal_semaphore::Burst;

use crate::action::Finished;
use crate::backend::Backend;
use crate::shared::Shared;
use crate::sync::Ordering;

impl<B: Backend> Shared<B> {
    /// Hands `finished` to the completion thread.
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
