//! [`QueueListener`]: how a queue hears that a semaphore its pending work waits on changed, and
//! issues what became ready on the thread that changed it.

use std::sync::{Arc, Weak};

use cuhal_semaphore::{Burst, Listener, Notice, SemaphoreId};

use crate::backend::Backend;
use crate::issue_lock::Issuer;
use crate::issue_lock::thread_key;
use crate::readiness::Hint;
use crate::shared::Shared;

/// The queue's semaphore listener: tries to handle the notification on the notifying thread.
pub(crate) struct QueueListener<B: Backend>(Weak<Shared<B>>);

impl<B: Backend> QueueListener<B> {
    /// The listener of the queue `shared` will be.
    pub(crate) fn shared(shared: Weak<Shared<B>>) -> Arc<dyn Listener<B::Event>> {
        Arc::new(QueueListener(shared))
    }
}

impl<B: Backend> Listener<B::Event> for QueueListener<B> {
    /// Fired as it registers (what it waits for already holds): with no notice, and no loop of
    /// a caller to issue in, so with a burst of its own. Registration happens under this queue's
    /// issue lock, which `on_listener` finds held by this thread.
    fn notify(&self, semaphore: SemaphoreId, key: u64) {
        let mut burst = Burst::new();
        self.notice(semaphore, key, Notice::Changed, &mut burst);
        burst.run();
    }

    fn notice(
        &self,
        semaphore: SemaphoreId,
        key: u64,
        notice: Notice<'_, B::Event>,
        burst: &mut Burst<B::Event>,
    ) {
        if let Some(shared) = self.0.upgrade() {
            shared.on_listener(key, Hint::from_notice(semaphore, notice), burst);
        }
    }
}

impl<B: Backend> Shared<B> {
    /// A semaphore that a pending action of this queue waits on changed. Handled here, on the
    /// thread that changed it, when the issue lock is free (what the issues make due goes into
    /// `burst`, the caller's loop); recorded for the holder when this thread holds it (it
    /// registered a listener that was due at once, or a failure it made under the lock fired
    /// it); recorded for the worker, which is woken, when another thread holds it.
    fn on_listener(&self, key: u64, hint: Option<Hint<B::Event>>, burst: &mut Burst<B::Event>) {
        let me = thread_key();
        if self.held_by(me) {
            self.notifier.push(key, hint);
            return;
        }
        let Some(mut guard) = self.try_lock_issue_as(me, Issuer::Signaller, burst) else {
            // The holder may already be past its last look at the notifications.
            self.notifier.push(key, hint);
            self.notifier.wake();
            return;
        };
        let (state, burst) = guard.parts();
        self.on_notify(state, burst, key, hint, Issuer::Signaller);
        self.pump(state, burst, Issuer::Signaller);
    }
}
