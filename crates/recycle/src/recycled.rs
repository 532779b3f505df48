//! [`Recycled`]: a list whose storage is kept for the next use.

use std::collections::VecDeque;
use std::ops::RangeBounds;

use smallvec::{Array, SmallVec};

use crate::prefetch;
use crate::storage::Storage;

/// A list (`S`: a [`Vec`], a [`SmallVec`], a [`VecDeque`]) whose storage is kept for reuse, so
/// that a list filled and emptied over and over allocates only at new high-water marks.
///
/// - **Growth**: a full list grows to twice its room, or to `START` if that is more: from empty
///   (or from its inline room) to `START`, then `2 * START`, `4 * START`... A list whose length
///   creeps up allocates a logarithmic number of times, and never for a few items at a time.
/// - **Kept room**: emptying ([`clear`](Self::clear), [`pop`](Self::pop), `drain`) never gives
///   room back, and a `SmallVec` that once spilled past its inline room keeps its heap storage:
///   the next use of the same size allocates nothing. Only [`swap_storage`](Self::swap_storage)
///   exchanges the storage whole.
/// - **Warm slots**: the slot the next push writes, or what the next pop hands out, can be
///   prefetched for writing ([`prefetch_next_push`](Self::prefetch_next_push),
///   [`pop_warm`](Self::pop_warm)), for lists that another core emptied last.
///
/// Every method that adds is `#[inline]` or generic, and the type is its list and nothing more
/// (`START` is a const parameter): a push costs a compare of length and room before the list's
/// own push.
///
/// Reads go through [`Deref`](std::ops::Deref) to the list itself; every way of adding items
/// goes through the growth above.
///
/// ```
/// use cuhal_recycle::Recycled;
///
/// let mut list = Recycled::<Vec<u32>, 16>::new();
/// list.push(1);
/// assert_eq!(list.capacity(), 16);
/// list.extend(2..=17);
/// assert_eq!(list.capacity(), 32);
/// list.clear();
/// assert_eq!(list.capacity(), 32);
/// ```
#[derive(Clone, Debug, Default)]
pub struct Recycled<S, const START: usize> {
    storage: S,
}

/// The room a list of `capacity` grows to: twice as much, at least `start`, and at least one more
/// (a `START` of 0 still grows).
const fn grown(start: usize, capacity: usize) -> usize {
    let doubled = capacity.saturating_mul(2);
    let at_least = if start > capacity {
        start
    } else {
        capacity.saturating_add(1)
    };
    if doubled > at_least {
        doubled
    } else {
        at_least
    }
}

impl<S: Storage, const START: usize> Recycled<S, START> {
    /// An empty list that makes room for `START` items at its first push.
    pub fn new() -> Self {
        Recycled {
            storage: S::default(),
        }
    }

    /// An empty list with room for `capacity` items up front; it doubles from there.
    pub fn with_capacity(capacity: usize) -> Self {
        Recycled {
            storage: S::with_capacity(capacity),
        }
    }

    /// The room the list grows to when it is next full: [`grown`](Self::grown) of its room.
    pub fn next_capacity(&self) -> usize {
        grown(START, self.storage.capacity())
    }

    /// Adds `item` at the end, growing the list first if it is full.
    #[inline]
    pub fn push(&mut self, item: S::Item) {
        if self.storage.len() == self.storage.capacity() {
            self.grow();
        }
        self.storage.push(item);
    }

    /// Grows the list once, to [`next_capacity`](Self::next_capacity).
    #[cold]
    #[inline(never)]
    pub fn grow(&mut self) {
        let target = self.next_capacity();
        self.storage.reserve_exact(target - self.storage.len());
    }

    /// Makes room for `total` items in all, growing by doubling until there is (nothing when
    /// there is already): a list that must be able to take every item of a pool, say.
    pub fn reserve_total(&mut self, total: usize) {
        let mut target = self.storage.capacity();
        if target >= total {
            return;
        }
        while target < total {
            target = grown(START, target);
        }
        self.storage.reserve_exact(target - self.storage.len());
    }

    /// Adds every item of `items` at the end, growing as [`push`](Self::push) does.
    pub fn extend(&mut self, items: impl IntoIterator<Item = S::Item>) {
        let items = items.into_iter();
        let (at_least, _) = items.size_hint();
        self.reserve_total(self.storage.len().saturating_add(at_least));
        for item in items {
            self.push(item);
        }
    }

    /// Adds `count` items made by `make` at the end (stopping at its first `None`), after making
    /// room for them by doubling: the refill of a pool of spares that ran dry, `count` being
    /// what [`grown`](Self::grown) of the objects it made allows. Returns how many were added.
    pub fn refill(&mut self, count: usize, mut make: impl FnMut() -> Option<S::Item>) -> usize {
        self.reserve_total(self.storage.len().saturating_add(count));
        let mut added = 0;
        while added < count {
            let Some(item) = make() else { break };
            self.storage.push(item);
            added += 1;
        }
        added
    }

    /// Removes the last item.
    #[inline]
    pub fn pop(&mut self) -> Option<S::Item> {
        self.storage.pop()
    }

    /// Removes the last item, and warms what `target` of the item left last points at, which
    /// the next pop hands out (see [`prefetch`]): for a pool whose items another core gave back.
    #[inline]
    pub fn pop_warm<U>(&mut self, target: impl FnOnce(&S::Item) -> *const U) -> Option<S::Item> {
        let item = self.storage.pop();
        self.prefetch_last(target);
        item
    }

    /// Warms what `target` of the last item points at (see [`pop_warm`](Self::pop_warm)).
    #[inline]
    pub fn prefetch_last<U>(&self, target: impl FnOnce(&S::Item) -> *const U) {
        if let Some(last) = self.storage.last() {
            prefetch::for_write(target(last));
        }
    }

    /// Warms the slot the next [`push`](Self::push) writes, for a list that another core
    /// emptied last (see [`prefetch`]).
    #[inline]
    pub fn prefetch_next_push(&self) {
        prefetch::for_write(self.storage.next_slot());
    }

    /// Removes every item and keeps the room.
    #[inline]
    pub fn clear(&mut self) {
        self.storage.clear();
    }

    /// Exchanges this list's storage with `other`'s: two sides that hand each other a whole
    /// list at once (the room goes with the storage; such sides keep enough on both, see
    /// [`reserve_total`](Self::reserve_total)).
    #[inline]
    pub fn swap_storage(&mut self, other: &mut S) {
        std::mem::swap(&mut self.storage, other);
    }
}

impl<S, const START: usize> Recycled<S, START> {
    /// What `reached` items (a room, or the objects a pool made) grow to: twice as many, at
    /// least `START`, at least one more. The one growth policy: pools that count the objects
    /// they made grow them by it, as every list grows its room by it.
    pub const fn grown(reached: usize) -> usize {
        grown(START, reached)
    }
}

impl<S, const START: usize> std::ops::Deref for Recycled<S, START> {
    type Target = S;

    #[inline]
    fn deref(&self) -> &S {
        &self.storage
    }
}

impl<'a, S, const START: usize> IntoIterator for &'a Recycled<S, START>
where
    &'a S: IntoIterator,
{
    type Item = <&'a S as IntoIterator>::Item;
    type IntoIter = <&'a S as IntoIterator>::IntoIter;

    #[inline]
    fn into_iter(self) -> Self::IntoIter {
        self.storage.into_iter()
    }
}

impl<S: Storage, const START: usize> Extend<S::Item> for Recycled<S, START> {
    fn extend<I: IntoIterator<Item = S::Item>>(&mut self, items: I) {
        Recycled::extend(self, items);
    }
}

impl<T, const START: usize> Recycled<Vec<T>, START> {
    /// Moves every item of `other` to the end, leaving `other` empty (its room kept).
    pub fn append(&mut self, other: &mut Vec<T>) {
        self.reserve_total(self.storage.len().saturating_add(other.len()));
        self.storage.append(other);
    }

    /// Removes the items in `range`, keeping the room.
    pub fn drain(&mut self, range: impl RangeBounds<usize>) -> std::vec::Drain<'_, T> {
        self.storage.drain(range)
    }

    /// Adds clones of `items` at the end, growing as [`push`](Self::push) does.
    pub fn extend_from_slice(&mut self, items: &[T])
    where
        T: Clone,
    {
        self.reserve_total(self.storage.len().saturating_add(items.len()));
        self.storage.extend_from_slice(items);
    }

    /// The items, to change in place (their number and the room stay).
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.storage
    }
}

impl<A: Array, const START: usize> Recycled<SmallVec<A>, START> {
    /// Removes the items in `range`, keeping the room (spilled storage included).
    pub fn drain(&mut self, range: impl RangeBounds<usize>) -> smallvec::Drain<'_, A> {
        self.storage.drain(range)
    }
}

impl<T, const START: usize> Recycled<VecDeque<T>, START> {
    /// Inserts `item` at `index` (items from there on move one place back), growing the ring
    /// first if it is full.
    pub fn insert(&mut self, index: usize, item: T) {
        if self.storage.len() == self.storage.capacity() {
            self.grow();
        }
        self.storage.insert(index, item);
    }

    /// Removes the first item.
    #[inline]
    pub fn pop_front(&mut self) -> Option<T> {
        self.storage.pop_front()
    }

    /// Removes the items in `range`, keeping the room.
    pub fn drain(
        &mut self,
        range: impl RangeBounds<usize>,
    ) -> std::collections::vec_deque::Drain<'_, T> {
        self.storage.drain(range)
    }
}

#[cfg(test)]
mod tests {
    use super::grown;

    #[test]
    fn growth_doubles_from_the_start() {
        assert_eq!(grown(16, 0), 16);
        assert_eq!(grown(16, 4), 16);
        assert_eq!(grown(16, 8), 16);
        assert_eq!(grown(16, 9), 18);
        assert_eq!(grown(16, 16), 32);
        assert_eq!(grown(0, 0), 1);
        assert_eq!(grown(1, 0), 1);
        assert_eq!(grown(0, 1), 2);
        assert_eq!(grown(16, usize::MAX), usize::MAX);
    }
}
