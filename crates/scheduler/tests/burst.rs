//! A burst (one thread issuing what its own issues made ready, a chain across queues released by
//! one host signal) wakes a parked completion thread when it ends, not at its first hand-over,
//! unless a full gather batch waits or a host thread is parked on the work.

mod support;

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use cuhal_scheduler::{Cleanups, CompletionOptions, Queue, QueueOptions, QueueStats, Resources};
use cuhal_semaphore::Semaphore;
use cuhal_semaphore::testing::FlagEvent;

use support::{OnIssue, Script, Scripted, eventually, within};

/// The issue of this action tells the test it began and then waits until the test lets it go,
/// holding the burst open.
const HOLD: u64 = 1_000;

/// Two queues whose backends hold the burst at `HOLD`: the test's ends of their channels. `go`
/// drops first, so a test that fails while the burst is held lets it go (its `recv` fails) before
/// the queues shut down.
struct Pair {
    go: [SyncSender<()>; 2],
    began: [Receiver<()>; 2],
    queues: [Arc<Queue<Scripted<OnIssue>>>; 2],
}

fn pair(options: impl Fn(&str) -> QueueOptions) -> Pair {
    let mut queues = Vec::new();
    let mut began = Vec::new();
    let mut go = Vec::new();
    for label in ["burst-0", "burst-1"] {
        let (began_tx, began_rx) = sync_channel(1);
        let (go_tx, go_rx) = sync_channel(1);
        let go_rx = Mutex::new(go_rx);
        // Scripted work, completed at issue.
        let backend = Scripted::with_on_issue(true, move |script| {
            if script.id == HOLD {
                began_tx.send(()).unwrap();
                go_rx.lock().unwrap().recv().unwrap();
            }
        });
        queues.push(Arc::new(Queue::new(backend, options(label)).unwrap()));
        began.push(began_rx);
        go.push(go_tx);
    }
    let queues: [Arc<Queue<Scripted<OnIssue>>>; 2] = queues.try_into().ok().unwrap();
    let began: [Receiver<()>; 2] = began.try_into().ok().unwrap();
    let go: [SyncSender<()>; 2] = go.try_into().ok().unwrap();
    Pair { go, began, queues }
}

/// Submits `steps` dependent actions alternating between the queues, the first waiting for
/// `gate` to reach 1 and step `i` signalling `chain` to `i + 1`; the last one is `HOLD`. Then
/// waits until both completion threads are parked.
fn pend_chain(pair: &Pair, gate: &Semaphore<FlagEvent>, chain: &Semaphore<FlagEvent>, steps: u64) {
    pend_chain_with(pair, gate, chain, steps, None);
}

/// [`pend_chain`], step 1 also signalling `side` to 1.
fn pend_chain_with(
    pair: &Pair,
    gate: &Semaphore<FlagEvent>,
    chain: &Semaphore<FlagEvent>,
    steps: u64,
    side: Option<&Semaphore<FlagEvent>>,
) {
    for i in 0..steps {
        let wait = if i == 0 { (gate, 1) } else { (chain, i) };
        let id = if i == steps - 1 { HOLD } else { i };
        let mut signals = vec![(chain, i + 1)];
        if let (1, Some(side)) = (i, side) {
            signals.push((side, 1));
        }
        pair.queues[(i % 2) as usize]
            .submit(
                &[wait],
                &signals,
                Script::id(id),
                Resources::new(),
                Cleanups::new(),
            )
            .unwrap();
    }
    eventually("both completion threads parked", || {
        pair.queues.iter().all(|q| q.stats().completion_parked)
    });
}

/// Releases the chain on another thread and waits until its burst reached `HOLD`, on queue
/// `(steps - 1) % 2`, then a while longer.
fn release_until_held(
    pair: &Pair,
    gate: &Semaphore<FlagEvent>,
    steps: u64,
) -> thread::JoinHandle<()> {
    let signaller = {
        let gate = gate.clone();
        thread::spawn(move || gate.signal(1).unwrap())
    };
    pair.began[held_queue(steps)]
        .recv_timeout(Duration::from_secs(5))
        .expect("the burst reached the held step");
    // A woken completion thread would have taken and retired its batch by now.
    thread::sleep(Duration::from_millis(50));
    signaller
}

/// The queue of a chain's last step, whose issue holds the burst.
fn held_queue(steps: u64) -> usize {
    ((steps - 1) % 2) as usize
}

/// Lets the held burst go and waits for the thread that released the chain.
fn let_go(pair: &Pair, steps: u64, signaller: thread::JoinHandle<()>) {
    pair.go[held_queue(steps)].send(()).unwrap();
    signaller.join().unwrap();
}

/// Waits until the chain's every step retired.
fn all_retire(pair: &Pair, steps: u64) {
    eventually("every step retired", || {
        stats(pair).iter().map(QueueStats::retired).sum::<u64>() == steps
    });
}

fn stats(pair: &Pair) -> [QueueStats; 2] {
    [pair.queues[0].stats(), pair.queues[1].stats()]
}

/// Actions each queue's completion thread released so far. (Not `stats`, which takes the issue
/// lock that the held burst holds.)
fn released(pair: &Pair) -> [usize; 2] {
    [0, 1].map(|q| pair.queues[q].backend().released.load(Ordering::SeqCst))
}

/// A chain of `steps` pended, released until its last step holds the burst, and let go: what
/// each queue released while it was held, and the chain's semaphore. The burst is let go before
/// any check, so that a failed one does not leave it held.
fn released_while_held(pair: &Pair, steps: u64) -> ([usize; 2], Semaphore<FlagEvent>) {
    let (gate, chain) = (Semaphore::new(0), Semaphore::new(0));
    pend_chain(pair, &gate, &chain, steps);
    let signaller = release_until_held(pair, &gate, steps);
    let during = released(pair);
    let_go(pair, steps, signaller);
    (during, chain)
}

#[test]
fn a_chain_released_by_one_signal_wakes_the_completion_threads_when_it_is_issued() {
    let pair = pair(|label| QueueOptions::new(label));
    let steps = 20;
    let (during, chain) = released_while_held(&pair, steps);
    assert_eq!(during, [0, 0], "released during the burst");
    // The burst's end woke both threads.
    all_retire(&pair, steps);
    for (queue, now) in stats(&pair).iter().enumerate() {
        assert_eq!(
            now.issued_on_signal,
            steps / 2,
            "queue {queue}: steps the burst issued"
        );
        // Woken once, at the burst's end.
        assert_eq!(now.retire_batches, 1, "queue {queue}: batches");
    }
    assert_eq!(chain.query().unwrap(), steps);
}

#[test]
fn a_full_gather_batch_wakes_the_completion_thread_during_a_burst() {
    let batch = 4;
    let pair = pair(|label| {
        QueueOptions::new(label).with_completion(CompletionOptions::new().with_gather_batch(batch))
    });
    // Nine steps handed over on each queue before the held one: more than two batches each.
    let steps = 20;
    let (during, _) = released_while_held(&pair, steps);
    for (queue, released) in during.iter().enumerate() {
        assert!(
            *released >= batch,
            "queue {queue}: {released} released during the burst, with batches of {batch}"
        );
    }
    all_retire(&pair, steps);
}

#[test]
fn work_a_host_thread_is_parked_on_wakes_the_completion_thread_during_a_burst() {
    let pair = pair(|label| {
        QueueOptions::new(label)
            // Gathering, so that a hand-over can be urgent; short, so that what the burst
            // handed a gathering thread afterwards retires within the test's patience.
            .with_completion(CompletionOptions::new().with_gather(Duration::from_millis(100)))
    });
    let (gate, chain, side) = (Semaphore::new(0), Semaphore::new(0), Semaphore::new(0));
    let steps = 20;
    pend_chain_with(&pair, &gate, &chain, steps, Some(&side));
    // Parked on `side` beyond what step 1 signals: step 1's hand-over finds a host thread
    // parked on its signal, so it is urgent and queue 1's completion thread is woken for it
    // while the burst is held.
    let waiter = {
        let side = side.clone();
        thread::spawn(move || side.wait(2, Duration::from_secs(10)))
    };
    eventually("the host waiter parked", || side.has_waiters());
    let signaller = release_until_held(&pair, &gate, steps);
    // Checked once the burst is let go, so that a failure does not leave it held.
    within(Duration::from_secs(5), || released(&pair)[1] >= 1);
    let during = released(&pair);
    side.signal(2).unwrap();
    waiter.join().unwrap().unwrap();
    let_go(&pair, steps, signaller);
    assert!(during[1] >= 1, "queue 1 released nothing during the burst");
    assert_eq!(during[0], 0, "queue 0 released during the burst");
    all_retire(&pair, steps);
}
