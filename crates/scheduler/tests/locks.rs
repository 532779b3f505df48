//! How often a submission takes each semaphore's lock, and that none is held across the
//! backend's issue. A chained submission (waits for `v` on a semaphore and signals `v + 1` on it)
//! takes that lock twice, once for the look at its wait and once for the record of its signal,
//! and not while the backend issues (a driver call under it would make the completion side and
//! every other queue wait for the driver); on a backend whose stream orders its own events, a
//! chain on one queue skips the look (stream order satisfies the wait) unless the semaphore
//! failed. A pending submission released by a semaphore's change needs no look at the wait that
//! change answered: the notification says what the semaphore did (a host signal's value, a
//! recorded device signal's event), so a chain released by one host signal takes the chain
//! semaphore's lock once per step, for its record. Actions that name several semaphores, in
//! opposite list orders on two threads, do not deadlock.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use cuhal_scheduler::host::{self, HostSemaphore};
use cuhal_scheduler::{Cleanups, Failure, Queue, QueueOptions, Resources};
use cuhal_semaphore::Semaphore;
use cuhal_semaphore::testing::FlagEvent;

use support::{Hooks, Script, Scripted, eventually, submit_nop};

/// Looks at the test's semaphores while the backend issues: a lock held there is one the
/// issue's driver calls would hold.
struct Probe {
    watched: Vec<Semaphore<FlagEvent>>,
    issues: AtomicU64,
    held_during_issue: AtomicU64,
    /// Whether the backend orders later work after its own events, as a stream does.
    ordered: bool,
}

impl Hooks for Probe {
    fn issue(&self, _payload: &Script) {
        self.issues.fetch_add(1, Ordering::Relaxed);
        if self.watched.iter().any(Semaphore::lock_is_held) {
            self.held_during_issue.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn orders_own_events(&self) -> bool {
        self.ordered
    }
}

/// The scripted backend, probing the watched semaphores' locks at every issue.
type Probing = Scripted<Probe>;

/// Queues whose events complete only when the test completes them, so that no completion thread
/// touches the semaphores while the test counts.
fn held_queues(n: usize, watched: &[&Semaphore<FlagEvent>]) -> Vec<Queue<Probing>> {
    queues_of(n, watched, false)
}

/// [`held_queues`], whose backends order their later work after their own events when
/// `ordered` (as a CUDA stream does).
fn queues_of(n: usize, watched: &[&Semaphore<FlagEvent>], ordered: bool) -> Vec<Queue<Probing>> {
    (0..n)
        .map(|q| {
            let probe = Probe {
                watched: watched.iter().map(|s| (*s).clone()).collect(),
                issues: AtomicU64::new(0),
                held_during_issue: AtomicU64::new(0),
                ordered,
            };
            let backend = Scripted::with_hooks(false, probe);
            Queue::new(backend, QueueOptions::new(format!("q{q}"))).unwrap()
        })
        .collect()
}

fn complete_all(queues: &[Queue<Probing>]) {
    for queue in queues {
        queue.backend().complete_all();
    }
}

/// Every queue issued `issues` actions in all, none with a watched semaphore's lock held.
fn no_lock_held_during_issue(queues: &[Queue<Probing>], issues: u64) {
    let total: u64 = queues
        .iter()
        .map(|q| q.backend().hooks.issues.load(Ordering::Relaxed))
        .sum();
    assert_eq!(total, issues, "every action reached the backend");
    for queue in queues {
        assert_eq!(
            queue
                .backend()
                .hooks
                .held_during_issue
                .load(Ordering::Relaxed),
            0,
            "a semaphore lock was held across the backend's issue"
        );
    }
}

/// Submits action `id` to `queue`: one wait, one signal.
fn submit(
    queue: &Queue<Probing>,
    wait: (&Semaphore<FlagEvent>, u64),
    signal: (&Semaphore<FlagEvent>, u64),
    id: u64,
) {
    queue
        .submit(
            &[wait],
            &[signal],
            Script::id(id),
            Resources::new(),
            Cleanups::new(),
        )
        .unwrap();
}

/// Submits step `i` of a chain on `chain` (wait for `i`, signal `i + 1`) to queue `i % n`;
/// returns how often the step took the chain's lock.
fn chain_step(queues: &[Queue<Probing>], chain: &Semaphore<FlagEvent>, i: u64) -> u64 {
    let before = chain.lock_count();
    submit(
        &queues[i as usize % queues.len()],
        (chain, i),
        (chain, i + 1),
        i,
    );
    chain.lock_count() - before
}

#[test]
fn a_chained_submission_locks_its_semaphore_twice_and_not_across_the_issue() {
    for n in [1, 2] {
        let chain = Semaphore::<FlagEvent>::new(0);
        let queues = held_queues(n, &[&chain]);
        const STEPS: u64 = 20;
        for i in 0..STEPS {
            let locks = chain_step(&queues, &chain, i);
            let held: u64 = queues
                .iter()
                .map(|q| q.backend().hooks.held_during_issue.load(Ordering::Relaxed))
                .sum();
            assert_eq!(
                held, 0,
                "step {i}: the chain's lock was held across the issue"
            );
            assert_eq!(
                locks, 2,
                "step {i} on {n} queue(s): one lock for the wait's look, one for the signal's record"
            );
        }
        no_lock_held_during_issue(&queues, STEPS);
        for queue in &queues {
            assert_eq!(queue.stats().issued_on_submit, STEPS / n as u64);
        }
        complete_all(&queues);
        chain.wait(STEPS, Duration::from_secs(5)).unwrap();
    }
}

/// On a backend whose stream orders its own events, a chain on one queue waits for the value
/// that queue's last issue recorded: the look at the semaphore finds the recorded signal, which
/// the backend [orders](cuhal_scheduler::Backend::orders) its later work after, so the step is issued with no
/// device wait (and no handle to the event is made). Alternating between two queues, each wait
/// is for the other queue's record, which the step waits for on the device. Either way the
/// semaphore is locked twice per step: the wait's look and the signal's record.
#[test]
fn a_chain_on_one_ordered_queue_needs_no_device_wait() {
    for n in [1, 2] {
        let chain = Semaphore::<FlagEvent>::new(0);
        let queues = queues_of(n, &[&chain], true);
        const STEPS: u64 = 20;
        for i in 0..STEPS {
            assert_eq!(
                chain_step(&queues, &chain, i),
                2,
                "step {i} on {n} queue(s)"
            );
        }
        no_lock_held_during_issue(&queues, STEPS);
        for queue in &queues {
            for issued in queue.backend().issued.lock().unwrap().iter() {
                // The first step waits on the initial value: nothing to wait for.
                let want = usize::from(n == 2 && issued.id > 0);
                assert_eq!(
                    issued.device_waits.len(),
                    want,
                    "step {} on {n} queue(s)",
                    issued.id
                );
            }
        }
        complete_all(&queues);
        chain.wait(STEPS, Duration::from_secs(5)).unwrap();
    }
}

/// A chain on one ordered queue still fails an action whose wait semaphore
/// failed, with that failure, as a look at the semaphore would: the action is not issued and
/// its signals fail.
#[test]
fn a_chained_wait_on_a_failed_semaphore_fails_even_when_stream_order_would_satisfy_it() {
    let chain = Semaphore::<FlagEvent>::new(0);
    let out = Semaphore::<FlagEvent>::new(0);
    let queues = queues_of(1, &[&chain, &out], true);
    let queue = &queues[0];
    submit(queue, (&chain, 0), (&chain, 1), 0);
    chain.fail(Failure::msg("upstream failure"));
    submit(queue, (&chain, 1), (&out, 1), 1);
    assert_eq!(
        queue.backend().hooks.issues.load(Ordering::Relaxed),
        1,
        "the action behind the failed wait was issued"
    );
    let err = out.wait(1, Duration::from_secs(5)).unwrap_err();
    assert!(
        err.to_string().contains("upstream failure"),
        "the signal failed with another failure: {err}"
    );
    complete_all(&queues);
}

#[test]
fn a_submission_released_by_a_host_signal_needs_no_look_at_its_wait() {
    let (gate, out) = (
        Semaphore::<FlagEvent>::new(0),
        Semaphore::<FlagEvent>::new(0),
    );
    let queues = held_queues(1, &[&gate, &out]);
    let queue = &queues[0];
    for value in 1..=10 {
        submit(queue, (&gate, value), (&out, value), value);
        assert_eq!(queue.stats().pending, 1);
        let (g, o) = (gate.lock_count(), out.lock_count());
        gate.signal(value).unwrap();
        assert_eq!(queue.stats().pending, 0, "issued inside the signal");
        assert_eq!(
            (gate.lock_count() - g, out.lock_count() - o),
            (1, 1),
            "value {value}: the signal's own lock, and no look at the wait; one record"
        );
    }
    assert_eq!(queue.stats().issued_on_signal, 10);
    no_lock_held_during_issue(&queues, 10);
    complete_all(&queues);
    out.wait(10, Duration::from_secs(5)).unwrap();
}

/// A chain across two queues, every step pending (step 0 on a gate, step `i` on the chain's value
/// `i`), released by one host signal: each step is issued on the signalling thread as the step
/// before records its signal, waits on the device for exactly that step's event (handed over by
/// the record's notification), and the chain semaphore's lock is taken once per step, for the
/// record alone.
#[test]
fn a_chain_released_by_a_host_signal_issues_each_step_on_the_event_its_notice_handed_over() {
    let (gate, chain) = (
        Semaphore::<FlagEvent>::new(0),
        Semaphore::<FlagEvent>::new(0),
    );
    let queues = held_queues(2, &[&gate, &chain]);
    const STEPS: u64 = 20;
    submit(&queues[0], (&gate, 1), (&chain, 1), 0);
    for i in 1..STEPS {
        chain_step(&queues, &chain, i);
    }
    let before = chain.lock_count();
    gate.signal(1).unwrap();
    assert_eq!(
        chain.lock_count() - before,
        STEPS,
        "one lock per step, for its record: no step looked at its wait"
    );
    let mut issued: Vec<(u64, Vec<FlagEvent>, FlagEvent)> = queues
        .iter()
        .flat_map(|q| {
            q.backend()
                .issued
                .lock()
                .unwrap()
                .iter()
                .map(|i| (i.id, i.device_waits.clone(), i.event.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    issued.sort_by_key(|(id, _, _)| *id);
    assert_eq!(
        issued.len() as u64,
        STEPS,
        "every step issued inside the signal"
    );
    for step in 1..STEPS as usize {
        let (_, waits, _) = &issued[step];
        assert!(
            waits.len() == 1 && waits[0].ptr_eq(&issued[step - 1].2),
            "step {step} waited on {} events, not on step {}'s",
            waits.len(),
            step - 1
        );
    }
    let signalled: u64 = queues.iter().map(|q| q.stats().issued_on_signal).sum();
    assert_eq!(signalled, STEPS);
    no_lock_held_during_issue(&queues, STEPS);
    complete_all(&queues);
    chain.wait(STEPS, Duration::from_secs(5)).unwrap();
}

/// Two threads, each chaining actions that wait on both semaphores and signal both, listed in
/// opposite orders: no thread holds one semaphore's lock while it waits for another's, so
/// neither waits for the other forever. The values signalled rise across both threads (each
/// takes the next under a lock and submits under it, so every signal is above the values
/// reached when it is submitted); the two queues' completion threads advance both semaphores in
/// opposite orders while the other thread's submission looks at both.
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
    let next = std::sync::Mutex::new(0u64);
    thread::scope(|scope| {
        for (q, queue) in queues.iter().enumerate() {
            let (first, second) = if q == 0 { (&a, &b) } else { (&b, &a) };
            let next = &next;
            scope.spawn(move || {
                for _ in 0..STEPS {
                    let mut value = next.lock().unwrap();
                    *value += 1;
                    // Values reached long ago: always ready, so every step looks at both.
                    submit_nop(
                        queue,
                        &[(first, 0), (second, 0)],
                        &[(second, *value), (first, *value)],
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
