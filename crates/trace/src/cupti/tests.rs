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
fn a_record_tap_sees_each_record_as_parsed_and_leaves_it_for_tracing() {
    static SEEN: std::sync::Mutex<Vec<(u32, u64)>> = std::sync::Mutex::new(Vec::new());
    fn tap(a: &Activity) {
        SEEN.lock().unwrap().push((a.correlation_id, a.start));
    }
    let fake = FakeCupti::install();
    let session = CuptiSession::acquire_with(fake.api()).unwrap();
    SEEN.lock().unwrap().clear();
    CuptiSession::set_record_tap(Some(tap));
    fake.complete_kernel(5, 100, 200, 0);
    fake.complete_memset(6, 210, 220, 0);
    assert_eq!(session.flush().unwrap(), 2);
    assert_eq!(*SEEN.lock().unwrap(), vec![(5, 100), (6, 210)]);
    // Still there for tracing to claim.
    assert_eq!(session.unclaimed(), 2);
    CuptiSession::set_record_tap(None);
    fake.complete_kernel(7, 300, 400, 0);
    assert_eq!(session.flush().unwrap(), 1);
    assert_eq!(SEEN.lock().unwrap().len(), 2, "no tap, nothing seen");
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
fn records_no_context_claims_are_dropped_once_stale_so_they_stay_bounded() {
    let fake = FakeCupti::install();
    let session = CuptiSession::acquire_with(fake.api()).unwrap();
    // A queue's own copies, another library's kernels: records nobody claims.
    for i in 0..MAX_UNCLAIMED as u64 {
        fake.complete_memcpy(1, 1_000 + i, 1_100 + i, 0);
    }
    session.flush().unwrap();
    assert_eq!(session.unclaimed(), MAX_UNCLAIMED);
    assert_eq!(session.discarded(), 0);
    // Past the cap, what is older than the age behind the newest record goes.
    let late = 1_100 + MAX_UNCLAIMED as u64 + UNCLAIMED_AGE_NS + 1;
    fake.complete_kernel(2, late - 100, late, 0);
    session.flush().unwrap();
    assert_eq!(session.unclaimed(), 1);
    assert_eq!(session.discarded(), MAX_UNCLAIMED as u64);
    assert_eq!(session.take(2, |_| {}), 1);
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
            CuptiError::Call { call, .. } if call == crate::cupti_name!(cuptiGetGraphNodeId)
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

mod zones {
    //! FINE command zones from activity records, through a tracing context on the fake GPU and
    //! the fake CUPTI.

    use std::sync::Arc;

    use super::super::fake::FakeCupti;
    use super::super::ffi::cbid;
    use crate::fake::FakeGpu;
    use crate::{
        CuptiChoice, DropReason, Error, FineSource, MemorySink, TraceConfig, TraceContext,
        Verbosity, ZoneList,
    };

    /// The fake GPU's clock reads 1 ms; CUPTI's reads `CUPTI_AT_1MS` then, so CUPTI time `t`
    /// is trace time `t - CUPTI_AT_1MS + 1 ms`.
    const CUPTI_AT_1MS: u64 = 50_000_000_000;

    fn to_cupti(trace_ns: u64) -> u64 {
        trace_ns - 1_000_000 + CUPTI_AT_1MS
    }

    /// A FINE tracing context on a fresh fake GPU and memory sink that times commands by
    /// `fake`'s records (required), with CUPTI's clock at `CUPTI_AT_1MS`.
    fn traced(fake: &FakeCupti) -> (Arc<FakeGpu>, Arc<MemorySink>, TraceContext) {
        fake.set_timestamp(Some(CUPTI_AT_1MS));
        let gpu = FakeGpu::new();
        let sink = Arc::new(MemorySink::new());
        let config = fine(api(fake, true));
        let trace = TraceContext::with_backend(gpu.clone(), config, sink.clone()).unwrap();
        (gpu, sink, trace)
    }

    /// A tracing context for `config` on a fresh fake GPU and memory sink.
    fn open(config: TraceConfig) -> Result<TraceContext, Error> {
        TraceContext::with_backend(FakeGpu::new(), config, Arc::new(MemorySink::new()))
    }

    /// A FINE configuration that asks for `cupti`.
    fn fine(cupti: CuptiChoice) -> TraceConfig {
        TraceConfig {
            cupti,
            ..TraceConfig::new(Verbosity::Fine, "queue 0")
        }
    }

    /// The fake CUPTI's function table.
    fn api(fake: &FakeCupti, required: bool) -> CuptiChoice {
        CuptiChoice::Api {
            api: fake.api(),
            required,
        }
    }

    /// A CUPTI library at a path where none is.
    fn missing_library(required: bool) -> CuptiChoice {
        CuptiChoice::Library {
            path: "/nonexistent/libcupti.so.13".into(),
            required,
        }
    }

    /// Records a command buffer zone around `names` (activity-timed) and returns the list and
    /// the buffer zone's events.
    fn record(list: &ZoneList, names: &[&str]) -> (cuhal_sys::CUevent, cuhal_sys::CUevent) {
        let begin = list.begin_zone("command buffer").unwrap();
        for name in names {
            let timing = list.command_zone(name, cuhal_command::EventPlacement::Graph);
            assert!(timing.by_activity && timing.begin.is_none() && timing.end.is_none());
        }
        let end = list.end_zone().unwrap();
        (begin, end)
    }

    #[test]
    fn deferred_replay_commands_take_their_records_times_and_keep_names_and_nesting() {
        let fake = FakeCupti::install();
        let (gpu, sink, trace) = traced(&fake);
        assert_eq!(trace.stats().fine_source, FineSource::Cupti);
        let list = trace.zone_list().unwrap();
        let (begin, end) = record(&list, &["fill", "saxpy", "copy"]);
        // The issue, on this thread: one launch per command, in order.
        list.will_issue();
        let fill = fake.launch(cbid::MEMSET_D32_ASYNC);
        let saxpy = fake.launch(cbid::LAUNCH_KERNEL);
        let copy = fake.launch(cbid::MEMCPY_DTOD_ASYNC);
        drop(list.on_submit());
        gpu.complete_at(begin, 2_000_000);
        gpu.complete_at(end, 2_100_000);
        // Records arrive in any order.
        fake.complete_kernel(saxpy, to_cupti(2_010_000), to_cupti(2_050_500), 0);
        fake.complete_memcpy(copy, to_cupti(2_051_000), to_cupti(2_060_000), 0);
        fake.complete_memset(fill, to_cupti(2_001_000), to_cupti(2_009_000), 0);
        assert_eq!(trace.collect(), 4);
        let zones = sink.zones();
        let got: Vec<_> = zones
            .iter()
            .map(|z| (z.name.as_str(), z.begin_ns, z.end_ns, z.depth))
            .collect();
        assert_eq!(
            got,
            vec![
                ("command buffer", 2_000_000, 2_100_000, 0),
                ("fill", 2_001_000, 2_009_000, 1),
                ("saxpy", 2_010_000, 2_050_500, 1),
                ("copy", 2_051_000, 2_060_000, 1),
            ]
        );
        let stats = trace.stats();
        assert_eq!(stats.activity_zones, 3);
        assert_eq!(stats.dropped.total(), 0);
    }

    #[test]
    fn graph_records_find_their_commands_through_the_cloned_node_ids() {
        let fake = FakeCupti::install();
        let (gpu, sink, trace) = traced(&fake);
        let list = trace.zone_list().unwrap();
        let begin = list.begin_zone("command buffer").unwrap();
        let nodes: Vec<cuhal_sys::CUgraphNode> = (1..=3)
            .map(|i| (0x100 * i) as cuhal_sys::CUgraphNode)
            .collect();
        for (i, (name, node)) in ["a", "b", "c"].iter().zip(&nodes).enumerate() {
            fake.set_node_id(*node, 0x5_0000_0000 + i as u64);
            list.command_zone(name, cuhal_command::EventPlacement::Graph);
            // SAFETY: the fake knows the node.
            unsafe { list.command_node(*node) };
        }
        let end = list.end_zone().unwrap();
        // Instantiation clones every node; records name the clones.
        for (i, node) in nodes.iter().enumerate() {
            let clone = (0x9000 + i) as cuhal_sys::CUgraphNode;
            fake.set_node_id(clone, 0x8_0000_0000 + i as u64);
            fake.clone_node(*node, clone);
        }
        list.will_issue();
        let launch = fake.launch(cbid::GRAPH_LAUNCH);
        drop(list.on_submit());
        gpu.complete_at(begin, 3_000_000);
        gpu.complete_at(end, 3_100_000);
        // The three nodes ran concurrently, in an order unlike their recording.
        fake.complete_kernel(
            launch,
            to_cupti(3_020_000),
            to_cupti(3_030_000),
            0x8_0000_0002,
        );
        fake.complete_kernel(
            launch,
            to_cupti(3_001_000),
            to_cupti(3_040_000),
            0x8_0000_0000,
        );
        fake.complete_kernel(
            launch,
            to_cupti(3_005_000),
            to_cupti(3_006_000),
            0x8_0000_0001,
        );
        assert_eq!(trace.collect(), 4);
        let mut got: Vec<_> = sink
            .zones()
            .iter()
            .map(|z| (z.name.clone(), z.duration_ns()))
            .collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                ("a".to_owned(), 39_000),
                ("b".to_owned(), 1_000),
                ("c".to_owned(), 10_000),
                ("command buffer".to_owned(), 100_000),
            ]
        );
    }

    #[test]
    fn a_replayed_graph_of_a_hundred_commands_flushes_once_per_collection_and_recycles_buffers() {
        const COMMANDS: usize = 100;
        let fake = FakeCupti::install();
        let (gpu, sink, trace) = traced(&fake);
        let session = crate::cupti::CuptiSession::acquire_with(fake.api()).unwrap();
        let list = trace.zone_list().unwrap();
        let begin = list.begin_zone("command buffer").unwrap();
        let names: Vec<String> = (0..COMMANDS).map(|i| format!("k{i}")).collect();
        for (i, name) in names.iter().enumerate() {
            let node = (0x1000 + i) as cuhal_sys::CUgraphNode;
            fake.set_node_id(node, 0x5_0000_0000 + i as u64);
            list.command_zone(name, cuhal_command::EventPlacement::Graph);
            // SAFETY: the fake knows the node.
            unsafe { list.command_node(node) };
        }
        let end = list.end_zone().unwrap();
        for i in 0..COMMANDS {
            let clone = (0x9000 + i) as cuhal_sys::CUgraphNode;
            fake.set_node_id(clone, 0x8_0000_0000 + i as u64);
            fake.clone_node((0x1000 + i) as cuhal_sys::CUgraphNode, clone);
        }
        let mut buffers = None;
        // 300 replays of 100 kernel records: several buffers' worth, recycled.
        for round in 0..300u64 {
            sink.clear();
            list.will_issue();
            let launch = fake.launch(cbid::GRAPH_LAUNCH);
            drop(list.on_submit());
            let t = 10_000_000 * (round + 1);
            gpu.complete_at(begin, t);
            gpu.complete_at(end, t + 1_000_000);
            // Records come in the reverse of the recording order; node i runs i + 1 ns.
            for i in (0..COMMANDS as u64).rev() {
                let start = t + 1_000 + 2_000 * i;
                fake.complete_kernel(
                    launch,
                    to_cupti(start),
                    to_cupti(start + i + 1),
                    0x8_0000_0000 + i,
                );
            }
            let flushes = fake.flushes();
            assert_eq!(trace.collect(), COMMANDS as u64 + 1, "round {round}");
            assert_eq!(
                fake.flushes(),
                flushes + 1,
                "one flush, for the records missing"
            );
            // Nothing waits for records: no flush.
            assert_eq!(trace.collect(), 0);
            assert_eq!(fake.flushes(), flushes + 1, "no flush when nothing waits");
            let zones = sink.zones();
            for (i, name) in names.iter().enumerate() {
                let zone = zones.iter().find(|z| &z.name == name).unwrap();
                assert_eq!(zone.duration_ns(), i as u64 + 1, "round {round}, {name}");
            }
            assert_eq!(session.unclaimed(), 0, "round {round}: every record taken");
            let allocated = crate::cupti::CuptiSession::buffers_allocated();
            assert_eq!(
                *buffers.get_or_insert(allocated),
                allocated,
                "round {round}: buffers are recycled, not allocated anew"
            );
        }
        let stats = trace.stats();
        assert_eq!(stats.dropped.total(), 0, "{stats:?}");
        assert_eq!(stats.activity_zones, 300 * COMMANDS as u64);
        assert_eq!(session.discarded(), 0);
    }

    #[test]
    fn records_not_yet_delivered_keep_the_list_pending_then_it_is_shown() {
        let fake = FakeCupti::install();
        let (gpu, _sink, trace) = traced(&fake);
        let list = trace.zone_list().unwrap();
        let (begin, end) = record(&list, &["k"]);
        list.will_issue();
        let id = fake.launch(cbid::LAUNCH_KERNEL);
        drop(list.on_submit());
        gpu.complete_at(begin, 2_000_000);
        gpu.complete_at(end, 2_100_000);
        assert_eq!(trace.collect(), 0);
        assert_eq!(trace.stats().pending_submissions, 1);
        fake.complete_kernel(id, to_cupti(2_010_000), to_cupti(2_020_000), 0);
        assert_eq!(trace.collect(), 2);
        assert_eq!(trace.stats().pending_submissions, 0);
    }

    #[test]
    fn records_that_never_come_drop_only_the_command_zones() {
        let fake = FakeCupti::install();
        let (gpu, sink, trace) = traced(&fake);
        let list = trace.zone_list().unwrap();
        let (begin, end) = record(&list, &["k1", "k2"]);
        list.will_issue();
        fake.launch(cbid::LAUNCH_KERNEL);
        fake.launch(cbid::LAUNCH_KERNEL);
        drop(list.on_submit());
        gpu.complete_at(begin, 2_000_000);
        gpu.complete_at(end, 2_100_000);
        let mut shown = 0;
        for _ in 0..64 {
            shown += trace.collect();
        }
        assert_eq!(shown, 1, "the command buffer zone alone");
        assert_eq!(sink.zones()[0].name, "command buffer");
        assert_eq!(trace.stats().dropped.get(DropReason::ActivityMissing), 2);
        assert_eq!(sink.dropped(DropReason::ActivityMissing), 2);
    }

    #[test]
    fn launches_that_do_not_match_the_commands_are_never_misattributed() {
        let fake = FakeCupti::install();
        let (gpu, _sink, trace) = traced(&fake);
        let list = trace.zone_list().unwrap();
        let (begin, end) = record(&list, &["k1", "k2"]);
        list.will_issue();
        // Three launches for two commands (stream work, say): which is which is unknown.
        for _ in 0..3 {
            let id = fake.launch(cbid::LAUNCH_KERNEL);
            fake.complete_kernel(id, to_cupti(2_010_000), to_cupti(2_020_000), 0);
        }
        drop(list.on_submit());
        gpu.complete_at(begin, 2_000_000);
        gpu.complete_at(end, 2_100_000);
        assert_eq!(trace.collect(), 1);
        assert_eq!(trace.stats().dropped.get(DropReason::ActivityMissing), 2);
    }

    #[test]
    fn two_lists_issued_back_to_back_each_get_their_own_launches() {
        let fake = FakeCupti::install();
        let (gpu, sink, trace) = traced(&fake);
        let first = trace.zone_list().unwrap();
        let second = trace.zone_list().unwrap();
        let (b1, e1) = record(&first, &["one"]);
        let (b2, e2) = record(&second, &["two"]);
        // As a queue issues one submission of two command buffers.
        first.will_issue();
        let one = fake.launch(cbid::LAUNCH_KERNEL);
        second.will_issue();
        let two = fake.launch(cbid::LAUNCH_KERNEL);
        drop(first.on_submit());
        drop(second.on_submit());
        for (e, t) in [
            (b1, 2_000_000),
            (e1, 2_100_000),
            (b2, 2_200_000),
            (e2, 2_300_000),
        ] {
            gpu.complete_at(e, t);
        }
        fake.complete_kernel(one, to_cupti(2_010_000), to_cupti(2_011_000), 0);
        fake.complete_kernel(two, to_cupti(2_210_000), to_cupti(2_213_000), 0);
        assert_eq!(trace.collect(), 4);
        let got: Vec<_> = sink
            .zones()
            .iter()
            .map(|z| (z.name.clone(), z.duration_ns()))
            .collect();
        assert!(got.contains(&("one".to_owned(), 1_000)), "{got:?}");
        assert!(got.contains(&("two".to_owned(), 3_000)), "{got:?}");
    }

    #[test]
    fn resubmitting_reuses_the_lists_storage_and_times_each_submission() {
        let fake = FakeCupti::install();
        let (gpu, sink, trace) = traced(&fake);
        let list = trace.zone_list().unwrap();
        let (begin, end) = record(&list, &["k"]);
        for round in 0..5u64 {
            list.will_issue();
            let id = fake.launch(cbid::LAUNCH_KERNEL);
            drop(list.on_submit());
            let t = 10_000_000 * (round + 1);
            gpu.complete_at(begin, t);
            gpu.complete_at(end, t + 100_000);
            fake.complete_kernel(
                id,
                to_cupti(t + 1_000),
                to_cupti(t + 1_000 + round * 10 + 5),
                0,
            );
            assert_eq!(trace.collect(), 2);
        }
        let durations: Vec<u64> = sink
            .zones()
            .iter()
            .filter(|z| z.name == "k")
            .map(|z| z.duration_ns())
            .collect();
        assert_eq!(durations, vec![5, 15, 25, 35, 45]);
    }

    #[test]
    fn cupti_zones_measure_no_event_bias_and_are_never_corrected() {
        let fake = FakeCupti::install();
        let (gpu, sink, trace) = traced(&fake);
        assert_eq!(
            gpu.bias_measurements(),
            0,
            "nothing timed by events to correct"
        );
        let stats = trace.stats();
        assert_eq!(
            (stats.event_bias_stream, stats.event_bias_graph),
            (None, None)
        );
        assert_eq!(stats.event_bias_failures, 0);
        gpu.set_event_bias(cuhal_command::EventPlacement::Graph, Some(3_000));
        let list = trace.zone_list().unwrap();
        let (begin, end) = record(&list, &["k"]);
        list.will_issue();
        let k = fake.launch(cbid::LAUNCH_KERNEL);
        drop(list.on_submit());
        gpu.complete_at(begin, 2_000_000);
        gpu.complete_at(end, 2_100_000);
        fake.complete_kernel(k, to_cupti(2_010_000), to_cupti(2_050_000), 0);
        trace.collect();
        let k = sink.zones().into_iter().find(|z| z.name == "k").unwrap();
        assert_eq!(
            (k.begin_ns, k.end_ns),
            (2_010_000, 2_050_000),
            "as CUPTI's record"
        );
        assert_eq!(trace.stats().bias_corrected_zones, 0);
    }

    #[test]
    fn without_cupti_fine_falls_back_to_events_and_says_why() {
        let fake = FakeCupti::install();
        fake.take_subscriber();
        let trace = open(fine(api(&fake, false))).unwrap();
        let stats = trace.stats();
        assert_eq!(stats.fine_source, FineSource::Events);
        assert_eq!(
            stats.cupti_unavailable,
            Some("subscriber taken by another profiler")
        );
        // Commands are timed by events again.
        let list = trace.zone_list().unwrap();
        let timing = list.command_zone("k", cuhal_command::EventPlacement::Graph);
        assert!(!timing.by_activity);
        assert!(timing.begin.is_some() && timing.end.is_some());

        let trace = open(fine(missing_library(false))).unwrap();
        assert_eq!(trace.stats().cupti_unavailable, Some("library not found"));
        // COARSE never asks for CUPTI.
        let trace = open(TraceConfig::new(Verbosity::Coarse, "q")).unwrap();
        assert_eq!(trace.stats().fine_source, FineSource::None);
        assert_eq!(trace.stats().cupti_unavailable, None);
    }

    #[test]
    fn asking_for_cupti_explicitly_is_a_typed_error_naming_the_reason() {
        let fake = FakeCupti::install();
        fake.take_subscriber();
        let err = open(fine(api(&fake, true))).unwrap_err();
        assert!(
            matches!(err, Error::Cupti(super::super::CuptiError::SubscriberTaken)),
            "{err:?}"
        );
        let err = open(fine(missing_library(true))).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Cupti(super::super::CuptiError::LibraryNotFound { .. })
            ),
            "{err:?}"
        );
    }
}
