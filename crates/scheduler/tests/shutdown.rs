//! Dropping a queue: with pending actions, with blocked waiters, with a failed queue; nothing
//! leaks and nothing hangs.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use cuhal_scheduler::host::{self, HostPayload, HostSemaphore};
use cuhal_scheduler::{Cleanup, Cleanups, Error, Failure, Queue, QueueOptions, Resources};
use cuhal_semaphore::Semaphore;
use cuhal_semaphore::testing::FlagEvent;
use smallvec::smallvec;

use support::{Script, Scripted, submit_nop, tracked};

const WAIT: Duration = Duration::from_secs(5);

fn is_shut_down(failure: &Failure) -> bool {
    matches!(
        failure.downcast_ref::<Error>(),
        Some(Error::ShutDown { .. })
    )
}

#[test]
fn drop_fails_pending_actions_wakes_blocked_waiters_and_releases_everything() {
    let queue = Queue::new(Scripted::new(true), QueueOptions::new("pending")).unwrap();
    let never = Semaphore::<FlagEvent>::new(0);
    let out = Semaphore::<FlagEvent>::new(0);
    let drops = Arc::new(AtomicUsize::new(0));
    let cleanups = Arc::new(AtomicUsize::new(0));
    for id in 0..10 {
        let counted = cleanups.clone();
        queue
            .submit(
                &[(&never, 1)],
                &[(&out, id + 1)],
                Script::id(id),
                smallvec![tracked(&drops)],
                smallvec![Cleanup::once(move |outcome| {
                    assert!(is_shut_down(outcome.unwrap_err()));
                    counted.fetch_add(1, Ordering::SeqCst);
                })],
            )
            .unwrap();
    }
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let out = out.clone();
            thread::spawn(move || out.wait(1, WAIT))
        })
        .collect();
    thread::sleep(Duration::from_millis(20));
    let started = Instant::now();
    let backend_live = queue.backend().live.clone();
    drop(queue);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "drop did not wait for `never`"
    );
    for waiter in waiters {
        let error = waiter.join().unwrap().unwrap_err();
        assert!(is_shut_down(error.failure().unwrap()), "{error}");
    }
    assert_eq!(cleanups.load(Ordering::SeqCst), 10);
    assert_eq!(drops.load(Ordering::SeqCst), 10);
    assert_eq!(never.listener_count(), 0, "listeners cancelled");
    assert_eq!(backend_live.live(), 0, "no event outlives the queue");
}

#[test]
fn drop_issues_what_is_ready_and_waits_for_issued_work() {
    let queue = host::queue(QueueOptions::new("drain")).unwrap();
    let done = HostSemaphore::new(0);
    let ran = Arc::new(AtomicUsize::new(0));
    let gate = HostSemaphore::new(0);
    for value in 1..=5u64 {
        let ran = ran.clone();
        queue
            .submit(
                &[(&gate, 1)],
                &[(&done, value)],
                HostPayload::once(move || {
                    thread::sleep(Duration::from_millis(5));
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }),
                Resources::new(),
                Cleanups::new(),
            )
            .unwrap();
    }
    gate.signal(1).unwrap();
    drop(queue);
    // Ready before the drop (or issued during it): all ran and signalled.
    assert_eq!(ran.load(Ordering::SeqCst), 5);
    assert_eq!(done.query().unwrap(), 5);
}

#[test]
fn drop_of_a_lost_queue_fails_what_is_left_and_leaks_nothing() {
    let queue = Queue::new(Scripted::new(true), QueueOptions::new("lost")).unwrap();
    let gate = Semaphore::<FlagEvent>::new(0);
    let never = Semaphore::<FlagEvent>::new(0);
    let later = Semaphore::<FlagEvent>::new(0);
    let outs: Vec<_> = (0..3).map(|_| Semaphore::<FlagEvent>::new(0)).collect();
    let drops = Arc::new(AtomicUsize::new(0));
    let device = Failure::msg("device lost");
    let scripts = [
        Script {
            id: 0,
            fail_completion: Some(device.clone()),
            ..Script::default()
        },
        Script::id(1),
        Script::id(2),
    ];
    let waits = [&gate, &later, &never];
    for ((script, wait), out) in scripts.into_iter().zip(waits).zip(&outs) {
        queue
            .submit(
                &[(wait, 1)],
                &[(out, 1)],
                script,
                smallvec![tracked(&drops)],
                Cleanups::new(),
            )
            .unwrap();
    }
    gate.signal(1).unwrap();
    outs[0].wait(1, WAIT).unwrap_err();
    // Pending when the queue was lost: failed with the loss, not issued when its wait is reached.
    outs[1].wait(1, WAIT).unwrap_err();
    later.signal(1).unwrap();
    let live = queue.backend().live.clone();
    drop(queue);
    for out in &outs {
        let failure = out.failure().expect("every signal failed");
        assert!(failure.ptr_eq(&device), "{failure}");
    }
    assert_eq!(drops.load(Ordering::SeqCst), 3);
    assert_eq!(never.listener_count(), 0);
    assert_eq!(live.live(), 0);
}

#[test]
fn the_queue_and_its_threads_are_freed() {
    let queue = host::queue(QueueOptions::new("freed")).unwrap();
    let marker: Arc<dyn std::any::Any + Send + Sync> = Arc::new(());
    let done = HostSemaphore::new(0);
    let gate = HostSemaphore::new(0);
    // One completes, one is pending at drop.
    queue
        .submit(
            &[],
            &[(&done, 1)],
            HostPayload::Nop,
            smallvec![marker.clone()],
            Cleanups::new(),
        )
        .unwrap();
    queue
        .submit(
            &[(&gate, 1)],
            &[],
            HostPayload::Nop,
            smallvec![marker.clone()],
            Cleanups::new(),
        )
        .unwrap();
    done.wait(1, WAIT).unwrap();
    drop(queue);
    assert_eq!(Arc::strong_count(&marker), 1, "every resource released");
    assert_eq!(
        gate.listener_count(),
        0,
        "no listener keeps the queue alive"
    );
}

#[test]
fn a_queue_dropped_by_its_own_cleanup_does_not_deadlock() {
    let slot: Arc<Mutex<Option<host::HostQueue>>> = Arc::new(Mutex::new(Some(
        host::queue(QueueOptions::new("self")).unwrap(),
    )));
    let done = HostSemaphore::new(0);
    let after = HostSemaphore::new(0);
    let taken = slot.clone();
    {
        let guard = slot.lock().unwrap();
        let queue = guard.as_ref().unwrap();
        submit_nop(
            queue,
            &[],
            &[(&done, 1)],
            smallvec![Cleanup::once(move |_| drop(taken.lock().unwrap().take()))],
        )
        .unwrap();
        submit_nop(queue, &[(&done, 1)], &[(&after, 1)], Cleanups::new()).unwrap();
    }
    done.wait(1, WAIT).unwrap();
    // The second action was issued (device wait) before the drop, so it completes.
    after.wait(1, WAIT).unwrap();
    let deadline = Instant::now() + WAIT;
    while slot.lock().unwrap().is_some() {
        assert!(Instant::now() < deadline);
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_loss_trigger_fails_pending_actions_and_later_submits() {
    let queue = host::queue(QueueOptions::new("triggered")).unwrap();
    let never = HostSemaphore::new(0);
    let out = HostSemaphore::new(0);
    submit_nop(&queue, &[(&never, 1)], &[(&out, 1)], Cleanups::new()).unwrap();
    let trigger = queue.loss_trigger();
    let failure = Failure::msg("the device's context is lost");
    trigger.trigger(&failure);
    // The pending action fails with the trigger's failure, without `never` being signalled.
    let error = out.wait(1, WAIT).unwrap_err();
    assert!(error.failure().unwrap().ptr_eq(&failure), "{error}");
    assert!(queue.lost().unwrap().ptr_eq(&failure));
    match submit_nop(&queue, &[], &[], Cleanups::new()) {
        Err(Error::Lost { failure: lost, .. }) => assert!(lost.ptr_eq(&failure)),
        other => panic!("expected Lost, got {other:?}"),
    }
    // A second trigger does not replace the first failure; a trigger outliving its queue is inert.
    trigger.trigger(&Failure::msg("later"));
    assert!(queue.lost().unwrap().ptr_eq(&failure));
    drop(queue);
    trigger.trigger(&failure);
}

/// A backend whose worker thread panics while binding to the device.
struct WorkerBindPanics;

impl support::Hooks for WorkerBindPanics {
    fn bind(&self, role: cuhal_scheduler::ThreadRole) -> Result<(), Failure> {
        if matches!(role, cuhal_scheduler::ThreadRole::Worker) {
            panic!("the worker could not bind (a test's panic)");
        }
        Ok(())
    }
}

/// A queue thread that panics while binding fails the queue's creation with `Error::Bind`, and
/// the half-made queue's threads are all joined: the completion thread, which waits for the
/// worker to say it is done, is told so once the worker is gone.
#[test]
fn a_worker_that_panics_while_binding_fails_creation_without_hanging() {
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let made = Queue::new(
            Scripted::with_hooks(true, WorkerBindPanics),
            QueueOptions::new("bind-panics"),
        );
        let _ = tx.send(made.map(|_| ()));
    });
    let made = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("Queue::new returned (dropping the half-made queue joined its threads)");
    assert!(matches!(made, Err(Error::Bind { .. })), "{made:?}");
}
