//! Host waiters: parked threads registered on the semaphores they wait for.
//!
//! A waiter registers its thread's handle ([`Thread`]) on every semaphore of its wait under that semaphore's
//! lock, checking the condition in the same critical section, and only then parks. A signal that
//! satisfies it after registration therefore finds it and unparks it; one before registration is seen
//! by the check. The thread's park token keeps an unpark that arrives before the park, so nothing
//! is lost in between. That is the whole no-lost-wake-up argument, and it holds for any number
//! of semaphores sharing one thread.

use slab::Slab;
use smallvec::SmallVec;

use crate::sync::Thread;

/// Registered value of a waiter that only wants to hear about a failure (its value is reached).
pub(crate) const FAILURE_ONLY: u64 = u64::MAX;

struct Entry {
    value: u64,
    /// Taken when the waiter is woken, so later advances skip it and the entry stays until its
    /// owner removes it (its slot can't be reused under the owner's feet).
    unparker: Option<Thread>,
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

    pub(crate) fn insert(&mut self, value: u64, unparker: &Thread) -> usize {
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
        out: &mut SmallVec<[Thread; N]>,
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
    pub(crate) fn take_all<const N: usize>(&mut self, out: &mut SmallVec<[Thread; N]>) {
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
fn wake_inline<const N: usize>(out: &mut SmallVec<[Thread; N]>, unparker: Option<Thread>) {
    if let Some(unparker) = unparker {
        if out.len() < N {
            out.push(unparker);
        } else {
            unparker.unpark();
        }
    }
}
