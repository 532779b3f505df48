//! One-shot listeners: how a scheduler learns that a semaphore advanced, recorded a device signal
//! or failed, without polling and without being called under the semaphore's lock.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
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

/// A live listener; its value is in its heap entry.
struct Entry {
    seq: u64,
    listener: Arc<dyn Listener>,
    key: u64,
}

/// A listener's place in the order of values: `(value, seq, slot)`, smallest first.
type Order = Reverse<(u64, u64, usize)>;

/// The listeners of one semaphore, kept under its lock. The slab's and the heap's storage is
/// reused, so registering and firing allocate nothing in steady state.
///
/// A min-heap on the values says which are due, so an advance or a device signal costs a look at
/// the smallest value plus a pop per listener it fires, whatever the number listening: a chain of
/// submissions all pending on one semaphore (each listening for the value the one before it
/// signals) would otherwise scan every listener at every step. A cancel leaves its heap entry
/// behind, skipped when it comes up (its slot no longer holds that `seq`); the heap is swept
/// when such entries outnumber the live ones ([`Listeners::sweep`]).
pub(crate) struct Listeners {
    entries: Slab<Entry>,
    order: BinaryHeap<Order>,
    next_seq: u64,
}

/// Cancelled entries the heap may hold beyond the live ones before it is swept.
const STALE_SLACK: usize = 16;

impl Listeners {
    pub(crate) fn new() -> Self {
        Listeners {
            // Room for a few from the start: the first wait or listener on a semaphore must
            // not be the one that allocates in a steady state.
            entries: Slab::with_capacity(4),
            order: BinaryHeap::with_capacity(4),
            next_seq: 0,
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
            seq,
            listener: Arc::clone(listener),
            key,
        });
        self.order.push(Reverse((value, seq, slot)));
        (slot, seq)
    }

    pub(crate) fn cancel(&mut self, slot: usize, seq: u64) -> Option<Arc<dyn Listener>> {
        match self.entries.get(slot) {
            Some(entry) if entry.seq == seq => {
                let listener = self.entries.remove(slot).listener;
                self.sweep();
                Some(listener)
            }
            _ => None,
        }
    }

    /// Whether a listener may be due at `threshold`: never false when [`Listeners::take_due`]
    /// would take one (a cancelled listener can make it true when none would be taken).
    pub(crate) fn any_due(&self, threshold: u64) -> bool {
        self.order
            .peek()
            .is_some_and(|Reverse((value, _, _))| *value <= threshold)
    }

    /// Moves every listener waiting for a value `<= threshold` into `due`, smallest value first
    /// (in registration order among equal values).
    pub(crate) fn take_due<const N: usize>(
        &mut self,
        threshold: u64,
        due: &mut SmallVec<[Due; N]>,
    ) {
        while let Some(&Reverse((value, seq, slot))) = self.order.peek() {
            if value > threshold {
                break;
            }
            self.order.pop();
            if live(&self.entries, slot, seq) {
                let entry = self.entries.remove(slot);
                due.push((entry.listener, entry.key));
            }
        }
        self.sweep();
    }

    /// Drops the heap's entries of cancelled listeners once they outnumber the live ones (by
    /// `STALE_SLACK`), in place: the heap keeps its capacity.
    fn sweep(&mut self) {
        if self.order.len() > 2 * self.entries.len() + STALE_SLACK {
            let entries = &self.entries;
            self.order
                .retain(|Reverse((_, seq, slot))| live(entries, *slot, *seq));
        }
    }

    /// Moves every listener into `due` (the semaphore failed).
    pub(crate) fn take_all<const N: usize>(&mut self, due: &mut SmallVec<[Due; N]>) {
        due.extend(
            self.entries
                .drain()
                .map(|entry| (entry.listener, entry.key)),
        );
        self.order.clear();
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Whether `slot` still holds the listener registered as `seq` (not fired, not cancelled).
fn live(entries: &Slab<Entry>, slot: usize, seq: u64) -> bool {
    entries.get(slot).is_some_and(|entry| entry.seq == seq)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;
    use smallvec::SmallVec;

    use super::{Due, Listener, Listeners, STALE_SLACK};
    use crate::semaphore::SemaphoreId;

    struct Nop;

    impl Listener for Nop {
        fn notify(&self, _semaphore: SemaphoreId, _key: u64) {}
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64),
        /// Cancels the `n`th token handed out (modulo their number): live, fired or cancelled.
        Cancel(usize),
        TakeDue(u64),
        TakeAll,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..30).prop_map(Op::Insert),
            2 => any::<usize>().prop_map(Op::Cancel),
            2 => (0u64..30).prop_map(Op::TakeDue),
            1 => Just(Op::TakeAll),
        ]
    }

    proptest! {
        /// Against a list of live listeners: every listener fires once, when a threshold reaches
        /// its value, smallest value first and in registration order among equals; a cancel of a
        /// fired or cancelled token (its slot maybe reused since) does nothing; `any_due` is
        /// never false when one is due; cancelled entries left in the heap stay bounded.
        #[test]
        fn listeners_match_a_list(ops in proptest::collection::vec(op(), 1..120)) {
            let listener: Arc<dyn Listener> = Arc::new(Nop);
            let mut listeners = Listeners::new();
            // (value, key) of the live listeners, by key (keys grow with registration).
            let mut model: Vec<(u64, u64)> = Vec::new();
            let mut tokens: Vec<(usize, u64, u64)> = Vec::new();
            let mut next_key = 0;
            for op in ops {
                match op {
                    Op::Insert(value) => {
                        let (slot, seq) = listeners.insert(value, &listener, next_key);
                        tokens.push((slot, seq, next_key));
                        model.push((value, next_key));
                        next_key += 1;
                    }
                    Op::Cancel(n) if !tokens.is_empty() => {
                        let (slot, seq, key) = tokens[n % tokens.len()];
                        let was_live = model.iter().any(|(_, k)| *k == key);
                        prop_assert_eq!(listeners.cancel(slot, seq).is_some(), was_live);
                        model.retain(|(_, k)| *k != key);
                    }
                    Op::Cancel(_) => {}
                    Op::TakeDue(threshold) => {
                        let mut want: Vec<(u64, u64)> =
                            model.iter().copied().filter(|(v, _)| *v <= threshold).collect();
                        want.sort();
                        prop_assert!(want.is_empty() || listeners.any_due(threshold));
                        let mut due: SmallVec<[Due; 4]> = SmallVec::new();
                        listeners.take_due(threshold, &mut due);
                        let got: Vec<u64> = due.iter().map(|(_, key)| *key).collect();
                        let want_keys: Vec<u64> = want.iter().map(|(_, key)| *key).collect();
                        prop_assert_eq!(got, want_keys);
                        model.retain(|(v, _)| *v > threshold);
                        prop_assert!(!listeners.any_due(threshold));
                    }
                    Op::TakeAll => {
                        let mut due: SmallVec<[Due; 4]> = SmallVec::new();
                        listeners.take_all(&mut due);
                        let mut got: Vec<u64> = due.iter().map(|(_, key)| *key).collect();
                        got.sort();
                        let want: Vec<u64> = model.iter().map(|(_, key)| *key).collect();
                        prop_assert_eq!(got, want);
                        model.clear();
                    }
                }
                prop_assert_eq!(listeners.len(), model.len());
                prop_assert!(listeners.order.len() <= 2 * model.len() + STALE_SLACK + 1);
            }
        }
    }
}
