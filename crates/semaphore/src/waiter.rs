//! Host waiters: parked threads registered on the semaphores they wait for.
//!
//! A waiter registers its thread's [`Unparker`] on every semaphore of its wait under that semaphore's
//! lock, checking the condition in the same critical section, and only then parks. A signal that
//! satisfies it after registration therefore finds it and unparks it; one before registration is seen
//! by the check. The parker keeps an unpark that arrives before the park, so nothing is lost in
//! between. That is the whole no-lost-wake-up argument, and it holds for any number of semaphores
//! sharing one parker.

#[cfg(not(loom))]
use std::cell::Cell;

use slab::Slab;
use smallvec::SmallVec;

use crate::sync::{Parker, Unparker};

/// Registered value of a waiter that only wants to hear about a failure (its value is reached).
pub(crate) const FAILURE_ONLY: u64 = u64::MAX;

struct Entry {
    value: u64,
    /// Taken when the waiter is woken, so later advances skip it and the entry stays until its
    /// owner removes it (its slot can't be reused under the owner's feet).
    unparker: Option<Unparker>,
}

/// The parked host waiters of one semaphore, kept under its lock.
pub(crate) struct Waiters {
    entries: Slab<Entry>,
    /// No armed waiter waits for a value below this (a stale-low bound is harmless).
    min_value: u64,
}

impl Waiters {
    pub(crate) fn new() -> Self {
        Waiters {
            // Room for a few from the start: the first wait or listener on a semaphore must
            // not be the one that allocates in a steady state.
            entries: Slab::with_capacity(4),
            min_value: u64::MAX,
        }
    }

    pub(crate) fn insert(&mut self, value: u64, unparker: &Unparker) -> usize {
        self.min_value = self.min_value.min(value);
        self.entries.insert(Entry {
            value,
            unparker: Some(unparker.clone()),
        })
    }

    pub(crate) fn remove(&mut self, slot: usize) {
        if self.entries.contains(slot) {
            self.entries.remove(slot);
        }
    }

    /// Takes the unparker of every armed waiter whose value is `<= value`.
    pub(crate) fn take_reached<const N: usize>(
        &mut self,
        value: u64,
        out: &mut SmallVec<[Unparker; N]>,
    ) {
        if value < self.min_value {
            return;
        }
        let mut min_value = u64::MAX;
        for (_, entry) in self.entries.iter_mut() {
            if entry.unparker.is_none() {
                continue;
            }
            if entry.value <= value {
                wake_inline(out, entry.unparker.take());
            } else {
                min_value = min_value.min(entry.value);
            }
        }
        self.min_value = min_value;
    }

    /// Takes the unparker of every armed waiter (the semaphore failed).
    pub(crate) fn take_all<const N: usize>(&mut self, out: &mut SmallVec<[Unparker; N]>) {
        for (_, entry) in self.entries.iter_mut() {
            wake_inline(out, entry.unparker.take());
        }
        self.min_value = u64::MAX;
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Keeps `unparker` for after the lock while `out` has inline room, and unparks it at once
/// otherwise (a system call under the lock, but only when many waiters wake together), so waking
/// never allocates.
fn wake_inline<const N: usize>(out: &mut SmallVec<[Unparker; N]>, unparker: Option<Unparker>) {
    if let Some(unparker) = unparker {
        if out.len() < N {
            out.push(unparker);
        } else {
            unparker.unpark();
        }
    }
}

#[cfg(not(loom))]
thread_local! {
    /// One parker per thread, reused by every wait on it so a wait allocates nothing.
    static PARKER: Cell<Option<Parker>> = const { Cell::new(None) };
}

/// Borrows this thread's parker (or a fresh one if it is in use or the thread is exiting).
pub(crate) struct ThreadParker {
    parker: Option<Parker>,
}

impl ThreadParker {
    pub(crate) fn take() -> Self {
        // Under loom every wait gets a fresh parker: loom's threads share the OS thread and its
        // thread-locals, and loom objects must not outlive the model execution that made them.
        #[cfg(loom)]
        let parker = Parker::new();
        #[cfg(not(loom))]
        let parker = PARKER
            .try_with(Cell::take)
            .ok()
            .flatten()
            .unwrap_or_default();
        // An unpark meant for an earlier wait may still be pending; consume it now rather than
        // take a spurious turn round the wait loop.
        parker.park_timeout(std::time::Duration::ZERO);
        ThreadParker {
            parker: Some(parker),
        }
    }

    pub(crate) fn parker(&self) -> &Parker {
        // Always `Some` until drop.
        self.parker.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl Drop for ThreadParker {
    fn drop(&mut self) {
        #[cfg(not(loom))]
        if let Some(parker) = self.parker.take() {
            let _ = PARKER.try_with(|cell| cell.set(Some(parker)));
        }
    }
}
