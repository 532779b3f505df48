//! Scheduler benchmark on the CPU host backend: `cargo bench -p cuhal-scheduler`.
//!
//! Prints markdown tables: submission throughput, round-trip latency against the thread hand-off
//! floor measured in the same run, and the cost per action with 100, 10,000 and 100,000 pending
//! actions waiting on distinct semaphores (the seed rescanned every pending action on every
//! completion, so its cost grew with the pending count; the goal here is the 100,000 figure within
//! 1.5x of the 100 figure).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_utils::sync::Parker;
use cuhal_scheduler::host::{self, HostPayload, HostQueue, HostSemaphore};
use cuhal_scheduler::{Cleanups, QueueOptions, Resources};

const WAIT: Duration = Duration::from_secs(60);

fn queue(label: &str) -> HostQueue {
    host::queue(QueueOptions::new(label)).unwrap()
}

/// Submits a host no-op that holds no resources and runs no cleanup.
fn submit_nop(
    queue: &HostQueue,
    waits: &[(&HostSemaphore, u64)],
    signals: &[(&HostSemaphore, u64)],
) {
    queue
        .submit(
            waits,
            signals,
            HostPayload::Nop,
            Resources::new(),
            Cleanups::new(),
        )
        .unwrap();
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[samples.len() / 2]
}

fn percentile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[((samples.len() as f64 - 1.0) * p) as usize]
}

/// One thread submits `n` ready actions to one queue, each signalling the next value of one
/// timeline; with `window`, it keeps at most that many in flight. Returns (submit ns/action,
/// end-to-end ns/action).
fn submit_throughput(n: u64, window: Option<u64>) -> (f64, f64) {
    let queue = queue("bench-submit");
    let done = HostSemaphore::new(0);
    let start = Instant::now();
    for k in 1..=n {
        submit_nop(&queue, &[], &[(&done, k)]);
        if let Some(window) = window
            && k.is_multiple_of(window / 2)
            && k > window / 2
        {
            done.wait(k - window / 2, WAIT).unwrap();
        }
    }
    let submitted = start.elapsed();
    done.wait(n, WAIT).unwrap();
    let finished = start.elapsed();
    (
        submitted.as_nanos() as f64 / n as f64,
        finished.as_nanos() as f64 / n as f64,
    )
}

/// Eight threads on four queues, chains and cross-thread waits (the stress test's pattern).
fn eight_threads(total: u64) -> f64 {
    const THREADS: usize = 8;
    let queues: Arc<Vec<HostQueue>> =
        Arc::new((0..4).map(|q| queue(&format!("bench-{q}"))).collect());
    let semaphores: Arc<Vec<HostSemaphore>> =
        Arc::new((0..THREADS).map(|_| HostSemaphore::new(0)).collect());
    let published: Arc<Vec<AtomicU64>> =
        Arc::new((0..THREADS).map(|_| AtomicU64::new(0)).collect());
    let per_thread = total / THREADS as u64;
    let start = Instant::now();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (queues, semaphores, published) =
                (queues.clone(), semaphores.clone(), published.clone());
            thread::spawn(move || {
                let (queue, own, next) = (&queues[t % 4], &semaphores[t], (t + 1) % THREADS);
                for k in 1..=per_thread {
                    let theirs = published[next].load(Ordering::Acquire);
                    let waits: &[(&HostSemaphore, u64)] = if k.is_multiple_of(16) && theirs > 0 {
                        &[(own, k - 1), (&semaphores[next], theirs)]
                    } else {
                        &[(own, k - 1)]
                    };
                    submit_nop(queue, waits, &[(own, k)]);
                    published[t].store(k, Ordering::Release);
                    if k.is_multiple_of(4096) {
                        own.wait(k - 2048, WAIT).unwrap();
                    }
                }
                own.wait(per_thread, WAIT).unwrap();
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    total as f64 / start.elapsed().as_secs_f64()
}

/// Submit one ready action and wait on the host for its signal, `n` times: latency samples in us.
fn round_trip(n: usize) -> Vec<f64> {
    let queue = queue("bench-latency");
    let done = HostSemaphore::new(0);
    (1..=n as u64)
        .map(|k| {
            let start = Instant::now();
            submit_nop(&queue, &[], &[(&done, k)]);
            done.wait(k, WAIT).unwrap();
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect()
}

/// The floor: one parked thread woken by another (one way), in us.
fn handoff(n: usize) -> Vec<f64> {
    let parker = Parker::new();
    let unparker = parker.unparker().clone();
    let stamp = Arc::new(AtomicU64::new(0));
    let origin = Instant::now();
    let ready = Arc::new(AtomicBool::new(false));
    let (stamp2, ready2) = (stamp.clone(), ready.clone());
    let waker = thread::spawn(move || {
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            while !ready2.swap(false, Ordering::AcqRel) {
                std::hint::spin_loop();
            }
            thread::sleep(Duration::from_micros(50)); // let the other side park
            stamp2.store(origin.elapsed().as_nanos() as u64, Ordering::Release);
            unparker.unpark();
            samples.push(());
        }
    });
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        ready.store(true, Ordering::Release);
        parker.park();
        let woke = origin.elapsed().as_nanos() as u64;
        samples.push((woke.saturating_sub(stamp.load(Ordering::Acquire))) as f64 / 1e3);
    }
    waker.join().unwrap();
    samples
}

/// `pending` actions on one queue, each waiting on its own semaphore: (submit ns/action,
/// resolve ns/action) where resolve = signal every semaphore (in submission order, or reversed)
/// and wait for the last action to complete.
fn pending_cost(pending: usize, reverse: bool) -> (f64, f64) {
    let queue = queue("bench-pending");
    let gates: Vec<HostSemaphore> = (0..pending).map(|_| HostSemaphore::new(0)).collect();
    // Each action signals its own semaphore: the queue retires in order, so the last one reaching
    // 1 means all did, and no semaphore holds more than one device-signal timepoint.
    let outs: Vec<HostSemaphore> = (0..pending).map(|_| HostSemaphore::new(0)).collect();
    let start = Instant::now();
    for (gate, out) in gates.iter().zip(&outs) {
        submit_nop(&queue, &[(gate, 1)], &[(out, 1)]);
    }
    let submit = start.elapsed().as_nanos() as f64 / pending as f64;
    assert_eq!(queue.stats().pending, pending);
    let start = Instant::now();
    if reverse {
        gates.iter().rev().for_each(|gate| gate.signal(1).unwrap());
    } else {
        gates.iter().for_each(|gate| gate.signal(1).unwrap());
    }
    outs[pending - 1].wait(1, WAIT).unwrap();
    let resolve = start.elapsed().as_nanos() as f64 / pending as f64;
    (submit, resolve)
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is accepted and ignored.
    let quick = std::env::args().any(|a| a == "--quick");
    let scale = if quick { 10 } else { 1 };

    println!("## Scheduler (CPU)\n");
    println!(
        "Host backend, `cargo bench -p cuhal-scheduler` (release), {} hardware threads.\n",
        thread::available_parallelism().map_or(0, |n| n.get())
    );

    let best = |window| {
        (0..3)
            .map(|_| submit_throughput(200_000 / scale, window))
            .fold((f64::MAX, f64::MAX), |(a, b), (x, y)| (a.min(x), b.min(y)))
    };
    let (submit, end_to_end) = best(Some(1024));
    let (deep_submit, deep_end_to_end) = best(None);
    let stress = eight_threads(1_000_000 / scale);
    println!("| throughput | ns/action | actions/s |");
    println!("|---|---:|---:|");
    println!(
        "| 1 thread, 1 queue, ready actions, <= 1024 in flight: submit | {submit:.0} | {:.0} |",
        1e9 / submit
    );
    println!(
        "| 1 thread, 1 queue, ready actions, <= 1024 in flight: submit to last completion | {end_to_end:.0} | {:.0} |",
        1e9 / end_to_end
    );
    println!(
        "| 1 thread, 1 queue, {} ready actions all in flight on one timeline: submit | {deep_submit:.0} | {:.0} |",
        200_000 / scale,
        1e9 / deep_submit
    );
    println!(
        "| same: submit to last completion | {deep_end_to_end:.0} | {:.0} |",
        1e9 / deep_end_to_end
    );
    println!(
        "| 8 threads, 4 queues, {} actions, chains + cross-queue waits | {:.0} | {stress:.0} |",
        1_000_000 / scale,
        1e9 / stress
    );

    let mut floor = handoff(2000 / scale as usize);
    let mut latency = round_trip(5000 / scale as usize);
    let (floor50, floor99) = (percentile(&mut floor, 0.5), percentile(&mut floor, 0.99));
    let (lat50, lat99) = (
        percentile(&mut latency, 0.5),
        percentile(&mut latency, 0.99),
    );
    println!();
    println!("| latency | p50 us | p99 us | p50 / floor |");
    println!("|---|---:|---:|---:|");
    println!(
        "| floor: parked thread woken by another, one way | {floor50:.1} | {floor99:.1} | 1.0 |"
    );
    println!(
        "| submit 1 ready action + host wait for its signal | {lat50:.1} | {lat99:.1} | {:.1} |",
        lat50 / floor50
    );

    println!();
    println!(
        "| pending actions | submit ns/action | resolve in order ns/action | resolve reversed ns/action | in order / 100 |"
    );
    println!("|---:|---:|---:|---:|---:|");
    let mut base = None;
    for (pending, repeats) in [(100usize, 200usize), (10_000, 10), (100_000, 3)] {
        let repeats = (repeats / scale as usize).max(1);
        let runs: Vec<_> = (0..repeats).map(|_| pending_cost(pending, false)).collect();
        let submit = median(runs.iter().map(|r| r.0).collect());
        let in_order = median(runs.iter().map(|r| r.1).collect());
        let reversed = median(
            (0..repeats)
                .map(|_| pending_cost(pending, true).1)
                .collect(),
        );
        let base = *base.get_or_insert(in_order);
        println!(
            "| {pending} | {submit:.0} | {in_order:.0} | {reversed:.0} | {:.2} |",
            in_order / base
        );
    }
}
