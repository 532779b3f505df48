//! The keys of pending actions to look at again, each with what its semaphore said it did (a
//! [`Hint`]), for whichever thread next holds the queue's issue lock (see `shared.rs`), and the
//! worker's wake-up. The keys' lock is a leaf: nothing is called while it is held, and it never
//! blocks for long.

use std::sync::PoisonError;

use crate::readiness::Hint;
use crate::sync::{AtomicBool, Mutex, Ordering, Unparker};

/// A notified key, and what its semaphore said.
pub(crate) type Notified<E> = (u64, Option<Hint<E>>);

pub(crate) struct Notifier<E> {
    /// Keys of actions whose awaited semaphore changed. Swapped with the holder's own buffer, so
    /// both keep their capacity and steady state allocates nothing.
    keys: Mutex<Vec<Notified<E>>>,
    /// Whether `keys` may be non-empty: lets a holder or the worker look without the lock.
    any: AtomicBool,
    worker: Unparker,
}

impl<E> Notifier<E> {
    pub(crate) fn new(worker: Unparker, capacity: usize) -> Self {
        Notifier {
            keys: Mutex::new(Vec::with_capacity(capacity)),
            any: AtomicBool::new(false),
            worker,
        }
    }

    /// Moves every recorded key into `into` (which the caller has emptied).
    pub(crate) fn take(&self, into: &mut Vec<Notified<E>>) {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::swap(&mut *keys, into);
        self.any.store(false, Ordering::SeqCst);
    }

    pub(crate) fn has_keys(&self) -> bool {
        self.any.load(Ordering::SeqCst)
    }

    /// Records a key for the next holder of the issue lock (or the worker, if woken).
    pub(crate) fn push(&self, key: u64, hint: Option<Hint<E>>) {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.push((key, hint));
        self.any.store(true, Ordering::SeqCst);
    }

    pub(crate) fn wake(&self) {
        self.worker.unpark();
    }
}
