//! Test doubles shared by the integration tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use cuhal_scheduler::{Backend, Failure, Resource};
use cuhal_semaphore::DeviceEvent;
use cuhal_semaphore::testing::{FlagEvent, LiveCounter};

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

/// What a [`Scripted`] backend calls at the start of every issue.
pub type OnIssue = Box<dyn Fn(&Script) + Send + Sync>;

/// A backend whose events are `FlagEvent`s the test completes (or that complete at issue), and
/// which records every issue.
pub struct Scripted {
    pub issued: Mutex<Vec<Issued>>,
    pub live: LiveCounter,
    pub auto_complete: bool,
    pub released: AtomicUsize,
    /// Called at the start of every issue (a test that holds an issue open, say).
    pub on_issue: Option<OnIssue>,
}

impl Scripted {
    pub fn new(auto_complete: bool) -> Self {
        Scripted {
            issued: Mutex::new(Vec::new()),
            live: LiveCounter::new(),
            auto_complete,
            released: AtomicUsize::new(0),
            on_issue: None,
        }
    }

    /// As [`Scripted::new`], calling `on_issue` at the start of every issue.
    pub fn with_on_issue(
        auto_complete: bool,
        on_issue: impl Fn(&Script) + Send + Sync + 'static,
    ) -> Self {
        Scripted {
            on_issue: Some(Box::new(on_issue)),
            ..Scripted::new(auto_complete)
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
}

impl Backend for Scripted {
    type Event = FlagEvent;
    type Payload = Script;
    type IssueLocal = ();

    fn issue(
        &self,
        _local: &mut (),
        device_waits: &[FlagEvent],
        payload: &mut Script,
    ) -> Result<FlagEvent, Failure> {
        if let Some(on_issue) = &self.on_issue {
            on_issue(payload);
        }
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
        event.query()
    }

    fn block_on_event(&self, event: &FlagEvent) -> Result<(), Failure> {
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
