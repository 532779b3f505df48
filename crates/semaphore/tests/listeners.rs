//! One-shot listeners: fired exactly once, outside the lock, on value, device signal or failure.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{bounded, failure};
use cuhal_semaphore::testing::FlagEvent;
use cuhal_semaphore::{Burst, Listener, Notice, Semaphore, SemaphoreId};

type Sem = Semaphore<FlagEvent>;

#[derive(Default)]
struct Record(Mutex<Vec<(SemaphoreId, u64)>>);

impl<E> Listener<E> for Record {
    fn notify(&self, semaphore: SemaphoreId, key: u64) {
        self.0.lock().unwrap().push((semaphore, key));
    }
}

impl Record {
    fn keys(&self) -> Vec<u64> {
        self.0.lock().unwrap().iter().map(|(_, k)| *k).collect()
    }
}

fn record() -> (Arc<Record>, Arc<dyn Listener<FlagEvent>>) {
    let r = Arc::new(Record::default());
    let l: Arc<dyn Listener<FlagEvent>> = r.clone();
    (r, l)
}

#[test]
fn fires_exactly_once_when_the_value_is_reached() {
    let s = Sem::new(0);
    let (r, l) = record();
    s.listen(3, &l, 7);
    s.listen(5, &l, 8);
    s.signal(2).unwrap();
    assert!(r.keys().is_empty());
    s.signal(3).unwrap();
    assert_eq!(r.keys(), vec![7]);
    assert_eq!(r.0.lock().unwrap()[0].0, s.id());
    s.signal(4).unwrap();
    s.advance_to(9).unwrap();
    s.signal(10).unwrap();
    assert_eq!(r.keys(), vec![7, 8]);
    assert_eq!(s.listener_count(), 0);
}

#[test]
fn fires_at_once_when_already_satisfied() {
    let s = Sem::new(4);
    let (r, l) = record();
    let token = s.listen(4, &l, 1);
    assert_eq!(r.keys(), vec![1]);
    s.cancel_listen(token);
    s.record_device_signal(9, FlagEvent::new()).unwrap();
    s.listen(8, &l, 2);
    assert_eq!(
        r.keys(),
        vec![1, 2],
        "a recorded device signal >= v satisfies a listener"
    );
    s.fail(failure("x"));
    s.listen(100, &l, 3);
    assert_eq!(r.keys(), vec![1, 2, 3]);
    assert_eq!(s.listener_count(), 0);
}

#[test]
fn fires_on_a_device_signal_at_or_above_the_value() {
    let s = Sem::new(0);
    let (r, l) = record();
    s.listen(5, &l, 1);
    s.record_device_signal(4, FlagEvent::new()).unwrap();
    assert!(r.keys().is_empty());
    s.record_device_signal(6, FlagEvent::new()).unwrap();
    assert_eq!(r.keys(), vec![1]);
    s.signal(6).unwrap();
    assert_eq!(r.keys(), vec![1], "not again when the value arrives");
}

#[test]
fn fires_on_failure() {
    let s = Sem::new(0);
    let (r, l) = record();
    s.listen(5, &l, 1);
    s.listen(50, &l, 2);
    s.fail(failure("x"));
    let mut keys = r.keys();
    keys.sort();
    assert_eq!(keys, vec![1, 2]);
    s.fail(failure("y"));
    assert_eq!(r.keys().len(), 2);
}

#[test]
fn cancel_works_and_stale_tokens_do_nothing() {
    let s = Sem::new(0);
    let (r, l) = record();
    let token = s.listen(5, &l, 1);
    s.cancel_listen(token);
    assert_eq!(s.listener_count(), 0);
    // The freed slot is reused; the old token must not cancel the new listener.
    let _new = s.listen(5, &l, 2);
    s.cancel_listen(token);
    assert_eq!(s.listener_count(), 1);
    // A token of another semaphore does nothing here.
    let other = Sem::new(0);
    let foreign = other.listen(5, &l, 3);
    s.cancel_listen(foreign);
    s.signal(5).unwrap();
    assert_eq!(r.keys(), vec![2]);
    // Cancelling after firing is a no-op.
    s.cancel_listen(_new);
    other.cancel_listen(foreign);
    other.signal(5).unwrap();
    assert_eq!(r.keys(), vec![2]);
}

/// A listener that calls back into the semaphore that notifies it: it would deadlock if notified
/// under the lock.
struct Reentrant {
    semaphore: Sem,
    me: Mutex<Option<Arc<dyn Listener<FlagEvent>>>>,
    fired: AtomicUsize,
}

impl<E> Listener<E> for Reentrant {
    fn notify(&self, semaphore: SemaphoreId, key: u64) {
        assert_eq!(semaphore, self.semaphore.id());
        self.fired.fetch_add(1, Ordering::SeqCst);
        let value = self.semaphore.query().unwrap();
        assert!(value >= key);
        self.semaphore.device_wait_event(key + 1);
        if key < 5 {
            let me = self.me.lock().unwrap().clone().unwrap();
            // Listen for the next value and signal it from inside the notification.
            self.semaphore.listen(key + 1, &me, key + 1);
            self.semaphore.signal(key + 1).unwrap();
        }
    }
}

#[test]
fn a_listener_may_call_back_into_the_semaphore() {
    bounded(Duration::from_secs(10), || {
        let s = Sem::new(0);
        let r = Arc::new(Reentrant {
            semaphore: s.clone(),
            me: Mutex::new(None),
            fired: AtomicUsize::new(0),
        });
        let l: Arc<dyn Listener<FlagEvent>> = r.clone();
        *r.me.lock().unwrap() = Some(l.clone());
        s.listen(1, &l, 1);
        s.signal(1).unwrap();
        assert_eq!(s.query().unwrap(), 5);
        assert_eq!(r.fired.load(Ordering::SeqCst), 5);
        r.me.lock().unwrap().take();
    });
}

#[test]
fn many_listeners_fire_in_one_signal_and_storage_is_reused() {
    let s = Sem::new(0);
    let (r, l) = record();
    for round in 0..3u64 {
        let base = round * 100;
        for k in 0..40 {
            s.listen(base + 1 + (k % 4), &l, base + k);
        }
        assert_eq!(s.listener_count(), 40);
        s.signal(base + 2).unwrap();
        assert_eq!(s.listener_count(), 20);
        s.signal(base + 4).unwrap();
        assert_eq!(s.listener_count(), 0);
        s.signal(base + 100).unwrap();
    }
    let mut keys = r.keys();
    keys.sort();
    let mut expected: Vec<u64> = (0..3)
        .flat_map(|r| (0..40).map(move |k| r * 100 + k))
        .collect();
    expected.sort();
    assert_eq!(keys, expected, "each listener exactly once");
}

/// What a listener was told.
#[derive(Debug)]
enum Told {
    Reached(u64),
    /// The recorded value, and the event it took, if one was left.
    Recorded(u64, Option<FlagEvent>),
    Changed,
}

#[derive(Default)]
struct Noticing(Mutex<Vec<(u64, Told)>>);

impl Listener<FlagEvent> for Noticing {
    fn notify(&self, _semaphore: SemaphoreId, key: u64) {
        self.0.lock().unwrap().push((key, Told::Changed));
    }

    fn notice(
        &self,
        _semaphore: SemaphoreId,
        key: u64,
        notice: Notice<'_, FlagEvent>,
        _burst: &mut Burst<FlagEvent>,
    ) {
        let told = match notice {
            Notice::Reached(value) => Told::Reached(value),
            Notice::Recorded { value, event } => Told::Recorded(value, event.take()),
            Notice::Changed => Told::Changed,
        };
        self.0.lock().unwrap().push((key, told));
    }
}

impl Noticing {
    fn take(&self) -> Vec<(u64, Told)> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// A recorded device signal hands a handle to its event to the first listener it fires (the
/// others find none, and the semaphore keeps its own), an advance tells the value reached, and a
/// failure tells only that something changed, as does a listener due when it registers.
#[test]
fn a_notice_tells_what_the_semaphore_did() {
    let s = Sem::new(0);
    let n = Arc::new(Noticing::default());
    let l: Arc<dyn Listener<FlagEvent>> = n.clone();
    s.listen(2, &l, 1);
    s.listen(1, &l, 2);
    let event = FlagEvent::new();
    s.record_device_signal(2, event.clone()).unwrap();
    match &n.take()[..] {
        // Smallest value first: key 2 (listening for 1) takes the event, key 1 finds none.
        [
            (2, Told::Recorded(2, Some(taken))),
            (1, Told::Recorded(2, None)),
        ] => {
            assert!(taken.ptr_eq(&event));
        }
        other => panic!("told {other:?}"),
    }
    assert!(s.device_wait_event(2).is_some_and(|e| e.ptr_eq(&event)));

    s.listen(2, &l, 3); // the signal at 2 is recorded: due at once
    s.listen(5, &l, 4);
    s.signal(5).unwrap();
    assert!(matches!(
        &n.take()[..],
        [(3, Told::Changed), (4, Told::Reached(5))]
    ));

    s.listen(9, &l, 5);
    s.fail(failure("gone"));
    assert!(matches!(&n.take()[..], [(5, Told::Changed)]));
}

/// A record that fires one listener tells it what a record that fires several tells its first
/// (the value, and a handle to the event), whatever the order of registration, a cancelled
/// listener in front, or several due at once; the semaphore keeps its own handle each time.
#[test]
fn a_record_that_fires_one_listener_tells_it_what_the_first_of_many_is_told() {
    let s = Sem::new(0);
    let n = Arc::new(Noticing::default());
    let l: Arc<dyn Listener<FlagEvent>> = n.clone();
    let recorded = |value: u64| {
        let event = FlagEvent::new();
        s.record_device_signal(value, event.clone()).unwrap();
        assert!(s.device_wait_event(value).is_some_and(|e| e.ptr_eq(&event)));
        event
    };
    let took = |told: &Told, value: u64, event: &FlagEvent| matches!(told, Told::Recorded(v, Some(e)) if *v == value && e.ptr_eq(event));

    // In order of value: each record fires the one listener due.
    s.listen(3, &l, 1);
    s.listen(5, &l, 2);
    let e3 = recorded(3);
    assert!(matches!(&n.take()[..], [(1, told)] if took(told, 3, &e3)));
    assert_eq!(s.listener_count(), 1);
    let e5 = recorded(5);
    assert!(matches!(&n.take()[..], [(2, told)] if took(told, 5, &e5)));

    // One registered below the last: the smaller fires first, alone.
    s.listen(9, &l, 3);
    s.listen(8, &l, 4);
    let e8 = recorded(8);
    assert!(matches!(&n.take()[..], [(4, told)] if took(told, 8, &e8)));
    let e9 = recorded(9);
    assert!(matches!(&n.take()[..], [(3, told)] if took(told, 9, &e9)));
    // Two due at once: the first (smallest value) takes the event, the second finds none.
    let both_due = |value: u64, first_key: u64, second_key: u64| {
        let event = recorded(value);
        match &n.take()[..] {
            [(k1, first), (k2, Told::Recorded(v, None))]
                if (*k1, *k2, *v) == (first_key, second_key, value)
                    && took(first, value, &event) => {}
            other => panic!("told {other:?}"),
        }
    };
    // One of them registered below the other: it fires first.
    s.listen(11, &l, 9);
    s.listen(10, &l, 10);
    both_due(11, 10, 9);

    // A cancelled listener in front is skipped.
    let cancelled = s.listen(12, &l, 5);
    s.listen(13, &l, 6);
    s.cancel_listen(cancelled);
    let e13 = recorded(13);
    assert!(matches!(&n.take()[..], [(6, told)] if took(told, 13, &e13)));

    // Both in order of value.
    s.listen(20, &l, 7);
    s.listen(21, &l, 8);
    both_due(21, 7, 8);
    assert_eq!(s.listener_count(), 0);
}

/// A listener that panics when a record fires it alone costs nothing else: the record is kept
/// and reported done, and the next listener is fired as usual.
#[test]
fn a_panicking_listener_fired_alone_by_a_record_is_contained() {
    struct Panics;
    impl<E> Listener<E> for Panics {
        fn notify(&self, _semaphore: SemaphoreId, _key: u64) {
            panic!("a listener that fails");
        }
    }
    let s = Sem::new(0);
    let panics: Arc<dyn Listener<FlagEvent>> = Arc::new(Panics);
    let (r, l) = record();
    s.listen(1, &panics, 1);
    s.listen(2, &l, 2);
    let event = FlagEvent::new();
    s.record_device_signal(1, event.clone()).unwrap();
    assert!(s.device_wait_event(1).is_some_and(|e| e.ptr_eq(&event)));
    s.record_device_signal(2, FlagEvent::new()).unwrap();
    assert_eq!(r.keys(), vec![2]);
    assert_eq!(s.listener_count(), 0);
}

/// A record into a burst calls nobody: the listeners it made due wait in the burst, each with its
/// notice (the first handed the event), until the burst runs. A failure into a burst does the
/// same, telling only that something changed.
#[test]
fn a_record_or_failure_into_a_burst_fires_its_listeners_only_when_the_burst_runs() {
    let s = Sem::new(0);
    let n = Arc::new(Noticing::default());
    let l: Arc<dyn Listener<FlagEvent>> = n.clone();
    s.listen(1, &l, 1);
    s.listen(2, &l, 2);
    let event = FlagEvent::new();
    let mut burst = Burst::new();
    s.record_device_signal_into(2, event.clone(), &mut burst)
        .unwrap();
    assert!(n.take().is_empty(), "a listener ran inside the record");
    assert!(!burst.is_empty());
    burst.run();
    assert!(burst.is_empty());
    match &n.take()[..] {
        [
            (1, Told::Recorded(2, Some(taken))),
            (2, Told::Recorded(2, None)),
        ] => assert!(taken.ptr_eq(&event)),
        other => panic!("told {other:?}"),
    }

    s.listen(3, &l, 3);
    s.fail_into(failure("gone"), &mut burst);
    assert!(n.take().is_empty(), "a listener ran inside the failure");
    drop(burst); // a dropped burst runs what it holds
    assert!(matches!(&n.take()[..], [(3, Told::Changed)]));
}

/// A listener fired from a burst that records a device signal itself, into the same burst, has
/// its listeners fired by the burst's loop after it returns, not from inside its own call: a
/// chain of 1,000 semaphores, each listener recording the next, fires every one at the depth of
/// the first.
#[test]
fn a_burst_fires_a_chain_of_records_as_one_loop() {
    const LINKS: usize = 1_000;

    /// Records `next` at 1 when fired; notes how deep in the stack it ran.
    struct Link {
        next: Option<Sem>,
        depths: Arc<Mutex<Vec<usize>>>,
    }

    impl Listener<FlagEvent> for Link {
        fn notify(&self, _semaphore: SemaphoreId, _key: u64) {
            unreachable!("fired from a burst, with a notice");
        }

        fn notice(
            &self,
            _semaphore: SemaphoreId,
            _key: u64,
            _notice: Notice<'_, FlagEvent>,
            burst: &mut Burst<FlagEvent>,
        ) {
            let marker = 0u8;
            let depth = std::hint::black_box(&marker) as *const u8 as usize;
            self.depths.lock().unwrap().push(depth);
            if let Some(next) = &self.next {
                next.record_device_signal_into(1, FlagEvent::new(), burst)
                    .unwrap();
            }
        }
    }

    let depths = Arc::new(Mutex::new(Vec::new()));
    let sems: Vec<Sem> = (0..LINKS).map(|_| Sem::new(0)).collect();
    for (i, s) in sems.iter().enumerate() {
        let link: Arc<dyn Listener<FlagEvent>> = Arc::new(Link {
            next: sems.get(i + 1).cloned(),
            depths: depths.clone(),
        });
        s.listen(1, &link, i as u64);
    }
    sems[0].record_device_signal(1, FlagEvent::new()).unwrap();
    let depths = depths.lock().unwrap();
    assert_eq!(depths.len(), LINKS, "every link fired");
    let spread = depths.iter().max().unwrap() - depths.iter().min().unwrap();
    assert!(spread < 4096, "the links ran {spread} bytes of stack apart");
}

/// A burst owes each waker's wake once, however often it is held, and makes it when it runs.
#[test]
fn a_burst_makes_each_held_wake_once_when_it_runs() {
    struct Count(AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    let (a, b) = (
        Arc::new(Count(AtomicUsize::new(0))),
        Arc::new(Count(AtomicUsize::new(0))),
    );
    let (wa, wb) = (
        std::task::Waker::from(a.clone()),
        std::task::Waker::from(b.clone()),
    );
    let mut burst = Burst::<FlagEvent>::new();
    burst.hold_wake(&wa);
    burst.hold_wake(&wb);
    burst.hold_wake(&wa);
    assert_eq!(a.0.load(Ordering::SeqCst), 0, "woken before the burst ran");
    burst.run();
    assert_eq!(
        (a.0.load(Ordering::SeqCst), b.0.load(Ordering::SeqCst)),
        (1, 1)
    );
    burst.run();
    assert_eq!(a.0.load(Ordering::SeqCst), 1, "a wake made twice");
}
