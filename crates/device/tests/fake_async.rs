//! Futures on semaphores on the fake driver: a submission's signal wakes the future waiting for
//! it (from the queue's completion side), a pending future hurries a completion side that
//! gathers, and a lost device resolves every pending future with its failure.

mod fake_support;

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use cuhal::{DeviceOptions, FillPattern, Semaphore, WaitMode, wait_semaphores_async};
use fake_support::*;

/// Counts its wakes, and unparks a thread blocked in [`block_on`] if it has one.
struct Counting {
    wakes: AtomicUsize,
    thread: Option<Thread>,
}

impl Wake for Counting {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        if let Some(thread) = &self.thread {
            thread.unpark();
        }
    }
}

fn counting() -> (Arc<Counting>, Waker) {
    let counter = Arc::new(Counting {
        wakes: AtomicUsize::new(0),
        thread: None,
    });
    (counter.clone(), Waker::from(counter))
}

/// Polls `future` on this thread until it resolves, parked between polls; a future not woken
/// within [`TIMEOUT`] fails the test.
fn block_on<F: Future>(future: F) -> F::Output {
    let waker = Waker::from(Arc::new(Counting {
        wakes: AtomicUsize::new(0),
        thread: Some(thread::current()),
    }));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        let now = Instant::now();
        assert!(
            now < deadline,
            "the future was not woken within {TIMEOUT:?}"
        );
        thread::park_timeout(deadline - now);
    }
}

fn poll_with<F: Future + Unpin>(future: &mut F, waker: &Waker) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(waker))
}

/// Waits until `counter` has seen `wakes` wakes.
fn woken(counter: &Counting, wakes: usize) {
    let deadline = Instant::now() + TIMEOUT;
    while counter.wakes.load(Ordering::SeqCst) < wakes {
        assert!(
            Instant::now() < deadline,
            "{} of {wakes} wakes within {TIMEOUT:?}",
            counter.wakes.load(Ordering::SeqCst)
        );
        thread::sleep(Duration::from_micros(200));
    }
}

#[test]
fn a_submissions_signal_wakes_its_future() {
    let (_fake, _driver, device) = open("async-signal", queues(1));
    let queue = device.queue(0);
    let buffer = device.create_buffer(256).unwrap();
    poison(&device, queue, &buffer.whole());
    let (go, done) = (device.create_semaphore(0), device.create_semaphore(0));
    queue
        .fill(
            &[(&go, 1)],
            &[(&done, 1)],
            &buffer.whole(),
            FillPattern::U32(0x0403_0201),
        )
        .unwrap();
    let (counter, waker) = counting();
    let mut wait = done.wait_async(1);
    assert!(poll_with(&mut wait, &waker).is_pending());
    assert!(done.has_waiters());
    assert_eq!(done.listener_count(), 1);
    // Releases the fill; the completion side's advance of `done` wakes the future.
    go.signal(1).unwrap();
    woken(&counter, 1);
    assert!(matches!(poll_with(&mut wait, &waker), Poll::Ready(Ok(()))));
    assert_eq!(done.listener_count(), 0);
    assert!(!done.has_waiters());
    let bytes = read(&device, queue, &buffer.whole());
    assert!(
        bytes.chunks(4).all(|word| word == [1, 2, 3, 4]),
        "{bytes:?}"
    );

    // A multi-wait resolved by two submissions, on a thread of its own.
    let (a, b) = (device.create_semaphore(0), device.create_semaphore(0));
    let wait = wait_semaphores_async(WaitMode::All, &[(&a, 1), (&b, 1)]);
    let waiter = thread::spawn(move || block_on(wait));
    queue
        .fill(&[], &[(&a, 1)], &buffer.whole(), FillPattern::U8(7))
        .unwrap();
    queue
        .fill(&[(&a, 1)], &[(&b, 1)], &buffer.whole(), FillPattern::U8(8))
        .unwrap();
    assert_eq!(waiter.join().unwrap().unwrap(), 0);
    assert_eq!(read(&device, queue, &buffer.whole()), vec![8; 256]);
}

/// A one-queue device gathering completions for 20 s, whose work takes `STEP` from now on,
/// with a semaphore its first submission (retired) brought to 1.
fn gathering_queue(
    tag: &str,
) -> (
    cuhal_fake_driver::harness::FakeDriver,
    cuhal::Driver,
    cuhal::Device,
    Semaphore,
) {
    let (fake, driver, device) = open(
        tag,
        DeviceOptions {
            completion: DeviceOptions::DEFAULT_COMPLETION.with_gather(Duration::from_secs(20)),
            ..queues(1)
        },
    );
    let queue = device.queue(0);
    let buffer = device.create_buffer(256).unwrap();
    let done = device.create_semaphore(0);
    queue
        .fill(&[], &[(&done, 1)], &buffer.whole(), FillPattern::U8(1))
        .unwrap();
    wait(&done, 1);
    settle(queue);
    fake.set_timing(STEP, Duration::ZERO);
    (fake, driver, device, done)
}

/// How long each launch takes on the fake's clock in the gathering tests.
const STEP: Duration = Duration::from_millis(100);

/// A future never looks at the device itself: the completion side's advance is its only
/// wake-up. Its registration tells the completion side that somebody waits, which ends the
/// gather (20 s here): the work is retired when done, not a gather later. Registered after the
/// submission (its timepoint is recorded: the registration nudges the queue) and before it
/// (the submission finds a waiter when it hands its work to the completion side).
#[test]
fn a_pending_future_ends_the_completion_gather() {
    for registered_first in [false, true] {
        let tag = format!("async-gather-{registered_first}");
        let (fake, _driver, device, done) = gathering_queue(&tag);
        let queue = device.queue(0);
        let buffer = device.create_buffer(256).unwrap();
        let mut cb = queue.create_command_buffer().unwrap();
        cb.fill(&buffer.whole(), FillPattern::U8(2)).unwrap();
        let cb = cb.end().unwrap();
        let start = Instant::now();
        let (counter, waker) = counting();
        let mut wait = done.wait_async(2);
        if registered_first {
            assert!(poll_with(&mut wait, &waker).is_pending());
        }
        queue.execute(&[], &[(&done, 2)], &[&cb]).unwrap();
        if !registered_first {
            assert!(poll_with(&mut wait, &waker).is_pending());
        }
        woken(&counter, 1);
        let elapsed = start.elapsed();
        fake.set_timing(Duration::ZERO, Duration::ZERO);
        assert!(matches!(poll_with(&mut wait, &waker), Poll::Ready(Ok(()))));
        assert!(
            elapsed < STEP + Duration::from_secs(3),
            "registered {}: woken after {elapsed:?} for {STEP:?} of work",
            if registered_first {
                "first"
            } else {
                "after the submission"
            }
        );
    }
}

#[test]
fn a_lost_device_fails_every_pending_future() {
    let (fake, _driver, device) = open("async-lost", queues(2));
    let scene = stage_loss(&device);
    let (s, p0, p1) = (&scene.s, &scene.p0, &scene.p1);

    let (counter, waker) = counting();
    let mut singles: Vec<_> = [&s, &p0, &p1, &s]
        .into_iter()
        .map(|semaphore| semaphore.wait_async(1))
        .collect();
    let mut all = wait_semaphores_async(WaitMode::All, &[(p0, 1), (p1, 1)]);
    let mut any = wait_semaphores_async(WaitMode::Any, &[(p0, 1), (p1, 1)]);
    for wait in &mut singles {
        assert!(poll_with(wait, &waker).is_pending());
    }
    assert!(poll_with(&mut all, &waker).is_pending());
    assert!(poll_with(&mut any, &waker).is_pending());
    // One more, blocked on a thread of its own.
    let blocked = {
        let wait = p1.wait_async(1);
        thread::spawn(move || block_on(wait))
    };

    scene.fault(&fake);
    woken(&counter, singles.len() + 2);
    let lost = device.lost().expect("the device is lost");
    assert_driver_result(&lost, cuhal_sys::CUresult::ERROR_ILLEGAL_ADDRESS);
    let failed_with_loss = |result: Result<(), cuhal_semaphore::Error>, what: &str| match result {
        Err(cuhal_semaphore::Error::Failed(failure)) => {
            assert!(
                failure.ptr_eq(&lost),
                "{what} failed with another failure {failure}"
            )
        }
        other => panic!("{what}: expected the device's failure, got {other:?}"),
    };
    for (i, wait) in singles.iter_mut().enumerate() {
        match poll_with(wait, &waker) {
            Poll::Ready(result) => failed_with_loss(result, &format!("future {i}")),
            Poll::Pending => panic!("future {i} still pending on a lost device"),
        }
    }
    for (what, wait) in [("all", &mut all), ("any", &mut any)] {
        match poll_with(wait, &waker) {
            Poll::Ready(Err(cuhal::Error::Semaphore(e))) => failed_with_loss(Err(e), what),
            other => panic!("{what}: expected the device's failure, got {other:?}"),
        }
    }
    failed_with_loss(blocked.join().unwrap(), "the blocked future");
    for semaphore in [&s, &p0, &p1] {
        assert_eq!(semaphore.listener_count(), 0);
        assert!(!semaphore.has_waiters());
    }
}
