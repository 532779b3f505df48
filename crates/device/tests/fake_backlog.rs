//! A completion side that falls behind the submitter: the queue holds the submitter back, so
//! the completion events created and the process's memory stay flat instead of growing with the
//! backlog. Its own test binary, so its memory is its own.

mod fake_support;

use std::time::Duration;

use cuhal::DeviceOptions;
use fake_support::*;

/// Resident memory of this process, in bytes (Linux `/proc/self/statm`; 0 elsewhere).
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

#[test]
fn a_slow_completion_side_keeps_events_and_memory_flat() {
    const LIMIT: usize = 64;
    let options = DeviceOptions {
        max_in_flight: LIMIT,
        ..queues(1)
    };
    let (_fake, _driver, device) = open("backlog", options);
    let queue = device.queue(0);
    let step = device.create_semaphore(0);
    let slow = device.create_semaphore(0);
    let mut value = 0u64;
    let mut slow_value = 0u64;
    // Every 500 submissions a host call holds the completion thread for 2 ms: far slower than
    // the submitter, which would otherwise run ahead by thousands of actions.
    let round = |count: usize, value: &mut u64, slow_value: &mut u64| {
        for _ in 0..count {
            *value += 1;
            queue.barrier(&[], &[(&step, *value)]).unwrap();
            if value.is_multiple_of(500) {
                *slow_value += 1;
                queue
                    .host_call(&[], &[(&slow, *slow_value)], || {
                        std::thread::sleep(Duration::from_millis(2));
                        Ok(())
                    })
                    .unwrap();
            }
        }
    };
    round(5_000, &mut value, &mut slow_value);
    wait(&step, value);
    settle(queue);
    let (events_warm, _) = device.event_counts();
    let resident_warm = resident_bytes();
    round(100_000, &mut value, &mut slow_value);
    wait(&step, value);
    wait(&slow, slow_value);
    settle(queue);
    let (events, in_use) = device.event_counts();
    let resident = resident_bytes();
    let stats = queue.stats();
    println!(
        "events created {events_warm} -> {events} (in use {in_use}); resident {resident_warm} -> {resident} bytes; {stats:?}"
    );
    assert_eq!(events, events_warm, "no event created after warm-up");
    assert!(
        events <= DeviceOptions::default().reserved_events + LIMIT + 8,
        "events bounded by the in-flight limit: {events}"
    );
    assert!(
        stats.in_flight_high_water <= LIMIT as u64 + 1,
        "in flight bounded: {stats:?}"
    );
    // Unbounded, 100,000 actions in flight hold tens of MiB (each keeps its body and an event).
    assert!(
        resident.saturating_sub(resident_warm) < 8 << 20,
        "memory grew by {} bytes",
        resident.saturating_sub(resident_warm)
    );
}
