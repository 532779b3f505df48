//! Several devices on the fake driver: opening a subset, peer access, semaphores one device
//! signals and another waits for on the device, and peer copies as queue operations and
//! command-buffer commands.

mod fake_support;

use cuhal_sys::cu_name;
use std::sync::Arc;

use cuhal::{CommandBuffer, DeviceOptions, Error, FillPattern, LinkKind};
use fake_support::{TIMEOUT, load, read, wait};

#[test]
fn opens_any_subset_and_enables_peer_access_both_ways() {
    let (fake, driver) = load("multi-open");
    fake.set_device_count(3);
    let devices = driver.open_many(&[2, 0], DeviceOptions::default()).unwrap();
    assert_eq!(devices[0].info().ordinal, 2);
    assert_eq!(devices[1].info().ordinal, 0);
    assert_eq!(devices[0].peers(), vec![0]);
    assert_eq!(devices[1].peers(), vec![2]);
    assert!(!devices[0].has_peer_access(1), "device 1 was not opened");
    assert_eq!(fake.calls(cu_name!(cuCtxEnablePeerAccess)), 2);
    // Buffers are pool memory, which context peer access does not open: each device's pool
    // lets the other device in.
    assert_eq!(fake.counts().pool_peer_grants, 2);
    // Enabling again is not an error (the driver's ALREADY_ENABLED is absorbed).
    assert!(devices[0].enable_peer_access(&devices[1]).unwrap());
    assert!(matches!(
        devices[0].enable_peer_access(&devices[0]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        driver.open_many(&[1, 1], DeviceOptions::default()),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        driver.open_many(&[0, 7], DeviceOptions::default()),
        Err(Error::NoSuchDevice { ordinal: 7, .. })
    ));
}

#[test]
fn topology_lists_every_ordered_pair() {
    let (fake, driver) = load("multi-topology");
    fake.set_device_count(2);
    let links = driver.topology().unwrap();
    assert_eq!(links.len(), 2);
    assert_eq!((links[0].source, links[0].destination), (0, 1));
    assert_eq!((links[1].source, links[1].destination), (1, 0));
    assert!(
        links
            .iter()
            .all(|l| l.access && l.kind() == LinkKind::NvLink)
    );
    assert_eq!(links[0].performance_rank, 0);
}

#[test]
fn without_peer_access_devices_open_and_peer_copies_still_work() {
    // The setting is read from the environment when the instance starts, so run it in a child
    // with its own copy of the library.
    if std::env::var_os("CUHAL_MULTI_NO_PEER_CHILD").is_none() {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "without_peer_access_devices_open_and_peer_copies_still_work",
                "--nocapture",
            ])
            .env("CUHAL_MULTI_NO_PEER_CHILD", "1")
            .env(cuhal_fake_driver::config::NO_PEER_ACCESS_ENV, "1")
            .status()
            .unwrap();
        assert!(status.success(), "child run failed: {status}");
        return;
    }
    let (fake, driver) = load("multi-nopeer");
    fake.set_device_count(2);
    let links = driver.topology().unwrap();
    assert!(
        links
            .iter()
            .all(|l| !l.access && l.kind() == LinkKind::None)
    );
    let devices = driver.open_all(DeviceOptions::default()).unwrap();
    assert!(devices.iter().all(|d| d.peers().is_empty()));
    assert_eq!(fake.calls(cu_name!(cuCtxEnablePeerAccess)), 0);
    assert_eq!(fake.counts().pool_peer_grants, 0);
    peer_copy_round_trip(&devices[0], &devices[1]);
}

/// Writes a pattern on `a`, copies it to `b` on `b`'s queue (a peer copy), reads it back.
fn peer_copy_round_trip(a: &cuhal::Device, b: &cuhal::Device) {
    let source = a.create_buffer(4096).unwrap();
    let target = b.create_buffer(4096).unwrap();
    let written = a.create_semaphore(0);
    let copied = b.create_semaphore(0);
    let bytes: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    a.queue(0)
        .write(&[], &[(&written, 1)], &source.whole(), &bytes)
        .unwrap();
    b.queue(0)
        .copy_peer(
            &[(&written, 1)],
            &[(&copied, 1)],
            &source.whole(),
            &target.whole(),
        )
        .unwrap();
    wait(&copied, 1);
    assert_eq!(read(b, b.queue(0), &target.whole()), bytes);
}

#[test]
fn a_queue_of_one_device_waits_on_the_device_for_another_devices_signal() {
    let (fake, driver) = load("multi-wait");
    fake.set_device_count(2);
    let devices = driver.open_all(DeviceOptions::default()).unwrap();
    let (gpu0, gpu1) = (&devices[0], &devices[1]);
    let data = gpu1.create_buffer(256).unwrap();
    let produced = gpu0.create_semaphore(0);
    let consumed = gpu1.create_semaphore(0);
    // Device 0's completion thread is held in a host call, so the barrier behind it is issued
    // (its completion event recorded as `produced`'s device timepoint) but `produced` stays 0 on
    // the host: device 1's fill can only be ready through a device wait on device 0's event.
    let (release, held) = std::sync::mpsc::channel::<()>();
    let (entered_tx, entered) = std::sync::mpsc::channel::<()>();
    gpu0.queue(0)
        .host_call(&[], &[], move || {
            let _ = entered_tx.send(());
            let _ = held.recv_timeout(TIMEOUT);
            Ok(())
        })
        .unwrap();
    // Submitted only once the completion thread is inside the call: a barrier it took in the
    // same batch would have its signal advanced before the call runs.
    entered.recv_timeout(TIMEOUT).unwrap();
    gpu0.queue(0).barrier(&[], &[(&produced, 1)]).unwrap();
    let waits_before = fake.calls(cu_name!(cuStreamWaitEvent));
    let issued_before = gpu1.queue(0).stats().issued_on_submit;
    gpu1.queue(0)
        .fill(
            &[(&produced, 1)],
            &[(&consumed, 1)],
            &data.whole(),
            FillPattern::U8(0x5a),
        )
        .unwrap();
    assert_eq!(
        produced.query().unwrap(),
        0,
        "the host value must not have moved yet"
    );
    assert_eq!(
        gpu1.queue(0).stats().issued_on_submit,
        issued_before + 1,
        "the fill was issued at once, on the submitting thread"
    );
    assert_eq!(
        fake.calls(cu_name!(cuStreamWaitEvent)),
        waits_before + 1,
        "one cuStreamWaitEvent on device 1's stream for device 0's event"
    );
    wait(&consumed, 1);
    release.send(()).unwrap();
    wait(&produced, 1);
    assert_eq!(read(gpu1, gpu1.queue(0), &data.whole()), vec![0x5a; 256]);

    // A chain back and forth, each step waiting for the other device's signal.
    let step = gpu0.create_semaphore(0);
    for i in 0..8u64 {
        devices[(i % 2) as usize]
            .queue(0)
            .barrier(&[(&step, i)], &[(&step, i + 1)])
            .unwrap();
    }
    wait(&step, 8);
}

#[test]
fn peer_copies_as_queue_operations_in_both_directions() {
    let (fake, driver) = load("multi-copy");
    fake.set_device_count(2);
    let devices = driver.open_all(DeviceOptions::default()).unwrap();
    let calls = fake.calls(cu_name!(cuMemcpyPeerAsync));
    peer_copy_round_trip(&devices[0], &devices[1]);
    peer_copy_round_trip(&devices[1], &devices[0]);
    assert_eq!(fake.calls(cu_name!(cuMemcpyPeerAsync)), calls + 2);
    // A copy whose two ends are both another device's is refused.
    let a = devices[1].create_buffer(64).unwrap();
    let b = devices[1].create_buffer(64).unwrap();
    assert!(matches!(
        devices[0]
            .queue(0)
            .copy_peer(&[], &[], &a.whole(), &b.whole()),
        Err(Error::WrongDevice { .. })
    ));
    // A plain copy still refuses another device's buffer.
    let mine = devices[0].create_buffer(64).unwrap();
    assert!(matches!(
        devices[0]
            .queue(0)
            .copy(&[], &[], &a.whole(), &mine.whole()),
        Err(Error::WrongDevice { .. })
    ));
}

#[test]
fn peer_copies_as_command_buffer_commands_graph_and_deferred() {
    for mode in [
        cuhal::CommandBufferMode::Graph,
        cuhal::CommandBufferMode::Deferred,
    ] {
        let (fake, driver) = load("multi-cb-copy");
        fake.set_device_count(2);
        let devices = driver
            .open_all(DeviceOptions {
                command_buffer_mode: mode,
                ..DeviceOptions::default()
            })
            .unwrap();
        let (gpu0, gpu1) = (&devices[0], &devices[1]);
        let local = gpu0.create_buffer(1024).unwrap();
        let remote = gpu1.create_buffer(1024).unwrap();
        let back = gpu0.create_buffer(1024).unwrap();
        let mut cb = gpu0.queue(0).create_command_buffer().unwrap();
        cb.fill(&local.whole(), FillPattern::U32(0x1234_5678))
            .unwrap();
        cb.barrier().unwrap();
        // A plain copy refuses the peer's buffer; a peer copy takes it.
        assert!(cb.copy(&local.whole(), &remote.whole()).is_err());
        cb.copy_peer(&local.whole(), &remote.whole()).unwrap();
        cb.barrier().unwrap();
        cb.copy_peer(&remote.whole(), &back.whole()).unwrap();
        // Both ends on the peer: refused with the command crate's context error.
        let other = gpu1.create_buffer(1024).unwrap();
        assert!(cb.copy_peer(&remote.whole(), &other.whole()).is_err());
        let cb: Arc<dyn CommandBuffer> = cb.end().unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        let done = gpu0.create_semaphore(0);
        gpu0.queue(0).execute(&[], &[(&done, 1)], &[&cb]).unwrap();
        wait(&done, 1);
        let expected: Vec<u8> = 0x1234_5678u32.to_le_bytes().repeat(256);
        assert_eq!(read(gpu1, gpu1.queue(0), &remote.whole()), expected);
        assert_eq!(read(gpu0, gpu0.queue(0), &back.whole()), expected);
    }
}
