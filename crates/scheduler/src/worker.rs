//! The worker thread: issues the actions that become ready after they were submitted.
//!
//! It sleeps until a listener reports that a semaphore some pending action waits on changed, then
//! looks at those actions only (never the whole pending list), and issues ready ones from the head
//! of the list in submission order. It also fails everything pending when the queue is lost, and at
//! shutdown issues what is ready and fails the rest.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crossbeam_utils::sync::Parker;
use cuhal_semaphore::Failure;

use crate::backend::Backend;
use crate::error::Error;
use crate::shared::{Issuer, Shared};
use crate::spin::spin_until;

/// Says the worker is done however it ends. If it ends by panicking, the queue is lost and what
/// was pending fails, so that no waiter and no queue drop waits for actions nobody will issue.
struct Done<'a, B: Backend>(&'a Shared<B>);

impl<B: Backend> Drop for Done<'_, B> {
    fn drop(&mut self) {
        let shared = self.0;
        if std::thread::panicking() {
            let failure = Failure::msg(format!(
                "queue `{}`: its worker thread panicked",
                shared.label
            ));
            shared.mark_lost(&failure);
            let mut state = shared.lock_state();
            shared.fail_all_pending(&mut state, &failure);
        }
        shared.worker_done.store(true, Ordering::Release);
        shared.completion.unpark();
    }
}

pub(crate) fn run<B: Backend>(shared: Arc<Shared<B>>, parker: Parker) {
    let _done = Done(&shared);
    let mut keys: Vec<u64> = Vec::with_capacity(shared.options.capacity);
    let mut lost_handled = false;
    loop {
        shared.notifier.take(&mut keys);
        let shutdown = shared.shutdown.load(Ordering::Acquire);
        let lost = if lost_handled {
            None
        } else {
            shared.lost.get().cloned()
        };
        if !keys.is_empty() || lost.is_some() || shutdown {
            let mut state = shared.lock_state();
            for key in keys.drain(..) {
                shared.on_notify(&mut state, key);
            }
            if let Some(failure) = lost {
                shared.fail_all_pending(&mut state, &failure);
                lost_handled = true;
            }
            shared.pump(&mut state, Issuer::Worker);
            if shutdown {
                let failure = Failure::new(Error::ShutDown {
                    queue: shared.label.clone(),
                });
                shared.fail_all_pending(&mut state, &failure);
                break;
            }
        }
        let idle = shared.options.idle_spin;
        if !spin_until(idle, || {
            shared.notifier.has_keys() || shared.shutdown.load(Ordering::Relaxed)
        }) {
            parker.park();
        }
    }
}
