//! How often a submission takes each semaphore's lock: once. A chained submission (waits for `v`
//! on a semaphore and signals `v + 1` on it) looks at its wait and records its signal under one
//! lock, on one queue and across two; a pending submission released by a host signal looks at
//! its wait once more, not twice. Actions that lock several semaphores at once, in opposite list
//! orders on two threads, do not deadlock.

mod support;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use cuhal_scheduler::host::{self, HostPayload, HostSemaphore};
use cuhal_scheduler::{Cleanups, Queue, QueueOptions, Resources};
use cuhal_semaphore::Semaphore;
use cuhal_semaphore::testing::FlagEvent;

use support::{Script, Scripted, eventually};

/// Queues whose events complete only when the test completes them, so that no completion thread
/// touches the semaphores while the test counts.
fn held_queues(n: usize) -> Vec<Queue<Scripted>> {
    (0..n)
        .map(|q| Queue::new(Scripted::new(false), QueueOptions::new(format!("q{q}"))).unwrap())
        .collect()
}

fn complete_all(queues: &[Queue<Scripted>]) {
    for queue in queues {
        for issued in queue.backend().issued.lock().unwrap().iter() {
            issued.event.complete();
        }
    }
}

#[test]
fn a_chained_submission_locks_its_semaphore_once() {
    for n in [1, 2] {
        let queues = held_queues(n);
        let chain = Semaphore::<FlagEvent>::new(0);
        const STEPS: u64 = 20;
        for i in 0..STEPS {
            let before = chain.lock_count();
            queues[i as usize % n]
                .submit(
                    &[(&chain, i)],
                    &[(&chain, i + 1)],
                    Script::id(i),
                    Resources::new(),
                    Cleanups::new(),
                )
                .unwrap();
            assert_eq!(
                chain.lock_count() - before,
                1,
                "step {i} on {n} queue(s): one lock for the wait and the signal"
            );
        }
        for queue in &queues {
            assert_eq!(queue.stats().issued_on_submit, STEPS / n as u64);
        }
        complete_all(&queues);
        chain.wait(STEPS, Duration::from_secs(5)).unwrap();
    }
}

#[test]
fn a_submission_released_by_a_host_signal_looks_at_its_wait_once() {
    let queues = held_queues(1);
    let queue = &queues[0];
    let (gate, out) = (
        Semaphore::<FlagEvent>::new(0),
        Semaphore::<FlagEvent>::new(0),
    );
    for value in 1..=10 {
        queue
            .submit(
                &[(&gate, value)],
                &[(&out, value)],
                Script::id(value),
                Resources::new(),
                Cleanups::new(),
            )
            .unwrap();
        assert_eq!(queue.stats().pending, 1);
        let (g, o) = (gate.lock_count(), out.lock_count());
        gate.signal(value).unwrap();
        assert_eq!(queue.stats().pending, 0, "issued inside the signal");
        assert_eq!(
            (gate.lock_count() - g, out.lock_count() - o),
            (2, 1),
            "value {value}: the signal's own lock and one look at the wait; one record"
        );
    }
    assert_eq!(queue.stats().issued_on_signal, 10);
    complete_all(&queues);
    out.wait(10, Duration::from_secs(5)).unwrap();
}

/// Two threads, each chaining actions that wait on both semaphores and signal both, listed in
/// opposite orders: every lock is taken in id order, so neither waits for the other forever.
#[test]
fn actions_locking_two_semaphores_in_opposite_orders_do_not_deadlock() {
    let queues: Vec<_> = (0..2)
        .map(|q| host::queue(QueueOptions::new(format!("h{q}"))).unwrap())
        .collect();
    let (a, b) = (
        Arc::new(HostSemaphore::new(0)),
        Arc::new(HostSemaphore::new(0)),
    );
    const STEPS: u64 = 2_000;
    thread::scope(|scope| {
        for (q, queue) in queues.iter().enumerate() {
            let (first, second) = if q == 0 { (&a, &b) } else { (&b, &a) };
            scope.spawn(move || {
                for _ in 0..STEPS {
                    // Values reached long ago: always ready, so every step holds both locks.
                    queue
                        .submit(
                            &[(first, 0), (second, 0)],
                            &[(second, 0), (first, 0)],
                            HostPayload::Nop,
                            Resources::new(),
                            Cleanups::new(),
                        )
                        .unwrap();
                }
            });
        }
    });
    for queue in &queues {
        eventually("every action retired", || {
            let stats = queue.stats();
            stats.completed == STEPS
        });
    }
}
