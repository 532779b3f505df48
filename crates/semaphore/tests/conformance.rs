//! The IREE HAL conformance semaphore cases, ported by behaviour, plus timeline-rule checks.

mod common;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use common::{bounded, failure};
use cuhal_semaphore::{Error, Failure, NoEvent, Semaphore, Timeout, wait_all, wait_any};

type Sem = Semaphore<NoEvent>;

const LONG: Duration = Duration::from_secs(10);

fn expect_failed<T: std::fmt::Debug>(result: Result<T, Error>, original: &Failure) {
    match result {
        Err(Error::Failed(f)) => assert!(f.ptr_eq(original), "a different failure: {f}"),
        other => panic!("expected the original failure, got {other:?}"),
    }
}

#[test]
fn no_op() {
    let s = Sem::new(123);
    assert_eq!(s.query().unwrap(), 123);
    assert!(s.failure().is_none());
    let other = Sem::new(123);
    assert_ne!(s.id(), other.id());
    assert_eq!(s.clone().id(), s.id());
    assert!(s.ptr_eq(&s.clone()) && !s.ptr_eq(&other));
}

#[test]
fn normal_signaling() {
    let s = Sem::new(2);
    assert_eq!(s.query().unwrap(), 2);
    s.signal(3).unwrap();
    assert_eq!(s.query().unwrap(), 3);
    s.signal(40).unwrap();
    assert_eq!(s.query().unwrap(), 40);
}

#[test]
fn failure_is_reported_by_every_operation() {
    let s = Sem::new(2);
    s.signal(3).unwrap();
    let f = failure("device lost");
    s.fail(f.clone());
    expect_failed(s.query(), &f);
    expect_failed(s.signal(4), &f);
    expect_failed(s.advance_to(4), &f);
    expect_failed(s.wait(1, Timeout::Immediate), &f);
    assert!(s.failure().unwrap().ptr_eq(&f));
    assert_eq!(s.failure().unwrap().to_string(), "device lost");
}

#[test]
fn empty_wait() {
    let empty: &[(&Sem, u64)] = &[];
    wait_all(empty, Timeout::Immediate).unwrap();
    wait_all(empty, Timeout::Infinite).unwrap();
    assert!(matches!(
        wait_any(empty, Timeout::Infinite),
        Err(Error::EmptyWaitList)
    ));
}

#[test]
fn wait_already_signaled() {
    let s = Sem::new(2);
    s.wait(1, Timeout::Immediate).unwrap();
    s.wait(2, Timeout::Immediate).unwrap();
    s.wait(2, Timeout::Infinite).unwrap();
    s.wait(2, Duration::from_secs(1)).unwrap();
}

#[test]
fn wait_unsignaled_times_out() {
    let s = Sem::new(2);
    assert!(matches!(s.wait(3, Timeout::Immediate), Err(Error::Timeout)));
    let start = Instant::now();
    assert!(matches!(
        s.wait(3, Duration::from_millis(20)),
        Err(Error::Timeout)
    ));
    assert!(start.elapsed() >= Duration::from_millis(20));
    assert_eq!(s.query().unwrap(), 2);
    assert_eq!(s.waiter_count(), 0, "a timed-out waiter deregisters");
}

#[test]
fn wait_later_signaled_beyond_value() {
    bounded(LONG, || {
        let s = Sem::new(0);
        let s2 = s.clone();
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(10));
            s2.signal(5).unwrap();
        });
        s.wait(3, Timeout::Infinite).unwrap();
        assert!(s.query().unwrap() >= 5, "woken only by the signal to 5");
        t.join().unwrap();
    });
}

#[test]
fn wait_all_not_all_signaled() {
    let a = Sem::new(0);
    let b = Sem::new(0);
    a.signal(1).unwrap();
    assert!(matches!(
        wait_all(&[(&a, 1), (&b, 1)], Timeout::Immediate),
        Err(Error::Timeout)
    ));
    assert!(matches!(
        wait_all(&[(&a, 1), (&b, 1)], Duration::from_millis(10)),
        Err(Error::Timeout)
    ));
    assert_eq!((a.waiter_count(), b.waiter_count()), (0, 0));
}

#[test]
fn wait_all_all_signaled() {
    let a = Sem::new(1);
    let b = Sem::new(2);
    wait_all(&[(&a, 1), (&b, 2)], Timeout::Immediate).unwrap();
    wait_all(&[(&a, 0), (&b, 1), (&a, 1)], Timeout::Infinite).unwrap();
}

#[test]
fn wait_any_already_signaled() {
    let a = Sem::new(0);
    let b = Sem::new(1);
    assert_eq!(
        wait_any(&[(&a, 1), (&b, 1)], Timeout::Immediate).unwrap(),
        1
    );
    assert_eq!(wait_any(&[(&b, 1), (&a, 1)], Timeout::Infinite).unwrap(), 0);
    assert!(matches!(
        wait_any(&[(&a, 1), (&b, 2)], Timeout::Immediate),
        Err(Error::Timeout)
    ));
}

#[test]
fn wait_any_later_signaled() {
    bounded(LONG, || {
        let a = Sem::new(0);
        let b = Sem::new(0);
        let b2 = b.clone();
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(10));
            b2.signal(1).unwrap();
        });
        assert_eq!(wait_any(&[(&a, 1), (&b, 1)], Timeout::Infinite).unwrap(), 1);
        assert_eq!(a.query().unwrap(), 0);
        t.join().unwrap();
    });
}

#[test]
fn ping_pong() {
    bounded(LONG, || {
        const ROUNDS: u64 = 500;
        let a_to_b = Sem::new(0);
        let b_to_a = Sem::new(0);
        let (ab, ba) = (a_to_b.clone(), b_to_a.clone());
        let t = thread::spawn(move || {
            for i in 1..=ROUNDS {
                ab.wait(i, Timeout::Infinite).unwrap();
                ba.signal(i).unwrap();
            }
        });
        for i in 1..=ROUNDS {
            a_to_b.signal(i).unwrap();
            b_to_a.wait(i, Timeout::Infinite).unwrap();
            assert_eq!(b_to_a.query().unwrap(), i, "b answered exactly round {i}");
        }
        t.join().unwrap();
    });
}

#[test]
fn wait_on_the_same_value_many_times() {
    bounded(LONG, || {
        let s = Sem::new(0);
        let threads = 8;
        let start = Arc::new(Barrier::new(threads + 1));
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (s, start) = (s.clone(), start.clone());
                thread::spawn(move || {
                    start.wait();
                    s.wait(1, Timeout::Infinite)
                })
            })
            .collect();
        start.wait();
        thread::sleep(Duration::from_millis(10));
        s.signal(1).unwrap();
        for h in handles {
            h.join().unwrap().unwrap();
        }
        for _ in 0..1000 {
            s.wait(1, Timeout::Immediate).unwrap();
        }
        assert_eq!(s.waiter_count(), 0);
    });
}

#[test]
fn wait_for_a_finite_time() {
    let s = Sem::new(0);
    let start = Instant::now();
    assert!(matches!(
        s.wait(1, Duration::from_millis(30)),
        Err(Error::Timeout)
    ));
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(30),
        "returned early: {waited:?}"
    );
    let deadline = Instant::now() + Duration::from_millis(20);
    assert!(matches!(s.wait(1, deadline), Err(Error::Timeout)));
    assert!(Instant::now() >= deadline);
    // A deadline in the past is an immediate check.
    assert!(matches!(s.wait(1, Timeout::At(start)), Err(Error::Timeout)));
    // A finite wait that is signalled in time succeeds.
    bounded(LONG, || {
        let s = Sem::new(0);
        let s2 = s.clone();
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(5));
            s2.signal(1).unwrap();
        });
        s.wait(1, Duration::from_secs(5)).unwrap();
        t.join().unwrap();
    });
}

#[test]
fn simultaneous_multi_wait_all_from_many_threads() {
    bounded(LONG, || {
        let a = Sem::new(0);
        let b = Sem::new(0);
        let threads = 16;
        let start = Arc::new(Barrier::new(threads + 1));
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let (a, b, start) = (a.clone(), b.clone(), start.clone());
                thread::spawn(move || {
                    start.wait();
                    let r = if i % 2 == 0 {
                        wait_all(&[(&a, 1), (&b, 1)], Timeout::Infinite)
                    } else {
                        wait_all(&[(&b, 1), (&a, 1)], Duration::from_secs(8))
                    };
                    (r, a.query().unwrap(), b.query().unwrap())
                })
            })
            .collect();
        start.wait();
        a.signal(1).unwrap();
        thread::sleep(Duration::from_millis(5));
        b.signal(1).unwrap();
        for h in handles {
            let (r, av, bv) = h.join().unwrap();
            r.unwrap();
            assert_eq!((av, bv), (1, 1));
        }
    });
}

#[test]
fn fail_then_wait() {
    let s = Sem::new(0);
    let f = failure("early");
    s.fail(f.clone());
    expect_failed(s.wait(1, Timeout::Infinite), &f);
    expect_failed(s.wait(0, Timeout::Infinite), &f);
    let ok = Sem::new(5);
    expect_failed(wait_all(&[(&ok, 1), (&s, 1)], Timeout::Infinite), &f);
    expect_failed(wait_any(&[(&ok, 7), (&s, 1)], Timeout::Infinite), &f);
}

#[test]
fn wait_then_fail() {
    bounded(LONG, || {
        let s = Sem::new(0);
        let s2 = s.clone();
        let waiter = thread::spawn(move || s2.wait(1, Timeout::Infinite));
        thread::sleep(Duration::from_millis(10));
        let f = failure("later");
        s.fail(f.clone());
        expect_failed(waiter.join().unwrap(), &f);
    });
}

#[test]
fn multi_wait_then_fail() {
    bounded(LONG, || {
        let a = Sem::new(0);
        let b = Sem::new(0);
        let (a1, b1, a2, b2) = (a.clone(), b.clone(), a.clone(), b.clone());
        let all = thread::spawn(move || wait_all(&[(&a1, 1), (&b1, 1)], Timeout::Infinite));
        let any = thread::spawn(move || wait_any(&[(&a2, 1), (&b2, 1)], Timeout::Infinite));
        thread::sleep(Duration::from_millis(10));
        let f = failure("b failed");
        b.fail(f.clone());
        expect_failed(all.join().unwrap(), &f);
        expect_failed(any.join().unwrap(), &f);
        assert_eq!(a.query().unwrap(), 0, "the other semaphore is untouched");
        // A wait-all with an already-reached entry still hears of the failure of that entry.
        let c = Sem::new(1);
        let d = Sem::new(0);
        let (c1, d1) = (c.clone(), d.clone());
        let all = thread::spawn(move || wait_all(&[(&c1, 1), (&d1, 1)], Timeout::Infinite));
        thread::sleep(Duration::from_millis(10));
        let f = failure("c failed after it was reached");
        c.fail(f.clone());
        expect_failed(all.join().unwrap(), &f);
    });
}

#[derive(Debug)]
struct DeviceLost(u32);

impl std::fmt::Display for DeviceLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "device {} lost", self.0)
    }
}

impl std::error::Error for DeviceLost {}

#[test]
fn failure_keeps_its_original_error() {
    let s = Sem::new(0);
    let first = Failure::new(DeviceLost(3));
    s.fail(first.clone());
    s.fail(Failure::msg("second"));
    let kept = s.failure().unwrap();
    assert!(kept.ptr_eq(&first));
    assert!(!kept.ptr_eq(&Failure::new(DeviceLost(3))));
    assert_eq!(kept.downcast_ref::<DeviceLost>().unwrap().0, 3);
    assert!(kept.downcast_ref::<std::fmt::Error>().is_none());
    match s.signal(1) {
        Err(e @ Error::Failed(_)) => {
            assert!(e.failure().unwrap().ptr_eq(&first));
            let source = std::error::Error::source(&e).unwrap();
            assert_eq!(source.to_string(), "device 3 lost");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn signal_backwards_is_a_typed_error_and_changes_nothing() {
    let s = Sem::new(5);
    assert!(matches!(
        s.signal(5),
        Err(Error::NotMonotonic {
            current: 5,
            requested: 5
        })
    ));
    assert!(matches!(
        s.signal(3),
        Err(Error::NotMonotonic {
            current: 5,
            requested: 3
        })
    ));
    assert_eq!(s.query().unwrap(), 5);
    s.signal(6).unwrap();
    assert_eq!(s.query().unwrap(), 6);
}

#[test]
fn advance_to_never_goes_back_and_never_complains_about_reached_values() {
    let s = Sem::new(5);
    s.advance_to(3).unwrap();
    s.advance_to(5).unwrap();
    assert_eq!(s.query().unwrap(), 5);
    s.advance_to(9).unwrap();
    assert_eq!(s.query().unwrap(), 9);
}

#[test]
fn timeout_conversions() {
    assert_eq!(
        Timeout::from(Duration::from_millis(3)),
        Timeout::After(Duration::from_millis(3))
    );
    let now = Instant::now();
    assert_eq!(Timeout::from(now), Timeout::At(now));
    // A huge duration does not overflow: it waits forever (here: until signalled).
    let s = Sem::new(1);
    s.wait(1, Duration::MAX).unwrap();
}
