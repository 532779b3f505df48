//! Test doubles shared by the integration tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use cuhal_scheduler::host::{HostPayload, HostQueue, HostSemaphore};
use cuhal_scheduler::{
    Backend, Cleanup, Cleanups, Error, Failure, Resource, Resources, ThreadRole,
};
use cuhal_semaphore::DeviceEvent;
use cuhal_semaphore::testing::{FlagEvent, LiveCounter};
use smallvec::smallvec;

/// One `issue` call as the scripted backend saw it.
#[derive(Clone)]
pub struct Issued {
    pub id: u64,
    pub thread: ThreadId,
    pub device_waits: Vec<FlagEvent>,
    pub event: FlagEvent,
}

/// The payload of the scripted backend.
#[derive(Default)]
pub struct Script {
    pub id: u64,
    /// `issue` returns this error.
    pub fail_issue: Option<Failure>,
    /// The completion event reports this error (when auto-completing).
    pub fail_completion: Option<Failure>,
}

impl Script {
    pub fn id(id: u64) -> Self {
        Script {
            id,
            ..Script::default()
        }
    }
}

/// What a test layers over a [`Scripted`] backend; each hook's default leaves the scripted
/// behaviour as it is.
pub trait Hooks: Send + Sync + 'static {
    /// The backend's `Backend::STICKY_ERRORS`.
    const STICKY_ERRORS: bool = false;

    /// The backend's `Backend::bind_thread`.
    fn bind(&self, _role: ThreadRole) -> Result<(), Failure> {
        Ok(())
    }

    /// Called at the start of every issue, before the scripted issue.
    fn issue(&self, _payload: &Script) {}

    /// Called at the start of every completion query, before the scripted query.
    fn query(&self, _event: &FlagEvent) {}

    /// Called at the start of every completion block, before the scripted block.
    fn block(&self, _event: &FlagEvent) {}

    /// Whether the backend orders later work after its own events, as a stream does.
    fn orders_own_events(&self) -> bool {
        false
    }

    /// Called by the backend's `Backend::completed`.
    fn completed(&self, _payload: &Script) {}

    /// The backend's `Backend::traffic`.
    fn traffic(&self) -> u64 {
        0
    }

    /// Called by the backend's `Backend::issued`.
    fn issued(&self, _resources: &[Resource]) {}

    /// The backend's `Backend::checks_completion`.
    fn checks_completion(&self, _payload: &Script) -> bool {
        false
    }
}

/// No hooks: the scripted behaviour alone.
impl Hooks for () {}

/// A hook called at the start of every issue (a test that holds an issue open, say).
pub type OnIssue = Box<dyn Fn(&Script) + Send + Sync>;

impl Hooks for OnIssue {
    fn issue(&self, payload: &Script) {
        self(payload);
    }
}

/// A backend whose events are `FlagEvent`s the test completes (or that complete at issue), and
/// which records every issue; `hooks` adds a test's own behaviour.
pub struct Scripted<H = ()> {
    pub issued: Mutex<Vec<Issued>>,
    pub live: LiveCounter,
    pub auto_complete: bool,
    pub released: AtomicUsize,
    pub hooks: H,
}

impl Scripted {
    pub fn new(auto_complete: bool) -> Self {
        Scripted::with_hooks(auto_complete, ())
    }

    /// As [`Scripted::new`], calling `on_issue` at the start of every issue.
    pub fn with_on_issue(
        auto_complete: bool,
        on_issue: impl Fn(&Script) + Send + Sync + 'static,
    ) -> Scripted<OnIssue> {
        Scripted::with_hooks(auto_complete, Box::new(on_issue))
    }
}

impl<H: Hooks> Scripted<H> {
    /// As [`Scripted::new`], with `hooks`.
    pub fn with_hooks(auto_complete: bool, hooks: H) -> Self {
        Scripted {
            issued: Mutex::new(Vec::new()),
            live: LiveCounter::new(),
            auto_complete,
            released: AtomicUsize::new(0),
            hooks,
        }
    }

    pub fn issued_ids(&self) -> Vec<u64> {
        self.issued.lock().unwrap().iter().map(|i| i.id).collect()
    }

    pub fn find(&self, id: u64) -> Option<Issued> {
        self.issued
            .lock()
            .unwrap()
            .iter()
            .find(|i| i.id == id)
            .cloned()
    }

    /// Completes the event of the issued action `id`.
    pub fn complete(&self, id: u64) {
        self.find(id).unwrap().event.complete();
    }

    /// Completes every event issued so far.
    pub fn complete_all(&self) {
        for issued in self.issued.lock().unwrap().iter() {
            issued.event.complete();
        }
    }
}

impl<H: Hooks> Backend for Scripted<H> {
    type Event = FlagEvent;
    type Payload = Script;
    type IssueLocal = ();
    const STICKY_ERRORS: bool = H::STICKY_ERRORS;

    fn bind_thread(&self, role: ThreadRole) -> Result<(), Failure> {
        self.hooks.bind(role)
    }

    fn issue(
        &self,
        _local: &mut (),
        device_waits: &[FlagEvent],
        payload: &mut Script,
    ) -> Result<FlagEvent, Failure> {
        self.hooks.issue(payload);
        if let Some(failure) = payload.fail_issue.clone() {
            return Err(failure);
        }
        let event = FlagEvent::counted(&self.live);
        if self.auto_complete {
            match payload.fail_completion.clone() {
                Some(failure) => event.fail(failure),
                None => event.complete(),
            }
        }
        self.issued.lock().unwrap().push(Issued {
            id: payload.id,
            thread: thread::current().id(),
            device_waits: device_waits.to_vec(),
            event: event.clone(),
        });
        Ok(event)
    }

    fn issue_local(&self) {}

    fn query_event(&self, event: &FlagEvent) -> Result<bool, Failure> {
        self.hooks.query(event);
        event.query()
    }

    fn block_on_event(&self, event: &FlagEvent) -> Result<(), Failure> {
        self.hooks.block(event);
        // Bounded, so a test that fails before completing its events fails instead of hanging.
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if event.query()? {
                return Ok(());
            }
            thread::sleep(Duration::from_micros(200));
        }
        Err(Failure::msg("scripted event never completed"))
    }

    fn orders(&self, event: &FlagEvent) -> bool {
        self.hooks.orders_own_events()
            && self
                .issued
                .lock()
                .unwrap()
                .iter()
                .any(|issued| issued.event.ptr_eq(event))
    }

    fn checks_completion(&self, payload: &Script) -> bool {
        self.hooks.checks_completion(payload)
    }

    fn completed(&self, payload: &Script) {
        self.hooks.completed(payload);
    }

    fn traffic(&self) -> u64 {
        self.hooks.traffic()
    }

    fn issued(&self, resources: &[Resource]) {
        self.hooks.issued(resources);
    }

    fn release(&self, payload: Script) {
        self.released.fetch_add(1, Ordering::SeqCst);
        drop(payload);
    }
}

/// A resource that counts its drops.
pub struct Tracked(pub Arc<AtomicUsize>);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// No resources and no cleanups.
pub fn none() -> (Resources, Cleanups) {
    (Resources::new(), Cleanups::new())
}

/// Each action's outcome, in the order they were recorded: `Ok` or the failure.
pub type Outcomes = Arc<Mutex<Vec<(u64, Result<(), Failure>)>>>;

/// A cleanup that records the outcome of action `id` in `outcomes`.
pub fn record(outcomes: &Outcomes, id: u64) -> Cleanups {
    let outcomes = outcomes.clone();
    smallvec![Cleanup::once(move |outcome| {
        outcomes
            .lock()
            .unwrap()
            .push((id, outcome.map_err(Clone::clone)));
    })]
}

/// Submits a host no-op to `queue` that holds no resources.
pub fn submit_nop(
    queue: &HostQueue,
    waits: &[(&HostSemaphore, u64)],
    signals: &[(&HostSemaphore, u64)],
    cleanups: Cleanups,
) -> Result<(), Error> {
    queue.submit(waits, signals, HostPayload::Nop, Resources::new(), cleanups)
}

pub fn tracked(drops: &Arc<AtomicUsize>) -> Resource {
    Arc::new(Tracked(drops.clone()))
}

/// Polls `done` for up to five seconds.
pub fn eventually(what: &str, done: impl FnMut() -> bool) {
    assert!(
        within(Duration::from_secs(5), done),
        "timed out waiting for: {what}"
    );
}

/// Polls `done` for up to `limit`; whether it came true (for a test that must tidy up before it
/// asserts).
pub fn within(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(1));
    }
    true
}
