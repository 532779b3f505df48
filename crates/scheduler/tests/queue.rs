//! Behaviour of one or two queues: fast path, readiness, ordering, device waits, failures.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use cuhal_scheduler::host::{self, HostPayload, HostSemaphore};
use cuhal_scheduler::{
    Cleanup, Cleanups, Error, Failure, Queue, QueueOptions, Resources, SlotCleanups, SlotResources,
};
use cuhal_semaphore::testing::FlagEvent;
use cuhal_semaphore::{DeviceEvent, Error as SemaphoreError, Semaphore};
use smallvec::smallvec;

use support::{Outcomes, Script, Scripted, eventually, none, record, submit_nop, tracked};

const WAIT: Duration = Duration::from_secs(5);

fn scripted(label: &str, auto_complete: bool) -> Queue<Scripted> {
    Queue::new(Scripted::new(auto_complete), QueueOptions::new(label)).unwrap()
}

#[test]
fn ready_action_is_issued_by_the_submitting_thread() {
    let queue = scripted("fast", true);
    let done = Semaphore::<FlagEvent>::new(0);
    let reached = Semaphore::<FlagEvent>::new(3);
    let (r, c) = none();
    queue
        .submit(&[(&reached, 2)], &[(&done, 1)], Script::id(1), r, c)
        .unwrap();
    let issued = queue
        .backend()
        .find(1)
        .expect("issued before submit returned");
    assert_eq!(issued.thread, thread::current().id());
    assert!(issued.device_waits.is_empty(), "a reached wait is dropped");
    done.wait(1, WAIT).unwrap();
    let stats = queue.stats();
    assert_eq!((stats.issued_on_submit, stats.issued_by_worker), (1, 0));
}

#[test]
fn pending_action_is_issued_by_the_signalling_thread_once_its_semaphore_is_signalled() {
    let queue = scripted("later", true);
    let gate = Semaphore::<FlagEvent>::new(0);
    let done = Semaphore::<FlagEvent>::new(0);
    let (r, c) = none();
    queue
        .submit(&[(&gate, 2)], &[(&done, 1)], Script::id(1), r, c)
        .unwrap();
    assert!(queue.backend().issued_ids().is_empty());
    assert_eq!(queue.stats().pending, 1);
    gate.signal(1).unwrap();
    thread::sleep(Duration::from_millis(20));
    assert!(
        queue.backend().issued_ids().is_empty(),
        "value 1 does not satisfy a wait for 2"
    );
    gate.signal(2).unwrap();
    done.wait(1, WAIT).unwrap();
    let issued = queue.backend().find(1).unwrap();
    assert_eq!(
        issued.thread,
        thread::current().id(),
        "the host signal issued it: no hand-off to the worker"
    );
    let stats = queue.stats();
    assert_eq!(
        (
            stats.pending,
            stats.issued_on_signal,
            stats.issued_by_worker
        ),
        (0, 1, 0)
    );
}

#[test]
fn a_ready_action_never_overtakes_an_earlier_pending_one() {
    let queue = scripted("order", true);
    let gate = Semaphore::<FlagEvent>::new(0);
    let done = Semaphore::<FlagEvent>::new(0);
    let (r, c) = none();
    queue
        .submit(&[(&gate, 1)], &[], Script::id(1), r, c)
        .unwrap();
    for id in 2..=4 {
        let (r, c) = none();
        queue
            .submit(&[], &[(&done, id - 1)], Script::id(id), r, c)
            .unwrap();
    }
    thread::sleep(Duration::from_millis(20));
    assert!(queue.backend().issued_ids().is_empty());
    assert_eq!(done.query().unwrap(), 0);
    gate.signal(1).unwrap();
    done.wait(3, WAIT).unwrap();
    assert_eq!(queue.backend().issued_ids(), vec![1, 2, 3, 4]);
}

#[test]
fn a_recorded_device_signal_becomes_a_device_wait_without_a_host_round_trip() {
    let producer = scripted("producer", false);
    let consumer = scripted("consumer", true);
    let data = Semaphore::<FlagEvent>::new(0);
    let done = Semaphore::<FlagEvent>::new(0);
    let (r, c) = none();
    producer
        .submit(&[], &[(&data, 1)], Script::id(1), r, c)
        .unwrap();
    let (r, c) = none();
    consumer
        .submit(&[(&data, 1)], &[(&done, 1)], Script::id(2), r, c)
        .unwrap();
    // Issued at once, before the producer's work completed, with a device wait on its event.
    let produced = producer.backend().find(1).unwrap();
    let consumed = consumer.backend().find(2).expect("issued on submit");
    assert_eq!(consumed.thread, thread::current().id());
    assert_eq!(consumed.device_waits.len(), 1);
    assert!(consumed.device_waits[0].ptr_eq(&produced.event));
    assert_eq!(data.query().unwrap(), 0);
    produced.event.complete();
    data.wait(1, WAIT).unwrap();
    done.wait(1, WAIT).unwrap();
}

#[test]
fn a_device_signal_recorded_later_also_becomes_a_device_wait() {
    let producer = scripted("producer", false);
    let consumer = scripted("consumer", true);
    let data = Semaphore::<FlagEvent>::new(0);
    let (r, c) = none();
    consumer
        .submit(&[(&data, 1)], &[], Script::id(2), r, c)
        .unwrap();
    assert!(consumer.backend().issued_ids().is_empty());
    let (r, c) = none();
    producer
        .submit(&[], &[(&data, 1)], Script::id(1), r, c)
        .unwrap();
    eventually("the consumer is issued", || {
        consumer.backend().find(2).is_some()
    });
    let produced = producer.backend().find(1).unwrap();
    let consumed = consumer.backend().find(2).unwrap();
    assert!(consumed.device_waits[0].ptr_eq(&produced.event));
    assert_eq!(
        data.query().unwrap(),
        0,
        "issued before the producer completed"
    );
    produced.event.complete();
}

#[test]
fn a_failed_wait_fails_the_action_and_its_signals_with_the_same_failure() {
    let queue = scripted("fail", true);
    let gate = Semaphore::<FlagEvent>::new(0);
    let (a, b) = (Semaphore::new(0), Semaphore::new(0));
    let outcomes = Outcomes::default();
    let drops = Arc::new(AtomicUsize::new(0));
    // One action fails at submission (already failed), one while pending.
    let early = Failure::msg("early");
    let already = Semaphore::<FlagEvent>::new(0);
    already.fail(early.clone());
    queue
        .submit(
            &[(&already, 1)],
            &[(&a, 1)],
            Script::id(1),
            smallvec![tracked(&drops)],
            record(&outcomes, 1),
        )
        .unwrap();
    queue
        .submit(
            &[(&gate, 1)],
            &[(&b, 1)],
            Script::id(2),
            smallvec![tracked(&drops)],
            record(&outcomes, 2),
        )
        .unwrap();
    let late = Failure::msg("late");
    gate.fail(late.clone());
    for (semaphore, failure) in [(&a, &early), (&b, &late)] {
        match semaphore.wait(1, WAIT) {
            Err(SemaphoreError::Failed(seen)) => assert!(seen.ptr_eq(failure)),
            other => panic!("expected the failure, got {other:?}"),
        }
    }
    eventually("both retired", || queue.stats().failed == 2);
    assert!(queue.backend().issued_ids().is_empty(), "nothing issued");
    assert_eq!(drops.load(Ordering::SeqCst), 2, "resources released");
    assert_eq!(queue.backend().released.load(Ordering::SeqCst), 2);
    let outcomes = outcomes.lock().unwrap();
    assert!(outcomes[0].1.as_ref().unwrap_err().ptr_eq(&early));
    assert!(outcomes[1].1.as_ref().unwrap_err().ptr_eq(&late));
    assert!(
        queue.lost().is_none(),
        "a failed wait does not lose the queue"
    );
}

#[test]
fn a_failed_pending_action_leaves_the_actions_behind_it_in_order() {
    let queue = scripted("middle", true);
    let first = Semaphore::<FlagEvent>::new(0);
    let second = Semaphore::<FlagEvent>::new(0);
    let done = Semaphore::<FlagEvent>::new(0);
    for (id, wait) in [(1, &first), (2, &second), (3, &first)] {
        let (r, c) = none();
        queue
            .submit(&[(wait, 1)], &[(&done, id)], Script::id(id), r, c)
            .unwrap();
    }
    second.fail(Failure::msg("second"));
    // The middle action failed: the queue does not wait for it, and `done` is failed by it.
    first.signal(1).unwrap();
    eventually("all retired", || queue.stats().retired() == 3);
    assert_eq!(queue.backend().issued_ids(), vec![1, 3]);
    assert_eq!(queue.stats().pending, 0);
}

#[test]
fn an_issue_error_loses_the_queue_and_fails_everything_pending() {
    let queue = scripted("issue-error", true);
    let gate = Semaphore::<FlagEvent>::new(0);
    let never = Semaphore::<FlagEvent>::new(0);
    let (a, b, c) = (Semaphore::new(0), Semaphore::new(0), Semaphore::new(0));
    let device = Failure::msg("launch failed");
    let outcomes = Outcomes::default();
    let (r, _) = none();
    queue
        .submit(
            &[(&gate, 1)],
            &[(&a, 1)],
            Script {
                id: 1,
                fail_issue: Some(device.clone()),
                ..Script::default()
            },
            r,
            record(&outcomes, 1),
        )
        .unwrap();
    let (r, _) = none();
    queue
        .submit(&[], &[(&b, 1)], Script::id(2), r, record(&outcomes, 2))
        .unwrap();
    let (r, _) = none();
    queue
        .submit(
            &[(&never, 1)],
            &[(&c, 1)],
            Script::id(3),
            r,
            record(&outcomes, 3),
        )
        .unwrap();
    gate.signal(1).unwrap();
    for semaphore in [&a, &b, &c] {
        let error = semaphore.wait(1, WAIT).unwrap_err();
        assert!(error.failure().unwrap().ptr_eq(&device));
    }
    eventually("all retired", || queue.stats().failed == 3);
    assert!(queue.lost().unwrap().ptr_eq(&device));
    let (r, c) = none();
    match queue.submit(&[], &[], Script::id(4), r, c) {
        Err(Error::Lost { failure, .. }) => assert!(failure.ptr_eq(&device)),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert_eq!(never.listener_count(), 0, "the listener was cancelled");
    assert!(queue.backend().issued_ids().is_empty());
    assert_eq!(outcomes.lock().unwrap().len(), 3);
}

#[test]
fn a_completion_error_loses_the_queue() {
    let queue = host::queue(QueueOptions::new("completion-error")).unwrap();
    let device = Failure::msg("illegal address");
    let (a, b) = (HostSemaphore::new(0), HostSemaphore::new(0));
    let failing = device.clone();
    let (r, c) = none();
    queue
        .submit(
            &[],
            &[(&a, 1)],
            HostPayload::once(move || Err(failing)),
            r,
            c,
        )
        .unwrap();
    assert!(
        a.wait(1, WAIT)
            .unwrap_err()
            .failure()
            .unwrap()
            .ptr_eq(&device)
    );
    eventually("lost", || queue.lost().is_some());
    let (r, c) = none();
    assert!(matches!(
        queue.submit(&[], &[(&b, 1)], HostPayload::Nop, r, c),
        Err(Error::Lost { .. })
    ));
}

#[test]
fn an_upstream_failure_through_a_device_wait_fails_the_action_but_not_its_queue() {
    let upstream = host::queue(QueueOptions::new("upstream")).unwrap();
    let downstream = host::queue(QueueOptions::new("downstream")).unwrap();
    let (data, out, after) = (
        HostSemaphore::new(0),
        HostSemaphore::new(0),
        HostSemaphore::new(0),
    );
    let device = Failure::msg("trap");
    let failing = device.clone();
    let (r, c) = none();
    upstream
        .submit(
            &[],
            &[(&data, 1)],
            HostPayload::once(move || {
                thread::sleep(Duration::from_millis(30));
                Err(failing)
            }),
            r,
            c,
        )
        .unwrap();
    let (r, c) = none();
    downstream
        .submit(&[(&data, 1)], &[(&out, 1)], HostPayload::Nop, r, c)
        .unwrap();
    assert_eq!(
        downstream.stats().issued_on_submit,
        1,
        "issued with a device wait"
    );
    assert!(
        out.wait(1, WAIT)
            .unwrap_err()
            .failure()
            .unwrap()
            .ptr_eq(&device)
    );
    let (r, c) = none();
    downstream
        .submit(&[], &[(&after, 1)], HostPayload::Nop, r, c)
        .unwrap();
    after.wait(1, WAIT).unwrap();
    assert!(downstream.lost().is_none());
    eventually("upstream lost", || upstream.lost().is_some());
}

#[test]
fn cleanups_run_after_completion_before_release_and_a_panic_does_not_stop_the_queue() {
    let queue = host::queue(QueueOptions::new("cleanup")).unwrap();
    let done = HostSemaphore::new(0);
    let drops = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    for value in 1..=3u64 {
        let (seen, drops_now, done_now) = (seen.clone(), drops.clone(), done.clone());
        let cleanups: Cleanups = smallvec![
            Cleanup::once(|_| panic!("a buggy cleanup")),
            Cleanup::once(move |outcome| {
                // Completed and signalled, not yet released.
                seen.lock().unwrap().push((
                    outcome.is_ok(),
                    done_now.query().unwrap() >= value,
                    drops_now.load(Ordering::SeqCst) == (value - 1) as usize,
                ));
            }),
        ];
        queue
            .submit(
                &[],
                &[(&done, value)],
                HostPayload::Nop,
                smallvec![tracked(&drops)],
                cleanups,
            )
            .unwrap();
    }
    done.wait(3, WAIT).unwrap();
    eventually("all retired", || queue.stats().completed == 3);
    assert_eq!(*seen.lock().unwrap(), vec![(true, true, true); 3]);
    assert_eq!(drops.load(Ordering::SeqCst), 3);
}

/// A resource whose drop panics.
struct PanicsOnDrop;

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("a buggy resource");
    }
}

/// Body slots are reused with their lists kept: a resource whose drop panics does not keep the
/// others of its action from being dropped, nor stop the queue, nor leave anything behind for the
/// slot's next action; and an action with more resources than a slot keeps room for (its list
/// spilled) drops them all too.
#[test]
fn every_resource_is_dropped_through_panicking_drops_and_slot_reuse() {
    let queue = host::queue(QueueOptions::new("resources")).unwrap();
    let done = HostSemaphore::new(0);
    let drops = Arc::new(AtomicUsize::new(0));
    let mut expected = 0;
    // Enough actions, waited for one by one, that every slot is used several times.
    for value in 1..=600u64 {
        let mut resources: Resources = smallvec![tracked(&drops)];
        match value % 3 {
            0 => resources.push(Arc::new(PanicsOnDrop)),
            1 => resources.extend((0..100).map(|_| tracked(&drops))),
            _ => {}
        }
        resources.push(tracked(&drops));
        expected += resources.len() - usize::from(value % 3 == 0);
        queue
            .submit(
                &[],
                &[(&done, value)],
                HostPayload::Nop,
                resources,
                Cleanups::new(),
            )
            .unwrap();
        done.wait(value, WAIT).unwrap();
    }
    eventually("all retired", || queue.stats().completed == 600);
    eventually("every resource dropped", || {
        drops.load(Ordering::SeqCst) == expected
    });
}

#[test]
fn host_payloads_run_in_issue_order_after_their_waits() {
    let a = host::queue(QueueOptions::new("a")).unwrap();
    let b = host::queue(QueueOptions::new("b")).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (s, t) = (HostSemaphore::new(0), HostSemaphore::new(0));
    let push = |n: u32| {
        let log = log.clone();
        HostPayload::once(move || {
            thread::sleep(Duration::from_millis(2));
            log.lock().unwrap().push(n);
            Ok(())
        })
    };
    // b's action waits for a's second action, which is submitted after it.
    let (r, c) = none();
    b.submit(&[(&s, 2)], &[(&t, 1)], push(3), r, c).unwrap();
    let (r, c) = none();
    a.submit(&[], &[(&s, 1)], push(1), r, c).unwrap();
    let (r, c) = none();
    a.submit(&[], &[(&s, 2)], push(2), r, c).unwrap();
    t.wait(1, WAIT).unwrap();
    assert_eq!(*log.lock().unwrap(), vec![1, 2, 3]);
}

#[test]
fn several_waits_and_signals_on_timelines() {
    let queue = host::queue(QueueOptions::new("timeline")).unwrap();
    let (x, y, z) = (
        HostSemaphore::new(5),
        HostSemaphore::new(0),
        HostSemaphore::new(0),
    );
    let (r, c) = none();
    queue
        .submit(
            &[(&x, 3), (&y, 2), (&x, 7)],
            &[(&z, 10), (&y, 4)],
            HostPayload::Nop,
            r,
            c,
        )
        .unwrap();
    y.signal(2).unwrap();
    thread::sleep(Duration::from_millis(10));
    assert_eq!(z.query().unwrap(), 0, "x has not reached 7");
    x.signal(8).unwrap();
    z.wait(10, WAIT).unwrap();
    // The signals are advanced one after the other (and a host waiter may advance `z` itself
    // from its device event), so `y` follows shortly.
    y.wait(4, WAIT).unwrap();
    assert_eq!(y.query().unwrap(), 4);
}

#[test]
fn a_cleanup_may_submit_to_its_own_queue() {
    let queue = Arc::new(host::queue(QueueOptions::new("resubmit")).unwrap());
    let done = HostSemaphore::new(0);
    let (weak, again) = (Arc::downgrade(&queue), done.clone());
    let cleanups: Cleanups = smallvec![Cleanup::once(move |_| {
        let queue = weak.upgrade().unwrap();
        let (r, c) = none();
        queue
            .submit(&[], &[(&again, 2)], HostPayload::Nop, r, c)
            .unwrap();
    })];
    submit_nop(&queue, &[], &[(&done, 1)], cleanups).unwrap();
    done.wait(2, WAIT).unwrap();
}

#[test]
fn a_host_wait_on_a_device_signal_sees_the_event_directly() {
    // The semaphore crate's event spin: the waiter advances the value itself.
    let queue = scripted("direct", false);
    let done = Semaphore::<FlagEvent>::new(0);
    let (r, c) = none();
    queue
        .submit(&[], &[(&done, 1)], Script::id(1), r, c)
        .unwrap();
    let event = queue.backend().find(1).unwrap().event;
    event.complete();
    done.wait(1, WAIT).unwrap();
    assert!(event.query().unwrap());
}

/// `submit_with` writes an action's parts straight into a recycled slot: `fill` runs once, on the
/// submitting thread, and always finds the slot's lists empty (the completion side emptied them,
/// whatever the action before left there); what it adds is released and run like `submit`'s.
#[test]
fn submit_with_fills_an_emptied_slot_whose_parts_are_released_like_submits() {
    let queue = host::queue(QueueOptions::new("in-place")).unwrap();
    let done = HostSemaphore::new(0);
    let drops = Arc::new(AtomicUsize::new(0));
    let cleanups_run = Arc::new(AtomicUsize::new(0));
    let fills = AtomicUsize::new(0);
    let submitter = thread::current().id();
    let mut expected = 0;
    for value in 1..=300u64 {
        // Every third action spills its resources, so slots come back with heap lists too.
        let count = if value % 3 == 0 { 70 } else { 2 };
        expected += count;
        queue
            .submit_with(&[], &[(&done, value)], |resources, cleanups| {
                assert!(resources.is_empty() && cleanups.is_empty(), "a used slot");
                assert_eq!(thread::current().id(), submitter);
                fills.fetch_add(1, Ordering::SeqCst);
                resources.extend((0..count).map(|_| tracked(&drops)));
                let run = cleanups_run.clone();
                cleanups.push(Cleanup::once(move |outcome| {
                    assert!(outcome.is_ok());
                    run.fetch_add(1, Ordering::SeqCst);
                }));
                HostPayload::Nop
            })
            .unwrap();
        if value % 50 == 0 {
            done.wait(value, WAIT).unwrap();
        }
    }
    done.wait(300, WAIT).unwrap();
    assert_eq!(fills.load(Ordering::SeqCst), 300);
    eventually("all retired", || queue.stats().completed == 300);
    eventually("every cleanup run", || {
        cleanups_run.load(Ordering::SeqCst) == 300
    });
    eventually("every resource dropped", || {
        drops.load(Ordering::SeqCst) == expected
    });
}

/// On a lost queue `submit_with` fails without calling `fill`, and drops it (with what it owns)
/// only after letting go of the issue lock: a drop that submits to the same queue gets its own
/// `Lost` instead of blocking on the lock.
#[test]
fn submit_with_on_a_lost_queue_drops_fill_uncalled_outside_the_issue_lock() {
    struct SubmitsOnDrop {
        queue: Arc<host::HostQueue>,
        answered: Arc<AtomicUsize>,
    }
    impl Drop for SubmitsOnDrop {
        fn drop(&mut self) {
            // From another thread, so that a held lock shows as a timeout, not a hang here.
            let queue = self.queue.clone();
            let (send, receive) = std::sync::mpsc::channel();
            thread::spawn(move || {
                let lost = matches!(
                    queue.submit(
                        &[],
                        &[],
                        HostPayload::Nop,
                        Resources::new(),
                        Cleanups::new()
                    ),
                    Err(Error::Lost { .. })
                );
                let _ = send.send(lost);
            });
            if receive.recv_timeout(Duration::from_secs(2)) == Ok(true) {
                self.answered.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
    let queue = Arc::new(host::queue(QueueOptions::new("lost-in-place")).unwrap());
    let failure = Failure::msg("the device's context is lost");
    queue.loss_trigger().trigger(&failure);
    let answered = Arc::new(AtomicUsize::new(0));
    let guard = SubmitsOnDrop {
        queue: queue.clone(),
        answered: answered.clone(),
    };
    let called = AtomicUsize::new(0);
    let counted = &called;
    let fill = move |_: &mut SlotResources, _: &mut SlotCleanups| {
        let _owned = &guard;
        counted.fetch_add(1, Ordering::SeqCst);
        HostPayload::Nop
    };
    match queue.submit_with(&[], &[], fill) {
        Err(Error::Lost { failure: lost, .. }) => assert!(lost.ptr_eq(&failure)),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert_eq!(called.load(Ordering::SeqCst), 0, "fill is not called");
    assert_eq!(
        answered.load(Ordering::SeqCst),
        1,
        "the drop's own submit got Lost, so the lock was not held"
    );
}

/// A `fill` that panics costs its slot and nothing else: the panic reaches the submitter, no
/// action is queued, and the queue takes the next submission as before.
#[test]
fn a_panicking_fill_leaves_the_queue_usable() {
    let queue = host::queue(QueueOptions::new("panicking-fill")).unwrap();
    let done = HostSemaphore::new(0);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        queue.submit_with(&[], &[(&done, 1)], |_, _| -> HostPayload {
            panic!("a fill that fails")
        })
    }));
    assert!(panicked.is_err());
    assert_eq!(queue.stats().submitted, 0, "nothing was queued");
    assert!(queue.lost().is_none());
    for value in 1..=3 {
        let (r, c) = none();
        queue
            .submit(&[], &[(&done, value)], HostPayload::Nop, r, c)
            .unwrap();
    }
    done.wait(3, WAIT).unwrap();
    eventually("all retired", || queue.stats().completed == 3);
}

/// A signal at or below the semaphore's value could never take effect (timeline values only
/// rise): the submission is refused with a typed error naming both values, nothing is issued,
/// and the queue goes on working; a signal above the value is taken as ever.
#[test]
fn a_signal_at_or_below_the_value_is_refused_and_nothing_is_queued() {
    let queue = scripted("backwards", true);
    let done = Semaphore::<FlagEvent>::new(5);
    for value in [5, 3, 0] {
        let (r, c) = none();
        let refused = queue
            .submit(&[], &[(&done, value)], Script::id(value), r, c)
            .unwrap_err();
        match &refused {
            Error::SignalNotAbove {
                queue: label,
                value: v,
                current,
            } => {
                assert_eq!((&**label, *v, *current), ("backwards", value, 5));
            }
            other => panic!("signal to {value}: {other:?}"),
        }
        assert!(refused.to_string().contains("already reached"), "{refused}");
        assert!(queue.backend().find(value).is_none(), "nothing issued");
    }
    // One bad signal among good ones refuses the whole submission.
    let other = Semaphore::<FlagEvent>::new(0);
    let (r, c) = none();
    assert!(matches!(
        queue.submit(&[], &[(&other, 1), (&done, 4)], Script::id(9), r, c),
        Err(Error::SignalNotAbove { value: 4, .. })
    ));
    assert!(queue.backend().find(9).is_none());
    let (r, c) = none();
    queue
        .submit(&[], &[(&done, 6)], Script::id(6), r, c)
        .unwrap();
    done.wait(6, WAIT).unwrap();
    assert_eq!(
        other.query().unwrap(),
        0,
        "the refused submission signalled nothing"
    );
}

/// A backend whose optional calls panic for the action with `PANICKY_ID` (or, for `traffic`,
/// always): each panic is kept inside the scheduler with a meaning, never unwinding through its
/// threads, so nothing hangs and every signal ends reached or failed.
struct Panicky {
    which: &'static str,
}

const PANICKY_ID: u64 = 7;

impl support::Hooks for Panicky {
    fn checks_completion(&self, payload: &Script) -> bool {
        if self.which == "checks_completion" && payload.id == PANICKY_ID {
            panic!("checks_completion (a test's panic)");
        }
        false
    }

    fn orders_own_events(&self) -> bool {
        if self.which == "orders" {
            panic!("orders (a test's panic)");
        }
        true
    }

    fn traffic(&self) -> u64 {
        if self.which == "traffic" {
            panic!("traffic (a test's panic)");
        }
        0
    }

    fn issued(&self, _resources: &[cuhal_scheduler::Resource]) {
        if self.which == "issued" {
            panic!("issued (a test's panic)");
        }
    }
}

#[test]
fn a_backend_panicking_in_checks_completion_fails_that_action_and_loses_the_queue() {
    let queue = Queue::new(
        Scripted::with_hooks(
            true,
            Panicky {
                which: "checks_completion",
            },
        ),
        QueueOptions::new("panics-checking"),
    )
    .unwrap();
    let done = Semaphore::<FlagEvent>::new(0);
    let (r, c) = none();
    queue
        .submit(&[], &[(&done, 1)], Script::id(PANICKY_ID), r, c)
        .unwrap();
    let failure = done.wait(1, WAIT).unwrap_err();
    assert!(failure.to_string().contains("panicked"), "{failure}");
    assert!(queue.backend().find(PANICKY_ID).is_none(), "never issued");
    let (r, c) = none();
    assert!(matches!(
        queue.submit(&[], &[], Script::id(8), r, c),
        Err(Error::Lost { .. })
    ));
}

#[test]
fn a_backend_panicking_in_issued_loses_the_queue_after_the_action_completes() {
    let queue = Queue::new(
        Scripted::with_hooks(true, Panicky { which: "issued" }),
        QueueOptions::new("panics-noting"),
    )
    .unwrap();
    let done = Semaphore::<FlagEvent>::new(0);
    let resources: Resources = smallvec![Arc::new(0u8) as cuhal_scheduler::Resource];
    queue
        .submit(
            &[],
            &[(&done, 1)],
            Script::id(1),
            resources,
            Cleanups::new(),
        )
        .unwrap();
    done.wait(1, WAIT).unwrap();
    let (r, c) = none();
    assert!(matches!(
        queue.submit(&[], &[], Script::id(2), r, c),
        Err(Error::Lost { .. })
    ));
}

#[test]
fn a_backend_panicking_in_traffic_still_completes_work_a_waiter_needs() {
    let queue = Queue::new(
        Scripted::with_hooks(false, Panicky { which: "traffic" }),
        QueueOptions::new("panics-traffic"),
    )
    .unwrap();
    let done = Semaphore::<FlagEvent>::new(0);
    thread::scope(|scope| {
        // A host thread parked on the signal before the work is submitted: the completion side
        // polls the work's event for it, asking the backend's traffic as it goes.
        let waiter = scope.spawn(|| done.wait(1, WAIT));
        eventually("the waiter parked", || done.has_waiters());
        let (r, c) = none();
        queue
            .submit(&[], &[(&done, 1)], Script::id(1), r, c)
            .unwrap();
        thread::sleep(Duration::from_millis(20));
        queue.backend().complete_all();
        waiter.join().unwrap().unwrap();
    });
    eventually("the completion side retired the work", || {
        queue.stats().completed == 1
    });
    assert!(queue.lost().is_none());
}

#[test]
fn a_backend_panicking_in_orders_still_completes_every_action() {
    for which in ["orders"] {
        let queue = Queue::new(
            Scripted::with_hooks(true, Panicky { which }),
            QueueOptions::new(format!("panics-{which}")),
        )
        .unwrap();
        let chain = Semaphore::<FlagEvent>::new(0);
        for step in 1..=20u64 {
            // Each waits for the one before: a device wait, which asks `orders`.
            let (r, c) = none();
            queue
                .submit(
                    &[(&chain, step - 1)],
                    &[(&chain, step)],
                    Script::id(step),
                    r,
                    c,
                )
                .unwrap();
        }
        chain
            .wait(20, WAIT)
            .unwrap_or_else(|f| panic!("{which}: {f}"));
        assert!(queue.lost().is_none(), "{which}");
    }
}
