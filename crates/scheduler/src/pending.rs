//! The pending actions of one queue: a slab (slots reused, so steady state allocates nothing)
//! threaded by an intrusive doubly linked list in submission order. The list gives the issue
//! order; the links let an action that fails in the middle leave in O(1).

use cuhal_semaphore::ListenToken;
use slab::Slab;

use crate::action::Boxed;
use crate::backend::Backend;

const NONE: usize = usize::MAX;

/// What a pending action is waiting for.
#[derive(Clone, Copy)]
pub(crate) enum Waiting {
    /// Every wait was reached or device-waitable when last examined: issue it when it reaches the
    /// head of the list.
    Ready,
    /// A listener is registered on wait `index`; waits before it were satisfied.
    Listening { index: usize, token: ListenToken },
}

pub(crate) struct Pending<B: Backend> {
    pub(crate) body: Boxed<B>,
    pub(crate) generation: u32,
    pub(crate) waiting: Waiting,
    prev: usize,
    next: usize,
}

/// A listener key: the slab slot and the generation of the action in it, so a notification for
/// an action that is gone (and whose slot was reused) is recognised and ignored.
pub(crate) fn key(slot: usize, generation: u32) -> u64 {
    (u64::from(generation) << 32) | slot as u64
}

fn split(key: u64) -> (usize, u32) {
    ((key & 0xffff_ffff) as usize, (key >> 32) as u32)
}

pub(crate) struct PendingList<B: Backend> {
    slab: Slab<Pending<B>>,
    head: usize,
    tail: usize,
    generation: u32,
}

impl<B: Backend> PendingList<B> {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        PendingList {
            slab: Slab::with_capacity(capacity),
            head: NONE,
            tail: NONE,
            generation: 0,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.head == NONE
    }

    pub(crate) fn len(&self) -> usize {
        self.slab.len()
    }

    /// Appends an action; returns its slot and listener key.
    pub(crate) fn push_back(&mut self, body: Boxed<B>, waiting: Waiting) -> (usize, u64) {
        let (slot, key) = self.insert(body, waiting, self.tail, NONE);
        if self.tail == NONE {
            self.head = slot;
        } else {
            self.slab[self.tail].next = slot;
        }
        self.tail = slot;
        (slot, key)
    }

    /// Puts an action back at the head (it was taken out for issue and must wait again).
    pub(crate) fn push_front(&mut self, body: Boxed<B>, waiting: Waiting) -> (usize, u64) {
        let (slot, key) = self.insert(body, waiting, NONE, self.head);
        if self.head == NONE {
            self.tail = slot;
        } else {
            self.slab[self.head].prev = slot;
        }
        self.head = slot;
        (slot, key)
    }

    /// Stores an action between `prev` and `next` under a new generation (the links of its
    /// neighbours are the caller's); returns its slot and listener key.
    fn insert(
        &mut self,
        body: Boxed<B>,
        waiting: Waiting,
        prev: usize,
        next: usize,
    ) -> (usize, u64) {
        self.generation = self.generation.wrapping_add(1);
        let generation = self.generation;
        let slot = self.slab.insert(Pending {
            body,
            generation,
            waiting,
            prev,
            next,
        });
        (slot, key(slot, generation))
    }

    pub(crate) fn get_mut(&mut self, slot: usize) -> &mut Pending<B> {
        &mut self.slab[slot]
    }

    /// The slot of the live action `key` names, if it is still pending.
    pub(crate) fn find(&self, key: u64) -> Option<usize> {
        let (slot, generation) = split(key);
        match self.slab.get(slot) {
            Some(pending) if pending.generation == generation => Some(slot),
            _ => None,
        }
    }

    /// The head's slot, if it is ready to issue.
    pub(crate) fn ready_head(&self) -> Option<usize> {
        match self.slab.get(self.head) {
            Some(Pending {
                waiting: Waiting::Ready,
                ..
            }) => Some(self.head),
            _ => None,
        }
    }

    pub(crate) fn head(&self) -> Option<usize> {
        (self.head != NONE).then_some(self.head)
    }

    /// Unlinks and removes the action in `slot`.
    pub(crate) fn remove(&mut self, slot: usize) -> Pending<B> {
        let pending = self.slab.remove(slot);
        if pending.prev == NONE {
            self.head = pending.next;
        } else {
            self.slab[pending.prev].next = pending.next;
        }
        if pending.next == NONE {
            self.tail = pending.prev;
        } else {
            self.slab[pending.next].prev = pending.prev;
        }
        pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_reject_reused_slots() {
        assert_eq!(split(key(7, 3)), (7, 3));
        assert_eq!(split(key(0xffff_fffe, u32::MAX)), (0xffff_fffe, u32::MAX));
    }
}
