//! The worker thread: issues the actions that become ready after they were submitted, when the
//! thread that made them ready could not.
//!
//! Most actions that become ready later are issued by the thread whose semaphore change made them
//! ready (see `shared.rs`). The worker is woken only when that thread found the queue's issue lock
//! taken by another thread; it then looks at the notified actions only (never the whole pending
//! list), and issues ready ones from the head of the list in submission order. It also fails
//! everything pending when the queue is lost, and at shutdown issues what is ready and fails the
//! rest.

use std::sync::Arc;

use cuhal_semaphore::{Burst, Failure};

use crate::backend::Backend;
use crate::error::Error;
use crate::issue_lock::Issuer;
use crate::shared::Shared;
use crate::spin::spin_until;
use crate::sync::{Ordering, Parker, thread};

/// Says the worker is done however it ends. If it ends by panicking, the queue is lost and what
/// was pending fails, so that no waiter and no queue drop waits for actions nobody will issue.
struct Done<'a, B: Backend>(&'a Shared<B>);

impl<B: Backend> Drop for Done<'_, B> {
    fn drop(&mut self) {
        let shared = self.0;
        if thread::panicking() {
            let failure = Failure::msg(format!(
                "queue `{}`: its worker thread panicked",
                shared.label
            ));
            shared.mark_lost(&failure);
            let mut burst = Burst::new();
            let mut guard = shared.lock_issue(Issuer::Worker, &mut burst);
            let (state, burst_in) = guard.parts();
            shared.fail_all_pending(state, burst_in, &failure);
            drop(guard);
            burst.run();
        }
        shared.worker_done.store(true, Ordering::Release);
        shared.hurry.wake();
    }
}

pub(crate) fn run<B: Backend>(shared: Arc<Shared<B>>, parker: Parker) {
    let _done = Done(&shared);
    let mut lost_handled = false;
    loop {
        let shutdown = shared.shutdown.load(Ordering::Acquire);
        let lost = if lost_handled {
            None
        } else {
            shared.lost.get()
        };
        if shared.notifier.has_keys() || lost.is_some() || shutdown {
            // The guard handles the recorded notifications before it lets go of the lock; the
            // burst, what the issues made due on other queues, runs after.
            let mut burst = Burst::new();
            let mut guard = shared.lock_issue(Issuer::Worker, &mut burst);
            let (state, burst_in) = guard.parts();
            if let Some(failure) = lost {
                shared.fail_all_pending(state, burst_in, &failure);
                lost_handled = true;
            }
            shared.pump(state, burst_in, Issuer::Worker);
            drop(guard);
            burst.run();
            if shutdown {
                let mut burst = Burst::new();
                let mut guard = shared.lock_issue(Issuer::Worker, &mut burst);
                let (state, burst_in) = guard.parts();
                let failure = Failure::new(Error::ShutDown {
                    queue: shared.label.clone(),
                });
                shared.fail_all_pending(state, burst_in, &failure);
                drop(guard);
                burst.run();
                break;
            }
        }
        let idle = crate::policy::IDLE_SPIN;
        if !spin_until(idle, || {
            shared.notifier.has_keys()
                || shared.shutdown.load(Ordering::Relaxed)
                || (!lost_handled && shared.lost.is_set())
        }) {
            shared.worker_parked.store(true, Ordering::SeqCst);
            shared.worker_parks.fetch_add(1, Ordering::Relaxed);
            parker.park();
            shared.worker_parked.store(false, Ordering::SeqCst);
        }
    }
}
