//! A sticky error on the fake driver: the device is lost, pending work on every queue fails
//! with that error, every later call returns `Error::Lost`, and nothing waits forever or leaks.

mod fake_support;

use cuhal::FillPattern;
use cuhal_fake_driver::control::Counts;
use cuhal_sys::cu_name;
use fake_support::*;

#[test]
fn an_injected_sticky_error_loses_the_device() {
    let (fake, driver) = load("lost");
    let device = driver.open(0, queues(2)).unwrap();
    let (q0, q1) = (device.queue(0), device.queue(1));
    let scene = stage_loss(&device);
    let (a, s, p0, p1) = (&scene.buffer, &scene.s, &scene.p0, &scene.p1);
    assert_eq!(q0.stats().pending + q1.stats().pending, 3);

    scene.fault(&fake);
    let failure = failure_of(s, 1);
    assert_driver_result(&failure, cuhal_sys::CUresult::ERROR_ILLEGAL_ADDRESS);
    assert!(device.lost().is_some_and(|f| f.ptr_eq(&failure)));

    // Pending work on both queues fails with it.
    for (name, semaphore) in [("queue 0", &p0), ("queue 1", &p1)] {
        let got = failure_of(semaphore, 1);
        assert!(
            got.ptr_eq(&failure),
            "{name}'s pending work failed with {got}"
        );
    }
    // Every later call is refused with the same failure.
    let t = device.create_semaphore(0);
    assert_lost(
        q1.fill(&[], &[(&t, 1)], &a.whole(), FillPattern::U8(4))
            .unwrap_err(),
        &failure,
        "fill",
    );
    assert_lost(
        q0.barrier(&[], &[(&t, 1)]).unwrap_err(),
        &failure,
        "barrier",
    );
    assert_lost(q1.alloca(&[], &[], 64).unwrap_err(), &failure, "alloca");
    assert_lost(
        q0.create_command_buffer().err().unwrap(),
        &failure,
        "create_command_buffer",
    );
    assert_lost(
        device.create_buffer(64).unwrap_err(),
        &failure,
        "create_buffer",
    );
    assert_lost(device.load_ptx(PTX).unwrap_err(), &failure, "load_ptx");
    let image = format!("{PTX}\0");
    assert_lost(
        device.load_cubin(image.as_bytes()).unwrap_err(),
        &failure,
        "load_cubin",
    );
    assert_lost(
        q0.create_command_buffer_as(cuhal::CommandBufferMode::Deferred, 0)
            .err()
            .unwrap(),
        &failure,
        "create_command_buffer_as",
    );
    assert_lost(
        q1.write(&[], &[], &a.whole(), &[0; 256]).unwrap_err(),
        &failure,
        "write",
    );
    assert_eq!(t.query().unwrap(), 0, "a refused call signals nothing");

    // Shutting down a lost device neither hangs nor leaks.
    fake.clear_faults();
    drop((scene, device));
    assert_eq!(live(&fake), Counts::default());
}

#[test]
fn a_failed_fill_fails_its_signal_with_the_drivers_error() {
    let (fake, _driver, device) = open("fillfail", queues(1));
    let q = device.queue(0);
    let a = device.create_buffer(64).unwrap();
    // Only the next 32-bit fill fails, with an error that does not lose the context.
    fake.fail_calls(
        cu_name!(cuMemsetD32Async),
        1,
        1,
        cuhal_fake_driver::status::INVALID_VALUE,
    );
    let s = device.create_semaphore(0);
    q.fill(&[], &[(&s, 1)], &a.whole(), FillPattern::U32(9))
        .ok();
    let failure = failure_of(&s, 1);
    assert_driver_result(&failure, cuhal_sys::CUresult::ERROR_INVALID_VALUE);
    assert!(device.lost().is_none(), "not a sticky error");
    assert_eq!(fake.calls(cu_name!(cuMemsetD32Async)), 1);
}
