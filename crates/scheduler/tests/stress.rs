//! Stress: 8 submitting threads, 4 host queues (two threads per queue), chains within each thread
//! and waits across threads and queues; bounded in time by a watchdog that aborts on a hang.
//!
//! 1,000,000 actions in every build: a debug build on the two-core build machine does them in a
//! few seconds. The benchmark (`cargo bench -p cuhal-scheduler`) runs the same stress in release.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use cuhal_scheduler::host::{self, HostPayload, HostSemaphore};
use cuhal_scheduler::{Cleanup, Failure, Outcome, QueueOptions, Resource};
use smallvec::smallvec;

const THREADS: usize = 8;
const QUEUES: usize = 4;

static CLEANED: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);
static RAN: AtomicU64 = AtomicU64::new(0);

fn work(_: u64) -> Result<(), Failure> {
    RAN.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

fn cleanup(outcome: Outcome<'_>, _: u64) {
    if outcome.is_err() {
        FAILED.fetch_add(1, Ordering::Relaxed);
    }
    CLEANED.fetch_add(1, Ordering::Relaxed);
}

/// Aborts the process if `done` is not signalled within `limit`: a hang must fail, not stall CI.
fn watchdog(limit: Duration) -> mpsc::Sender<()> {
    let (done, wait) = mpsc::channel::<()>();
    thread::spawn(move || {
        if let Err(mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(limit) {
            eprintln!("stress: no progress within {limit:?}: hang; aborting");
            std::process::abort();
        }
    });
    done
}

#[test]
fn eight_threads_many_actions_no_hang_nothing_lost() {
    let total: u64 = 1_000_000;
    let per_thread = total / THREADS as u64;
    let done = watchdog(Duration::from_secs(if cfg!(debug_assertions) {
        120
    } else {
        60
    }));
    let queues: Arc<Vec<_>> = Arc::new(
        (0..QUEUES)
            .map(|q| host::queue(QueueOptions::new(format!("stress-{q}"))).unwrap())
            .collect(),
    );
    let semaphores: Arc<Vec<HostSemaphore>> =
        Arc::new((0..THREADS).map(|_| HostSemaphore::new(0)).collect());
    let published: Arc<Vec<AtomicU64>> =
        Arc::new((0..THREADS).map(|_| AtomicU64::new(0)).collect());
    let resource: Resource = Arc::new(());
    let start = Arc::new(Barrier::new(THREADS));
    let began = Instant::now();
    let submitters: Vec<_> = (0..THREADS)
        .map(|t| {
            let (queues, semaphores, published, resource, start) = (
                queues.clone(),
                semaphores.clone(),
                published.clone(),
                resource.clone(),
                start.clone(),
            );
            thread::spawn(move || {
                let queue = &queues[t % QUEUES];
                let own = &semaphores[t];
                let next = (t + 1) % THREADS;
                start.wait();
                for k in 1..=per_thread {
                    // Cross-thread waits only name work already submitted, so the graph stays
                    // acyclic in submission order (queues issue in order).
                    let theirs = published[next].load(Ordering::Acquire);
                    let waits: &[(&HostSemaphore, u64)] = if k.is_multiple_of(16) && theirs > 0 {
                        &[(own, k - 1), (&semaphores[next], theirs)]
                    } else {
                        &[(own, k - 1)]
                    };
                    queue
                        .submit(
                            waits,
                            &[(own, k)],
                            HostPayload::call(work, k),
                            smallvec![resource.clone()],
                            smallvec![Cleanup::call(cleanup, k)],
                        )
                        .unwrap();
                    published[t].store(k, Ordering::Release);
                    // Keep a bounded window in flight, as a real producer would.
                    if k.is_multiple_of(4096) {
                        own.wait(k - 2048, Duration::from_secs(30)).unwrap();
                    }
                }
                own.wait(per_thread, Duration::from_secs(30)).unwrap();
            })
        })
        .collect();
    for submitter in submitters {
        submitter.join().unwrap();
    }
    let elapsed = began.elapsed();
    let deadline = Instant::now() + Duration::from_secs(30);
    while CLEANED.load(Ordering::SeqCst) < total {
        assert!(Instant::now() < deadline, "cleanups missing");
        thread::sleep(Duration::from_millis(1));
    }
    let stats: Vec<_> = queues.iter().map(|q| q.stats()).collect();
    drop(queues);
    let _ = done.send(());
    eprintln!(
        "stress: {total} actions from {THREADS} threads on {QUEUES} queues in {elapsed:.2?} \
         ({:.0} actions/s)",
        total as f64 / elapsed.as_secs_f64()
    );
    for semaphore in semaphores.iter() {
        assert_eq!(semaphore.query().unwrap(), per_thread);
    }
    assert_eq!(FAILED.load(Ordering::SeqCst), 0);
    assert_eq!(RAN.load(Ordering::SeqCst), total);
    assert_eq!(stats.iter().map(|s| s.completed).sum::<u64>(), total);
    assert_eq!(stats.iter().map(|s| s.pending).sum::<usize>(), 0);
    assert_eq!(Arc::strong_count(&resource), 1, "every resource released");
}
