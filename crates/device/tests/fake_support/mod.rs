//! Shared by the `fake_*` tests: the device crate end to end on the CPU, against a private
//! instance of the fake driver (`cuhal-fake-driver`), a simple synchronous GPU made of host
//! memory.
//!
//! Each test copies the fake's library and loads its copy, so it has its own devices, objects,
//! counters and injected faults, and tests run in parallel. `Driver::load` finds the copy
//! through `CUHAL_CUDA_LIBRARY`, which is set and read under one lock.
#![allow(dead_code)] // each test file uses a different part

pub mod add;
pub mod counting;
pub mod helpers;
pub mod stamp;

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cuhal::{
    BufferRange, Device, DeviceOptions, Driver, Error, Failure, HostBuffer, Queue, Semaphore,
};
use cuhal_fake_driver::control::Counts;
use cuhal_fake_driver::harness::FakeDriver;

/// How long a test waits for anything before it calls the wait a hang.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// What every output is filled with before the work that should overwrite it.
pub const POISON: u8 = 0xd7;

/// Kernels the fake "compiles": it only reads the `.entry` names.
pub const PTX: &str = "\
.version 8.0
.target sm_90
.address_size 64
.visible .entry scale(.param .u64 data, .param .u32 factor, .param .u32 n) { ret; }
.visible .entry add_one(.param .u64 data, .param .u32 n) { ret; }
";

/// A fresh instance of the fake and the driver loaded from it.
pub fn load(tag: &str) -> (FakeDriver, Driver) {
    load_with(tag, |_| {})
}

/// As [`load`], with `setup` applied to the fake before the driver is loaded (to hide a symbol,
/// say, which must happen before the table is resolved).
pub fn load_with(tag: &str, setup: impl FnOnce(&FakeDriver)) -> (FakeDriver, Driver) {
    static ENV: Mutex<()> = Mutex::new(());
    let fake = FakeDriver::private(tag).unwrap_or_else(|e| panic!("{e}"));
    setup(&fake);
    let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: the environment is written only here, under `ENV`, and `Driver::load` reads it
    // under the same lock through std (which serializes with set_var); nothing in these test
    // binaries reads it through libc.
    unsafe { std::env::set_var(cuhal_sys::LIBRARY_ENV, fake.path()) };
    let driver = Driver::load().unwrap_or_else(|e| panic!("loading the fake driver: {e}"));
    (fake, driver)
}

/// A fresh instance, its driver, and device 0 opened with `queues` queues of `options`.
pub fn open(tag: &str, options: DeviceOptions) -> (FakeDriver, Driver, Device) {
    let (fake, driver) = load(tag);
    let device = driver
        .open(0, options)
        .unwrap_or_else(|e| panic!("opening the fake device: {e}"));
    (fake, driver, device)
}

/// Options with `queues` queues, otherwise the defaults.
pub fn queues(queues: usize) -> DeviceOptions {
    DeviceOptions {
        queues,
        ..DeviceOptions::default()
    }
}

/// Waits for `semaphore` to reach `value`, panicking with what it saw on a failure or a hang.
pub fn wait(semaphore: &Semaphore, value: u64) {
    if let Err(e) = semaphore.wait(value, TIMEOUT) {
        panic!("waiting for {semaphore:?} to reach {value}: {e}");
    }
}

/// The failure `semaphore` ends with when waited on for `value` (a hang or success panics).
pub fn failure_of(semaphore: &Semaphore, value: u64) -> Failure {
    match semaphore.wait(value, TIMEOUT) {
        Err(cuhal_semaphore::Error::Failed(failure)) => failure,
        other => panic!("expected {semaphore:?} to fail before {value}, got {other:?}"),
    }
}

/// Asserts that `failure` comes from a driver call that returned `result`.
pub fn assert_driver_result(failure: &Failure, result: cuhal_sys::CUresult) {
    let cuda = cuhal::cuda_of_failure(failure).expect("a driver error");
    assert_eq!(cuda.result(), Some(result), "{failure}");
}

/// Holds each round of `rounds` in flight on `queue` (nothing completes until the whole round
/// is submitted), then completes it and waits until `queue` retired it; `counter` counts the
/// allocations of the rounds from index `counted_from` on, which this returns.
/// `submit(round, value)` submits one action that waits for `value` on `semaphore` and signals
/// `value + 1`.
pub fn rounds_in_flight(
    fake: &FakeDriver,
    queue: &Queue,
    semaphore: &Semaphore,
    counter: &counting::CountingAlloc,
    rounds: impl IntoIterator<Item = u64>,
    counted_from: usize,
    mut submit: impl FnMut(usize, u64),
) -> u64 {
    // Nothing completes until `finish_work`.
    fake.set_timing(Duration::from_secs(3600), Duration::ZERO);
    let mut value = 0;
    for (round, size) in rounds.into_iter().enumerate() {
        if round == counted_from {
            counter.start();
        }
        for _ in 0..size {
            submit(round, value);
            value += 1;
        }
        fake.finish_work();
        wait(semaphore, value);
        settle(queue);
    }
    let counted = counter.stop();
    fake.set_timing(Duration::ZERO, Duration::ZERO);
    counted
}

/// Waits until `queue` has retired (signalled, cleaned up, released) everything submitted.
pub fn settle(queue: &Queue) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let stats = queue.stats();
        if stats.retired() == stats.submitted {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} never settled: {stats:?}",
            queue.label()
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Reads `range` back through `queue` (a queue read into pinned memory, then a host wait).
pub fn read(device: &Device, queue: &Queue, range: &BufferRange) -> Vec<u8> {
    let host = device.create_host_buffer(range.len()).unwrap();
    let done = device.create_semaphore(0);
    queue.read(&[], &[(&done, 1)], range, &host, 0).unwrap();
    wait(&done, 1);
    host_bytes(&host)
}

/// The bytes of a host buffer.
pub fn host_bytes(host: &HostBuffer) -> Vec<u8> {
    let mut bytes = vec![0; host.len()];
    host.read(0, &mut bytes).unwrap();
    bytes
}

/// Fills `range` with [`POISON`] and waits for it.
pub fn poison(device: &Device, queue: &Queue, range: &BufferRange) {
    let done = device.create_semaphore(0);
    queue
        .fill(&[], &[(&done, 1)], range, cuhal::FillPattern::U8(POISON))
        .unwrap();
    wait(&done, 1);
}

/// `error` is `Error::Lost` carrying `failure`.
pub fn assert_lost(error: Error, failure: &Failure, what: &str) {
    match error {
        Error::Lost(f) => assert!(f.ptr_eq(failure), "{what}: lost with another failure {f}"),
        other => panic!("{what}: expected Error::Lost, got {other:?}"),
    }
}

/// The fake's live objects, with the launch total (not an object) left out.
pub fn live(fake: &FakeDriver) -> Counts {
    Counts {
        launches: 0,
        ..fake.counts()
    }
}

/// A small deterministic generator, seeded from the clock (the seed is printed, so a failing
/// run can be replayed with `CUHAL_TEST_SEED`).
pub struct Rng(u64);

impl Rng {
    /// Seeded from `CUHAL_TEST_SEED` or the clock.
    pub fn new() -> Rng {
        let seed = std::env::var("CUHAL_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        println!("seed {seed} (CUHAL_TEST_SEED)");
        Rng(seed | 1)
    }

    /// xorshift64*.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// `n` random bytes, none equal to [`POISON`] so a surviving poison byte is visible.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n)
            .map(|_| match self.next_u64() as u8 {
                POISON => POISON ^ 1,
                b => b,
            })
            .collect()
    }
}

/// Two fake devices (opened with `open_all`, peer access between them) and the fake NCCL from
/// the same library: the setup of every collective test.
pub fn two_devices_with_nccl(tag: &str) -> (FakeDriver, Vec<Device>, cuhal::Nccl) {
    let (fake, driver) = load(tag);
    fake.set_device_count(2);
    let devices = driver.open_all(DeviceOptions::default()).unwrap();
    let nccl = cuhal::Nccl::load(Some(fake.path().to_path_buf())).unwrap();
    (fake, devices, nccl)
}

/// A communicator over every device of `devices`, rank `i` on `devices[i]`, default options.
pub fn communicator(nccl: &cuhal::Nccl, devices: &[Device]) -> cuhal::Communicator {
    let devices: Vec<&Device> = devices.iter().collect();
    cuhal::Communicator::local(nccl, &devices, cuhal::CommunicatorOptions::default())
        .unwrap_or_else(|e| panic!("a communicator over {} devices: {e}", devices.len()))
}

/// Joins communicator `id` from one thread per device, as separate processes would (rank `i`
/// on `devices[i]`, default options), and runs `work(rank, device, communicator)` on each.
pub fn join_as_processes(
    nccl: &cuhal::Nccl,
    id: cuhal::UniqueId,
    devices: &[Device],
    work: impl Fn(usize, &Device, cuhal::Communicator) + Sync,
) {
    let work = &work;
    std::thread::scope(|scope| {
        for (rank, device) in devices.iter().enumerate() {
            scope.spawn(move || {
                let ranks = [(device, rank as i32)];
                let options = cuhal::CommunicatorOptions::default();
                let comm =
                    cuhal::Communicator::join(nccl, id, devices.len() as i32, &ranks, options)
                        .unwrap_or_else(|e| panic!("rank {rank} joining: {e}"));
                work(rank, device, comm);
            });
        }
    });
}

/// Little-endian `f32`s of `bytes`.
pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The little-endian bytes of `values`.
pub fn bytes_of(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Writes `values` into a new buffer of `device`; returns it and the semaphore the write
/// signals (value 1).
pub fn upload(device: &Device, values: &[f32]) -> (std::sync::Arc<cuhal::Buffer>, Semaphore) {
    let buffer = device.create_buffer(values.len() * 4).unwrap();
    let written = device.create_semaphore(0);
    device
        .queue(0)
        .write(&[], &[(&written, 1)], &buffer.whole(), &bytes_of(values))
        .unwrap();
    (buffer, written)
}

/// Work staged to see a device lost, on a device of two or more queues: on queue 0 a fill of
/// `buffer` waiting for `go` (signalling `s`), and behind it (a queue issues in order) and on
/// queue 1 fills waiting for a semaphore nobody signals (signalling `p0` and `p1`).
pub struct LossScene {
    pub buffer: std::sync::Arc<cuhal::Buffer>,
    pub go: Semaphore,
    pub s: Semaphore,
    pub p0: Semaphore,
    pub p1: Semaphore,
    _gate: Semaphore,
}

/// Stages a [`LossScene`] on `device`'s queues 0 and 1.
pub fn stage_loss(device: &Device) -> LossScene {
    let (q0, q1) = (device.queue(0), device.queue(1));
    let buffer = device.create_buffer(256).unwrap();
    let semaphore = || device.create_semaphore(0);
    let (go, gate, s, p0, p1) = (
        semaphore(),
        semaphore(),
        semaphore(),
        semaphore(),
        semaphore(),
    );
    let fill = cuhal::FillPattern::U8;
    q0.fill(&[(&go, 1)], &[(&s, 1)], &buffer.whole(), fill(3))
        .unwrap();
    q0.fill(&[(&gate, 1)], &[(&p0, 1)], &buffer.whole(), fill(1))
        .unwrap();
    q1.fill(&[(&gate, 1)], &[(&p1, 1)], &buffer.whole(), fill(2))
        .unwrap();
    LossScene {
        buffer,
        go,
        s,
        p0,
        p1,
        _gate: gate,
    }
}

impl LossScene {
    /// The GPU faults: from now on every event query reports an illegal address; then the
    /// first fill goes.
    pub fn fault(&self, fake: &FakeDriver) {
        fake.fail(
            cuhal_sys::cu_name!(cuEventQuery),
            cuhal_fake_driver::status::ILLEGAL_ADDRESS,
        );
        self.go.signal(1).unwrap();
    }
}
