//! The parts of one collective must agree across ranks (kind, element count, data type,
//! reduction, root, send/receive pairing): parts that disagree are refused with a typed error
//! naming the first disagreement, nothing reaches the queue or NCCL, no signal moves, and the
//! communicator goes on working. Submissions and recorded collectives alike.

mod fake_support;

use std::sync::Arc;

use cuhal::{
    Buffer, Collective, CollectiveCommandBuffers, CollectivePart, CommandBufferMode, Communicator,
    Device, Error, NcclDataType, NcclRedOp, PartField,
};
use cuhal_fake_driver::harness::FakeDriver;
use fake_support::{
    communicator, f32s, failure_of, join_as_processes, read, two_devices_with_nccl, upload, wait,
};

const F32: NcclDataType = NcclDataType::F32;
const SUM: NcclRedOp = NcclRedOp::Sum;

/// Two devices, a communicator over both, and four f32s on each ([1, 2, 3, 4] and
/// [10, 20, 30, 40]).
struct Two {
    fake: FakeDriver,
    devices: Vec<Device>,
    comm: Communicator,
    a: Arc<Buffer>,
    b: Arc<Buffer>,
}

fn two(tag: &str) -> Two {
    let (fake, devices, nccl) = two_devices_with_nccl(tag);
    let comm = communicator(&nccl, &devices);
    let (a, wa) = upload(&devices[0], &[1.0, 2.0, 3.0, 4.0]);
    let (b, wb) = upload(&devices[1], &[10.0, 20.0, 30.0, 40.0]);
    wait(&wa, 1);
    wait(&wb, 1);
    Two {
        fake,
        devices,
        comm,
        a,
        b,
    }
}

/// What [`Error::CollectiveMismatch`] says: `(rank, value, other_rank, other_value)`.
type Mismatch = (i32, PartField, i32, PartField);

fn mismatch_of(error: Error) -> Mismatch {
    match error {
        Error::CollectiveMismatch {
            rank,
            value,
            other_rank,
            other_value,
        } => (rank, value, other_rank, other_value),
        other => panic!("expected Error::CollectiveMismatch, got {other:?}"),
    }
}

/// Submits `parts`, each rank's signalling a semaphore of its own to 1, and expects the
/// refusal; checks that nothing reached the queue or NCCL, then that a correct all-reduce on
/// the same communicator runs and the refused signals still have not moved (nor failed).
fn refused(t: &Two, parts: [CollectivePart<'_>; 2]) -> Mismatch {
    let (d0, d1) = (
        t.devices[0].create_semaphore(0),
        t.devices[1].create_semaphore(0),
    );
    let (s0, s1) = ([(&d0, 1)], [(&d1, 1)]);
    let [p0, p1] = parts;
    let nccl_calls = |fake: &FakeDriver| fake.calls("ncclGroupStart") + fake.calls("ncclGroupEnd");
    let (calls, submitted) = (nccl_calls(&t.fake), t.comm.stats().submitted);
    let error = t
        .comm
        .submit(&[p0.signals(&s0), p1.signals(&s1)])
        .expect_err("parts that disagree are refused");
    let mismatch = mismatch_of(error);
    assert_eq!(
        t.comm.stats().submitted,
        submitted,
        "nothing reached the queue"
    );
    assert_eq!(nccl_calls(&t.fake), calls, "nothing reached NCCL");
    assert!(t.comm.failure().is_none(), "the communicator goes on");

    // A correct all-reduce afterwards runs.
    let contents = |(device, buffer): (&Device, &Arc<Buffer>)| {
        f32s(&read(device, device.queue(0), &buffer.whole()))
    };
    let before: Vec<Vec<f32>> = t.devices.iter().zip([&t.a, &t.b]).map(contents).collect();
    let sum: Vec<f32> = before[0]
        .iter()
        .zip(&before[1])
        .map(|(x, y)| x + y)
        .collect();
    let done = t.devices[0].create_semaphore(0);
    let signals = [(&done, 1)];
    t.comm
        .submit(&[
            CollectivePart::all_reduce(&t.a.whole(), &t.a.whole(), 4, F32, SUM).signals(&signals),
            CollectivePart::all_reduce(&t.b.whole(), &t.b.whole(), 4, F32, SUM),
        ])
        .unwrap();
    wait(&done, 1);
    for rank in t.devices.iter().zip([&t.a, &t.b]) {
        assert_eq!(contents(rank), sum);
    }
    for semaphore in [&d0, &d1] {
        assert_eq!(semaphore.query().unwrap(), 0, "a refused signal moved");
        assert!(!semaphore.has_failed(), "a refused signal failed");
    }
    mismatch
}

#[test]
fn an_all_reduce_of_f32_against_i32_is_refused() {
    let t = two("agree-dtype");
    let (a, b) = (t.a.whole(), t.b.whole());
    let mismatch = refused(
        &t,
        [
            CollectivePart::all_reduce(&a, &a, 4, F32, SUM),
            CollectivePart::all_reduce(&b, &b, 4, NcclDataType::I32, SUM),
        ],
    );
    assert_eq!(
        mismatch,
        (
            0,
            PartField::DataType(F32),
            1,
            PartField::DataType(NcclDataType::I32)
        )
    );
}

#[test]
fn sum_against_max_is_refused() {
    let t = two("agree-op");
    let (a, b) = (t.a.whole(), t.b.whole());
    let mismatch = refused(
        &t,
        [
            CollectivePart::all_reduce(&a, &a, 4, F32, SUM),
            CollectivePart::all_reduce(&b, &b, 4, F32, NcclRedOp::Max),
        ],
    );
    assert_eq!(
        mismatch,
        (0, PartField::Op(SUM), 1, PartField::Op(NcclRedOp::Max))
    );
}

#[test]
fn broadcast_from_root_0_against_root_1_is_refused() {
    let t = two("agree-root");
    let (a, b) = (t.a.whole(), t.b.whole());
    let mismatch = refused(
        &t,
        [
            CollectivePart::new(
                Collective::Broadcast { root: 0 },
                F32,
                4,
                Some(&a),
                Some(&a),
            ),
            CollectivePart::new(
                Collective::Broadcast { root: 1 },
                F32,
                4,
                Some(&b),
                Some(&b),
            ),
        ],
    );
    assert_eq!(mismatch, (0, PartField::Root(0), 1, PartField::Root(1)));
}

#[test]
fn element_counts_that_differ_are_refused() {
    let t = two("agree-count");
    let a = t.a.whole();
    let half = t.devices[1].create_buffer(8).unwrap().whole();
    let mismatch = refused(
        &t,
        [
            CollectivePart::all_reduce(&a, &a, 4, F32, SUM),
            CollectivePart::all_reduce(&half, &half, 2, F32, SUM),
        ],
    );
    assert_eq!(mismatch, (0, PartField::Count(4), 1, PartField::Count(2)));
}

#[test]
fn different_collectives_and_unpaired_sends_are_refused() {
    let t = two("agree-kind");
    let (a, b) = (t.a.whole(), t.b.whole());
    let broadcast = Collective::Broadcast { root: 0 };
    let mismatch = refused(
        &t,
        [
            CollectivePart::all_reduce(&a, &a, 4, F32, SUM),
            CollectivePart::new(broadcast, F32, 4, None, Some(&b)),
        ],
    );
    assert_eq!(
        mismatch,
        (
            0,
            PartField::Kind(Collective::AllReduce(SUM)),
            1,
            PartField::Kind(broadcast)
        )
    );
    // Two sends: neither receives the other's.
    let (to1, to0) = (Collective::Send { peer: 1 }, Collective::Send { peer: 0 });
    let mismatch = refused(
        &t,
        [
            CollectivePart::new(to1, F32, 4, Some(&a), None),
            CollectivePart::new(to0, F32, 4, Some(&b), None),
        ],
    );
    assert_eq!(mismatch, (0, PartField::Kind(to1), 1, PartField::Kind(to0)));
    // A send of four elements that its peer receives as two.
    let half = t.devices[1].create_buffer(8).unwrap().whole();
    let mismatch = refused(
        &t,
        [
            CollectivePart::new(to1, F32, 4, Some(&a), None),
            CollectivePart::new(Collective::Recv { peer: 0 }, F32, 2, None, Some(&half)),
        ],
    );
    assert_eq!(mismatch, (0, PartField::Count(4), 1, PartField::Count(2)));
}

#[test]
fn the_message_names_the_field_the_ranks_and_both_values() {
    let t = two("agree-message");
    let (a, b) = (t.a.whole(), t.b.whole());
    let error = t
        .comm
        .submit(&[
            CollectivePart::all_reduce(&a, &a, 4, F32, SUM),
            CollectivePart::all_reduce(&b, &b, 4, NcclDataType::I32, SUM),
        ])
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("data type: rank 0 has F32, rank 1 has I32"),
        "{text}"
    );
}

/// A collective recorded into a set of command buffers is checked the same way: the refused
/// one records nothing (no NCCL call), and the set records and runs a correct one afterwards.
#[test]
fn a_recorded_collective_whose_parts_disagree_is_refused() {
    for mode in [CommandBufferMode::Graph, CommandBufferMode::Deferred] {
        let t = two(&format!("agree-set-{mode:?}"));
        let (a, b) = (t.a.whole(), t.b.whole());
        let queues = [t.devices[0].queue(0), t.devices[1].queue(0)];
        let mut set = CollectiveCommandBuffers::new(&t.comm, &queues, mode).unwrap();
        let calls = t.fake.calls("ncclAllReduce");
        let error = set
            .collective(&[
                CollectivePart::all_reduce(&a, &a, 4, F32, SUM),
                CollectivePart::all_reduce(&b, &b, 4, F32, NcclRedOp::Max),
            ])
            .unwrap_err();
        assert_eq!(
            mismatch_of(error),
            (0, PartField::Op(SUM), 1, PartField::Op(NcclRedOp::Max)),
            "{mode:?}"
        );
        assert_eq!(t.fake.calls("ncclAllReduce"), calls, "{mode:?}");
        set.collective(&[
            CollectivePart::all_reduce(&a, &a, 4, F32, SUM),
            CollectivePart::all_reduce(&b, &b, 4, F32, SUM),
        ])
        .unwrap();
        set.end().unwrap();
        let done = t.devices[0].create_semaphore(0);
        t.comm.execute(&set, &[], &[(&done, 1)]).unwrap();
        wait(&done, 1);
        for (device, buffer) in t.devices.iter().zip([&t.a, &t.b]) {
            assert_eq!(
                f32s(&read(device, device.queue(0), &buffer.whole())),
                [11.0, 22.0, 33.0, 44.0],
                "{mode:?}"
            );
        }
    }
}

/// Ranks of two processes (joined by unique id) are out of the check's reach: each process's
/// one part agrees with itself. The fake NCCL refuses the round when the ranks meet, so such
/// a collective fails its signals with `ncclInvalidUsage` instead of computing garbage.
#[test]
fn ranks_of_two_processes_that_disagree_fail_in_nccl() {
    let (_fake, devices, nccl) = two_devices_with_nccl("agree-processes");
    let id = nccl.unique_id().unwrap();
    join_as_processes(&nccl, id, &devices, |rank, device, comm| {
        let (x, written) = upload(device, &[1.0; 4]);
        let done = device.create_semaphore(0);
        let (w, s) = ([(&written, 1)], [(&done, 1)]);
        let t = [F32, NcclDataType::I32][rank];
        comm.submit(&[
            CollectivePart::all_reduce(&x.whole(), &x.whole(), 4, t, SUM)
                .waits(&w)
                .signals(&s),
        ])
        .unwrap();
        let text = failure_of(&done, 1).to_string();
        assert!(text.contains("invalid usage"), "rank {rank}: {text}");
        assert_eq!(f32s(&read(device, device.queue(0), &x.whole())), [1.0; 4]);
    });
}

/// A send's local peer must receive from the sender, not from another rank.
#[test]
fn a_receive_from_another_rank_than_the_sender_is_refused() {
    let (fake, driver) = fake_support::load("agree-peer");
    fake.set_device_count(3);
    let devices = driver.open_all(cuhal::DeviceOptions::default()).unwrap();
    let nccl = cuhal::Nccl::load(Some(fake.path().to_path_buf())).unwrap();
    let comm = communicator(&nccl, &devices);
    let x: Vec<_> = devices
        .iter()
        .map(|d| d.create_buffer(16).unwrap().whole())
        .collect();
    let part = |collective, rank: usize| {
        let (send, recv) = match collective {
            Collective::Send { .. } => (Some(&x[rank]), None),
            _ => (None, Some(&x[rank])),
        };
        CollectivePart::new(collective, F32, 4, send, recv)
    };
    let error = comm
        .submit(&[
            part(Collective::Send { peer: 1 }, 0),
            part(Collective::Recv { peer: 2 }, 1),
            part(Collective::Send { peer: 1 }, 2),
        ])
        .unwrap_err();
    assert_eq!(
        mismatch_of(error),
        (0, PartField::Peer(1), 1, PartField::Peer(2))
    );
    assert_eq!(comm.stats().submitted, 0, "nothing reached the queue");
}
