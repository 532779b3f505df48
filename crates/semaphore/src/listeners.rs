//! [`Listeners`]: the one-shot listeners registered on one semaphore, kept under its lock, and
//! the [`ListenToken`] that cancels one.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use slab::Slab;
use smallvec::SmallVec;

use crate::id::SemaphoreId;
use crate::listener::Listener;

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
pub(crate) type Due<E> = (Arc<dyn Listener<E>>, u64);

/// A live listener; its value is in its entry in the order.
struct Entry<E> {
    seq: u64,
    listener: Arc<dyn Listener<E>>,
    key: u64,
}

/// A listener's place in the order of values: `(value, seq, slot)`, smallest first; `seq` grows
/// with registration, so listeners of equal values fire in the order they were registered.
type Place = (u64, u64, usize);

/// The listeners of one semaphore, kept under its lock. The slab's and the order's storage is
/// reused, so registering and firing allocate nothing in steady state.
///
/// The order of values says which are due, so an advance or a device signal costs a look at the
/// smallest value plus a removal per listener it fires, whatever the number listening: a chain of
/// submissions all pending on one semaphore (each listening for the value the one before it
/// signals) would otherwise scan every listener at every step. Listeners mostly come in the
/// order of their values (a chain registers each step after the one before), so those go to the
/// back of a sorted ring, and fire from its front, at a constant cost; one that comes with a
/// smaller value than the ring's last goes to a min-heap beside it, and the smaller of the two
/// fronts fires first. A cancel leaves its place behind, skipped when it comes up (its slot no
/// longer holds that `seq`); both are swept when such places outnumber the live listeners
/// ([`Listeners::sweep`]).
pub(crate) struct Listeners<E> {
    entries: Slab<Entry<E>>,
    /// Places registered in order of value, sorted.
    in_order: VecDeque<Place>,
    /// Places registered below the ring's last value.
    out_of_order: BinaryHeap<Reverse<Place>>,
    next_seq: u64,
}

/// Cancelled entries the heap may hold beyond the live ones before it is swept.
const STALE_SLACK: usize = 16;

impl<E> Listeners<E> {
    pub(crate) fn new() -> Self {
        Listeners {
            // Room for a few from the start: the first wait or listener on a semaphore must
            // not be the one that allocates in a steady state.
            entries: Slab::with_capacity(4),
            in_order: VecDeque::with_capacity(4),
            out_of_order: BinaryHeap::with_capacity(4),
            next_seq: 0,
        }
    }

    /// A list with no storage until its first listener: for one most semaphores never use (the
    /// futures' list), so that creating a semaphore costs no allocation for it.
    pub(crate) fn empty() -> Self {
        Listeners {
            entries: Slab::new(),
            in_order: VecDeque::new(),
            out_of_order: BinaryHeap::new(),
            next_seq: 0,
        }
    }

    pub(crate) fn insert(
        &mut self,
        value: u64,
        listener: &Arc<dyn Listener<E>>,
        key: u64,
    ) -> (usize, u64) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let slot = self.entries.insert(Entry {
            seq,
            listener: Arc::clone(listener),
            key,
        });
        let place = (value, seq, slot);
        if self
            .in_order
            .back()
            .is_none_or(|&(last, _, _)| last <= value)
        {
            self.in_order.push_back(place);
        } else {
            self.out_of_order.push(Reverse(place));
        }
        (slot, seq)
    }

    /// The smallest place of either list (live or not).
    #[inline(always)]
    fn first(&self) -> Option<Place> {
        match (self.in_order.front(), self.out_of_order.peek()) {
            (front, None) => front.copied(),
            (Some(&a), Some(&Reverse(b))) => Some(a.min(b)),
            (None, Some(&Reverse(b))) => Some(b),
        }
    }

    /// Removes the smallest place, which [`first`](Self::first) returned.
    #[inline(always)]
    fn remove_first(&mut self, place: Place) {
        // Places are unique (their `seq` is), so the ring's front is the one or the heap's is.
        if self.in_order.front().is_some_and(|&front| front == place) {
            self.in_order.pop_front();
        } else {
            self.out_of_order.pop();
        }
    }

    pub(crate) fn cancel(&mut self, slot: usize, seq: u64) -> Option<Arc<dyn Listener<E>>> {
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
        self.first().is_some_and(|(value, _, _)| value <= threshold)
    }

    /// Moves every listener waiting for a value `<= threshold` into `due`, smallest value first
    /// (in registration order among equal values).
    pub(crate) fn take_due<const N: usize>(
        &mut self,
        threshold: u64,
        due: &mut SmallVec<[Due<E>; N]>,
    ) {
        while let Some(place @ (value, seq, slot)) = self.first() {
            if value > threshold {
                break;
            }
            self.remove_first(place);
            if live(&self.entries, slot, seq) {
                let entry = self.entries.remove(slot);
                due.push((entry.listener, entry.key));
            }
        }
        self.sweep();
    }

    /// The one listener due at `threshold`, taken, when it is the only one: the ring's front is
    /// live and due, and neither the ring's next place nor the heap's smallest is (the common
    /// case of a chain, one listener for each value it signals). `None` when none is due or more
    /// may be, for [`take_due`](Self::take_due) to sort out.
    pub(crate) fn take_only_due(&mut self, threshold: u64) -> Option<Due<E>> {
        let &(value, seq, slot) = self.in_order.front()?;
        let next_due = |place: Option<&Place>| place.is_some_and(|&(v, _, _)| v <= threshold);
        if value > threshold
            || next_due(self.in_order.get(1))
            || next_due(self.out_of_order.peek().map(|Reverse(place)| place))
            || !live(&self.entries, slot, seq)
        {
            return None;
        }
        self.in_order.pop_front();
        let entry = self.entries.remove(slot);
        self.sweep();
        Some((entry.listener, entry.key))
    }

    /// Drops the places of cancelled listeners once they outnumber the live ones (by
    /// `STALE_SLACK`), in place: both lists keep their capacity (and the ring its order).
    #[inline]
    fn sweep(&mut self) {
        if self.places() > 2 * self.entries.len() + STALE_SLACK {
            self.sweep_now();
        }
    }

    /// The sweep itself, out of line: every firing checks for it, few sweep.
    #[cold]
    fn sweep_now(&mut self) {
        let entries = &self.entries;
        self.in_order
            .retain(|&(_, seq, slot)| live(entries, slot, seq));
        self.out_of_order
            .retain(|&Reverse((_, seq, slot))| live(entries, slot, seq));
    }

    /// Places held, live or not.
    fn places(&self) -> usize {
        self.in_order.len() + self.out_of_order.len()
    }

    /// Moves every listener into `due` (the semaphore failed).
    pub(crate) fn take_all<const N: usize>(&mut self, due: &mut SmallVec<[Due<E>; N]>) {
        due.extend(
            self.entries
                .drain()
                .map(|entry| (entry.listener, entry.key)),
        );
        self.in_order.clear();
        self.out_of_order.clear();
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Whether `slot` still holds the listener registered as `seq` (not fired, not cancelled).
fn live<E>(entries: &Slab<Entry<E>>, slot: usize, seq: u64) -> bool {
    entries.get(slot).is_some_and(|entry| entry.seq == seq)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;
    use smallvec::SmallVec;

    use super::{Due, Listeners, STALE_SLACK};
    use crate::event::NoEvent;
    use crate::id::SemaphoreId;
    use crate::listener::Listener;

    struct Nop;

    impl Listener<NoEvent> for Nop {
        fn notify(&self, _semaphore: SemaphoreId, _key: u64) {}
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64),
        /// Cancels the `n`th token handed out (modulo their number): live, fired or cancelled.
        Cancel(usize),
        TakeDue(u64),
        /// Takes the one listener due, if it is the only one (see `take_only_due`).
        TakeOnlyDue(u64),
        TakeAll,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..30).prop_map(Op::Insert),
            2 => any::<usize>().prop_map(Op::Cancel),
            2 => (0u64..30).prop_map(Op::TakeDue),
            2 => (0u64..30).prop_map(Op::TakeOnlyDue),
            1 => Just(Op::TakeAll),
        ]
    }

    /// A chain's listeners (values in the order they register) never touch the heap: they go
    /// to the back of the ring and fire from its front. One registered below the ring's last
    /// value goes to the heap and still fires in order with the ring's.
    #[test]
    fn listeners_in_value_order_stay_in_the_ring() {
        let listener: Arc<dyn Listener<NoEvent>> = Arc::new(Nop);
        let mut listeners = Listeners::<NoEvent>::new();
        for step in 0..100u64 {
            listeners.insert(step + 1, &listener, step);
        }
        assert_eq!(
            (listeners.in_order.len(), listeners.out_of_order.len()),
            (100, 0)
        );
        let mut due: SmallVec<[Due<NoEvent>; 4]> = SmallVec::new();
        for step in 0..50u64 {
            listeners.take_due(step + 1, &mut due);
            assert_eq!(due.iter().map(|(_, key)| *key).collect::<Vec<_>>(), [step]);
            due.clear();
        }
        // Below the ring's last value (100): into the heap, due before the ring's 52.
        listeners.insert(51, &listener, 1000);
        assert_eq!(listeners.out_of_order.len(), 1);
        listeners.take_due(52, &mut due);
        assert_eq!(
            due.iter().map(|(_, key)| *key).collect::<Vec<_>>(),
            [50, 1000, 51]
        );
    }

    proptest! {
        /// Against a list of live listeners: every listener fires once, when a threshold reaches
        /// its value, smallest value first and in registration order among equals; a cancel of a
        /// fired or cancelled token (its slot maybe reused since) does nothing; `any_due` is
        /// never false when one is due; cancelled entries left in the heap stay bounded.
        #[test]
        fn listeners_match_a_list(ops in proptest::collection::vec(op(), 1..120)) {
            let listener: Arc<dyn Listener<NoEvent>> = Arc::new(Nop);
            let mut listeners = Listeners::<NoEvent>::new();
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
                        let mut due: SmallVec<[Due<NoEvent>; 4]> = SmallVec::new();
                        listeners.take_due(threshold, &mut due);
                        let got: Vec<u64> = due.iter().map(|(_, key)| *key).collect();
                        let want_keys: Vec<u64> = want.iter().map(|(_, key)| *key).collect();
                        prop_assert_eq!(got, want_keys);
                        model.retain(|(v, _)| *v > threshold);
                        prop_assert!(!listeners.any_due(threshold));
                    }
                    Op::TakeOnlyDue(threshold) => {
                        let mut want: Vec<(u64, u64)> =
                            model.iter().copied().filter(|(v, _)| *v <= threshold).collect();
                        want.sort();
                        // It may decline (then nothing changes), but what it takes is the one
                        // listener due, and only when it is the only one.
                        if let Some((_, key)) = listeners.take_only_due(threshold) {
                            prop_assert_eq!(want.len(), 1);
                            prop_assert_eq!(key, want[0].1);
                            model.retain(|(_, k)| *k != key);
                        }
                    }
                    Op::TakeAll => {
                        let mut due: SmallVec<[Due<NoEvent>; 4]> = SmallVec::new();
                        listeners.take_all(&mut due);
                        let mut got: Vec<u64> = due.iter().map(|(_, key)| *key).collect();
                        got.sort();
                        let want: Vec<u64> = model.iter().map(|(_, key)| *key).collect();
                        prop_assert_eq!(got, want);
                        model.clear();
                    }
                }
                prop_assert_eq!(listeners.len(), model.len());
                prop_assert!(listeners.places() <= 2 * model.len() + STALE_SLACK + 1);
            }
        }
    }
}
