//! The bookkeeping of a pool of reference-counted slots, without the slots: a per-slot handle
//! count and a free list. The device crate's event pool keeps its `CUevent`s in slots at fixed
//! addresses and counts their handles by hand (so that taking and cloning an event never
//! allocates); the counting and the free list live here, in safe code over this crate's sync
//! shim, so that the loom model (`tests/loom_slot_pool.rs`) checks the same code the pool runs:
//! a slot goes back to the free list exactly once, when its last handle drops, and is never
//! handed out while a handle still refers to it.

use std::sync::PoisonError;

use cuhal_recycle::Recycled;

use crate::sync::{AtomicUsize, Mutex, Ordering, fence};

/// How many handles refer to one slot; zero while the slot is free.
#[derive(Debug)]
pub struct HandleCount(AtomicUsize);

impl Default for HandleCount {
    fn default() -> Self {
        Self::new()
    }
}

impl HandleCount {
    /// A count for a free slot.
    pub fn new() -> Self {
        HandleCount(AtomicUsize::new(0))
    }

    /// Counts one more handle, made from an existing one. Relaxed is enough: the existing handle
    /// keeps the slot out of the free list meanwhile (as `Arc::clone`).
    pub fn clone_handle(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one handle fewer; true when it was the last, after synchronising with every other
    /// handle's release, so the caller may give the slot back.
    #[must_use]
    pub fn release(&self) -> bool {
        if self.0.fetch_sub(1, Ordering::Release) != 1 {
            return false;
        }
        fence(Ordering::Acquire);
        true
    }

    /// Handles now (a snapshot).
    pub fn handles(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// Marks a slot just taken from a free list as having one handle. A slot on a free list has
    /// no handles (one that still had some would be handed out twice): debug builds and the loom
    /// models read the old count to check it. Elsewhere a plain store does, for no other thread
    /// touches a free slot's count (the free list's lock ordered the last release before this
    /// take).
    fn claim(&self) {
        if cfg!(any(debug_assertions, loom)) {
            let was = self.0.swap(1, Ordering::Relaxed);
            assert_eq!(was, 0, "a slot on a free list still had handles");
        } else {
            self.0.store(1, Ordering::Relaxed);
        }
    }
}

/// The free slots of a pool, as whatever names a slot (`T`: an index, a pointer).
pub struct FreeList<T> {
    free: Mutex<Vec<T>>,
}

impl<T> FreeList<T> {
    /// An empty free list with room for `capacity` slots.
    pub fn with_capacity(capacity: usize) -> Self {
        FreeList {
            free: Mutex::new(Vec::with_capacity(capacity)),
        }
    }

    fn lock(&self) -> crate::sync::MutexGuard<'_, Vec<T>> {
        self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a free slot and counts its first handle (`count` finds the slot's [`HandleCount`]);
    /// `None` when no slot is free.
    pub fn take<'a>(&self, count: impl FnOnce(&T) -> &'a HandleCount) -> Option<T> {
        let slot = self.lock().pop()?;
        count(&slot).claim();
        Some(slot)
    }

    /// Takes a free slot through `local`, a list of free slots that one taker keeps: from
    /// `local` if it holds any, else after moving every slot of the free list into it at once.
    /// The free list's lock is then taken once per refill instead of once per take, so a taker
    /// and the threads giving slots back seldom meet on it. `local` must hold free slots only
    /// (taken here), and have room for every slot of the pool, as the free list does (see
    /// [`reserve_total`](Self::reserve_total)): the two swap their storage.
    pub fn take_via<'a, const START: usize>(
        &self,
        local: &mut Recycled<Vec<T>, START>,
        count: impl FnOnce(&T) -> &'a HandleCount,
    ) -> Option<T> {
        if local.is_empty() {
            local.swap_storage(&mut self.lock());
        }
        let slot = local.pop()?;
        count(&slot).claim();
        Some(slot)
    }

    /// Drops one handle of `slot`; if it was the last, the slot goes back on the free list and
    /// this returns true. The slot may be taken again by another thread as soon as it is back.
    pub fn drop_handle(&self, slot: T, count: &HandleCount) -> bool {
        if !count.release() {
            return false;
        }
        self.lock().push(slot);
        true
    }

    /// Puts a slot that was never handed out (no handles) on the free list: a pool that
    /// creates several slots at once keeps the spare ones here.
    pub fn add_new(&self, slot: T) {
        self.lock().push(slot);
    }

    /// Makes room for `total` free slots, so that giving slots back never allocates; called when
    /// the pool grows.
    pub fn reserve_total(&self, total: usize) {
        let mut free = self.lock();
        let extra = total.saturating_sub(free.len());
        free.reserve(extra);
    }

    /// Free slots now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no slot is free now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
