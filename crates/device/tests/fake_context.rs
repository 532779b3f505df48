//! cuhal never leaves another runtime's thread on the wrong context: on a thread where another
//! context is current (PyTorch on another GPU, say), opening a device, allocating, submitting and
//! dropping all leave that context current; on a thread with none, cuhal's becomes current.

mod fake_support;

use cuhal_sys::cu;
use cuhal_sys::cu_name;
use std::sync::Arc;

use cuhal::{DeviceOptions, FillPattern};
use cuhal_sys::{CUcontext, DriverApi, PrimaryContext};
use fake_support::{load, settle, wait};

fn current(api: &DriverApi) -> CUcontext {
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: `context` is a valid out-pointer.
    unsafe { cu!(api, cuCtxGetCurrent(&mut context)) }.unwrap();
    context
}

#[test]
fn a_foreign_current_context_survives_everything_cuhal_does() {
    let (fake, driver) = load("context-foreign");
    fake.set_device_count(2);
    let api = driver.api().clone();
    std::thread::spawn(move || {
        // "Another runtime": device 1's primary context, current on this thread.
        let other = PrimaryContext::retain(api.clone(), 1).unwrap();
        other.bind().unwrap();
        assert_eq!(current(&api), other.raw());

        let device = driver.open(0, DeviceOptions::default()).unwrap();
        assert_ne!(device.context().raw(), other.raw());
        assert_eq!(
            current(&api),
            other.raw(),
            "opening a device switched the thread"
        );

        let buffer = device.create_buffer(1024).unwrap();
        assert_eq!(current(&api), other.raw(), "allocating switched the thread");

        let queue = device.queue(0);
        let done = device.create_semaphore(0);
        // Ready at once: issued on this thread.
        queue
            .fill(&[], &[(&done, 1)], &buffer.whole(), FillPattern::U32(7))
            .unwrap();
        wait(&done, 1);
        assert_eq!(current(&api), other.raw(), "submitting switched the thread");

        settle(queue);
        drop(buffer);
        drop(device);
        assert_eq!(current(&api), other.raw(), "dropping switched the thread");
    })
    .join()
    .unwrap();
}

#[test]
fn a_thread_without_a_context_gets_cuhals() {
    let (_fake, driver) = load("context-none");
    let device = Arc::new(driver.open(0, DeviceOptions::default()).unwrap());
    let api = driver.api().clone();
    std::thread::spawn(move || {
        assert!(
            current(&api).is_null(),
            "a new thread starts with no context"
        );
        let buffer = device.create_buffer(64).unwrap();
        assert_eq!(
            current(&api),
            device.context().raw(),
            "cuhal's context stays current for the next call"
        );
        drop(buffer);
    })
    .join()
    .unwrap();
}

#[test]
fn queues_take_their_stream_priorities() {
    let (fake, driver) = load("context-priorities");
    let before = fake.calls(cu_name!(cuStreamCreateWithPriority));
    let device = driver
        .open(
            0,
            DeviceOptions {
                queues: 3,
                queue_priorities: vec![-1, 0],
                ..DeviceOptions::default()
            },
        )
        .unwrap();
    assert_eq!(device.queues().len(), 3);
    assert_eq!(fake.calls(cu_name!(cuStreamCreateWithPriority)) - before, 3);
}
