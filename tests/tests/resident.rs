//! GPU suite: resident queues, driven by the scheduler kernel on the device. Each test opens its
//! own queue; a submission's graph increments a counter of its own (executions of one graph
//! never overlap, those of two may).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cuhal::{CommandBufferMode, Device, Error, ResidentOptions, ResidentQueue};
use cuhal_gpu_tests::device_support::{
    Kernels, TIMEOUT, command_buffer, open, read_u32, record_increment, wait,
};
use cuhal_resident::Refusal;

fn resident(device: &Device, options: ResidentOptions) -> ResidentQueue {
    device
        .open_resident_queue(&options)
        .unwrap_or_else(|e| panic!("open_resident_queue: {e}"))
}

/// A graph that increments `counter[0]`, prepared for `queue`.
fn incrementer(
    device: &Device,
    kernels: &Kernels,
    queue: &ResidentQueue,
) -> (Arc<cuhal::ResidentGraph>, Arc<cuhal::Buffer>) {
    let counter = device.create_buffer(4).unwrap();
    counter.write(0, &[0; 4]).unwrap();
    let cb = command_buffer(device.queue(0), |cb| {
        record_increment(cb, kernels, &counter.whole());
    });
    let graph = queue
        .prepare(&cb)
        .unwrap_or_else(|e| panic!("prepare: {e}"));
    (graph, counter)
}

fn check_one_chain(queue: &ResidentQueue) {
    let (executions, overlapped) = queue.device_counts().unwrap();
    assert!(executions > 0, "the scheduler never ran");
    assert!(!overlapped, "two scheduler chains ran at once");
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn a_resident_submission_runs_its_graph_and_signals() {
    let device = open(CommandBufferMode::Graph, 1);
    let kernels = Kernels::load(&device);
    let queue = resident(&device, ResidentOptions::new("one"));
    let (graph, counter) = incrementer(&device, &kernels, &queue);
    let done = device.create_semaphore(0);
    queue.bind(&done).unwrap();
    for value in 1..=10 {
        queue.submit(&[], &[(&done, value)], &graph).unwrap();
        wait(&done, value);
    }
    assert_eq!(read_u32(&counter), [10]);
    assert_eq!(queue.device_slot_values()[0], 10);
    check_one_chain(&queue);
    let stats = queue.shutdown();
    assert_eq!((stats.submitted, stats.retired, stats.failed), (10, 10, 0));
}

/// Four threads submit 2,000 times each to one queue with a ring of 64 (back-pressure), each
/// signalling its own semaphore; a fifth chain of submissions waits on each value in turn.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn many_threads_submit_through_a_full_ring_and_nothing_is_lost() {
    let device = open(CommandBufferMode::Graph, 1);
    let kernels = Kernels::load(&device);
    let mut options = ResidentOptions::new("many");
    options.capacity = 64;
    let queue = resident(&device, options);
    const PER_THREAD: u64 = 2_000;
    let work: Vec<_> = (0..4)
        .map(|_| {
            let (graph, counter) = incrementer(&device, &kernels, &queue);
            let semaphore = device.create_semaphore(0);
            queue.bind(&semaphore).unwrap();
            (graph, counter, semaphore)
        })
        .collect();
    std::thread::scope(|scope| {
        for (graph, _, semaphore) in &work {
            let queue = &queue;
            scope.spawn(move || {
                for value in 1..=PER_THREAD {
                    queue.submit(&[], &[(semaphore, value)], graph).unwrap();
                }
            });
        }
    });
    for (_, counter, semaphore) in &work {
        wait(semaphore, PER_THREAD);
        assert_eq!(read_u32(counter), [PER_THREAD as u32]);
    }
    check_one_chain(&queue);
    let stats = queue.shutdown();
    assert_eq!(stats.submitted, 4 * PER_THREAD);
    assert_eq!(stats.failed, 0);
    assert_eq!(stats.retained, 0);
}

/// A resident submission waits on a value a normal queue signals; a normal queue waits on the
/// resident submission's signal; the host sees the end of the chain.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn normal_and_resident_queues_wait_on_each_other() {
    let device = open(CommandBufferMode::Graph, 1);
    let kernels = Kernels::load(&device);
    let queue = resident(&device, ResidentOptions::new("mixed"));
    let (graph, counter) = incrementer(&device, &kernels, &queue);
    let normal = device.queue(0);
    let normal_counter = device.create_buffer(4).unwrap();
    normal_counter.write(0, &[0; 4]).unwrap();
    let normal_cb = command_buffer(normal, |cb| {
        record_increment(cb, &kernels, &normal_counter.whole());
    });
    let (a, b, c) = (
        device.create_semaphore(0),
        device.create_semaphore(0),
        device.create_semaphore(0),
    );
    queue.bind(&a).unwrap();
    queue.bind(&b).unwrap();
    for round in 1..=20u64 {
        // The resident submission first: it waits for the normal queue's signal.
        queue
            .submit(&[(&a, round)], &[(&b, round)], &graph)
            .unwrap();
        normal.execute(&[], &[(&a, round)], &[&normal_cb]).unwrap();
        normal
            .execute(&[(&b, round)], &[(&c, round)], &[&normal_cb])
            .unwrap();
        wait(&c, round);
    }
    assert_eq!(read_u32(&counter), [20]);
    assert_eq!(read_u32(&normal_counter), [40]);
    check_one_chain(&queue);
}

/// Idle past `idle_exit`, the chain exits; the next submission starts it again.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn an_idle_scheduler_exits_and_the_next_submission_starts_it() {
    let device = open(CommandBufferMode::Graph, 1);
    let kernels = Kernels::load(&device);
    let mut options = ResidentOptions::new("idle");
    options.idle_exit = Duration::from_micros(50);
    let queue = resident(&device, options);
    let (graph, counter) = incrementer(&device, &kernels, &queue);
    let done = device.create_semaphore(0);
    queue.bind(&done).unwrap();
    for value in 1..=5 {
        queue.submit(&[], &[(&done, value)], &graph).unwrap();
        wait(&done, value);
        let deadline = Instant::now() + TIMEOUT;
        while queue.stats().exits < queue.stats().starts {
            assert!(Instant::now() < deadline, "the idle chain never exited");
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let stats = queue.stats();
    assert_eq!(
        stats.starts, 5,
        "one cold start per submission after an idle exit"
    );
    assert_eq!(stats.exits, 5);
    assert_eq!(read_u32(&counter), [5]);
    check_one_chain(&queue);
}

/// A wait on a failed semaphore fails the submission's signals, and its graph does not run.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn a_failed_wait_fails_the_signals_and_runs_nothing() {
    let device = open(CommandBufferMode::Graph, 1);
    let kernels = Kernels::load(&device);
    let queue = resident(&device, ResidentOptions::new("failed"));
    let (graph, counter) = incrementer(&device, &kernels, &queue);
    let (upstream, done) = (device.create_semaphore(0), device.create_semaphore(0));
    queue.bind(&upstream).unwrap();
    queue.bind(&done).unwrap();
    queue
        .submit(&[(&upstream, 1)], &[(&done, 1)], &graph)
        .unwrap();
    upstream.fail(cuhal_semaphore::Failure::msg("upstream failed on purpose"));
    let error = done.wait(1, TIMEOUT).unwrap_err();
    assert!(
        error.to_string().contains("upstream failed on purpose"),
        "{error}"
    );
    assert_eq!(read_u32(&counter), [0]);
}

/// Shutdown with a submission whose wait is never reached: its signal fails, nothing hangs.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn shutdown_fails_what_can_never_run() {
    let device = open(CommandBufferMode::Graph, 1);
    let kernels = Kernels::load(&device);
    let queue = resident(&device, ResidentOptions::new("shutdown"));
    let (graph, counter) = incrementer(&device, &kernels, &queue);
    let (never, done, ran) = (
        device.create_semaphore(0),
        device.create_semaphore(0),
        device.create_semaphore(0),
    );
    for s in [&never, &done, &ran] {
        queue.bind(s).unwrap();
    }
    queue.submit(&[], &[(&ran, 1)], &graph).unwrap();
    queue.submit(&[(&never, 1)], &[(&done, 1)], &graph).unwrap();
    let started = Instant::now();
    let stats = queue.shutdown();
    assert!(started.elapsed() < TIMEOUT);
    wait(&ran, 1);
    assert!(done.wait(1, TIMEOUT).is_err());
    assert_eq!(stats.failed_at_shutdown, 1);
    assert_eq!(read_u32(&counter), [1]);
    assert!(matches!(
        queue.submit(&[], &[(&ran, 2)], &graph),
        Err(Error::Resident(_))
    ));
}

/// What a resident queue cannot run is refused when prepared or submitted, with a typed reason.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn what_cannot_run_on_the_device_is_refused_with_a_reason() {
    let kernels_device = open(CommandBufferMode::Deferred, 1);
    let kernels = Kernels::load(&kernels_device);
    let queue = resident(&kernels_device, ResidentOptions::new("refusals"));
    let counter = kernels_device.create_buffer(4).unwrap();
    let deferred = command_buffer(kernels_device.queue(0), |cb| {
        record_increment(cb, &kernels, &counter.whole());
    });
    let refusal = |e: Error| match e {
        Error::Resident(cuhal_resident::Error::Refused(r)) => r,
        other => panic!("not a refusal: {other}"),
    };
    assert!(matches!(
        refusal(
            queue
                .prepare(&deferred)
                .err()
                .expect("a deferred buffer is refused")
        ),
        Refusal::NotAGraph { .. }
    ));
    let device = open(CommandBufferMode::Graph, 1);
    let kernels = Kernels::load(&device);
    let queue = resident(&device, ResidentOptions::new("refusals"));
    let (graph, _counter) = incrementer(&device, &kernels, &queue);
    let unbound = device.create_semaphore(0);
    assert!(matches!(
        refusal(queue.submit(&[], &[(&unbound, 1)], &graph).unwrap_err()),
        Refusal::UnboundSemaphore { .. }
    ));
    let done = device.create_semaphore(5);
    queue.bind(&done).unwrap();
    assert!(matches!(
        refusal(queue.submit(&[], &[(&done, 5)], &graph).unwrap_err()),
        Refusal::SignalNotAbove { .. }
    ));
    let other = resident(&device, ResidentOptions::new("other"));
    other.bind(&done).unwrap();
    assert!(matches!(
        refusal(other.submit(&[], &[(&done, 6)], &graph).unwrap_err()),
        Refusal::OtherQueue
    ));
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn spread(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 10], v[v.len() * 9 / 10])
}

/// Figures, printed (the pass condition is only that everything ran): host time per submission
/// and the round trip, resident against the normal queue, in turns in this process.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn figures_against_the_normal_queue() {
    let device = open(CommandBufferMode::Graph, 1);
    let kernels = Kernels::load(&device);
    let mut options = ResidentOptions::new("figures");
    options.idle_exit = Duration::from_secs(1);
    options.capacity = 4096;
    let queue = resident(&device, options);
    let normal = device.queue(0);
    let graphs: Vec<_> = (0..64)
        .map(|_| incrementer(&device, &kernels, &queue))
        .collect();
    let normal_counter = device.create_buffer(4).unwrap();
    normal_counter.write(0, &[0; 4]).unwrap();
    let normal_cb = command_buffer(normal, |cb| {
        record_increment(cb, &kernels, &normal_counter.whole());
    });
    let (r, n) = (device.create_semaphore(0), device.create_semaphore(0));
    queue.bind(&r).unwrap();
    let (mut rv, mut nv) = (0u64, 0u64);
    // Host time per submission: batches of 100 submissions (ring room to spare), in turns.
    let (mut res_sub, mut normal_sub) = (Vec::new(), Vec::new());
    for round in 0..60 {
        for side in 0..2 {
            let t = Instant::now();
            if (side == 0) == (round % 2 == 0) {
                for i in 0..100 {
                    rv += 1;
                    queue.submit(&[], &[(&r, rv)], &graphs[i % 64].0).unwrap();
                }
                let per = t.elapsed().as_nanos() as f64 / 100.0;
                wait(&r, rv);
                if round >= 10 {
                    res_sub.push(per);
                }
            } else {
                for _ in 0..100 {
                    nv += 1;
                    normal.execute(&[], &[(&n, nv)], &[&normal_cb]).unwrap();
                }
                let per = t.elapsed().as_nanos() as f64 / 100.0;
                wait(&n, nv);
                if round >= 10 {
                    normal_sub.push(per);
                }
            }
        }
    }
    let (rs, ns) = (median(res_sub.clone()), median(normal_sub.clone()));
    println!(
        "FIGURE host time per submission: resident {rs:.0} ns (p10-p90 {:.0}-{:.0}), normal queue {ns:.0} ns (p10-p90 {:.0}-{:.0}): {:.3}x",
        spread(res_sub.clone()).0,
        spread(res_sub).1,
        spread(normal_sub.clone()).0,
        spread(normal_sub).1,
        rs / ns
    );
    // Sustained: 100,000 submissions from one thread, to the last signal.
    let t = Instant::now();
    for i in 0..100_000 {
        rv += 1;
        queue.submit(&[], &[(&r, rv)], &graphs[i % 64].0).unwrap();
    }
    let submitted = t.elapsed();
    wait(&r, rv);
    let all = t.elapsed();
    println!(
        "FIGURE sustained from one thread: {:.2} M submissions/s to the last signal ({:.0} ns per submit call)",
        100_000.0 / all.as_secs_f64() / 1e6,
        submitted.as_nanos() as f64 / 100_000.0
    );
    // Round trip: submit one, wait on its semaphore on the host.
    let (mut res_rt, mut normal_rt) = (Vec::new(), Vec::new());
    for round in 0..2_100 {
        for side in 0..2 {
            let t = Instant::now();
            if (side == 0) == (round % 2 == 0) {
                rv += 1;
                queue.submit(&[], &[(&r, rv)], &graphs[0].0).unwrap();
                wait(&r, rv);
                if round >= 100 {
                    res_rt.push(t.elapsed().as_nanos() as f64 / 1e3);
                }
            } else {
                nv += 1;
                normal.execute(&[], &[(&n, nv)], &[&normal_cb]).unwrap();
                wait(&n, nv);
                if round >= 100 {
                    normal_rt.push(t.elapsed().as_nanos() as f64 / 1e3);
                }
            }
        }
    }
    let (rr, nr) = (median(res_rt.clone()), median(normal_rt.clone()));
    println!(
        "FIGURE round trip: resident {rr:.2} us (p10-p90 {:.2}-{:.2}), normal queue {nr:.2} us (p10-p90 {:.2}-{:.2}): {:.3}x",
        spread(res_rt.clone()).0,
        spread(res_rt).1,
        spread(normal_rt.clone()).0,
        spread(normal_rt).1,
        rr / nr
    );
    check_one_chain(&queue);
    let stats = queue.shutdown();
    println!(
        "FIGURE executions {} for {} submissions; cold starts {}",
        queue.device_counts().unwrap().0,
        stats.submitted,
        stats.starts
    );
}

/// Three threads submit chains to two resident queues and the normal queue, each submission
/// waiting on its own chain's last value and on a value another thread has already submitted
/// (so no queue's order can deadlock): every value is reached and every graph ran exactly as
/// often as it was submitted.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn threads_across_two_resident_queues_and_a_normal_queue_lose_nothing() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let device = open(CommandBufferMode::Graph, 1);
    let kernels = Kernels::load(&device);
    let resident_queues = [
        resident(&device, ResidentOptions::new("stress-a")),
        resident(&device, ResidentOptions::new("stress-b")),
    ];
    const THREADS: usize = 3;
    const STEPS: u64 = 500;
    let chains: Vec<_> = (0..THREADS).map(|_| device.create_semaphore(0)).collect();
    for queue in &resident_queues {
        for chain in &chains {
            queue.bind(chain).unwrap();
        }
    }
    let submitted: Vec<AtomicU64> = (0..THREADS).map(|_| AtomicU64::new(0)).collect();
    let target = device.create_buffer(64).unwrap();
    let graphs: Vec<Vec<_>> = (0..THREADS)
        .map(|_| {
            resident_queues
                .iter()
                .map(|queue| incrementer(&device, &kernels, queue))
                .collect()
        })
        .collect();
    let runs: Vec<Vec<AtomicU64>> = (0..THREADS)
        .map(|_| (0..2).map(|_| AtomicU64::new(0)).collect())
        .collect();
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (device, queues, chains, submitted, graphs, target, runs) = (
                &device,
                &resident_queues,
                &chains,
                &submitted,
                &graphs,
                &target,
                &runs,
            );
            scope.spawn(move || {
                let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ (t as u64 + 1);
                let mut next = move || {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed
                };
                for step in 1..=STEPS {
                    let other = (t + 1 + (next() as usize % (THREADS - 1))) % THREADS;
                    let reached = submitted[other].load(Ordering::SeqCst);
                    let mut waits = vec![(&chains[t], step - 1)];
                    if reached > 0 {
                        waits.push((&chains[other], 1 + next() % reached));
                    }
                    let signals = [(&chains[t], step)];
                    match next() % 3 {
                        2 => device
                            .queue(0)
                            .fill(&waits, &signals, &target.whole(), cuhal::FillPattern::U8(1))
                            .unwrap(),
                        q => {
                            let q = q as usize;
                            queues[q].submit(&waits, &signals, &graphs[t][q].0).unwrap();
                            runs[t][q].fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    submitted[t].store(step, Ordering::SeqCst);
                }
            });
        }
    });
    for chain in &chains {
        wait(chain, STEPS);
    }
    for queue in &resident_queues {
        check_one_chain(queue);
        let stats = queue.shutdown();
        assert_eq!((stats.failed, stats.retained), (0, 0), "{stats:?}");
    }
    for (t, row) in graphs.iter().enumerate() {
        for (q, (_, counter)) in row.iter().enumerate() {
            assert_eq!(
                u64::from(read_u32(counter)[0]),
                runs[t][q].load(Ordering::SeqCst),
                "thread {t}, resident queue {q}"
            );
        }
    }
}
