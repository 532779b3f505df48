//! Interoperation on the fake driver: foreign memory checked with `cuPointerGetAttribute` and
//! released once after its last queued use, foreign events waited on by queue operations, and
//! semaphore timepoints exported as events a foreign stream waits on.
//!
//! The "foreign runtime" here is raw driver calls through the same loaded driver, as another
//! library in the process would make them.

mod fake_support;

use cuhal_sys::cu_name;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cuhal::{Error, ExportedBuffer, FillPattern, ForeignEvent, Release};
use cuhal_sys::{CU_EVENT_DISABLE_TIMING, CU_STREAM_NON_BLOCKING, CUdeviceptr, CUevent, cu};
use fake_support::*;

/// A release callback that counts its runs.
fn counted(counter: &Arc<AtomicUsize>) -> Option<Release> {
    let counter = Arc::clone(counter);
    Some(Box::new(move || {
        counter.fetch_add(1, Ordering::SeqCst);
    }))
}

/// `cuMemAlloc` in the device's context, as another runtime would allocate.
fn raw_alloc(device: &cuhal::Device, len: usize) -> CUdeviceptr {
    let context = device.context();
    let _bound = context.enter().unwrap();
    let api = context.api();
    let mut ptr = 0;
    // SAFETY: valid out-pointer; the context is current.
    unsafe { cu!(api, cuMemAlloc(&mut ptr, len)) }.unwrap();
    ptr
}

fn raw_free(device: &cuhal::Device, ptr: CUdeviceptr) {
    let context = device.context();
    let _bound = context.enter().unwrap();
    let api = context.api();
    // SAFETY: `ptr` came from raw_alloc and is freed once, after every use of it.
    unsafe { cu!(api, cuMemFree(ptr)) }.unwrap();
}

#[test]
fn foreign_pointers_are_checked_against_the_device() {
    let (fake, driver) = load("interop-check");
    fake.set_device_count(2);
    let device = driver.open(0, queues(1)).unwrap();
    let other = driver.open(1, queues(1)).unwrap();
    let never = Arc::new(AtomicUsize::new(0));

    // Plain host memory: the driver does not know the address.
    let host = vec![0u8; 4096];
    // SAFETY: the import is refused, so nothing keeps the pointer.
    let e = unsafe { device.import_buffer(host.as_ptr() as u64, 64, counted(&never)) }.unwrap_err();
    assert!(
        matches!(
            e,
            Error::NotDeviceMemory {
                memory_type: None,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("not CUDA device memory"), "{e}");

    // Pinned host memory: known, but host memory.
    let pinned = device.create_host_buffer(256).unwrap();
    // SAFETY: refused.
    let e =
        unsafe { device.import_buffer(pinned.as_ptr() as u64, 64, counted(&never)) }.unwrap_err();
    assert!(
        matches!(
            e,
            Error::NotDeviceMemory {
                memory_type: Some(cuhal_sys::CU_MEMORYTYPE_HOST),
                ..
            }
        ),
        "{e:?}"
    );

    // Memory of the other device.
    let theirs = raw_alloc(&other, 1024);
    // SAFETY: refused.
    let e = unsafe { device.import_buffer(theirs, 1024, counted(&never)) }.unwrap_err();
    assert!(
        matches!(e, Error::OtherDevice { owner: 1, device: 0, ptr } if ptr == theirs),
        "{e:?}"
    );

    // A range past the end of its allocation, from its start or from inside it.
    let ours = raw_alloc(&device, 1024);
    for (offset, len) in [(0, 1025), (512, 513), (1023, 2)] {
        // SAFETY: refused.
        let e = unsafe { device.import_buffer(ours + offset, len, counted(&never)) }.unwrap_err();
        match e {
            Error::PastAllocation {
                ptr,
                len: l,
                allocation_start,
                allocation_size,
            } => {
                assert_eq!((ptr, l), (ours + offset, len));
                assert_eq!((allocation_start, allocation_size), (ours, 1024));
            }
            other => panic!("({offset}, {len}): {other:?}"),
        }
    }
    // Zero bytes.
    // SAFETY: refused.
    let e = unsafe { device.import_buffer(ours, 0, counted(&never)) }.unwrap_err();
    assert!(matches!(e, Error::Command(_)), "{e:?}");

    // The exact allocation, and a range inside it, are accepted.
    // SAFETY: `ours` stays allocated until after both buffers are dropped.
    let whole = unsafe { device.import_buffer(ours, 1024, None) }.unwrap();
    // SAFETY: as above.
    let inner = unsafe { device.import_buffer(ours + 256, 512, None) }.unwrap();
    assert_eq!((whole.device_ptr(), whole.len()), (ours, 1024));
    assert_eq!((inner.device_ptr(), inner.len()), (ours + 256, 512));
    drop((whole, inner));

    // A refused import never runs its callback.
    assert_eq!(never.load(Ordering::SeqCst), 0);
    raw_free(&device, ours);
    raw_free(&other, theirs);
}

#[test]
fn foreign_memory_is_used_and_released_once_after_the_last_queued_use() {
    let (fake, _driver, device) = open("interop-release", queues(1));
    let q = device.queue(0);
    let ptr = raw_alloc(&device, 1024);
    let released = Arc::new(AtomicUsize::new(0));
    // SAFETY: `ptr` is freed only after the callback ran (checked below).
    let foreign = unsafe { device.import_buffer(ptr, 1024, counted(&released)) }.unwrap();
    let ours = device.create_buffer(1024).unwrap();
    let allocations = fake.counts().device_allocations;

    // A copy into cuhal's buffer that waits on a semaphore nobody has signalled yet.
    let gate = device.create_semaphore(0);
    let done = device.create_semaphore(0);
    q.fill(
        &[],
        &[(&done, 1)],
        &foreign.whole(),
        FillPattern::U32(0x1234_5678),
    )
    .unwrap();
    q.copy(
        &[(&gate, 1), (&done, 1)],
        &[(&done, 2)],
        &foreign.whole(),
        &ours.whole(),
    )
    .unwrap();
    drop(foreign);
    // The pending copy still holds the buffer: not released, not freed by cuhal.
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(released.load(Ordering::SeqCst), 0);

    gate.signal(1).unwrap();
    wait(&done, 2);
    settle(q);
    assert_eq!(released.load(Ordering::SeqCst), 1, "released once");
    // cuhal never frees foreign memory: the allocation is still there for its owner to free.
    assert_eq!(fake.counts().device_allocations, allocations);
    let bytes = read(&device, q, &ours.whole());
    assert!(
        bytes.chunks(4).all(|c| c == 0x1234_5678u32.to_ne_bytes()),
        "the copy read the foreign memory"
    );
    raw_free(&device, ptr);
    assert_eq!(released.load(Ordering::SeqCst), 1);
}

#[test]
fn exported_buffers_keep_their_memory_until_released() {
    let (fake, _driver, device) = open("interop-export-buffer", queues(1));
    let base = fake.counts().device_allocations;
    let buffer = device.create_buffer(4096).unwrap();
    let exported = ExportedBuffer::new(&buffer).unwrap();
    assert_eq!(
        (exported.device_ptr(), exported.len()),
        (buffer.device_ptr(), 4096)
    );
    let (ptr, len, release) = exported.into_raw();
    assert_eq!((ptr, len), (buffer.device_ptr(), 4096));
    drop(buffer);
    // The borrower still holds it.
    assert_eq!(fake.counts().device_allocations, base + 1);
    // The "foreign runtime" writes through the raw pointer it was lent.
    let api = device.context().api();
    {
        let _bound = device.context().enter().unwrap();
        // SAFETY: `ptr` is 4096 live bytes of device memory until `release` runs.
        unsafe { cu!(api, cuMemsetD8Async(ptr, 7, len, std::ptr::null_mut())) }.unwrap();
    }
    release();
    assert_eq!(fake.counts().device_allocations, base, "freed on release");
}

/// The foreign runtime's stream and event, made with raw driver calls.
struct Foreign {
    stream: cuhal_sys::Stream,
    event: cuhal_sys::Event,
}

impl Foreign {
    fn new(device: &cuhal::Device) -> Self {
        let context = device.context();
        Self {
            stream: cuhal_sys::Stream::new(context, CU_STREAM_NON_BLOCKING).unwrap(),
            event: cuhal_sys::Event::new(context, CU_EVENT_DISABLE_TIMING).unwrap(),
        }
    }

    fn record(&self) {
        self.event.record(&self.stream).unwrap();
    }

    fn wait_on(&self, event: CUevent) {
        // SAFETY: the caller keeps `event` live.
        unsafe { self.stream.wait_raw_event(event) }.unwrap();
    }
}

#[test]
fn a_queue_operation_waits_on_a_foreign_event() {
    let (fake, _driver, device) = open("interop-wait-event", queues(2));
    let foreign = Foreign::new(&device);
    let released = Arc::new(AtomicUsize::new(0));
    // SAFETY: the event outlives the release callback (destroyed when `foreign` drops, last).
    let event = unsafe { ForeignEvent::from_raw(foreign.event.raw(), counted(&released)) };
    let waits_before = fake.calls(cu_name!(cuStreamWaitEvent));

    // Never recorded: waits for nothing, as CUDA defines, and signals.
    let s = device.create_semaphore(0);
    device.queue(0).wait_event(&[], &[(&s, 1)], &event).unwrap();
    wait(&s, 1);
    assert_eq!(fake.calls(cu_name!(cuStreamWaitEvent)), waits_before + 1);

    // Recorded by the foreign runtime, waited on behind a pending semaphore on queue 1; a
    // fill on queue 0 ordered after it through the signal.
    foreign.record();
    let gate = device.create_semaphore(0);
    let buffer = device.create_buffer(256).unwrap();
    device
        .queue(1)
        .wait_event(&[(&gate, 1)], &[(&s, 2)], &event)
        .unwrap();
    device
        .queue(0)
        .fill(&[(&s, 2)], &[(&s, 3)], &buffer.whole(), FillPattern::U8(9))
        .unwrap();
    drop(event);
    assert_eq!(
        released.load(Ordering::SeqCst),
        0,
        "a pending wait holds it"
    );
    gate.signal(1).unwrap();
    wait(&s, 3);
    settle(device.queue(0));
    settle(device.queue(1));
    assert_eq!(released.load(Ordering::SeqCst), 1, "released once");
    assert!(
        read(&device, device.queue(0), &buffer.whole())
            .iter()
            .all(|&b| b == 9)
    );
}

#[test]
fn a_queue_wait_on_a_destroyed_event_fails_its_signals() {
    let (_fake, _driver, device) = open("interop-bad-event", queues(1));
    let foreign = Foreign::new(&device);
    let made_up: CUevent = std::ptr::without_provenance_mut(0x10);
    // SAFETY: deliberately not an event: the driver refuses it and nothing else touches it.
    let event = unsafe { ForeignEvent::from_raw(made_up, None) };
    let s = device.create_semaphore(0);
    device.queue(0).wait_event(&[], &[(&s, 1)], &event).unwrap();
    let failure = failure_of(&s, 1);
    let cuda = cuhal::cuda_of_failure(&failure).expect("a driver error");
    assert!(
        cuda.to_string().contains(cu_name!(cuStreamWaitEvent)),
        "{cuda}"
    );
    drop(foreign);
}

#[test]
fn timepoints_export_as_events_a_foreign_stream_waits_on() {
    let (_fake, _driver, device) = open("interop-export-event", queues(1));
    let foreign = Foreign::new(&device);
    let q = device.queue(0);
    let s = device.create_semaphore(0);

    // Reached already: an event that waits for nothing.
    s.signal(1).unwrap();
    let exported = device.export_timepoint(&s, 1, TIMEOUT).unwrap();
    assert_eq!(exported.signal_value(), None);
    foreign.wait_on(exported.raw());
    drop(exported);

    // Not issued yet: times out, on the host, without failing anything.
    let gate = device.create_semaphore(0);
    q.barrier(&[(&gate, 1)], &[(&s, 3)]).unwrap();
    let e = device
        .export_timepoint(&s, 2, Duration::from_millis(20))
        .unwrap_err();
    assert!(
        matches!(e, Error::Semaphore(cuhal_semaphore::Error::Timeout)),
        "{e:?}"
    );

    // Issued while the export waits: it wakes and returns that submission's completion event
    // (or, if the fake's instant GPU already completed it, an event that waits for nothing).
    let started = std::time::Instant::now();
    let exporter = std::thread::scope(|scope| {
        let waiting = scope.spawn(|| device.export_timepoint(&s, 2, TIMEOUT));
        std::thread::sleep(Duration::from_millis(10));
        gate.signal(1).unwrap();
        waiting.join().unwrap()
    });
    let exported = exporter.unwrap();
    // Woken by the signal's issue, not by the deadline.
    assert!(started.elapsed() < TIMEOUT / 2, "{:?}", started.elapsed());
    assert!(
        matches!(exported.signal_value(), Some(3) | None),
        "{exported:?}"
    );
    foreign.wait_on(exported.raw());
    let (raw, release) = exported.into_raw();
    foreign.wait_on(raw);
    release();
    wait(&s, 3);

    // A failed semaphore is its failure.
    let failed = device.create_semaphore(0);
    failed.fail(cuhal::Failure::msg("upstream failed"));
    let e = device.export_timepoint(&failed, 1, TIMEOUT).unwrap_err();
    assert!(e.to_string().contains("upstream failed"), "{e}");
}

/// The driver calls a stream crossing can make (completion-side queries and sleeps aside,
/// which depend on timing): each is counted per crossing.
const CROSSING_CALLS: [&str; 7] = [
    cu_name!(cuEventRecord),
    cu_name!(cuStreamWaitEvent),
    cu_name!(cuEventCreate),
    cu_name!(cuCtxGetCurrent),
    cu_name!(cuCtxSetCurrent),
    cu_name!(cuCtxPushCurrent),
    cu_name!(cuCtxPopCurrent),
];

/// The calls of [`CROSSING_CALLS`] made by `f` (which waits for what it needs), per name.
fn calls_of(
    fake: &cuhal_fake_driver::harness::FakeDriver,
    f: impl FnOnce(),
) -> Vec<(&'static str, u64)> {
    let before: Vec<u64> = CROSSING_CALLS.iter().map(|n| fake.calls(n)).collect();
    f();
    CROSSING_CALLS
        .iter()
        .zip(before)
        .map(|(n, b)| (*n, fake.calls(n) - b))
        .filter(|(_, d)| *d != 0)
        .collect()
}

#[test]
fn a_queue_waits_for_a_foreign_stream_with_one_record() {
    let (fake, _driver, device) = open("interop-wait-stream", queues(1));
    let foreign = Foreign::new(&device);
    let q = device.queue(0);
    let s = device.create_semaphore(0);
    // Warm: the device's pool of stream records gets its event, the queue its completion one.
    // SAFETY: `foreign.stream` is a live stream of the device's context.
    unsafe { q.wait_stream(&[], &[(&s, 1)], foreign.stream.raw()) }.unwrap();
    wait(&s, 1);
    settle(q);

    // A plain wait on a foreign event: the queue's own calls (the wait, its completion record).
    foreign.record();
    // SAFETY: the event outlives every operation waiting on it (`foreign` drops last).
    let event = unsafe { ForeignEvent::from_raw(foreign.event.raw(), None) };
    let plain = calls_of(&fake, || {
        q.wait_event(&[], &[(&s, 2)], &event).unwrap();
        wait(&s, 2);
        settle(q);
    });
    // The stream crossing: the same, and one record on the foreign stream.
    let crossing = calls_of(&fake, || {
        // SAFETY: as above.
        unsafe { q.wait_stream(&[], &[(&s, 3)], foreign.stream.raw()) }.unwrap();
        wait(&s, 3);
        settle(q);
    });
    let record = cu_name!(cuEventRecord);
    let mut expected = plain.clone();
    expected
        .iter_mut()
        .find(|(n, _)| *n == record)
        .expect("the queue records its completion")
        .1 += 1;
    assert_eq!(crossing, expected, "plain wait: {plain:?}");
    assert_eq!(
        crossing
            .iter()
            .find(|(n, _)| *n == cu_name!(cuStreamWaitEvent)),
        Some(&(cu_name!(cuStreamWaitEvent), 1)),
        "{crossing:?}"
    );
    // The recorded event went back to the pool: another crossing creates none.
    let again = calls_of(&fake, || {
        // SAFETY: as above.
        unsafe { q.wait_stream(&[], &[(&s, 4)], foreign.stream.raw()) }.unwrap();
        wait(&s, 4);
        settle(q);
    });
    assert_eq!(again, crossing);
}

#[test]
fn a_foreign_stream_waits_for_a_semaphore_value_with_one_call() {
    let (fake, _driver, device) = open("interop-stream-wait", queues(1));
    let foreign = Foreign::new(&device);
    let q = device.queue(0);
    let s = device.create_semaphore(0);
    let stream = foreign.stream.raw();

    // Reached already: nothing to wait for, no driver call at all.
    s.signal(1).unwrap();
    let reached = calls_of(&fake, || {
        // SAFETY: `stream` is live for every call below (`foreign` drops last).
        unsafe { device.stream_wait_value(stream, &s, 1, TIMEOUT) }.unwrap()
    });
    assert_eq!(reached, vec![]);

    // Issued and still running (launches stay in flight until `finish_work`): one wait, on
    // the submission's completion event, and nothing else.
    let buffer = device.create_buffer(256).unwrap();
    let mut cb = q.create_command_buffer().unwrap();
    cb.fill(&buffer.whole(), FillPattern::U32(7)).unwrap();
    let cb: Arc<dyn cuhal::CommandBuffer> = cb.end().unwrap();
    fake.set_timing(Duration::from_secs(3600), Duration::from_micros(2));
    q.execute(&[], &[(&s, 2)], &[&cb]).unwrap();
    assert!(matches!(
        s.wait_point(2).unwrap(),
        cuhal_semaphore::WaitPoint::Device { .. }
    ));
    let issued = calls_of(&fake, || {
        // SAFETY: as above.
        unsafe { device.stream_wait_value(stream, &s, 2, TIMEOUT) }.unwrap()
    });
    // The work is let go before any assertion, so that a failing one does not leave the
    // device's drop waiting for it.
    fake.set_timing(Duration::ZERO, Duration::ZERO);
    fake.finish_work();
    wait(&s, 2);
    assert_eq!(issued, vec![(cu_name!(cuStreamWaitEvent), 1)]);

    // Not issued: times out on the host, enqueuing nothing.
    let gate = device.create_semaphore(0);
    q.barrier(&[(&gate, 1)], &[(&s, 3)]).unwrap();
    let timed_out = calls_of(&fake, || {
        // SAFETY: as above.
        let e = unsafe { device.stream_wait_value(stream, &s, 3, Duration::from_millis(20)) }
            .unwrap_err();
        assert!(
            matches!(e, Error::Semaphore(cuhal_semaphore::Error::Timeout)),
            "{e:?}"
        );
    });
    assert_eq!(timed_out, vec![]);
    gate.signal(1).unwrap();
    wait(&s, 3);

    // A failed semaphore is its failure.
    let failed = device.create_semaphore(0);
    failed.fail(cuhal::Failure::msg("upstream failed"));
    // SAFETY: as above.
    let e = unsafe { device.stream_wait_value(stream, &failed, 1, TIMEOUT) }.unwrap_err();
    assert!(e.to_string().contains("upstream failed"), "{e}");
    settle(q);
}

/// Both crossings in a row, with device work that takes time: a foreign stream waits for a
/// queue's work, and a queue operation on another queue waits for the foreign stream. The
/// operation's signal comes only once the first queue's work is done, which holds only if the
/// foreign stream waited for it and the record was made on the foreign stream.
#[test]
fn stream_crossings_order_device_work_both_ways() {
    let (fake, _driver, device) = open("interop-stream-order", queues(3));
    let foreign = Foreign::new(&device);
    let idle = Foreign::new(&device);
    let buffer = device.create_buffer(256).unwrap();
    let mut cb = device.queue(0).create_command_buffer().unwrap();
    cb.fill(&buffer.whole(), FillPattern::U32(7)).unwrap();
    let cb: Arc<dyn cuhal::CommandBuffer> = cb.end().unwrap();
    let (a, b, c) = (
        device.create_semaphore(0),
        device.create_semaphore(0),
        device.create_semaphore(0),
    );
    // Launches stay in flight until `finish_work`.
    fake.set_timing(Duration::from_secs(3600), Duration::from_micros(2));
    device.queue(0).execute(&[], &[(&a, 1)], &[&cb]).unwrap();
    // SAFETY: both foreign streams are live until the end of the test.
    unsafe {
        device
            .stream_wait_value(foreign.stream.raw(), &a, 1, TIMEOUT)
            .unwrap();
        device
            .queue(1)
            .wait_stream(&[], &[(&b, 1)], foreign.stream.raw())
            .unwrap();
        // The control: a stream that waited for nothing lets its waiter through at once.
        device
            .queue(2)
            .wait_stream(&[], &[(&c, 1)], idle.stream.raw())
            .unwrap();
    }
    wait(&c, 1);
    std::thread::sleep(Duration::from_millis(50));
    let held = (a.query().unwrap(), b.query().unwrap());
    // Let the work go before asserting (a failing assertion must not leave it held).
    fake.set_timing(Duration::ZERO, Duration::ZERO);
    fake.finish_work();
    wait(&a, 1);
    wait(&b, 1);
    assert_eq!(
        held,
        (0, 0),
        "the foreign stream's waiter ran before the queue's work"
    );
    for q in device.queues() {
        settle(q);
    }
}

#[test]
fn a_stream_of_another_device_is_refused_by_the_driver() {
    let (fake, driver) = load("interop-stream-other");
    fake.set_device_count(2);
    let device = driver.open(0, queues(1)).unwrap();
    let other = driver.open(1, queues(1)).unwrap();
    let theirs = Foreign::new(&other);
    let s = device.create_semaphore(0);
    // SAFETY: a live stream, of the other device's context: the record is refused.
    let e = unsafe {
        device
            .queue(0)
            .wait_stream(&[], &[(&s, 1)], theirs.stream.raw())
    }
    .unwrap_err();
    assert!(e.to_string().contains(cu_name!(cuEventRecord)), "{e}");
    // Nothing was queued: the semaphore neither advanced nor failed, and the queue works.
    assert_eq!(s.query().unwrap(), 0);
    device.queue(0).barrier(&[], &[(&s, 1)]).unwrap();
    wait(&s, 1);
}
