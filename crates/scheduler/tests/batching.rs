//! Batched retirement, chains issued without hand-offs, idle threads that park, and the bound on
//! what a completion side that falls behind lets pile up.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use cuhal_scheduler::host::{self, HostPayload, HostSemaphore};
use cuhal_scheduler::{Cleanup, Cleanups, Failure, Queue, QueueOptions, Resources};
use cuhal_semaphore::Semaphore;
use cuhal_semaphore::testing::FlagEvent;
use smallvec::smallvec;

use support::{Hooks, Outcomes, Script, Scripted, eventually, none, record, submit_nop};

const WAIT: Duration = Duration::from_secs(5);

/// A cleanup that holds the completion thread until `release` is set.
fn hold_until(release: &Arc<AtomicBool>) -> Cleanups {
    let release = release.clone();
    smallvec![Cleanup::once(move |_| {
        while !release.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(1));
        }
    })]
}

#[test]
fn a_failed_action_in_the_middle_of_a_batch_fails_exactly_its_signals_and_dependents() {
    let upstream = host::queue(QueueOptions::new("up")).unwrap();
    let queue = host::queue(QueueOptions::new("batch")).unwrap();
    let downstream = host::queue(QueueOptions::new("down")).unwrap();
    let bad = HostSemaphore::new(0);
    let signals: Vec<HostSemaphore> = (0..6).map(|_| HostSemaphore::new(0)).collect();
    let dependent = HostSemaphore::new(0);
    let outcomes: Outcomes = Arc::default();
    let release = Arc::new(AtomicBool::new(false));
    let trap = Failure::msg("trap upstream");

    // The upstream action fails on its device.
    let failing = trap.clone();
    let (r, c) = none();
    upstream
        .submit(
            &[],
            &[(&bad, 1)],
            HostPayload::once(move || Err(failing)),
            r,
            c,
        )
        .unwrap();
    // Action 0 holds the completion thread, so 1..=5 pile up and retire as one batch.
    submit_nop(&queue, &[], &[(&signals[0], 1)], hold_until(&release)).unwrap();
    eventually("action 0 retiring", || queue.stats().retire_batches == 1);
    for id in 1..6u64 {
        // Action 3 waits on the failing upstream signal, on the device.
        let waits: &[(&HostSemaphore, u64)] = if id == 3 { &[(&bad, 1)] } else { &[] };
        submit_nop(
            &queue,
            waits,
            &[(&signals[id as usize], 1)],
            record(&outcomes, id),
        )
        .unwrap();
    }
    // A dependent of action 3 on another queue: a device wait on its completion event.
    let (r, c) = none();
    downstream
        .submit(
            &[(&signals[3], 1)],
            &[(&dependent, 1)],
            HostPayload::Nop,
            r,
            c,
        )
        .unwrap();

    // Host waiters on every signal, parked before the batch retires.
    let waiters: Vec<_> = (1..6)
        .map(|id| {
            let semaphore = signals[id].clone();
            thread::spawn(move || semaphore.wait(1, WAIT))
        })
        .collect();
    thread::sleep(Duration::from_millis(20));
    release.store(true, Ordering::SeqCst);
    let results: Vec<_> = waiters.into_iter().map(|w| w.join().unwrap()).collect();
    for (index, result) in results.iter().enumerate() {
        let id = index + 1;
        if id == 3 {
            let failure = result.as_ref().unwrap_err().failure().unwrap().clone();
            assert!(
                failure.ptr_eq(&trap),
                "action 3 fails with the upstream failure"
            );
        } else {
            assert!(result.is_ok(), "action {id} completed: {result:?}");
        }
    }
    let error = dependent.wait(1, WAIT).unwrap_err();
    let failure = error.failure().unwrap();
    assert!(
        failure.ptr_eq(&trap),
        "the dependent fails with the same failure"
    );

    eventually("all retired", || queue.stats().retired() == 6);
    let stats = queue.stats();
    assert_eq!((stats.completed, stats.failed), (5, 1));
    assert_eq!(
        stats.retire_batches, 2,
        "actions 1 to 5 retired as one batch"
    );
    let mut outcomes = outcomes.lock().unwrap().clone();
    outcomes.sort_by_key(|(id, _)| *id);
    let failed: Vec<u64> = outcomes
        .iter()
        .filter(|(_, o)| o.is_err())
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(failed, vec![3], "cleanups see exactly action 3 fail");
    assert!(
        queue.lost().is_none(),
        "an upstream failure does not lose the queue"
    );
}

/// Declares sticky errors: the completion side then waits for a batch's newest event only.
struct StickyErrors;

impl Hooks for StickyErrors {
    const STICKY_ERRORS: bool = true;
}

#[test]
fn with_sticky_errors_a_batch_whose_newest_event_failed_finds_the_first_failed_action() {
    let queue = Queue::new(
        Scripted::with_hooks(false, StickyErrors),
        QueueOptions::new("sticky"),
    )
    .unwrap();
    let signals: Vec<Semaphore<FlagEvent>> = (0..5).map(|_| Semaphore::new(0)).collect();
    let outcomes: Outcomes = Arc::default();
    for id in 0..5u64 {
        queue
            .submit(
                &[],
                &[(&signals[id as usize], 1)],
                Script::id(id),
                Resources::new(),
                record(&outcomes, id),
            )
            .unwrap();
    }
    // The device faults at action 2: it and everything after it report the fault.
    let fault = Failure::msg("sticky fault");
    let issued = queue.backend().issued.lock().unwrap().clone();
    for entry in &issued {
        if entry.id < 2 {
            entry.event.complete();
        } else {
            entry.event.fail(fault.clone());
        }
    }
    for (id, semaphore) in signals.iter().enumerate() {
        let result = semaphore.wait(1, WAIT);
        if id < 2 {
            assert!(result.is_ok(), "action {id}: {result:?}");
        } else {
            assert!(result.unwrap_err().failure().unwrap().ptr_eq(&fault));
        }
    }
    eventually("all retired", || queue.stats().retired() == 5);
    let stats = queue.stats();
    assert_eq!((stats.completed, stats.failed), (2, 3));
    assert!(
        queue.lost().unwrap().ptr_eq(&fault),
        "a device fault loses the queue"
    );
}

#[test]
fn an_alternating_chain_across_two_queues_is_issued_by_the_signalling_thread() {
    let a = Queue::new(Scripted::new(true), QueueOptions::new("chain-a")).unwrap();
    let b = Queue::new(Scripted::new(true), QueueOptions::new("chain-b")).unwrap();
    let gate = Semaphore::<FlagEvent>::new(0);
    let step = Semaphore::<FlagEvent>::new(0);
    const STEPS: u64 = 40;
    for i in 1..=STEPS {
        let queue = if i % 2 == 1 { &a } else { &b };
        let waits: &[(&Semaphore<FlagEvent>, u64)] = if i == 1 {
            &[(&gate, 1)]
        } else {
            &[(&step, i - 1)]
        };
        let (r, c) = none();
        queue
            .submit(waits, &[(&step, i)], Script::id(i), r, c)
            .unwrap();
    }
    assert_eq!(a.stats().pending + b.stats().pending, STEPS as usize);
    gate.signal(1).unwrap();
    // Every step was issued before `signal` returned, on this thread. Each but the first waits on
    // the step before it on the device, unless the completion side had already retired that step
    // (the scripted events complete at once), in which case the wait was met on the host.
    let me = thread::current().id();
    for i in 1..=STEPS {
        let backend = if i % 2 == 1 { a.backend() } else { b.backend() };
        let issued = backend.find(i).unwrap_or_else(|| panic!("step {i} issued"));
        assert_eq!(
            issued.thread, me,
            "step {i} issued by the signalling thread"
        );
        assert!(
            issued.device_waits.len() <= usize::from(i > 1),
            "step {i}: {} device waits",
            issued.device_waits.len()
        );
    }
    step.wait(STEPS, WAIT).unwrap();
    for queue in [&a, &b] {
        let stats = queue.stats();
        assert_eq!(
            (
                stats.issued_on_signal,
                stats.issued_by_worker,
                stats.pending
            ),
            (STEPS / 2, 0, 0)
        );
    }
}

#[test]
fn idle_queue_threads_park_and_stay_parked() {
    let queue = host::queue(QueueOptions::new("idle")).unwrap();
    let done = HostSemaphore::new(0);
    for value in 1..=100 {
        let (r, c) = none();
        queue
            .submit(&[], &[(&done, value)], HostPayload::Nop, r, c)
            .unwrap();
    }
    done.wait(100, WAIT).unwrap();
    eventually("both threads parked", || {
        let stats = queue.stats();
        stats.completion_parked && stats.worker_parked && stats.retired() == 100
    });
    let before = queue.stats();
    thread::sleep(Duration::from_millis(50));
    let after = queue.stats();
    assert!(after.completion_parked && after.worker_parked);
    assert_eq!(
        (after.completion_parks, after.worker_parks),
        (before.completion_parks, before.worker_parks),
        "an idle queue's threads do not wake up"
    );
    assert!(
        after.retire_batches <= 100,
        "at most one batch per action: {after:?}"
    );
}

#[test]
fn a_slow_completion_side_holds_the_submitter_back() {
    const LIMIT: usize = 8;
    let queue = host::queue(QueueOptions::new("slow").with_max_in_flight(LIMIT)).unwrap();
    let done = HostSemaphore::new(0);
    let cleaned = Arc::new(AtomicUsize::new(0));
    for value in 1..=400u64 {
        let cleaned = cleaned.clone();
        let cleanups: Cleanups = smallvec![Cleanup::once(move |_| {
            // The completion side is slower than the submitter.
            thread::sleep(Duration::from_micros(200));
            cleaned.fetch_add(1, Ordering::SeqCst);
        })];
        submit_nop(&queue, &[], &[(&done, value)], cleanups).unwrap();
        // Whatever the completion side has not retired stays within the limit.
        let stats = queue.stats();
        assert!(
            stats.submitted - stats.retired() <= LIMIT as u64,
            "in flight past the limit: {stats:?}"
        );
    }
    done.wait(400, WAIT).unwrap();
    eventually("all cleaned", || cleaned.load(Ordering::SeqCst) == 400);
    let stats = queue.stats();
    assert!(stats.in_flight_high_water <= LIMIT as u64, "{stats:?}");
    // Unbounded, 400 actions in flight at once would have grown the pool past its first 256.
    assert_eq!(
        queue.backend().pooled_events(),
        QueueOptions::DEFAULT_CAPACITY,
        "completion events stay bounded"
    );
}

/// What the backend and the cleanups saw, in order: (`true` for the backend's `completed`,
/// action id).
#[derive(Default, Clone)]
struct CompletedLog(Arc<std::sync::Mutex<Vec<(bool, u64)>>>);

impl Hooks for CompletedLog {
    fn completed(&self, payload: &Script) {
        self.0.lock().unwrap().push((true, payload.id));
    }
}

/// The backend hears of every action whose completion event completed, in issue order, before
/// any cleanup of its batch runs (so a cleanup can rely on it), and never of one that failed.
#[test]
fn the_backend_hears_of_each_completed_action_before_its_batch_cleans_up() {
    let log = CompletedLog::default();
    let queue = Queue::new(
        Scripted::with_hooks(false, log.clone()),
        QueueOptions::new("completed"),
    )
    .unwrap();
    for id in 0..5u64 {
        let log = log.clone();
        queue
            .submit(
                &[],
                &[],
                Script::id(id),
                Resources::new(),
                smallvec![Cleanup::once(move |_| {
                    log.0.lock().unwrap().push((false, id));
                })],
            )
            .unwrap();
    }
    let fault = Failure::msg("action 2 failed alone");
    for entry in queue.backend().issued.lock().unwrap().iter() {
        if entry.id == 2 {
            entry.event.fail(fault.clone());
        } else {
            entry.event.complete();
        }
    }
    eventually("all retired", || queue.stats().retired() == 5);
    let log = log.0.lock().unwrap().clone();
    let heard: Vec<u64> = log.iter().filter(|(b, _)| *b).map(|(_, id)| *id).collect();
    assert_eq!(heard, [0, 1, 3, 4], "{log:?}");
    for id in [0, 1, 3, 4] {
        let at = |backend| log.iter().position(|e| *e == (backend, id)).unwrap();
        assert!(
            at(true) < at(false),
            "action {id} cleaned up first: {log:?}"
        );
    }
}
