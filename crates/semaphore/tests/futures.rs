//! Futures on timepoints (`wait_async`, `wait_all_async`, `wait_any_async`) under a minimal
//! executor written here: a `block_on` whose waker unparks the blocked thread, and a counting
//! waker for polling by hand.

mod common;

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use common::{bounded, failure};
use cuhal_semaphore::testing::FlagEvent;
use cuhal_semaphore::{Error, NoEvent, Semaphore, wait_all_async, wait_any_async};

type Sem = Semaphore<NoEvent>;

/// Wakes a thread blocked in [`block_on`], counting its wakes.
struct ThreadWaker {
    thread: Thread,
    wakes: AtomicUsize,
}

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.thread.unpark();
    }
}

/// Polls `future` on this thread until it resolves, parking between polls; panics if that
/// takes more than 5 s (a lost wake-up). Returns the output and how many times it was woken.
fn block_on<F: Future>(future: F) -> (F::Output, usize) {
    let woken = Arc::new(ThreadWaker {
        thread: thread::current(),
        wakes: AtomicUsize::new(0),
    });
    let waker = Waker::from(woken.clone());
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return (output, woken.wakes.load(Ordering::SeqCst));
        }
        // A spurious unpark only costs another poll; the deadline turns a lost wake-up into a
        // failure instead of a hang.
        let now = Instant::now();
        assert!(now < deadline, "the future was never woken");
        thread::park_timeout(deadline - now);
    }
}

/// A waker that counts its wakes; its clones are counted by the `Arc`'s strong count.
#[derive(Default)]
struct Counting {
    wakes: AtomicUsize,
}

impl Wake for Counting {
    fn wake(self: Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }
}

fn counting() -> (Arc<Counting>, Waker) {
    let counter = Arc::new(Counting::default());
    (counter.clone(), Waker::from(counter))
}

impl Counting {
    fn wakes(&self) -> usize {
        self.wakes.load(Ordering::SeqCst)
    }
}

/// Polls once with `waker`.
fn poll_with<F: Future + Unpin>(future: &mut F, waker: &Waker) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(waker))
}

#[test]
fn a_host_signal_from_another_thread_wakes_the_future() {
    let s = Sem::new(0);
    let signaller = s.clone();
    let ((result, wakes), ()) = bounded(Duration::from_secs(10), move || {
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            signaller.signal(1).unwrap();
            thread::sleep(Duration::from_millis(20));
            signaller.signal(5).unwrap();
        });
        let out = block_on(s.wait_async(5));
        assert_eq!(s.query().unwrap(), 5);
        assert_eq!(s.listener_count(), 0);
        assert!(!s.has_waiters());
        t.join().unwrap();
        (out, ())
    });
    result.unwrap();
    // Woken once, by the signal to 5: the signal to 1 is below the awaited value.
    assert_eq!(wakes, 1);
}

#[test]
fn a_value_already_reached_resolves_at_the_first_poll_registering_nothing() {
    let s = Sem::new(3);
    let (counter, waker) = counting();
    let mut wait = s.wait_async(3);
    assert!(matches!(poll_with(&mut wait, &waker), Poll::Ready(Ok(()))));
    assert_eq!(s.listener_count(), 0);
    // The waker was not even cloned.
    assert_eq!(Arc::strong_count(&counter), 2);
    drop(wait);
    let mut all = wait_all_async(&[(&s, 1), (&s, 2)]);
    assert!(matches!(poll_with(&mut all, &waker), Poll::Ready(Ok(()))));
    assert_eq!(s.listener_count(), 0);
    assert_eq!(Arc::strong_count(&counter), 2);
    assert_eq!(counter.wakes(), 0);
}

#[test]
fn a_failure_resolves_pending_futures_with_the_semaphores_failure() {
    let s = Sem::new(0);
    let (counter, waker) = counting();
    let mut a = s.wait_async(1);
    let mut b = wait_any_async(&[(&s, 2), (&s, 3)]);
    assert!(poll_with(&mut a, &waker).is_pending());
    assert!(poll_with(&mut b, &waker).is_pending());
    assert!(s.has_waiters());
    let f = failure("device fell over");
    s.fail(f.clone());
    assert_eq!(counter.wakes(), 2);
    for result in [
        match poll_with(&mut a, &waker) {
            Poll::Ready(r) => r.map(|()| 0),
            Poll::Pending => panic!("still pending after the failure"),
        },
        match poll_with(&mut b, &waker) {
            Poll::Ready(r) => r,
            Poll::Pending => panic!("still pending after the failure"),
        },
    ] {
        match result {
            Err(Error::Failed(seen)) => assert!(seen.ptr_eq(&f)),
            other => panic!("expected the failure, got {other:?}"),
        }
    }
    assert_eq!(s.listener_count(), 0);
    assert!(!s.has_waiters());
    // A failed semaphore fails a later future at once, even for a value it had reached.
    let (result, wakes) = block_on(s.wait_async(0));
    assert!(matches!(result, Err(Error::Failed(seen)) if seen.ptr_eq(&f)));
    assert_eq!(wakes, 0);
}

#[test]
fn a_failure_from_another_thread_wakes_a_blocked_future() {
    let s = Sem::new(0);
    let failer = s.clone();
    let f = failure("lost");
    let expected = f.clone();
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(20));
        failer.fail(f);
    });
    let (result, _) = bounded(Duration::from_secs(10), move || block_on(s.wait_async(9)));
    t.join().unwrap();
    assert!(matches!(result, Err(Error::Failed(seen)) if seen.ptr_eq(&expected)));
}

#[test]
fn wait_all_resolves_only_when_every_entry_is_reached() {
    let (a, b) = (Sem::new(0), Sem::new(0));
    let (counter, waker) = counting();
    let mut all = wait_all_async(&[(&a, 2), (&b, 1)]);
    assert!(poll_with(&mut all, &waker).is_pending());
    assert_eq!((a.listener_count(), b.listener_count()), (1, 1));
    a.signal(1).unwrap();
    assert_eq!(counter.wakes(), 0, "below the awaited value");
    a.signal(2).unwrap();
    assert_eq!(counter.wakes(), 1);
    assert!(poll_with(&mut all, &waker).is_pending());
    // `a`'s listener fired and `a` now listens for its failure only; `b`'s is still the one
    // registered, not a second.
    assert_eq!((a.listener_count(), b.listener_count()), (1, 1));
    assert!(poll_with(&mut all, &waker).is_pending());
    assert_eq!(
        (a.listener_count(), b.listener_count()),
        (1, 1),
        "a second poll registers nothing more"
    );
    b.signal(1).unwrap();
    assert_eq!(counter.wakes(), 2);
    assert!(matches!(poll_with(&mut all, &waker), Poll::Ready(Ok(()))));
    assert_eq!((a.listener_count(), b.listener_count()), (0, 0));
}

/// A wait-all fails as soon as any of its semaphores fails, an entry already reached too: its
/// semaphore's failure wakes the task (before, only a pending entry's listener could, so the
/// wait stayed pending until the others moved).
#[test]
fn wait_all_hears_the_failure_of_an_entry_already_reached() {
    let (a, b) = (Sem::new(1), Sem::new(0));
    let (counter, waker) = counting();
    let mut all = wait_all_async(&[(&a, 1), (&b, 1)]);
    assert!(poll_with(&mut all, &waker).is_pending());
    let failure = cuhal_semaphore::Failure::msg("a failed after it was reached");
    a.fail(failure.clone());
    assert_eq!(counter.wakes(), 1, "the failure woke the task");
    assert!(matches!(
        poll_with(&mut all, &waker),
        Poll::Ready(Err(Error::Failed(seen))) if seen.ptr_eq(&failure)
    ));
    assert_eq!((a.listener_count(), b.listener_count()), (0, 0));
    // A semaphore at the last value has nothing left to listen for, and the wait still ends.
    let (c, d) = (Sem::new(u64::MAX), Sem::new(0));
    let mut all = wait_all_async(&[(&c, 1), (&d, 1)]);
    assert!(poll_with(&mut all, &waker).is_pending());
    d.signal(1).unwrap();
    assert!(matches!(poll_with(&mut all, &waker), Poll::Ready(Ok(()))));
}

#[test]
fn wait_any_resolves_with_the_first_reached_entry() {
    let (a, b, c) = (Sem::new(0), Sem::new(0), Sem::new(0));
    let (counter, waker) = counting();
    let mut any = wait_any_async(&[(&a, 1), (&b, 1), (&c, 1)]);
    assert!(poll_with(&mut any, &waker).is_pending());
    c.signal(1).unwrap();
    assert_eq!(counter.wakes(), 1);
    b.signal(1).unwrap();
    // The first reached in list order when the future looks.
    assert!(matches!(poll_with(&mut any, &waker), Poll::Ready(Ok(1))));
    // Resolving unregistered the listener still waiting on `a`.
    assert_eq!(a.listener_count(), 0);
    assert!(!a.has_waiters());
    // Already reached: at once.
    let (result, wakes) = block_on(wait_any_async(&[(&a, 1), (&c, 1)]));
    assert_eq!((result.unwrap(), wakes), (1, 0));
    // Empty lists: all is satisfied, any never could be.
    assert!(block_on(wait_all_async::<NoEvent>(&[])).0.is_ok());
    assert!(matches!(
        block_on(wait_any_async::<NoEvent>(&[])).0,
        Err(Error::EmptyWaitList)
    ));
}

#[test]
fn dropping_pending_futures_unregisters_them() {
    let s = Sem::new(0);
    let other = Sem::new(0);
    let (counter, waker) = counting();
    for i in 0..10_000u64 {
        let mut wait = s.wait_async(1 + i % 7);
        assert!(poll_with(&mut wait, &waker).is_pending());
        let mut any = wait_any_async(&[(&s, 100), (&other, 1)]);
        assert!(poll_with(&mut any, &waker).is_pending());
        assert_eq!(s.listener_count(), 2);
        drop((wait, any));
    }
    assert_eq!((s.listener_count(), other.listener_count()), (0, 0));
    assert!(!s.has_waiters() && !other.has_waiters());
    // Every clone of the waker was let go with its future.
    assert_eq!(Arc::strong_count(&counter), 2);
    s.signal(100).unwrap();
    other.signal(1).unwrap();
    assert_eq!(counter.wakes(), 0);
}

#[test]
fn a_later_polls_waker_replaces_the_earlier_one() {
    let s = Sem::new(0);
    let (first, first_waker) = counting();
    let (second, second_waker) = counting();
    let mut wait = s.wait_async(1);
    assert!(poll_with(&mut wait, &first_waker).is_pending());
    assert_eq!(Arc::strong_count(&first), 3);
    // Polled again, as an executor that moved the task would: one listener still, holding the
    // new waker only.
    for _ in 0..100 {
        assert!(poll_with(&mut wait, &second_waker).is_pending());
    }
    assert_eq!(s.listener_count(), 1);
    assert_eq!(Arc::strong_count(&first), 2, "the old waker is let go");
    assert_eq!(Arc::strong_count(&second), 3, "the new one is held once");
    s.signal(1).unwrap();
    assert_eq!((first.wakes(), second.wakes()), (0, 1));
    assert!(matches!(
        poll_with(&mut wait, &second_waker),
        Poll::Ready(Ok(()))
    ));
    assert_eq!(Arc::strong_count(&second), 2);
}

#[test]
fn a_recorded_device_signal_does_not_wake_the_future_but_is_told_it_is_awaited() {
    let s = Semaphore::<FlagEvent>::new(0);
    let event = FlagEvent::new();
    s.record_device_signal(4, event.clone()).unwrap();
    let (counter, waker) = counting();
    let mut wait = s.wait_async(3);
    assert!(poll_with(&mut wait, &waker).is_pending());
    // The registration told the timepoint that somebody waits (a lazy completion side then
    // retires it promptly); the future never queries the event itself.
    assert_eq!(event.awaited_count(), 1);
    assert_eq!(event.query_count(), 0);
    assert!(s.has_waiters());
    // A device signal recorded after the registration fires the scheduler's listeners, not the
    // future's: the value is not reached.
    s.record_device_signal(5, FlagEvent::new()).unwrap();
    assert_eq!(counter.wakes(), 0);
    assert!(poll_with(&mut wait, &waker).is_pending());
    assert_eq!(event.awaited_count(), 1, "told once per registration");
    // The completion side's advance is what wakes it.
    event.complete();
    s.advance_to(4).unwrap();
    assert_eq!(counter.wakes(), 1);
    assert!(matches!(poll_with(&mut wait, &waker), Poll::Ready(Ok(()))));
    assert!(!s.has_waiters());
}

#[test]
fn many_futures_on_many_threads_all_wake() {
    let s = Sem::new(0);
    let waiters: Vec<_> = (0..8u64)
        .map(|i| {
            let s = s.clone();
            thread::spawn(move || block_on(s.wait_async(1 + i * 100)).0)
        })
        .collect();
    let signaller = s.clone();
    bounded(Duration::from_secs(10), move || {
        for value in 1..=1_000 {
            signaller.signal(value).unwrap();
        }
    });
    for waiter in waiters {
        waiter.join().unwrap().unwrap();
    }
    assert_eq!(s.listener_count(), 0);
}
