//! Tracing is chosen per queue when the device opens.

mod fake_support;

use cuhal_sys::cu_name;
use std::sync::Arc;

use cuhal::{DeviceOptions, MemorySink, Verbosity};
use fake_support::open;

#[test]
fn each_queue_traces_at_its_own_verbosity() {
    let sink = Arc::new(MemorySink::new());
    let (_fake, _driver, device) = open(
        "tracing-per-queue",
        DeviceOptions {
            queues: 3,
            tracing: Verbosity::Coarse,
            queue_tracing: vec![Verbosity::Fine, Verbosity::Off],
            trace_sink: Some(sink),
            ..DeviceOptions::default()
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
    let (_fake, _driver, device) = open(
        "tracing-resubmit",
        DeviceOptions {
            tracing: Verbosity::Fine,
            trace_sink: Some(sink.clone()),
            ..DeviceOptions::default()
        },
    );
    let queue = device.queue(0);
    let buffer = device.create_buffer(256).unwrap();
    let mut cb = queue.create_command_buffer().unwrap();
    cb.begin_debug_group("work").unwrap();
    cb.fill(&buffer.whole(), FillPattern::U32(1)).unwrap();
    cb.end_debug_group().unwrap();
    cb.end().unwrap();
    let cb: Arc<dyn CommandBuffer> = Arc::from(cb);
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
/// its commands (only the command buffer's and debug groups' zones have events), where FINE on
/// timing events adds a pair per command.
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
                tracing: Verbosity::Fine,
                trace_sink: Some(sink.clone()),
                cupti: choice,
                ..DeviceOptions::default()
            },
        );
        let source = device.queue(0).trace().unwrap().stats().fine_source;
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
        cb.end().unwrap();
        let nodes = fake.calls(cu_name!(cuGraphAddEventRecordNode));
        let cb: Arc<dyn CommandBuffer> = Arc::from(cb);
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
    assert_eq!(
        with_cupti, 4,
        "command buffer and debug group: begin and end each"
    );
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
    assert_eq!(with_events, 8, "and a pair around each of the two commands");
}
