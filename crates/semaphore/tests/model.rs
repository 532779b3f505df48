//! Property tests against a simple sequential model of the timeline.
//!
//! `sequential_ops_match_the_model`: random operations on a few semaphores, run on one thread, each
//! result compared with the model's; listener firings and event retention compared after every
//! operation; parked waiter threads (on semaphores whose waits never query events, so they cannot
//! change state themselves) must wake exactly when the model says, with the model's result.
//!
//! `concurrent_ops_keep_the_invariants`: random operations from several threads at once; each
//! thread sees values that never decrease; the final value is one somebody produced and at least
//! every successful signal; a waiter for the final value wakes; no event leaks.

mod common;

use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use common::bounded;
use cuhal_semaphore::testing::{FlagEvent, LiveCounter};
use cuhal_semaphore::{
    Error, Failure, ListenToken, Listener, Semaphore, SemaphoreId, SemaphoreOptions, Timeout,
    wait_all, wait_any,
};
use proptest::prelude::*;

type Sem = Semaphore<FlagEvent>;

/// Semaphores 0 and 1 query events in host waits; 2 and 3 never do (parked waiters go there).
const SEMS: usize = 4;
const QUIET: usize = 2;

#[derive(Debug, Clone)]
enum Op {
    Signal(usize, u64),
    Advance(usize, u64),
    Fail(usize),
    Wait(usize, u64),
    WaitAll(Vec<(usize, u64)>),
    WaitAny(Vec<(usize, u64)>),
    Record(usize, u64),
    CompleteEvent(usize),
    ErrorEvent(usize),
    DeviceWait(usize, u64),
    Listen(usize, u64),
    Cancel(usize),
    /// A parked waiter thread: wait-all (true) or wait-any over entries of the quiet semaphores.
    Park(bool, Vec<(usize, u64)>),
}

fn sem() -> impl Strategy<Value = usize> {
    0..SEMS
}

fn value() -> impl Strategy<Value = u64> {
    0..16u64
}

fn entries(range: std::ops::Range<usize>) -> impl Strategy<Value = Vec<(usize, u64)>> {
    prop::collection::vec((range, value()), 0..4)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (sem(), value()).prop_map(|(s, v)| Op::Signal(s, v)),
        2 => (sem(), value()).prop_map(|(s, v)| Op::Advance(s, v)),
        1 => sem().prop_map(Op::Fail),
        3 => (sem(), value()).prop_map(|(s, v)| Op::Wait(s, v)),
        2 => entries(0..SEMS).prop_map(Op::WaitAll),
        2 => entries(0..SEMS).prop_map(Op::WaitAny),
        4 => (sem(), value()).prop_map(|(s, v)| Op::Record(s, v)),
        3 => (0..12usize).prop_map(Op::CompleteEvent),
        1 => (0..12usize).prop_map(Op::ErrorEvent),
        2 => (sem(), value()).prop_map(|(s, v)| Op::DeviceWait(s, v)),
        3 => (sem(), value()).prop_map(|(s, v)| Op::Listen(s, v)),
        1 => (0..12usize).prop_map(Op::Cancel),
        1 => (any::<bool>(), entries(QUIET..SEMS)).prop_map(|(all, list)| Op::Park(all, list)),
    ]
}

/// The model's failure: an index into the test's list of failures.
type FailureId = usize;

#[derive(Clone, Default)]
struct ModelSem {
    value: u64,
    failed: Option<FailureId>,
    /// (value, event index), sorted by value, insertion order among equals.
    timepoints: Vec<(u64, usize)>,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum ModelEvent {
    Pending,
    Complete,
    Error(FailureId),
}

#[derive(Default)]
struct Model {
    sems: Vec<ModelSem>,
    events: Vec<ModelEvent>,
}

/// The model's answer to a wait.
#[derive(Debug, PartialEq, Clone, Copy)]
enum Outcome {
    Ok(usize),
    Failed(FailureId),
    Timeout,
    Empty,
}

impl Model {
    fn advance(&mut self, s: usize, v: u64) {
        let sem = &mut self.sems[s];
        if sem.failed.is_none() && v > sem.value {
            sem.value = v;
            sem.timepoints.retain(|(tv, _)| *tv > v);
        }
    }

    fn fail(&mut self, s: usize, f: FailureId) {
        let sem = &mut self.sems[s];
        if sem.failed.is_none() {
            sem.failed = Some(f);
            sem.timepoints.clear();
        }
    }

    fn at_least(&self, s: usize, v: u64) -> Option<(u64, usize)> {
        self.sems[s]
            .timepoints
            .iter()
            .copied()
            .find(|(tv, _)| *tv >= v)
    }

    fn threshold(&self, s: usize) -> u64 {
        let sem = &self.sems[s];
        sem.timepoints
            .last()
            .map_or(sem.value, |(tv, _)| (*tv).max(sem.value))
    }

    /// Checks the list as a wait does: a failure first, then all/any reached.
    fn check(&self, list: &[(usize, u64)], all: bool) -> Option<Outcome> {
        if let Some(f) = list.iter().find_map(|(s, _)| self.sems[*s].failed) {
            return Some(Outcome::Failed(f));
        }
        let reached: Vec<bool> = list
            .iter()
            .map(|(s, v)| self.sems[*s].value >= *v)
            .collect();
        if all && reached.iter().all(|r| *r) {
            return Some(Outcome::Ok(0));
        }
        if !all && let Some(i) = reached.iter().position(|r| *r) {
            return Some(Outcome::Ok(i));
        }
        None
    }

    /// An immediate host wait: check; query the events of the unreached entries in list order
    /// (event queries only on semaphores below QUIET) up to the first that completed or failed,
    /// apply what it says and check again, until a round changes nothing. One at a time, as the
    /// wait does: the first failure ends a wait, so an event of a later entry that failed too is
    /// not looked at, and its semaphore is not failed by this wait.
    fn wait(&mut self, list: &[(usize, u64)], all: bool) -> Outcome {
        if list.is_empty() {
            return if all { Outcome::Ok(0) } else { Outcome::Empty };
        }
        loop {
            if let Some(outcome) = self.check(list, all) {
                return outcome;
            }
            let round: Vec<(usize, u64, usize)> = list
                .iter()
                .filter(|(s, v)| *s < QUIET && self.sems[*s].value < *v)
                .filter_map(|(s, v)| self.at_least(*s, *v).map(|(tv, e)| (*s, tv, e)))
                .collect();
            let mut changed = false;
            for (s, tv, e) in round {
                match self.events[e] {
                    ModelEvent::Pending => continue,
                    ModelEvent::Complete => self.advance(s, tv),
                    ModelEvent::Error(f) => self.fail(s, f),
                }
                changed = true;
                break;
            }
            if !changed {
                return Outcome::Timeout;
            }
        }
    }
}

fn outcome<T>(
    result: Result<T, Error>,
    index: impl FnOnce(T) -> usize,
    failures: &[Failure],
) -> Outcome {
    match result {
        Ok(t) => Outcome::Ok(index(t)),
        Err(Error::Failed(f)) => Outcome::Failed(
            failures
                .iter()
                .position(|known| known.ptr_eq(&f))
                .expect("a failure the test created"),
        ),
        Err(Error::Timeout) => Outcome::Timeout,
        Err(Error::EmptyWaitList) => Outcome::Empty,
        Err(other) => panic!("unexpected {other:?}"),
    }
}

#[derive(Default)]
struct Fired(Mutex<Vec<u64>>);

impl<E> Listener<E> for Fired {
    fn notify(&self, _: SemaphoreId, key: u64) {
        self.0.lock().unwrap().push(key);
    }
}

struct Parked {
    list: Vec<(usize, u64)>,
    all: bool,
    done: bool,
    rx: mpsc::Receiver<Outcome>,
    handle: thread::JoinHandle<()>,
}

fn run_sequential(initial: Vec<u64>, ops: Vec<Op>) {
    let live = LiveCounter::new();
    let sems: Vec<Sem> = (0..SEMS)
        .map(|i| {
            let options = if i < QUIET {
                SemaphoreOptions::new().with_event_spin(Duration::ZERO)
            } else {
                SemaphoreOptions::new().without_event_queries()
            };
            Sem::with_options(initial[i], options)
        })
        .collect();
    let mut model = Model {
        sems: initial
            .iter()
            .map(|&value| ModelSem {
                value,
                ..Default::default()
            })
            .collect(),
        events: Vec::new(),
    };
    let failures: Arc<Mutex<Vec<Failure>>> = Arc::default();
    let new_failure = |text: String| -> (Failure, FailureId) {
        let f = Failure::msg(text);
        let mut all = failures.lock().unwrap();
        all.push(f.clone());
        (f, all.len() - 1)
    };
    let known = || failures.lock().unwrap().clone();
    let mut events: Vec<FlagEvent> = Vec::new();
    let fired = Arc::new(Fired::default());
    let listener: Arc<dyn Listener<FlagEvent>> = fired.clone();
    // (semaphore, value, token, cancelled, expected fired)
    let mut listeners: Vec<(usize, u64, ListenToken, bool, bool)> = Vec::new();
    let mut parked: Vec<Parked> = Vec::new();

    for op in ops {
        match op.clone() {
            Op::Signal(s, v) => {
                let expected = match (model.sems[s].failed, model.sems[s].value) {
                    (Some(f), _) => Err(Some(f)),
                    (None, current) if v <= current => Err(None),
                    _ => Ok(()),
                };
                let got = sems[s].signal(v);
                match (&expected, &got) {
                    (Ok(()), Ok(())) => model.advance(s, v),
                    (Err(Some(f)), Err(Error::Failed(g))) => assert!(g.ptr_eq(&known()[*f])),
                    (Err(None), Err(Error::NotMonotonic { current, requested })) => {
                        assert_eq!((*current, *requested), (model.sems[s].value, v))
                    }
                    _ => panic!("{op:?}: expected {expected:?}, got {got:?}"),
                }
            }
            Op::Advance(s, v) => {
                let got = sems[s].advance_to(v);
                match model.sems[s].failed {
                    Some(f) => {
                        assert!(matches!(&got, Err(Error::Failed(g)) if g.ptr_eq(&known()[f])))
                    }
                    None => {
                        assert!(got.is_ok());
                        model.advance(s, v);
                    }
                }
            }
            Op::Fail(s) => {
                let (f, id) = new_failure(format!("fail {s}"));
                sems[s].fail(f);
                model.fail(s, id);
            }
            Op::Wait(s, v) => {
                let expected = model.wait(&[(s, v)], true);
                let got = outcome(sems[s].wait(v, Timeout::Immediate), |()| 0, &known());
                assert_eq!(got, expected, "{op:?}");
            }
            Op::WaitAll(list) | Op::WaitAny(list) => {
                let all = matches!(op, Op::WaitAll(_));
                let expected = model.wait(&list, all);
                let refs: Vec<(&Sem, u64)> = list.iter().map(|(s, v)| (&sems[*s], *v)).collect();
                let got = if all {
                    outcome(wait_all(&refs, Timeout::Immediate), |()| 0, &known())
                } else {
                    outcome(wait_any(&refs, Timeout::Immediate), |i| i, &known())
                };
                assert_eq!(got, expected, "{op:?}");
            }
            Op::Record(s, v) => {
                let event = FlagEvent::counted(&live);
                let index = events.len();
                events.push(event.clone());
                model.events.push(ModelEvent::Pending);
                let got = sems[s].record_device_signal(v, event);
                let sem = &mut model.sems[s];
                match sem.failed {
                    Some(_) => assert!(matches!(got, Err(Error::Failed(_)))),
                    None => {
                        assert!(got.is_ok());
                        if v > sem.value {
                            let at = sem.timepoints.partition_point(|(tv, _)| *tv <= v);
                            sem.timepoints.insert(at, (v, index));
                        }
                    }
                }
            }
            Op::CompleteEvent(i) => {
                if let Some(e) = events.get(i) {
                    e.complete();
                    if model.events[i] == ModelEvent::Pending {
                        model.events[i] = ModelEvent::Complete;
                    }
                }
            }
            Op::ErrorEvent(i) => {
                if let Some(e) = events.get(i) {
                    let (f, id) = new_failure(format!("event {i}"));
                    e.fail(f);
                    if !matches!(model.events[i], ModelEvent::Error(_)) {
                        model.events[i] = ModelEvent::Error(id);
                    }
                }
            }
            Op::DeviceWait(s, v) => {
                let sem = &model.sems[s];
                let expected = if sem.failed.is_some() || sem.value >= v {
                    None
                } else {
                    model.at_least(s, v).map(|(_, e)| e)
                };
                let got = sems[s].device_wait_event(v);
                match (expected, got) {
                    (None, None) => {}
                    (Some(e), Some(g)) => assert!(g.ptr_eq(&events[e]), "{op:?}: another event"),
                    (e, g) => panic!("{op:?}: expected event {e:?}, got {g:?}"),
                }
            }
            Op::Listen(s, v) => {
                let key = listeners.len() as u64;
                let token = sems[s].listen(v, &listener, key);
                listeners.push((s, v, token, false, false));
            }
            Op::Cancel(i) => {
                if let Some(entry) = listeners.get_mut(i) {
                    sems[entry.0].cancel_listen(entry.2);
                    entry.3 = true;
                }
            }
            Op::Park(all, list) => {
                let (tx, rx) = mpsc::channel();
                let owned: Vec<Sem> = list.iter().map(|(s, _)| sems[*s].clone()).collect();
                let values: Vec<u64> = list.iter().map(|(_, v)| *v).collect();
                let known_failures = failures.clone();
                let handle = thread::spawn(move || {
                    let refs: Vec<(&Sem, u64)> =
                        owned.iter().zip(&values).map(|(s, v)| (s, *v)).collect();
                    let result = if all {
                        wait_all(&refs, Timeout::Infinite).map(|()| 0)
                    } else {
                        wait_any(&refs, Timeout::Infinite)
                    };
                    let known = known_failures.lock().unwrap().clone();
                    let _ = tx.send(outcome(result, |i| i, &known));
                });
                // Until it has registered on every entry (or is satisfied at once), a later
                // operation would race with its first look, which a wait-any reads one entry at a
                // time: a value raised between two entries makes it report a later one.
                if model.check(&list, all).is_none() && !list.is_empty() {
                    let registered = || sems.iter().map(Sem::waiter_count).sum::<usize>();
                    let target = parked
                        .iter()
                        .filter(|p| !p.done)
                        .map(|p| p.list.len())
                        .sum::<usize>()
                        + list.len();
                    let deadline = std::time::Instant::now() + Duration::from_secs(10);
                    while registered() < target {
                        assert!(
                            std::time::Instant::now() < deadline,
                            "a waiter never parked"
                        );
                        thread::yield_now();
                    }
                }
                parked.push(Parked {
                    list,
                    all,
                    done: false,
                    rx,
                    handle,
                });
            }
        }

        // After every operation: values, listeners, event retention and parked waiters match.
        for (s, sem) in sems.iter().enumerate() {
            match (sem.query(), model.sems[s].failed) {
                (Ok(v), None) => assert_eq!(v, model.sems[s].value, "after {op:?}"),
                (Err(Error::Failed(f)), Some(id)) => assert!(f.ptr_eq(&known()[id])),
                (got, expected) => panic!("after {op:?}: {got:?}, model failure {expected:?}"),
            }
            assert_eq!(sem.timepoint_count(), model.sems[s].timepoints.len());
        }
        for (key, entry) in listeners.iter_mut().enumerate() {
            let (s, v, _, cancelled, ref mut should) = *entry;
            if !cancelled && !*should && (model.sems[s].failed.is_some() || model.threshold(s) >= v)
            {
                *should = true;
            }
            let count = fired
                .0
                .lock()
                .unwrap()
                .iter()
                .filter(|k| **k == key as u64)
                .count();
            assert_eq!(count, usize::from(entry.4), "listener {key} after {op:?}");
        }
        for (i, e) in events.iter().enumerate() {
            let held = model
                .sems
                .iter()
                .flat_map(|s| &s.timepoints)
                .filter(|(_, ev)| *ev == i)
                .count();
            assert_eq!(
                e.clone_count(),
                1 + held,
                "event {i} retention after {op:?}"
            );
        }
        for p in parked.iter_mut().filter(|p| !p.done) {
            let expected = if p.list.is_empty() {
                Some(if p.all {
                    Outcome::Ok(0)
                } else {
                    Outcome::Empty
                })
            } else {
                model.check(&p.list, p.all)
            };
            match expected {
                Some(expected) => {
                    let got =
                        p.rx.recv_timeout(Duration::from_secs(10))
                            .expect("a waiter did not wake");
                    assert_eq!(got, expected, "parked {:?} after {op:?}", p.list);
                    p.done = true;
                }
                None => assert!(
                    p.rx.try_recv().is_err(),
                    "parked {:?} woke early after {op:?}",
                    p.list
                ),
            }
        }
    }
    // Fail everything: every remaining parked waiter must wake with a failure.
    for (s, sem) in sems.iter().enumerate() {
        let (f, id) = new_failure(format!("end {s}"));
        sem.fail(f);
        model.fail(s, id);
    }
    for p in parked {
        if !p.done {
            let got =
                p.rx.recv_timeout(Duration::from_secs(10))
                    .expect("a waiter did not wake on failure");
            assert!(matches!(got, Outcome::Failed(_)) || p.list.is_empty());
        }
        p.handle.join().unwrap();
    }
    drop(sems);
    drop(events);
    assert_eq!(live.live(), 0, "every event released");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn sequential_ops_match_the_model(
        initial in prop::collection::vec(0..4u64, SEMS),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        run_sequential(initial, ops);
    }
}

#[derive(Debug, Clone)]
enum ConcurrentOp {
    Signal(usize, u64),
    Advance(usize, u64),
    Wait(usize, u64),
    WaitAll(usize, u64, usize, u64),
    WaitAny(usize, u64, usize, u64),
    Record(usize, u64),
    Complete,
    DeviceWait(usize, u64),
    Fail(usize),
}

fn concurrent_op() -> impl Strategy<Value = ConcurrentOp> {
    let s = || 0..2usize;
    let v = || 1..40u64;
    prop_oneof![
        5 => (s(), v()).prop_map(|(s, v)| ConcurrentOp::Signal(s, v)),
        3 => (s(), v()).prop_map(|(s, v)| ConcurrentOp::Advance(s, v)),
        3 => (s(), v()).prop_map(|(s, v)| ConcurrentOp::Wait(s, v)),
        1 => (s(), v(), s(), v()).prop_map(|(a, x, b, y)| ConcurrentOp::WaitAll(a, x, b, y)),
        1 => (s(), v(), s(), v()).prop_map(|(a, x, b, y)| ConcurrentOp::WaitAny(a, x, b, y)),
        3 => (s(), v()).prop_map(|(s, v)| ConcurrentOp::Record(s, v)),
        2 => Just(ConcurrentOp::Complete),
        2 => (s(), v()).prop_map(|(s, v)| ConcurrentOp::DeviceWait(s, v)),
        1 => s().prop_map(ConcurrentOp::Fail),
    ]
}

/// What one thread saw: per semaphore, the values it produced or that a wait reached.
#[derive(Default)]
struct Seen {
    signalled: Vec<(usize, u64)>,
    produced: Vec<(usize, u64)>,
    reached: Vec<(usize, u64)>,
}

const FINAL: u64 = 1000;

fn run_concurrent(threads: Vec<Vec<ConcurrentOp>>, with_failure: bool) {
    let live = LiveCounter::new();
    let options = SemaphoreOptions::new().with_event_spin(Duration::from_micros(20));
    let sems: Vec<Sem> = (0..2).map(|_| Sem::with_options(0, options)).collect();
    let short = Duration::from_micros(200);
    // A waiter for the value every thread advances to at its end: it must wake.
    let final_waiter = {
        let sems = sems.clone();
        thread::spawn(move || wait_all(&[(&sems[0], FINAL), (&sems[1], FINAL)], Timeout::Infinite))
    };
    let parties = threads.len() + 1;
    let (ops_done, checked) = (
        Arc::new(Barrier::new(parties)),
        Arc::new(Barrier::new(parties)),
    );
    let all_seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let handles: Vec<_> = threads
        .into_iter()
        .map(|ops| {
            let sems = sems.clone();
            let live = live.clone();
            let (ops_done, checked, all_seen) =
                (ops_done.clone(), checked.clone(), all_seen.clone());
            thread::spawn(move || {
                let mut seen = Seen::default();
                let mut last = [0u64; 2];
                let mut mine: Vec<FlagEvent> = Vec::new();
                let observe = |last: &mut [u64; 2], s: usize, sem: &Sem| {
                    if let Ok(v) = sem.query() {
                        assert!(
                            v >= last[s],
                            "semaphore {s} went back from {} to {v}",
                            last[s]
                        );
                        last[s] = v;
                    }
                };
                for op in ops {
                    match op {
                        ConcurrentOp::Signal(s, v) => match sems[s].signal(v) {
                            Ok(()) => seen.signalled.push((s, v)),
                            Err(Error::NotMonotonic { current, requested }) => {
                                assert!(requested <= current)
                            }
                            Err(Error::Failed(_)) => {}
                            Err(e) => panic!("{e:?}"),
                        },
                        ConcurrentOp::Advance(s, v) => {
                            if sems[s].advance_to(v).is_ok() {
                                seen.produced.push((s, v));
                            }
                        }
                        ConcurrentOp::Wait(s, v) => {
                            if sems[s].wait(v, short).is_ok() {
                                seen.reached.push((s, v));
                            }
                        }
                        ConcurrentOp::WaitAll(a, x, b, y) => {
                            if wait_all(&[(&sems[a], x), (&sems[b], y)], short).is_ok() {
                                seen.reached.push((a, x));
                                seen.reached.push((b, y));
                            }
                        }
                        ConcurrentOp::WaitAny(a, x, b, y) => {
                            if let Ok(i) = wait_any(&[(&sems[a], x), (&sems[b], y)], short) {
                                seen.reached.push(if i == 0 { (a, x) } else { (b, y) });
                            }
                        }
                        ConcurrentOp::Record(s, v) => {
                            let e = FlagEvent::counted(&live);
                            if sems[s].record_device_signal(v, e.clone()).is_ok() {
                                seen.produced.push((s, v));
                            }
                            mine.push(e);
                        }
                        ConcurrentOp::Complete => {
                            if let Some(e) = mine.pop() {
                                e.complete();
                            }
                        }
                        ConcurrentOp::DeviceWait(s, v) => drop(sems[s].device_wait_event(v)),
                        ConcurrentOp::Fail(s) => {
                            if with_failure {
                                sems[s].fail(Failure::msg("concurrent failure"));
                            }
                        }
                    }
                    for (s, sem) in sems.iter().enumerate() {
                        observe(&mut last, s, sem);
                    }
                }
                all_seen.lock().unwrap().push(seen);
                ops_done.wait();
                checked.wait();
                for e in mine {
                    e.complete();
                }
                for sem in &sems {
                    let _ = sem.advance_to(FINAL);
                }
            })
        })
        .collect();
    // Quiescent point: every thread has done its operations, none has advanced to FINAL yet.
    ops_done.wait();
    {
        let seen = all_seen.lock().unwrap();
        for (s, sem) in sems.iter().enumerate() {
            let Ok(value) = sem.query() else {
                assert!(with_failure);
                continue;
            };
            let mine = |list: fn(&Seen) -> &Vec<(usize, u64)>| {
                seen.iter()
                    .flat_map(move |t| list(t).iter())
                    .filter(|(ss, _)| *ss == s)
                    .map(|(_, v)| *v)
            };
            let max_signalled = mine(|t| &t.signalled).max().unwrap_or(0);
            assert!(
                value >= max_signalled,
                "semaphore {s} at {value}, below a successful signal {max_signalled}"
            );
            assert!(
                mine(|t| &t.reached).all(|v| v <= value),
                "a wait succeeded for a value never reached"
            );
            let produced = value == 0
                || mine(|t| &t.signalled)
                    .chain(mine(|t| &t.produced))
                    .any(|v| v == value);
            assert!(
                produced,
                "semaphore {s} at {value}, a value nobody produced"
            );
        }
    }
    checked.wait();
    let seen: Vec<Seen> = std::mem::take(&mut *all_seen.lock().unwrap());
    for h in handles {
        h.join().unwrap();
    }
    match final_waiter.join().unwrap() {
        Ok(()) => {}
        Err(Error::Failed(_)) => assert!(with_failure),
        Err(e) => panic!("the final waiter: {e:?}"),
    }
    for (s, sem) in sems.iter().enumerate() {
        match sem.query() {
            Ok(v) => {
                assert_eq!(v, FINAL);
                for seen in &seen {
                    for (ss, sv) in seen.signalled.iter().chain(&seen.reached) {
                        assert!(*ss != s || *sv <= v);
                    }
                }
            }
            Err(Error::Failed(_)) => assert!(with_failure),
            Err(e) => panic!("{e:?}"),
        }
        assert_eq!(sem.waiter_count(), 0);
    }
    drop(sems);
    assert_eq!(live.live(), 0, "every event released");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn concurrent_ops_keep_the_invariants(
        threads in prop::collection::vec(prop::collection::vec(concurrent_op(), 1..60), 2..5),
        with_failure in any::<bool>(),
    ) {
        bounded(Duration::from_secs(30), move || run_concurrent(threads, with_failure));
    }
}
