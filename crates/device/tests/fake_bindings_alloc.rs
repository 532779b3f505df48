//! No heap allocation per submission with binding tables, in steady state, on the fake driver:
//! one command buffer with slots (a chain of bound dispatches and a bound fill) submitted
//! thousands of times with alternating tables and with fresh buffers at every submission, for
//! the graph kind patching on the host and on the device ([`PatchMethod`] forced) and for the
//! deferred kind. A counting global allocator sees every thread of the process, so an allocation
//! a submission causes anywhere counts. Its own test binary, so nothing else allocates while it
//! counts; the tests run one at a time (`SERIAL`). Fresh buffers are created before counting
//! (creating a buffer is not a submission) and each is bound once while counting.

mod fake_support;

use std::sync::Arc;
use std::time::Duration;

use cuhal::{
    Buffer, BufferRange, CommandBuffer, CommandRecorder, DeferredCommandBuffer, Device,
    FillPattern, Function, GraphCommandBuffer, PatchMethod,
};
use cuhal_fake_driver::harness::FakeDriver;
use fake_support::add::{add_kernel, record_add_chain};
use fake_support::helpers::{BOTH_HELPERS, install_helpers};
use fake_support::*;

#[global_allocator]
static GLOBAL: fake_support::counting::CountingAlloc = fake_support::counting::CountingAlloc::new();

/// Held by each test: one counts at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Words each slot's buffer holds.
const N: usize = 32;
const BYTES: usize = N * 4;
/// Bound dispatches in the chain: at least `DEVICE_PATCH_MIN_NODES`, so device patching applies.
const CHAIN: u32 = 12;
/// Slots: 0 input, 1 output, 2 and 3 scratch, 4 a filled record.
const SLOTS: usize = 5;
/// Submissions warming up (pools, rings and list capacities grow here).
const WARM: usize = 600;
/// Submissions with alternating tables, counted.
const ALTERNATING: usize = 3000;
/// Submissions with fresh buffers, counted.
const FRESH: usize = 1000;
/// The host waits for the queue every this many submissions.
const BATCH: usize = 100;

/// Queues of the fake device: the submissions alternate between the two in the tests that say
/// so (each queue then launches an executable of its own, and every launch records its
/// executable's completion event).
const QUEUES: usize = 2;

fn open_fake(tag: &str) -> (FakeDriver, cuhal::Driver, Device, Function) {
    install_helpers("bind-alloc", BOTH_HELPERS);
    let (fake, driver, device) = open(tag, queues(QUEUES));
    let add = add_kernel(&device);
    (fake, driver, device, add)
}

/// Records the chain (2 = in + 1, then 3 and 2 in turn, out = last + 1) and a fill of slot 4.
fn record(cb: &mut dyn CommandRecorder, add: &Function) {
    record_add_chain(cb, add, 7, CHAIN, N, 0);
}

fn graph(device: &Device, add: &Function, method: PatchMethod) -> Arc<dyn CommandBuffer> {
    let mut cb = GraphCommandBuffer::with_bindings(device.context(), None, SLOTS as u32).unwrap();
    cb.set_patch_method(method).unwrap();
    record(&mut cb, add);
    Arc::new(cb.end().unwrap())
}

fn deferred(device: &Device, add: &Function) -> Arc<dyn CommandBuffer> {
    let mut cb =
        DeferredCommandBuffer::with_bindings(device.context(), None, SLOTS as u32).unwrap();
    record(&mut cb, add);
    Arc::new(cb.end().unwrap())
}

/// A table of fresh buffers, one per slot.
fn fresh(device: &Device) -> (Vec<Arc<Buffer>>, Vec<BufferRange>) {
    let buffers: Vec<_> = (0..SLOTS)
        .map(|_| device.create_buffer(BYTES).unwrap())
        .collect();
    let table = buffers.iter().map(|b| b.whole()).collect();
    (buffers, table)
}

/// Submits `cb` with `tables[i]` for each `i` of `order`, on the first `queues` queues in turn,
/// chained on one semaphore per queue, the host waiting every `BATCH`; counts from submission
/// `count_from` on. Returns the allocations.
fn submit(
    fake: &FakeDriver,
    device: &Device,
    cb: &Arc<dyn CommandBuffer>,
    tables: &[Vec<BufferRange>],
    order: impl Iterator<Item = usize>,
    count_from: usize,
    queues: usize,
) -> u64 {
    let semaphores: Vec<_> = (0..queues).map(|_| device.create_semaphore(0)).collect();
    let mut values = vec![0u64; queues];
    // Completes the work submitted so far (held on the model clock while warming up), then
    // waits until every queue retired it.
    let drain = |values: &[u64]| {
        fake.finish_work();
        for (q, semaphore) in semaphores.iter().enumerate() {
            wait(semaphore, values[q]);
            settle(device.queue(q));
        }
    };
    for (n, i) in order.enumerate() {
        let q = n % queues;
        let (queue, semaphore, value) = (device.queue(q), &semaphores[q], values[q]);
        if n == 0 {
            // Nothing completes until a drain: every submission of a warm-up batch is in flight
            // at once, as many as the counted phase ever has, however slowly this machine
            // submits (pools, rings and lists grow here).
            fake.set_timing(Duration::from_secs(3600), Duration::from_micros(2));
        }
        if n == count_from {
            drain(&values);
            // Work takes time, so completions lag behind submissions as on a GPU.
            fake.set_timing(Duration::from_micros(3), Duration::from_micros(2));
            GLOBAL.start();
        }
        queue
            .execute_with_bindings(
                &[(semaphore, value)],
                &[(semaphore, value + 1)],
                &[(cb, &tables[i])],
            )
            .unwrap();
        values[q] += 1;
        if (n + 1) % BATCH == 0 {
            drain(&values);
        }
    }
    drain(&values);
    GLOBAL.stop()
}

/// Warm-up with alternating tables, then `ALTERNATING` counted submissions alternating among
/// three tables, then `FRESH` counted submissions each on buffers never bound before.
fn alternating_and_fresh(
    fake: &FakeDriver,
    device: &Device,
    cb: &Arc<dyn CommandBuffer>,
    queues: usize,
) -> (u64, u64) {
    let sets: Vec<_> = (0..3).map(|_| fresh(device)).collect();
    let warm_tables: Vec<_> = sets.iter().map(|(_, t)| t.clone()).collect();
    let alternating = submit(
        fake,
        device,
        cb,
        &warm_tables,
        (0..WARM + ALTERNATING).map(|i| i % 3),
        WARM,
        queues,
    );
    let fresh_sets: Vec<_> = (0..FRESH).map(|_| fresh(device)).collect();
    let mut tables: Vec<_> = fresh_sets.iter().map(|(_, t)| t.clone()).collect();
    // Warm-up on the alternating sets' tables, then every fresh table once.
    tables.extend(warm_tables);
    let fresh_count = submit(
        fake,
        device,
        cb,
        &tables,
        (0..WARM).map(|i| FRESH + i % 3).chain(0..FRESH),
        WARM,
        queues,
    );
    (alternating, fresh_count)
}

#[test]
fn host_patching_allocates_nothing_per_submission() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (fake, _driver, device, add) = open_fake("bind-alloc-host");
    for queues in [1, QUEUES] {
        let cb = graph(&device, &add, PatchMethod::Host);
        let counts = alternating_and_fresh(&fake, &device, &cb, queues);
        assert_eq!(
            counts,
            (0, 0),
            "allocations over {ALTERNATING} alternating and {FRESH} fresh tables, host \
             patching, {queues} queue(s)"
        );
    }
}

#[test]
fn device_patching_allocates_nothing_per_submission() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (fake, _driver, device, add) = open_fake("bind-alloc-device");
    for queues in [1, QUEUES] {
        let graph_cb = {
            let mut cb =
                GraphCommandBuffer::with_bindings(device.context(), None, SLOTS as u32).unwrap();
            cb.set_patch_method(PatchMethod::Device).unwrap();
            record(&mut cb, &add);
            let graph = Arc::new(cb.end().unwrap());
            assert!(
                graph.patches_on_device(),
                "a chain of {CHAIN} bound dispatches"
            );
            graph
        };
        let cb: Arc<dyn CommandBuffer> = graph_cb.clone();
        let counts = alternating_and_fresh(&fake, &device, &cb, queues);
        assert!(
            graph_cb.device_patched_launches() >= (ALTERNATING + FRESH) as u64,
            "patched on the device: {}",
            graph_cb.device_patched_launches()
        );
        assert_eq!(
            counts,
            (0, 0),
            "allocations over {ALTERNATING} alternating and {FRESH} fresh tables, device \
         patching, {queues} queue(s)"
        );
        assert_eq!(graph_cb.executable_count(), queues);
    }
}

#[test]
fn deferred_replay_with_a_table_allocates_nothing_per_submission() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (fake, _driver, device, add) = open_fake("bind-alloc-deferred");
    let cb = deferred(&device, &add);
    let counts = alternating_and_fresh(&fake, &device, &cb, 1);
    assert_eq!(
        counts,
        (0, 0),
        "allocations over {ALTERNATING} alternating and {FRESH} fresh tables, deferred replay"
    );
}

/// Holds every round of `rounds` in flight (nothing completes until the round is submitted),
/// then completes it; counts the allocations of every round but the first (the warm-up). Before
/// the rounds, `barriers` barriers are held in flight on the same semaphore and queue, which
/// grows what rounds that large need besides tables (the semaphore's timepoints, the queue's
/// lists) without touching the table pool.
fn tables_in_flight(tag: &str, barriers: u64, rounds: impl IntoIterator<Item = u64>) -> u64 {
    let (fake, _driver, device, add) = open_fake(tag);
    let cb = deferred(&device, &add);
    let sets: Vec<_> = (0..2).map(|_| fresh(&device)).collect();
    let queue = device.queue(0);
    let semaphore = device.create_semaphore(0);
    let rounds = std::iter::once(barriers).chain(rounds);
    rounds_in_flight(
        &fake,
        queue,
        &semaphore,
        &GLOBAL,
        rounds,
        2,
        |round, value| {
            let (waits, signals) = (&[(&semaphore, value)], &[(&semaphore, value + 1)]);
            if round == 0 {
                queue.barrier(waits, signals).unwrap();
            } else {
                let table = &sets[value as usize % 2].1;
                queue
                    .execute_with_bindings(waits, signals, &[(&cb, table)])
                    .unwrap();
            }
        },
    )
}

/// A number of submissions with tables in flight that creeps up (here from 70 to 120: all of a
/// round is held in flight, then completed), as a completion side that lags a little more now
/// and then makes it, is met by table storage made ahead, not by an allocation at each new mark.
#[test]
fn a_creeping_number_of_tables_in_flight_allocates_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let counted = tables_in_flight("bind-alloc-creep", 0, std::iter::once(70).chain(71..=120));
    assert_eq!(
        counted, 0,
        "allocations while the tables in flight crept from 70 to 120"
    );
}

/// A queue that held a table or two at a time, as a submitter that waits for each submission
/// does, then holds up to a gather batch of them (its completion side retires lazily, so
/// submissions nobody waits for pile up that far) allocates nothing: table storage is made a
/// gather batch at a time from the first.
#[test]
fn a_lag_of_up_to_a_gather_batch_after_a_quiet_start_allocates_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let counted = tables_in_flight("bind-alloc-lag", 64, std::iter::once(2).chain(3..=60));
    assert_eq!(
        counted, 0,
        "allocations while the tables in flight grew from 2 to 60"
    );
}

/// A thread that never issued before makes a pending deferred replay with a table ready (its
/// signal issues the replay, on that thread): once the command buffer is warm, the issue
/// allocates nothing there, for the replay's argument scratch belongs to the command buffer, not
/// to the thread. The thread first makes a replay without slots ready, which warms what any
/// issuing thread sets up once (its parker, the driver's per-thread state).
#[test]
fn a_fresh_thread_issuing_a_warm_deferred_replay_allocates_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (_fake, _driver, device, add) = open_fake("bind-alloc-fresh-thread");
    let bound = deferred(&device, &add);
    let (_buffers, table) = fresh(&device);
    let target = device.create_buffer(BYTES).unwrap();
    let plain: Arc<dyn CommandBuffer> = {
        let mut cb = DeferredCommandBuffer::with_bindings(device.context(), None, 0).unwrap();
        cb.fill(&target.whole(), FillPattern::U32(3)).unwrap();
        Arc::new(cb.end().unwrap())
    };
    let queue = device.queue(0);
    let (gate, done) = (device.create_semaphore(0), device.create_semaphore(0));
    let mut value = 0;
    // Both replays pending on the gate, one value each: the first signal issues the plain one,
    // the second the bound one.
    let mut pend = || {
        value += 2;
        queue
            .execute(&[(&gate, value - 1)], &[(&done, value - 1)], &[&plain])
            .unwrap();
        queue
            .execute_with_bindings(
                &[(&gate, value)],
                &[(&done, value)],
                &[(&bound, table.as_slice())],
            )
            .unwrap();
        value
    };
    for _ in 0..WARM / 4 {
        let value = pend();
        gate.signal(value - 1).unwrap();
        gate.signal(value).unwrap();
        wait(&done, value);
    }
    settle(queue);
    let value = pend();
    let allocations = std::thread::scope(|s| {
        s.spawn(|| {
            gate.signal(value - 1).unwrap();
            wait(&done, value - 1);
            GLOBAL.start();
            gate.signal(value).unwrap();
            GLOBAL.stop()
        })
        .join()
        .unwrap()
    });
    wait(&done, value);
    assert_eq!(
        allocations, 0,
        "a fresh thread's issue of a warm deferred replay with a table"
    );
}
