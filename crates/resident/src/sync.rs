//! The synchronisation primitives the ring and the doorbell use, in one place so that the loom
//! models (`tests/loom_ring.rs`, built with `RUSTFLAGS="--cfg loom"`) can swap them for loom's
//! checked versions. Normal builds get std's types, unchanged.

#[cfg(not(loom))]
use std::cell::UnsafeCell;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};

/// A cell the producer writes and the consumer reads, ordered by the ring's sequence numbers.
/// Under loom it is loom's checked cell, which reports a read racing a write. Otherwise it is a
/// `T` in memory (`repr(transparent)`), so a device can read it where the host wrote it.
#[cfg_attr(not(loom), repr(transparent))]
pub(crate) struct RaceCell<T> {
    #[cfg(not(loom))]
    cell: UnsafeCell<T>,
    #[cfg(loom)]
    cell: loom::cell::UnsafeCell<T>,
}

impl<T: Copy> RaceCell<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            #[cfg(not(loom))]
            cell: UnsafeCell::new(value),
            #[cfg(loom)]
            cell: loom::cell::UnsafeCell::new(value),
        }
    }

    /// Copies the value out.
    ///
    /// # Safety
    ///
    /// No write of this cell may run concurrently (the ring's sequence numbers order them).
    pub(crate) unsafe fn read(&self) -> T {
        #[cfg(not(loom))]
        {
            // SAFETY: the caller guarantees no concurrent write; `T: Copy`.
            unsafe { *self.cell.get() }
        }
        #[cfg(loom)]
        {
            // SAFETY: as above; loom checks the claim.
            self.cell.with(|p| unsafe { *p })
        }
    }

    /// Overwrites the value.
    ///
    /// # Safety
    ///
    /// No read or write of this cell may run concurrently.
    pub(crate) unsafe fn write(&self, value: T) {
        #[cfg(not(loom))]
        {
            // SAFETY: the caller guarantees exclusive access for the write.
            unsafe { *self.cell.get() = value }
        }
        #[cfg(loom)]
        {
            // SAFETY: as above; loom checks the claim.
            self.cell.with_mut(|p| unsafe { *p = value })
        }
    }
}
