//! The crate's one way to take a mutex, so tests can count lock acquisitions.
//!
//! Tracing at `Off` promises to take no lock at all; the tests check it with the per-thread
//! counter below (compiled only into the crate's own tests, so release builds pay nothing).

use std::sync::{Mutex, MutexGuard, PoisonError};

#[cfg(test)]
thread_local! {
    static LOCKS_TAKEN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Locks `mutex`, ignoring poisoning: every critical section here leaves its data consistent
/// before anything in it can panic.
#[inline]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(test)]
    LOCKS_TAKEN.with(|n| n.set(n.get() + 1));
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Locks `mutex` if nobody holds it (ignoring poisoning, as [`lock`] does); `None` if it is held.
#[inline]
pub(crate) fn try_lock<T>(mutex: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    #[cfg(test)]
    LOCKS_TAKEN.with(|n| n.set(n.get() + 1));
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Locks taken by this thread so far (tests only).
#[cfg(test)]
pub(crate) fn locks_taken_on_this_thread() -> u64 {
    LOCKS_TAKEN.with(|n| n.get())
}
