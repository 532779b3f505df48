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
