//! loom models of the scheduler's core: the pending/listener hand-off (a listener handles its
//! notification on its own thread when the issue lock is free, records it for the holder when the
//! holder is itself, records it and wakes the worker when another thread holds the lock), issue,
//! completion and retirement, failure propagation and shutdown. Each model runs one real
//! [`Queue`] (its worker and completion threads are loom threads) on a model device, with the
//! submitting thread and one more thread racing it: every interleaving up to
//! `LOOM_MAX_PREEMPTIONS` preemptions is run. A lost wake-up leaves the main thread parked on a
//! semaphore that nothing will advance, with every other thread parked too: loom reports that
//! as a deadlock.
//!
//! Built and run only with `RUSTFLAGS="--cfg loom"` (`cargo xtask ci` does it); the crate then
//! uses loom's threads, mutexes, atomics and a loom parker (see `src/sync.rs`).
#![cfg(loom)]

#[path = "../../semaphore/tests/common/loom.rs"]
mod loom_model;

use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;

use cuhal_scheduler::{
    Backend, Cleanup, Cleanups, CompletionOptions, DeviceEvent, Error, Failure, Queue,
    QueueOptions, Resources,
};
use cuhal_semaphore::testing::{FlagEvent, LiveCounter};
use cuhal_semaphore::{Error as SemaphoreError, Semaphore, SemaphoreOptions, Timeout};
use loom::thread;
use smallvec::smallvec;

use loom_model::model;

/// What an action does on the model device, with the action's number.
#[derive(Clone, Copy, Debug)]
enum Work {
    /// Runs and completes.
    Run(usize),
    /// Issued, then the device faults: its completion event reports an error, and so does every
    /// event issued after it (a sticky error, as on CUDA).
    Fault(usize),
}

impl Work {
    fn id(self) -> usize {
        match self {
            Work::Run(id) | Work::Fault(id) => id,
        }
    }
}

/// What happened to each action, as the device and the cleanups saw it. Plain std types: nothing
/// here is a synchronisation point of the code under test, and no loom operation runs while one
/// of these locks is held.
#[derive(Default)]
struct Log {
    issued: StdMutex<Vec<usize>>,
    released: StdMutex<Vec<usize>>,
    /// `(action, failure)` per cleanup run.
    cleaned: StdMutex<Vec<(usize, Option<Failure>)>>,
    /// The device's sticky fault, once one happened.
    fault: StdMutex<Option<Failure>>,
    events: LiveCounter,
}

fn locked<T>(mutex: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The model device: runs nothing, but keeps CUDA's order and failure rules. An event completes
/// when the completion side waits for it (so a semaphore's value lags its device signal, as on a
/// real device); an event issued behind a failed one (by a device wait or after a fault) fails
/// with that failure.
struct Device(Arc<Log>);

impl Backend for Device {
    type Event = FlagEvent;
    type Payload = Work;
    type IssueLocal = ();

    fn issue(
        &self,
        _local: &mut (),
        device_waits: &[FlagEvent],
        work: &mut Work,
    ) -> Result<FlagEvent, Failure> {
        locked(&self.0.issued).push(work.id());
        let event = FlagEvent::counted(&self.0.events);
        let mut fault = locked(&self.0.fault);
        if let Work::Fault(_) = work
            && fault.is_none()
        {
            *fault = Some(Failure::msg("model: device fault"));
        }
        let upstream = device_waits.iter().find_map(|e| e.query().err());
        if let Some(failure) = upstream.or_else(|| fault.clone()) {
            event.fail(failure);
        }
        Ok(event)
    }

    fn issue_local(&self) {}

    fn query_event(&self, event: &FlagEvent) -> Result<bool, Failure> {
        event.query()
    }

    fn block_on_event(&self, event: &FlagEvent) -> Result<(), Failure> {
        event.query()?;
        event.complete();
        Ok(())
    }

    fn release(&self, work: Work) {
        locked(&self.0.released).push(work.id());
    }
}

/// A queue on the model device and its log.
fn queue() -> (Queue<Device>, Arc<Log>) {
    let log = Arc::new(Log::default());
    let options = QueueOptions::new("model")
        .with_capacity(4)
        .with_completion(CompletionOptions::new().with_spin(Duration::ZERO));
    let queue = Queue::new(Device(log.clone()), options).expect("queue starts");
    (queue, log)
}

/// A semaphore whose host waits never query events (loom has no time to spin against): a waiter
/// sees a value only once the completion side advances it.
fn semaphore() -> Semaphore<FlagEvent> {
    Semaphore::with_options(0, SemaphoreOptions::new().without_event_queries())
}

/// Submits action `work` waiting on `waits` and signalling `signals`; its cleanup logs how it ended.
fn submit(
    queue: &Queue<Device>,
    log: &Arc<Log>,
    waits: &[(&Semaphore<FlagEvent>, u64)],
    signals: &[(&Semaphore<FlagEvent>, u64)],
    work: Work,
) -> Result<(), Error> {
    let log = log.clone();
    let cleanups: Cleanups = smallvec![Cleanup::once(move |outcome| {
        locked(&log.cleaned).push((work.id(), outcome.err().cloned()));
    })];
    queue.submit(waits, signals, work, Resources::new(), cleanups)
}

/// After the queue is dropped: every action was released and cleaned up exactly once, none was
/// issued twice or out of submission order, and no device event is left alive.
fn check_retired(log: &Log, actions: usize) -> Vec<(usize, Option<Failure>)> {
    let issued = locked(&log.issued).clone();
    assert!(
        issued.windows(2).all(|w| w[0] < w[1]),
        "issued twice or out of order: {issued:?}"
    );
    let mut released = locked(&log.released).clone();
    released.sort_unstable();
    assert_eq!(released, (0..actions).collect::<Vec<_>>(), "released");
    let mut cleaned = locked(&log.cleaned).clone();
    cleaned.sort_by_key(|(id, _)| *id);
    assert_eq!(
        cleaned.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        (0..actions).collect::<Vec<_>>(),
        "cleanups"
    );
    assert_eq!(log.events.live(), 0, "device events leaked");
    cleaned
}

/// [`check_retired`], and every action was issued, in submission order, and none failed.
fn check_succeeded(log: &Log, actions: usize) {
    let cleaned = check_retired(log, actions);
    assert_eq!(*locked(&log.issued), (0..actions).collect::<Vec<_>>());
    assert!(cleaned.iter().all(|(_, failure)| failure.is_none()));
}

fn failed_with(result: Result<(), SemaphoreError>, failure: &Failure) -> bool {
    matches!(result, Err(SemaphoreError::Failed(seen)) if seen.ptr_eq(failure))
}

/// No lost wake-up while the worker drains: X waits on `a`, which another thread signals while
/// the main thread submits Y; Y waits on `c`, which the main thread signals right after. A
/// listener that finds the issue lock taken (by the submitter, the other signaller or the worker
/// draining an earlier notification) records its key and wakes the worker; whichever thread holds
/// the lock drains every recorded key before it lets go. X and then Y are issued exactly once and
/// both signals are reached. (A lost notification leaves the main thread parked on `d` with every
/// other thread parked too: loom reports the deadlock.)
#[test]
fn listeners_race_the_draining_worker() {
    model("scheduler::listeners_race_the_draining_worker", || {
        let (queue, log) = queue();
        let (a, b, c, d) = (semaphore(), semaphore(), semaphore(), semaphore());
        submit(&queue, &log, &[(&a, 1)], &[(&b, 1)], Work::Run(0)).unwrap();
        let signaller = a.clone();
        let t = thread::spawn(move || signaller.signal(1).unwrap());
        submit(&queue, &log, &[(&c, 1)], &[(&d, 1)], Work::Run(1)).unwrap();
        c.signal(1).unwrap();
        d.wait(1, Timeout::Infinite).unwrap();
        // X retired no later than Y (in an earlier batch, or first in the same one).
        assert_eq!(b.query().unwrap(), 1);
        t.join().unwrap();
        drop(queue);
        check_succeeded(&log, 2);
        assert_eq!((a.listener_count(), c.listener_count()), (0, 0));
    });
}

/// A chain inside one queue, racing a signal: Y waits for what X signals, and X waits on `a`,
/// which another thread signals while Y is being submitted. The thread that issues X (the
/// signaller, the submitter draining the signaller's key, or the worker) records X's device
/// signal, which fires Y's listener on that same thread while it holds the issue lock (the
/// holder's own notification: recorded, then drained before it lets go); or Y, submitted after X
/// was issued, finds the device signal and is issued at once. Either way Y is issued once, after
/// X, and its signal is reached.
#[test]
fn chain_within_one_queue() {
    model("scheduler::chain_within_one_queue", || {
        let (queue, log) = queue();
        let (a, b, c) = (semaphore(), semaphore(), semaphore());
        submit(&queue, &log, &[(&a, 1)], &[(&b, 1)], Work::Run(0)).unwrap();
        let signaller = a.clone();
        let t = thread::spawn(move || signaller.signal(1).unwrap());
        submit(&queue, &log, &[(&b, 1)], &[(&c, 1)], Work::Run(1)).unwrap();
        c.wait(1, Timeout::Infinite).unwrap();
        assert_eq!(b.query().unwrap(), 1);
        t.join().unwrap();
        drop(queue);
        check_succeeded(&log, 2);
        assert_eq!((a.listener_count(), b.listener_count()), (0, 0));
    });
}

/// A failure reaches every dependent: `a` fails (on another thread) while X, waiting on `a`, and Y,
/// waiting on X's signal, are being submitted. Neither is issued; X's and Y's signal semaphores
/// fail with that same failure and both cleanups see it (an action the failure did not reach
/// would fail with `Error::ShutDown` when the queue is dropped); the queue is not lost (the
/// failure came from upstream).
#[test]
fn failure_reaches_every_dependent() {
    model("scheduler::failure_reaches_every_dependent", || {
        let (queue, log) = queue();
        let (a, b, c) = (semaphore(), semaphore(), semaphore());
        let failure = Failure::msg("upstream");
        submit(&queue, &log, &[(&a, 1)], &[(&b, 1)], Work::Run(0)).unwrap();
        let (failing, sent) = (a.clone(), failure.clone());
        let t = thread::spawn(move || failing.fail(sent));
        submit(&queue, &log, &[(&b, 1)], &[(&c, 1)], Work::Run(1)).unwrap();
        t.join().unwrap();
        assert!(queue.lost().is_none());
        drop(queue);
        let cleaned = check_retired(&log, 2);
        assert!(locked(&log.issued).is_empty());
        for (id, seen) in &cleaned {
            assert!(
                seen.as_ref().is_some_and(|seen| seen.ptr_eq(&failure)),
                "action {id}: {seen:?}"
            );
        }
        for signal in [&b, &c] {
            assert!(failed_with(signal.query().map(drop), &failure));
        }
    });
}

/// A device fault found on the completion side loses the queue and reaches its dependent: X
/// faults on the device; Y waits on the device for X's signal (or is refused with `Error::Lost`
/// if the completion side found the fault first). Every accepted action fails exactly once (its
/// signal semaphore fails, its cleanup sees a failure), and a submit after the loss is refused.
#[test]
fn device_fault_loses_the_queue_and_fails_its_dependent() {
    model(
        "scheduler::device_fault_loses_the_queue_and_fails_its_dependent",
        || {
            let (queue, log) = queue();
            let (b, c) = (semaphore(), semaphore());
            submit(&queue, &log, &[], &[(&b, 1)], Work::Fault(0)).unwrap();
            let accepted = match submit(&queue, &log, &[(&b, 1)], &[(&c, 1)], Work::Run(1)) {
                Ok(()) => 2,
                Err(Error::Lost { .. }) => 1,
                Err(other) => panic!("submit: {other}"),
            };
            let failed =
                |r: Result<(), SemaphoreError>| matches!(r, Err(SemaphoreError::Failed(_)));
            for signal in [&b, &c].into_iter().take(accepted) {
                assert!(failed(signal.wait(1, Timeout::Infinite)));
            }
            assert!(matches!(
                submit(&queue, &log, &[], &[], Work::Run(2)),
                Err(Error::Lost { .. })
            ));
            drop(queue);
            let cleaned = check_retired(&log, accepted);
            assert!(cleaned.iter().all(|(_, failure)| failure.is_some()));
        },
    );
}

/// Shutdown leaves nothing pending: the queue is dropped while another thread signals what its
/// pending action waits for. Each action is either issued (once) and completed, or failed with
/// `Error::ShutDown`; its signal is reached or failed accordingly; every action is cleaned up and
/// released once, no listener stays registered and no device event is left alive.
#[test]
fn shutdown_leaves_nothing_pending() {
    model("scheduler::shutdown_leaves_nothing_pending", || {
        let (queue, log) = queue();
        let (a, b, c) = (semaphore(), semaphore(), semaphore());
        submit(&queue, &log, &[(&a, 1)], &[(&b, 1)], Work::Run(0)).unwrap();
        submit(&queue, &log, &[], &[(&c, 1)], Work::Run(1)).unwrap();
        let signaller = a.clone();
        let t = thread::spawn(move || signaller.signal(1).unwrap());
        drop(queue);
        t.join().unwrap();
        let cleaned = check_retired(&log, 2);
        let issued = locked(&log.issued).clone();
        for ((id, failure), signal) in cleaned.iter().zip([&b, &c]) {
            if issued.contains(id) {
                assert!(failure.is_none(), "issued action {id} failed");
                assert_eq!(signal.query().unwrap(), 1);
            } else {
                let failure = failure.as_ref().expect("unissued action failed");
                assert!(matches!(
                    failure.downcast_ref::<Error>(),
                    Some(Error::ShutDown { .. })
                ));
                assert!(failed_with(signal.query().map(drop), failure));
            }
            assert_eq!(signal.timepoint_count(), 0);
        }
        assert_eq!(a.listener_count(), 0);
    });
}

/// The burst hands work across queues: X on queue P waits on `a` and signals `b`; Y on queue Q
/// waits on `b` and signals `c`. The main thread signals `a`: it issues X under P's issue lock,
/// whose record of `b` puts Y's listener into the signal's burst instead of calling it; once P's
/// lock is let go the burst runs it, which try-locks Q and issues Y there, on the same thread,
/// or (Q's lock taken) hands Y's key to Q's worker. Racing it, P's completion thread retires X
/// and advances `b`, which fires Y's listener from that thread (if it is still registered): Q's
/// lock then goes to one of them, and the other finds Y issued or hands over. Y is issued once,
/// after X, and `c` is reached; the completion wake the burst held back is made (else the main
/// thread, parked on `c`, waits for a completion thread nobody woke: loom reports the deadlock).
/// Two queues are four threads: with the main thread, loom's limit.
#[test]
fn a_burst_hands_work_across_queues() {
    model("scheduler::a_burst_hands_work_across_queues", || {
        let ((p, p_log), (q, q_log)) = (queue(), queue());
        let (a, b, c) = (semaphore(), semaphore(), semaphore());
        submit(&p, &p_log, &[(&a, 1)], &[(&b, 1)], Work::Run(0)).unwrap();
        submit(&q, &q_log, &[(&b, 1)], &[(&c, 1)], Work::Run(0)).unwrap();
        a.signal(1).unwrap();
        c.wait(1, Timeout::Infinite).unwrap();
        drop(q);
        drop(p);
        for log in [&p_log, &q_log] {
            check_succeeded(log, 1);
        }
        assert_eq!((a.listener_count(), b.listener_count()), (0, 0));
    });
}
