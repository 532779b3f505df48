//! What [`Recycled`](crate::Recycled) needs of the list it keeps: `Vec`, `SmallVec` and
//! `VecDeque` provide it.

use std::collections::VecDeque;

use smallvec::{Array, SmallVec};

/// A growable list whose room [`Recycled`](crate::Recycled) manages: it asks for exact growth
/// and never for less room, and pushes only where room is made.
pub trait Storage: Default {
    /// What the list holds.
    type Item;

    /// An empty list with room for `capacity` items.
    fn with_capacity(capacity: usize) -> Self;

    /// Items held.
    fn len(&self) -> usize;

    /// Whether it holds none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Items it holds without growing (inline room included).
    fn capacity(&self) -> usize;

    /// Makes room for `additional` more items than it holds, and no more than that if it can.
    fn reserve_exact(&mut self, additional: usize);

    /// Adds `item` at the end.
    fn push(&mut self, item: Self::Item);

    /// Removes the last item.
    fn pop(&mut self) -> Option<Self::Item>;

    /// The last item.
    fn last(&self) -> Option<&Self::Item>;

    /// Removes every item and keeps the room.
    fn clear(&mut self);

    /// Where the next [`push`](Self::push) writes: only a hint for a prefetch, so it may point
    /// anywhere (null, or past the storage when it is full).
    fn next_slot(&self) -> *const Self::Item;
}

impl<T> Storage for Vec<T> {
    type Item = T;

    fn with_capacity(capacity: usize) -> Self {
        Vec::with_capacity(capacity)
    }

    #[inline]
    fn len(&self) -> usize {
        Vec::len(self)
    }

    #[inline]
    fn capacity(&self) -> usize {
        Vec::capacity(self)
    }

    fn reserve_exact(&mut self, additional: usize) {
        Vec::reserve_exact(self, additional);
    }

    #[inline]
    fn push(&mut self, item: T) {
        Vec::push(self, item);
    }

    #[inline]
    fn pop(&mut self) -> Option<T> {
        Vec::pop(self)
    }

    #[inline]
    fn last(&self) -> Option<&T> {
        <[T]>::last(self)
    }

    #[inline]
    fn clear(&mut self) {
        Vec::clear(self);
    }

    #[inline]
    fn next_slot(&self) -> *const T {
        self.as_ptr().wrapping_add(self.len())
    }
}

impl<A: Array> Storage for SmallVec<A> {
    type Item = A::Item;

    fn with_capacity(capacity: usize) -> Self {
        SmallVec::with_capacity(capacity)
    }

    #[inline]
    fn len(&self) -> usize {
        SmallVec::len(self)
    }

    #[inline]
    fn capacity(&self) -> usize {
        SmallVec::capacity(self)
    }

    fn reserve_exact(&mut self, additional: usize) {
        SmallVec::reserve_exact(self, additional);
    }

    #[inline]
    fn push(&mut self, item: A::Item) {
        SmallVec::push(self, item);
    }

    #[inline]
    fn pop(&mut self) -> Option<A::Item> {
        SmallVec::pop(self)
    }

    #[inline]
    fn last(&self) -> Option<&A::Item> {
        <[A::Item]>::last(self)
    }

    #[inline]
    fn clear(&mut self) {
        // Truncates: spilled storage stays spilled.
        SmallVec::clear(self);
    }

    #[inline]
    fn next_slot(&self) -> *const A::Item {
        self.as_ptr().wrapping_add(self.len())
    }
}

impl<T> Storage for VecDeque<T> {
    type Item = T;

    fn with_capacity(capacity: usize) -> Self {
        VecDeque::with_capacity(capacity)
    }

    #[inline]
    fn len(&self) -> usize {
        VecDeque::len(self)
    }

    #[inline]
    fn capacity(&self) -> usize {
        VecDeque::capacity(self)
    }

    fn reserve_exact(&mut self, additional: usize) {
        VecDeque::reserve_exact(self, additional);
    }

    #[inline]
    fn push(&mut self, item: T) {
        self.push_back(item);
    }

    #[inline]
    fn pop(&mut self) -> Option<T> {
        self.pop_back()
    }

    #[inline]
    fn last(&self) -> Option<&T> {
        self.back()
    }

    #[inline]
    fn clear(&mut self) {
        VecDeque::clear(self);
    }

    /// The slot after the last item: where the ring wraps or is full that is memory of no use,
    /// or no memory at all, and the hint is wasted, nothing more.
    #[inline]
    fn next_slot(&self) -> *const T {
        self.back().map_or(std::ptr::null(), |last| {
            std::ptr::from_ref(last).wrapping_add(1)
        })
    }
}
