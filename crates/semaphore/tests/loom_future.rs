//! loom models of the semaphore's futures: a pending future's registration, a later poll's
//! waker replacing the earlier one, and a drop, each racing the signal that reaches the value.
//! A lost wake-up shows as a future left pending with no wake. Built and run only with
//! `RUSTFLAGS="--cfg loom"` (`cargo xtask ci` does it).
#![cfg(loom)]

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc as StdArc;
use std::task::{Context, Poll, Wake, Waker};

use cuhal_semaphore::loom_sync::{Parker, Unparker};
use cuhal_semaphore::{NoEvent, Semaphore, SemaphoreOptions, wait_all_async};
use loom::thread;

use common::loom::model;

/// Host-only semaphores whose waits never spin on events (loom has no time to spin against).
fn semaphore(initial: u64) -> Semaphore<NoEvent> {
    Semaphore::with_options(initial, SemaphoreOptions::new().without_event_queries())
}

/// A waker that counts its wakes (a loom atomic, so the models see every ordering of them).
struct Count(loom::sync::atomic::AtomicUsize);

impl Wake for Count {
    fn wake(self: StdArc<Self>) {
        self.0.fetch_add(1, loom::sync::atomic::Ordering::SeqCst);
    }
}

impl Count {
    fn waker() -> (StdArc<Count>, Waker) {
        let count = StdArc::new(Count(loom::sync::atomic::AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    fn wakes(&self) -> usize {
        self.0.load(loom::sync::atomic::Ordering::SeqCst)
    }
}

/// Wakes a thread blocked in [`block_on`], through the crate's loom parker (loom's own
/// `thread::unpark` would also end a wait for a mutex, which loom then reports as an error).
struct Unpark(Unparker);

impl Wake for Unpark {
    fn wake(self: StdArc<Self>) {
        self.0.unpark();
    }
}

/// Polls `future` until it resolves, parking between polls (a lost wake-up leaves the thread
/// parked for ever, which loom reports as a deadlock).
fn block_on<F: Future + Unpin>(mut future: F) -> F::Output {
    let parker = Parker::new();
    let waker = Waker::from(StdArc::new(Unpark(parker.unparker().clone())));
    loop {
        if let Poll::Ready(output) = poll(&mut future, &waker) {
            return output;
        }
        parker.park();
    }
}

fn poll<F: Future + Unpin>(future: &mut F, waker: &Waker) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(waker))
}

/// A poll that registers while another thread signals: either the poll resolves, or the
/// signal wakes the waker it left (once), and the next poll resolves.
#[test]
fn register_vs_signal() {
    model("future::register_vs_signal", || {
        let s = semaphore(0);
        let signaller = s.clone();
        let t = thread::spawn(move || signaller.signal(1).unwrap());
        let (count, waker) = Count::waker();
        let mut wait = s.wait_async(1);
        match poll(&mut wait, &waker) {
            Poll::Ready(result) => {
                result.unwrap();
                t.join().unwrap();
                assert_eq!(count.wakes(), 0);
            }
            Poll::Pending => {
                t.join().unwrap();
                assert_eq!(count.wakes(), 1, "a pending future missed its signal");
                assert!(matches!(poll(&mut wait, &waker), Poll::Ready(Ok(()))));
            }
        }
        assert_eq!(s.listener_count(), 0);
    });
}

/// A second poll with another waker (a task moved by its executor) while the signal races:
/// if that poll is pending, its waker, not only the first's, is woken.
#[test]
fn waker_replacement_vs_signal() {
    model("future::waker_replacement_vs_signal", || {
        let s = semaphore(0);
        let signaller = s.clone();
        let (_first, first_waker) = Count::waker();
        let (second, second_waker) = Count::waker();
        let mut wait = s.wait_async(1);
        let t = thread::spawn(move || signaller.signal(1).unwrap());
        if poll(&mut wait, &first_waker).is_ready() {
            t.join().unwrap();
            return;
        }
        match poll(&mut wait, &second_waker) {
            Poll::Ready(result) => result.unwrap(),
            Poll::Pending => {
                t.join().unwrap();
                assert_eq!(second.wakes(), 1, "the replacing waker missed the signal");
                assert_eq!(s.listener_count(), 0);
                return;
            }
        }
        t.join().unwrap();
        assert_eq!(s.listener_count(), 0);
    });
}

/// A pending future dropped while the signal races: its listener is gone either way, and the
/// signal never wakes a waker whose future is gone twice.
#[test]
fn drop_vs_signal() {
    model("future::drop_vs_signal", || {
        let s = semaphore(0);
        let signaller = s.clone();
        let (count, waker) = Count::waker();
        let mut wait = s.wait_async(1);
        let pending = poll(&mut wait, &waker).is_pending();
        let t = thread::spawn(move || signaller.signal(1).unwrap());
        drop(wait);
        t.join().unwrap();
        assert!(pending);
        assert!(count.wakes() <= 1);
        assert_eq!(s.listener_count(), 0);
        assert!(!s.has_waiters());
    });
}

/// A wait for two semaphores signalled by two threads, on a parking executor: it always
/// resolves (a lost wake-up deadlocks, which loom reports).
#[test]
fn wait_all_vs_two_signals() {
    model("future::wait_all_vs_two_signals", || {
        let (a, b) = (semaphore(0), semaphore(0));
        let (sa, sb) = (a.clone(), b.clone());
        let ta = thread::spawn(move || sa.signal(1).unwrap());
        let tb = thread::spawn(move || sb.signal(1).unwrap());
        block_on(wait_all_async(&[(&a, 1), (&b, 1)])).unwrap();
        ta.join().unwrap();
        tb.join().unwrap();
        assert_eq!((a.listener_count(), b.listener_count()), (0, 0));
    });
}
