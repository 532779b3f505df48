//! Completion gathering: after a batch nobody waited for, the completion thread sleeps for the
//! queue's `completion_gather` so that the next batch holds many actions; a submitter that needs
//! room, work only the completion thread can finish, work a host thread parked on, a nudge (a
//! host thread about to park) and shutdown all end the sleep early.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use cuhal_scheduler::{Cleanups, CompletionOptions, Queue, QueueOptions, Resources};
use cuhal_semaphore::Semaphore;
use cuhal_semaphore::testing::FlagEvent;

use support::{Hooks, Script, Scripted, eventually};

/// Scripted work (completed at once, or when the test says); an action whose id is at least
/// `CHECKED` is checked on completion (it records no device signal, so only the completion
/// thread can see it done). Counts the completion waits that found their work still running.
#[derive(Default)]
struct Checks {
    waited_on_running: AtomicUsize,
}

const CHECKED: u64 = 1_000;

impl Hooks for Checks {
    fn block(&self, event: &FlagEvent) {
        if !event.is_complete() {
            self.waited_on_running.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn checks_completion(&self, payload: &Script) -> bool {
        payload.id >= CHECKED
    }
}

type Checked = Scripted<Checks>;

fn checked(auto_complete: bool) -> Checked {
    Scripted::with_hooks(auto_complete, Checks::default())
}

fn queue(options: QueueOptions) -> Queue<Checked> {
    Queue::new(checked(true), options).unwrap()
}

fn submit(queue: &Queue<Checked>, signal: &Semaphore<FlagEvent>, value: u64, id: u64) {
    queue
        .submit(
            &[],
            &[(signal, value)],
            Script::id(id),
            Resources::new(),
            Cleanups::new(),
        )
        .unwrap();
}

/// One action retired (the completion thread is then gathering, if it gathers), then 20 more
/// submitted 2 ms apart; returns how many batches retired those 20.
fn batches_for_spaced_submissions(gather: Duration) -> u64 {
    let queue = queue(
        QueueOptions::new("gather").with_completion(CompletionOptions::new().with_gather(gather)),
    );
    let signal = Semaphore::<FlagEvent>::new(0);
    submit(&queue, &signal, 1, 0);
    eventually("the first action retired", || queue.stats().completed == 1);
    let before = queue.stats().retire_batches;
    for i in 1..=20 {
        thread::sleep(Duration::from_millis(2));
        submit(&queue, &signal, i + 1, i);
    }
    eventually("every action retired", || queue.stats().completed == 21);
    queue.stats().retire_batches - before
}

#[test]
fn a_batch_nobody_waited_for_lets_the_next_one_gather() {
    // 40 ms of submissions inside one 2 s gather: one batch, two if the first gather ended
    // between two submissions.
    let gathered = batches_for_spaced_submissions(Duration::from_secs(2));
    assert!(gathered <= 2, "{gathered} batches with gathering");
    // The control: without gathering, the thread retires each action 2 ms after the last.
    let scattered = batches_for_spaced_submissions(Duration::ZERO);
    assert!(scattered >= 5, "{scattered} batches without gathering");
}

/// Submits one action and waits until it retired: the completion thread then sleeps in a
/// 20 s gather.
fn gathering_queue(options: QueueOptions) -> (Queue<Checked>, Semaphore<FlagEvent>) {
    let completion = options.completion().with_gather(Duration::from_secs(20));
    let queue = queue(options.with_completion(completion));
    let signal = Semaphore::<FlagEvent>::new(0);
    submit(&queue, &signal, 1, 0);
    eventually("the first action retired", || queue.stats().completed == 1);
    // Past the retirement, into the gather.
    thread::sleep(Duration::from_millis(20));
    (queue, signal)
}

const SOON: Duration = Duration::from_secs(5);

#[test]
fn work_only_the_completion_thread_can_finish_ends_a_gather() {
    let (queue, signal) = gathering_queue(QueueOptions::new("checked"));
    let start = Instant::now();
    submit(&queue, &signal, 2, CHECKED);
    // No device signal is recorded for checked work: this wait needs the completion thread.
    signal.wait(2, SOON).unwrap();
    assert!(start.elapsed() < SOON);
    // Counted once released, just after the signal's advance.
    eventually("the checked action retired", || {
        queue.stats().completed == 2
    });
}

#[test]
fn a_submitter_waiting_for_room_ends_a_gather() {
    let (queue, signal) = gathering_queue(QueueOptions::new("room").with_max_in_flight(2));
    let start = Instant::now();
    for i in 1..=6 {
        submit(&queue, &signal, i + 1, i);
    }
    let waited = start.elapsed();
    assert!(waited < SOON, "the submitter waited {waited:?} for room");
    eventually("every action retired", || queue.stats().completed == 7);
}

#[test]
fn shutdown_ends_a_gather() {
    let (queue, signal) = gathering_queue(QueueOptions::new("shutdown"));
    submit(&queue, &signal, 2, 1);
    let start = Instant::now();
    drop(queue);
    let took = start.elapsed();
    assert!(took < SOON, "shutdown took {took:?}");
    assert_eq!(
        signal.query().unwrap(),
        2,
        "the last action retired before shutdown ended"
    );
}

/// With a gather of 20 s under way, `batch - 1` more actions wait without ending it, and the push
/// of the `batch`th ends it.
fn full_batch_ends_a_gather(options: QueueOptions) {
    let batch = options.completion().gather_batch as u64;
    let (queue, signal) = gathering_queue(options);
    for i in 1..batch {
        submit(&queue, &signal, i + 1, i);
    }
    // One short of a full batch: the gather goes on (it has 20 s to run).
    thread::sleep(Duration::from_millis(100));
    assert_eq!(
        queue.stats().completed,
        1,
        "actions retired before a full batch of {batch} waited"
    );
    let start = Instant::now();
    submit(&queue, &signal, batch + 1, batch);
    eventually("the full batch retired", || {
        queue.stats().completed == batch + 1
    });
    let took = start.elapsed();
    assert!(took < SOON, "the full batch of {batch} waited {took:?}");
}

#[test]
fn a_full_batch_ends_a_gather() {
    full_batch_ends_a_gather(QueueOptions::new("full"));
    full_batch_ends_a_gather(
        QueueOptions::new("full-8").with_completion(CompletionOptions::new().with_gather_batch(8)),
    );
    full_batch_ends_a_gather(
        QueueOptions::new("full-200")
            .with_completion(CompletionOptions::new().with_gather_batch(200)),
    );
}

/// Five actions submitted at once, their work completed 20 ms later; returns how many times the
/// completion side waited on work still running.
fn waits_on_running_work(gather: Duration) -> usize {
    let queue = Queue::new(
        checked(false),
        QueueOptions::new("defer").with_completion(CompletionOptions::new().with_gather(gather)),
    )
    .unwrap();
    let signal = Semaphore::<FlagEvent>::new(0);
    for i in 0..5 {
        queue
            .submit(
                &[],
                &[(&signal, i + 1)],
                Script::id(i),
                Resources::new(),
                Cleanups::new(),
            )
            .unwrap();
    }
    thread::sleep(Duration::from_millis(20));
    for i in 0..5 {
        queue.backend().complete(i);
    }
    eventually("every action retired", || queue.stats().completed == 5);
    queue
        .backend()
        .hooks
        .waited_on_running
        .load(Ordering::SeqCst)
}

#[test]
fn a_gathering_queue_defers_running_work_instead_of_waiting_for_it() {
    // The first batch is taken at the first push, its work still running: deferred, and retired
    // after the 1 s gather without a wait.
    assert_eq!(waits_on_running_work(Duration::from_secs(1)), 0);
    // The control: without gathering, the completion side waits for that work.
    assert!(waits_on_running_work(Duration::ZERO) >= 1);
}

#[test]
fn a_nudge_ends_a_gather() {
    let (queue, signal) = gathering_queue(QueueOptions::new("nudge"));
    submit(&queue, &signal, 2, 1);
    thread::sleep(Duration::from_millis(100));
    assert_eq!(
        queue.stats().completed,
        1,
        "one action waits out the gather"
    );
    let start = Instant::now();
    queue.completion_nudge().nudge();
    eventually("the nudged action retired", || queue.stats().completed == 2);
    let took = start.elapsed();
    assert!(took < SOON, "the nudged gather went on for {took:?}");
}

/// A queue whose work runs until the test completes it, with a 20 s gather.
fn running_queue(label: &str) -> (Queue<Checked>, Semaphore<FlagEvent>) {
    let queue = Queue::new(
        checked(false),
        QueueOptions::new(label)
            .with_completion(CompletionOptions::new().with_gather(Duration::from_secs(20))),
    )
    .unwrap();
    (queue, Semaphore::<FlagEvent>::new(0))
}

#[test]
fn a_nudge_retires_deferred_work_when_it_completes() {
    let (queue, signal) = running_queue("nudge-deferred");
    submit(&queue, &signal, 1, 0);
    // Taken at once, its work running and nobody waiting: deferred, and a 20 s gather begins.
    thread::sleep(Duration::from_millis(50));
    // The nudge comes first (a waiter parks while the work runs), the completion after.
    queue.completion_nudge().nudge();
    thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    queue.backend().complete(0);
    eventually("the deferred action retired", || {
        queue.stats().completed == 1
    });
    let took = start.elapsed();
    assert!(took < SOON, "the deferred action waited {took:?}");
}

/// A nudge for an older action whose batch's newest action nobody waits for: the round it ends
/// must retire the batch, waiting for its running work, not defer it and gather again (the
/// parked waiter may need the older action, which the deferral would hold up for a gather).
#[test]
fn a_nudged_round_does_not_defer_its_batch() {
    let queue = Queue::new(
        checked(false),
        QueueOptions::new("nudge-batch")
            .with_completion(CompletionOptions::new().with_gather(Duration::from_secs(2))),
    )
    .unwrap();
    let first = Semaphore::<FlagEvent>::new(0);
    submit(&queue, &first, 1, 0);
    queue.backend().complete(0);
    // Retired (at once, or a gather later if it was taken still running); the thread then
    // gathers, nobody having waited.
    eventually("the first action retired", || queue.stats().completed == 1);
    let second = Semaphore::<FlagEvent>::new(0);
    submit(&queue, &first, 2, 1);
    submit(&queue, &second, 1, 2);
    let waits_before = queue
        .backend()
        .hooks
        .waited_on_running
        .load(Ordering::SeqCst);
    queue.completion_nudge().nudge();
    thread::sleep(Duration::from_millis(50));
    queue.backend().complete(1);
    queue.backend().complete(2);
    eventually("both actions retired", || queue.stats().completed == 3);
    assert_eq!(
        queue
            .backend()
            .hooks
            .waited_on_running
            .load(Ordering::SeqCst)
            - waits_before,
        1,
        "the nudged round waited for its running batch instead of deferring it"
    );
}

#[test]
fn work_a_host_thread_parked_on_ends_a_gather() {
    let (queue, signal) = gathering_queue(QueueOptions::new("parked"));
    let waiter = {
        let signal = signal.clone();
        thread::spawn(move || {
            let start = Instant::now();
            signal.wait(2, SOON * 2).map(|()| start.elapsed())
        })
    };
    // Parked before the signal is recorded: no event to tell, so the push must end the gather.
    eventually("the waiter parked", || signal.waiter_count() == 1);
    submit(&queue, &signal, 2, 1);
    let waited = waiter.join().unwrap().unwrap();
    assert!(waited < SOON, "the parked waiter waited {waited:?}");
}
