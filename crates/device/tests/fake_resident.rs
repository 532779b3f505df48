//! Resident queues are opt-in, and refused with a typed error naming what is missing where the
//! driver or device lacks what they need (the fake driver loads no real scheduler cubin, and a
//! test hides `cuGraphNodeGetType`); the device's queues work as before.

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
        .expect("the fake driver cannot run a resident queue");
    let Error::ResidentUnavailable { missing } = &err else {
        panic!("expected ResidentUnavailable, got {err}")
    };
    // The fake loads no real cubin: the scheduler kernel cannot be found in it.
    assert!(
        matches!(missing.as_slice(), [ResidentMissing::SchedulerLoad(_)]),
        "{missing:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("not available on this device/driver"),
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

#[test]
fn a_driver_without_what_a_resident_queue_calls_is_named() {
    let (_fake, driver) = load_with("resident-old", |fake| fake.hide("cuGraphNodeGetType"));
    let device = driver.open(0, queues(1)).unwrap();
    let err = device
        .open_resident_queue(&ResidentOptions::new("resident"))
        .err()
        .expect("a driver without cuGraphNodeGetType cannot run a resident queue");
    let Error::ResidentUnavailable { missing } = &err else {
        panic!("expected ResidentUnavailable, got {err}")
    };
    assert_eq!(
        missing,
        &[ResidentMissing::DriverFunction("cuGraphNodeGetType")]
    );
    assert!(err.to_string().contains("cuGraphNodeGetType"), "{err}");
}

#[test]
fn bad_options_are_refused_before_anything_is_made() {
    let (_fake, driver) = load("resident-options");
    let device = driver.open(0, queues(1)).unwrap();
    let mut options = ResidentOptions::new("resident");
    options.launches_per_execution = 0;
    // The fake cannot load the scheduler either; the options are checked first.
    let err = device.open_resident_queue(&options).err().unwrap();
    assert!(matches!(err, Error::Resident(_)), "{err}");
}
