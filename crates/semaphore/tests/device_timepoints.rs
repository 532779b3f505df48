//! Device-signal timepoints: lookup, release of events, and host waits that use recorded events.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::{bounded, failure};
use cuhal_semaphore::testing::{FlagEvent, LiveCounter};
use cuhal_semaphore::{Error, Semaphore, SemaphoreOptions, Timeout, WaitPoint, wait_all, wait_any};

type Sem = Semaphore<FlagEvent>;

const LONG: Duration = Duration::from_secs(10);

/// A consumer that some events need no wait from (a queue, for events of its own stream) gets
/// `Reached` for a timepoint on such an event, without a handle to it; any other event still
/// comes as a device wait, and a failure or a pending value as before.
#[test]
fn wait_point_ordered_answers_reached_for_an_ordered_event_without_a_handle() {
    let s = Sem::new(0);
    let (mine, theirs) = (FlagEvent::new(), FlagEvent::new());
    s.record_device_signal(5, mine.clone()).unwrap();
    s.record_device_signal(7, theirs.clone()).unwrap();
    let is_mine = |e: &FlagEvent| e.ptr_eq(&mine);
    let handles = mine.clone_count();
    assert!(matches!(
        s.wait_point_ordered(4, is_mine).unwrap(),
        WaitPoint::Reached
    ));
    assert_eq!(
        mine.clone_count(),
        handles,
        "no handle to the ordered event was made"
    );
    match s.wait_point_ordered(6, is_mine).unwrap() {
        WaitPoint::Device { value, event } => assert!(value == 7 && event.ptr_eq(&theirs)),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        s.wait_point_ordered(8, is_mine).unwrap(),
        WaitPoint::Pending
    ));
    assert!(matches!(
        s.wait_point_ordered(6, |_| true).unwrap(),
        WaitPoint::Reached
    ));
    assert!(!s.has_failed());
    s.fail(failure("x"));
    assert!(s.has_failed());
    assert!(matches!(
        s.wait_point_ordered(4, |_| true),
        Err(Error::Failed(_))
    ));
}

#[test]
fn device_wait_event_picks_the_smallest_recorded_value_at_least_v() {
    let s = Sem::new(0);
    let (e5, e7, e10) = (FlagEvent::new(), FlagEvent::new(), FlagEvent::new());
    s.record_device_signal(5, e5.clone()).unwrap();
    s.record_device_signal(10, e10.clone()).unwrap();
    s.record_device_signal(7, e7.clone()).unwrap();
    assert!(s.device_wait_event(1).unwrap().ptr_eq(&e5));
    assert!(s.device_wait_event(5).unwrap().ptr_eq(&e5));
    assert!(s.device_wait_event(6).unwrap().ptr_eq(&e7));
    assert!(s.device_wait_event(7).unwrap().ptr_eq(&e7));
    assert!(s.device_wait_event(8).unwrap().ptr_eq(&e10));
    assert!(s.device_wait_event(11).is_none());
    match s.wait_point(6).unwrap() {
        WaitPoint::Device { value, event } => assert!(value == 7 && event.ptr_eq(&e7)),
        other => panic!("{other:?}"),
    }
    assert!(matches!(s.wait_point(11).unwrap(), WaitPoint::Pending));
    s.signal(7).unwrap();
    assert!(
        s.device_wait_event(6).is_none(),
        "value reached: nothing to wait on"
    );
    assert!(matches!(s.wait_point(6).unwrap(), WaitPoint::Reached));
    assert!(s.device_wait_event(8).unwrap().ptr_eq(&e10));
    assert_eq!(s.timepoint_count(), 1);
    s.fail(failure("x"));
    assert!(s.device_wait_event(8).is_none());
    assert!(matches!(s.wait_point(8), Err(Error::Failed(_))));
}

#[test]
fn events_are_released_once_their_value_is_reached() {
    let live = LiveCounter::new();
    let s = Sem::new(0);
    for v in [1, 2, 3, 5] {
        s.record_device_signal(v, FlagEvent::counted(&live))
            .unwrap();
    }
    assert_eq!(live.live(), 4);
    s.signal(2).unwrap();
    assert_eq!(live.live(), 2, "timepoints 1 and 2 released");
    let held = s.device_wait_event(4).unwrap();
    s.advance_to(5).unwrap();
    assert_eq!(
        live.live(),
        1,
        "only the clone a device waiter still holds is alive"
    );
    assert_eq!(held.clone_count(), 1);
    drop(held);
    assert_eq!(live.live(), 0);
    // Recording a reached value keeps nothing.
    s.record_device_signal(4, FlagEvent::counted(&live))
        .unwrap();
    assert_eq!((live.live(), s.timepoint_count()), (0, 0));
}

#[test]
fn failure_and_drop_release_every_event() {
    let live = LiveCounter::new();
    let s = Sem::new(0);
    s.record_device_signal(3, FlagEvent::counted(&live))
        .unwrap();
    s.fail(failure("gone"));
    assert_eq!(live.live(), 0);
    assert!(matches!(
        s.record_device_signal(4, FlagEvent::counted(&live)),
        Err(Error::Failed(_))
    ));
    assert_eq!(
        live.live(),
        0,
        "an event recorded on a failed semaphore is dropped"
    );
    let t = Sem::new(0);
    t.record_device_signal(3, FlagEvent::counted(&live))
        .unwrap();
    t.record_device_signal(3, FlagEvent::counted(&live))
        .unwrap();
    assert_eq!(live.live(), 2);
    drop(t);
    assert_eq!(live.live(), 0);
}

#[test]
fn host_wait_advances_the_semaphore_through_a_completed_event() {
    let s = Sem::new(0);
    let e = FlagEvent::new();
    s.record_device_signal(5, e.clone()).unwrap();
    assert!(matches!(s.wait(3, Timeout::Immediate), Err(Error::Timeout)));
    assert!(
        e.query_count() >= 1,
        "the immediate wait queried the event once"
    );
    e.complete();
    s.wait(3, Timeout::Immediate).unwrap();
    assert_eq!(
        s.query().unwrap(),
        5,
        "brought up to the timepoint's value by the waiter"
    );
    assert_eq!(e.clone_count(), 1, "and the semaphore let go of the event");
}

#[test]
fn host_wait_spins_on_the_event_then_sees_it_complete() {
    bounded(LONG, || {
        let s = Sem::with_options(
            0,
            SemaphoreOptions::new().with_event_spin(Duration::from_secs(20)),
        );
        let e = FlagEvent::new();
        s.record_device_signal(2, e.clone()).unwrap();
        let e2 = e.clone();
        let completer = thread::spawn(move || {
            thread::sleep(Duration::from_millis(10));
            e2.complete();
        });
        // Nobody signals the semaphore: only the waiter's own query can end this wait.
        s.wait(2, Duration::from_secs(8)).unwrap();
        assert_eq!(s.query().unwrap(), 2);
        completer.join().unwrap();
    });
}

/// A semaphore whose waits query events for `spin`.
fn spinning(spin: Duration) -> Sem {
    Sem::with_options(0, SemaphoreOptions::new().with_event_spin(spin))
}

/// A semaphore whose waits query events for `spin`, a device signal for 1 recorded on it, and
/// a thread waiting for 1, once it has parked.
fn parked_on_an_event(spin: Duration) -> (Sem, FlagEvent, thread::JoinHandle<Result<(), Error>>) {
    let s = spinning(spin);
    let e = FlagEvent::new();
    s.record_device_signal(1, e.clone()).unwrap();
    let waiter = parked_waiter(&s, 1);
    (s, e, waiter)
}

/// A thread waiting for `value` on `s`, once it has parked (its spin over).
fn parked_waiter(s: &Sem, value: u64) -> thread::JoinHandle<Result<(), Error>> {
    let s2 = s.clone();
    let waiter = thread::spawn(move || s2.wait(value, Timeout::Infinite));
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.waiter_count() == 0 {
        assert!(Instant::now() < deadline, "the waiter never parked");
        thread::sleep(Duration::from_millis(1));
    }
    waiter
}

#[test]
fn event_spin_is_bounded_then_the_waiter_parks() {
    bounded(LONG, || {
        let (s, e, waiter) = parked_on_an_event(Duration::from_millis(2));
        let queries = e.query_count();
        assert!(queries >= 1);
        let parked = Instant::now();
        thread::sleep(Duration::from_millis(30));
        // Parked, it looks again on a doubling period from 50 us to 1 ms: about one look per
        // millisecond once the period is grown (and a few before), where a spin makes tens of
        // thousands.
        let looks = e.query_count() - queries;
        let most = parked.elapsed().as_millis() as usize + 10;
        assert!(
            looks <= most,
            "a parked waiter queried {looks} times in {:?}",
            parked.elapsed()
        );
        s.signal(1).unwrap();
        waiter.join().unwrap().unwrap();
    });
}

/// A parked waiter whose event completes returns on its own, without an advance from anybody
/// else: whoever retires the work may be waiting for newer work first.
#[test]
fn a_parked_waiter_sees_its_event_complete_by_itself() {
    bounded(LONG, || {
        let (s, e, waiter) = parked_on_an_event(Duration::from_micros(100));
        // Parked a while: its re-query period has grown to the most it gets.
        thread::sleep(Duration::from_millis(20));
        let completed = Instant::now();
        e.complete();
        waiter.join().unwrap().unwrap();
        let late = completed.elapsed();
        assert!(
            late < Duration::from_millis(500),
            "returned {late:?} after its event completed"
        );
        assert_eq!(
            s.query().unwrap(),
            1,
            "the waiter brought the value up itself"
        );
    });
}

/// A waiter that parks tells the event of the timepoint it needs (the smallest recorded value at
/// least its own) that it is awaited, so a completion side that sleeps between batches can look
/// now; the events of other timepoints hear nothing, nor does anything when the value is pending
/// with no timepoint recorded for it.
#[test]
fn a_parking_waiter_tells_the_event_it_needs_that_it_is_awaited() {
    bounded(LONG, || {
        let s = spinning(Duration::from_micros(100));
        let (e2, e4, e6) = (FlagEvent::new(), FlagEvent::new(), FlagEvent::new());
        s.record_device_signal(2, e2.clone()).unwrap();
        s.record_device_signal(4, e4.clone()).unwrap();
        s.record_device_signal(6, e6.clone()).unwrap();
        let waiter = parked_waiter(&s, 3);
        // Told just after the registration that `parked_waiter` saw.
        let deadline = Instant::now() + Duration::from_secs(5);
        while e4.awaited_count() == 0 {
            assert!(
                Instant::now() < deadline,
                "the parked waiter's timepoint never heard of it"
            );
            thread::sleep(Duration::from_millis(1));
        }
        // Its later parks, after each look at the event, tell nobody again.
        thread::sleep(Duration::from_millis(10));
        assert_eq!(e4.awaited_count(), 1, "told once per wait");
        assert_eq!((e2.awaited_count(), e6.awaited_count()), (0, 0));
        s.signal(4).unwrap();
        waiter.join().unwrap().unwrap();

        let told = e4.awaited_count();
        let waiter = parked_waiter(&s, 7);
        // Whatever it would tell, it tells right after registering.
        thread::sleep(Duration::from_millis(20));
        assert_eq!(
            (e4.awaited_count(), e6.awaited_count()),
            (told, 0),
            "no timepoint at or above 7: nobody to tell"
        );
        s.signal(7).unwrap();
        waiter.join().unwrap().unwrap();
    });
}

/// How many times a wait queried an event that completes 20 ms after the wait began, how late
/// after the completion the wait returned, and how long it waited.
fn queries_of_a_20_ms_wait(event: FlagEvent, pace: Duration) -> (usize, Duration, Duration) {
    let s = Sem::with_options(
        0,
        SemaphoreOptions::new()
            .with_event_spin(Duration::from_secs(20))
            .with_busy_query_pace(pace),
    );
    s.record_device_signal(1, event.clone()).unwrap();
    let e2 = event.clone();
    let began = Instant::now();
    let completer = thread::spawn(move || {
        thread::sleep(Duration::from_millis(20));
        e2.complete();
        Instant::now()
    });
    s.wait(1, Duration::from_secs(8)).unwrap();
    let returned = Instant::now();
    let completed = completer.join().unwrap();
    (
        event.query_count(),
        returned.saturating_duration_since(completed),
        returned.saturating_duration_since(began),
    )
}

/// While the device is being submitted to, a wait queries its event once per pace (each query
/// would take the lock the submitters need) and returns at most about a pace after completion;
/// with the device idle, or with no pace, it queries back to back.
#[test]
fn a_wait_holds_its_queries_back_while_the_device_is_busy() {
    bounded(LONG, || {
        let pace = Duration::from_millis(1);
        let (paced, late, waited) = queries_of_a_20_ms_wait(FlagEvent::on_busy_device(), pace);
        // One query per ms of the wait (which a loaded machine stretches), and the first.
        let most = waited.as_millis() as usize + 2;
        assert!(
            paced <= most,
            "{paced} queries in {waited:?} at a 1 ms pace"
        );
        assert!(late < Duration::from_millis(500), "returned {late:?} late");
        let (idle, ..) = queries_of_a_20_ms_wait(FlagEvent::new(), pace);
        assert!(
            idle > 1_000,
            "an idle device's wait queried only {idle} times"
        );
        let (unpaced, ..) = queries_of_a_20_ms_wait(FlagEvent::on_busy_device(), Duration::ZERO);
        assert!(
            unpaced > 1_000,
            "an unpaced wait queried only {unpaced} times"
        );
    });
}

/// A semaphore with value 1 recorded on an event of a busy device, whose waits hold their
/// queries back for 5 s at a time.
fn held_back_semaphore() -> (Sem, FlagEvent) {
    let s = Sem::with_options(
        0,
        SemaphoreOptions::new()
            .with_event_spin(Duration::from_secs(20))
            .with_busy_query_pace(Duration::from_secs(5)),
    );
    let e = FlagEvent::on_busy_device();
    s.record_device_signal(1, e.clone()).unwrap();
    (s, e)
}

/// A value reached by someone else (the completion thread, a host signal) ends a held-back wait
/// at once, without waiting out the pace; new device signals recorded meanwhile (more of the busy
/// device's work) do not.
#[test]
fn a_held_back_wait_ends_when_the_value_is_reached() {
    bounded(LONG, || {
        let (s, e) = held_back_semaphore();
        let s2 = s.clone();
        let advancer = thread::spawn(move || {
            for value in 2..50 {
                s2.record_device_signal(value, FlagEvent::new()).unwrap();
                thread::sleep(Duration::from_micros(200));
            }
            s2.advance_to(1).unwrap();
            Instant::now()
        });
        s.wait(1, Duration::from_secs(8)).unwrap();
        let returned = Instant::now();
        let advanced = advancer.join().unwrap();
        assert!(
            returned.saturating_duration_since(advanced) < Duration::from_secs(1),
            "the wait held back past the advance"
        );
        // The first round, then held back until the advance.
        assert_eq!(e.query_count(), 1);
    });
}

/// A failure, or a host signal, ends a held-back wait at once too (the wait watches the value
/// mirror and the failure flag, not only an advance through the completion side).
#[test]
fn a_held_back_wait_ends_on_a_failure_and_on_a_signal() {
    for fail in [true, false] {
        bounded(LONG, move || {
            let (s, _event) = held_back_semaphore();
            let s2 = s.clone();
            let other = thread::spawn(move || {
                thread::sleep(Duration::from_millis(20));
                if fail {
                    s2.fail(failure("gone"));
                } else {
                    s2.signal(1).unwrap();
                }
                Instant::now()
            });
            let result = s.wait(1, Duration::from_secs(8));
            let returned = Instant::now();
            let at = other.join().unwrap();
            assert_eq!(result.is_err(), fail, "{result:?}");
            let late = returned.saturating_duration_since(at);
            assert!(
                late < Duration::from_secs(1),
                "fail={fail}: returned {late:?} late"
            );
        });
    }
}

#[test]
fn waits_without_event_queries_leave_events_alone() {
    let s = Sem::with_options(0, SemaphoreOptions::new().without_event_queries());
    let e = FlagEvent::new();
    e.complete();
    s.record_device_signal(1, e.clone()).unwrap();
    assert!(matches!(
        s.wait(1, Duration::from_millis(5)),
        Err(Error::Timeout)
    ));
    assert_eq!(e.query_count(), 0);
    assert_eq!(s.query().unwrap(), 0);
}

#[test]
fn an_event_that_errors_fails_the_semaphore() {
    let s = Sem::new(0);
    let e = FlagEvent::new();
    s.record_device_signal(4, e.clone()).unwrap();
    let f = failure("illegal address");
    e.fail(f.clone());
    match s.wait(4, Timeout::Infinite) {
        Err(Error::Failed(got)) => assert!(got.ptr_eq(&f)),
        other => panic!("{other:?}"),
    }
    assert!(s.failure().unwrap().ptr_eq(&f));
    assert_eq!(
        e.clone_count(),
        1,
        "the failed semaphore released its event"
    );
}

#[test]
fn multi_waits_use_recorded_events_too() {
    let a = Sem::new(0);
    let b = Sem::new(0);
    let (ea, eb) = (FlagEvent::new(), FlagEvent::new());
    a.record_device_signal(1, ea.clone()).unwrap();
    b.record_device_signal(3, eb.clone()).unwrap();
    ea.complete();
    assert!(matches!(
        wait_all(&[(&a, 1), (&b, 2)], Timeout::Immediate),
        Err(Error::Timeout)
    ));
    assert_eq!(
        a.query().unwrap(),
        1,
        "a's completed event was applied on the way"
    );
    assert_eq!(
        wait_any(&[(&b, 2), (&a, 1)], Timeout::Immediate).unwrap(),
        1
    );
    eb.complete();
    wait_all(&[(&a, 1), (&b, 2)], Timeout::Immediate).unwrap();
    assert_eq!(b.query().unwrap(), 3);
}

#[test]
fn a_completion_thread_and_a_waiter_may_both_advance() {
    // The completion path uses advance_to, which does not complain when a waiter got there first.
    let s = Sem::new(0);
    let e = FlagEvent::new();
    s.record_device_signal(2, e.clone()).unwrap();
    e.complete();
    s.wait(2, Timeout::Immediate).unwrap();
    s.advance_to(2).unwrap();
    assert_eq!(s.query().unwrap(), 2);
}

#[test]
fn an_advance_can_hand_its_released_events_to_the_caller() {
    let live = LiveCounter::new();
    let s = Sem::new(0);
    for v in 1..=20 {
        s.record_device_signal(v, FlagEvent::counted(&live))
            .unwrap();
    }
    let mut released = Vec::with_capacity(32);
    s.advance_to_releasing(15, &mut released).unwrap();
    assert_eq!(s.query().unwrap(), 15);
    assert_eq!(s.timepoint_count(), 5);
    assert_eq!(
        (released.len(), live.live()),
        (15, 20),
        "all 15 released events handed over, none dropped under the lock"
    );
    released.clear();
    assert_eq!(live.live(), 5);
    // An advance to a value already reached releases nothing; a failed semaphore refuses.
    s.advance_to_releasing(10, &mut released).unwrap();
    assert!(released.is_empty());
    s.fail(failure("x"));
    assert!(matches!(
        s.advance_to_releasing(30, &mut released),
        Err(Error::Failed(_))
    ));
    assert_eq!(live.live(), 0);
}

#[test]
fn a_wait_that_sees_its_event_complete_returns_with_the_value_advanced() {
    let s = Sem::new(0);
    let event = FlagEvent::new();
    s.record_device_signal(3, event.clone()).unwrap();
    let waiter = {
        let s = s.clone();
        thread::spawn(move || s.wait(2, LONG))
    };
    thread::sleep(Duration::from_millis(5));
    event.complete();
    waiter.join().unwrap().unwrap();
    assert_eq!(
        s.query().unwrap(),
        3,
        "the waiter advanced to the timepoint"
    );
}

/// `query` is the value as last advanced, with no device query; a wait with an immediate
/// timeout is the poll of the device: it queries the awaited timepoint's event once and brings
/// the value up when it completed.
#[test]
fn an_immediate_wait_polls_the_device_where_a_query_does_not() {
    let s = Sem::new(0);
    let e = FlagEvent::new();
    s.record_device_signal(3, e.clone()).unwrap();
    assert!(matches!(s.wait(2, Timeout::Immediate), Err(Error::Timeout)));
    e.complete();
    assert_eq!(s.query().unwrap(), 0, "nobody has seen the event complete");
    let queries = e.query_count();
    s.wait(2, Timeout::Immediate).unwrap();
    assert_eq!(e.query_count(), queries + 1, "one look at the event");
    assert_eq!(s.query().unwrap(), 3, "brought up to the timepoint");
}
