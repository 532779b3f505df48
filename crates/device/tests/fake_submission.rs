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
    cb.end().unwrap();
    let cb: Arc<dyn CommandBuffer> = Arc::from(cb);
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
