//! Tracing is chosen per queue when the device opens.

mod fake_support;

use cuhal_sys::cu_name;
use std::sync::Arc;

use cuhal::{DeviceOptions, MemorySink, Sink, Verbosity};
use cuhal_trace::MemoryZone;
use fake_support::open;

/// Options that trace at `verbosity` into `sink`, otherwise the defaults.
fn traced(verbosity: Verbosity, sink: Arc<dyn Sink>) -> DeviceOptions {
    DeviceOptions {
        tracing: verbosity,
        trace_sink: Some(sink),
        ..DeviceOptions::default()
    }
}

#[test]
fn each_queue_traces_at_its_own_verbosity() {
    let sink = Arc::new(MemorySink::new());
    let (_fake, _driver, device) = open(
        "tracing-per-queue",
        DeviceOptions {
            queues: 3,
            queue_tracing: vec![Verbosity::Fine, Verbosity::Off],
            ..traced(Verbosity::Coarse, sink)
        },
    );
    let verbosity = |i: usize| device.queue(i).trace().map(|t| t.verbosity());
    assert_eq!(verbosity(0), Some(Verbosity::Fine), "overridden");
    assert_eq!(
        verbosity(1),
        None,
        "overridden to off: no tracing context at all"
    );
    assert_eq!(
        verbosity(2),
        Some(Verbosity::Coarse),
        "the device's default"
    );
}

#[test]
fn without_a_sink_nothing_traces() {
    let (_fake, _driver, device) = open(
        "tracing-no-sink",
        DeviceOptions {
            tracing: Verbosity::Fine,
            ..DeviceOptions::default()
        },
    );
    assert!(device.queue(0).trace().is_none());
}

#[test]
fn traced_resubmissions_reach_the_sink_once_each() {
    use cuhal::{CommandBuffer, FillPattern};
    use cuhal_trace::DropReason;

    let sink = Arc::new(MemorySink::new());
    let (_fake, _driver, device) = open("tracing-resubmit", traced(Verbosity::Fine, sink.clone()));
    let queue = device.queue(0);
    let buffer = device.create_buffer(256).unwrap();
    let mut cb = queue.create_command_buffer().unwrap();
    cb.begin_debug_group("work").unwrap();
    cb.fill(&buffer.whole(), FillPattern::U32(1)).unwrap();
    cb.end_debug_group().unwrap();
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    let done = device.create_semaphore(0);
    const N: u64 = 20;
    for n in 1..=N {
        queue.execute(&[], &[(&done, n)], &[&cb]).unwrap();
        fake_support::wait(&done, n);
    }
    drop(cb);
    drop(device); // joins the completion threads: everything is collected
    assert_eq!(sink.dropped(DropReason::Superseded), 0);
    let zones = sink.zones();
    let count = |name: &str| zones.iter().filter(|z| z.name == name).count() as u64;
    assert_eq!(count("submission"), N);
    assert_eq!(count("work"), N);
    assert_eq!(count("fill"), N);
    for zone in &zones {
        assert!(zone.begin_ns <= zone.end_ns, "{zone:?}");
    }
}

/// FINE zones from CUPTI's activity records: a graph command buffer gets no event nodes for
/// its commands (only debug groups' zones have events; the command buffer's zone comes from
/// the submission's completion event), where FINE on timing events adds a pair per command.
#[test]
fn fine_zones_from_cupti_add_no_graph_nodes() {
    use cuhal::{CommandBuffer, CuptiChoice, FillPattern};
    use cuhal_trace::cupti::fake::FakeCupti;
    use cuhal_trace::{DropReason, FineSource};

    let cupti = FakeCupti::install();
    let event_nodes = |choice: CuptiChoice, tag: &str| {
        let sink = Arc::new(MemorySink::new());
        let (fake, _driver, device) = open(
            tag,
            DeviceOptions {
                cupti: choice,
                ..traced(Verbosity::Fine, sink.clone())
            },
        );
        let source = device.queue(0).trace().unwrap().stats().fine_source;
        // A context timing commands by events measured what they add when it was made (a
        // graph of its own): only the command buffer's nodes count here.
        let before = fake.calls(cu_name!(cuGraphAddEventRecordNode));
        let queue = device.queue(0);
        let buffer = device.create_buffer(256).unwrap();
        let mut cb = queue.create_command_buffer().unwrap();
        cb.begin_debug_group("work").unwrap();
        cb.fill(&buffer.whole(), FillPattern::U32(1)).unwrap();
        cb.copy(
            &buffer.range(0, 128).unwrap(),
            &buffer.range(128, 128).unwrap(),
        )
        .unwrap();
        cb.end_debug_group().unwrap();
        let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
        let nodes = fake.calls(cu_name!(cuGraphAddEventRecordNode)) - before;
        let done = device.create_semaphore(0);
        queue.execute(&[], &[(&done, 1)], &[&cb]).unwrap();
        fake_support::wait(&done, 1);
        drop(cb);
        drop(device);
        (source, nodes, sink)
    };
    let (source, with_cupti, sink) = event_nodes(
        CuptiChoice::Api {
            api: cupti.api(),
            required: true,
        },
        "tracing-cupti",
    );
    assert_eq!(source, FineSource::Cupti);
    assert_eq!(with_cupti, 2, "the debug group's begin and end");
    // The fake driver tells the fake CUPTI of no launch, so the commands have no records: their
    // zones are dropped and counted, the rest is shown.
    let names: Vec<String> = sink.zones().into_iter().map(|z| z.name).collect();
    assert!(names.iter().any(|n| n == "work"), "{names:?}");
    assert!(
        !names.iter().any(|n| n == "fill" || n == "copy"),
        "{names:?}"
    );
    assert_eq!(sink.dropped(DropReason::ActivityMissing), 2);

    let (source, with_events, _) = event_nodes(CuptiChoice::Off, "tracing-events");
    assert_eq!(source, FineSource::Events);
    assert_eq!(with_events, 6, "and a pair around each of the two commands");
}

/// A graph command buffer filling `buffer`, inside a debug group when `group` is given.
fn fill_buffer(
    queue: &cuhal::Queue,
    buffer: &Arc<cuhal::Buffer>,
    group: Option<&str>,
) -> Arc<dyn cuhal::CommandBuffer> {
    use cuhal::FillPattern;
    let mut cb = queue.create_command_buffer().unwrap();
    if let Some(group) = group {
        cb.begin_debug_group(group).unwrap();
    }
    cb.fill(&buffer.whole(), FillPattern::U32(7)).unwrap();
    if group.is_some() {
        cb.end_debug_group().unwrap();
    }
    cb.end().unwrap()
}

/// COARSE tracing adds no GPU work to a submission: per submission, as many events recorded and
/// event-record graph nodes added as untraced (the completion event, which the traced queue
/// creates with timing, ends the submission's and the command buffer's zones). A start event is
/// recorded only when the start is not known otherwise: after untraced work on the stream.
#[test]
fn coarse_tracing_adds_no_gpu_work() {
    const WARM: u64 = 4;
    const N: u64 = 50;
    let run = |verbosity: Verbosity, tag: &str| {
        let sink = Arc::new(MemorySink::new());
        let (fake, _driver, device) = open(tag, traced(verbosity, sink.clone()));
        let queue = device.queue(0);
        let buffer = device.create_buffer(256).unwrap();
        let nodes = || fake.calls(cu_name!(cuGraphAddEventRecordNode));
        let cb = fill_buffer(queue, &buffer, None);
        let done = device.create_semaphore(0);
        for n in 1..=WARM {
            queue.execute(&[], &[(&done, n)], &[&cb]).unwrap();
            fake_support::wait(&done, n);
        }
        let records = || fake.calls(cu_name!(cuEventRecord));
        let before = records();
        for n in WARM + 1..=WARM + N {
            queue.execute(&[], &[(&done, n)], &[&cb]).unwrap();
            fake_support::wait(&done, n);
        }
        let steady = records() - before;
        // Untraced work on the stream: the next traced submission times its start.
        queue
            .fill(&[], &[], &buffer.whole(), cuhal::FillPattern::U8(0))
            .unwrap();
        let before = records();
        let n = WARM + N + 1;
        queue.execute(&[], &[(&done, n)], &[&cb]).unwrap();
        fake_support::wait(&done, n);
        let after_fill = records() - before;
        let graph_nodes = nodes();
        drop(cb);
        drop(device);
        (steady, after_fill, graph_nodes, sink)
    };
    let (untraced, untraced_after_fill, untraced_nodes, _) = run(Verbosity::Off, "coarse-off");
    let (coarse, coarse_after_fill, coarse_nodes, sink) = run(Verbosity::Coarse, "coarse-on");
    assert_eq!(untraced, N, "one completion event per submission");
    assert_eq!(coarse, untraced, "COARSE records no event of its own");
    assert_eq!(
        (untraced_nodes, coarse_nodes),
        (0, 0),
        "and adds no graph node"
    );
    assert_eq!(untraced_after_fill, 1);
    assert_eq!(coarse_after_fill, 2, "a start event after untraced work");
    // Every submission still has its zone and its command buffer's, nested.
    let zones = sink.zones();
    let (submissions, buffers) = submission_zones(&zones);
    assert_eq!(submissions.len() as u64, WARM + N + 1);
    assert_eq!(buffers.len(), submissions.len());
    for (s, b) in submissions.iter().zip(&buffers) {
        assert_eq!((s.depth, b.depth), (0, 1));
        assert!(
            s.begin_ns <= b.begin_ns && b.end_ns <= s.end_ns,
            "{s:?} {b:?}"
        );
        assert!(s.begin_ns <= s.end_ns);
    }
    // One after another on the stream: no two submissions overlap.
    for pair in submissions.windows(2) {
        assert!(pair[0].end_ns <= pair[1].begin_ns, "{pair:?}");
    }
}

/// Driver calls a phase of a test made, and the batches the queue's completion side retired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct CallCounts {
    queries: u64,
    elapsed: u64,
    records: u64,
    batches: u64,
}

impl CallCounts {
    fn now(fake: &cuhal_fake_driver::harness::FakeDriver, queue: &cuhal::Queue) -> Self {
        Self {
            queries: fake.calls(cu_name!(cuEventQuery)),
            elapsed: fake.calls(cu_name!(cuEventElapsedTime)),
            records: fake.calls(cu_name!(cuEventRecord)),
            batches: queue.stats().retire_batches,
        }
    }

    fn since(self, before: Self) -> Self {
        Self {
            queries: self.queries - before.queries,
            elapsed: self.elapsed - before.elapsed,
            records: self.records - before.records,
            batches: self.batches - before.batches,
        }
    }

    /// The queries beyond one per retired batch (the one the completion side asks of each
    /// batch's newest event).
    fn queries_beyond_batches(self) -> i64 {
        self.queries as i64 - self.batches as i64
    }
}

/// COARSE asks the driver nothing on the completion side that the queue does not already ask:
/// the queue's completion side tells the tracer which submissions it saw complete, and their
/// collection times each one's completion event (one `cuEventElapsedTime`) without a
/// `cuEventQuery` of its own. Against the same workload untraced, in three shapes: one
/// submission at a time (a batch each), back to back, and all held in flight until the
/// completion side blocks on the first (so its collection meets every later one still queued).
/// The queue's own queries are one per retired batch on the fake's GPU with no gathering (plus
/// the one after a block), so tracing's share is what the traced run asks beyond that, less
/// what the untraced run does: none. Per submission: the same events recorded (the completion
/// event) and one `cuEventElapsedTime`.
#[test]
fn coarse_collection_adds_no_event_query() {
    use std::time::{Duration, Instant};
    const WARM: u64 = 4;
    const N: u64 = 40;
    let run = |verbosity: Verbosity, tag: &str| {
        let sink = Arc::new(MemorySink::new());
        let (fake, _driver, device) = open(
            tag,
            DeviceOptions {
                // No gathering: no query to decide whether to defer a batch.
                completion: DeviceOptions::DEFAULT_COMPLETION.with_gather(Duration::ZERO),
                ..traced(verbosity, sink.clone())
            },
        );
        let queue = device.queue(0);
        let buffer = device.create_buffer(256).unwrap();
        let cb = fill_buffer(queue, &buffer, None);
        for _ in 0..WARM {
            queue.execute(&[], &[], &[&cb]).unwrap();
            fake_support::settle(queue);
        }
        // One at a time: each submission is a batch of its own.
        let before = CallCounts::now(&fake, queue);
        for _ in 0..N {
            queue.execute(&[], &[], &[&cb]).unwrap();
            fake_support::settle(queue);
        }
        let alone = CallCounts::now(&fake, queue).since(before);
        // Back to back.
        let before = CallCounts::now(&fake, queue);
        for _ in 0..N {
            queue.execute(&[], &[], &[&cb]).unwrap();
        }
        fake_support::settle(queue);
        let together = CallCounts::now(&fake, queue).since(before);
        // Held in flight: counted from when the completion side blocks on its first batch (its
        // nap's queries are the queue's and vary), then everything completes at once.
        fake.set_timing(Duration::from_secs(3600), Duration::ZERO);
        let blocks = || fake.calls(cu_name!(cuEventSynchronize));
        let blocked = blocks();
        for _ in 0..N {
            queue.execute(&[], &[], &[&cb]).unwrap();
        }
        let deadline = Instant::now() + fake_support::TIMEOUT;
        while blocks() == blocked {
            assert!(
                Instant::now() < deadline,
                "the completion side never blocked"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        let before = CallCounts::now(&fake, queue);
        fake.finish_work();
        fake_support::settle(queue);
        let held = CallCounts::now(&fake, queue).since(before);
        fake.set_timing(Duration::ZERO, Duration::ZERO);
        let not_ready = fake.elapsed_not_ready();
        drop(cb);
        drop(device);
        (alone, together, held, not_ready, sink)
    };
    let (off_alone, off_together, off_held, _, _) = run(Verbosity::Off, "coarse-queries-off");
    let (alone, together, held, not_ready, sink) = run(Verbosity::Coarse, "coarse-queries-on");

    // The queue's own driver calls, untraced: one query per batch, one record per submission.
    assert_eq!(
        off_alone,
        CallCounts {
            queries: N,
            elapsed: 0,
            records: N,
            batches: N
        }
    );
    assert_eq!(off_together.queries_beyond_batches(), 0, "{off_together:?}");
    assert_eq!(
        off_held.queries_beyond_batches(),
        1,
        "the query after the block"
    );

    // Traced, one at a time: exactly the untraced queries and records, one timing each.
    assert_eq!(alone.batches, N);
    assert_eq!(
        alone.queries, off_alone.queries,
        "COARSE queried events the queue had already seen complete: {alone:?}"
    );
    assert_eq!(alone.records, off_alone.records, "COARSE records no event");
    assert_eq!(alone.elapsed, N, "one cuEventElapsedTime per submission");

    // Traced, in batches: tracing's own queries are none.
    for (shape, traced, untraced) in [
        ("back to back", together, off_together),
        ("held in flight", held, off_held),
    ] {
        assert_eq!(
            traced.queries_beyond_batches() - untraced.queries_beyond_batches(),
            0,
            "{shape}: cuEventQuery calls of tracing's own over {N} submissions: {traced:?}"
        );
        assert_eq!(traced.elapsed, N, "{shape}");
    }
    assert_eq!(together.records, N);
    assert_eq!(not_ready, 0, "an incomplete event was timed");

    // Every submission still has its zone and its command buffer's, nested, in order.
    let zones = sink.zones();
    let (submissions, buffers) = submission_zones(&zones);
    assert_eq!(submissions.len() as u64, WARM + 3 * N);
    assert_eq!(buffers.len(), submissions.len());
    for (s, b) in submissions.iter().zip(&buffers) {
        assert!(
            s.begin_ns <= b.begin_ns && b.end_ns <= s.end_ns,
            "{s:?} {b:?}"
        );
    }
    for pair in submissions.windows(2) {
        assert!(pair[0].end_ns <= pair[1].begin_ns, "{pair:?}");
    }
}

/// A submission's zone says what it was: queue, ordinal, waits and signals, command buffer
/// labels, the submitting thread, and, when the GPU waited for another queue's work first,
/// that it did. Its command buffer's debug group nests inside the command buffer's zone.
#[test]
fn submission_zones_carry_their_details() {
    let sink = Arc::new(MemorySink::new());
    let (_fake, _driver, device) = open(
        "tracing-details",
        DeviceOptions {
            queues: 2,
            ..traced(Verbosity::Coarse, sink.clone())
        },
    );
    let (q0, q1) = (device.queue(0), device.queue(1));
    let buffer = device.create_buffer(256).unwrap();
    let first = fill_buffer(q0, &buffer, Some("produce"));
    let second = fill_buffer(q1, &buffer, None);
    let (ready, done) = (device.create_semaphore(0), device.create_semaphore(0));
    // Queue 1 waits for queue 0's signal, which is not even submitted yet: once queue 0
    // issues, queue 1's submission waits for it on the device.
    q1.execute(&[(&ready, 1)], &[(&done, 1)], &[&second])
        .unwrap();
    q0.execute(&[], &[(&ready, 1)], &[&first]).unwrap();
    fake_support::wait(&done, 1);
    drop((first, second));
    drop(device);

    let submissions = sink.submissions();
    assert_eq!(submissions.len(), 2, "{submissions:?}");
    let on = |queue: &str| {
        submissions
            .iter()
            .find(|s| s.queue.ends_with(queue))
            .unwrap_or_else(|| panic!("no submission of {queue}: {submissions:?}"))
    };
    let (s0, s1) = (on("queue 0"), on("queue 1"));
    assert_eq!((s0.ordinal, s1.ordinal), (1, 1), "ordinals count per queue");
    assert_eq!(s0.waits, []);
    assert_eq!(s0.signals, [(ready.id().get(), 1)]);
    assert_eq!(s1.waits, [(ready.id().get(), 1)]);
    assert_eq!(s1.signals, [(done.id().get(), 1)]);
    assert_eq!(s0.command_buffers, ["graph command buffer"]);
    assert_eq!(
        s0.thread,
        cuhal_trace::thread_id(),
        "submitted on this thread"
    );
    assert_eq!(s0.issuing_thread, s0.thread, "and issued at once on it");
    assert_eq!(s0.device_wait_ns, None, "queue 0 waited for nothing");
    assert!(
        s1.device_wait_ns.is_some(),
        "queue 1 waited on the device for queue 0: {s1:?}"
    );
    assert_ne!(s0.flow, s1.flow);
    let zones = sink.zones();
    let names: Vec<(&str, usize)> = zones
        .iter()
        .filter(|z| z.track == s0.track)
        .map(|z| (z.name.as_str(), z.depth))
        .collect();
    assert_eq!(
        names,
        [
            ("submission", 0),
            ("graph command buffer", 1),
            ("produce", 2)
        ]
    );
}

/// The Perfetto JSON sink shows the host side of a submission and links it to its GPU zone: a
/// `submit` zone on the submitting thread, a flow arrow (`s` there, `f` on the GPU track, same
/// id), and details in `args`.
#[test]
fn json_trace_links_host_submissions_to_their_gpu_zones() {
    let sink = Arc::new(cuhal_trace::JsonSink::new(Vec::<u8>::new()).unwrap());
    let (_fake, _driver, device) = open("tracing-json", traced(Verbosity::Coarse, sink.clone()));
    let queue = device.queue(0);
    let buffer = device.create_buffer(256).unwrap();
    let cb = fill_buffer(queue, &buffer, Some("work"));
    let done = device.create_semaphore(0);
    for n in 1..=3 {
        queue.execute(&[], &[(&done, n)], &[&cb]).unwrap();
        fake_support::wait(&done, n);
    }
    drop(cb);
    drop(device);
    let bytes = sink.finish().unwrap().unwrap();
    let events: Vec<serde_json::Value> = serde_json::from_slice(&bytes).unwrap();
    let phase =
        |ph: &str| -> Vec<&serde_json::Value> { events.iter().filter(|e| e["ph"] == ph).collect() };
    let (starts, ends) = (phase("s"), phase("f"));
    assert_eq!((starts.len(), ends.len()), (3, 3));
    let host: Vec<_> = phase("X")
        .into_iter()
        .filter(|e| e["name"] == "submit")
        .collect();
    let gpu: Vec<_> = phase("X")
        .into_iter()
        .filter(|e| e["name"] == "submission")
        .collect();
    assert_eq!((host.len(), gpu.len()), (3, 3));
    for ((s, f), (h, g)) in starts.iter().zip(&ends).zip(host.iter().zip(&gpu)) {
        assert_eq!(s["id"], f["id"], "one arrow: {s} {f}");
        assert_eq!(s["tid"], h["tid"], "starts on the submitting thread");
        assert_eq!(f["tid"], g["tid"], "ends on the GPU track");
        assert_eq!(f["ts"], g["ts"], "at the GPU zone's start");
        assert_eq!(f["bp"], "e");
        let args = &g["args"];
        assert_eq!(args["queue"], "GPU 0 queue 0");
        assert!(args["ordinal"].as_u64().is_some(), "{args}");
        assert_eq!(args["waits"], serde_json::json!([]));
        assert_eq!(args["signals"][0][1], args["ordinal"]);
        assert_eq!(args["command_buffers"][0], "graph command buffer");
    }
    let cbs: Vec<_> = phase("X")
        .into_iter()
        .filter(|e| e["name"] == "graph command buffer")
        .collect();
    assert_eq!(cbs.len(), 3);
    assert_eq!(cbs[0]["args"]["label"], "graph command buffer");
}

/// COARSE collection asks the driver for an event's time only once the event is complete: a
/// submission still running when another's completion collects is left for a later collection
/// (nothing lost), without a `cuEventElapsedTime` call that answers `CUDA_ERROR_NOT_READY`
/// (compute-sanitizer reports each such call as an API error).
#[test]
fn coarse_collection_never_times_an_incomplete_event() {
    use std::time::Duration;
    const N: u64 = 6;
    let sink = Arc::new(MemorySink::new());
    let (fake, _driver, device) = open("coarse-not-ready", traced(Verbosity::Coarse, sink.clone()));
    let queue = device.queue(0);
    let buffer = device.create_buffer(256).unwrap();
    // A debug group: COARSE times it with events of its own, inside the graph.
    let cb = fill_buffer(queue, &buffer, Some("group"));
    // Each graph launch keeps the stream busy, so the first submission completes (and its
    // completion collects) while the later ones still run.
    fake.set_timing(Duration::from_millis(15), Duration::ZERO);
    let done = device.create_semaphore(0);
    for n in 1..=N {
        queue.execute(&[], &[(&done, n)], &[&cb]).unwrap();
    }
    fake_support::wait(&done, N);
    fake_support::settle(queue);
    fake.set_timing(Duration::ZERO, Duration::ZERO);
    drop(cb);
    drop(device);
    let zones = sink.zones();
    let count = |name: &str| zones.iter().filter(|z| z.name == name).count() as u64;
    assert_eq!(count("submission"), N, "{zones:?}");
    assert_eq!(count("graph command buffer"), N);
    assert_eq!(count("group"), N);
    assert!(
        fake.calls(cu_name!(cuEventElapsedTime)) > 0,
        "the zones were timed by the driver"
    );
    assert_eq!(
        fake.elapsed_not_ready(),
        0,
        "cuEventElapsedTime was asked about an event not complete yet"
    );
}

/// A queue that asks for CUPTI explicitly while another profiler (or compute-sanitizer) holds
/// CUPTI's one subscriber does not open, and says why with a typed error the GPU suite tells
/// apart from every other failure (it skips its CUPTI tests only then).
#[test]
fn cupti_held_by_another_subscriber_is_a_typed_error() {
    use cuhal::CuptiChoice;
    use cuhal_trace::cupti::CuptiError;
    use cuhal_trace::cupti::fake::FakeCupti;

    let cupti = FakeCupti::install();
    let options = |cupti: CuptiChoice| DeviceOptions {
        cupti,
        ..traced(Verbosity::Fine, Arc::new(MemorySink::new()))
    };
    let (_fake, driver) = fake_support::load("cupti-taken");
    cupti.take_subscriber();
    let err = driver
        .open(
            0,
            options(CuptiChoice::Api {
                api: cupti.api(),
                required: true,
            }),
        )
        .expect_err("CUPTI is held by another subscriber");
    assert_eq!(err.cupti(), Some(&CuptiError::SubscriberTaken), "{err:?}");
    assert!(
        err.to_string()
            .contains("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"),
        "{err}"
    );
    assert!(err.cuda().is_none(), "not a driver error: {err:?}");

    // Other reasons are not that one: a missing library,
    let err = driver
        .open(
            0,
            options(CuptiChoice::Library {
                path: "/nonexistent/libcupti.so.13".into(),
                required: true,
            }),
        )
        .expect_err("no such library");
    assert!(
        matches!(err.cupti(), Some(CuptiError::LibraryNotFound { .. })),
        "{err:?}"
    );
    // and errors that are not CUPTI's at all.
    let (_fake, driver) =
        fake_support::load_with("cupti-taken-no-device", |f| f.set_device_count(0));
    let err = driver
        .open(
            0,
            options(CuptiChoice::Api {
                api: cupti.api(),
                required: true,
            }),
        )
        .expect_err("no device");
    assert_eq!(err.cupti(), None, "{err:?}");
    // Not required: FINE falls back to event zones and says why.
    let (_fake, _driver, device) = open(
        "cupti-taken-fallback",
        options(CuptiChoice::Api {
            api: cupti.api(),
            required: false,
        }),
    );
    let stats = device.queue(0).trace().unwrap().stats();
    assert_eq!(stats.fine_source, cuhal_trace::FineSource::Events);
    assert_eq!(
        stats.cupti_unavailable,
        Some("subscriber taken by another profiler")
    );
}

/// The submission zones among `zones` and their graph command buffers' zones, in order.
fn submission_zones(zones: &[MemoryZone]) -> (Vec<&MemoryZone>, Vec<&MemoryZone>) {
    let named = |name: &str| zones.iter().filter(|z| z.name == name).collect::<Vec<_>>();
    (named("submission"), named("graph command buffer"))
}

/// The fake GPU runs no kernels, so the clock exchange's kernel exits (its completion event
/// completes) without answering: the host notices at its next look instead of waiting out its
/// timeout, the queue's tracing falls back to the host-bracket calibration and counts it, and
/// zones are still collected.
#[test]
fn a_clock_exchange_nobody_answers_falls_back_at_once() {
    let sink = Arc::new(MemorySink::new());
    let opened = std::time::Instant::now();
    let (fake, _driver, device) = open(
        "tracing-clock-exchange",
        traced(Verbosity::Coarse, sink.clone()),
    );
    let open_took = opened.elapsed();
    let trace = device.queue(0).trace().expect("traced");
    let stats = trace.stats();
    assert_eq!(stats.calibrations, 1, "{stats:?}");
    assert_eq!((stats.clock_syncs, stats.clock_sync_failures), (0, 1));
    assert_eq!(stats.clock_sync, None);
    assert_eq!(
        stats.clock_sync_failure,
        Some("the exchange kernel exited without answering")
    );
    assert_eq!(fake.launches("cuhal_clock_exchange"), 1);
    assert!(
        open_took < cuhal_trace::EXCHANGE_TIMEOUT * 10,
        "opening took {open_took:?}"
    );
    // A re-calibration tries again (the previous kernel has exited) and falls back again.
    trace.recalibrate().unwrap();
    let stats = trace.stats();
    assert_eq!((stats.calibrations, stats.clock_sync_failures), (2, 2));
    assert_eq!(fake.launches("cuhal_clock_exchange"), 2);
    let queue = device.queue(0);
    let buffer = device.create_buffer(256).unwrap();
    let cb = fill_buffer(queue, &buffer, None);
    let done = device.create_semaphore(0);
    queue.execute(&[], &[(&done, 1)], &[&cb]).unwrap();
    fake_support::wait(&done, 1);
    drop(cb);
    drop(device);
    assert!(!sink.zones().is_empty());
    assert_eq!(sink.clock_snapshots().len(), 2);
}
