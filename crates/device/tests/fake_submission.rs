//! What one submission costs the driver, counted on the fake: one context check, no wait on an
//! event of the queue's own stream, and a chain released by a host signal issued by the
//! signalling thread.

mod fake_support;

use cuhal_sys::cu_name;
use std::sync::Arc;

use cuhal::{CommandBuffer, FillPattern};
use fake_support::*;

#[test]
fn a_submission_checks_the_context_once() {
    let (fake, _driver, device) = open("one-check", queues(1));
    let queue = device.queue(0);
    let buffer = device.create_buffer(256).unwrap();
    let mut cb = queue.create_command_buffer().unwrap();
    cb.fill(&buffer.whole(), FillPattern::U32(7)).unwrap();
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    let done = device.create_semaphore(0);
    const N: u64 = 100;
    // Warm: the event pool grows to about what N submissions in flight need.
    for value in 1..=N {
        queue.execute(&[], &[(&done, value)], &[&cb]).unwrap();
    }
    wait(&done, N);
    settle(queue);
    let (events, _) = device.event_counts();
    let checks = fake.calls(cu_name!(cuCtxGetCurrent));
    let launches = fake.calls(cu_name!(cuGraphLaunch));
    for value in N + 1..=2 * N {
        queue.execute(&[], &[(&done, value)], &[&cb]).unwrap();
    }
    wait(&done, 2 * N);
    settle(queue);
    assert_eq!(fake.calls(cu_name!(cuGraphLaunch)) - launches, N);
    // Creating an event (when more are in flight than ever before) checks the context too.
    let created = (device.event_counts().0 - events) as u64;
    assert_eq!(
        fake.calls(cu_name!(cuCtxGetCurrent)) - checks,
        N + created,
        "one context check per submission ({created} events created)"
    );
}

#[test]
fn waits_on_the_queues_own_timepoints_cost_no_driver_call() {
    let (fake, _driver, device) = open("same-stream", queues(1));
    let queue = device.queue(0);
    let gate = device.create_semaphore(0);
    let step = device.create_semaphore(0);
    const STEPS: u64 = 50;
    // A chain on one queue, each step waiting for the one before, all pending behind a gate:
    // when the gate opens, each step's wait is on a completion event of this very stream.
    for i in 1..=STEPS {
        let waits = if i == 1 {
            [(&gate, 1)]
        } else {
            [(&step, i - 1)]
        };
        queue.barrier(&waits, &[(&step, i)]).unwrap();
    }
    assert_eq!(queue.stats().pending, STEPS as usize);
    let waits = fake.calls(cu_name!(cuStreamWaitEvent));
    gate.signal(1).unwrap();
    wait(&step, STEPS);
    settle(queue);
    let stats = queue.stats();
    assert_eq!(
        fake.calls(cu_name!(cuStreamWaitEvent)) - waits,
        0,
        "stream order already gives every wait: {stats:?}"
    );
    assert_eq!(
        (stats.issued_on_signal, stats.issued_by_worker),
        (STEPS, 0),
        "the signalling thread issued the whole chain"
    );
}

/// A one-fill graph command buffer of `queue`.
fn fill_command_buffer(device: &cuhal::Device, queue: &cuhal::Queue) -> Arc<dyn CommandBuffer> {
    let buffer = device.create_buffer(256).unwrap();
    let mut cb = queue.create_command_buffer().unwrap();
    cb.fill(&buffer.whole(), FillPattern::U32(3)).unwrap();
    cb.end().unwrap()
}

/// Bench case 3's pattern: B on queue 1 waits for A's signal from queue 0. Once A is issued, B
/// must be issued at once with one `cuStreamWaitEvent` on A's completion event (what the GPU
/// needs to start B right after A), not be held on the host until A's completion is seen there.
/// A is held behind a host gate so that, on this synchronous fake, nothing can see A complete
/// before B is issued: opening the gate issues A, whose recorded device signal issues B on the
/// same thread, all before `signal` returns.
#[test]
fn a_dependent_submission_on_another_queue_is_issued_with_a_device_wait() {
    let (fake, _driver, device) = open("cross-queue-wait", queues(2));
    let (q1, q2) = (device.queue(0), device.queue(1));
    let (cb_a, cb_b) = (
        fill_command_buffer(&device, q1),
        fill_command_buffer(&device, q2),
    );
    let (gate, sem_a, sem_b) = (
        device.create_semaphore(0),
        device.create_semaphore(0),
        device.create_semaphore(0),
    );
    const ROUNDS: u64 = 20;
    for value in 1..=ROUNDS {
        q1.execute(&[(&gate, value)], &[(&sem_a, value)], &[&cb_a])
            .unwrap();
        q2.execute(&[(&sem_a, value)], &[(&sem_b, value)], &[&cb_b])
            .unwrap();
        assert_eq!(
            (q1.stats().pending, q2.stats().pending),
            (1, 1),
            "round {value}: A waits for the gate, B for A"
        );
        let waits = fake.calls(cu_name!(cuStreamWaitEvent));
        let launches = fake.calls(cu_name!(cuGraphLaunch));
        gate.signal(value).unwrap();
        // Both were issued inside `signal`, B behind a device wait on A's event.
        assert_eq!(
            (q1.stats().pending, q2.stats().pending),
            (0, 0),
            "round {value}: the gate's signal issued A and B"
        );
        assert_eq!(fake.calls(cu_name!(cuGraphLaunch)) - launches, 2);
        assert_eq!(
            fake.calls(cu_name!(cuStreamWaitEvent)) - waits,
            1,
            "round {value}: B waits for A's completion event on the device"
        );
        wait(&sem_b, value);
        wait(&sem_a, value);
    }
    settle(q1);
    settle(q2);
    let (s1, s2) = (q1.stats(), q2.stats());
    assert_eq!((s1.issued_on_signal, s2.issued_on_signal), (ROUNDS, ROUNDS));
    assert_eq!(s2.issued_by_worker, 0, "no hand-off to queue 2's worker");
}

/// The bench's own order: A is ready when submitted, B is submitted right after. B is issued by
/// the submitting thread (never left pending for a host-side completion of A).
#[test]
fn a_dependent_submission_after_an_issued_one_is_issued_on_submit() {
    let (_fake, _driver, device) = open("cross-queue-submit", queues(2));
    let (q1, q2) = (device.queue(0), device.queue(1));
    let (cb_a, cb_b) = (
        fill_command_buffer(&device, q1),
        fill_command_buffer(&device, q2),
    );
    let (sem_a, sem_b) = (device.create_semaphore(0), device.create_semaphore(0));
    const ROUNDS: u64 = 50;
    for value in 1..=ROUNDS {
        q1.execute(&[], &[(&sem_a, value)], &[&cb_a]).unwrap();
        q2.execute(&[(&sem_a, value)], &[(&sem_b, value)], &[&cb_b])
            .unwrap();
        assert_eq!(
            q2.stats().pending,
            0,
            "round {value}: B was issued on submit"
        );
        wait(&sem_b, value);
        wait(&sem_a, value);
    }
    settle(q2);
    assert_eq!(q2.stats().issued_on_submit, ROUNDS);
}
