//! A chain across many queues released by one host signal is issued by one loop on the
//! signalling thread: each step's record puts the next step's listener into the loop's burst,
//! which runs it once the step's queue lock is let go. The stack does not grow with the chain:
//! every step is issued at the same depth, with at most one issue lock held.

mod support;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use cuhal_scheduler::{Cleanups, Queue, QueueOptions, Resources};
use cuhal_semaphore::Semaphore;
use cuhal_semaphore::testing::FlagEvent;
use proptest::prelude::*;

use support::{OnIssue, Script, Scripted};

/// How far apart (in bytes of stack) the deepest and the shallowest issue of a chain may be.
/// One loop issues every step at the same depth, give or take a frame; a call nested per step
/// would put the 64th step tens of kilobytes below the first.
const STACK_SPREAD: usize = 16 * 1024;

/// Queues whose work completes only when the test says (so no completion thread advances a
/// semaphore and issues anything), each noting how deep in the stack its issues run.
fn queues(n: usize, depths: &Arc<Mutex<Vec<usize>>>) -> Vec<Queue<Scripted<OnIssue>>> {
    (0..n)
        .map(|q| {
            let depths = Arc::clone(depths);
            let backend = Scripted::with_on_issue(false, move |_script| {
                let marker = 0u8;
                let depth = std::hint::black_box(&marker) as *const u8 as usize;
                depths.lock().unwrap().push(depth);
            });
            Queue::new(backend, QueueOptions::new(format!("chain-{q}"))).unwrap()
        })
        .collect()
}

/// Submits step `i` of a chain to `queue`: it waits for `wait` and signals `chain` to `i + 1`.
fn submit(
    queue: &Queue<Scripted<OnIssue>>,
    wait: (&Semaphore<FlagEvent>, u64),
    chain: &Semaphore<FlagEvent>,
    i: u64,
) {
    queue
        .submit(
            &[wait],
            &[(chain, i + 1)],
            Script::id(i),
            Resources::new(),
            Cleanups::new(),
        )
        .unwrap();
}

/// Submits a chain whose step `i` runs on queue `on[i]`, step 0 waiting for `gate` to reach 1
/// and step `i` for `chain` to reach `i`; signals the gate on a thread of its own with a small
/// stack; checks that every step was issued on that thread, in order, each waiting on the
/// device for exactly the step before it, at one stack depth. Returns the issue count.
fn release_chain(n: usize, on: &[usize]) -> usize {
    let depths = Arc::new(Mutex::new(Vec::new()));
    let queues = queues(n, &depths);
    let (gate, chain) = (
        Semaphore::<FlagEvent>::new(0),
        Semaphore::<FlagEvent>::new(0),
    );
    for (i, &q) in on.iter().enumerate() {
        let i = i as u64;
        let wait = if i == 0 { (&gate, 1) } else { (&chain, i) };
        submit(&queues[q], wait, &chain, i);
    }
    let pending: usize = queues.iter().map(|q| q.stats().pending).sum();
    assert_eq!(pending, on.len(), "every step waits for the gate");
    let signaller = {
        let gate = gate.clone();
        thread::Builder::new()
            .name("chain-signaller".into())
            // Room for one step's issue, far from room for a call nested per step.
            .stack_size(256 * 1024)
            .spawn(move || {
                gate.signal(1).unwrap();
                thread::current().id()
            })
            .unwrap()
    };
    let signaller = signaller.join().expect("the signalling thread overflowed");
    let mut issued: Vec<_> = queues
        .iter()
        .flat_map(|q| q.backend().issued.lock().unwrap().clone())
        .collect();
    issued.sort_by_key(|issued| issued.id);
    assert_eq!(issued.len(), on.len(), "every step issued by the signal");
    for (i, step) in issued.iter().enumerate() {
        assert_eq!(step.id, i as u64);
        assert_eq!(
            step.thread, signaller,
            "step {i} was issued on another thread than the signalling one"
        );
        if i == 0 {
            assert!(
                step.device_waits.is_empty(),
                "the gate was reached on the host"
            );
        } else {
            assert_eq!(step.device_waits.len(), 1, "step {i}");
            assert!(
                step.device_waits[0].ptr_eq(&issued[i - 1].event),
                "step {i} waits on the device for the step before it"
            );
        }
    }
    for queue in &queues {
        let stats = queue.stats();
        assert_eq!(stats.pending, 0);
        assert_eq!(stats.issued_on_signal, stats.submitted);
    }
    let depths = depths.lock().unwrap();
    let spread = depths.iter().max().unwrap() - depths.iter().min().unwrap();
    assert!(
        spread < STACK_SPREAD,
        "the issues of a chain of {} steps ran {spread} bytes of stack apart",
        on.len()
    );
    for issued in &issued {
        issued.event.complete();
    }
    chain
        .wait(on.len() as u64, Duration::from_secs(10))
        .unwrap();
    issued.len()
}

#[test]
fn a_chain_across_64_queues_released_by_one_host_signal_is_issued_by_one_loop() {
    let on: Vec<usize> = (0..64).collect();
    assert_eq!(release_chain(64, &on), 64);
}

#[test]
fn a_long_chain_alternating_between_two_queues_is_issued_by_one_loop() {
    let on: Vec<usize> = (0..500).map(|i| i % 2).collect();
    assert_eq!(release_chain(2, &on), 500);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// A chain whose steps land on random queues (the same queue several steps running, or
    /// hopping between them) is issued whole by the signal, in order, at one stack depth.
    #[test]
    fn a_chain_over_random_queues_is_issued_by_one_loop(
        n in 1usize..10,
        picks in proptest::collection::vec(any::<usize>(), 1..80),
    ) {
        let on: Vec<usize> = picks.iter().map(|pick| pick % n).collect();
        prop_assert_eq!(release_chain(n, &on), on.len());
    }
}
