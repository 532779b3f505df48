//! Property test: random DAGs of up to 200 actions over several host queues and semaphores,
//! random completion order (payloads sleep random times) and injected failures (failed source
//! semaphores, failing payloads), checked against a model:
//!
//! - no action is issued before each wait is reached or device-waitable (checked by a wrapping
//!   backend at issue), nor runs before each wait is complete (checked by the payload);
//! - actions on one queue are issued in submission order;
//! - each action completes or fails exactly once, and fails exactly when the model says (a failed
//!   dependency, or its queue lost by an earlier payload error), with a failure that comes from one
//!   of its causes;
//! - every resource is released; every semaphore ends at the model's value or failure.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use cuhal_scheduler::host::{HostBackend, HostEvent, HostPayload, HostSemaphore};
use cuhal_scheduler::{
    Backend, Cleanup, Cleanups, CompletionOptions, Error, Failure, Queue, QueueOptions, Resource,
    Resources,
};
use cuhal_semaphore::{DeviceEvent, WaitPoint};
use proptest::prelude::*;
use smallvec::{SmallVec, smallvec};

type Violations = Arc<Mutex<Vec<String>>>;
/// Every outcome each action reported (exactly one is expected).
type Outcomes = Arc<Mutex<Vec<Vec<Result<(), Failure>>>>>;

/// The host backend, checking at issue that the scheduler only issues ready actions.
struct Checked(HostBackend);

struct CheckedPayload {
    id: usize,
    waits: SmallVec<[(HostSemaphore, u64); 4]>,
    issued: Arc<Mutex<Vec<usize>>>,
    violations: Violations,
    inner: HostPayload,
}

impl Backend for Checked {
    type Event = HostEvent;
    type Payload = CheckedPayload;
    type IssueLocal = ();

    fn issue(
        &self,
        _local: &mut (),
        device_waits: &[HostEvent],
        payload: &mut CheckedPayload,
    ) -> Result<HostEvent, Failure> {
        for (semaphore, value) in &payload.waits {
            let ok = match semaphore.wait_point(*value) {
                Ok(WaitPoint::Reached) => true,
                // Device-waitable: the event (or an earlier-completing one for a higher value
                // signalled by the same action) must be among the device waits.
                Ok(WaitPoint::Device { event, .. }) => {
                    device_waits.iter().any(|e| e.ptr_eq(&event)) || event.query().unwrap_or(false)
                }
                Ok(WaitPoint::Pending) => false,
                // Failed since the scheduler looked (a device wait whose producer failed): the
                // action fails through its device wait.
                Err(_) => true,
            };
            if !ok {
                payload.violations.lock().unwrap().push(format!(
                    "action {} issued before its wait for {value} was reached or device-waitable",
                    payload.id
                ));
            }
        }
        payload.issued.lock().unwrap().push(payload.id);
        self.0.issue(&mut (), device_waits, &mut payload.inner)
    }

    fn issue_local(&self) {}

    fn query_event(&self, event: &HostEvent) -> Result<bool, Failure> {
        self.0.query_event(event)
    }

    fn block_on_event(&self, event: &HostEvent) -> Result<(), Failure> {
        self.0.block_on_event(event)
    }
}

#[derive(Debug, Clone)]
struct ActionSpec {
    queue: usize,
    /// (pick, value fraction): resolved against the semaphores that exist when it is submitted.
    waits: Vec<(usize, u8)>,
    value: u64,
    delay_us: u64,
    inject: bool,
}

#[derive(Debug, Clone)]
struct SourceSpec {
    /// Signalled or failed after this many submissions.
    at: usize,
    fail: bool,
    value: u64,
}

#[derive(Debug, Clone)]
struct Case {
    queues: usize,
    sources: Vec<SourceSpec>,
    actions: Vec<ActionSpec>,
}

fn case() -> impl Strategy<Value = Case> {
    let action = (
        0usize..4,
        prop::collection::vec((any::<usize>(), any::<u8>()), 0..=3),
        1u64..=3,
        0u64..=150,
        prop::bool::weighted(0.03),
    )
        .prop_map(|(queue, waits, value, delay_us, inject)| ActionSpec {
            queue,
            waits,
            value,
            delay_us,
            inject,
        });
    let source = (any::<usize>(), prop::bool::weighted(0.25), 1u64..=3)
        .prop_map(|(at, fail, value)| SourceSpec { at, fail, value });
    (
        1usize..=4,
        prop::collection::vec(source, 1..=4),
        prop::collection::vec(action, 1..=200),
    )
        .prop_map(|(queues, sources, actions)| Case {
            queues,
            sources,
            actions,
        })
}

/// Which semaphore and value each wait of each action names, resolved: only sources and earlier
/// actions' signal semaphores, so the graph is acyclic.
fn resolve(case: &Case) -> Vec<Vec<(usize, u64)>> {
    let sources = case.sources.len();
    case.actions
        .iter()
        .enumerate()
        .map(|(j, action)| {
            action
                .waits
                .iter()
                .map(|&(pick, fraction)| {
                    let semaphore = pick % (sources + j);
                    let top = if semaphore < sources {
                        case.sources[semaphore].value
                    } else {
                        case.actions[semaphore - sources].value
                    };
                    (semaphore, 1 + u64::from(fraction) % top)
                })
                .collect()
        })
        .collect()
}

/// The model's verdict per semaphore: `Ok(value)` or the set of failures it may fail with.
type Verdict = Result<u64, BTreeSet<usize>>;

/// Failure ids: sources are `0..S`, injected payload failures `S + j`.
fn model(case: &Case, waits: &[Vec<(usize, u64)>]) -> Vec<Verdict> {
    let sources = case.sources.len();
    let mut verdicts: Vec<Verdict> = case
        .sources
        .iter()
        .enumerate()
        .map(|(s, spec)| {
            if spec.fail {
                Err(BTreeSet::from([s]))
            } else {
                Ok(spec.value)
            }
        })
        .collect();
    let mut lost: Vec<Option<usize>> = vec![None; case.queues];
    for (j, action) in case.actions.iter().enumerate() {
        let queue = action.queue % case.queues;
        let mut causes = BTreeSet::new();
        for &(semaphore, _) in &waits[j] {
            if let Err(failures) = &verdicts[semaphore] {
                causes.extend(failures.iter().copied());
            }
        }
        if let Some(loss) = lost[queue] {
            causes.insert(loss);
        }
        let verdict = if !causes.is_empty() {
            Err(causes)
        } else if action.inject {
            lost[queue] = Some(sources + j);
            Err(BTreeSet::from([sources + j]))
        } else {
            Ok(action.value)
        };
        verdicts.push(verdict);
    }
    verdicts
}

fn check_waits(waits: &[(HostSemaphore, u64)]) -> bool {
    waits
        .iter()
        .all(|(semaphore, value)| match semaphore.wait_point(*value) {
            Ok(WaitPoint::Reached) => true,
            Ok(WaitPoint::Device { event, .. }) => matches!(event.query(), Ok(true)),
            _ => false,
        })
}

fn run(case: Case) -> Result<(), TestCaseError> {
    let waits = resolve(&case);
    let expected = model(&case, &waits);
    let sources = case.sources.len();
    let semaphores: Vec<HostSemaphore> = (0..sources + case.actions.len())
        .map(|_| HostSemaphore::new(0))
        .collect();
    let failures: Vec<Failure> = (0..sources + case.actions.len())
        .map(|id| Failure::msg(format!("injected failure {id}")))
        .collect();
    let violations = Violations::default();
    let issued: Vec<Arc<Mutex<Vec<usize>>>> = (0..case.queues).map(|_| Arc::default()).collect();
    let ran: Vec<Arc<Mutex<Vec<usize>>>> = (0..case.queues).map(|_| Arc::default()).collect();
    let outcomes: Outcomes = Arc::new(Mutex::new(vec![Vec::new(); case.actions.len()]));
    let resources: Vec<Resource> = (0..case.actions.len())
        .map(|j| Arc::new(j) as Resource)
        .collect();
    let queues: Vec<Queue<Checked>> = (0..case.queues)
        .map(|q| {
            let options = QueueOptions::new(format!("model-{q}"))
                .with_completion(CompletionOptions::new().with_spin(Duration::from_micros(5)));
            Queue::new(
                Checked(HostBackend::new(options.label(), Duration::from_micros(5)).unwrap()),
                options,
            )
            .unwrap()
        })
        .collect();

    let resolve_sources = |submitted: usize, last: bool| {
        for (s, spec) in case.sources.iter().enumerate() {
            let at = spec.at % (case.actions.len() + 1);
            if at == submitted || (last && at > submitted) {
                if spec.fail {
                    semaphores[s].fail(failures[s].clone());
                } else {
                    semaphores[s].signal(spec.value).unwrap();
                }
            }
        }
    };

    for (j, action) in case.actions.iter().enumerate() {
        resolve_sources(j, false);
        let queue = action.queue % case.queues;
        let wait_list: SmallVec<[(HostSemaphore, u64); 4]> = waits[j]
            .iter()
            .map(|&(s, v)| (semaphores[s].clone(), v))
            .collect();
        let wait_refs: SmallVec<[(&HostSemaphore, u64); 4]> =
            waits[j].iter().map(|&(s, v)| (&semaphores[s], v)).collect();
        let signal = &semaphores[sources + j];
        let (delay, inject) = (
            action.delay_us,
            action.inject.then(|| failures[sources + j].clone()),
        );
        let (run_log, violated, checked_waits) =
            (ran[queue].clone(), violations.clone(), wait_list.clone());
        let inner = HostPayload::once(move || {
            if !check_waits(&checked_waits) {
                violated
                    .lock()
                    .unwrap()
                    .push(format!("action {j} ran before its waits completed"));
            }
            run_log.lock().unwrap().push(j);
            if delay > 0 {
                thread::sleep(Duration::from_micros(delay));
            }
            inject.map_or(Ok(()), Err)
        });
        let payload = CheckedPayload {
            id: j,
            waits: wait_list,
            issued: issued[queue].clone(),
            violations: violations.clone(),
            inner,
        };
        let record = outcomes.clone();
        let cleanups: Cleanups = smallvec![Cleanup::once(move |outcome| {
            record.lock().unwrap()[j].push(outcome.map_err(Clone::clone));
        })];
        let kept: Resources = smallvec![resources[j].clone()];
        match queues[queue].submit(
            &wait_refs,
            &[(signal, action.value)],
            payload,
            kept,
            cleanups,
        ) {
            Ok(()) => {}
            Err(Error::Lost { failure, .. }) => {
                // Refused: the caller owns the action's failure (as a device layer would).
                signal.fail(failure.clone());
                outcomes.lock().unwrap()[j].push(Err(failure));
            }
            Err(other) => return Err(TestCaseError::fail(format!("submit: {other}"))),
        }
    }
    resolve_sources(case.actions.len(), true);

    // Everything must resolve: the graph is acyclic and every source is signalled or failed.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let done = outcomes.lock().unwrap().iter().all(|o| !o.is_empty());
        if done {
            break;
        }
        prop_assert!(Instant::now() < deadline, "actions never resolved: a hang");
        thread::sleep(Duration::from_millis(1));
    }
    drop(queues);

    let violations = violations.lock().unwrap();
    prop_assert!(violations.is_empty(), "{:?}", *violations);
    for (q, log) in issued.iter().chain(ran.iter()).enumerate() {
        let log = log.lock().unwrap();
        prop_assert!(
            log.windows(2).all(|w| w[0] < w[1]),
            "log {q} out of submission order: {:?}",
            *log
        );
    }
    let outcomes = outcomes.lock().unwrap();
    for (j, outcome) in outcomes.iter().enumerate() {
        prop_assert_eq!(
            outcome.len(),
            1,
            "action {} resolved {} times",
            j,
            outcome.len()
        );
        let id_of = |failure: &Failure| failures.iter().position(|f| f.ptr_eq(failure));
        match (&expected[sources + j], &outcome[0]) {
            (Ok(_), Ok(())) => {}
            (Err(causes), Err(failure)) => {
                let id = id_of(failure);
                prop_assert!(
                    id.is_some_and(|id| causes.contains(&id)),
                    "action {} failed with {} ({:?}), expected one of {:?}",
                    j,
                    failure,
                    id,
                    causes
                );
            }
            (expected, got) => {
                return Err(TestCaseError::fail(format!(
                    "action {j}: expected {expected:?}, got {got:?}"
                )));
            }
        }
    }
    for (s, semaphore) in semaphores.iter().enumerate() {
        match (&expected[s], semaphore.query()) {
            (Ok(value), Ok(got)) => prop_assert_eq!(*value, got, "semaphore {}", s),
            (Err(causes), Err(error)) => {
                let failure = error.failure().unwrap();
                let id = failures.iter().position(|f| f.ptr_eq(failure));
                prop_assert!(
                    id.is_some_and(|id| causes.contains(&id)),
                    "semaphore {s}: {failure}"
                );
            }
            (expected, got) => {
                return Err(TestCaseError::fail(format!(
                    "semaphore {s}: expected {expected:?}, got {got:?}"
                )));
            }
        }
        prop_assert_eq!(
            semaphore.listener_count(),
            0,
            "semaphore {} kept a listener",
            s
        );
    }
    for (j, resource) in resources.iter().enumerate() {
        prop_assert_eq!(
            Arc::strong_count(resource),
            1,
            "resource of action {} leaked",
            j
        );
    }
    Ok(())
}

static CASES_RUN: AtomicUsize = AtomicUsize::new(0);

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(debug_assertions) { 128 } else { 512 },
        max_shrink_iters: 200,
        .. ProptestConfig::default()
    })]

    #[test]
    fn random_dags_match_the_model(case in case()) {
        CASES_RUN.fetch_add(1, Ordering::Relaxed);
        run(case)?;
    }
}
