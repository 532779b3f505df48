//! NCCL collectives on the fake driver and its fake NCCL (the same library, collectives done in
//! host memory): every collective as a queue operation, failures, a peer that never arrives,
//! ranks joined by unique id as two processes would, and many submissions under a watchdog.

mod fake_support;

use std::sync::{Arc, mpsc};
use std::time::Duration;

use cuhal::{
    Buffer, Collective, CollectivePart, Communicator, CommunicatorOptions, Device, Error, Failure,
    Nccl, NcclDataType, NcclRedOp, Semaphore,
};
use cuhal_fake_driver::harness::FakeDriver;
use fake_support::{
    TIMEOUT, communicator, f32s, failure_of, join_as_processes, read, two_devices_with_nccl,
    upload, wait,
};

fn setup(tag: &str) -> (FakeDriver, Vec<Device>, Nccl) {
    two_devices_with_nccl(tag)
}

/// Rank 0 of two on `devices[0]` with the caller's `timeout`, and rank 1 on `devices[1]` as a
/// peer with the default options (a second process's rank, in one process).
fn join_two_with_timeout(
    nccl: &Nccl,
    devices: &[Device],
    timeout: Duration,
) -> (Communicator, Communicator) {
    let id = nccl.unique_id().unwrap();
    let options = CommunicatorOptions {
        timeout,
        ..CommunicatorOptions::default()
    };
    std::thread::scope(|scope| {
        let peer = scope.spawn(|| {
            Communicator::join(
                nccl,
                id,
                2,
                &[(&devices[1], 1)],
                CommunicatorOptions::default(),
            )
            .unwrap()
        });
        let comm = Communicator::join(nccl, id, 2, &[(&devices[0], 0)], options).unwrap();
        (comm, peer.join().unwrap())
    })
}

/// Submits an all-reduce of `a` on `comm` signalling `done` to `value` from a thread of its own
/// (it blocks while its peer never arrives), checks that the submission returns, and gives the
/// failure `done` ends with.
fn all_reduce_failure(
    comm: &Communicator,
    a: &Arc<Buffer>,
    done: &Semaphore,
    value: u64,
) -> Failure {
    let s = [(done, value)];
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let r = comm.submit(&[CollectivePart::all_reduce(
                &a.whole(),
                &a.whole(),
                1,
                NcclDataType::F32,
                NcclRedOp::Sum,
            )
            .signals(&s)]);
            tx.send(r.is_ok()).unwrap();
        });
        assert!(rx.recv_timeout(TIMEOUT).unwrap(), "the submission returned");
        failure_of(done, value)
    })
}

#[test]
fn nccl_loads_from_an_explicit_path_and_reports_its_version() {
    let (fake, _devices, nccl) = setup("nccl-load");
    assert_eq!(nccl.version(), cuhal_fake_driver::nccl::VERSION);
    assert_eq!(nccl.library_path(), fake.path().display().to_string());
}

#[test]
fn without_nccl_a_typed_error_and_everything_else_works() {
    let (_fake, devices, _nccl) = setup("nccl-absent");
    let error = Nccl::load(Some("/nonexistent/libnccl.so.2".into())).unwrap_err();
    match &error {
        Error::Nccl(cuhal_sys::NcclError::NotFound { tried }) => {
            assert_eq!(tried[0].path, "/nonexistent/libnccl.so.2")
        }
        other => panic!("expected NcclError::NotFound, got {other:?}"),
    }
    // The devices do not care.
    let (buffer, written) = upload(&devices[0], &[1.0, 2.0]);
    wait(&written, 1);
    assert_eq!(
        f32s(&read(&devices[0], devices[0].queue(0), &buffer.whole())),
        [1.0, 2.0]
    );
}

#[test]
fn all_reduce_over_two_devices_as_one_submission_with_per_rank_waits_and_signals() {
    let (_fake, devices, nccl) = setup("nccl-allreduce");
    let comm = communicator(&nccl, &devices);
    assert_eq!(comm.ranks(), 2);
    assert_eq!(comm.local_ranks(), vec![0, 1]);
    let (a, wa) = upload(&devices[0], &[1.0, 2.0, 3.0, 4.0]);
    let (b, wb) = upload(&devices[1], &[10.0, 20.0, 30.0, 40.0]);
    let (d0, d1) = (
        devices[0].create_semaphore(0),
        devices[1].create_semaphore(0),
    );
    for op in [NcclRedOp::Sum, NcclRedOp::Max] {
        let round = if op == NcclRedOp::Sum { 1 } else { 2 };
        let w0 = [(&wa, round)];
        let w1 = [(&wb, round)];
        let s0 = [(&d0, round)];
        let s1 = [(&d1, round)];
        comm.submit(&[
            CollectivePart::all_reduce(&a.whole(), &a.whole(), 4, NcclDataType::F32, op)
                .waits(&w0)
                .signals(&s0),
            CollectivePart::all_reduce(&b.whole(), &b.whole(), 4, NcclDataType::F32, op)
                .waits(&w1)
                .signals(&s1),
        ])
        .unwrap();
        wait(&d0, round);
        wait(&d1, round);
        let expected = [11.0, 22.0, 33.0, 44.0];
        assert_eq!(
            f32s(&read(&devices[0], devices[0].queue(0), &a.whole())),
            expected
        );
        assert_eq!(
            f32s(&read(&devices[1], devices[1].queue(0), &b.whole())),
            expected
        );
        if round == 1 {
            // Arm the next round's waits.
            devices[0].queue(0).barrier(&[], &[(&wa, 2)]).unwrap();
            devices[1].queue(0).barrier(&[], &[(&wb, 2)]).unwrap();
        }
    }
}

#[test]
fn every_collective_kind_moves_the_right_bytes() {
    let (_fake, devices, nccl) = setup("nccl-kinds");
    let comm = communicator(&nccl, &devices);
    let run = |parts: [CollectivePart<'_>; 2]| {
        let done = devices[0].create_semaphore(0);
        let signals = [(&done, 1)];
        let [p0, p1] = parts;
        comm.submit(&[p0.signals(&signals), p1]).unwrap();
        wait(&done, 1);
    };
    let (x0, w0) = upload(&devices[0], &[1.0, 2.0]);
    let (x1, w1) = upload(&devices[1], &[3.0, 4.0]);
    wait(&w0, 1);
    wait(&w1, 1);
    let get = |d: usize, b: &std::sync::Arc<cuhal::Buffer>| {
        f32s(&read(&devices[d], devices[d].queue(0), &b.whole()))
    };
    // All-gather: [x0, x1] on both.
    let g0 = devices[0].create_buffer(16).unwrap();
    let g1 = devices[1].create_buffer(16).unwrap();
    let f = NcclDataType::F32;
    run([
        CollectivePart::new(
            Collective::AllGather,
            f,
            2,
            Some(&x0.whole()),
            Some(&g0.whole()),
        ),
        CollectivePart::new(
            Collective::AllGather,
            f,
            2,
            Some(&x1.whole()),
            Some(&g1.whole()),
        ),
    ]);
    assert_eq!(get(0, &g0), [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(get(1, &g1), [1.0, 2.0, 3.0, 4.0]);
    // Reduce-scatter of the gathered [1,2,3,4] + [1,2,3,4]: rank 0 gets [2,4], rank 1 [6,8].
    let r0 = devices[0].create_buffer(8).unwrap();
    let r1 = devices[1].create_buffer(8).unwrap();
    let rs = Collective::ReduceScatter(NcclRedOp::Sum);
    run([
        CollectivePart::new(rs, f, 2, Some(&g0.whole()), Some(&r0.whole())),
        CollectivePart::new(rs, f, 2, Some(&g1.whole()), Some(&r1.whole())),
    ]);
    assert_eq!(get(0, &r0), [2.0, 4.0]);
    assert_eq!(get(1, &r1), [6.0, 8.0]);
    // Broadcast from rank 1: x1 everywhere.
    let bc = Collective::Broadcast { root: 1 };
    run([
        CollectivePart::new(bc, f, 2, None, Some(&r0.whole())),
        CollectivePart::new(bc, f, 2, Some(&x1.whole()), Some(&r1.whole())),
    ]);
    assert_eq!(get(0, &r0), [3.0, 4.0]);
    // Reduce (product) to rank 0: x0 * x1.
    let red = Collective::Reduce {
        op: NcclRedOp::Prod,
        root: 0,
    };
    run([
        CollectivePart::new(red, f, 2, Some(&x0.whole()), Some(&r0.whole())),
        CollectivePart::new(red, f, 2, Some(&x1.whole()), None),
    ]);
    assert_eq!(get(0, &r0), [3.0, 8.0]);
    // Send from rank 0, receive on rank 1.
    run([
        CollectivePart::new(Collective::Send { peer: 1 }, f, 2, Some(&x0.whole()), None),
        CollectivePart::new(Collective::Recv { peer: 0 }, f, 2, None, Some(&r1.whole())),
    ]);
    assert_eq!(get(1, &r1), [1.0, 2.0]);
}

#[test]
fn parts_are_checked_at_submission() {
    let (_fake, devices, nccl) = setup("nccl-checks");
    let comm = communicator(&nccl, &devices);
    let a = devices[0].create_buffer(16).unwrap();
    let b = devices[1].create_buffer(16).unwrap();
    let f = NcclDataType::F32;
    let sum = NcclRedOp::Sum;
    // One part for two ranks.
    assert!(matches!(
        comm.submit(&[CollectivePart::all_reduce(
            &a.whole(),
            &a.whole(),
            4,
            f,
            sum
        )]),
        Err(Error::InvalidArgument(_))
    ));
    // A buffer of the other device.
    assert!(matches!(
        comm.submit(&[
            CollectivePart::all_reduce(&b.whole(), &b.whole(), 4, f, sum),
            CollectivePart::all_reduce(&b.whole(), &b.whole(), 4, f, sum),
        ]),
        Err(Error::WrongDevice { .. })
    ));
    // A length that does not match the count.
    assert!(matches!(
        comm.submit(&[
            CollectivePart::all_reduce(&a.whole(), &a.whole(), 3, f, sum),
            CollectivePart::all_reduce(&b.whole(), &b.whole(), 3, f, sum),
        ]),
        Err(Error::InvalidArgument(_))
    ));
    // A bad root and a bad peer.
    let bc = Collective::Broadcast { root: 2 };
    assert!(
        comm.submit(&[
            CollectivePart::new(bc, f, 4, Some(&a.whole()), Some(&a.whole())),
            CollectivePart::new(bc, f, 4, None, Some(&b.whole())),
        ])
        .is_err()
    );
    assert!(
        comm.submit(&[
            CollectivePart::new(Collective::Send { peer: 0 }, f, 4, Some(&a.whole()), None),
            CollectivePart::new(Collective::Recv { peer: 0 }, f, 4, None, Some(&b.whole())),
        ])
        .is_err()
    );
    assert_eq!(comm.stats().submitted, 0, "nothing reached the queue");
}

#[test]
fn a_nccl_error_fails_the_signals_with_nccls_message() {
    let (fake, devices, nccl) = setup("nccl-error");
    let comm = communicator(&nccl, &devices);
    let a = devices[0].create_buffer(16).unwrap();
    let b = devices[1].create_buffer(16).unwrap();
    let (d0, d1) = (
        devices[0].create_semaphore(0),
        devices[1].create_semaphore(0),
    );
    fake.fail("ncclAllReduce", 4);
    let (s0, s1) = ([(&d0, 1)], [(&d1, 1)]);
    let f = NcclDataType::F32;
    comm.submit(&[
        CollectivePart::all_reduce(&a.whole(), &a.whole(), 4, f, NcclRedOp::Sum).signals(&s0),
        CollectivePart::all_reduce(&b.whole(), &b.whole(), 4, f, NcclRedOp::Sum).signals(&s1),
    ])
    .unwrap();
    for semaphore in [&d0, &d1] {
        let failure = failure_of(semaphore, 1);
        let text = failure.to_string();
        assert!(
            text.contains("ncclAllReduce") && text.contains("invalid argument"),
            "{text}"
        );
    }
    fake.clear_faults();
    // The communicator is done for; later submissions say so, the devices do not care.
    assert!(comm.failure().is_some());
    assert!(matches!(
        comm.submit(&[
            CollectivePart::all_reduce(&a.whole(), &a.whole(), 4, f, NcclRedOp::Sum),
            CollectivePart::all_reduce(&b.whole(), &b.whole(), 4, f, NcclRedOp::Sum),
        ]),
        Err(Error::Lost(_))
    ));
    assert!(devices[0].lost().is_none() && devices[1].lost().is_none());
}

#[test]
fn an_asynchronous_error_fails_the_collective_with_nccls_message() {
    let (fake, devices, nccl) = setup("nccl-async");
    let comm = communicator(&nccl, &devices);
    let a = devices[0].create_buffer(4).unwrap();
    let b = devices[1].create_buffer(4).unwrap();
    let done = devices[0].create_semaphore(0);
    // ncclRemoteError from the communicator's background check.
    fake.fail("ncclCommGetAsyncError", 6);
    let s = [(&done, 1)];
    let f = NcclDataType::I32;
    comm.submit(&[
        CollectivePart::all_reduce(&a.whole(), &a.whole(), 1, f, NcclRedOp::Sum).signals(&s),
        CollectivePart::all_reduce(&b.whole(), &b.whole(), 1, f, NcclRedOp::Sum),
    ])
    .unwrap();
    // The completion side's poll fails the communicator. A host waiter that saw the
    // collective's completion event before that poll may have advanced `done`; then the error
    // fails what is submitted next. Either way it is NCCL's error, and nothing hangs.
    let says_nccl = |text: &str| {
        text.contains("ncclCommGetAsyncError") && text.contains("remote process exited")
    };
    match done.wait(1, TIMEOUT) {
        Err(cuhal_semaphore::Error::Failed(failure)) => {
            let text = failure.to_string();
            assert!(says_nccl(&text), "{text}");
        }
        Ok(()) => {}
        other => panic!("expected the collective to end, got {other:?}"),
    }
    let deadline = std::time::Instant::now() + TIMEOUT;
    let failure = loop {
        if let Some(failure) = comm.failure() {
            break failure;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the communicator never failed"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(says_nccl(&failure.to_string()), "{failure}");
    let next = [(&done, 2)];
    match comm.submit(&[
        CollectivePart::all_reduce(&a.whole(), &a.whole(), 1, f, NcclRedOp::Sum).signals(&next),
        CollectivePart::all_reduce(&b.whole(), &b.whole(), 1, f, NcclRedOp::Sum),
    ]) {
        Err(Error::Lost(failure)) => assert!(says_nccl(&failure.to_string()), "{failure}"),
        other => panic!("expected the next submission to fail, got {other:?}"),
    }
    fake.clear_faults();
}

/// The issuing path of a collective without device waits enters no rank's context (the
/// join's event records and stream wait take the stream's context): per submission it makes
/// the raw group's NCCL calls and the join's three driver calls, nothing more.
#[test]
fn a_collective_issues_without_context_switches() {
    let (fake, devices, nccl) = setup("nccl-lean-issue");
    let comm = communicator(&nccl, &devices);
    let a = devices[0].create_buffer(4).unwrap();
    let b = devices[1].create_buffer(4).unwrap();
    let done = devices[0].create_semaphore(0);
    let f = NcclDataType::I32;
    let submit = |value: u64| {
        let s = [(&done, value)];
        comm.submit(&[
            CollectivePart::all_reduce(&a.whole(), &a.whole(), 1, f, NcclRedOp::Sum).signals(&s),
            CollectivePart::all_reduce(&b.whole(), &b.whole(), 1, f, NcclRedOp::Sum),
        ])
        .unwrap();
    };
    // The first submission makes whatever is made once (the submitting thread's context).
    submit(1);
    wait(&done, 1);
    let calls = |name: &str| fake.calls(name);
    let switches = || calls("cuCtxPushCurrent") + calls("cuCtxSetCurrent");
    let (switched, records, waits, groups) = (
        switches(),
        calls("cuEventRecord"),
        calls("cuStreamWaitEvent"),
        calls("ncclGroupEnd"),
    );
    const N: u64 = 50;
    for value in 2..=N + 1 {
        submit(value);
    }
    wait(&done, N + 1);
    assert_eq!(calls("ncclGroupEnd") - groups, N);
    assert_eq!(
        switches() - switched,
        0,
        "context switches on the issuing path"
    );
    assert_eq!(calls("cuEventRecord") - records, 2 * N);
    assert_eq!(calls("cuStreamWaitEvent") - waits, N);
    // A driver that fails these calls outside the stream's context after all (here with
    // CUDA_ERROR_INVALID_HANDLE, 400) costs one call made again inside the context, not a
    // failure; from then on that rank enters its context for them, so no call fails again.
    let (pushed, records) = (calls("cuCtxPushCurrent"), calls("cuEventRecord"));
    fake.fail_calls("cuEventRecord", 1, 1, 400);
    submit(N + 2);
    wait(&done, N + 2);
    assert_eq!(calls("cuEventRecord") - records, 3);
    assert_eq!(calls("cuCtxPushCurrent") - pushed, 1);
    fake.clear_faults();
    let (pushed, records) = (calls("cuCtxPushCurrent"), calls("cuEventRecord"));
    submit(N + 3);
    wait(&done, N + 3);
    assert_eq!(calls("cuEventRecord") - records, 2);
    assert_eq!(
        calls("cuCtxPushCurrent") - pushed,
        1,
        "rank 1 enters its context"
    );
    fake.clear_faults();
}

#[test]
fn a_peer_that_never_arrives_is_aborted_after_the_timeout() {
    let (fake, devices, nccl) = setup("nccl-timeout");
    // Rank 0 of two; rank 1 (another process) joins but never submits.
    let (comm, _silent) = join_two_with_timeout(&nccl, &devices, Duration::from_millis(300));
    let a = devices[0].create_buffer(4).unwrap();
    let done = devices[0].create_semaphore(0);
    let started = std::time::Instant::now();
    let failure = all_reduce_failure(&comm, &a, &done, 1);
    match failure.downcast_ref::<Error>() {
        Some(Error::CollectiveTimeout { timeout, .. }) => {
            assert_eq!(*timeout, Duration::from_millis(300))
        }
        other => panic!("expected CollectiveTimeout, got {other:?} ({failure})"),
    }
    assert!(started.elapsed() < TIMEOUT);
    assert!(fake.calls("ncclCommAbort") >= 1);
    assert!(comm.failure().is_some());
    drop(comm);
}

/// The watchdog is woken only when it waits with no deadline; a group call that blocks after
/// earlier collectives (the watchdog then sleeping on an older deadline, or idle again) is
/// still aborted after the timeout.
#[test]
fn a_peer_that_stops_arriving_after_some_rounds_is_aborted_after_the_timeout() {
    let (fake, devices, nccl) = setup("nccl-timeout-later");
    let (comm, peer) = join_two_with_timeout(&nccl, &devices, Duration::from_millis(300));
    let a = devices[0].create_buffer(4).unwrap();
    let b = devices[1].create_buffer(4).unwrap();
    let f = NcclDataType::F32;
    let done = devices[0].create_semaphore(0);
    // Rounds both ranks take part in, some back to back, some with a pause between.
    for round in 1..=6u64 {
        std::thread::scope(|scope| {
            scope.spawn(|| {
                peer.submit(&[CollectivePart::all_reduce(
                    &b.whole(),
                    &b.whole(),
                    1,
                    f,
                    NcclRedOp::Sum,
                )])
                .unwrap()
            });
            let s = [(&done, round)];
            comm.submit(&[CollectivePart::all_reduce(
                &a.whole(),
                &a.whole(),
                1,
                f,
                NcclRedOp::Sum,
            )
            .signals(&s)])
                .unwrap();
        });
        done.wait(round, TIMEOUT).unwrap();
        if round % 2 == 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // Now the peer never arrives.
    let started = std::time::Instant::now();
    let failure = all_reduce_failure(&comm, &a, &done, 7);
    assert!(
        matches!(
            failure.downcast_ref::<Error>(),
            Some(Error::CollectiveTimeout { .. })
        ),
        "expected CollectiveTimeout, got {failure}"
    );
    assert!(started.elapsed() < TIMEOUT);
    assert!(fake.calls("ncclCommAbort") >= 1);
    drop(comm);
}

/// Joining waits for every rank (in the group's end, as NCCL does); a rank that never joins
/// aborts this process's ranks after the caller's timeout: a typed error, not a hang.
#[test]
fn a_join_whose_peer_never_arrives_fails_after_the_timeout() {
    let (fake, devices, nccl) = setup("nccl-join-timeout");
    let id = nccl.unique_id().unwrap();
    let timeout = Duration::from_millis(300);
    let options = CommunicatorOptions {
        timeout,
        ..CommunicatorOptions::default()
    };
    let started = std::time::Instant::now();
    let error = Communicator::join(&nccl, id, 2, &[(&devices[0], 0)], options).unwrap_err();
    assert!(
        matches!(error, Error::JoinTimeout { timeout: t } if t == timeout),
        "{error:?}"
    );
    assert!(error.to_string().contains("never"), "{error}");
    assert!(started.elapsed() >= timeout && started.elapsed() < TIMEOUT);
    assert_eq!(fake.calls("ncclCommAbort"), 1);
    // Two ranks of one process join at once (one group); a third of three never does.
    let id = nccl.unique_id().unwrap();
    let error = Communicator::join(&nccl, id, 3, &[(&devices[0], 0), (&devices[1], 1)], options)
        .unwrap_err();
    assert!(matches!(error, Error::JoinTimeout { .. }), "{error:?}");
    assert_eq!(fake.calls("ncclCommAbort"), 3);
    // Nothing was destroyed after the abort, and the devices still work.
    assert_eq!(fake.calls("ncclCommDestroy"), 0);
    let comm = communicator(&nccl, &devices);
    assert_eq!(comm.ranks(), 2);
}

#[test]
fn ranks_joined_by_unique_id_work_like_two_processes() {
    let (_fake, devices, nccl) = setup("nccl-join");
    let id = nccl.unique_id().unwrap();
    // What a second process would receive from the first.
    let id = cuhal::UniqueId::from_bytes(id.to_bytes());
    join_as_processes(&nccl, id, &devices, |rank, device, comm| {
        let value = (rank + 1) as f32;
        let (x, written) = upload(device, &[value; 8]);
        let done = device.create_semaphore(0);
        let (w, s) = ([(&written, 1)], [(&done, 1)]);
        comm.submit(&[CollectivePart::all_reduce(
            &x.whole(),
            &x.whole(),
            8,
            NcclDataType::F32,
            NcclRedOp::Sum,
        )
        .waits(&w)
        .signals(&s)])
            .unwrap();
        wait(&done, 1);
        assert_eq!(f32s(&read(device, device.queue(0), &x.whole())), [3.0; 8]);
    });
}

/// The design's guarantee on the fake, whose collectives block like spinning GPU kernels until
/// every rank posted: one thread submitting thousands of all-reduces over two devices, each
/// behind the previous one's signals, never deadlocks (a watchdog fails the test if progress
/// stops for 10 s).
#[test]
fn thousands_of_all_reduces_from_one_thread_never_deadlock() {
    let (_fake, devices, nccl) = setup("nccl-many");
    let comm = communicator(&nccl, &devices);
    let a = devices[0].create_buffer(4).unwrap();
    let b = devices[1].create_buffer(4).unwrap();
    let (d0, d1) = (
        devices[0].create_semaphore(0),
        devices[1].create_semaphore(0),
    );
    let rounds = 2000u64;
    let progress = std::sync::atomic::AtomicU64::new(0);
    let finished = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut last = (0, std::time::Instant::now());
            while !finished.load(std::sync::atomic::Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(50));
                let now = progress.load(std::sync::atomic::Ordering::Acquire);
                if now != last.0 {
                    last = (now, std::time::Instant::now());
                }
                assert!(
                    last.1.elapsed() < Duration::from_secs(10),
                    "no progress for 10 s at round {now}: deadlock"
                );
            }
        });
        let f = NcclDataType::I32;
        for i in 0..rounds {
            let (w0, w1) = ([(&d0, i)], [(&d1, i)]);
            let (s0, s1) = ([(&d0, i + 1)], [(&d1, i + 1)]);
            comm.submit(&[
                CollectivePart::all_reduce(&a.whole(), &a.whole(), 1, f, NcclRedOp::Max)
                    .waits(&w1)
                    .signals(&s0),
                CollectivePart::all_reduce(&b.whole(), &b.whole(), 1, f, NcclRedOp::Max)
                    .waits(&w0)
                    .signals(&s1),
            ])
            .unwrap();
            progress.store(i, std::sync::atomic::Ordering::Release);
        }
        wait(&d0, rounds);
        wait(&d1, rounds);
        finished.store(true, std::sync::atomic::Ordering::Release);
    });
}

/// A collective's buffers must be memory: a slot range (an offset, bound to nothing) is refused,
/// and so is an allocation `dealloca` released; one still allocated is held until the collective
/// completes, so a `dealloca` meanwhile leaves the free to it.
#[test]
fn collective_buffers_are_checked_and_held_like_queue_operations() {
    use cuhal::{CollectivePart, NcclDataType, NcclRedOp};
    let (fake, devices, nccl) = two_devices_with_nccl("collective-buffers");
    let comm = communicator(&nccl, &devices);
    let plain = [
        devices[0].create_buffer(4).unwrap(),
        devices[1].create_buffer(4).unwrap(),
    ];
    let sum = |range: &cuhal::BufferRange| {
        CollectivePart::all_reduce(range, range, 1, NcclDataType::F32, NcclRedOp::Sum)
    };
    let slot = cuhal::BufferRange::slot(0, 0, 4).unwrap();
    let error = comm
        .submit(&[sum(&slot), sum(&plain[1].whole())])
        .unwrap_err();
    assert!(
        matches!(
            error,
            cuhal::Error::Command(cuhal_command::Error::Binding(
                cuhal_command::BindingError::SlotRangeNotBound { .. }
            ))
        ),
        "{error:?}"
    );

    let q = devices[0].queue(0);
    let s = devices[0].create_semaphore(0);
    let gone = q.alloca(&[], &[(&s, 1)], 4).unwrap();
    wait(&s, 1);
    q.dealloca(&[], &[(&s, 2)], &gone).unwrap();
    wait(&s, 2);
    let error = comm
        .submit(&[sum(&gone.whole()), sum(&plain[1].whole())])
        .unwrap_err();
    assert!(
        matches!(error, cuhal::Error::Deallocated { .. }),
        "{error:?}"
    );
    assert!(
        comm.failure().is_none(),
        "a refused submission loses nothing"
    );

    // Held while queued: the collective waits on a gate, the dealloca goes first.
    let kept = q.alloca(&[], &[(&s, 3)], 4).unwrap();
    wait(&s, 3);
    let allocated = fake_support::live(&fake).device_allocations;
    let (gate, done) = (
        devices[0].create_semaphore(0),
        devices[0].create_semaphore(0),
    );
    let (waits, signals) = ([(&gate, 1)], [(&done, 1)]);
    let mut first = sum(&kept.whole());
    first.waits = &waits;
    first.signals = &signals;
    comm.submit(&[first, sum(&plain[1].whole())]).unwrap();
    q.dealloca(&[], &[(&s, 4)], &kept).unwrap();
    wait(&s, 4);
    assert_eq!(
        fake_support::live(&fake).device_allocations,
        allocated,
        "freed under a queued collective"
    );
    gate.signal(1).unwrap();
    wait(&done, 1);
}

/// The group rule (`collective::group`): the per-rank calls stop at the first that fails, the
/// group is ended all the same, once, and the failure is that call's.
#[test]
fn a_failed_rank_call_stops_the_group_which_is_still_ended() {
    use cuhal_sys::nccl_name;
    let (fake, devices, nccl) = setup("nccl-group-rule");
    let comm = communicator(&nccl, &devices);
    let a = devices[0].create_buffer(16).unwrap();
    let b = devices[1].create_buffer(16).unwrap();
    let done = devices[0].create_semaphore(0);
    let calls = |name| fake.calls(name);
    let before = [
        calls(nccl_name!(ncclGroupStart)),
        calls(nccl_name!(ncclGroupEnd)),
        calls(nccl_name!(ncclAllReduce)),
    ];
    fake.fail(nccl_name!(ncclAllReduce), 4);
    let s = [(&done, 1)];
    let f = NcclDataType::F32;
    comm.submit(&[
        CollectivePart::all_reduce(&a.whole(), &a.whole(), 4, f, NcclRedOp::Sum).signals(&s),
        CollectivePart::all_reduce(&b.whole(), &b.whole(), 4, f, NcclRedOp::Sum),
    ])
    .unwrap();
    let failure = failure_of(&done, 1).to_string();
    fake.clear_faults();
    assert!(failure.contains(nccl_name!(ncclAllReduce)), "{failure}");
    let after = [
        calls(nccl_name!(ncclGroupStart)),
        calls(nccl_name!(ncclGroupEnd)),
        calls(nccl_name!(ncclAllReduce)),
    ];
    assert_eq!(after[0] - before[0], 1, "one group started");
    assert_eq!(after[1] - before[1], 1, "and ended, after the failed call");
    assert_eq!(
        after[2] - before[2],
        1,
        "rank 1's call is not made after rank 0's failed"
    );
}

/// The join's group follows the same rule: a failed `ncclCommInitRank` stops the ranks' inits,
/// the group is ended, and the join fails with that call's error.
#[test]
fn a_failed_init_stops_the_join_whose_group_is_still_ended() {
    use cuhal_sys::nccl_name;
    let (fake, devices, nccl) = setup("nccl-join-rule");
    let before = [
        fake.calls(nccl_name!(ncclGroupEnd)),
        fake.calls(nccl_name!(ncclCommInitRank)),
    ];
    fake.fail(nccl_name!(ncclCommInitRank), 4);
    let error = Communicator::local(
        &nccl,
        &[&devices[0], &devices[1]],
        CommunicatorOptions::default(),
    )
    .unwrap_err();
    fake.clear_faults();
    assert!(
        matches!(&error, Error::Nccl(cuhal_sys::NcclError::Call { call, .. })
            if *call == nccl_name!(ncclCommInitRank)),
        "{error:?}"
    );
    assert_eq!(fake.calls(nccl_name!(ncclGroupEnd)) - before[0], 1);
    assert_eq!(fake.calls(nccl_name!(ncclCommInitRank)) - before[1], 1);
    // Nothing was left half-made: a communicator joins afterwards.
    communicator(&nccl, &devices);
}
