//! The resident queue on its CPU model: submission and signals, refusals, back-pressure,
//! failure propagation, host-pushed waits and idle exit, relaunch, shutdown and device loss.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use cuhal_resident::{
    Error, ExecutableKind, Launch, LaunchError, Launchable, NodeKind, Refusal, ResidentOptions,
    ResidentQueue,
};
use cuhal_semaphore::{Error as SemError, Failure, NoEvent, Semaphore};

type Sem = Semaphore<NoEvent>;
const LONG: Duration = Duration::from_secs(10);

/// An executable that counts how many of it are alive.
struct Exe {
    kind: ExecutableKind,
    nodes: Vec<NodeKind>,
    handle: u64,
    live: Arc<AtomicUsize>,
}

impl Exe {
    fn graph(handle: u64, live: &Arc<AtomicUsize>) -> Arc<dyn Launchable> {
        live.fetch_add(1, Ordering::SeqCst);
        Arc::new(Exe {
            kind: ExecutableKind::Graph,
            nodes: vec![NodeKind::Kernel, NodeKind::Memcpy, NodeKind::Memset],
            handle,
            live: live.clone(),
        })
    }
}

impl Drop for Exe {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Launchable for Exe {
    fn kind(&self) -> ExecutableKind {
        self.kind
    }
    fn nodes(&self) -> &[NodeKind] {
        &self.nodes
    }
    fn handle(&self) -> u64 {
        self.handle
    }
}

fn ok(_: Launch) -> Result<(), LaunchError> {
    Ok(())
}

fn queue(options: ResidentOptions) -> ResidentQueue<NoEvent> {
    ResidentQueue::new(options, ok).unwrap()
}

#[test]
fn a_submission_signals_its_semaphores_and_waits_in_order() {
    let q = queue(ResidentOptions::new("basic"));
    let live = Arc::new(AtomicUsize::new(0));
    let (a, b) = (Sem::new(0), Sem::new(0));
    q.bind(&a).unwrap();
    q.bind(&b).unwrap();
    let exe = Exe::graph(1, &live);
    q.submit(&[], &[(&a, 1)], &exe, 0).unwrap();
    q.submit(&[(&a, 1)], &[(&b, 5)], &exe, 0).unwrap();
    b.wait(5, LONG).unwrap();
    assert_eq!(a.query().unwrap(), 1);
    let stats = q.shutdown();
    assert_eq!((stats.submitted, stats.launched, stats.failed), (2, 2, 0));
    assert_eq!(stats.retained, 0);
}

#[test]
fn refusals_are_typed_and_publish_nothing() {
    let q = queue(ResidentOptions::new("refusals"));
    let live = Arc::new(AtomicUsize::new(0));
    let (bound, unbound) = (Sem::new(0), Sem::new(0));
    q.bind(&bound).unwrap();
    let graph = Exe::graph(1, &live);
    for kind in [ExecutableKind::Stream, ExecutableKind::Deferred] {
        let exe: Arc<dyn Launchable> = Arc::new(Exe {
            kind,
            nodes: vec![],
            handle: 2,
            live: Arc::new(AtomicUsize::new(1)),
        });
        let err = q.submit(&[], &[(&bound, 1)], &exe, 0).unwrap_err();
        assert!(matches!(err, Error::Refused(Refusal::NotAGraph { kind: k }) if k == kind));
    }
    let traced: Arc<dyn Launchable> = Arc::new(Exe {
        kind: ExecutableKind::Graph,
        nodes: vec![NodeKind::Kernel, NodeKind::EventRecord],
        handle: 3,
        live: Arc::new(AtomicUsize::new(1)),
    });
    let err = q.submit(&[], &[], &traced, 0).unwrap_err();
    assert!(matches!(
        err,
        Error::Refused(Refusal::NodeKind {
            kind: NodeKind::EventRecord,
            index: 1
        })
    ));
    assert!(err.to_string().contains("EventRecord"), "{err}");
    let err = q.submit(&[(&unbound, 1)], &[], &graph, 0).unwrap_err();
    assert!(matches!(
        err,
        Error::Refused(Refusal::UnboundSemaphore { semaphore, role: "wait" }) if semaphore == unbound.id()
    ));
    let err = q.submit(&[], &[(&bound, 1 << 63)], &graph, 0).unwrap_err();
    assert!(matches!(
        err,
        Error::Refused(Refusal::ValueOutOfRange { .. })
    ));
    let waits: Vec<(&Sem, u64)> = (0..7).map(|_| (&bound, 0)).collect();
    let err = q.submit(&waits, &[], &graph, 0).unwrap_err();
    assert!(matches!(
        err,
        Error::Refused(Refusal::TooManyWaits { count: 7, max: 6 })
    ));
    // A signal to a value already reached could never take effect.
    let err = q.submit(&[], &[(&bound, 0)], &graph, 0).unwrap_err();
    assert!(matches!(
        err,
        Error::Refused(Refusal::SignalNotAbove {
            value: 0,
            current: 0
        })
    ));
    assert!(err.to_string().contains("already reached"), "{err}");
    let stats = q.shutdown();
    assert_eq!(stats.submitted, 0);
    assert_eq!(bound.query().unwrap(), 0);
}

#[test]
fn a_full_ring_refuses_try_submit_and_blocks_submit_until_room() {
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let launcher = {
        let gate = gate.clone();
        move |_: Launch| -> Result<(), LaunchError> {
            let (open, cv) = &*gate;
            let mut open = open.lock().unwrap();
            while !*open {
                open = cv.wait(open).unwrap();
            }
            Ok(())
        }
    };
    let mut options = ResidentOptions::new("full");
    options.capacity = 4;
    let q = Arc::new(ResidentQueue::<NoEvent>::new(options, launcher).unwrap());
    let live = Arc::new(AtomicUsize::new(0));
    let exe = Exe::graph(1, &live);
    let done = Sem::new(0);
    q.bind(&done).unwrap();
    for value in 1..=4 {
        q.try_submit(&[], &[(&done, value)], &exe, 0).unwrap();
    }
    assert!(matches!(
        q.try_submit(&[], &[(&done, 5)], &exe, 0),
        Err(Error::Full { capacity: 4 })
    ));
    let blocked = {
        let (q, exe, done) = (q.clone(), exe.clone(), done.clone());
        thread::spawn(move || q.submit(&[], &[(&done, 5)], &exe, 0))
    };
    thread::sleep(Duration::from_millis(20));
    assert!(!blocked.is_finished(), "submit must wait for room");
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
    assert_eq!(blocked.join().unwrap().unwrap(), 4);
    done.wait(5, LONG).unwrap();
}

#[test]
fn a_failed_launch_fails_exactly_its_signals_and_their_dependents() {
    let launcher = |launch: Launch| -> Result<(), LaunchError> {
        if launch.executable == 13 {
            Err(LaunchError::Failed(Failure::msg("kernel trapped")))
        } else {
            Ok(())
        }
    };
    let q = ResidentQueue::<NoEvent>::new(ResidentOptions::new("fail"), launcher).unwrap();
    let live = Arc::new(AtomicUsize::new(0));
    let (bad, good) = (Exe::graph(13, &live), Exe::graph(1, &live));
    let (s1, s2, s3) = (Sem::new(0), Sem::new(0), Sem::new(0));
    for s in [&s1, &s2, &s3] {
        q.bind(s).unwrap();
    }
    q.submit(&[], &[(&s1, 1)], &bad, 0).unwrap();
    q.submit(&[(&s1, 1)], &[(&s2, 1)], &good, 0).unwrap();
    q.submit(&[], &[(&s3, 1)], &good, 0).unwrap();
    s3.wait(1, LONG).unwrap();
    let SemError::Failed(first) = s1.wait(1, LONG).unwrap_err() else {
        panic!("s1 must fail")
    };
    assert_eq!(first.to_string(), "kernel trapped");
    let SemError::Failed(second) = s2.wait(1, LONG).unwrap_err() else {
        panic!("s2 must fail")
    };
    assert!(
        second.ptr_eq(&first),
        "a dependent fails with the same failure"
    );
    let stats = q.shutdown();
    assert_eq!((stats.launched, stats.failed), (2, 2));
    assert!(
        q.lost().is_none(),
        "a plain launch failure does not lose the queue"
    );
}

#[test]
fn a_host_signal_restarts_an_idle_scheduler() {
    let q = queue(ResidentOptions::new("idle"));
    let live = Arc::new(AtomicUsize::new(0));
    let exe = Exe::graph(1, &live);
    let (host, done) = (Sem::new(0), Sem::new(0));
    q.bind(&host).unwrap();
    q.bind(&done).unwrap();
    q.submit(&[(&host, 1)], &[(&done, 1)], &exe, 0).unwrap();
    // Well past the 100 us idle exit.
    thread::sleep(Duration::from_millis(30));
    let idle = q.stats();
    assert!(idle.exits >= 1, "the scheduler exits when idle: {idle:?}");
    assert_eq!(idle.launched, 0);
    host.signal(1).unwrap();
    done.wait(1, LONG).unwrap();
    let stats = q.shutdown();
    assert!(
        stats.starts >= 2,
        "the host's value started it again: {stats:?}"
    );
    assert_eq!(stats.launched, 1);
}

#[test]
fn the_scheduler_relaunches_before_the_fire_and_forget_limit() {
    let executions = Arc::new(Mutex::new(Vec::new()));
    let launcher = {
        let executions = executions.clone();
        move |launch: Launch| -> Result<(), LaunchError> {
            executions.lock().unwrap().push(launch.execution);
            Ok(())
        }
    };
    let mut options = ResidentOptions::new("relaunch");
    options.idle_exit = Duration::from_secs(5);
    options.capacity = 512;
    let q = ResidentQueue::<NoEvent>::new(options, launcher).unwrap();
    let live = Arc::new(AtomicUsize::new(0));
    let exe = Exe::graph(1, &live);
    let (gate, done) = (Sem::new(0), Sem::new(0));
    q.bind(&gate).unwrap();
    q.bind(&done).unwrap();
    // Everything is published before the scheduler may launch anything.
    q.submit(&[(&gate, 1)], &[], &exe, 0).unwrap();
    for value in 1..=300 {
        q.submit(&[], &[(&done, value)], &exe, 0).unwrap();
    }
    gate.signal(1).unwrap();
    done.wait(300, LONG).unwrap();
    let stats = q.shutdown();
    assert_eq!(stats.launched, 301);
    let executions = executions.lock().unwrap();
    let mut per_execution = std::collections::BTreeMap::new();
    for e in executions.iter() {
        *per_execution.entry(*e).or_insert(0u32) += 1;
    }
    assert!(
        per_execution.values().all(|&n| n <= 120),
        "{per_execution:?}"
    );
    assert!(stats.relaunches >= 2, "{stats:?}");
}

#[test]
fn shutdown_runs_what_is_ready_fails_the_rest_and_leaks_nothing() {
    let live = Arc::new(AtomicUsize::new(0));
    let never = Sem::new(0);
    let ready: Vec<Sem> = (0..5).map(|_| Sem::new(0)).collect();
    let stuck: Vec<Sem> = (0..3).map(|_| Sem::new(0)).collect();
    {
        let q = queue(ResidentOptions::new("shutdown"));
        q.bind(&never).unwrap();
        for s in ready.iter().chain(&stuck) {
            q.bind(s).unwrap();
        }
        for s in &ready {
            q.submit(&[], &[(s, 1)], &Exe::graph(1, &live), 0).unwrap();
        }
        for s in &stuck {
            q.submit(&[(&never, 1)], &[(s, 1)], &Exe::graph(2, &live), 0)
                .unwrap();
        }
        let stats = q.shutdown();
        assert_eq!(stats.submitted, 8);
        assert_eq!(stats.launched, 5);
        assert_eq!(stats.failed_at_shutdown, 3);
        assert_eq!(stats.retired, 8);
        assert_eq!(stats.retained, 0);
        assert!(matches!(
            q.submit(&[], &[], &Exe::graph(3, &live), 0),
            Err(Error::Shutdown)
        ));
    }
    assert_eq!(
        live.load(Ordering::SeqCst),
        0,
        "every executable was released"
    );
    for s in &ready {
        assert_eq!(s.query().unwrap(), 1);
    }
    for s in &stuck {
        let SemError::Failed(failure) = s.query().unwrap_err() else {
            panic!("a pending submission's signal must fail")
        };
        assert!(matches!(
            failure.downcast_ref::<Error>(),
            Some(Error::ShutdownBeforeReady { .. })
        ));
    }
}

#[test]
fn device_loss_wakes_every_waiter_with_a_typed_error() {
    let live = Arc::new(AtomicUsize::new(0));
    let q = queue(ResidentOptions::new("lost"));
    let never = Sem::new(0);
    let targets: Vec<Sem> = (0..4).map(|_| Sem::new(0)).collect();
    q.bind(&never).unwrap();
    for s in &targets {
        q.bind(s).unwrap();
        q.submit(&[(&never, 1)], &[(s, 1)], &Exe::graph(1, &live), 0)
            .unwrap();
    }
    let waiters: Vec<_> = targets
        .iter()
        .map(|s| {
            let s = s.clone();
            thread::spawn(move || s.wait(1, LONG))
        })
        .collect();
    thread::sleep(Duration::from_millis(10));
    let failure = Failure::msg("device lost: illegal address");
    q.lose(failure.clone());
    for waiter in waiters {
        let SemError::Failed(got) = waiter.join().unwrap().unwrap_err() else {
            panic!("a waiter must see the loss")
        };
        assert!(got.ptr_eq(&failure));
    }
    assert!(matches!(
        q.submit(&[], &[], &Exe::graph(1, &live), 0),
        Err(Error::Lost(f)) if f.ptr_eq(&failure)
    ));
    let stats = q.shutdown();
    assert_eq!(stats.retained, 0);
    assert_eq!(stats.failed, 4);
    drop(q);
    assert_eq!(live.load(Ordering::SeqCst), 0);
}

#[test]
fn a_sticky_launch_error_loses_the_queue() {
    let launcher =
        |_: Launch| -> Result<(), LaunchError> { Err(LaunchError::Lost(Failure::msg("sticky"))) };
    let q = ResidentQueue::<NoEvent>::new(ResidentOptions::new("sticky"), launcher).unwrap();
    let live = Arc::new(AtomicUsize::new(0));
    let (a, other) = (Sem::new(0), Sem::new(0));
    q.bind(&a).unwrap();
    q.bind(&other).unwrap();
    q.submit(&[], &[(&a, 1)], &Exe::graph(1, &live), 0).unwrap();
    assert!(matches!(a.wait(1, LONG), Err(SemError::Failed(_))));
    assert!(matches!(other.wait(1, LONG), Err(SemError::Failed(_))));
    assert!(q.lost().is_some());
    assert!(matches!(
        q.submit(&[], &[], &Exe::graph(1, &live), 0),
        Err(Error::Lost(_))
    ));
}

#[test]
fn several_submitting_threads_all_complete_in_order() {
    const THREADS: u64 = 4;
    const EACH: u64 = 500;
    let mut options = ResidentOptions::new("stress");
    options.capacity = 8;
    let launched = Arc::new(AtomicUsize::new(0));
    let launcher = {
        let launched = launched.clone();
        move |_: Launch| -> Result<(), LaunchError> {
            launched.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    };
    let q = Arc::new(ResidentQueue::<NoEvent>::new(options, launcher).unwrap());
    let live = Arc::new(AtomicUsize::new(0));
    let semaphores: Vec<Sem> = (0..THREADS).map(|_| Sem::new(0)).collect();
    for s in &semaphores {
        q.bind(s).unwrap();
    }
    let threads: Vec<_> = semaphores
        .iter()
        .map(|s| {
            let (q, s, live) = (q.clone(), s.clone(), live.clone());
            thread::spawn(move || {
                let exe = Exe::graph(1, &live);
                for value in 1..=EACH {
                    // Each waits on its own previous value: in order per thread.
                    q.submit(&[(&s, value - 1)], &[(&s, value)], &exe, 0)
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for s in &semaphores {
        s.wait(EACH, LONG).unwrap();
    }
    let stats = q.shutdown();
    assert_eq!(stats.launched, THREADS * EACH);
    assert_eq!(launched.load(Ordering::Relaxed) as u64, THREADS * EACH);
    assert_eq!(stats.retained, 0);
    drop(q);
    assert_eq!(live.load(Ordering::SeqCst), 0);
}

#[test]
fn a_recorded_device_signal_does_not_fire_the_slot_listener_forever() {
    // A normal queue recorded a device signal for the value a resident wait wants, before the
    // value is reached: the semaphore fires listeners at once for it. The slot listener must not
    // re-listen (and be fired again) without end.
    use cuhal_semaphore::testing::FlagEvent;
    let q = ResidentQueue::<FlagEvent>::new(ResidentOptions::new("recorded"), ok).unwrap();
    let (input, done) = (
        Semaphore::<FlagEvent>::new(0),
        Semaphore::<FlagEvent>::new(0),
    );
    q.bind(&input).unwrap();
    q.bind(&done).unwrap();
    input.record_device_signal(2, FlagEvent::new()).unwrap();
    let live = Arc::new(AtomicUsize::new(0));
    q.submit(&[(&input, 1)], &[(&done, 1)], &Exe::graph(1, &live), 0)
        .unwrap();
    input.advance_to(2).unwrap();
    done.wait(1, LONG).unwrap();
}

/// A wait on a semaphore that has failed fails, even at a value it reached before failing:
/// nothing is launched and the submission's signals fail with the wait's failure.
#[test]
fn a_wait_on_a_failed_semaphore_fails_even_below_its_value() {
    let launched = Arc::new(AtomicUsize::new(0));
    let q = {
        let launched = launched.clone();
        ResidentQueue::new(ResidentOptions::new("failed-wait"), move |_: Launch| {
            launched.fetch_add(1, Ordering::SeqCst);
            Ok::<(), LaunchError>(())
        })
        .unwrap()
    };
    let live = Arc::new(AtomicUsize::new(0));
    let (s, done) = (Sem::new(5), Sem::new(0));
    q.bind(&s).unwrap();
    q.bind(&done).unwrap();
    let failure = Failure::msg("upstream work failed");
    s.fail(failure.clone());
    let exe = Exe::graph(1, &live);
    q.submit(&[(&s, 3)], &[(&done, 1)], &exe, 0).unwrap();
    match done.wait(1, LONG) {
        Err(SemError::Failed(seen)) => assert!(seen.ptr_eq(&failure), "{seen}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(launched.load(Ordering::SeqCst), 0, "nothing launched");
    let stats = q.shutdown();
    assert_eq!(stats.retained, 0);
}

/// Sizes past the limits are typed refusals, not capacity panics or aborts.
#[test]
fn options_past_their_limits_are_refused() {
    for (what, options) in [
        (
            "capacity",
            ResidentOptions {
                capacity: usize::MAX,
                ..ResidentOptions::new("too-big")
            },
        ),
        (
            "capacity",
            ResidentOptions {
                capacity: cuhal_resident::MAX_CAPACITY + 1,
                ..ResidentOptions::new("too-big")
            },
        ),
        (
            "slots",
            ResidentOptions {
                slots: usize::MAX,
                ..ResidentOptions::new("too-big")
            },
        ),
    ] {
        match ResidentQueue::<NoEvent>::new(options, ok) {
            Err(cuhal_resident::Error::InvalidOptions(why)) => assert!(why.contains(what), "{why}"),
            Err(other) => panic!("{what}: {other:?}"),
            Ok(_) => panic!("{what}: accepted"),
        }
    }
}
