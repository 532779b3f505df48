//! Collectives recorded into command buffers on the fake driver and its fake NCCL: a set of one
//! command buffer per device (graphs capture the collective, deferred buffers replay it in
//! lockstep), ordered between each rank's own commands, replayed many times from one thread
//! under a watchdog, and refused where it would be wrong.

mod fake_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cuhal::{
    Buffer, CollectiveCommandBuffers, CollectivePart, CommandBufferMode, Device, Error,
    FillPattern, NcclDataType, NcclRedOp,
};
use fake_support::{communicator, f32s, read, two_devices_with_nccl, wait};

const MODES: [CommandBufferMode; 2] = [CommandBufferMode::Graph, CommandBufferMode::Deferred];

/// Per rank: fill `x` with the rank's value, all-reduce (sum) `x` in place over both ranks,
/// copy `x` to `y`, all-reduce (max) `y` into `z`. The copy and the second collective see the
/// first's result only if every command runs in recording order on every rank.
#[test]
fn a_collective_between_each_ranks_commands_runs_in_recording_order() {
    for mode in MODES {
        let (fake, devices, nccl) = two_devices_with_nccl(&format!("set-order-{mode:?}"));
        let comm = communicator(&nccl, &devices);
        let n = 16;
        let buffers: Vec<_> = devices
            .iter()
            .map(|d| [0; 3].map(|_| d.create_buffer(n * 4).unwrap()))
            .collect();
        let queues: Vec<_> = devices.iter().map(|d| d.queue(0)).collect();
        let mut set = CollectiveCommandBuffers::new(&comm, &queues, mode).unwrap();
        for (rank, [x, _, _]) in buffers.iter().enumerate() {
            let cb = set.rank(rank).unwrap();
            let value = (rank as f32 + 1.0).to_bits();
            cb.fill(&x.whole(), FillPattern::U32(value)).unwrap();
            cb.barrier().unwrap();
        }
        // Every rank's all-reduce of its buffer `send` into its buffer `recv`.
        let all_reduce = |send: usize, recv: usize, op: NcclRedOp| -> Vec<_> {
            let f = NcclDataType::F32;
            buffers
                .iter()
                .map(|b| CollectivePart::all_reduce(&b[send].whole(), &b[recv].whole(), n, f, op))
                .collect()
        };
        set.collective(&all_reduce(0, 0, NcclRedOp::Sum)).unwrap();
        for (rank, [x, y, _]) in buffers.iter().enumerate() {
            let cb = set.rank(rank).unwrap();
            cb.barrier().unwrap();
            cb.copy(&x.whole(), &y.whole()).unwrap();
            cb.barrier().unwrap();
        }
        set.collective(&all_reduce(1, 2, NcclRedOp::Max)).unwrap();
        set.end().unwrap();
        assert_eq!(set.mode(), mode);
        let (calls, groups) = (fake.calls("ncclAllReduce"), fake.calls("ncclGroupEnd"));
        let done = devices[0].create_semaphore(0);
        for round in 1..=3u64 {
            comm.execute(&set, &[], &[(&done, round)]).unwrap();
            wait(&done, round);
            for (device, [x, y, z]) in devices.iter().zip(&buffers) {
                for (what, range) in [("x", x), ("y", y), ("z", z)] {
                    assert_eq!(
                        f32s(&read(device, device.queue(0), &range.whole())),
                        vec![3.0; n],
                        "{mode:?} round {round}: {what} on device {}",
                        device.info().ordinal
                    );
                }
            }
        }
        let (calls, groups) = (
            fake.calls("ncclAllReduce") - calls,
            fake.calls("ncclGroupEnd") - groups,
        );
        if mode == CommandBufferMode::Graph {
            // The collectives were captured when recorded (two ranks' calls, each in a group);
            // launches call no NCCL.
            assert_eq!((calls, groups), (0, 0), "{mode:?}");
        } else {
            // Replayed: two collectives of two ranks, three times, one group per collective.
            assert_eq!((calls, groups), (12, 6), "{mode:?}");
        }
    }
}

/// One 4-byte buffer on each of `devices`.
fn word_per_device(devices: &[Device]) -> Vec<Arc<Buffer>> {
    devices
        .iter()
        .map(|d| d.create_buffer(4).unwrap())
        .collect()
}

/// The design's guarantee: one thread submits thousands of replays of a set whose every
/// submission waits for the previous one's signal (each rank's graph launch blocks in the fake
/// until the other rank's is launched), and a watchdog fails the test if progress stops.
#[test]
fn thousands_of_replays_of_a_collective_set_never_deadlock() {
    for mode in MODES {
        let (_fake, devices, nccl) = two_devices_with_nccl(&format!("set-many-{mode:?}"));
        let comm = communicator(&nccl, &devices);
        let xs = word_per_device(&devices);
        let queues: Vec<_> = devices.iter().map(|d| d.queue(0)).collect();
        let mut set = CollectiveCommandBuffers::new(&comm, &queues, mode).unwrap();
        for (rank, x) in xs.iter().enumerate() {
            set.rank(rank)
                .unwrap()
                .fill(&x.whole(), FillPattern::U32(rank as u32 + 1))
                .unwrap();
        }
        let parts: Vec<_> = xs
            .iter()
            .map(|x| {
                CollectivePart::all_reduce(
                    &x.whole(),
                    &x.whole(),
                    1,
                    NcclDataType::I32,
                    NcclRedOp::Sum,
                )
            })
            .collect();
        set.collective(&parts).unwrap();
        set.end().unwrap();
        let done = devices[1].create_semaphore(0);
        let rounds = 2000u64;
        let progress = AtomicU64::new(0);
        let finished = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let mut last = (0, Instant::now());
                while !finished.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(50));
                    let now = progress.load(Ordering::Acquire);
                    if now != last.0 {
                        last = (now, Instant::now());
                    }
                    assert!(
                        last.1.elapsed() < Duration::from_secs(10),
                        "{mode:?}: no progress for 10 s at round {now}: deadlock"
                    );
                }
            });
            for i in 0..rounds {
                comm.execute(&set, &[(&done, i)], &[(&done, i + 1)])
                    .unwrap();
                progress.store(i, Ordering::Release);
            }
            wait(&done, rounds);
            finished.store(true, Ordering::Release);
        });
        for (device, x) in devices.iter().zip(&xs) {
            assert_eq!(
                read(device, device.queue(0), &x.whole()),
                3u32.to_le_bytes()
            );
        }
    }
}

#[test]
fn sets_are_checked_when_recorded_and_submitted() {
    let (_fake, devices, nccl) = two_devices_with_nccl("set-checks");
    let comm = communicator(&nccl, &devices);
    let other = communicator(&nccl, &devices);
    let a = devices[0].create_buffer(16).unwrap();
    let b = devices[1].create_buffer(16).unwrap();
    let f = NcclDataType::F32;
    // One queue per rank, each of its rank's device.
    assert!(matches!(
        CollectiveCommandBuffers::new(&comm, &[devices[0].queue(0)], CommandBufferMode::Graph),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        CollectiveCommandBuffers::new(
            &comm,
            &[devices[1].queue(0), devices[0].queue(0)],
            CommandBufferMode::Graph
        ),
        Err(Error::WrongDevice { .. })
    ));
    let queues = [devices[0].queue(0), devices[1].queue(0)];
    let mut set = CollectiveCommandBuffers::new(&comm, &queues, CommandBufferMode::Graph).unwrap();
    // Parts are checked as submissions' are: a buffer of the wrong device.
    let swapped = [
        CollectivePart::all_reduce(&b.whole(), &b.whole(), 4, f, NcclRedOp::Sum),
        CollectivePart::all_reduce(&a.whole(), &a.whole(), 4, f, NcclRedOp::Sum),
    ];
    assert!(matches!(
        set.collective(&swapped),
        Err(Error::WrongDevice { .. })
    ));
    // Waits and signals belong to submissions.
    let s = devices[0].create_semaphore(0);
    let signals = [(&s, 1)];
    let with_signal = [
        CollectivePart::all_reduce(&a.whole(), &a.whole(), 4, f, NcclRedOp::Sum).signals(&signals),
        CollectivePart::all_reduce(&b.whole(), &b.whole(), 4, f, NcclRedOp::Sum),
    ];
    assert!(matches!(
        set.collective(&with_signal),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(set.rank(2), Err(Error::InvalidArgument(_))));
    // Not ended yet.
    assert!(matches!(
        comm.execute(&set, &[], &[]),
        Err(Error::Command(_))
    ));
    let parts = [
        CollectivePart::all_reduce(&a.whole(), &a.whole(), 4, f, NcclRedOp::Sum),
        CollectivePart::all_reduce(&b.whole(), &b.whole(), 4, f, NcclRedOp::Sum),
    ];
    set.collective(&parts).unwrap();
    set.end().unwrap();
    assert!(matches!(set.rank(0), Err(Error::Command(_))));
    assert!(matches!(set.end(), Err(Error::Command(_))));
    // Another communicator's set.
    assert!(matches!(
        other.execute(&set, &[], &[]),
        Err(Error::InvalidArgument(_))
    ));
    comm.execute(&set, &[], &[(&s, 1)]).unwrap();
    wait(&s, 1);
}

/// A set outlives nothing it needs: dropping the communicator first keeps the NCCL state until
/// the set goes (NCCL destroys a communicator only after the graphs that captured it).
#[test]
fn a_set_keeps_its_communicator_alive() {
    let (fake, devices, nccl) = two_devices_with_nccl("set-lifetime");
    let comm = communicator(&nccl, &devices);
    let xs = word_per_device(&devices);
    let queues: Vec<_> = devices.iter().map(|d| d.queue(0)).collect();
    let mut set = CollectiveCommandBuffers::new(&comm, &queues, CommandBufferMode::Graph).unwrap();
    let parts: Vec<_> = xs
        .iter()
        .map(|x| {
            CollectivePart::all_reduce(&x.whole(), &x.whole(), 1, NcclDataType::I32, NcclRedOp::Sum)
        })
        .collect();
    set.collective(&parts).unwrap();
    set.end().unwrap();
    let done = devices[0].create_semaphore(0);
    comm.execute(&set, &[], &[(&done, 1)]).unwrap();
    wait(&done, 1);
    drop(comm);
    assert_eq!(fake.calls("ncclCommDestroy"), 0);
    drop(set);
    assert_eq!(fake.calls("ncclCommDestroy"), 2);
}
