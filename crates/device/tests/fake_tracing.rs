//! Tracing is chosen per queue when the device opens.

mod fake_support;

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
