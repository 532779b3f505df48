//! The synchronisation primitives the scheduler core (issue lock, notifier, worker, completion
//! thread, queue start and shutdown) uses, in one place so that the loom models
//! (`tests/loom_scheduler.rs`, built with `RUSTFLAGS="--cfg loom"`) can swap them for loom's
//! checked versions. Normal builds get std's types and crossbeam's parker, unchanged.
//!
//! Under loom: threads, mutexes, condition variables, atomics and the channel are
//! loom's; the parker is the semaphore crate's loom parker (crossbeam's has no loom counterpart);
//! [`Once`] is a flag and a mutex around an `Option` (loom has no `OnceLock`). The host backend (`host/`) is
//! not part of the models and stays on std's types in every build.

#[cfg(not(loom))]
pub(crate) use crossbeam_utils::sync::{Parker, Unparker};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::mpsc;
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::thread;

#[cfg(loom)]
pub(crate) use cuhal_semaphore::loom_sync::{Parker, Unparker};
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::mpsc;
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};
#[cfg(loom)]
pub(crate) use loom::thread;

/// Counters and flags that only [`Queue::stats`](crate::Queue::stats) reads: no decision of the
/// scheduler depends on them, so they are std's atomics in every build (under loom, modelling
/// them would only multiply the interleavings to explore).
pub(crate) use std::sync::atomic::{AtomicBool as StatBool, AtomicU64 as StatU64};

/// A value set at most once (the first `set` wins) and read by cloning: the queue's loss.
/// Reading clones only when a value is set, so the hot path's "is the queue lost?" costs one load.
pub(crate) struct Once<T> {
    #[cfg(not(loom))]
    cell: std::sync::OnceLock<T>,
    #[cfg(loom)]
    cell: Mutex<Option<T>>,
    /// Raised (release) once `cell` holds the value: the cheap check, as `OnceLock::get`'s load.
    #[cfg(loom)]
    set: AtomicBool,
}

impl<T: Clone> Once<T> {
    pub(crate) fn new() -> Self {
        Once {
            #[cfg(not(loom))]
            cell: std::sync::OnceLock::new(),
            #[cfg(loom)]
            cell: Mutex::new(None),
            #[cfg(loom)]
            set: AtomicBool::new(false),
        }
    }

    /// The value, if set.
    pub(crate) fn get(&self) -> Option<T> {
        #[cfg(not(loom))]
        {
            self.cell.get().cloned()
        }
        #[cfg(loom)]
        {
            if !self.set.load(Ordering::Acquire) {
                return None;
            }
            self.cell
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        }
    }

    /// Whether a value is set.
    pub(crate) fn is_set(&self) -> bool {
        #[cfg(not(loom))]
        {
            self.cell.get().is_some()
        }
        #[cfg(loom)]
        {
            self.set.load(Ordering::Acquire)
        }
    }

    /// Sets the value if none is set yet; returns whether this call set it.
    pub(crate) fn set(&self, value: T) -> bool {
        #[cfg(not(loom))]
        {
            self.cell.set(value).is_ok()
        }
        #[cfg(loom)]
        {
            let mut cell = self
                .cell
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if cell.is_some() {
                return false;
            }
            *cell = Some(value);
            self.set.store(true, Ordering::Release);
            true
        }
    }
}
