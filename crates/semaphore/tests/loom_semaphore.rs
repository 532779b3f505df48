//! loom models of the semaphore: every interleaving (up to `LOOM_MAX_PREEMPTIONS` preemptions)
//! of signals, waits, failures and listeners racing on one semaphore. Built and run only with
//! `RUSTFLAGS="--cfg loom"` (`cargo xtask ci` does it); the crate then uses loom's mutexes,
//! atomics and a loom parker (see `src/sync.rs`).
#![cfg(loom)]

mod common;

use std::sync::Arc as StdArc;

use cuhal_semaphore::{
    Error, Failure, Listener, NoEvent, Semaphore, SemaphoreId, SemaphoreOptions, Timeout,
};
use loom::thread;

use common::loom::model;

/// Host-only semaphores whose waits never spin on events (loom has no time to spin against).
fn semaphore(initial: u64) -> Semaphore<NoEvent> {
    Semaphore::with_options(initial, SemaphoreOptions::new().without_event_queries())
}

/// A waiter parked for a value never misses the signal that reaches it, whichever comes first:
/// the wait's check, its registration, its park, or the signal. (A lost wake-up deadlocks, which
/// loom reports.)
#[test]
fn signal_wakes_waiter() {
    model("semaphore::signal_wakes_waiter", || {
        let s = semaphore(0);
        let signaller = s.clone();
        let t = thread::spawn(move || signaller.signal(1).unwrap());
        s.wait(1, Timeout::Infinite).unwrap();
        assert_eq!(s.query().unwrap(), 1);
        t.join().unwrap();
        assert_eq!(s.waiter_count(), 0);
    });
}

/// Two signals racing with a waiter for the higher value: the waiter wakes only once the value
/// is reached, and the value never goes backwards (the losing signal sees `NotMonotonic`).
#[test]
fn racing_signals_and_waiter() {
    model("semaphore::racing_signals_and_waiter", || {
        let s = semaphore(0);
        let (a, b) = (s.clone(), s.clone());
        let ta = thread::spawn(move || a.signal(1));
        let tb = thread::spawn(move || b.signal(2));
        s.wait(2, Timeout::Infinite).unwrap();
        assert_eq!(s.query().unwrap(), 2);
        let ra = ta.join().unwrap();
        tb.join().unwrap().unwrap();
        // Signal 1 either came first or found 2 already there.
        match ra {
            Ok(()) => {}
            Err(Error::NotMonotonic { current, requested }) => {
                assert_eq!((current, requested), (2, 1));
            }
            Err(other) => panic!("unexpected {other:?}"),
        }
    });
}

/// Two failures racing with a signal and a parked waiter: the waiter wakes with a failure, the
/// first failure is the one kept (every observer sees the same one), and a signal after it fails.
#[test]
fn first_failure_kept() {
    model("semaphore::first_failure_kept", || {
        let s = semaphore(0);
        let (a, b) = (s.clone(), s.clone());
        let fa = Failure::msg("a");
        let fb = Failure::msg("b");
        let (ka, kb) = (fa.clone(), fb.clone());
        let ta = thread::spawn(move || a.fail(ka));
        let tb = thread::spawn(move || b.fail(kb));
        let waited = s.wait(5, Timeout::Infinite);
        ta.join().unwrap();
        tb.join().unwrap();
        let kept = s.failure().expect("failed");
        assert!(kept.ptr_eq(&fa) || kept.ptr_eq(&fb));
        match waited {
            Err(Error::Failed(seen)) => assert!(seen.ptr_eq(&kept), "waiter saw another failure"),
            other => panic!("waiter: {other:?}"),
        }
        match s.signal(1) {
            Err(Error::Failed(seen)) => assert!(seen.ptr_eq(&kept)),
            other => panic!("signal after failure: {other:?}"),
        }
    });
}

/// A signal racing with a failure and a waiter: the waiter ends either reached (the signal came
/// first) or with the kept failure, never parked for ever.
#[test]
fn signal_vs_fail_vs_wait() {
    model("semaphore::signal_vs_fail_vs_wait", || {
        let s = semaphore(0);
        let (a, b) = (s.clone(), s.clone());
        let failure = Failure::msg("lost");
        let f = failure.clone();
        let ta = thread::spawn(move || {
            let _ = a.signal(1);
        });
        let tb = thread::spawn(move || b.fail(f));
        let waited = s.wait(1, Timeout::Infinite);
        ta.join().unwrap();
        tb.join().unwrap();
        assert!(s.failure().expect("failed").ptr_eq(&failure));
        match waited {
            Ok(()) => {}
            Err(Error::Failed(seen)) => assert!(seen.ptr_eq(&failure)),
            Err(other) => panic!("waiter: {other:?}"),
        }
    });
}

/// Counts notifications per key.
struct Count(loom::sync::atomic::AtomicUsize);

impl<E> Listener<E> for Count {
    fn notify(&self, _semaphore: SemaphoreId, _key: u64) {
        self.0.fetch_add(1, loom::sync::atomic::Ordering::SeqCst);
    }
}

/// A listener registered while a signal and a failure race fires exactly once: at
/// registration if the value is already reached or the semaphore failed, else on the change.
#[test]
fn listener_fires_once() {
    model("semaphore::listener_fires_once", || {
        let s = semaphore(0);
        let count = StdArc::new(Count(loom::sync::atomic::AtomicUsize::new(0)));
        let listener: StdArc<dyn Listener<NoEvent>> = count.clone();
        let (a, b) = (s.clone(), s.clone());
        let ta = thread::spawn(move || {
            let _ = a.signal(1);
        });
        let tb = thread::spawn(move || b.fail(Failure::msg("x")));
        s.listen(1, &listener, 7);
        ta.join().unwrap();
        tb.join().unwrap();
        assert_eq!(count.0.load(loom::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(s.listener_count(), 0);
    });
}
