//! GPU conformance suite of the device crate (`cuhal`): IREE's HAL submission cases, ported by
//! behaviour, plus queue allocations, transfers, host calls, cross-queue dependencies, a long
//! chained run and shutdown with pending work.
//!
//! Every case runs in both command-buffer modes (the `graph::` and `deferred::` tests). Data is
//! fresh random each run (the seed is printed) and every output buffer is poisoned before the
//! work that should write it, so a result can only come from that work. Cases that check that
//! something has *not* happened yet look at work that cannot have been issued (it waits on a
//! host semaphore nobody has signalled), never at a race.
//!
//! The faulting dispatch lives in `conformance_trap.rs` (it loses the context), and the
//! zero-allocation check in `device_alloc.rs` (it installs a counting global allocator).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cuhal::{
    Buffer, CommandBufferMode, Device, Error, Failure, FillPattern, Queue, Semaphore, WaitMode,
    wait_semaphores,
};
use cuhal_gpu_tests::device_support::*;
use cuhal_gpu_tests::gpu::{Rng, seed};

/// What every output buffer holds before the work that should overwrite it.
const POISON: u32 = 0xDEAD_BEEF;
/// Words in the suite's small buffers (16 KiB).
const WORDS: usize = 4096;
/// A GPU spin long enough that the host sees the work in flight (2 ms).
const SPIN_NS: u64 = 2_000_000;
/// How long a test lets something that must not happen have its chance.
const GRACE: Duration = Duration::from_millis(20);

macro_rules! in_both_modes {
    ($($name:ident),* $(,)?) => {
        mod graph {
            $(
                #[test]
                #[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
                fn $name() {
                    super::$name(cuhal::CommandBufferMode::Graph)
                }
            )*
        }
        mod deferred {
            $(
                #[test]
                #[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
                fn $name() {
                    super::$name(cuhal::CommandBufferMode::Deferred)
                }
            )*
        }
    };
}

in_both_modes!(
    submit_with_no_command_buffers,
    submit_and_signal,
    submit_with_wait,
    several_semaphores,
    wait_all_on_host_and_device_semaphores,
    wait_any_with_host_signals,
    intermediate_semaphore_between_device_batches,
    two_batches_waiting_on_one_earlier_batch,
    two_batches_waiting_on_different_values,
    batch_waiting_on_a_batch_and_a_host_signal,
    device_batch_signalling_another_batch_and_the_host,
    waiting_on_a_smaller_value_after_it_is_signalled,
    waiting_on_a_smaller_value_before_it_is_signalled,
    failure_propagates_through_a_chain,
    host_calls_run_in_order_and_fail_their_signals,
    alloca_and_dealloca_are_ordered_by_semaphores,
    read_write_round_trips,
    queue_waits_on_another_queue_on_the_device,
    ten_thousand_chained_submissions_across_two_queues,
    dropping_the_device_fails_pending_work,
    rejected_operations_change_nothing,
    a_host_signal_issues_an_alternating_chain_on_its_own_thread,
    a_chain_on_one_queue_relies_on_stream_order,
    timing_a_backlog_behind_a_long_kernel_retires_in_batches,
    idle_queues_park_their_threads,
    dropping_a_buffer_leaves_the_device_running,
);

/// One test's device, kernels and random source.
struct Env {
    device: Device,
    kernels: Kernels,
    rng: Rng,
}

fn env(mode: CommandBufferMode, queues: usize) -> Env {
    let device = open(mode, queues);
    let kernels = Kernels::load(&device);
    Env {
        device,
        kernels,
        rng: Rng::new(seed()),
    }
}

impl Env {
    fn q(&self, index: usize) -> &Queue {
        self.device.queue(index)
    }

    fn sem(&self) -> Semaphore {
        self.device.create_semaphore(0)
    }

    /// A poisoned buffer of `WORDS` words.
    fn buffer(&self) -> Arc<Buffer> {
        let buffer = self
            .device
            .create_buffer(WORDS * 4)
            .unwrap_or_else(|e| panic!("create_buffer: {e}"));
        poison(&buffer, POISON);
        buffer
    }

    /// A random word that is not the poison.
    fn value(&mut self) -> u32 {
        loop {
            let v = self.rng.next_u32();
            if v != POISON && v.wrapping_add(1) != POISON {
                return v;
            }
        }
    }

    /// A command buffer of queue `q` that spins `spin_ns`, then fills `target` with `value`.
    fn fill_cb(
        &self,
        q: usize,
        spin_ns: u64,
        target: &Arc<Buffer>,
        value: u32,
    ) -> Arc<dyn cuhal::CommandBuffer> {
        command_buffer(self.q(q), |cb| {
            record_spin_fill(cb, &self.kernels, spin_ns, &target.whole(), value)
        })
    }

    /// A command buffer of queue `q` that computes `dst = src + k`.
    fn add_cb(
        &self,
        q: usize,
        dst: &Arc<Buffer>,
        src: &Arc<Buffer>,
        k: u32,
    ) -> Arc<dyn cuhal::CommandBuffer> {
        command_buffer(self.q(q), |cb| {
            record_add(cb, &self.kernels, &dst.whole(), &src.whole(), k)
        })
    }
}

fn value_of(semaphore: &Semaphore) -> u64 {
    semaphore
        .query()
        .unwrap_or_else(|e| panic!("{semaphore:?}: {e}"))
}

/// The failure a wait on `semaphore` for `value` ends with (panics if it succeeds or hangs).
fn failure_of(semaphore: &Semaphore, value: u64) -> Failure {
    match semaphore.wait(value, TIMEOUT) {
        Err(cuhal_semaphore::Error::Failed(failure)) => failure,
        other => panic!("expected {semaphore:?} to fail, the wait returned {other:?}"),
    }
}

/// Waits until every action submitted to `queue` is retired (signalled, cleaned up, released).
fn settle(queue: &Queue) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let stats = queue.stats();
        if stats.retired() == stats.submitted {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} never retired everything: {stats:?}",
            queue.label()
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

// ---------------------------------------------------------------------------------------------
// IREE's submission cases

fn submit_with_no_command_buffers(mode: CommandBufferMode) {
    let e = env(mode, 1);
    let s = e.sem();
    e.q(0).execute(&[], &[(&s, 1)], &[]).unwrap();
    wait(&s, 1);
    e.q(0).execute(&[(&s, 1)], &[(&s, 2)], &[]).unwrap();
    e.q(0).barrier(&[(&s, 2)], &[(&s, 3)]).unwrap();
    wait(&s, 3);
    assert_eq!(value_of(&s), 3);
    settle(e.q(0));
    let stats = e.q(0).stats();
    assert_eq!((stats.submitted, stats.completed, stats.failed), (3, 3, 0));
}

fn submit_and_signal(mode: CommandBufferMode) {
    let mut e = env(mode, 1);
    let s = e.sem();
    let out = e.buffer();
    let v = e.value();
    let cb = e.fill_cb(0, 0, &out, v);
    e.q(0).execute(&[], &[(&s, 1)], &[&cb]).unwrap();
    wait(&s, 1);
    assert_all(&out, v, "after the first submission");
    // Resubmitted, it runs again: the poison written in between is overwritten.
    poison(&out, POISON);
    e.q(0).execute(&[(&s, 1)], &[(&s, 2)], &[&cb]).unwrap();
    wait(&s, 2);
    assert_all(&out, v, "after the second submission");
}

fn submit_with_wait(mode: CommandBufferMode) {
    let mut e = env(mode, 1);
    let (w, s) = (e.sem(), e.sem());
    let out = e.buffer();
    let v = e.value();
    let cb = e.fill_cb(0, 0, &out, v);
    e.q(0).execute(&[(&w, 1)], &[(&s, 1)], &[&cb]).unwrap();
    std::thread::sleep(GRACE);
    assert_eq!(value_of(&s), 0, "signalled before its wait was reached");
    assert_eq!(e.q(0).stats().pending, 1);
    assert_all(&out, POISON, "ran before its wait was reached");
    w.signal(1).unwrap();
    wait(&s, 1);
    assert_all(&out, v, "after the wait was reached");
    // The host signal made it ready, so the signalling thread issued it itself (no hand-off to
    // the worker; the queue's issue lock was free).
    let stats = e.q(0).stats();
    assert_eq!(
        (
            stats.issued_on_submit,
            stats.issued_on_signal,
            stats.issued_by_worker
        ),
        (0, 1, 0),
        "{stats:?}"
    );
}

fn several_semaphores(mode: CommandBufferMode) {
    let mut e = env(mode, 1);
    let (w1, w2) = (e.sem(), e.sem());
    let (s1, s2, s3) = (e.sem(), e.sem(), e.sem());
    let out = e.buffer();
    let v = e.value();
    let cb = e.fill_cb(0, 0, &out, v);
    e.q(0)
        .execute(
            &[(&w1, 1), (&w2, 5)],
            &[(&s1, 1), (&s2, 7), (&s3, 2)],
            &[&cb],
        )
        .unwrap();
    w1.signal(1).unwrap();
    w2.signal(4).unwrap(); // below the wanted value
    std::thread::sleep(GRACE);
    for s in [&s1, &s2, &s3] {
        assert_eq!(value_of(s), 0, "signalled with a wait unreached");
    }
    assert_all(&out, POISON, "ran with a wait unreached");
    w2.signal(5).unwrap();
    wait_semaphores(WaitMode::All, &[(&s1, 1), (&s2, 7), (&s3, 2)], TIMEOUT).unwrap();
    assert_eq!(
        (value_of(&s1), value_of(&s2), value_of(&s3)),
        (1, 7, 2),
        "each semaphore reaches exactly its own value"
    );
    assert_all(&out, v, "after both waits");
}

fn wait_all_on_host_and_device_semaphores(mode: CommandBufferMode) {
    let mut e = env(mode, 1);
    let (host, device) = (e.sem(), e.sem());
    let out = e.buffer();
    let v = e.value();
    let cb = e.fill_cb(0, SPIN_NS, &out, v);
    e.q(0).execute(&[], &[(&device, 1)], &[&cb]).unwrap();
    let signaller = {
        let host = host.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            host.signal(1)
        })
    };
    let index = wait_semaphores(WaitMode::All, &[(&host, 1), (&device, 1)], TIMEOUT).unwrap();
    assert_eq!(index, 0);
    assert!(value_of(&host) >= 1 && value_of(&device) >= 1);
    signaller.join().unwrap().unwrap();
    assert_all(&out, v, "the device batch's output");

    // With one of them never signalled, wait-all times out.
    let never = e.sem();
    let start = Instant::now();
    let result = wait_semaphores(
        WaitMode::All,
        &[(&device, 1), (&never, 1)],
        Duration::from_millis(20),
    );
    assert!(
        matches!(
            result,
            Err(Error::Semaphore(cuhal_semaphore::Error::Timeout))
        ),
        "{result:?}"
    );
    assert!(start.elapsed() >= Duration::from_millis(20));
}

fn wait_any_with_host_signals(mode: CommandBufferMode) {
    let e = env(mode, 1);
    let (a, b, c) = (e.sem(), e.sem(), e.sem());
    let signaller = {
        let b = b.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            b.signal(3)
        })
    };
    let index = wait_semaphores(WaitMode::Any, &[(&a, 1), (&b, 2), (&c, 1)], TIMEOUT).unwrap();
    assert_eq!(index, 1);
    signaller.join().unwrap().unwrap();
    assert_eq!((value_of(&a), value_of(&c)), (0, 0));

    // A value already reached answers at once, whatever else is listed.
    let index = wait_semaphores(WaitMode::Any, &[(&a, 1), (&b, 1)], Duration::ZERO).unwrap();
    assert_eq!(index, 1);

    // Any of a host semaphore and one a device batch signals.
    let d = e.sem();
    e.q(0).execute(&[], &[(&d, 1)], &[]).unwrap();
    let index = wait_semaphores(WaitMode::Any, &[(&c, 1), (&d, 1)], TIMEOUT).unwrap();
    assert_eq!(index, 1);

    // None reached: a timeout, not an index.
    let result = wait_semaphores(WaitMode::Any, &[(&a, 1), (&c, 1)], Duration::from_millis(5));
    assert!(
        matches!(
            result,
            Err(Error::Semaphore(cuhal_semaphore::Error::Timeout))
        ),
        "{result:?}"
    );
}

fn intermediate_semaphore_between_device_batches(mode: CommandBufferMode) {
    let mut e = env(mode, 2);
    let (w, i, s) = (e.sem(), e.sem(), e.sem());
    let (src, dst) = (e.buffer(), e.buffer());
    let (v, k) = (e.value(), e.value());
    let produce = e.fill_cb(0, 0, &src, v);
    let consume = e.add_cb(1, &dst, &src, k);
    // The consumer is submitted first, on the other queue, before its producer exists.
    e.q(1).execute(&[(&i, 1)], &[(&s, 1)], &[&consume]).unwrap();
    e.q(0).execute(&[(&w, 1)], &[(&i, 1)], &[&produce]).unwrap();
    std::thread::sleep(GRACE);
    assert_eq!((value_of(&i), value_of(&s)), (0, 0));
    assert_all(&dst, POISON, "the consumer ran before its producer");
    w.signal(1).unwrap();
    wait(&s, 1);
    // The host value of `i` follows its own queue's completion, which may come a moment after.
    wait(&i, 1);
    assert_eq!(value_of(&i), 1);
    assert_all(&dst, v.wrapping_add(k), "the consumer's output");

    // Again with the producer issued first: the consumer waits for it on the device.
    poison(&src, POISON);
    poison(&dst, POISON);
    let slow = e.fill_cb(0, SPIN_NS, &src, v);
    e.q(0).execute(&[(&i, 1)], &[(&i, 2)], &[&slow]).unwrap();
    e.q(1).execute(&[(&i, 2)], &[(&s, 2)], &[&consume]).unwrap();
    wait(&s, 2);
    assert_all(
        &dst,
        v.wrapping_add(k),
        "the consumer's output, second round",
    );
}

fn two_batches_waiting_on_one_earlier_batch(mode: CommandBufferMode) {
    let mut e = env(mode, 2);
    let (x, y, z) = (e.sem(), e.sem(), e.sem());
    let (src, out1, out2) = (e.buffer(), e.buffer(), e.buffer());
    let (v, k1, k2) = (e.value(), e.value(), e.value());
    let produce = e.fill_cb(0, SPIN_NS, &src, v);
    let first = e.add_cb(1, &out1, &src, k1);
    let second = e.add_cb(0, &out2, &src, k2);
    e.q(0).execute(&[], &[(&x, 1)], &[&produce]).unwrap();
    e.q(1).execute(&[(&x, 1)], &[(&y, 1)], &[&first]).unwrap();
    e.q(0).execute(&[(&x, 1)], &[(&z, 1)], &[&second]).unwrap();
    wait_semaphores(WaitMode::All, &[(&y, 1), (&z, 1)], TIMEOUT).unwrap();
    assert_all(&out1, v.wrapping_add(k1), "the batch on the other queue");
    assert_all(&out2, v.wrapping_add(k2), "the batch on the same queue");
}

fn two_batches_waiting_on_different_values(mode: CommandBufferMode) {
    let mut e = env(mode, 2);
    let (x, y, z) = (e.sem(), e.sem(), e.sem());
    let (out1, out2) = (e.buffer(), e.buffer());
    let (v1, v2) = (e.value(), e.value());
    let first = e.fill_cb(0, 0, &out1, v1);
    let second = e.fill_cb(1, 0, &out2, v2);
    e.q(0).execute(&[(&x, 1)], &[(&y, 1)], &[&first]).unwrap();
    e.q(1).execute(&[(&x, 2)], &[(&z, 1)], &[&second]).unwrap();
    x.signal(1).unwrap();
    wait(&y, 1);
    assert_all(&out1, v1, "the batch waiting on 1");
    std::thread::sleep(GRACE);
    assert_eq!(value_of(&z), 0, "the batch waiting on 2 ran at 1");
    assert_all(&out2, POISON, "the batch waiting on 2 ran at 1");
    x.signal(2).unwrap();
    wait(&z, 1);
    assert_all(&out2, v2, "the batch waiting on 2");
}

fn batch_waiting_on_a_batch_and_a_host_signal(mode: CommandBufferMode) {
    let mut e = env(mode, 2);
    let (a, h, s) = (e.sem(), e.sem(), e.sem());
    let (src, dst) = (e.buffer(), e.buffer());
    let (v, k) = (e.value(), e.value());
    let produce = e.fill_cb(0, SPIN_NS, &src, v);
    let consume = e.add_cb(1, &dst, &src, k);
    e.q(0).execute(&[], &[(&a, 1)], &[&produce]).unwrap();
    e.q(1)
        .execute(&[(&a, 1), (&h, 1)], &[(&s, 1)], &[&consume])
        .unwrap();
    wait(&a, 1);
    std::thread::sleep(GRACE);
    assert_eq!(value_of(&s), 0, "ran without the host signal");
    assert_all(&dst, POISON, "ran without the host signal");
    h.signal(1).unwrap();
    wait(&s, 1);
    assert_all(&dst, v.wrapping_add(k), "the consumer's output");
}

fn device_batch_signalling_another_batch_and_the_host(mode: CommandBufferMode) {
    let mut e = env(mode, 2);
    let (x, to_host, y) = (e.sem(), e.sem(), e.sem());
    let (src, dst) = (e.buffer(), e.buffer());
    let (v, k) = (e.value(), e.value());
    let produce = e.fill_cb(0, SPIN_NS, &src, v);
    let consume = e.add_cb(1, &dst, &src, k);
    // A host waiter blocked before anything is submitted.
    let waiter = {
        let to_host = to_host.clone();
        std::thread::spawn(move || to_host.wait(1, TIMEOUT))
    };
    e.q(0)
        .execute(&[], &[(&x, 1), (&to_host, 1)], &[&produce])
        .unwrap();
    e.q(1).execute(&[(&x, 1)], &[(&y, 1)], &[&consume]).unwrap();
    waiter.join().unwrap().unwrap();
    // When the host hears of it, the producer's output is complete.
    assert_all(&src, v, "the producer's output, seen by the host");
    wait_semaphores(WaitMode::All, &[(&to_host, 1), (&y, 1)], TIMEOUT).unwrap();
    assert_all(&dst, v.wrapping_add(k), "the consumer's output");
}

fn waiting_on_a_smaller_value_after_it_is_signalled(mode: CommandBufferMode) {
    let mut e = env(mode, 2);
    let (s, t) = (e.sem(), e.sem());
    e.q(0).execute(&[], &[(&s, 10)], &[]).unwrap();
    wait(&s, 10);
    assert_eq!(value_of(&s), 10);
    s.wait(5, Duration::ZERO).unwrap();
    wait_semaphores(WaitMode::All, &[(&s, 1), (&s, 10)], Duration::ZERO).unwrap();
    // A device batch waiting on a smaller value runs at once.
    let out = e.buffer();
    let v = e.value();
    let cb = e.fill_cb(1, 0, &out, v);
    e.q(1).execute(&[(&s, 4)], &[(&t, 1)], &[&cb]).unwrap();
    wait(&t, 1);
    assert_all(&out, v, "the batch waiting on a smaller value");
    // A host signal below the value is refused and changes nothing.
    assert!(matches!(
        s.signal(9),
        Err(cuhal_semaphore::Error::NotMonotonic {
            current: 10,
            requested: 9
        })
    ));
    assert_eq!(value_of(&s), 10);
}

fn waiting_on_a_smaller_value_before_it_is_signalled(mode: CommandBufferMode) {
    let mut e = env(mode, 2);
    let (gate, s, t) = (e.sem(), e.sem(), e.sem());
    let (out1, out2) = (e.buffer(), e.buffer());
    let (v1, v2) = (e.value(), e.value());
    let host_waiter = {
        let s = s.clone();
        std::thread::spawn(move || s.wait(5, TIMEOUT))
    };
    let deadline = Instant::now() + TIMEOUT;
    while s.waiter_count() == 0 {
        assert!(Instant::now() < deadline, "the host waiter never blocked");
        std::thread::sleep(Duration::from_micros(100));
    }
    // A device batch waiting on a smaller value than the one that will be signalled, submitted
    // before any signal is even recorded: it waits on the host side.
    let first = e.fill_cb(1, 0, &out1, v1);
    e.q(1).execute(&[(&s, 3)], &[(&t, 1)], &[&first]).unwrap();
    e.q(0)
        .execute(
            &[(&gate, 1)],
            &[(&s, 10)],
            &[&e.fill_cb(0, SPIN_NS, &out2, v2)],
        )
        .unwrap();
    std::thread::sleep(GRACE);
    assert_eq!((value_of(&s), value_of(&t)), (0, 0));
    gate.signal(1).unwrap();
    host_waiter.join().unwrap().unwrap();
    wait(&t, 1);
    wait(&s, 10); // (its host value follows its own queue's completion)
    assert_eq!(value_of(&s), 10);
    assert_all(&out1, v1, "the batch waiting on a smaller value");
    assert_all(&out2, v2, "the batch signalling the larger value");

    // Recorded but not reached: a batch waiting on a smaller value than a timepoint in flight
    // waits for it on the device, issued by the submitting thread.
    let slow = e.fill_cb(0, SPIN_NS, &out2, v1);
    e.q(0).execute(&[], &[(&s, 20)], &[&slow]).unwrap();
    let before = e.q(1).stats();
    let second = e.fill_cb(1, 0, &out1, v2);
    e.q(1).execute(&[(&s, 15)], &[(&t, 2)], &[&second]).unwrap();
    let after = e.q(1).stats();
    assert_eq!(after.issued_on_submit, before.issued_on_submit + 1);
    assert_eq!(after.issued_by_worker, before.issued_by_worker);
    s.wait(12, TIMEOUT).unwrap();
    wait(&t, 2);
    wait(&s, 20); // (its host value follows its own queue's completion)
    assert_eq!(value_of(&s), 20);
    assert_all(&out1, v2, "the device-side waiter's output");
}

fn failure_propagates_through_a_chain(mode: CommandBufferMode) {
    let mut e = env(mode, 2);
    let h = e.sem();
    let chain: Vec<Semaphore> = (0..4).map(|_| e.sem()).collect();
    let out = e.buffer();
    let v = e.value();
    let cb = e.fill_cb(0, 0, &out, v);
    // h -> q0 batch -> chain[0] -> q1 batch -> chain[1] -> q0 batch -> chain[2] -> host call -> chain[3]
    e.q(0)
        .execute(&[(&h, 1)], &[(&chain[0], 1)], &[&cb])
        .unwrap();
    e.q(1)
        .execute(&[(&chain[0], 1)], &[(&chain[1], 1)], &[])
        .unwrap();
    e.q(0)
        .execute(&[(&chain[1], 1)], &[(&chain[2], 5)], &[&cb])
        .unwrap();
    let called = Arc::new(AtomicBool::new(false));
    {
        let called = called.clone();
        e.q(1)
            .host_call(&[(&chain[2], 5)], &[(&chain[3], 1)], move || {
                called.store(true, Ordering::SeqCst);
                Ok(())
            })
            .unwrap();
    }
    let failure = Failure::msg("upstream producer failed");
    h.fail(failure.clone());
    for (i, s) in chain.iter().enumerate() {
        let got = failure_of(s, 1);
        assert!(got.ptr_eq(&failure), "chain[{i}] failed with {got}");
    }
    let error = wait_semaphores(WaitMode::Any, &[(&chain[3], 1), (&h, 1)], TIMEOUT).unwrap_err();
    assert!(
        error.failure().is_some_and(|f| f.ptr_eq(&failure)),
        "{error}"
    );
    settle(e.q(0));
    settle(e.q(1));
    assert!(!called.load(Ordering::SeqCst), "the host call ran");
    assert_all(&out, POISON, "a failed batch ran");
    assert_eq!(e.q(0).stats().failed, 2);
    assert_eq!(e.q(1).stats().failed, 2);
    // An upstream failure loses nothing: both queues still work.
    assert!(e.q(0).lost().is_none() && e.q(1).lost().is_none());
    assert!(e.device.lost().is_none());
    let ok = e.sem();
    e.q(0).execute(&[], &[(&ok, 1)], &[&cb]).unwrap();
    e.q(1).execute(&[(&ok, 1)], &[(&ok, 2)], &[]).unwrap();
    wait(&ok, 2);
    assert_all(&out, v, "work after the failure");
}

fn host_calls_run_in_order_and_fail_their_signals(mode: CommandBufferMode) {
    let mut e = env(mode, 2);
    let (s, h, t) = (e.sem(), e.sem(), e.sem());
    let out = e.buffer();
    let v = e.value();

    // Ordering on its queue: a host call with no waits runs after the earlier (slow) kernel.
    let slow = e.fill_cb(0, SPIN_NS, &out, v);
    e.q(0).execute(&[], &[(&s, 1)], &[&slow]).unwrap();
    // What the host call saw: the earlier batch's signal and the buffer it wrote.
    type Seen = Option<(u64, Vec<u32>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    {
        let (seen, s, out) = (seen.clone(), s.clone(), out.clone());
        e.q(0)
            .host_call(&[], &[(&h, 1)], move || {
                *seen.lock().unwrap() = Some((s.query().unwrap_or(0), read_u32(&out)));
                Ok(())
            })
            .unwrap();
    }
    wait(&h, 1);
    let (s_seen, data) = seen.lock().unwrap().take().expect("the host call ran");
    assert_eq!(
        s_seen, 1,
        "the host call ran before the earlier batch signalled"
    );
    assert!(
        data.iter().all(|w| *w == v),
        "the host call ran before the kernel finished"
    );

    // Ordering by its waits: not before a host signal; a device batch then waits on it.
    let w = e.sem();
    let ran = Arc::new(AtomicU64::new(0));
    {
        let ran = ran.clone();
        e.q(1)
            .host_call(&[(&w, 1)], &[(&h, 2)], move || {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .unwrap();
    }
    let out2 = e.buffer();
    let v2 = e.value();
    let after = e.fill_cb(0, 0, &out2, v2);
    e.q(0).execute(&[(&h, 2)], &[(&t, 1)], &[&after]).unwrap();
    std::thread::sleep(GRACE);
    assert_eq!(ran.load(Ordering::SeqCst), 0, "ran before its wait");
    assert_all(&out2, POISON, "the batch after the host call ran first");
    w.signal(1).unwrap();
    wait(&t, 1);
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_all(&out2, v2, "the batch after the host call");

    // A host call returning an error fails its signals, and what waits on them, with that error.
    let (x, y, z) = (e.sem(), e.sem(), e.sem());
    let refused = Failure::msg("host call refused");
    {
        let refused = refused.clone();
        e.q(1)
            .host_call(&[], &[(&x, 1), (&y, 4)], move || Err(refused))
            .unwrap();
    }
    e.q(0).execute(&[(&x, 1)], &[(&z, 1)], &[&after]).unwrap();
    for (name, sem, value) in [("x", &x, 1), ("y", &y, 4), ("z", &z, 1)] {
        let got = failure_of(sem, value);
        assert!(got.ptr_eq(&refused), "{name} failed with {got}");
    }

    // A panicking host call fails its signals too, and the queue goes on.
    let p = e.sem();
    e.q(1)
        .host_call(&[], &[(&p, 1)], || {
            panic!("deliberate panic in a host call")
        })
        .unwrap();
    let got = failure_of(&p, 1);
    assert!(got.to_string().contains("panicked"), "{got}");

    // A host call whose wait fails is not called; its signals carry the upstream failure.
    let (up, down) = (e.sem(), e.sem());
    let called = Arc::new(AtomicBool::new(false));
    {
        let called = called.clone();
        e.q(0)
            .host_call(&[(&up, 1)], &[(&down, 1)], move || {
                called.store(true, Ordering::SeqCst);
                Ok(())
            })
            .unwrap();
    }
    let upstream = Failure::msg("upstream");
    up.fail(upstream.clone());
    assert!(failure_of(&down, 1).ptr_eq(&upstream));
    settle(e.q(0));
    settle(e.q(1));
    assert!(!called.load(Ordering::SeqCst));
    assert!(e.q(0).lost().is_none() && e.q(1).lost().is_none());
}

fn alloca_and_dealloca_are_ordered_by_semaphores(mode: CommandBufferMode) {
    let mut e = env(mode, 2);
    let (h, a) = (e.sem(), e.sem());
    let len = WORDS * 4;
    let v = e.value();
    // The alloca waits on a host signal; the address is known at once, so the fill that uses
    // it can be recorded now, and submitted on the other queue behind the alloca's signal.
    let buffer = e.q(0).alloca(&[(&h, 1)], &[(&a, 1)], len).unwrap();
    assert_eq!(buffer.len(), len);
    let fill = e.fill_cb(1, 0, &buffer, v);
    e.q(1).execute(&[(&a, 1)], &[(&a, 2)], &[&fill]).unwrap();
    let mut host = e.device.create_host_buffer(len + 8).unwrap();
    Arc::get_mut(&mut host)
        .expect("no queued work holds the buffer")
        .write(0, &vec![0xA5; len + 8])
        .unwrap();
    e.q(1)
        .read(&[(&a, 2)], &[(&a, 3)], &buffer.whole(), &host, 4)
        .unwrap();
    e.q(0).dealloca(&[(&a, 3)], &[(&a, 4)], &buffer).unwrap();
    std::thread::sleep(GRACE);
    assert_eq!(value_of(&a), 0, "the alloca signalled before its wait");
    h.signal(1).unwrap();
    wait(&a, 4);
    let mut bytes = vec![0u8; len + 8];
    host.read(0, &mut bytes).unwrap();
    assert_eq!(&bytes[..4], &[0xA5; 4], "the read wrote before its offset");
    assert_eq!(
        &bytes[len + 4..],
        &[0xA5; 4],
        "the read wrote past its range"
    );
    let expected: Vec<u8> = std::iter::repeat_n(v.to_ne_bytes(), WORDS)
        .flatten()
        .collect();
    assert!(
        bytes[4..len + 4] == expected[..],
        "the alloca'd buffer's contents"
    );

    // Alloca again after the dealloca (the pool may hand the same memory back), fill it on the
    // queue, read it back: the old contents must not show through.
    let v2 = e.value();
    let again = e.q(0).alloca(&[(&a, 4)], &[(&a, 5)], len).unwrap();
    e.q(0)
        .fill(&[(&a, 5)], &[(&a, 6)], &again.whole(), FillPattern::U32(v2))
        .unwrap();
    e.q(0)
        .read(&[(&a, 6)], &[(&a, 7)], &again.whole(), &host, 0)
        .unwrap();
    e.q(0).dealloca(&[(&a, 7)], &[(&a, 8)], &again).unwrap();
    wait(&a, 8);
    host.read(0, &mut bytes[..len]).unwrap();
    let expected: Vec<u8> = std::iter::repeat_n(v2.to_ne_bytes(), WORDS)
        .flatten()
        .collect();
    assert!(
        bytes[..len] == expected[..],
        "the second allocation's contents"
    );

    // Only alloca'd buffers can be dealloca'd.
    let plain = e.buffer();
    assert!(matches!(
        e.q(0).dealloca(&[], &[], &plain),
        Err(Error::InvalidArgument(_))
    ));
    settle(e.q(0));
    settle(e.q(1));
    assert_eq!(e.q(0).stats().failed + e.q(1).stats().failed, 0);
}

fn read_write_round_trips(mode: CommandBufferMode) {
    let Env {
        device: dev,
        mut rng,
        ..
    } = env(mode, 1);
    let q = dev.queue(0);
    let s = dev.create_semaphore(0);
    let capacity = (1 << 20) + 64;
    let device = dev.create_buffer(capacity).unwrap();
    let copy_target = dev.create_buffer(capacity).unwrap();
    let mut host = dev.create_host_buffer(capacity).unwrap();
    // Each operation waits on the previous one's signal.
    let mut next = 0u64;
    let mut step = || {
        next += 1;
        (next - 1, next)
    };
    for len in [1usize, 2, 3, 7, 64, 4095, 4096, 65_537, 1 << 20] {
        let room = capacity - len;
        let offset = (rng.next_u64() as usize) % (room + 1);
        let host_offset = (rng.next_u64() as usize) % (room + 1);
        let copy_offset = (rng.next_u64() as usize) % (room + 1);
        let data: Vec<u8> = (0..len).map(|_| rng.next_u32() as u8).collect();
        let poison_byte = (rng.next_u32() as u8) | 1;
        for buffer in [&device, &copy_target] {
            buffer.write(0, &vec![poison_byte; capacity]).unwrap();
        }
        // Only possible once the previous round's read released the buffer.
        Arc::get_mut(&mut host)
            .expect("no queued work holds the buffer")
            .write(0, &vec![poison_byte ^ 0xFF; capacity])
            .unwrap();
        let range = device.range(offset, len).unwrap();
        let copied = copy_target.range(copy_offset, len).unwrap();
        let (w0, s1) = step();
        q.write(&[(&s, w0)], &[(&s, s1)], &range, &data).unwrap();
        let (w1, s2) = step();
        q.copy(&[(&s, w1)], &[(&s, s2)], &range, &copied).unwrap();
        let (w2, s3) = step();
        q.read(&[(&s, w2)], &[(&s, s3)], &copied, &host, host_offset)
            .unwrap();
        wait(&s, s3);
        let mut back = vec![0u8; capacity];
        host.read(0, &mut back).unwrap();
        assert!(
            back[host_offset..host_offset + len] == data[..],
            "{len} bytes at device offset {offset}, copy offset {copy_offset}, host offset {host_offset}: round trip differs"
        );
        let outside = back[..host_offset]
            .iter()
            .chain(&back[host_offset + len..])
            .all(|b| *b == poison_byte ^ 0xFF);
        assert!(outside, "{len} bytes: the read wrote outside its range");
        for (name, buffer, at) in [
            ("written", &device, offset),
            ("copied", &copy_target, copy_offset),
        ] {
            buffer.read(0, &mut back).unwrap();
            assert!(back[at..at + len] == data[..], "{name} buffer, {len} bytes");
            let outside = back[..at]
                .iter()
                .chain(&back[at + len..])
                .all(|b| *b == poison_byte);
            assert!(outside, "{len} bytes: the {name} range spilled");
        }
    }

    // Fills of every pattern size, at offsets their size allows.
    for pattern in [
        FillPattern::U8(rng.next_u32() as u8),
        FillPattern::U16(rng.next_u32() as u16),
        FillPattern::U32(rng.next_u32()),
    ] {
        let size = pattern.size();
        let offset = size * (1 + (rng.next_u64() as usize) % 1000);
        let len = size * (1 + (rng.next_u64() as usize) % 5000);
        device.write(0, &vec![0x5A; capacity]).unwrap();
        let (w, s1) = step();
        q.fill(
            &[(&s, w)],
            &[(&s, s1)],
            &device.range(offset, len).unwrap(),
            pattern,
        )
        .unwrap();
        wait(&s, s1);
        let mut back = vec![0u8; capacity];
        device.read(0, &mut back).unwrap();
        let value = pattern.value().to_ne_bytes();
        for (i, b) in back.iter().enumerate() {
            let expected = if (offset..offset + len).contains(&i) {
                value[(i - offset) % size]
            } else {
                0x5A
            };
            assert_eq!(
                *b, expected,
                "{pattern:?} at byte {i} (fill [{offset}, +{len}))"
            );
        }
    }
    settle(q);
    assert_eq!(q.stats().failed, 0);
}

fn queue_waits_on_another_queue_on_the_device(mode: CommandBufferMode) {
    let mut e = env(mode, 2);
    let (x, y) = (e.sem(), e.sem());
    let (src, dst) = (e.buffer(), e.buffer());
    for round in 1..=3u64 {
        poison(&src, POISON);
        poison(&dst, POISON);
        let (v, k) = (e.value(), e.value());
        let produce = e.fill_cb(1, SPIN_NS, &src, v);
        let consume = e.add_cb(0, &dst, &src, k);
        e.q(1).execute(&[], &[(&x, round)], &[&produce]).unwrap();
        let before = e.q(0).stats();
        e.q(0)
            .execute(&[(&x, round)], &[(&y, round)], &[&consume])
            .unwrap();
        let after = e.q(0).stats();
        // Queue 2's signal was recorded and not yet reached (its kernel spins 2 ms): queue 1's
        // batch went out at once with a device-side wait, not through a host round trip.
        // (The host value of `x` may still lag at `round - 1` or below: its queue's completion
        // thread brings it up to date on its own time.)
        assert!(
            value_of(&x) < round,
            "round {round}: the producer finished within microseconds?"
        );
        assert_eq!(after.issued_on_submit, before.issued_on_submit + 1);
        assert_eq!(after.issued_by_worker, before.issued_by_worker);
        wait(&y, round);
        assert_all(
            &dst,
            v.wrapping_add(k),
            "the consumer saw the producer's result",
        );
    }
}

fn ten_thousand_chained_submissions_across_two_queues(mode: CommandBufferMode) {
    const COUNT: u64 = 10_000;
    let e = env(mode, 2);
    let chain = e.sem();
    let counter = e.device.create_buffer(4).unwrap();
    poison(&counter, 0);
    let cbs: Vec<_> = (0..2)
        .map(|q| {
            command_buffer(e.q(q), |cb| {
                record_increment(cb, &e.kernels, &counter.whole())
            })
        })
        .collect();
    let (created_before, _) = e.device.event_counts();
    let start = Instant::now();
    for i in 0..COUNT {
        let q = (i % 2) as usize;
        e.q(q)
            .execute(&[(&chain, i)], &[(&chain, i + 1)], &[&cbs[q]])
            .unwrap();
    }
    let submitted = start.elapsed();
    chain.wait(COUNT, Duration::from_secs(30)).unwrap();
    let waited = start.elapsed();
    assert_eq!(value_of(&chain), COUNT);
    assert_eq!(
        read_u32(&counter),
        vec![COUNT as u32],
        "every increment ran once, in order"
    );
    settle(e.q(0));
    settle(e.q(1));
    for q in 0..2 {
        let stats = e.q(q).stats();
        assert_eq!(stats.submitted, COUNT / 2, "queue {q}: {stats:?}");
        assert_eq!(stats.completed, COUNT / 2, "queue {q}: {stats:?}");
        assert_eq!(stats.failed, 0);
        assert_eq!(stats.pending, 0);
    }
    let (created, in_use) = e.device.event_counts();
    println!(
        "{COUNT} submissions: submitted in {submitted:?}, done in {waited:?}; events created {created_before} -> {created}, in use {in_use}"
    );
    assert!(in_use <= 2, "{in_use} events still in use: leaked");
    assert_eq!(chain.timepoint_count(), 0, "timepoints left behind");
    assert_eq!(chain.listener_count(), 0, "listeners left behind");
}

fn dropping_the_device_fails_pending_work(mode: CommandBufferMode) {
    let mut e = env(mode, 2);
    let (never, s, t, done) = (e.sem(), e.sem(), e.sem(), e.sem());
    let out = e.buffer();
    let v = e.value();
    let cb = e.fill_cb(0, 0, &out, v);
    // Issued work completes; pending work fails.
    e.q(1).execute(&[], &[(&done, 1)], &[&cb]).unwrap();
    e.q(0).execute(&[(&never, 1)], &[(&s, 1)], &[&cb]).unwrap();
    e.q(1).execute(&[(&s, 1)], &[(&t, 1)], &[]).unwrap();
    let called = Arc::new(AtomicBool::new(false));
    {
        let called = called.clone();
        e.q(0)
            .host_call(&[(&never, 2)], &[], move || {
                called.store(true, Ordering::SeqCst);
                Ok(())
            })
            .unwrap();
    }
    let Env {
        device, kernels, ..
    } = e;
    let start = Instant::now();
    drop(device);
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "dropping the device took {took:?}"
    );
    wait(&done, 1);
    assert_all(&out, v, "issued work completed");
    for (name, sem) in [("s", &s), ("t", &t)] {
        let failure = failure_of(sem, 1);
        assert!(
            matches!(
                failure.downcast_ref::<cuhal_scheduler::Error>(),
                Some(cuhal_scheduler::Error::ShutDown { .. })
            ),
            "{name} failed with {failure}"
        );
    }
    assert!(!called.load(Ordering::SeqCst), "a pending host call ran");
    assert_eq!(value_of(&never), 0);
    // The command buffer, buffers and kernels outlive the device.
    drop((cb, kernels, out));
}

fn rejected_operations_change_nothing(mode: CommandBufferMode) {
    let e = env(mode, 1);
    let q = e.q(0);
    let s = e.sem();
    let buffer = e.buffer();
    let host = e.device.create_host_buffer(16).unwrap();
    let misaligned = buffer.range(2, 8).unwrap();
    assert!(matches!(
        q.fill(&[], &[(&s, 1)], &misaligned, FillPattern::U32(1)),
        Err(Error::Command(cuhal_command::Error::Misaligned { .. }))
    ));
    assert!(matches!(
        q.copy(
            &[],
            &[(&s, 1)],
            &buffer.range(0, 64).unwrap(),
            &buffer.range(32, 64).unwrap()
        ),
        Err(Error::Command(cuhal_command::Error::OverlappingCopy { .. }))
    ));
    assert!(matches!(
        q.copy(
            &[],
            &[(&s, 1)],
            &buffer.range(0, 8).unwrap(),
            &buffer.range(64, 16).unwrap()
        ),
        Err(Error::Command(cuhal_command::Error::LengthMismatch { .. }))
    ));
    assert!(matches!(
        q.read(&[], &[(&s, 1)], &buffer.range(0, 16).unwrap(), &host, 1),
        Err(Error::Command(cuhal_command::Error::OutOfBounds { .. }))
    ));
    assert!(matches!(
        q.write(&[], &[(&s, 1)], &buffer.range(0, 4).unwrap(), &[1, 2, 3]),
        Err(Error::Command(cuhal_command::Error::LengthMismatch { .. }))
    ));
    assert!(matches!(
        q.alloca(&[], &[(&s, 1)], 0),
        Err(Error::Command(cuhal_command::Error::ZeroSize { .. }))
    ));
    // A command buffer that has not ended is not a `CommandBuffer` and cannot be passed to
    // `execute` at all: a compile-fail doctest in the `cuhal` crate's docs keeps it so.
    assert_eq!(q.stats().submitted, 0, "a rejected operation was submitted");
    assert_eq!(value_of(&s), 0);
    assert_all(&buffer, POISON, "a rejected operation wrote");
}

// ---------------------------------------------------------------------------------------------
// Submissions at the driver's floor: no hand-offs, no needless waits, batched retirement

/// `steps` poisoned one-word-per-thread buffers and, for each step `i >= 1`, a command buffer of
/// queue `queue_of(i)` computing `buffers[i] = buffers[i - 1] + 1`: a step that ran before the
/// one it depends on would read poison.
fn add_chain(
    e: &Env,
    steps: usize,
    queue_of: impl Fn(usize) -> usize,
) -> (Vec<Arc<Buffer>>, Vec<Arc<dyn cuhal::CommandBuffer>>) {
    let buffers: Vec<_> = (0..=steps).map(|_| e.buffer()).collect();
    let cbs = (1..=steps)
        .map(|i| e.add_cb(queue_of(i), &buffers[i], &buffers[i - 1], 1))
        .collect();
    (buffers, cbs)
}

fn a_host_signal_issues_an_alternating_chain_on_its_own_thread(mode: CommandBufferMode) {
    const STEPS: usize = 40;
    let mut e = env(mode, 2);
    let (gate, step) = (e.sem(), e.sem());
    let (buffers, cbs) = add_chain(&e, STEPS, |i| i % 2);
    let start = e.value();
    e.q(0)
        .execute(&[], &[(&gate, 1)], &[&e.fill_cb(0, 0, &buffers[0], start)])
        .unwrap();
    wait(&gate, 1);
    let release = e.sem();
    for i in 1..=STEPS {
        let waits = if i == 1 {
            [(&release, 1)]
        } else {
            [(&step, i as u64 - 1)]
        };
        e.q(i % 2)
            .execute(&waits, &[(&step, i as u64)], &[&cbs[i - 1]])
            .unwrap();
    }
    let before = [e.q(0).stats(), e.q(1).stats()];
    // The signal issues the whole chain on this thread: each step's device signal makes the
    // next ready, on the other queue, with a device wait on it.
    release.signal(1).unwrap();
    wait(&step, STEPS as u64);
    assert_all(
        &buffers[STEPS],
        start.wrapping_add(STEPS as u32),
        "every step read the one before it",
    );
    for (q, before) in before.iter().enumerate() {
        let after = e.q(q).stats();
        assert_eq!(
            after.issued_by_worker, before.issued_by_worker,
            "queue {q}: no step went through the worker: {after:?}"
        );
        assert_eq!(
            after.issued_on_signal - before.issued_on_signal,
            STEPS as u64 / 2,
            "queue {q}: {after:?}"
        );
    }
}

fn a_chain_on_one_queue_relies_on_stream_order(mode: CommandBufferMode) {
    const STEPS: usize = 40;
    let mut e = env(mode, 1);
    let (gate, step) = (e.sem(), e.sem());
    let (buffers, cbs) = add_chain(&e, STEPS, |_| 0);
    let start = e.value();
    let first = e.fill_cb(0, SPIN_NS, &buffers[0], start);
    // Every step waits for the one before on the same queue: no cuStreamWaitEvent is needed (the
    // stream runs them in order), and the result shows that order held.
    for i in 0..=STEPS {
        let waits = if i == 0 {
            [(&gate, 1)]
        } else {
            [(&step, i as u64)]
        };
        let cb = if i == 0 { &first } else { &cbs[i - 1] };
        e.q(0)
            .execute(&waits, &[(&step, i as u64 + 1)], &[cb])
            .unwrap();
    }
    gate.signal(1).unwrap();
    wait(&step, STEPS as u64 + 1);
    assert_all(
        &buffers[STEPS],
        start.wrapping_add(STEPS as u32),
        "every step ran after the one before it",
    );
    settle(e.q(0));
    assert_eq!(e.q(0).stats().failed, 0);
}

/// `timing_`: it assumes the host submits the backlog well within the 2 ms kernel, which an
/// instrumented kernel and driver (`run --sanitize`) do not keep, so the sanitizer run skips it.
fn timing_a_backlog_behind_a_long_kernel_retires_in_batches(mode: CommandBufferMode) {
    const COUNT: u64 = 200;
    let mut e = env(mode, 1);
    let s = e.sem();
    let out = e.buffer();
    let v = e.value();
    let slow = e.fill_cb(0, SPIN_NS, &out, v);
    let counter = e.device.create_buffer(4).unwrap();
    poison(&counter, 0);
    let increment = command_buffer(e.q(0), |cb| {
        record_increment(cb, &e.kernels, &counter.whole())
    });
    e.q(0).execute(&[], &[(&s, 1)], &[&slow]).unwrap();
    for value in 2..=COUNT {
        e.q(0).execute(&[], &[(&s, value)], &[&increment]).unwrap();
    }
    // A waiter on a value in the middle and one on the last: both return with the work done.
    let middle = {
        let s = s.clone();
        std::thread::spawn(move || s.wait(COUNT / 2, TIMEOUT))
    };
    wait(&s, COUNT);
    middle.join().unwrap().unwrap();
    assert_all(&out, v, "the long kernel ran");
    assert_eq!(read_u32(&counter), vec![COUNT as u32 - 1]);
    settle(e.q(0));
    let stats = e.q(0).stats();
    println!("{COUNT} submissions behind a 2 ms kernel: {stats:?}");
    assert_eq!((stats.completed, stats.failed), (COUNT, 0));
    assert!(
        stats.retire_batches < COUNT / 4,
        "the backlog retired in a few batches: {stats:?}"
    );
}

fn idle_queues_park_their_threads(mode: CommandBufferMode) {
    let mut e = env(mode, 2);
    let s = e.sem();
    let out = e.buffer();
    let v = e.value();
    let cb = e.fill_cb(0, 0, &out, v);
    for value in 1..=50 {
        e.q((value % 2) as usize)
            .execute(&[(&s, value - 1)], &[(&s, value)], &[&cb])
            .unwrap();
    }
    wait(&s, 50);
    let deadline = Instant::now() + TIMEOUT;
    for q in 0..2 {
        settle(e.q(q));
        while !(e.q(q).stats().completion_parked && e.q(q).stats().worker_parked) {
            assert!(Instant::now() < deadline, "queue {q}: {:?}", e.q(q).stats());
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let before: Vec<_> = (0..2).map(|q| e.q(q).stats()).collect();
    std::thread::sleep(Duration::from_millis(50));
    for (q, before) in before.iter().enumerate() {
        let after = e.q(q).stats();
        assert!(after.completion_parked && after.worker_parked, "{after:?}");
        assert_eq!(
            (after.completion_parks, after.worker_parks),
            (before.completion_parks, before.worker_parks),
            "queue {q}: an idle queue's threads stay parked"
        );
    }
}

/// A buffer's last reference going while a long kernel runs waits neither for that kernel nor
/// for anything else: another queue's work is submitted and completes meanwhile. (`cuMemFree`
/// waits for the whole device, holding the driver's lock: a buffer dropped on the completion
/// thread stalled every other queue's submissions until all running work ended.)
fn dropping_a_buffer_leaves_the_device_running(mode: CommandBufferMode) {
    /// Long enough that a drop that waited for the device cannot be missed.
    const LONG_NS: u64 = 1_000_000_000;
    let mut e = env(mode, 2);
    let (long, quick) = (e.sem(), e.sem());
    let (out, v) = (e.buffer(), e.value());
    let slow = e.fill_cb(0, LONG_NS, &out, v);
    let (other, x) = (e.buffer(), e.value());
    let other_fill = e.fill_cb(1, 0, &other, x);
    // A buffer that finished work used, held by nothing but this test once that work retired.
    let (dropped, w) = (e.buffer(), e.value());
    let fill = e.fill_cb(1, 0, &dropped, w);
    e.q(1).execute(&[], &[(&quick, 1)], &[&fill]).unwrap();
    wait(&quick, 1);
    assert_all(&dropped, w, "the dropped buffer's work ran");
    drop(fill);
    settle(e.q(1));
    assert_eq!(Arc::strong_count(&dropped), 1, "only the test holds it");

    e.q(0).execute(&[], &[(&long, 1)], &[&slow]).unwrap();
    let started = Instant::now();
    drop(dropped);
    let dropping = started.elapsed();
    e.q(1).execute(&[], &[(&quick, 2)], &[&other_fill]).unwrap();
    wait(&quick, 2);
    let meanwhile = started.elapsed();
    assert_eq!(
        value_of(&long),
        0,
        "the 1 s kernel must still run after the drop ({dropping:?}) and another queue's \
         work ({meanwhile:?}): the drop waited for the device"
    );
    wait(&long, 1);
    assert_all(&out, v, "the long kernel ran");
    assert_all(&other, x, "the other queue's work ran");
    println!("dropping the buffer took {dropping:?}; with the other queue's work, {meanwhile:?}");
}
