//! The device on the fake driver: loading, opening, transfers and fills, stream-ordered
//! allocations, and a device that frees everything it made when dropped.

mod fake_support;

use cuhal_sys::cu_name;
use std::sync::Arc;

use cuhal::{CommandBuffer, DeviceOptions, Error, FillPattern, KernelArgs};
use cuhal_fake_driver::control::Counts;
use cuhal_fake_driver::driver;
use fake_support::*;

#[test]
fn the_driver_lists_the_fake_devices_and_opens_them() {
    let (fake, driver) = load("open");
    assert_eq!(driver.version(), 13000);
    let devices = driver.devices().unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].name, driver::device_name(0));
    assert_eq!(devices[0].compute_capability, (9, 0));
    assert_eq!(live(&fake), Counts::default(), "loading creates nothing");

    let device = driver.open(0, queues(2)).unwrap();
    assert_eq!(device.info().ordinal, 0);
    assert_eq!(device.queues().len(), 2);
    assert!(device.lost().is_none());
    let counts = fake.counts();
    assert_eq!(counts.context_retains, 1);
    assert_eq!(
        counts.pools, 1,
        "the device's pool for stream-ordered allocations"
    );
    // Each queue: its stream and the completion thread's sleep stream; and the stream that
    // buffers are allocated and freed on.
    assert_eq!(counts.streams, 5);
    let reserved = DeviceOptions::default().reserved_events as u64;
    assert!(counts.events >= reserved, "{counts:?}");
    assert_eq!(
        device.event_counts().0 as u64 + 2,
        counts.events,
        "pool + sleep events"
    );

    match driver.open(1, queues(1)) {
        Err(Error::NoSuchDevice {
            ordinal: 1,
            count: 1,
        }) => {}
        other => panic!("device 1 of 1: {other:?}"),
    }
    assert!(matches!(
        driver.open(0, queues(0)),
        Err(Error::InvalidArgument(_))
    ));
    // Too many queues is a typed error too, before anything is made (not a capacity panic).
    for too_many in [cuhal::MAX_QUEUES + 1, usize::MAX] {
        match driver.open(0, queues(too_many)) {
            Err(Error::InvalidArgument(why)) => assert!(why.contains("at most"), "{why}"),
            other => panic!("{too_many} queues: {:?}", other.map(|_| ())),
        }
    }
    drop(device);
    assert_eq!(live(&fake), Counts::default());
}

#[test]
fn buffers_come_from_the_pool_and_go_back_in_stream_order_without_cu_mem_free() {
    let (fake, driver) = load("pooled-buffers");
    let device = driver.open(0, queues(1)).unwrap();
    let before = fake.counts();
    let (allocs, frees) = (
        fake.calls(cu_name!(cuMemAlloc)),
        fake.calls(cu_name!(cuMemFree)),
    );
    let buffer = device.create_buffer(1000).unwrap();
    assert_eq!(buffer.device_ptr() % 256, 0);
    assert_eq!(buffer.len(), 1000);
    assert_eq!(
        fake.counts().device_allocations,
        before.device_allocations + 1
    );
    assert_eq!(fake.calls(cu_name!(cuMemAlloc)), allocs, "not cuMemAlloc");
    assert!(fake.calls(cu_name!(cuMemAllocFromPoolAsync)) >= 1);

    // The queue holds the buffer until the fill completed; the last reference goes there.
    let done = device.create_semaphore(0);
    device
        .queue(0)
        .fill(&[], &[(&done, 1)], &buffer.whole(), FillPattern::U32(7))
        .unwrap();
    drop(buffer);
    wait(&done, 1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while fake.counts().device_allocations != before.device_allocations {
        assert!(
            std::time::Instant::now() < deadline,
            "the buffer was never freed: {:?}",
            fake.counts()
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(
        fake.calls(cu_name!(cuMemFree)),
        frees,
        "a dropped buffer must not go through cuMemFree, which waits for the whole device"
    );
    assert!(fake.calls(cu_name!(cuMemFreeAsync)) >= 1);

    assert!(matches!(
        device.create_buffer(0),
        Err(Error::Command(cuhal_command::Error::ZeroSize { .. }))
    ));
    // A buffer may outlive its device: the pool, the stream and the context stay until it goes.
    let kept = device.create_buffer(64).unwrap();
    drop(device);
    assert_eq!(fake.counts().device_allocations, 1);
    drop(kept);
    assert_eq!(live(&fake), Counts::default());
}

/// The expected contents after a fill of `pattern` over `bytes[offset..offset + len]`.
fn fill_model(bytes: &mut [u8], offset: usize, len: usize, pattern: FillPattern) {
    let element: Vec<u8> = match pattern {
        FillPattern::U8(v) => vec![v],
        FillPattern::U16(v) => v.to_ne_bytes().to_vec(),
        FillPattern::U32(v) => v.to_ne_bytes().to_vec(),
    };
    for (i, byte) in bytes[offset..offset + len].iter_mut().enumerate() {
        *byte = element[i % element.len()];
    }
}

#[test]
fn write_fill_copy_read_round_trip_random_data() {
    let (_fake, _driver, device) = open("transfers", queues(1));
    let q = device.queue(0);
    let mut rng = Rng::new();
    const LEN: usize = 4096;
    let a = device.create_buffer(LEN).unwrap();
    let b = device.create_buffer(LEN).unwrap();
    poison(&device, q, &a.whole());
    poison(&device, q, &b.whole());

    let mut model = rng.bytes(LEN);
    let step = device.create_semaphore(0);
    q.write(&[], &[(&step, 1)], &a.whole(), &model).unwrap();
    // Fills of every width at random aligned offsets, ordered by the semaphore.
    let mut value = 1;
    for size in [1usize, 2, 4, 4, 2, 1] {
        let offset = rng.below(LEN / size / 2) * size;
        let len = (1 + rng.below((LEN - offset) / size - 1)) * size;
        let pattern = match size {
            1 => FillPattern::U8(rng.next_u64() as u8),
            2 => FillPattern::U16(rng.next_u64() as u16),
            _ => FillPattern::U32(rng.next_u64() as u32),
        };
        fill_model(&mut model, offset, len, pattern);
        let range = a.range(offset, len).unwrap();
        q.fill(&[(&step, value)], &[(&step, value + 1)], &range, pattern)
            .unwrap();
        value += 1;
    }
    // Copy the second half of A over the first half of B; B's second half stays poisoned.
    let half = LEN / 2;
    q.copy(
        &[(&step, value)],
        &[(&step, value + 1)],
        &a.range(half, half).unwrap(),
        &b.range(0, half).unwrap(),
    )
    .unwrap();
    wait(&step, value + 1);

    assert_eq!(
        read(&device, q, &a.whole()),
        model,
        "A after write and fills"
    );
    let got = read(&device, q, &b.whole());
    assert_eq!(&got[..half], &model[half..], "B's copied half");
    assert!(
        got[half..].iter().all(|&b| b == POISON),
        "B's untouched half"
    );

    // A read at an offset into a larger host buffer leaves the rest alone.
    let mut host = device.create_host_buffer(LEN + 64).unwrap();
    Arc::get_mut(&mut host)
        .expect("no queued work holds the buffer")
        .write(0, &[POISON; LEN + 64])
        .unwrap();
    let done = device.create_semaphore(0);
    q.read(&[], &[(&done, 1)], &a.range(64, 128).unwrap(), &host, 32)
        .unwrap();
    wait(&done, 1);
    let bytes = host_bytes(&host);
    assert!(bytes[..32].iter().all(|&b| b == POISON));
    assert_eq!(&bytes[32..160], &model[64..192]);
    assert!(bytes[160..].iter().all(|&b| b == POISON));
}

#[test]
fn fills_refuse_misaligned_ranges_before_the_driver_sees_them() {
    let (fake, _driver, device) = open("misaligned", queues(1));
    let q = device.queue(0);
    let a = device.create_buffer(64).unwrap();
    let before = fake.calls(cu_name!(cuMemsetD32Async)) + fake.calls(cu_name!(cuMemsetD16Async));
    let s = device.create_semaphore(0);
    assert!(
        q.fill(
            &[],
            &[(&s, 1)],
            &a.range(2, 8).unwrap(),
            FillPattern::U32(1)
        )
        .is_err()
    );
    assert!(
        q.fill(
            &[],
            &[(&s, 1)],
            &a.range(0, 3).unwrap(),
            FillPattern::U16(1)
        )
        .is_err()
    );
    assert_eq!(
        fake.calls(cu_name!(cuMemsetD32Async)) + fake.calls(cu_name!(cuMemsetD16Async)),
        before
    );
    assert_eq!(s.query().unwrap(), 0, "a refused operation signals nothing");
}

#[test]
fn alloca_and_dealloca_leak_nothing() {
    let (fake, _driver, device) = open("alloca", queues(2));
    let (q0, q1) = (device.queue(0), device.queue(1));
    let baseline = fake.counts();
    let mut rng = Rng::new();

    let ready = device.create_semaphore(0);
    let buffer = q0.alloca(&[], &[(&ready, 1)], 1000).unwrap();
    assert_eq!(
        fake.counts().device_allocations,
        baseline.device_allocations + 1
    );
    assert_eq!(
        buffer.device_ptr() % 256,
        0,
        "allocations are 256-byte aligned"
    );
    // The other queue uses the memory once the alloca's signal says it exists.
    let data = rng.bytes(1000);
    let written = device.create_semaphore(0);
    q1.write(&[(&ready, 1)], &[(&written, 1)], &buffer.whole(), &data)
        .unwrap();
    wait(&written, 1);
    assert_eq!(read(&device, q1, &buffer.whole()), data);
    let freed = device.create_semaphore(0);
    q1.dealloca(&[(&written, 1)], &[(&freed, 1)], &buffer)
        .unwrap();
    wait(&freed, 1);
    // The write's and the read's uses end when the queue retires them, which may be after the
    // dealloca's signal: the last of them frees.
    settle(q1);
    assert_eq!(fake.calls(cu_name!(cuMemFreeAsync)), 1);
    assert_eq!(
        fake.counts().device_allocations,
        baseline.device_allocations
    );

    // One never deallocated is freed when its last handle goes.
    let kept = q0.alloca(&[], &[], 64).unwrap();
    assert_eq!(
        fake.counts().device_allocations,
        baseline.device_allocations + 1
    );
    // A buffer the queue did not allocate is refused.
    let plain = device.create_buffer(64).unwrap();
    assert!(matches!(
        q0.dealloca(&[], &[], &plain),
        Err(Error::InvalidArgument(_))
    ));
    drop((kept, plain));
    // The alloca's action holds the allocation until the queue retires it, which may be just
    // after its signal: wait for the retirement, not a semaphore.
    settle(q0);
    assert_eq!(
        fake.counts().device_allocations,
        baseline.device_allocations
    );
    assert_eq!(fake.counts().device_bytes, baseline.device_bytes);
}

#[test]
fn dropping_the_device_frees_everything_it_made() {
    let (fake, driver) = load("drop");
    let before = live(&fake);
    assert_eq!(before, Counts::default());
    {
        let device = driver.open(0, queues(2)).unwrap();
        let (q0, q1) = (device.queue(0), device.queue(1));
        let a = device.create_buffer(256).unwrap();
        let staged = q0.alloca(&[], &[], 512).unwrap();
        let module = device.load_ptx(PTX).unwrap();
        let scale = module.function("scale").unwrap();
        let args = KernelArgs::new()
            .with_range(&a.whole())
            .with(3u32)
            .with(64u32);
        let mut cb = q0.create_command_buffer().unwrap();
        cb.fill(&a.whole(), FillPattern::U32(5)).unwrap();
        cb.dispatch(&cuhal::Dispatch::new(&scale, [1, 1, 1], [64, 1, 1], &args))
            .unwrap();
        let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
        let (s, t) = (device.create_semaphore(0), device.create_semaphore(0));
        q0.execute(&[], &[(&s, 1)], &[&cb]).unwrap();
        q1.copy(
            &[(&s, 1)],
            &[(&t, 1)],
            &a.range(0, 256).unwrap(),
            &staged.range(0, 256).unwrap(),
        )
        .unwrap();
        wait(&t, 1);
        // Work still waiting when the device goes is failed, not leaked.
        let never = device.create_semaphore(0);
        q1.fill(&[(&never, 1)], &[], &a.whole(), FillPattern::U8(0))
            .unwrap();
        let during = live(&fake);
        assert!(during.graphs == 1 && during.graph_execs == 1 && during.modules == 1);
        assert!(during.device_allocations >= 2, "{during:?}");
        assert_eq!(fake.launches("scale"), 1);
        drop((cb, scale, module, a, staged));
    }
    assert_eq!(
        live(&fake),
        before,
        "left alive after the device and everything it made"
    );
}

/// A window without bound (no backpressure, gathers ended by time alone) opens a device: what
/// a queue makes up front is capped, and the rest grows on demand (it used to overflow a
/// capacity computation and panic).
#[test]
fn an_unbounded_window_opens_and_runs() {
    let options = DeviceOptions {
        max_in_flight: usize::MAX,
        completion: cuhal::CompletionOptions::new().with_gather_batch(usize::MAX),
        ..queues(1)
    };
    let (_fake, _driver, device) = open("unbounded-window", options);
    let s = device.create_semaphore(0);
    for value in 1..=300 {
        device.queue(0).barrier(&[], &[(&s, value)]).unwrap();
    }
    wait(&s, 300);
    assert_eq!(
        cuhal_scheduler::QueueOptions::new("q")
            .with_capacity(usize::MAX)
            .capacity(),
        cuhal_scheduler::QueueOptions::MAX_CAPACITY
    );
}

/// A device out of memory says so, with what was asked for and how much: a buffer (after the
/// pool gave back what it held) and an alloca; the device is not lost, and allocations work
/// again once memory is back.
#[test]
fn out_of_device_memory_names_what_and_how_much() {
    let (fake, _driver, device) = open("oom", queues(1));
    const OUT_OF_MEMORY: i32 = 2;
    fake.fail(cu_name!(cuMemAllocFromPoolAsync), OUT_OF_MEMORY);
    let q = device.queue(0);
    for (what, result) in [
        ("buffer", device.create_buffer(1 << 20).map(drop)),
        ("alloca", q.alloca(&[], &[], 1 << 20).map(drop)),
    ] {
        let error = result.unwrap_err();
        let text = error.to_string();
        match error {
            Error::OutOfDeviceMemory {
                what: w,
                bytes,
                cuda,
            } => {
                assert_eq!((w, bytes), (what, 1 << 20));
                assert_eq!(
                    cuda.result(),
                    Some(cuhal_sys::CUresult::ERROR_OUT_OF_MEMORY)
                );
                assert!(text.contains("1048576 bytes"), "{text}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    fake.clear_faults();
    assert!(device.lost().is_none());
    device.create_buffer(64).unwrap();
}
