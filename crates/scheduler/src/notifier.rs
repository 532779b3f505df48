//! The queue's semaphore [`Listener`]: records which pending action to look at again and wakes
//! the worker. It runs on whatever thread changed the semaphore, so it only takes its own leaf
//! lock (never held while anything else is called) and never blocks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use crossbeam_utils::sync::Unparker;
use cuhal_semaphore::{Listener, SemaphoreId};

pub(crate) struct Notifier {
    /// Keys of actions whose awaited semaphore changed. Swapped with the worker's own buffer, so
    /// both keep their capacity and steady state allocates nothing.
    keys: Mutex<Vec<u64>>,
    /// Whether `keys` may be non-empty: lets the worker spin without taking the lock.
    any: AtomicBool,
    worker: Unparker,
}

impl Notifier {
    pub(crate) fn new(worker: Unparker, capacity: usize) -> Self {
        Notifier {
            keys: Mutex::new(Vec::with_capacity(capacity)),
            any: AtomicBool::new(false),
            worker,
        }
    }

    /// Moves every recorded key into `into` (which the caller has emptied).
    pub(crate) fn take(&self, into: &mut Vec<u64>) {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::swap(&mut *keys, into);
        self.any.store(false, Ordering::Relaxed);
    }

    pub(crate) fn has_keys(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    pub(crate) fn wake(&self) {
        self.worker.unpark();
    }
}

impl Listener for Notifier {
    fn notify(&self, _semaphore: SemaphoreId, key: u64) {
        {
            let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
            keys.push(key);
            self.any.store(true, Ordering::Relaxed);
        }
        self.worker.unpark();
    }
}
