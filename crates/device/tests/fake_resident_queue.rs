//! Resident queues on the fake driver, whose emulated scheduler follows the kernel's rules
//! (`cuhal_fake_driver::resident`): the device half's host code end to end, without a GPU:
//! opening, preparing (node kinds, device-launch instantiation), submission and signals, waits
//! on host values pushed later, shutdown, refusals, and a launch the device refuses.

mod fake_support;

use std::sync::{Arc, Once};
use std::time::Duration;

use cuhal::{
    Buffer, CommandBufferMode, Device, DeviceOptions, Dispatch, Error, FillPattern, KernelArgs,
    RESIDENT_SCHEDULER_DIR_ENV, ResidentOptions, ResidentQueue,
};
use cuhal_resident::Refusal;
use fake_support::add::add_kernel;
use fake_support::*;

/// A stand-in for the sm_90 scheduler cubin: the fake "compiles" any text with `.entry` names.
const SCHEDULER: &str = ".entry cuhal_resident_schedule(.param .align 8 .b8 p[128]) { ret; }\0";

fn install_scheduler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let dir = std::env::temp_dir().join(format!("cuhal-resident-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("scheduler_sm_90.cubin"), SCHEDULER).unwrap();
        // SAFETY: set once, before any test of this binary opens a resident queue; nothing in
        // the test binaries reads the environment through libc.
        unsafe { std::env::set_var(RESIDENT_SCHEDULER_DIR_ENV, &dir) };
    });
}

fn device(tag: &str) -> (cuhal_fake_driver::harness::FakeDriver, Device) {
    install_scheduler();
    let (fake, driver) = load(tag);
    let device = driver
        .open(
            0,
            DeviceOptions {
                command_buffer_mode: CommandBufferMode::Graph,
                ..queues(1)
            },
        )
        .unwrap();
    (fake, device)
}

/// A graph adding 1 to `counter[0]`, and the counter.
fn counter_graph(device: &Device) -> (Arc<dyn cuhal::CommandBuffer>, Arc<Buffer>) {
    let add = add_kernel(device);
    let counter = device.create_buffer(4).unwrap();
    counter.write(0, &[0; 4]).unwrap();
    let mut cb = device.queue(0).create_command_buffer().unwrap();
    let args = KernelArgs::new()
        .with_range(&counter.whole())
        .with_range(&counter.whole())
        .with(1u32)
        .with(1u32);
    cb.dispatch(&Dispatch::new(&add, [1, 1, 1], [1, 1, 1], &args))
        .unwrap();
    (cb.end().unwrap(), counter)
}

fn read(counter: &Buffer) -> u32 {
    let mut bytes = [0u8; 4];
    counter.read(0, &mut bytes).unwrap();
    u32::from_ne_bytes(bytes)
}

fn open(device: &Device, options: ResidentOptions) -> ResidentQueue {
    device
        .open_resident_queue(&options)
        .unwrap_or_else(|e| panic!("open_resident_queue: {e}"))
}

#[test]
fn submissions_run_their_graphs_and_signal_in_order() {
    let (_fake, device) = device("resident-run");
    let queue = open(&device, ResidentOptions::new("run"));
    let (cb, counter) = counter_graph(&device);
    let graph = queue.prepare(&cb).unwrap();
    let done = device.create_semaphore(0);
    queue.bind(&done).unwrap();
    for value in 1..=50 {
        queue.submit(&[], &[(&done, value)], &graph).unwrap();
    }
    wait(&done, 50);
    assert_eq!(read(&counter), 50);
    assert_eq!(queue.device_slot_values()[0], 50);
    let stats = queue.shutdown();
    assert_eq!(
        (stats.submitted, stats.retired, stats.launched, stats.failed),
        (50, 50, 50, 0)
    );
    assert!(
        stats.starts >= 1 && stats.exits == stats.starts,
        "{stats:?}"
    );
    let (executions, overlapped) = queue.device_counts().unwrap();
    assert!(executions >= 1 && !overlapped);
}

#[test]
fn a_wait_on_a_host_value_runs_once_the_host_signals_it() {
    let (_fake, device) = device("resident-wait");
    let queue = open(&device, ResidentOptions::new("wait"));
    let (cb, counter) = counter_graph(&device);
    let graph = queue.prepare(&cb).unwrap();
    let (gate, done) = (device.create_semaphore(0), device.create_semaphore(0));
    queue.bind(&gate).unwrap();
    queue.bind(&done).unwrap();
    queue.submit(&[(&gate, 3)], &[(&done, 1)], &graph).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(read(&counter), 0, "ran before its wait was reached");
    assert!(done.wait(1, Duration::from_millis(1)).is_err());
    gate.signal(3).unwrap();
    wait(&done, 1);
    assert_eq!(read(&counter), 1);
}

#[test]
fn normal_and_resident_queues_wait_on_each_other() {
    let (_fake, device) = device("resident-mixed");
    let queue = open(&device, ResidentOptions::new("mixed"));
    let (cb, counter) = counter_graph(&device);
    let graph = queue.prepare(&cb).unwrap();
    let target = device.create_buffer(16).unwrap();
    let (a, b, c) = (
        device.create_semaphore(0),
        device.create_semaphore(0),
        device.create_semaphore(0),
    );
    queue.bind(&a).unwrap();
    queue.bind(&b).unwrap();
    let normal = device.queue(0);
    for round in 1..=10u64 {
        queue
            .submit(&[(&a, round)], &[(&b, round)], &graph)
            .unwrap();
        normal
            .fill(&[], &[(&a, round)], &target.whole(), FillPattern::U8(1))
            .unwrap();
        normal
            .fill(
                &[(&b, round)],
                &[(&c, round)],
                &target.whole(),
                FillPattern::U8(2),
            )
            .unwrap();
        wait(&c, round);
    }
    assert_eq!(read(&counter), 10);
}

#[test]
fn shutdown_fails_what_waits_and_refuses_later_submissions() {
    let (_fake, device) = device("resident-shutdown");
    let queue = open(&device, ResidentOptions::new("shutdown"));
    let (cb, counter) = counter_graph(&device);
    let graph = queue.prepare(&cb).unwrap();
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
    let stats = queue.shutdown();
    // The scheduler itself finished the waiting submission: its signal slot is failed.
    assert_eq!(queue.device_slot_values()[1], 1 << 63);
    wait(&ran, 1);
    let error = done.wait(1, TIMEOUT).unwrap_err();
    assert!(error.to_string().contains("shut down"), "{error}");
    assert_eq!(stats.failed_at_shutdown, 1);
    assert_eq!(read(&counter), 1);
    assert!(matches!(
        queue.submit(&[], &[(&ran, 2)], &graph),
        Err(Error::Resident(cuhal_resident::Error::Shutdown))
    ));
}

fn refusal(error: Error) -> Refusal {
    match error {
        Error::Resident(cuhal_resident::Error::Refused(refusal)) => refusal,
        other => panic!("not a refusal: {other}"),
    }
}

#[test]
fn what_the_device_cannot_launch_is_refused_with_a_reason() {
    let (_fake, device) = device("resident-refusals");
    let queue = open(&device, ResidentOptions::new("refusals"));
    // A barrier between two dispatches is an empty node, which device launch refuses.
    let add = add_kernel(&device);
    let counter = device.create_buffer(4).unwrap();
    let mut cb = device.queue(0).create_command_buffer().unwrap();
    let args = KernelArgs::new()
        .with_range(&counter.whole())
        .with_range(&counter.whole())
        .with(1u32)
        .with(1u32);
    for _ in 0..2 {
        cb.dispatch(&Dispatch::new(&add, [1, 1, 1], [1, 1, 1], &args))
            .unwrap();
        cb.barrier().unwrap();
    }
    let with_barriers = cb.end().unwrap();
    match queue.prepare(&with_barriers) {
        Err(e) => assert!(
            matches!(refusal(e), Refusal::NodeKind { .. }),
            "a barrier's node"
        ),
        // A recorder that joins barriers without empty nodes leaves kernels only.
        Ok(graph) => assert!(graph.nodes().iter().all(|k| k.device_launchable())),
    }
    // Binding slots.
    let mut cb = device
        .queue(0)
        .create_command_buffer_with_bindings(1)
        .unwrap();
    cb.fill(
        &cuhal::BufferRange::slot(0, 0, 4).unwrap(),
        FillPattern::U32(7),
    )
    .unwrap();
    let slotted = cb.end().unwrap();
    assert!(matches!(
        refusal(queue.prepare(&slotted).err().unwrap()),
        Refusal::BindingSlots { slots: 1 }
    ));
    // A graph prepared for another queue.
    let (cb, _counter) = counter_graph(&device);
    let graph = queue.prepare(&cb).unwrap();
    let other = open(&device, ResidentOptions::new("other"));
    let done = device.create_semaphore(0);
    other.bind(&done).unwrap();
    assert!(matches!(
        refusal(other.submit(&[], &[(&done, 1)], &graph).unwrap_err()),
        Refusal::OtherQueue
    ));
    // An unbound semaphore, and a signal already reached.
    let unbound = device.create_semaphore(0);
    assert!(matches!(
        refusal(queue.submit(&[], &[(&unbound, 1)], &graph).unwrap_err()),
        Refusal::UnboundSemaphore { .. }
    ));
    let high = device.create_semaphore(5);
    queue.bind(&high).unwrap();
    assert!(matches!(
        refusal(queue.submit(&[], &[(&high, 5)], &graph).unwrap_err()),
        Refusal::SignalNotAbove { .. }
    ));
}

#[test]
fn a_launch_the_device_refuses_fails_only_its_own_signals() {
    let (fake, device) = device("resident-launch-failure");
    let queue = open(&device, ResidentOptions::new("launch-failure"));
    let (cb, counter) = counter_graph(&device);
    let graph = queue.prepare(&cb).unwrap();
    let signals: Vec<_> = (0..3).map(|_| device.create_semaphore(0)).collect();
    for s in &signals {
        queue.bind(s).unwrap();
    }
    // The second device launch fails with cudaErrorLaunchFailure (719).
    fake.fail_calls(cuhal_fake_driver::resident::DEVICE_GRAPH_LAUNCH, 2, 1, 719);
    for s in &signals {
        queue.submit(&[], &[(s, 1)], &graph).unwrap();
    }
    wait(&signals[0], 1);
    wait(&signals[2], 1);
    let error = signals[1].wait(1, TIMEOUT).unwrap_err().to_string();
    assert!(
        error.contains("could not launch resident submission 1") && error.contains("719"),
        "{error}"
    );
    assert_eq!(read(&counter), 2);
    assert_eq!(queue.stats().failed, 1);
}

#[test]
fn many_threads_through_a_small_ring_lose_nothing() {
    let (_fake, device) = device("resident-many");
    let mut options = ResidentOptions::new("many");
    options.capacity = 8;
    let queue = open(&device, options);
    let work: Vec<_> = (0..4)
        .map(|_| {
            let (cb, counter) = counter_graph(&device);
            let graph = queue.prepare(&cb).unwrap();
            let semaphore = device.create_semaphore(0);
            queue.bind(&semaphore).unwrap();
            (graph, counter, semaphore)
        })
        .collect();
    std::thread::scope(|scope| {
        for (graph, _, semaphore) in &work {
            let queue = &queue;
            scope.spawn(move || {
                for value in 1..=300 {
                    queue.submit(&[], &[(semaphore, value)], graph).unwrap();
                }
            });
        }
    });
    for (_, counter, semaphore) in &work {
        wait(semaphore, 300);
        assert_eq!(read(counter), 300);
    }
    let stats = queue.shutdown();
    assert_eq!(
        (stats.submitted, stats.failed, stats.retained),
        (1200, 0, 0)
    );
}

/// Three threads submit chains to two resident queues and the normal queue, each submission
/// waiting on its own chain's last value and on a value another thread has already submitted
/// (so no queue's order can deadlock): without faults every value is reached and every graph
/// ran exactly as often as it was submitted; with device launches failing at random, each chain
/// reaches its end or fails, failures reach every submission that waits on them, and nothing
/// hangs.
#[test]
fn threads_across_two_resident_queues_and_a_normal_queue_lose_nothing() {
    use std::sync::atomic::{AtomicU64, Ordering};
    for faults in [false, true] {
        let (fake, device) = device(if faults {
            "resident-stress-faults"
        } else {
            "resident-stress"
        });
        let resident = [
            open(&device, ResidentOptions::new("stress-a")),
            open(&device, ResidentOptions::new("stress-b")),
        ];
        const THREADS: usize = 3;
        const STEPS: u64 = 150;
        let chains: Vec<_> = (0..THREADS).map(|_| device.create_semaphore(0)).collect();
        for queue in &resident {
            for chain in &chains {
                queue.bind(chain).unwrap();
            }
        }
        let submitted: Vec<AtomicU64> = (0..THREADS).map(|_| AtomicU64::new(0)).collect();
        let target = device.create_buffer(64).unwrap();
        // One graph and counter per thread and resident queue.
        let graphs: Vec<Vec<_>> = (0..THREADS)
            .map(|_| {
                resident
                    .iter()
                    .map(|queue| {
                        let (cb, counter) = counter_graph(&device);
                        (queue.prepare(&cb).unwrap(), counter)
                    })
                    .collect()
            })
            .collect();
        if faults {
            // The 7th device launch fails.
            fake.fail_calls(cuhal_fake_driver::resident::DEVICE_GRAPH_LAUNCH, 7, 1, 719);
        }
        let resident_runs: Vec<Vec<AtomicU64>> = (0..THREADS)
            .map(|_| (0..2).map(|_| AtomicU64::new(0)).collect())
            .collect();
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let (device, resident, chains, submitted, graphs, target, runs) = (
                    &device,
                    &resident,
                    &chains,
                    &submitted,
                    &graphs,
                    &target,
                    &resident_runs,
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
                                .fill(&waits, &signals, &target.whole(), FillPattern::U8(1))
                                .unwrap(),
                            q => {
                                let q = q as usize;
                                resident[q]
                                    .submit(&waits, &signals, &graphs[t][q].0)
                                    .unwrap();
                                runs[t][q].fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        submitted[t].store(step, Ordering::SeqCst);
                    }
                });
            }
        });
        let mut failed_chains = 0;
        for chain in &chains {
            match chain.wait(STEPS, TIMEOUT) {
                Ok(()) => {}
                Err(error) => {
                    assert!(faults, "a chain failed without faults: {error}");
                    assert!(error.to_string().contains("719"), "{error}");
                    failed_chains += 1;
                }
            }
        }
        for queue in &resident {
            let stats = queue.shutdown();
            assert_eq!(stats.retained, 0, "{stats:?}");
        }
        if faults {
            assert!(failed_chains > 0, "no fault reached a chain");
        } else {
            for (t, row) in graphs.iter().enumerate() {
                for (q, (_, counter)) in row.iter().enumerate() {
                    assert_eq!(
                        u64::from(read(counter)),
                        resident_runs[t][q].load(Ordering::SeqCst),
                        "thread {t}, resident queue {q}"
                    );
                }
            }
        }
    }
}
