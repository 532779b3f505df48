//! Stream work (a closure handed a stream) on the fake driver: captured into graph command
//! buffers with `cuStreamBeginCaptureToGraph`, called at replay by deferred ones and at once by
//! stream ones; captures that break the rules are typed errors that leave nothing behind.

mod fake_support;

use cuhal_sys::{cu, cu_name};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuhal::{CommandBuffer, CommandBufferMode, DeviceOptions, FillPattern};
use cuhal_command::{
    CommandBufferState, CommandRecorder, Error, GraphCommandBuffer, StreamCommandBuffer,
    StreamWork, StreamWorkFn,
};
use cuhal_sys::CUresult;
use fake_support::*;

fn options(mode: CommandBufferMode) -> DeviceOptions {
    DeviceOptions {
        command_buffer_mode: mode,
        ..queues(1)
    }
}

/// Stream work that fills range 0 with `value` (`cuMemsetD32Async` on the stream it is handed)
/// and copies range 0 into range 1 if there is one, as a library would enqueue its kernels.
fn fill_then_copy(value: u32, calls: &Arc<AtomicUsize>) -> Arc<StreamWorkFn> {
    let calls = Arc::clone(calls);
    Arc::new(move |on: &StreamWork<'_>| {
        calls.fetch_add(1, Ordering::SeqCst);
        let api = on.context().api();
        let first = on.ranges()[0];
        // SAFETY: range 0 is live device memory the command buffer retains; the stream is the
        // one handed to us.
        unsafe {
            cu!(
                api,
                cuMemsetD32Async(first.ptr, value, first.len / 4, on.stream())
            )
        }?;
        if let Some(second) = on.ranges().get(1) {
            // SAFETY: both ranges are live, equal in length (the test makes them so), disjoint.
            unsafe {
                cu!(
                    api,
                    cuMemcpyDtoDAsync(second.ptr, first.ptr, first.len, on.stream())
                )
            }?;
        }
        Ok(())
    })
}

fn u32s(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks(4)
        .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn stream_work_runs_between_commands_in_both_modes() {
    for mode in [CommandBufferMode::Graph, CommandBufferMode::Deferred] {
        let (_fake, _driver, device) = open("stream-work", options(mode));
        let q = device.queue(0);
        let (a, b, c) = (
            device.create_buffer(256).unwrap(),
            device.create_buffer(256).unwrap(),
            device.create_buffer(256).unwrap(),
        );
        poison(&device, q, &c.whole());
        let calls = Arc::new(AtomicUsize::new(0));
        let mut cb = q.create_command_buffer().unwrap();
        cb.fill(&a.whole(), FillPattern::U32(1)).unwrap();
        cb.barrier().unwrap();
        // Reads what the fill wrote (a), writes b: must run after the fill, before the copy.
        cb.stream_work(
            &[a.range(0, 128).unwrap(), b.range(0, 128).unwrap()],
            fill_then_copy(7, &calls),
        )
        .unwrap();
        cb.barrier().unwrap();
        cb.copy(&b.range(0, 128).unwrap(), &c.range(0, 128).unwrap())
            .unwrap();
        let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
        let recorded = calls.load(Ordering::SeqCst);
        match mode {
            // Captured once, at record time.
            CommandBufferMode::Graph => assert_eq!(recorded, 1),
            // Called only at replay.
            CommandBufferMode::Deferred => assert_eq!(recorded, 0),
        }
        let done = device.create_semaphore(0);
        for round in 1..=2 {
            poison(&device, q, &c.whole());
            q.execute(&[], &[(&done, round)], &[&cb]).unwrap();
            wait(&done, round);
            let out = u32s(&read(&device, q, &c.whole()));
            assert!(out[..32].iter().all(|&v| v == 7), "{mode:?} round {round}");
            assert!(
                out[32..]
                    .iter()
                    .all(|&v| v == u32::from_ne_bytes([POISON; 4])),
                "{mode:?}: the copy wrote only its range"
            );
        }
        let replays = calls.load(Ordering::SeqCst);
        match mode {
            CommandBufferMode::Graph => assert_eq!(replays, 1, "the graph replays the capture"),
            CommandBufferMode::Deferred => assert_eq!(replays, 2, "called at every replay"),
        }
    }
}

#[test]
fn captured_work_joins_the_group_it_was_recorded_in() {
    let (_fake, _driver, device) = open("stream-work-join", options(CommandBufferMode::Graph));
    let ctx = device.context();
    let (a, b) = (
        device.create_buffer(64).unwrap(),
        device.create_buffer(64).unwrap(),
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let mut cb = GraphCommandBuffer::new(ctx, None).unwrap();
    cb.fill(&a.whole(), FillPattern::U8(1)).unwrap();
    cb.barrier().unwrap();
    cb.stream_work(&[a.whole()], fill_then_copy(2, &calls))
        .unwrap();
    cb.stream_work(&[b.whole()], fill_then_copy(3, &calls))
        .unwrap();
    // An empty closure captures nothing and adds nothing.
    cb.stream_work(&[], Arc::new(|_: &StreamWork<'_>| Ok(())))
        .unwrap();
    cb.barrier().unwrap();
    cb.copy(&a.range(0, 32).unwrap(), &b.range(32, 32).unwrap())
        .unwrap();
    // fill, two captured memsets, the join of the two-wide group, the copy.
    assert_eq!(cb.node_count(), 5);
    assert_eq!(cb.end().unwrap().node_count(), 5);
}

/// A foreign call that capture forbids, made by the closure after it captured some work.
fn synchronizing(calls: &Arc<AtomicUsize>) -> Arc<StreamWorkFn> {
    let inner = fill_then_copy(9, calls);
    Arc::new(move |on: &StreamWork<'_>| {
        inner(on)?;
        let api = on.context().api();
        // SAFETY: the stream is live; under capture the driver refuses this.
        unsafe { cu!(api, cuStreamSynchronize(on.stream())) }?;
        Ok(())
    })
}

#[test]
fn a_capture_that_breaks_the_rules_is_a_typed_error_and_leaves_nothing() {
    let (_fake, _driver, device) = open("stream-work-bad", options(CommandBufferMode::Graph));
    let q = device.queue(0);
    let a = device.create_buffer(64).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut cb = q.create_command_buffer().unwrap();
    cb.fill(&a.whole(), FillPattern::U8(5)).unwrap();

    // Synchronizing inside the capture: the driver's complaint, and the closure's.
    let e = cb
        .stream_work(&[a.whole()], synchronizing(&calls))
        .unwrap_err();
    match &e {
        Error::Capture { cuda, work } => {
            assert_eq!(
                cuda.as_ref().and_then(|c| c.result()),
                Some(CUresult::ERROR_STREAM_CAPTURE_INVALIDATED)
            );
            let work = work.as_ref().expect("the closure's error").to_string();
            assert!(work.contains(cu_name!(cuStreamSynchronize)), "{work}");
            assert!(
                work.contains("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"),
                "{work}"
            );
        }
        other => panic!("{other:?}"),
    }
    let text = e.to_string();
    assert!(text.contains("could not be captured"), "{text}");
    assert!(text.contains("STREAM_CAPTURE_INVALIDATED"), "{text}");

    // A closure that fails after capturing, and one that panics.
    let failing: Arc<StreamWorkFn> = {
        let inner = fill_then_copy(9, &calls);
        Arc::new(move |on: &StreamWork<'_>| {
            inner(on)?;
            Err("the library said no".into())
        })
    };
    let e = cb.stream_work(&[a.whole()], failing).unwrap_err();
    assert!(
        matches!(&e, Error::Capture { cuda: None, work: Some(w) } if w.to_string() == "the library said no"),
        "{e:?}"
    );
    let panicking: Arc<StreamWorkFn> = Arc::new(|_: &StreamWork<'_>| panic!("boom"));
    let e = cb.stream_work(&[a.whole()], panicking).unwrap_err();
    assert!(e.to_string().contains("panicked"), "{e}");

    // Nothing of the three stayed: the buffer still records, and runs only the fill.
    assert_eq!(cb.state(), CommandBufferState::Recording);
    cb.barrier().unwrap();
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    let done = device.create_semaphore(0);
    q.execute(&[], &[(&done, 1)], &[&cb]).unwrap();
    wait(&done, 1);
    assert!(read(&device, q, &a.whole()).iter().all(|&v| v == 5));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the closures ran once each"
    );

    // The capture stream is usable again: a good capture after the bad ones works.
    let mut cb = q.create_command_buffer().unwrap();
    cb.stream_work(&[a.whole()], fill_then_copy(6, &calls))
        .unwrap();
    cb.end().unwrap();
}

/// The driver's contract around a capture into a graph that the closure invalidates, as on the
/// real driver (the fake models it): the capture's graph is destroyed by `cuStreamEndCapture`,
/// and an empty graph's node list cannot be read into a non-null array. As the first command of
/// a command buffer (its graph still empty), the capture is refused with the driver's
/// complaint, and everything recorded before and after it still runs.
#[test]
fn an_invalidated_first_capture_leaves_the_command_buffer_whole() {
    let (_fake, _driver, device) = open("stream-work-first", options(CommandBufferMode::Graph));
    let q = device.queue(0);
    let (a, b) = (
        device.create_buffer(64).unwrap(),
        device.create_buffer(64).unwrap(),
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let mut cb = q.create_command_buffer().unwrap();
    let e = cb
        .stream_work(&[a.whole()], synchronizing(&calls))
        .unwrap_err();
    assert!(
        matches!(&e, Error::Capture { cuda: Some(c), work: Some(_) }
            if c.result() == Some(CUresult::ERROR_STREAM_CAPTURE_INVALIDATED)),
        "{e:?}"
    );
    assert_eq!(cb.state(), CommandBufferState::Recording);
    // Twice in a row, and between good commands: the command buffer's graph is never touched.
    cb.fill(&a.whole(), FillPattern::U8(4)).unwrap();
    let e = cb
        .stream_work(&[a.whole()], synchronizing(&calls))
        .unwrap_err();
    assert!(matches!(e, Error::Capture { .. }), "{e:?}");
    cb.barrier().unwrap();
    cb.stream_work(&[b.whole()], fill_then_copy(7, &calls))
        .unwrap();
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    let done = device.create_semaphore(0);
    q.execute(&[], &[(&done, 1)], &[&cb]).unwrap();
    wait(&done, 1);
    assert!(read(&device, q, &a.whole()).iter().all(|&v| v == 4));
    let captured = u32s(&read(&device, q, &b.whole()));
    assert_eq!(captured, [7; 16], "the good capture ran");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "each closure ran once, at recording"
    );
}

/// A `cuStreamEndCapture` that fails without ending the capture (here, refused before the
/// driver did anything) leaves nothing behind: the scratch graph is destroyed once, the stream
/// is out of capture (the next capture on it works), and the command buffer keeps recording.
#[test]
fn a_failed_capture_end_leaks_no_graph_and_leaves_the_stream_usable() {
    let (fake, _driver, device) = open("stream-work-end", options(CommandBufferMode::Graph));
    let q = device.queue(0);
    let a = device.create_buffer(64).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut cb = q.create_command_buffer().unwrap();
    cb.fill(&a.whole(), FillPattern::U8(1)).unwrap();
    let graphs = fake.counts().graphs;
    fake.fail_calls(
        cu_name!(cuStreamEndCapture),
        1,
        1,
        cuhal_fake_driver::status::INVALID_VALUE,
    );
    let e = cb
        .stream_work(&[a.whole()], fill_then_copy(3, &calls))
        .unwrap_err();
    fake.clear_faults();
    assert!(
        matches!(&e, Error::Capture { cuda: Some(c), work: None }
            if c.result() == Some(CUresult::ERROR_INVALID_VALUE)),
        "{e:?}"
    );
    assert_eq!(
        fake.counts().graphs,
        graphs,
        "the scratch graph was destroyed"
    );
    assert_eq!(cb.state(), CommandBufferState::Recording);
    cb.stream_work(&[a.whole()], fill_then_copy(5, &calls))
        .unwrap();
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    let done = device.create_semaphore(0);
    q.execute(&[], &[(&done, 1)], &[&cb]).unwrap();
    wait(&done, 1);
    assert_eq!(u32s(&read(&device, q, &a.whole())), [5; 16]);
}

/// Stream work that calls back into its own queue at replay (through a weak handle to the
/// device, as a library holding on to its runtime would): reading the queue's counters works, a
/// submission is refused with a typed error instead of waiting forever for the issue lock its
/// own thread holds, and the queue keeps working afterwards.
#[test]
fn stream_work_that_calls_back_into_its_queue_is_refused_not_deadlocked() {
    let (_fake, _driver, device) =
        open("stream-work-reenter", options(CommandBufferMode::Deferred));
    let device = Arc::new(device);
    let weak = Arc::downgrade(&device);
    let a = device.create_buffer(64).unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let work: Arc<StreamWorkFn> = {
        let seen = Arc::clone(&seen);
        Arc::new(move |_on: &StreamWork<'_>| {
            let Some(device) = weak.upgrade() else {
                return Ok(());
            };
            let q = device.queue(0);
            let stats = q.stats();
            let inner = device.create_semaphore(0);
            let submitted = q.execute(&[], &[(&inner, 1)], &[]);
            seen.lock().unwrap().push((stats.submitted, submitted));
            Ok(())
        })
    };
    let q = device.queue(0);
    let mut cb = q.create_command_buffer().unwrap();
    cb.stream_work(&[a.whole()], work).unwrap();
    cb.fill(&a.whole(), FillPattern::U8(6)).unwrap();
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    let done = device.create_semaphore(0);
    q.execute(&[], &[(&done, 1)], &[&cb]).unwrap();
    wait(&done, 1);
    q.execute(&[(&done, 1)], &[(&done, 2)], &[&cb]).unwrap();
    wait(&done, 2);
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(seen.len(), 2, "one call per replay");
    for (submitted, result) in seen {
        assert!(submitted <= 2, "{submitted}");
        assert!(
            matches!(
                result,
                Err(cuhal::Error::Queue(
                    cuhal_scheduler::Error::Reentrant { .. }
                ))
            ),
            "{result:?}"
        );
    }
    // The queue keeps working.
    q.fill(&[(&done, 2)], &[(&done, 3)], &a.whole(), FillPattern::U8(9))
        .unwrap();
    wait(&done, 3);
    assert!(read(&device, q, &a.whole()).iter().all(|&v| v == 9));
}

#[test]
fn graph_capture_needs_cuda_12_3() {
    // A driver older than 12.3 has no cuStreamBeginCaptureToGraph.
    let (_fake, driver) = load_with("stream-work-old", |fake| {
        fake.hide(cu_name!(cuStreamBeginCaptureToGraph))
    });
    let device = driver.open(0, options(CommandBufferMode::Graph)).unwrap();
    let a = device.create_buffer(64).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut cb = device.queue(0).create_command_buffer().unwrap();
    let e = cb
        .stream_work(&[a.whole()], fill_then_copy(1, &calls))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::CaptureUnsupported {
                driver_version: 13000
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("CUDA 12.3"), "{e}");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "never called");
    assert_eq!(cb.state(), CommandBufferState::Recording);
}

#[test]
fn a_deferred_replay_that_fails_fails_its_submission() {
    let (_fake, _driver, device) = open("stream-work-replay", options(CommandBufferMode::Deferred));
    let q = device.queue(0);
    let mut cb = q.create_command_buffer().unwrap();
    cb.stream_work(
        &[],
        Arc::new(|_: &StreamWork<'_>| Err("out of workspace".into())),
    )
    .unwrap();
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    let done = device.create_semaphore(0);
    q.execute(&[], &[(&done, 1)], &[&cb]).unwrap();
    let failure = failure_of(&done, 1);
    assert!(
        failure.to_string().contains("out of workspace"),
        "{failure}"
    );
}

#[test]
fn stream_command_buffers_run_stream_work_at_once() {
    let (_fake, _driver, device) = open("stream-work-now", queues(1));
    let q = device.queue(0);
    let a = device.create_buffer(64).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    // SAFETY: the queue's stream lives as long as the device, past this recording.
    let mut cb = unsafe { StreamCommandBuffer::new(device.context(), q.stream(), None) }.unwrap();
    cb.stream_work(&[a.whole()], fill_then_copy(4, &calls))
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1, "called while recording");
    // A failing closure fails the command buffer: its work may be half enqueued.
    let e = cb
        .stream_work(&[], Arc::new(|_: &StreamWork<'_>| Err("nope".into())))
        .unwrap_err();
    assert!(matches!(e, Error::StreamWork(_)), "{e:?}");
    assert_eq!(cb.state(), CommandBufferState::Failed);
    settle(q);
    assert!(u32s(&read(&device, q, &a.whole())).iter().all(|&v| v == 4));
}

#[test]
fn stream_work_ranges_must_belong_to_the_command_buffer_context() {
    let (fake, driver) = load("stream-work-context");
    fake.set_device_count(2);
    let device = driver.open(0, options(CommandBufferMode::Graph)).unwrap();
    let other = driver.open(1, queues(1)).unwrap();
    let theirs = other.create_buffer(64).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut cb = device.queue(0).create_command_buffer().unwrap();
    let e = cb
        .stream_work(&[theirs.whole()], fill_then_copy(1, &calls))
        .unwrap_err();
    assert!(matches!(e, Error::ContextMismatch), "{e:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// Binding tables reach stream work in deferred command buffers: the closure is handed the
/// addresses of each submission's bindings (plus the recorded offsets).
#[test]
fn deferred_stream_work_is_handed_each_submission_bindings() {
    let (_fake, _driver, device) =
        open("stream-work-bindings", options(CommandBufferMode::Deferred));
    let q = device.queue(0);
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut cb = q.create_command_buffer_with_bindings(2).unwrap();
    let fill = fill_then_copy(11, &calls);
    let record = Arc::clone(&seen);
    let work: Arc<StreamWorkFn> = Arc::new(move |on: &StreamWork<'_>| {
        record.lock().unwrap().push(on.ranges().to_vec());
        fill(on)
    });
    // Slot 0 from byte 64, 128 bytes; then a copy into slot 1.
    cb.stream_work(
        &[
            cuhal::BufferRange::slot(0, 64, 128).unwrap(),
            cuhal::BufferRange::slot(1, 0, 128).unwrap(),
        ],
        work,
    )
    .unwrap();
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    let done = device.create_semaphore(0);
    for round in 1..=2u64 {
        let (x, y) = (
            device.create_buffer(256).unwrap(),
            device.create_buffer(128).unwrap(),
        );
        poison(&device, q, &x.whole());
        poison(&device, q, &y.whole());
        let table = [x.whole(), y.whole()];
        q.execute_with_bindings(&[], &[(&done, round)], &[(&cb, &table)])
            .unwrap();
        wait(&done, round);
        let last = seen.lock().unwrap().last().cloned().unwrap();
        assert_eq!(last[0].ptr, x.device_ptr() + 64, "round {round}");
        assert_eq!((last[1].ptr, last[1].len), (y.device_ptr(), 128));
        let xs = read(&device, q, &x.whole());
        assert!(xs[..64].iter().all(|&b| b == POISON), "round {round}");
        assert!(u32s(&xs[64..192]).iter().all(|&v| v == 11));
        assert!(xs[192..].iter().all(|&b| b == POISON));
        assert!(u32s(&read(&device, q, &y.whole())).iter().all(|&v| v == 11));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // A table too short for the slots the stream work names is refused at submission.
    let short = [device.create_buffer(256).unwrap().whole()];
    assert!(
        q.execute_with_bindings(&[], &[(&done, 3)], &[(&cb, &short)])
            .is_err()
    );
}

/// Which closure calls a test saw: the addresses handed over and whether under capture.
type Seen = Arc<std::sync::Mutex<Vec<(Vec<cuhal_command::WorkRange>, bool)>>>;

/// `fill_then_copy(value)` that also notes what it was handed.
fn noting(value: u32, calls: &Arc<AtomicUsize>, seen: &Seen) -> Arc<StreamWorkFn> {
    let fill = fill_then_copy(value, calls);
    let seen = Arc::clone(seen);
    Arc::new(move |on: &StreamWork<'_>| {
        seen.lock()
            .unwrap()
            .push((on.ranges().to_vec(), on.is_capturing()));
        fill(on)
    })
}

/// A command buffer of `mode` with two slots: a fill of slot 0, then stream work over slot 0
/// from byte 64 (128 bytes, filled with 11) and slot 1 (the copy of it), then a copy of slot
/// 1's first 64 bytes into `out` (a buffer of its own), each after a barrier.
fn bound_work(
    q: &cuhal::Queue,
    mode: CommandBufferMode,
    work: Arc<StreamWorkFn>,
    out: &Arc<cuhal::Buffer>,
) -> Arc<dyn CommandBuffer> {
    let slot = |s, offset, len| cuhal::BufferRange::slot(s, offset, len).unwrap();
    let mut cb = q.create_command_buffer_as(mode, 2).unwrap();
    cb.fill(&slot(0, 0, 256), FillPattern::U32(1)).unwrap();
    cb.barrier().unwrap();
    cb.stream_work(&[slot(0, 64, 128), slot(1, 0, 128)], work)
        .unwrap();
    cb.barrier().unwrap();
    cb.copy(&slot(1, 0, 64), &out.range(0, 64).unwrap())
        .unwrap();
    cb.end().unwrap()
}

/// Stream work that names slots, in both kinds, over tables that alternate: every byte of
/// every buffer is what that submission's table says, and nothing outside it is touched. A
/// graph captures the work at recording (over placeholder memory, not any table's) and again
/// for each executable whose table moved a slot the work names; an unchanged table re-captures
/// nothing. A deferred buffer calls the work at every replay with the table's addresses.
#[test]
fn stream_work_follows_alternating_binding_tables_in_both_kinds() {
    for mode in [CommandBufferMode::Graph, CommandBufferMode::Deferred] {
        let (_fake, _driver, device) = open("stream-work-tables", options(mode));
        let q = device.queue(0);
        let calls = Arc::new(AtomicUsize::new(0));
        let seen: Seen = Arc::default();
        let out = device.create_buffer(64).unwrap();
        let cb = bound_work(q, mode, noting(11, &calls, &seen), &out);
        let at_recording = calls.load(Ordering::SeqCst);
        let buffers: Vec<_> = (0..4)
            .map(|i| {
                device
                    .create_buffer(if i % 2 == 0 { 256 } else { 128 })
                    .unwrap()
            })
            .collect();
        let tables = [
            [buffers[0].whole(), buffers[1].whole()],
            [buffers[2].whole(), buffers[3].whole()],
        ];
        match mode {
            CommandBufferMode::Graph => {
                assert_eq!(at_recording, 1, "captured at recording");
                let (ranges, capturing) = seen.lock().unwrap()[0].clone();
                assert!(capturing);
                assert_eq!((ranges[0].len, ranges[1].len), (128, 128));
                assert_eq!(ranges[0].ptr % 256, 64, "the slot offset's alignment");
                let placeholder = |p: u64| buffers.iter().all(|b| b.device_ptr() != p - 64);
                assert!(placeholder(ranges[0].ptr), "no table is known at recording");
                assert!(
                    ranges[1].ptr >= ranges[0].ptr + 128,
                    "the placeholders are disjoint"
                );
            }
            CommandBufferMode::Deferred => assert_eq!(at_recording, 0),
        }
        let done = device.create_semaphore(0);
        // A, B, A, B, then B again.
        let order = [0, 1, 0, 1, 1];
        for (round, &t) in order.iter().enumerate() {
            let value = round as u64 + 1;
            for b in buffers.iter().chain([&out]) {
                poison(&device, q, &b.whole());
            }
            let table = &tables[t];
            q.execute_with_bindings(&[], &[(&done, value)], &[(&cb, table)])
                .unwrap();
            wait(&done, value);
            let (x, y) = (&buffers[2 * t], &buffers[2 * t + 1]);
            let xs = u32s(&read(&device, q, &x.whole()));
            let what = format!("{mode:?} round {round}");
            assert!(xs[..16].iter().all(|&v| v == 1), "{what}: the fill");
            assert!(xs[16..48].iter().all(|&v| v == 11), "{what}: the work");
            assert!(xs[48..].iter().all(|&v| v == 1), "{what}: the fill");
            assert_eq!(u32s(&read(&device, q, &y.whole())), [11; 32], "{what}");
            assert_eq!(u32s(&read(&device, q, &out.whole())), [11; 16], "{what}");
            for other in [&buffers[2 * (1 - t)], &buffers[2 * (1 - t) + 1]] {
                assert!(
                    read(&device, q, &other.whole())
                        .iter()
                        .all(|&b| b == POISON),
                    "{what}: the other table's memory is untouched"
                );
            }
            let (ranges, _) = seen.lock().unwrap().last().cloned().unwrap();
            assert_eq!(ranges[0].ptr, x.device_ptr() + 64, "{what}");
            assert_eq!(ranges[1].ptr, y.device_ptr(), "{what}");
        }
        let total = calls.load(Ordering::SeqCst);
        match mode {
            // Recording, then a re-capture for each of the four tables that moved the slots;
            // the repeated table none.
            CommandBufferMode::Graph => {
                assert_eq!(total, 5);
                assert!(seen.lock().unwrap().iter().all(|(_, capturing)| *capturing));
            }
            CommandBufferMode::Deferred => {
                assert_eq!(total, 5, "once per replay");
                assert!(
                    seen.lock()
                        .unwrap()
                        .iter()
                        .all(|(_, capturing)| !*capturing)
                );
            }
        }
    }
}

/// A graph's executables re-capture independently: the same command buffer on a second queue
/// gets an executable of its own, captured for its own table, while the first keeps its.
#[test]
fn each_executable_captures_for_its_own_table() {
    let (_fake, _driver, device) = open(
        "stream-work-execs",
        DeviceOptions {
            command_buffer_mode: CommandBufferMode::Graph,
            ..queues(2)
        },
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let seen: Seen = Arc::default();
    let out = device.create_buffer(64).unwrap();
    let (q0, q1) = (device.queue(0), device.queue(1));
    let cb = bound_work(q0, CommandBufferMode::Graph, noting(5, &calls, &seen), &out);
    let x: Vec<_> = (0..4)
        .map(|i| {
            device
                .create_buffer(if i % 2 == 0 { 256 } else { 128 })
                .unwrap()
        })
        .collect();
    let (a, b) = ([x[0].whole(), x[1].whole()], [x[2].whole(), x[3].whole()]);
    let done = device.create_semaphore(0);
    let mut value = 0;
    let mut run = |q: &cuhal::Queue, table: &[cuhal::BufferRange]| {
        value += 1;
        q.execute_with_bindings(&[], &[(&done, value)], &[(&cb, table)])
            .unwrap();
        wait(&done, value);
    };
    run(q0, &a);
    run(q1, &b);
    run(q0, &a);
    run(q1, &b);
    // Recording, then one capture per executable; each kept its table after.
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(u32s(&read(&device, q0, &x[1].whole())), [5; 32]);
    assert_eq!(u32s(&read(&device, q0, &x[3].whole())), [5; 32]);
}

/// A re-capture that fails fails that submission with the closure's or the driver's complaint
/// (and, like any error while issuing, loses that queue, not the device); other queues' launches
/// capture again on their own. Once with an error from the closure, once with work of another
/// shape than at recording (which the driver refuses as the node's new child).
#[test]
fn a_failed_recapture_fails_its_submission() {
    let (_fake, _driver, device) = open(
        "stream-work-recapture-fails",
        DeviceOptions {
            command_buffer_mode: CommandBufferMode::Graph,
            ..queues(3)
        },
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let out = device.create_buffer(64).unwrap();
    // Call 0 records, call 1 fails, call 2 enqueues a second fill (another shape), later calls
    // do what the recording did.
    let work: Arc<StreamWorkFn> = {
        let fill = fill_then_copy(8, &calls);
        let count = Arc::new(AtomicUsize::new(0));
        Arc::new(move |on: &StreamWork<'_>| {
            match count.fetch_add(1, Ordering::SeqCst) {
                1 => return Err("the library's workspace is gone".into()),
                2 => fill(on)?,
                _ => {}
            }
            fill(on)
        })
    };
    let cb = bound_work(device.queue(0), CommandBufferMode::Graph, work, &out);
    let (x, y) = (
        device.create_buffer(256).unwrap(),
        device.create_buffer(128).unwrap(),
    );
    let table = [x.whole(), y.whole()];
    let submit = |queue: usize| {
        let done = device.create_semaphore(0);
        device
            .queue(queue)
            .execute_with_bindings(&[], &[(&done, 1)], &[(&cb, &table)])
            .unwrap();
        done
    };
    let failure = failure_of(&submit(0), 1).to_string();
    assert!(failure.contains("workspace is gone"), "{failure}");
    assert!(failure.contains("could not be captured"), "{failure}");
    assert!(device.queue(0).lost().is_some());

    let failure = failure_of(&submit(1), 1).to_string();
    assert!(
        failure.contains(cu_name!(cuGraphExecChildGraphNodeSetParams)),
        "{failure}"
    );
    assert!(failure.contains("CUDA_ERROR_INVALID_VALUE"), "{failure}");

    // The device is not lost, and a launch on the third queue captures the right shape.
    assert!(device.lost().is_none());
    poison(&device, device.queue(2), &y.whole());
    wait(&submit(2), 1);
    assert_eq!(u32s(&read(&device, device.queue(2), &y.whole())), [8; 32]);
}

/// Slot ranges in stream work of a stream command buffer (which runs it at recording, when a
/// slot has no address) are refused, nothing called, the command buffer still recording.
#[test]
fn stream_command_buffers_refuse_slot_ranges_in_stream_work() {
    let (_fake, _driver, device) = open("stream-work-slot-now", queues(1));
    let q = device.queue(0);
    let calls = Arc::new(AtomicUsize::new(0));
    // SAFETY: the queue's stream lives as long as the device, past this recording.
    let mut cb = unsafe { StreamCommandBuffer::new(device.context(), q.stream(), None) }.unwrap();
    let e = cb
        .stream_work(
            &[cuhal::BufferRange::slot(0, 0, 64).unwrap()],
            fill_then_copy(1, &calls),
        )
        .unwrap_err();
    assert!(e.to_string().contains("binding slot 0"), "{e}");
    assert_eq!(cb.state(), CommandBufferState::Recording);
    assert_eq!(calls.load(Ordering::SeqCst), 0, "never called");
}

/// Calls capture forbids on the capturing thread besides synchronizing the stream (an
/// allocation, a context synchronize), after some captured work: each is refused with the
/// driver's complaint and the closure's, nothing of it stays, and the command buffer runs
/// exactly the commands around them.
#[test]
fn forbidden_calls_in_a_capture_are_refused_and_leave_nothing() {
    let (_fake, _driver, device) = open("stream-work-forbidden", options(CommandBufferMode::Graph));
    let q = device.queue(0);
    let (a, b) = (
        device.create_buffer(64).unwrap(),
        device.create_buffer(64).unwrap(),
    );
    let calls = Arc::new(AtomicUsize::new(0));
    /// A call the closure makes under capture.
    type Forbidden = fn(&StreamWork<'_>) -> Result<(), cuhal_sys::Error>;
    let then = |forbidden: Forbidden| {
        let fill = fill_then_copy(9, &calls);
        let work: Arc<StreamWorkFn> = Arc::new(move |on: &StreamWork<'_>| {
            fill(on)?;
            forbidden(on)?;
            Ok(())
        });
        work
    };
    let forbidden: [(&str, Forbidden); 2] = [
        (cu_name!(cuMemAlloc), |on| {
            let mut ptr = 0;
            // SAFETY: valid out-pointer; the driver refuses under capture.
            unsafe { cu!(on.context().api(), cuMemAlloc(&mut ptr, 64)) }
        }),
        (cu_name!(cuCtxSynchronize), |on| {
            // SAFETY: no arguments.
            unsafe { cu!(on.context().api(), cuCtxSynchronize()) }
        }),
    ];
    let mut cb = q.create_command_buffer().unwrap();
    cb.fill(&a.whole(), FillPattern::U8(3)).unwrap();
    for (name, call) in forbidden {
        let e = cb.stream_work(&[b.whole()], then(call)).unwrap_err();
        match &e {
            Error::Capture {
                cuda: Some(cuda),
                work: Some(work),
            } => {
                assert_eq!(
                    cuda.result(),
                    Some(CUresult::ERROR_STREAM_CAPTURE_INVALIDATED),
                    "{name}"
                );
                let work = work.to_string();
                assert!(work.contains(name), "{work}");
                assert!(
                    work.contains("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"),
                    "{work}"
                );
            }
            other => panic!("{name}: {other:?}"),
        }
        assert_eq!(cb.state(), CommandBufferState::Recording, "{name}");
    }
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    poison(&device, q, &b.whole());
    let done = device.create_semaphore(0);
    q.execute(&[], &[(&done, 1)], &[&cb]).unwrap();
    wait(&done, 1);
    assert!(read(&device, q, &a.whole()).iter().all(|&v| v == 3));
    assert!(
        read(&device, q, &b.whole()).iter().all(|&v| v == POISON),
        "nothing of the refused captures ran"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2, "each closure ran once");
}
