//! The synchronisation primitives this crate uses, in one place so that the loom models
//! (`tests/loom_semaphore.rs`, built with `RUSTFLAGS="--cfg loom"`) can swap them for loom's
//! checked versions. Normal builds get std's types, unchanged; a host waiter parks its own
//! thread ([`park`], [`Thread::unpark`]), which allocates nothing and needs no per-thread cache.
//!
//! The module [`loom_parker`] is for the scheduler's loom models (its worker and completion
//! threads park on a parker of their own).
//!
//! crossbeam's `Parker` has no loom counterpart; under loom it is a token under a `Mutex` with a
//! `Condvar`, which has the same contract (an unpark before the park is kept; one token at most).
//! loom has no time, so under loom a timed park with a non-zero timeout parks until unparked: the
//! models only use untimed waits (and waits without event queries, since a wait with events to
//! query parks for a while only, to look at them again).

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::thread::{Thread, current as current_thread, park, park_timeout};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};
#[cfg(loom)]
pub(crate) use loom::thread::{Thread, current as current_thread, park};

/// loom has no time: a timed park parks until unparked (the models only use untimed waits).
#[cfg(loom)]
pub(crate) fn park_timeout(_timeout: std::time::Duration) {
    park();
}

#[cfg(loom)]
pub(crate) mod loom_parker {
    use std::sync::PoisonError;
    use std::time::{Duration, Instant};

    use loom::sync::{Arc, Condvar, Mutex};

    struct Inner {
        token: Mutex<bool>,
        condvar: Condvar,
    }

    /// A parker with crossbeam's contract, built from loom's mutex and condition variable.
    pub struct Parker {
        unparker: Unparker,
    }

    /// Wakes its [`Parker`]'s thread, or keeps the token for its next park.
    #[derive(Clone)]
    pub struct Unparker(Arc<Inner>);

    impl Default for Parker {
        fn default() -> Self {
            Parker {
                unparker: Unparker(Arc::new(Inner {
                    token: Mutex::new(false),
                    condvar: Condvar::new(),
                })),
            }
        }
    }

    impl Parker {
        /// A parker with no token.
        pub fn new() -> Self {
            Self::default()
        }

        /// The handle that wakes this parker.
        pub fn unparker(&self) -> &Unparker {
            &self.unparker
        }

        /// Waits for the token (returns at once if an unpark left one) and consumes it.
        pub fn park(&self) {
            let inner = &self.unparker.0;
            let mut token = inner.token.lock().unwrap_or_else(PoisonError::into_inner);
            while !*token {
                token = inner
                    .condvar
                    .wait(token)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            *token = false;
        }

        /// A zero timeout only consumes a pending token; any other parks until unparked.
        pub fn park_timeout(&self, timeout: Duration) {
            if timeout.is_zero() {
                let inner = &self.unparker.0;
                *inner.token.lock().unwrap_or_else(PoisonError::into_inner) = false;
            } else {
                self.park();
            }
        }

        /// Parks until unparked (loom has no time).
        pub fn park_deadline(&self, _deadline: Instant) {
            self.park();
        }
    }

    impl Unparker {
        /// Leaves the token and wakes the parked thread, if any.
        pub fn unpark(&self) {
            let inner = &self.0;
            *inner.token.lock().unwrap_or_else(PoisonError::into_inner) = true;
            inner.condvar.notify_one();
        }
    }
}
