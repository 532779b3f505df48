//! One-shot listeners: how a scheduler learns that a semaphore advanced, recorded a device signal
//! or failed, without polling and without being called under the semaphore's lock.

use std::sync::Arc;

use slab::Slab;
use smallvec::SmallVec;

use crate::semaphore::SemaphoreId;

/// Receives one-shot notifications from [`Semaphore::listen`](crate::Semaphore::listen).
///
/// `notify` is called outside every semaphore lock, on whichever thread caused the change (a
/// signalling thread, a completion thread, a host waiter that saw a device event complete, or the
/// thread calling `listen` when the condition already holds). It must not block on a lock another
/// thread may hold while it calls into semaphores: record the key and wake a worker, or *try* a
/// lock and do the work right there (a scheduler issues what became ready on the notifying thread,
/// which saves a thread hand-off). It may call back into any semaphore.
pub trait Listener: Send + Sync {
    /// The semaphore `semaphore` reached the listened value, recorded a device signal for a value
    /// at least that high, or failed. `key` is the key given to `listen`.
    fn notify(&self, semaphore: SemaphoreId, key: u64);
}

/// Identifies a registered listener, to [`cancel`](crate::Semaphore::cancel_listen) it.
///
/// Cancelling a token whose listener already fired (or was cancelled) does nothing, even when its
/// storage slot has been reused by a newer listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ListenToken {
    pub(crate) semaphore: SemaphoreId,
    pub(crate) slot: usize,
    pub(crate) seq: u64,
}

/// A slot number no slab ever hands out: the token of a listener that fired at registration.
pub(crate) const FIRED_SLOT: usize = usize::MAX;

/// A listener that is due: called once the lock is released.
pub(crate) type Due = (Arc<dyn Listener>, u64);

struct Entry {
    value: u64,
    seq: u64,
    listener: Arc<dyn Listener>,
    key: u64,
}

/// The listeners of one semaphore, kept under its lock. The slab's storage is reused, so
/// registering and firing allocate nothing in steady state.
#[derive(Default)]
pub(crate) struct Listeners {
    entries: Slab<Entry>,
    next_seq: u64,
    /// No listener waits for a value below this (a lower bound: it may be stale-low after a cancel),
    /// so most advances skip the scan.
    min_value: u64,
}

impl Listeners {
    pub(crate) fn new() -> Self {
        Listeners {
            // Room for a few from the start: the first wait or listener on a semaphore must
            // not be the one that allocates in a steady state.
            entries: Slab::with_capacity(4),
            next_seq: 0,
            min_value: u64::MAX,
        }
    }

    pub(crate) fn insert(
        &mut self,
        value: u64,
        listener: &Arc<dyn Listener>,
        key: u64,
    ) -> (usize, u64) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let slot = self.entries.insert(Entry {
            value,
            seq,
            listener: Arc::clone(listener),
            key,
        });
        self.min_value = self.min_value.min(value);
        (slot, seq)
    }

    pub(crate) fn cancel(&mut self, slot: usize, seq: u64) -> Option<Arc<dyn Listener>> {
        match self.entries.get(slot) {
            Some(entry) if entry.seq == seq => Some(self.entries.remove(slot).listener),
            _ => None,
        }
    }

    /// Whether a listener may be due at `threshold`: never false when [`Listeners::take_due`]
    /// would take one (a cancelled listener can make it true when none would be taken).
    pub(crate) fn any_due(&self, threshold: u64) -> bool {
        threshold >= self.min_value
    }

    /// Moves every listener waiting for a value `<= threshold` into `due`.
    pub(crate) fn take_due<const N: usize>(
        &mut self,
        threshold: u64,
        due: &mut SmallVec<[Due; N]>,
    ) {
        if threshold < self.min_value {
            return;
        }
        let mut min_value = u64::MAX;
        let mut slots: SmallVec<[usize; 8]> = SmallVec::new();
        for (slot, entry) in self.entries.iter() {
            if entry.value <= threshold {
                slots.push(slot);
            } else {
                min_value = min_value.min(entry.value);
            }
        }
        for slot in slots {
            let entry = self.entries.remove(slot);
            due.push((entry.listener, entry.key));
        }
        self.min_value = min_value;
    }

    /// Moves every listener into `due` (the semaphore failed).
    pub(crate) fn take_all<const N: usize>(&mut self, due: &mut SmallVec<[Due; N]>) {
        due.extend(
            self.entries
                .drain()
                .map(|entry| (entry.listener, entry.key)),
        );
        self.min_value = u64::MAX;
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}
