//! The completion policy's nap on a scripted backend: a completion nobody needs is napped on,
//! then blocked on; a hurry during the nap turns it into polling; what the nap waits for is
//! retired when it completes.

mod support;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use cuhal_scheduler::policy::NAP;
use cuhal_scheduler::{
    Backend, Cleanups, CompletionNudge, CompletionOptions, Failure, Queue, QueueOptions, Resources,
};
use cuhal_semaphore::Semaphore;
use cuhal_semaphore::testing::FlagEvent;

use support::{Script, Scripted, eventually};

/// The scripted backend, counting the policy's queries; with a nudge set, its second query
/// (the nap's first) hurries the queue, as a waiter arriving during the nap would.
struct Counted {
    inner: Scripted,
    queries: AtomicUsize,
    nudge: OnceLock<CompletionNudge>,
}

impl Backend for Counted {
    type Event = FlagEvent;
    type Payload = Script;
    type IssueLocal = ();

    fn issue(
        &self,
        _local: &mut (),
        device_waits: &[FlagEvent],
        payload: &mut Script,
    ) -> Result<FlagEvent, Failure> {
        self.inner.issue(&mut (), device_waits, payload)
    }

    fn issue_local(&self) {}

    fn query_event(&self, event: &FlagEvent) -> Result<bool, Failure> {
        if self.queries.fetch_add(1, Ordering::SeqCst) == 1
            && let Some(nudge) = self.nudge.get()
        {
            nudge.nudge();
        }
        self.inner.query_event(event)
    }

    fn block_on_event(&self, event: &FlagEvent) -> Result<(), Failure> {
        self.inner.block_on_event(event)
    }
}

/// A queue whose hurried polls last (a 10 s spin), with one action nobody waits for, still
/// running: returned as soon as its completion thread began to nap on it (it queried twice).
fn napping_queue(label: &str, hurried: bool) -> (Queue<Counted>, Semaphore<FlagEvent>) {
    let backend = Counted {
        inner: Scripted::new(false),
        queries: AtomicUsize::new(0),
        nudge: OnceLock::new(),
    };
    let options = QueueOptions::new(label)
        .with_completion(CompletionOptions::new().with_spin(Duration::from_secs(10)));
    let queue = Queue::new(backend, options).unwrap();
    if hurried {
        let _ = queue.backend().nudge.set(queue.completion_nudge());
    }
    let signal = Semaphore::<FlagEvent>::new(0);
    queue
        .submit(
            &[],
            &[(&signal, 1)],
            Script::id(0),
            Resources::new(),
            Cleanups::new(),
        )
        .unwrap();
    // Watched without sleeping: the nap (its first query is the second) has just begun.
    let deadline = Instant::now() + Duration::from_secs(10);
    while queue.backend().queries.load(Ordering::SeqCst) < 2 {
        assert!(
            Instant::now() < deadline,
            "the completion thread never napped"
        );
        thread::yield_now();
    }
    (queue, signal)
}

/// Queries the completion thread makes within `window`, after `settle` has passed.
fn queries_within(queue: &Queue<Counted>, settle: Duration, window: Duration) -> usize {
    thread::sleep(settle);
    let before = queue.backend().queries.load(Ordering::SeqCst);
    thread::sleep(window);
    queue.backend().queries.load(Ordering::SeqCst) - before
}

/// Long past the nap window (`NAP`): an unhurried nap has ended in a block, so the completion
/// thread queries no more.
#[test]
fn an_unhurried_nap_ends_in_a_block() {
    let (queue, signal) = napping_queue("nap", false);
    let queries = queries_within(&queue, 400 * NAP, 200 * NAP);
    assert!(queries <= 1, "{queries} queries long after the nap's end");
    queue.backend().inner.find(0).unwrap().event.complete();
    eventually("the napped action retired", || queue.stats().completed == 1);
    assert_eq!(signal.query().unwrap(), 1);
}

/// A hurry during the nap (the handshake with a sleep in progress is the loom model's,
/// `loom_policy.rs`) turns the wait into polling, which lasts the
/// queue's spin (10 s here) instead of ending in a block with the nap; the work is retired
/// once it completes.
#[test]
fn a_hurry_during_a_nap_turns_it_into_polling() {
    let (queue, signal) = napping_queue("hurried-nap", true);
    let queries = queries_within(&queue, 400 * NAP, 200 * NAP);
    assert!(
        queries > 10,
        "{queries} queries long after the nap's end: the hurried wait did not poll"
    );
    queue.backend().inner.find(0).unwrap().event.complete();
    eventually("the hurried action retired", || {
        queue.stats().completed == 1
    });
    assert_eq!(signal.query().unwrap(), 1);
}
