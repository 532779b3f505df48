//! No heap allocation per submission in steady state, end to end through the device crate, with
//! completions that come later than submissions (the fake's model clock), as bench case 1 runs
//! them: chained submissions (each waits for the one before and signals the next value) on one
//! queue and alternating between two, the host waiting every `BATCH`. A counting global allocator
//! sees every thread of the process (submitter, workers, completion threads), so an allocation a
//! submission causes anywhere counts. Its own test binary, so nothing else allocates while it
//! counts; the forms run one after the other in one test, and the tests one at a time
//! (`SERIAL`), for the same reason.

mod fake_support;

use std::sync::Arc;
use std::time::Duration;

use cuhal::{CommandBuffer, Device, DeviceOptions, FillPattern};
use fake_support::*;

#[global_allocator]
static GLOBAL: fake_support::counting::CountingAlloc = fake_support::counting::CountingAlloc::new();

/// Held by each test: one counts at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Submissions counted.
const COUNTED: u64 = 100_000;
/// The host waits for the chain every this many submissions, as bench case 1 does.
const BATCH: u64 = 200;
/// Batches warming the queues up, on a slow model GPU so that as many submissions are in flight
/// as the counted phase ever has (pools, lists and their capacities grow here).
const WARM_BATCHES: u64 = 3;

/// A one-fill graph command buffer of queue `q`.
fn command_buffer(device: &Device, q: usize) -> Arc<dyn CommandBuffer> {
    let buffer = device.create_buffer(256).unwrap();
    let mut cb = device.queue(q).create_command_buffer().unwrap();
    cb.fill(&buffer.whole(), FillPattern::U32(5)).unwrap();
    cb.end().unwrap()
}

/// Waits until every queue of `device` has retired everything submitted to it. The counted
/// phase waits for this every batch, so that no more than a batch is ever in flight: a completion
/// side that falls behind (this machine's cores are shared) would otherwise hold more actions and
/// events than warm-up ever saw, and growing to hold them is not a per-submission cost.
fn retired(device: &Device, queues: usize) {
    for q in 0..queues {
        settle(device.queue(q));
    }
}

/// Chained submissions over `queues` queues (round robin): warm-up batches on a slow model GPU,
/// then `COUNTED` on a fast one; returns the allocations the counted ones made.
fn chained(fake: &cuhal_fake_driver::harness::FakeDriver, device: &Device, queues: usize) -> u64 {
    let cbs: Vec<_> = (0..queues).map(|q| command_buffer(device, q)).collect();
    let semaphore = device.create_semaphore(0);
    let warm = WARM_BATCHES * BATCH;
    // Slow work: every submission of a batch is in flight before the first completes.
    fake.set_timing(Duration::from_micros(500), Duration::from_micros(2));
    for i in 0..warm + COUNTED {
        if i == warm {
            retired(device, queues);
            // Work takes time, so completions lag behind submissions as on a GPU.
            fake.set_timing(Duration::from_micros(3), Duration::from_micros(2));
            GLOBAL.start();
        }
        let q = i as usize % queues;
        device
            .queue(q)
            .execute(&[(&semaphore, i)], &[(&semaphore, i + 1)], &[&cbs[q]])
            .unwrap();
        if (i + 1) % BATCH == 0 {
            wait(&semaphore, i + 1);
            retired(device, queues);
        }
    }
    wait(&semaphore, warm + COUNTED);
    retired(device, queues);
    GLOBAL.stop()
}

/// Chained submissions on one queue whose in-flight high-water mark creeps up by one each batch
/// (all of a batch is held in flight, then completed), as a completion side that sometimes
/// lags a little more than ever before makes it: warm-up reaches `from` in flight, the counted
/// batches `from + 1` to `to`. Returns the allocations the counted batches made.
fn creeping(
    fake: &cuhal_fake_driver::harness::FakeDriver,
    device: &Device,
    from: u64,
    to: u64,
) -> u64 {
    let cb = command_buffer(device, 0);
    let semaphore = device.create_semaphore(0);
    let queue = device.queue(0);
    let rounds = std::iter::once(from).chain(from + 1..=to);
    rounds_in_flight(fake, queue, &semaphore, &GLOBAL, rounds, 1, |_, value| {
        queue
            .execute(&[(&semaphore, value)], &[(&semaphore, value + 1)], &[&cb])
            .unwrap();
    })
}

#[test]
fn chained_submissions_allocate_nothing_once_warm() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (fake, _driver, device) = open("alloc", queues(2));
    let same = chained(&fake, &device, 1);
    let across = chained(&fake, &device, 2);
    assert_eq!(
        (same, across),
        (0, 0),
        "allocations over {COUNTED} chained submissions (same queue, across queues)"
    );
}

/// A high-water mark that creeps up (here from 130 to 250 actions and events in flight) is met
/// by capacity grown ahead, not by an allocation at each new mark.
#[test]
fn a_creeping_high_water_mark_allocates_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (fake, _driver, device) = open("alloc-creep", queues(1));
    let allocations = creeping(&fake, &device, 130, 250);
    assert_eq!(
        allocations, 0,
        "allocations while the in-flight high-water mark crept from 130 to 250"
    );
}

/// A queue makes room up front for every action it may have in flight: a fresh queue that
/// suddenly holds nearly `max_in_flight` actions (a completion side far behind, as a busy host
/// can leave it while the submitter runs on) allocates nothing for them, whether or not that
/// window is a power of two (the body slots grow by doubling, from a reserve of the window's
/// size). The semaphore's timepoint ring is grown first, on the other queue, so only the fresh
/// queue's own storage is counted.
#[test]
fn a_fresh_queue_holds_a_full_window_without_allocating() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let default = DeviceOptions::default().max_in_flight;
    for max_in_flight in [default, 1_000] {
        let allocations = fresh_window(max_in_flight);
        assert_eq!(
            allocations,
            0,
            "allocations while a fresh queue held {} actions in flight (max_in_flight {max_in_flight})",
            max_in_flight - 24
        );
    }
}

/// Allocations while a fresh queue of a device with `max_in_flight` goes from nothing to
/// `max_in_flight - 24` actions in flight.
fn fresh_window(max_in_flight: usize) -> u64 {
    let options = DeviceOptions {
        max_in_flight,
        ..queues(2)
    };
    let (fake, _driver, device) = open("alloc-window", options);
    let window = max_in_flight as u64 - 24;
    let semaphore = device.create_semaphore(0);
    let other = command_buffer(&device, 1);
    rounds_in_flight(
        &fake,
        device.queue(1),
        &semaphore,
        &GLOBAL,
        [window],
        1,
        |_, value| {
            device
                .queue(1)
                .execute(
                    &[(&semaphore, value)],
                    &[(&semaphore, value + 1)],
                    &[&other],
                )
                .unwrap();
        },
    );
    let cb = command_buffer(&device, 0);
    // A few first (its stream's executable, its event stash), then the window, counted.
    rounds_in_flight(
        &fake,
        device.queue(0),
        &semaphore,
        &GLOBAL,
        [4, window],
        1,
        |_, value| {
            let value = window + value;
            device
                .queue(0)
                .execute(&[(&semaphore, value)], &[(&semaphore, value + 1)], &[&cb])
                .unwrap();
        },
    )
}

/// Bench case 9's pattern: a chain of steps alternating between two queues, all submitted
/// pending (each waits for the step before, on the other queue), then released by one host
/// signal, which issues the whole chain on the signalling thread. Returns the allocations
/// `chains` chains made after `warm` chains warmed the queues up.
fn released_chains(device: &Device, warm: u64, chains: u64) -> u64 {
    const STEPS: u64 = 100;
    let cbs: Vec<_> = (0..2).map(|q| command_buffer(device, q)).collect();
    let host = device.create_semaphore(0);
    let chain = device.create_semaphore(0);
    for c in 0..warm + chains {
        if c == warm {
            retired(device, 2);
            GLOBAL.start();
        }
        for i in 0..STEPS {
            let q = (i % 2) as usize;
            let value = c * STEPS + i;
            let waits = if i == 0 {
                [(&host, c + 1)]
            } else {
                [(&chain, value)]
            };
            device
                .queue(q)
                .execute(&waits, &[(&chain, value + 1)], &[&cbs[q]])
                .unwrap();
        }
        host.signal(c + 1).unwrap();
        wait(&chain, (c + 1) * STEPS);
        retired(device, 2);
    }
    GLOBAL.stop()
}

#[test]
fn released_chains_allocate_nothing_once_warm() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (_fake, _driver, device) = open("alloc-released", queues(2));
    let allocations = released_chains(&device, 20, 200);
    assert_eq!(
        allocations, 0,
        "allocations over 200 released chains of 100 steps"
    );
}
