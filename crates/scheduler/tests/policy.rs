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
    Cleanups, CompletionNudge, CompletionOptions, Queue, QueueOptions, Resources,
};
use cuhal_semaphore::Semaphore;
use cuhal_semaphore::testing::FlagEvent;

use support::{Hooks, Script, Scripted, eventually};

/// Counts the policy's queries; with a nudge set, the second query (the nap's first) hurries
/// the queue, as a waiter arriving during the nap would.
#[derive(Default)]
struct Queries {
    count: AtomicUsize,
    nudge: OnceLock<CompletionNudge>,
}

impl Hooks for Queries {
    fn query(&self, _event: &FlagEvent) {
        if self.count.fetch_add(1, Ordering::SeqCst) == 1
            && let Some(nudge) = self.nudge.get()
        {
            nudge.nudge();
        }
    }
}

/// The scripted backend, counting its queries.
type Counted = Scripted<Queries>;

/// A queue whose hurried polls last (a 10 s spin), with one action nobody waits for, still
/// running: returned as soon as its completion thread began to nap on it (it queried twice).
fn napping_queue(label: &str, hurried: bool) -> (Queue<Counted>, Semaphore<FlagEvent>) {
    let backend = Scripted::with_hooks(false, Queries::default());
    let options = QueueOptions::new(label)
        .with_completion(CompletionOptions::new().with_spin(Duration::from_secs(10)));
    let queue = Queue::new(backend, options).unwrap();
    if hurried {
        let _ = queue.backend().hooks.nudge.set(queue.completion_nudge());
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
    while queue.backend().hooks.count.load(Ordering::SeqCst) < 2 {
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
    let before = queue.backend().hooks.count.load(Ordering::SeqCst);
    thread::sleep(window);
    queue.backend().hooks.count.load(Ordering::SeqCst) - before
}

/// Long past the nap window (`NAP`): an unhurried nap has ended in a block, so the completion
/// thread queries no more.
#[test]
fn an_unhurried_nap_ends_in_a_block() {
    let (queue, signal) = napping_queue("nap", false);
    let queries = queries_within(&queue, 400 * NAP, 200 * NAP);
    assert!(queries <= 1, "{queries} queries long after the nap's end");
    queue.backend().complete(0);
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
    queue.backend().complete(0);
    eventually("the hurried action retired", || {
        queue.stats().completed == 1
    });
    assert_eq!(signal.query().unwrap(), 1);
}
