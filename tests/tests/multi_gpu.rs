//! GPU suite: several GPUs in one process (and two processes). Every test needs two GPUs and
//! reports itself skipped (`cuhal_gpu_tests::skip`, counted as skipped by the bundle's `run`) on
//! a machine with fewer; the NCCL tests also need
//! NCCL (`CUHAL_NCCL_LIBRARY` or `libnccl.so.2` on the loader's path) and set
//! `NCCL_NVLS_ENABLE=0` (NVLink multicast off) before NCCL is loaded.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cuhal::{
    Collective, CollectivePart, Communicator, CommunicatorOptions, Device, DeviceOptions, Driver,
    FillPattern, Nccl, NcclDataType, NcclRedOp, Semaphore, UniqueId,
};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The first two devices, or `None` (after saying so) with fewer than two.
fn two_gpus() -> Option<(Driver, Vec<Device>)> {
    let driver = Driver::load().expect("the CUDA driver loads");
    let count = driver.devices().expect("devices").len();
    if count < 2 {
        cuhal_gpu_tests::skip::skip(&format!("needs 2 GPUs ({count} found)"));
        return None;
    }
    let devices = driver
        .open_many(&[0, 1], DeviceOptions::default())
        .expect("opening GPUs 0 and 1");
    Some((driver, devices))
}

/// NCCL, with NVLink multicast off (set before NCCL reads its environment).
fn nccl() -> Nccl {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: set once, before NCCL is loaded, and read only by NCCL (through libc) after
        // this; no other thread of the suite writes the environment.
        unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    });
    let nccl = Nccl::load(None).expect("NCCL loads (set CUHAL_NCCL_LIBRARY)");
    println!(
        "NCCL {} ({})",
        cuhal_sys::format_nccl_version(nccl.version()),
        nccl.library_path()
    );
    nccl
}

/// A communicator over GPUs 0 and 1 of `devices`, default options: the setup of every
/// one-process NCCL test.
fn communicator(nccl: &Nccl, devices: &[Device]) -> Communicator {
    Communicator::local(
        nccl,
        &[&devices[0], &devices[1]],
        CommunicatorOptions::default(),
    )
    .expect("a communicator over GPUs 0 and 1")
}

fn wait(semaphore: &Semaphore, value: u64) {
    semaphore
        .wait(value, TIMEOUT)
        .unwrap_or_else(|e| panic!("waiting for {value}: {e}"));
}

fn read(device: &Device, range: &cuhal::BufferRange) -> Vec<u8> {
    let host = device.create_host_buffer(range.len()).unwrap();
    let done = device.create_semaphore(0);
    device
        .queue(0)
        .read(&[], &[(&done, 1)], range, &host, 0)
        .unwrap();
    wait(&done, 1);
    let mut bytes = vec![0; range.len()];
    host.read(0, &mut bytes).unwrap();
    bytes
}

fn f32_bytes(values: impl Iterator<Item = f32>) -> Vec<u8> {
    values.flat_map(f32::to_le_bytes).collect()
}

#[test]
#[ignore = "needs two CUDA GPUs (cargo xtask gpu-test)"]
fn multi_gpu_topology_and_peer_access() {
    let Some((driver, devices)) = two_gpus() else {
        return;
    };
    let links = driver.topology().unwrap();
    for link in &links {
        println!(
            "{} -> {}: access {}, {}, rank {}",
            link.source,
            link.destination,
            link.access,
            link.kind().name(),
            link.performance_rank
        );
        if link.source < 2 && link.destination < 2 {
            assert_eq!(
                devices[link.source as usize].has_peer_access(link.destination),
                link.access,
                "peer access enabled exactly where the driver allows it"
            );
        }
    }
}

#[test]
#[ignore = "needs two CUDA GPUs (cargo xtask gpu-test)"]
fn multi_gpu_cross_device_wait_is_a_device_wait() {
    let Some((_driver, devices)) = two_gpus() else {
        return;
    };
    let (gpu0, gpu1) = (&devices[0], &devices[1]);
    let len = 16 << 20;
    let source = gpu0.create_buffer(len).unwrap();
    let target = gpu1.create_buffer(len).unwrap();
    for round in 1..=20u64 {
        let filled = gpu0.create_semaphore(0);
        let copied = gpu1.create_semaphore(0);
        // GPU 1's queue waits for GPU 0's fill on the device: submitted at once, issued at once
        // (the fill's completion event is recorded), ordered by cuStreamWaitEvent alone.
        gpu0.queue(0)
            .fill(
                &[],
                &[(&filled, 1)],
                &source.whole(),
                FillPattern::U32(round as u32),
            )
            .unwrap();
        gpu1.queue(0)
            .copy_peer(
                &[(&filled, 1)],
                &[(&copied, 1)],
                &source.whole(),
                &target.whole(),
            )
            .unwrap();
        wait(&copied, 1);
        let bytes = read(gpu1, &target.whole());
        assert!(
            bytes.chunks(4).all(|c| c == (round as u32).to_le_bytes()),
            "round {round}: the copy ran before the fill"
        );
    }
}

#[test]
#[ignore = "needs two CUDA GPUs (cargo xtask gpu-test)"]
fn multi_gpu_peer_copies_as_queue_operations_and_commands() {
    let Some((_driver, devices)) = two_gpus() else {
        return;
    };
    let (gpu0, gpu1) = (&devices[0], &devices[1]);
    let len = 64 << 20;
    let a = gpu0.create_buffer(len).unwrap();
    let b = gpu1.create_buffer(len).unwrap();
    let back = gpu0.create_buffer(len).unwrap();
    let done = gpu0.create_semaphore(0);
    gpu0.queue(0)
        .fill(
            &[],
            &[(&done, 1)],
            &a.whole(),
            FillPattern::U32(0xa5a5_0001),
        )
        .unwrap();
    gpu1.queue(0)
        .copy_peer(&[(&done, 1)], &[(&done, 2)], &a.whole(), &b.whole())
        .unwrap();
    wait(&done, 2);
    assert!(
        read(gpu1, &b.whole())
            .chunks(4)
            .all(|c| c == 0xa5a5_0001u32.to_le_bytes())
    );
    let mut cb = gpu0.queue(0).create_command_buffer().unwrap();
    cb.fill(&b.whole(), FillPattern::U32(7)).unwrap_err(); // another device's buffer
    cb.copy_peer(&b.whole(), &back.whole()).unwrap();
    let cb: Arc<dyn cuhal::CommandBuffer> = cb.end().unwrap();
    gpu0.queue(0).execute(&[], &[(&done, 3)], &[&cb]).unwrap();
    wait(&done, 3);
    assert!(
        read(gpu0, &back.whole())
            .chunks(4)
            .all(|c| c == 0xa5a5_0001u32.to_le_bytes())
    );
}

#[test]
#[ignore = "needs two CUDA GPUs (cargo xtask gpu-test)"]
fn multi_gpu_nccl_collectives_bit_exact() {
    let Some((_driver, devices)) = two_gpus() else {
        return;
    };
    let nccl = nccl();
    let comm = communicator(&nccl, &devices);
    let n = 1 << 20;
    let f = NcclDataType::F32;
    // Integer-valued floats: every sum is exact, so results compare bit for bit.
    let values = |rank: usize| (0..n).map(move |i| ((i % 1000) + rank * 7) as f32);
    let bufs: Vec<_> = (0..2)
        .map(|r| {
            let x = devices[r].create_buffer(n * 4).unwrap();
            let done = devices[r].create_semaphore(0);
            devices[r]
                .queue(0)
                .write(&[], &[(&done, 1)], &x.whole(), &f32_bytes(values(r)))
                .unwrap();
            (x, done)
        })
        .collect();
    let out: Vec<_> = (0..2)
        .map(|r| devices[r].create_buffer(2 * n * 4).unwrap())
        .collect();
    let done = devices[0].create_semaphore(0);
    let (w0, w1, s) = ([(&bufs[0].1, 1)], [(&bufs[1].1, 1)], [(&done, 1)]);
    comm.submit(&[
        CollectivePart::new(
            Collective::AllReduce(NcclRedOp::Sum),
            f,
            n,
            Some(&bufs[0].0.whole()),
            Some(&out[0].range(0, n * 4).unwrap()),
        )
        .waits(&w0)
        .signals(&s),
        CollectivePart::new(
            Collective::AllReduce(NcclRedOp::Sum),
            f,
            n,
            Some(&bufs[1].0.whole()),
            Some(&out[1].range(0, n * 4).unwrap()),
        )
        .waits(&w1),
    ])
    .unwrap();
    wait(&done, 1);
    let expected = f32_bytes((0..n).map(|i| ((i % 1000) * 2 + 7) as f32));
    for r in 0..2 {
        assert_eq!(
            read(&devices[r], &out[r].range(0, n * 4).unwrap()),
            expected,
            "all-reduce on rank {r}"
        );
    }
    // All-gather: rank 0's values then rank 1's, on both.
    let s = [(&done, 2)];
    comm.submit(&[
        CollectivePart::new(
            Collective::AllGather,
            f,
            n,
            Some(&bufs[0].0.whole()),
            Some(&out[0].whole()),
        )
        .signals(&s),
        CollectivePart::new(
            Collective::AllGather,
            f,
            n,
            Some(&bufs[1].0.whole()),
            Some(&out[1].whole()),
        ),
    ])
    .unwrap();
    wait(&done, 2);
    let gathered: Vec<u8> = f32_bytes(values(0).chain(values(1)));
    for r in 0..2 {
        assert_eq!(
            read(&devices[r], &out[r].whole()),
            gathered,
            "all-gather on rank {r}"
        );
    }
    // Send/recv: rank 1's values to rank 0.
    let s = [(&done, 3)];
    comm.submit(&[
        CollectivePart::new(
            Collective::Recv { peer: 1 },
            f,
            n,
            None,
            Some(&out[0].range(0, n * 4).unwrap()),
        )
        .signals(&s),
        CollectivePart::new(
            Collective::Send { peer: 0 },
            f,
            n,
            Some(&bufs[1].0.whole()),
            None,
        ),
    ])
    .unwrap();
    wait(&done, 3);
    assert_eq!(
        read(&devices[0], &out[0].range(0, n * 4).unwrap()),
        f32_bytes(values(1))
    );
}

/// The issuing path enters no rank's context for the join (its event records and stream wait
/// take the stream's context): all-reduces submitted from a thread with no current context,
/// with GPU 1's and with GPU 0's complete, and work on GPU 1 that waits for the collective's
/// signal on the device (its only signal is rank 0's) reads rank 1's result: the signal's event
/// follows every rank's part.
#[test]
#[ignore = "needs two CUDA GPUs (cargo xtask gpu-test)"]
fn multi_gpu_collectives_from_any_current_context_join_every_rank() {
    let Some((_driver, devices)) = two_gpus() else {
        return;
    };
    let nccl = nccl();
    let comm = communicator(&nccl, &devices);
    let n = 4 << 20;
    let f = NcclDataType::F32;
    let bufs: Vec<_> = (0..2)
        .map(|r| {
            let x = devices[r].create_buffer(n * 4).unwrap();
            let filled = devices[r].create_semaphore(0);
            devices[r]
                .queue(0)
                .fill(
                    &[],
                    &[(&filled, 1)],
                    &x.whole(),
                    FillPattern::U32(((r + 1) as f32).to_bits()),
                )
                .unwrap();
            wait(&filled, 1);
            x
        })
        .collect();
    let done = devices[0].create_semaphore(0);
    let read_done = devices[1].create_semaphore(0);
    let host = devices[1].create_host_buffer(n * 4).unwrap();
    // 1 + 2, then doubled by every round (exact in f32).
    let mut expected = 3.0f32;
    for (round, current) in [None, Some(1), Some(0)].into_iter().enumerate() {
        let value = round as u64 + 1;
        std::thread::scope(|scope| {
            scope.spawn(|| {
                // A fresh thread has no current context; otherwise make one GPU's current.
                if let Some(d) = current {
                    devices[d].context().bind().unwrap();
                }
                let s = [(&done, value)];
                comm.submit(&[
                    CollectivePart::all_reduce(
                        &bufs[0].whole(),
                        &bufs[0].whole(),
                        n,
                        f,
                        NcclRedOp::Sum,
                    )
                    .signals(&s),
                    CollectivePart::all_reduce(
                        &bufs[1].whole(),
                        &bufs[1].whole(),
                        n,
                        f,
                        NcclRedOp::Sum,
                    ),
                ])
                .unwrap();
                // Rank 1's result, read on GPU 1 behind a device wait for the signal.
                devices[1]
                    .queue(0)
                    .read(
                        &[(&done, value)],
                        &[(&read_done, value)],
                        &bufs[1].whole(),
                        &host,
                        0,
                    )
                    .unwrap();
            });
        });
        wait(&read_done, value);
        let mut bytes = vec![0u8; n * 4];
        host.read(0, &mut bytes).unwrap();
        let want = f32_bytes(std::iter::repeat_n(expected, n));
        assert!(
            bytes == want,
            "round {round} (current context: {current:?}): rank 1's buffer is not the all-reduce's result"
        );
        expected *= 2.0;
    }
}

/// 10,000 dependent all-reduces over both GPUs submitted from one thread; a watchdog ends the
/// process (a failure, not a hang) if no progress is seen for 60 s.
#[test]
#[ignore = "needs two CUDA GPUs (cargo xtask gpu-test)"]
fn multi_gpu_ten_thousand_all_reduces_never_deadlock() {
    let Some((_driver, devices)) = two_gpus() else {
        return;
    };
    let nccl = nccl();
    let comm = communicator(&nccl, &devices);
    let a = devices[0].create_buffer(8).unwrap();
    let b = devices[1].create_buffer(8).unwrap();
    let (d0, d1) = (
        devices[0].create_semaphore(0),
        devices[1].create_semaphore(0),
    );
    let progress = Arc::new(AtomicU64::new(0));
    let watched = progress.clone();
    std::thread::spawn(move || {
        let mut last = (0, Instant::now());
        loop {
            std::thread::sleep(Duration::from_millis(200));
            let now = watched.load(Ordering::Acquire);
            if now == u64::MAX {
                return;
            }
            if now != last.0 {
                last = (now, Instant::now());
            } else if last.1.elapsed() > TIMEOUT {
                eprintln!("watchdog: no progress for {TIMEOUT:?} at step {now}: deadlock");
                std::process::exit(101);
            }
        }
    });
    let rounds = 10_000u64;
    let f = NcclDataType::F32;
    let started = Instant::now();
    for i in 0..rounds {
        let (w0, w1, s0, s1) = ([(&d1, i)], [(&d0, i)], [(&d0, i + 1)], [(&d1, i + 1)]);
        comm.submit(&[
            CollectivePart::all_reduce(&a.whole(), &a.whole(), 2, f, NcclRedOp::Sum)
                .waits(&w0)
                .signals(&s0),
            CollectivePart::all_reduce(&b.whole(), &b.whole(), 2, f, NcclRedOp::Sum)
                .waits(&w1)
                .signals(&s1),
        ])
        .unwrap();
        if i % 64 == 0 {
            d0.wait(i.saturating_sub(128), TIMEOUT).unwrap();
        }
        progress.store(i + 1, Ordering::Release);
    }
    wait(&d0, rounds);
    wait(&d1, rounds);
    progress.store(u64::MAX, Ordering::Release);
    println!("{rounds} all-reduces in {:?}", started.elapsed());
}

const RANK_ENV: &str = "CUHAL_MULTI_GPU_RANK";
const ID_ENV: &str = "CUHAL_MULTI_GPU_NCCL_ID";

/// Two processes, one GPU each, one communicator: the parent makes the unique id and passes it
/// to both children (as hex in the environment), as a multi-host launcher would.
#[test]
#[ignore = "needs two CUDA GPUs (cargo xtask gpu-test)"]
fn multi_gpu_two_processes_all_reduce() {
    if let Ok(rank) = std::env::var(RANK_ENV) {
        return two_process_child(rank.parse().unwrap());
    }
    let Some((_driver, devices)) = two_gpus() else {
        return;
    };
    drop(devices);
    let id = nccl().unique_id().unwrap();
    let hex: String = id.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let children: Vec<_> = (0..2)
        .map(|rank| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "multi_gpu_two_processes_all_reduce",
                    "--ignored",
                    "--nocapture",
                ])
                .env(RANK_ENV, rank.to_string())
                .env(ID_ENV, &hex)
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    for mut child in children {
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "a rank failed: {status}");
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("a rank did not finish in 120 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn two_process_child(rank: usize) {
    let hex = std::env::var(ID_ENV).unwrap();
    let mut bytes = [0u8; 128];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    let driver = Driver::load().unwrap();
    let device = driver.open(rank as i32, DeviceOptions::default()).unwrap();
    let comm = Communicator::join(
        &nccl(),
        UniqueId::from_bytes(bytes),
        2,
        &[(&device, rank as i32)],
        CommunicatorOptions {
            timeout: Duration::from_secs(60),
            ..CommunicatorOptions::default()
        },
    )
    .unwrap();
    let n = 1 << 16;
    let x = device.create_buffer(n * 4).unwrap();
    let done = device.create_semaphore(0);
    device
        .queue(0)
        .write(
            &[],
            &[(&done, 1)],
            &x.whole(),
            &f32_bytes((0..n).map(|i| (i + rank) as f32)),
        )
        .unwrap();
    let (w, s) = ([(&done, 1)], [(&done, 2)]);
    comm.submit(&[CollectivePart::all_reduce(
        &x.whole(),
        &x.whole(),
        n,
        NcclDataType::F32,
        NcclRedOp::Sum,
    )
    .waits(&w)
    .signals(&s)])
        .unwrap();
    wait(&done, 2);
    assert_eq!(
        read(&device, &x.whole()),
        f32_bytes((0..n).map(|i| (2 * i + 1) as f32))
    );
    println!("rank {rank}: all-reduce across processes matched");
}

/// Records into a set of one command buffer per GPU: fill `x` with the rank's value, all-reduce
/// (sum) `x` into `y`, copy `y` to `w`, all-reduce (max) `w` into `z`. Every result is 3.0 when
/// each rank's commands and collectives run in recording order.
fn record_collective_set(
    comm: &Communicator,
    devices: &[Device],
    mode: cuhal::CommandBufferMode,
    n: usize,
) -> (
    cuhal::CollectiveCommandBuffers,
    Vec<[Arc<cuhal::Buffer>; 4]>,
) {
    let bufs: Vec<[Arc<cuhal::Buffer>; 4]> = devices
        .iter()
        .map(|d| [0; 4].map(|_| d.create_buffer(n * 4).unwrap()))
        .collect();
    let queues: Vec<_> = devices.iter().map(|d| d.queue(0)).collect();
    let mut set = cuhal::CollectiveCommandBuffers::new(comm, &queues, mode).unwrap();
    for (rank, [x, ..]) in bufs.iter().enumerate() {
        let cb = set.rank(rank).unwrap();
        cb.fill(&x.whole(), FillPattern::U32((rank as f32 + 1.0).to_bits()))
            .unwrap();
        cb.barrier().unwrap();
    }
    let f = NcclDataType::F32;
    let parts: Vec<_> = bufs
        .iter()
        .map(|[x, y, ..]| CollectivePart::all_reduce(&x.whole(), &y.whole(), n, f, NcclRedOp::Sum))
        .collect();
    set.collective(&parts).unwrap();
    for (rank, [_, y, w, _]) in bufs.iter().enumerate() {
        let cb = set.rank(rank).unwrap();
        cb.barrier().unwrap();
        cb.copy(&y.whole(), &w.whole()).unwrap();
        cb.barrier().unwrap();
    }
    let parts: Vec<_> = bufs
        .iter()
        .map(|[_, _, w, z]| {
            CollectivePart::all_reduce(&w.whole(), &z.whole(), n, f, NcclRedOp::Max)
        })
        .collect();
    set.collective(&parts).unwrap();
    set.end().unwrap();
    (set, bufs)
}

/// Zeroes every result buffer of `bufs` after `after` is reached; signals `zeroed` (on each
/// device's queue 0, value `value`).
fn zero_results(
    devices: &[Device],
    bufs: &[[Arc<cuhal::Buffer>; 4]],
    after: &[(&Semaphore, u64)],
    zeroed: &[Semaphore],
    value: u64,
) {
    for ((device, b), zeroed) in devices.iter().zip(bufs).zip(zeroed) {
        for (i, buffer) in b.iter().enumerate().skip(1) {
            let signals = [(zeroed, value)];
            let signal: &[(&Semaphore, u64)] = if i == 3 { &signals } else { &[] };
            device
                .queue(0)
                .fill(after, signal, &buffer.whole(), FillPattern::U32(0))
                .unwrap();
        }
    }
}

fn check_results(devices: &[Device], bufs: &[[Arc<cuhal::Buffer>; 4]], what: &str) {
    let three = f32_bytes(std::iter::repeat_n(3.0, bufs[0][0].len() / 4));
    for (device, b) in devices.iter().zip(bufs) {
        for (name, buffer) in ["y", "w", "z"].iter().zip(&b[1..]) {
            assert!(
                read(device, &buffer.whole()) == three,
                "{what}: {name} on GPU {} is not 3.0 everywhere",
                device.info().ordinal
            );
        }
    }
}

/// Collectives recorded into command buffers, graph and deferred: a set of one command buffer
/// per GPU, each rank's commands and collectives in recording order, bit for bit, replayed.
#[test]
#[ignore = "needs two CUDA GPUs (cargo xtask gpu-test)"]
fn multi_gpu_collective_command_buffers_bit_exact() {
    let Some((_driver, devices)) = two_gpus() else {
        return;
    };
    let nccl = nccl();
    let comm = communicator(&nccl, &devices);
    for mode in [
        cuhal::CommandBufferMode::Graph,
        cuhal::CommandBufferMode::Deferred,
    ] {
        let (set, bufs) = record_collective_set(&comm, &devices, mode, 1 << 16);
        let done = devices[0].create_semaphore(0);
        let zeroed: Vec<_> = devices.iter().map(|d| d.create_semaphore(0)).collect();
        for round in 1..=3u64 {
            let waits: Vec<(&Semaphore, u64)> = zeroed.iter().map(|z| (z, round - 1)).collect();
            comm.execute(&set, &waits, &[(&done, round)]).unwrap();
            wait(&done, round);
            check_results(&devices, &bufs, &format!("{mode:?} round {round}"));
            zero_results(&devices, &bufs, &[(&done, round)], &zeroed, round);
        }
        println!("{mode:?}: 3 replays bit exact");
    }
}

/// NCCL's guide warns that several GPUs per process under graph launch can deadlock. 10,000
/// replays of a graph command-buffer set holding two all-reduces over both GPUs, from one thread,
/// each waiting for the previous replay, under a watchdog that ends the process if progress
/// stops for 60 s; results checked (zeroed and recomputed) every 1,000 replays.
#[test]
#[ignore = "needs two CUDA GPUs (cargo xtask gpu-test)"]
fn multi_gpu_ten_thousand_graph_collective_replays_never_deadlock() {
    let Some((_driver, devices)) = two_gpus() else {
        return;
    };
    let nccl = nccl();
    let comm = communicator(&nccl, &devices);
    let (set, bufs) = record_collective_set(&comm, &devices, cuhal::CommandBufferMode::Graph, 2);
    let progress = Arc::new(AtomicU64::new(0));
    let watched = progress.clone();
    std::thread::spawn(move || {
        let mut last = (0, Instant::now());
        loop {
            std::thread::sleep(Duration::from_millis(200));
            let now = watched.load(Ordering::Acquire);
            if now == u64::MAX {
                return;
            }
            if now != last.0 {
                last = (now, Instant::now());
            } else if last.1.elapsed() > TIMEOUT {
                eprintln!("watchdog: no progress for {TIMEOUT:?} at replay {now}: deadlock");
                std::process::exit(101);
            }
        }
    });
    let rounds = 10_000u64;
    let done = devices[0].create_semaphore(0);
    let zeroed: Vec<_> = devices.iter().map(|d| d.create_semaphore(0)).collect();
    let mut zeroings = 0;
    let started = Instant::now();
    for i in 0..rounds {
        let mut waits: Vec<(&Semaphore, u64)> = vec![(&done, i)];
        waits.extend(zeroed.iter().map(|z| (z, zeroings)));
        comm.execute(&set, &waits, &[(&done, i + 1)]).unwrap();
        if (i + 1) % 1000 == 0 {
            wait(&done, i + 1);
            check_results(&devices, &bufs, &format!("replay {}", i + 1));
            zeroings += 1;
            zero_results(&devices, &bufs, &[(&done, i + 1)], &zeroed, zeroings);
        } else if i % 64 == 0 {
            done.wait(i.saturating_sub(128), TIMEOUT).unwrap();
        }
        progress.store(i + 1, Ordering::Release);
    }
    wait(&done, rounds);
    progress.store(u64::MAX, Ordering::Release);
    println!(
        "{rounds} replays of a 2-GPU graph set (2 all-reduces each) in {:?}",
        started.elapsed()
    );
}
