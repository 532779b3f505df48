//! Resident queues are opt-in and, until the device-side scheduler is built, refused on every
//! device with a typed error naming what is missing; the device's queues work as before.

mod fake_support;

use std::time::Duration;

use cuhal::{Error, FillPattern, ResidentMissing, ResidentOptions};
use fake_support::*;

#[test]
fn opening_a_resident_queue_is_a_typed_refusal_naming_what_is_missing() {
    let (_fake, driver) = load("resident");
    let device = driver.open(0, queues(1)).unwrap();
    let err = device
        .open_resident_queue(&ResidentOptions::new("resident"))
        .err()
        .expect("no device can open a resident queue yet");
    let Error::ResidentUnavailable { missing } = &err else {
        panic!("expected ResidentUnavailable, got {err}")
    };
    assert!(missing.contains(&ResidentMissing::SchedulerKernel));
    assert!(missing.contains(&ResidentMissing::DeviceLaunchInstantiation));
    let text = err.to_string();
    assert!(
        text.contains("not available on this device/driver yet"),
        "{text}"
    );
    assert!(text.contains("scheduler kernel"), "{text}");

    // The normal queue is untouched.
    let buffer = device.create_buffer(256).unwrap();
    let done = device.create_semaphore(0);
    device
        .queue(0)
        .fill(&[], &[(&done, 1)], &buffer.whole(), FillPattern::U8(1))
        .unwrap();
    done.wait(1, Duration::from_secs(10)).unwrap();
}
