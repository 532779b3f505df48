//! The CUPTI path against the fake CUPTI.

use super::fake::FakeCupti;
use super::ffi::{self, cbid};
use super::*;

#[test]
fn a_session_subscribes_enables_the_three_kinds_and_undoes_it_when_dropped() {
    let fake = FakeCupti::install();
    let session = CuptiSession::acquire_with(fake.api()).unwrap();
    assert!(fake.subscribed());
    for kind in [
        ffi::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
        ffi::CUPTI_ACTIVITY_KIND_MEMCPY,
        ffi::CUPTI_ACTIVITY_KIND_MEMSET,
    ] {
        assert!(fake.kind_enabled(kind), "kind {kind}");
    }
    // The serializing kernel kind stays off.
    assert!(!fake.kind_enabled(ffi::CUPTI_ACTIVITY_KIND_KERNEL));
    // A second user shares the live session instead of subscribing again.
    let again = CuptiSession::acquire_with(fake.api()).unwrap();
    assert!(std::sync::Arc::ptr_eq(&session, &again));
    drop(again);
    assert!(fake.subscribed());
    drop(session);
    assert!(!fake.subscribed());
    assert!(!fake.kind_enabled(ffi::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
}

#[test]
fn another_subscriber_is_reported_as_taken() {
    let fake = FakeCupti::install();
    fake.take_subscriber();
    let err = CuptiSession::acquire_with(fake.api()).unwrap_err();
    assert_eq!(err, CuptiError::SubscriberTaken);
    assert!(err.to_string().contains("MULTIPLE_SUBSCRIBERS"), "{err}");
    // Nothing was left half set up.
    assert!(!fake.kind_enabled(ffi::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
}

#[test]
fn a_capture_collects_the_correlation_ids_of_this_threads_launches_in_order() {
    let fake = FakeCupti::install();
    let _session = CuptiSession::acquire_with(fake.api()).unwrap();
    // Before the capture: not collected.
    fake.launch(cbid::LAUNCH_KERNEL);
    let capture = CaptureGuard::start();
    let a = fake.launch(cbid::LAUNCH_KERNEL);
    let failed = fake.failed_launch(cbid::MEMSET_D32_ASYNC);
    let b = fake.launch(cbid::MEMSET_D32_ASYNC);
    let c = fake.launch(cbid::MEMCPY_DTOD_ASYNC);
    // A call cuhal does not capture (not a launch): no callback enabled for it.
    fake.launch(9999);
    // Another thread's launches are not this capture's.
    std::thread::scope(|s| {
        s.spawn(|| fake.launch(cbid::LAUNCH_KERNEL));
    });
    let ids = capture.finish(|ids| ids.to_vec());
    assert_eq!(
        ids,
        vec![a, b, c],
        "failed call {failed} must not be captured"
    );
    // After the capture: not collected.
    fake.launch(cbid::GRAPH_LAUNCH);
    let capture = CaptureGuard::start();
    let g = fake.launch(cbid::GRAPH_LAUNCH);
    assert_eq!(capture.finish(|ids| ids.to_vec()), vec![g]);
}

#[test]
fn records_arrive_through_the_buffers_and_are_taken_by_correlation_id() {
    let fake = FakeCupti::install();
    let session = CuptiSession::acquire_with(fake.api()).unwrap();
    fake.complete_kernel(5, 100, 200, 0);
    fake.complete_memset(6, 210, 220, 0);
    fake.complete_memcpy(6, 230, 260, 0);
    fake.complete_kernel(7, 300, 400, 0);
    assert_eq!(session.flush().unwrap(), 4);
    assert_eq!(session.unclaimed(), 4);
    let mut got = Vec::new();
    assert_eq!(session.take(6, |a| got.push(*a)), 2);
    assert_eq!(
        got.iter()
            .map(|a| (a.kind, a.start, a.end))
            .collect::<Vec<_>>(),
        vec![
            (ActivityKind::Memset, 210, 220),
            (ActivityKind::Memcpy, 230, 260)
        ]
    );
    assert_eq!(session.unclaimed(), 2);
    assert_eq!(session.claim(|a| a.correlation_id == 5), 1);
    assert_eq!(session.take(7, |_| {}), 1);
    assert_eq!(session.unclaimed(), 0);
    assert_eq!(session.records_parsed(), 4);
}

#[test]
fn many_records_span_several_buffers_which_are_recycled() {
    let fake = FakeCupti::install();
    let session = CuptiSession::acquire_with(fake.api()).unwrap();
    // More records than one buffer holds.
    let n = BUFFER_BYTES / 216 * 3 + 17;
    for round in 0..3u64 {
        for i in 0..n as u64 {
            fake.complete_kernel(
                (i % 1000) as u32,
                round * 1_000_000 + i,
                round * 1_000_000 + i + 1,
                0,
            );
        }
        assert_eq!(session.flush().unwrap(), n);
        assert_eq!(session.claim(|_| true), n);
    }
    assert_eq!(session.dropped(), 0);
}

#[test]
fn graph_records_map_from_the_clone_to_the_node_cuhal_added() {
    let fake = FakeCupti::install();
    let session = CuptiSession::acquire_with(fake.api()).unwrap();
    let original = 0x1000 as cuhal_sys::CUgraphNode;
    let clone = 0x2000 as cuhal_sys::CUgraphNode;
    fake.set_node_id(original, 0x7_0000_0001);
    fake.set_node_id(clone, 0x9_0000_0001);
    // SAFETY: the fake knows the node; it never dereferences it.
    let id = unsafe { session.graph_node_id(original) };
    assert_eq!(id.unwrap(), 0x7_0000_0001);
    fake.clone_node(original, clone);
    assert_eq!(session.original_node_id(0x9_0000_0001), 0x7_0000_0001);
    // Unknown ids are taken as the original's own.
    assert_eq!(session.original_node_id(42), 42);
    // An unknown node is a typed error.
    // SAFETY: the fake answers for any handle.
    let err = unsafe { session.graph_node_id(0x3000 as cuhal_sys::CUgraphNode) }.unwrap_err();
    assert!(
        matches!(
            err,
            CuptiError::Call {
                call: "cuptiGetGraphNodeId",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn cupti_times_are_converted_onto_the_trace_clock() {
    let fake = FakeCupti::install();
    // CUPTI's clock runs 5 s ahead of the trace clock.
    fake.set_clock_offset(5_000_000_000);
    let session = CuptiSession::acquire_with(fake.api()).unwrap();
    let map = session.clock();
    let now = crate::clock::now_ns();
    let cupti_now = now + 5_000_000_000;
    let converted = map.to_trace_ns(cupti_now);
    // Within the calibration bracket (plus the time since it was taken).
    assert!(
        converted.abs_diff(now) <= map.uncertainty_ns + (now - map.taken_at_ns) + 1_000,
        "{converted} vs {now}, {map:?}"
    );
    // Durations are kept exactly.
    assert_eq!(map.to_trace_ns(cupti_now + 1_234) - converted, 1_234);
}
