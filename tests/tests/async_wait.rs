//! GPU suite: semaphore futures woken by real GPU completions (`Semaphore::wait_async`,
//! `wait_semaphores_async`), on an executor written here: poll, park until the waker runs,
//! poll again.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Instant;

use cuhal::{CommandBufferMode, WaitMode, wait_semaphores_async};
use cuhal_gpu_tests::device_support::{
    Kernels, TIMEOUT, assert_all, command_buffer, open, poison, record_spin_fill,
};

/// Unparks the executor's thread, counting its wakes.
struct Unpark {
    thread: Thread,
    wakes: AtomicUsize,
}

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.thread.unpark();
    }
}

/// Runs `future` to completion on this thread; returns its output, whether its first poll was
/// pending, and how many wakes it took. A future not woken within [`TIMEOUT`] fails the test.
fn block_on<F: Future>(future: F) -> (F::Output, bool, usize) {
    let unpark = Arc::new(Unpark {
        thread: std::thread::current(),
        wakes: AtomicUsize::new(0),
    });
    let waker = Waker::from(unpark.clone());
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    let deadline = Instant::now() + TIMEOUT;
    let mut polls = 0;
    loop {
        polls += 1;
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return (output, polls > 1, unpark.wakes.load(Ordering::SeqCst));
        }
        let now = Instant::now();
        assert!(
            now < deadline,
            "the future was not woken within {TIMEOUT:?}"
        );
        std::thread::park_timeout(deadline - now);
    }
}

fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(Waker::noop()))
}

/// A kernel that spins 2 ms, then fills a buffer: the future is pending when first polled,
/// woken by the queue's completion side, and the buffer holds the fill when it resolves.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn a_future_is_woken_when_its_gpu_work_completes() {
    for mode in [CommandBufferMode::Graph, CommandBufferMode::Deferred] {
        let device = open(mode, 1);
        let kernels = Kernels::load(&device);
        let queue = device.queue(0);
        let buffer = device.create_buffer(4096).unwrap();
        poison(&buffer, 0xdead_beef);
        let cb = command_buffer(queue, |cb| {
            record_spin_fill(cb, &kernels, 2_000_000, &buffer.whole(), 0x600d_0001);
        });
        let done = device.create_semaphore(0);
        queue.execute(&[], &[(&done, 1)], &[&cb]).unwrap();
        let (result, was_pending, wakes) = block_on(done.wait_async(1));
        result.unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        assert!(
            was_pending,
            "{mode:?}: a 2 ms kernel was done at the first poll"
        );
        assert!(wakes >= 1, "{mode:?}: resolved without a wake");
        assert_eq!(done.listener_count(), 0);
        assert!(!done.has_waiters());
        assert_all(&buffer, 0x600d_0001, &format!("{mode:?} fill"));
    }
}

/// Work on two queues, awaited together and one at a time: every future resolves with its
/// work done, and dropping a pending one unregisters it.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn futures_over_two_queues_resolve_and_a_dropped_one_unregisters() {
    let device = open(CommandBufferMode::Graph, 2);
    let kernels = Kernels::load(&device);
    let buffers: Vec<_> = (0..2)
        .map(|_| device.create_buffer(4096).unwrap())
        .collect();
    let semaphores: Vec<_> = (0..2).map(|_| device.create_semaphore(0)).collect();
    for (i, buffer) in buffers.iter().enumerate() {
        poison(buffer, 0);
        let queue = device.queue(i);
        let cb = command_buffer(queue, |cb| {
            record_spin_fill(cb, &kernels, 1_000_000, &buffer.whole(), 10 + i as u32);
        });
        queue.execute(&[], &[(&semaphores[i], 1)], &[&cb]).unwrap();
    }
    // Pending, then dropped: nothing stays registered.
    let mut dropped = semaphores[0].wait_async(2);
    assert!(poll_once(&mut dropped).is_pending());
    assert_eq!(semaphores[0].listener_count(), 1);
    drop(dropped);
    assert_eq!(semaphores[0].listener_count(), 0);

    let list = [(&semaphores[0], 1), (&semaphores[1], 1)];
    let (all, _, _) = block_on(wait_semaphores_async(WaitMode::All, &list));
    assert_eq!(all.unwrap(), 0);
    let (any, was_pending, _) = block_on(wait_semaphores_async(WaitMode::Any, &list));
    assert_eq!(any.unwrap(), 0, "both reached: the first in list order");
    assert!(!was_pending, "reached values resolve at the first poll");
    for (i, buffer) in buffers.iter().enumerate() {
        assert_all(buffer, 10 + i as u32, &format!("queue {i}'s fill"));
        assert_eq!(semaphores[i].listener_count(), 0);
    }
}
