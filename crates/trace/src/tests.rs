//! Tests of the whole pipeline (pool, lists, collection, sinks) on the fake device.

use std::sync::Arc;
use std::time::Duration;

use crate::fake::FakeGpu;
use crate::lock::locks_taken_on_this_thread;
use cuhal_sys::CUevent;

use crate::{DropReason, MemorySink, PoolLimits, TraceConfig, TraceContext, Verbosity, ZoneList};

const MS: u64 = 1_000_000;

/// A FINE tracing context with `pool` on a fresh fake GPU and memory sink.
fn traced(pool: PoolLimits) -> (Arc<FakeGpu>, Arc<MemorySink>, TraceContext) {
    let gpu = FakeGpu::new();
    let sink = Arc::new(MemorySink::new());
    let trace = context(&gpu, &sink, pool);
    (gpu, sink, trace)
}

/// A FINE tracing context with `pool` on `gpu`, writing to `sink`.
fn context(gpu: &Arc<FakeGpu>, sink: &Arc<MemorySink>, pool: PoolLimits) -> TraceContext {
    let config = TraceConfig {
        pool,
        ..TraceConfig::new(Verbosity::Fine, "queue 0")
    };
    TraceContext::with_backend(gpu.clone(), config, sink.clone()).unwrap()
}

/// Records a zone `name` in `list` and returns its begin and end events.
fn zone(list: &ZoneList, name: &str) -> (CUevent, CUevent) {
    (list.begin_zone(name).unwrap(), list.end_zone().unwrap())
}

/// Completes a zone's begin and end events at `begin_ns` and `end_ns`.
fn complete(gpu: &FakeGpu, (begin, end): (CUevent, CUevent), begin_ns: u64, end_ns: u64) {
    gpu.complete_at(begin, begin_ns);
    gpu.complete_at(end, end_ns);
}

/// The zones the sink holds, as name, begin and end.
fn shown(sink: &MemorySink) -> Vec<(String, u64, u64)> {
    sink.zones()
        .into_iter()
        .map(|z| (z.name, z.begin_ns, z.end_ns))
        .collect()
}

fn small_pool(max: usize) -> PoolLimits {
    PoolLimits {
        initial: 0,
        grow_by: 8,
        max,
    }
}

#[test]
fn off_records_nothing_and_takes_no_lock() {
    let gpu = FakeGpu::new();
    let sink = Arc::new(MemorySink::new());
    let locks_before = locks_taken_on_this_thread();
    let trace = TraceContext::with_backend(
        gpu.clone(),
        TraceConfig::new(Verbosity::Off, "off"),
        sink.clone(),
    )
    .unwrap();
    assert_eq!(trace.verbosity(), Verbosity::Off);
    assert!(trace.recorder().is_none());
    assert!(trace.zone_list().is_none());
    assert!(trace.collector().is_none());
    assert_eq!(trace.collect(), 0);
    trace.recalibrate().unwrap();
    assert_eq!(trace.stats(), Default::default());
    assert_eq!(trace.track(), None);
    drop(trace);
    assert_eq!(
        locks_taken_on_this_thread(),
        locks_before,
        "a lock was taken at Off"
    );
    assert_eq!(gpu.calls(), 0, "the device was touched at Off");
    assert!(sink.records().is_empty(), "the sink was touched at Off");
}

#[test]
fn the_lock_counter_sees_locks() {
    // The Off test relies on the counter; make sure it counts when tracing is on.
    let (_gpu, _sink, trace) = traced(PoolLimits::default());
    let before = locks_taken_on_this_thread();
    let list = trace.zone_list().unwrap();
    list.begin_zone("x");
    assert!(locks_taken_on_this_thread() > before);
}

#[test]
fn zones_get_the_times_their_events_completed_at() {
    let gpu = FakeGpu::new();
    let sink = Arc::new(MemorySink::new());
    gpu.set_now(7 * MS);
    let trace = context(&gpu, &sink, PoolLimits::default());
    let recorder = trace.recorder().unwrap();
    assert_eq!(recorder.verbosity(), Verbosity::Fine);
    let cb_begin = recorder.begin_zone("command buffer").unwrap();
    let d_begin = recorder.begin_zone("dispatch").unwrap();
    let d_end = recorder.end_zone().unwrap();
    let cb_end = recorder.end_zone().unwrap();
    assert!(recorder.end_zone().is_none(), "nothing left open");
    gpu.complete_at(cb_begin, 10 * MS);
    gpu.complete_at(d_begin, 10 * MS + 1_500);
    gpu.complete_at(d_end, 10 * MS + 41_500);
    gpu.complete_at(cb_end, 10 * MS + 42_000);
    let list = recorder
        .as_any()
        .and_then(|a| a.downcast_ref::<crate::ZoneList>())
        .expect("the context's recorder is a zone list");
    let collector = list.on_submit().unwrap();
    assert!(
        sink.zones().is_empty(),
        "nothing is collected before the collector runs"
    );
    collector();
    let zones: Vec<_> = sink
        .zones()
        .into_iter()
        .map(|z| (z.name, z.depth, z.begin_ns, z.end_ns))
        .collect();
    assert_eq!(
        zones,
        [
            ("command buffer".to_owned(), 0, 10 * MS, 10 * MS + 42_000),
            ("dispatch".to_owned(), 1, 10 * MS + 1_500, 10 * MS + 41_500),
        ]
    );
    let stats = trace.stats();
    assert_eq!(stats.zones_recorded, 2);
    assert_eq!(stats.zones_collected, 2);
    assert_eq!(stats.pending_submissions, 0);
    assert_eq!(stats.dropped.total(), 0);
}

#[test]
fn a_zone_still_running_is_not_collected_early() {
    let (gpu, sink, trace) = traced(PoolLimits::default());
    let list = trace.zone_list().unwrap();
    let b = list.begin_zone("long kernel").unwrap();
    let e = list.end_zone().unwrap();
    gpu.complete_at(b, 2 * MS);
    gpu.pend(e); // the kernel is still running
    let collector = list.on_submit().unwrap();
    collector();
    assert!(sink.zones().is_empty());
    assert_eq!(trace.stats().pending_submissions, 1);
    // A later collection (another submission's collector) picks it up once complete.
    assert_eq!(trace.collect(), 0);
    gpu.complete_at(e, 9 * MS);
    assert_eq!(trace.collect(), 1);
    let z = &sink.zones()[0];
    assert_eq!((z.begin_ns, z.end_ns), (2 * MS, 9 * MS));
    assert_eq!(trace.stats().pending_submissions, 0);
}

#[test]
fn a_not_ready_list_does_not_hold_back_later_ones() {
    let (gpu, sink, trace) = traced(PoolLimits::default());
    let first = trace.zone_list().unwrap();
    let (b1, e1) = (
        first.begin_zone("first").unwrap(),
        first.end_zone().unwrap(),
    );
    gpu.complete_at(b1, 2 * MS);
    gpu.pend(e1);
    let second = trace.zone_list().unwrap();
    let (b2, e2) = (
        second.begin_zone("second").unwrap(),
        second.end_zone().unwrap(),
    );
    gpu.complete_at(b2, 3 * MS);
    gpu.complete_at(e2, 4 * MS);
    let _first = first.on_submit().unwrap();
    second.on_submit().unwrap()();
    assert_eq!(sink.zones().len(), 1);
    assert_eq!(sink.zones()[0].name, "second");
    gpu.complete_at(e1, 5 * MS);
    trace.collect();
    assert_eq!(sink.zones().len(), 2);
}

#[test]
fn exhaustion_drops_zones_counts_them_and_keeps_nesting() {
    // Four events: two zones.
    let (gpu, sink, trace) = traced(small_pool(4));
    let list = trace.zone_list().unwrap();
    let a = list.begin_zone("a").unwrap();
    let b = list.begin_zone("b").unwrap();
    assert!(list.begin_zone("c").is_none(), "the pool is exhausted");
    assert!(list.begin_zone("d").is_none());
    assert!(list.end_zone().is_none(), "d was dropped");
    assert!(list.end_zone().is_none(), "c was dropped");
    let b_end = list.end_zone().unwrap();
    assert!(list.begin_zone("e").is_none());
    assert!(list.end_zone().is_none());
    let a_end = list.end_zone().unwrap();
    for (i, e) in [a, b, b_end, a_end].into_iter().enumerate() {
        gpu.complete_at(e, (i as u64 + 1) * MS);
    }
    list.on_submit().unwrap()();
    let names: Vec<_> = sink
        .zones()
        .into_iter()
        .map(|z| (z.name, z.depth))
        .collect();
    assert_eq!(names, [("a".to_owned(), 0), ("b".to_owned(), 1)]);
    assert_eq!(trace.stats().dropped.get(DropReason::PoolExhausted), 3);
    assert_eq!(sink.dropped(DropReason::PoolExhausted), 3);
    assert_eq!(sink.open_zones(trace.track().unwrap()), 0);
    // The list still holds its events; dropping it gives them back.
    assert_eq!(trace.stats().events_free, 0);
    drop(list);
    let stats = trace.stats();
    assert_eq!((stats.events_created, stats.events_free), (4, 4));
    // ...and a new list can use them.
    let again = trace.zone_list().unwrap();
    assert!(again.begin_zone("again").is_some());
}

#[test]
fn events_return_to_the_pool_only_after_the_last_submission_is_collected() {
    let (gpu, sink, trace) = traced(small_pool(64));
    let list = trace.zone_list().unwrap();
    let b = list.begin_zone("z").unwrap();
    let e = list.end_zone().unwrap();
    gpu.complete_at(b, MS);
    gpu.pend(e);
    let collector = list.on_submit().unwrap();
    // The command buffer is dropped while its submission is in flight.
    drop(list);
    let s = trace.stats();
    assert_eq!(
        s.events_created - s.events_free,
        2,
        "events still owned by the submission"
    );
    collector();
    let s = trace.stats();
    assert_eq!(
        s.events_created - s.events_free,
        2,
        "not complete, still owned"
    );
    gpu.complete_at(e, 2 * MS);
    trace.collect();
    let s = trace.stats();
    assert_eq!(
        s.events_created, s.events_free,
        "back in the pool after collection"
    );
    assert_eq!(sink.zones().len(), 1);
}

#[test]
fn never_submitted_lists_are_counted_and_never_shown() {
    let (_gpu, sink, trace) = traced(PoolLimits::default());
    let list = trace.zone_list().unwrap();
    list.begin_zone("outer");
    list.begin_zone("inner");
    list.end_zone();
    // "outer" is left open, and the list is dropped unsubmitted.
    drop(list);
    trace.collect();
    assert_eq!(trace.stats().dropped.get(DropReason::NeverSubmitted), 2);
    assert_eq!(sink.dropped(DropReason::NeverSubmitted), 2);
    assert_eq!(sink.open_zones(trace.track().unwrap()), 0);
    assert!(sink.zones().is_empty());
    let s = trace.stats();
    assert_eq!(s.events_created, s.events_free);
}

#[test]
fn zones_left_open_at_submission_are_closed_at_the_lists_last_time() {
    let (gpu, sink, trace) = traced(PoolLimits::default());
    let list = trace.zone_list().unwrap();
    let a = list.begin_zone("never ended").unwrap();
    let b = list.begin_zone("inner").unwrap();
    let b_end = list.end_zone().unwrap();
    gpu.complete_at(a, MS);
    gpu.complete_at(b, 2 * MS);
    gpu.complete_at(b_end, 3 * MS);
    list.on_submit().unwrap()();
    assert_eq!(
        shown(&sink),
        [
            ("never ended".to_owned(), MS, 3 * MS),
            ("inner".to_owned(), 2 * MS, 3 * MS)
        ]
    );
    assert_eq!(sink.open_zones(trace.track().unwrap()), 0);
}

#[test]
fn a_calibration_that_fails_half_way_is_not_used() {
    let (gpu, sink, trace) = traced(PoolLimits::default());
    // The host-bracket calibration (the exchange's fallback) is the one failing here.
    gpu.fail_clock_exchange(true);
    let calibrations = trace.stats().calibrations;
    // The first candidate (possibly the current base) is re-recorded, the second fails.
    gpu.advance(3 * MS);
    gpu.fail_calibration_after(1);
    assert!(trace.recalibrate().is_err());
    // A zone collected now must come from a fresh calibration, not the broken one.
    let list = trace.zone_list().unwrap();
    let b = list.begin_zone("after").unwrap();
    let e = list.end_zone().unwrap();
    gpu.advance(MS);
    let start = gpu.now();
    gpu.complete_at(b, start);
    gpu.complete_at(e, start + 40_000);
    list.on_submit().unwrap()();
    assert_eq!(
        trace.stats().calibrations,
        calibrations + 1,
        "calibrated again"
    );
    let zones = sink.zones();
    assert_eq!(zones.len(), 1);
    assert_eq!(zones[0].duration_ns(), 40_000);
    let error = zones[0].begin_ns.abs_diff(start);
    assert!(
        error <= 1_000,
        "begin {} vs device time {start}",
        zones[0].begin_ns
    );
}

#[test]
fn a_relaunch_announced_before_it_re_records_is_never_reported_twice() {
    let (gpu, sink, trace) = traced(PoolLimits::default());
    let list = trace.zone_list().unwrap();
    let graph = zone(&list, "graph");
    complete(&gpu, graph, MS, 2 * MS);
    let first = list.on_submit().unwrap();
    // The queue announces the second launch, which then re-records (and here completes) the
    // events before the first submission's collection runs.
    list.will_issue();
    complete(&gpu, graph, 5 * MS, 7 * MS);
    first(); // between the launch and its on_submit: must not report the new times as the first's
    let second = list.on_submit().unwrap();
    second();
    assert_eq!(
        shown(&sink),
        [("graph".to_owned(), 5 * MS, 7 * MS)],
        "the second launch's times, once"
    );
    assert_eq!(trace.stats().dropped.get(DropReason::Superseded), 1);
}

#[test]
fn a_resubmission_before_collection_supersedes_the_earlier_one() {
    let (gpu, sink, trace) = traced(PoolLimits::default());
    let list = trace.zone_list().unwrap();
    let graph = zone(&list, "graph");
    // First launch.
    complete(&gpu, graph, MS, 2 * MS);
    let first = list.on_submit().unwrap();
    // Second launch re-records the same events before the first is collected.
    complete(&gpu, graph, 5 * MS, 7 * MS);
    let second = list.on_submit().unwrap();
    first();
    second();
    assert_eq!(
        shown(&sink),
        [("graph".to_owned(), 5 * MS, 7 * MS)],
        "shown once, with the times the events hold"
    );
    assert_eq!(trace.stats().dropped.get(DropReason::Superseded), 1);
    // A third launch after collection is shown normally.
    complete(&gpu, graph, 8 * MS, 9 * MS);
    list.on_submit().unwrap()();
    assert_eq!(sink.zones().len(), 2);
}

#[test]
fn collection_rebases_a_stale_calibration() {
    let gpu = FakeGpu::new();
    let sink = Arc::new(MemorySink::new());
    let config = TraceConfig {
        rebase_after: Duration::from_secs(1),
        ..TraceConfig::new(Verbosity::Coarse, "q")
    };
    let trace = TraceContext::with_backend(gpu.clone(), config, sink.clone()).unwrap();
    assert_eq!(trace.stats().calibrations, 1);
    let zone = |at: u64| {
        let list = trace.zone_list().unwrap();
        complete(&gpu, zone(&list, "z"), at, at + 1_000);
        list.on_submit().unwrap()();
    };
    gpu.advance(500 * MS);
    zone(gpu.now() - 100);
    assert_eq!(trace.stats().calibrations, 1, "fresh enough");
    gpu.advance(3_000 * MS);
    zone(gpu.now() - 100);
    assert_eq!(trace.stats().calibrations, 2, "re-based after 1 s");
    // Times stay right across the re-base.
    let z = sink.zones();
    assert_eq!(z[1].begin_ns, 3_501 * MS - 100);
    assert_eq!(z[1].duration_ns(), 1_000);
}

#[test]
fn a_hundred_thousand_zones_through_a_pool_of_a_thousand_events() {
    let (gpu, sink, trace) = traced(PoolLimits {
        initial: 0,
        grow_by: 100,
        max: 1_000,
    });
    let mut in_flight = std::collections::VecDeque::new();
    let mut zones = 0u64;
    let mut t = 10 * MS;
    while zones < 100_000 {
        let list = trace.zone_list().unwrap();
        for _ in 0..100 {
            complete(&gpu, zone(&list, "z"), t, t + 10);
            t += 20;
        }
        zones += 100;
        let collector = list.on_submit().unwrap();
        in_flight.push_back((list, collector));
        // Up to four command buffers alive at once: 800 events.
        if in_flight.len() == 4 {
            let (list, collector) = in_flight.pop_front().unwrap();
            collector();
            drop(list);
        }
    }
    for (list, collector) in in_flight.drain(..) {
        collector();
        drop(list);
    }
    let s = trace.stats();
    assert_eq!(s.zones_collected, 100_000);
    assert_eq!(s.dropped.total(), 0);
    assert!(s.events_created <= 1_000, "{}", s.events_created);
    assert_eq!(s.events_created, s.events_free, "no event leaked");
    assert_eq!(
        gpu.live_events(),
        s.events_created + 3,
        "the pool's events and the three base candidates"
    );
    drop(trace);
    drop(sink);
    assert_eq!(gpu.live_events(), 0, "everything destroyed");
}

#[test]
fn dropping_the_context_abandons_what_is_still_running_and_frees_everything() {
    let (gpu, sink, trace) = traced(PoolLimits::default());
    let list = trace.zone_list().unwrap();
    list.begin_zone("running").unwrap();
    let e = list.end_zone().unwrap();
    gpu.pend(e);
    let collector = list.on_submit().unwrap();
    drop(trace);
    assert_eq!(sink.dropped(DropReason::Abandoned), 1);
    // A late collector or submission is harmless.
    collector();
    assert!(list.on_submit().is_none());
    drop(list);
    assert_eq!(gpu.live_events(), 0);
}

#[test]
fn stream_and_graph_helpers_record_through_the_backend() {
    let (gpu, sink, trace) = traced(PoolLimits::default());
    let list = trace.zone_list().unwrap();
    gpu.set_now(20 * MS);
    // SAFETY: the fake device accepts any stream and graph handle.
    unsafe {
        assert!(
            list.begin_on_stream(std::ptr::null_mut(), "submission")
                .unwrap()
        );
        gpu.set_now(21 * MS);
        let node = list
            .begin_in_graph(std::ptr::null_mut(), &[], "graph zone")
            .unwrap();
        assert!(node.is_some());
        gpu.set_now(22 * MS);
        list.end_in_graph(std::ptr::null_mut(), &[node.unwrap()])
            .unwrap();
        gpu.set_now(23 * MS);
        assert!(list.end_on_stream(std::ptr::null_mut()).unwrap());
    }
    list.on_submit().unwrap()();
    assert_eq!(
        shown(&sink),
        [
            ("submission".to_owned(), 20 * MS, 23 * MS),
            ("graph zone".to_owned(), 21 * MS, 22 * MS)
        ]
    );
}

#[test]
fn recording_and_collecting_from_many_threads() {
    let (gpu, sink, trace) = traced(PoolLimits {
        initial: 0,
        grow_by: 16,
        max: 256,
    });
    let trace = Arc::new(trace);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let trace = trace.clone();
            let gpu = gpu.clone();
            std::thread::spawn(move || {
                for _ in 0..200 {
                    let list = trace.zone_list().unwrap();
                    for _ in 0..5 {
                        if let Some(b) = list.begin_zone("z") {
                            gpu.complete_at(b, gpu.now());
                        }
                        if let Some(e) = list.end_zone() {
                            gpu.complete_at(e, gpu.now() + 5);
                        }
                    }
                    if let Some(c) = list.on_submit() {
                        c();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    trace.collect();
    let s = trace.stats();
    assert_eq!(s.zones_collected + s.dropped.total(), 4 * 200 * 5);
    assert_eq!(s.zones_collected, sink.zones().len() as u64);
    assert_eq!(s.events_created, s.events_free);
    assert_eq!(s.pending_submissions, 0);
}

#[test]
fn concurrent_zones_are_timed_only_once_every_event_completed() {
    // Two zones of a graph between the same barriers: the second's end (recorded last) can
    // complete while the first still runs. No time is asked of an event not complete yet (the
    // driver's CUDA_ERROR_NOT_READY, an API error to compute-sanitizer), and the list is shown
    // once it is.
    let (gpu, sink, trace) = traced(PoolLimits::default());
    let list = trace.zone_list().unwrap();
    let (b1, e1) = zone(&list, "a");
    complete(&gpu, zone(&list, "b"), 2 * MS, 3 * MS);
    gpu.complete_at(b1, 2 * MS);
    gpu.pend(e1);
    list.on_submit().unwrap()();
    assert!(sink.zones().is_empty());
    assert_eq!(trace.stats().pending_submissions, 1);
    assert_eq!(gpu.elapsed_not_ready(), 0, "a time was asked too early");
    gpu.complete_at(e1, 5 * MS);
    assert_eq!(trace.collect(), 2);
    assert_eq!(
        shown(&sink),
        [
            ("a".to_owned(), 2 * MS, 5 * MS),
            ("b".to_owned(), 2 * MS, 3 * MS)
        ]
    );
    assert_eq!(gpu.elapsed_not_ready(), 0);
    assert_eq!(trace.stats().dropped.total(), 0);
}

/// A queue submission the completion side said completed is collected without a query of its
/// completion event (one `elapsed_ms` times it); a collection of what is known complete passes
/// over a later one without a backend call; a full collection queries that one first.
#[test]
fn submissions_known_complete_are_collected_without_a_query() {
    use crate::{EventBackend, IssueStep, StreamBefore, SubmissionInfo};
    let gpu = FakeGpu::new();
    let sink = Arc::new(MemorySink::new());
    let config = TraceConfig::new(Verbosity::Coarse, "queue 0");
    let trace = TraceContext::with_backend(gpu.clone(), config, sink.clone()).unwrap();
    let stream = std::ptr::NonNull::<u8>::dangling().as_ptr().cast();
    let info = SubmissionInfo::new([], []);
    let events = [gpu.create_event().unwrap(), gpu.create_event().unwrap()];
    let tickets = events.map(|completion| {
        // SAFETY: the fake backend made the completion event and lives past the collections;
        // the stream is never used by the fake.
        unsafe {
            trace.submit::<crate::Error>(
                stream,
                &info,
                &[],
                StreamBefore::Traced,
                completion,
                |step| {
                    assert_eq!(step, IssueStep::Completion);
                    gpu.pend(completion);
                    Ok(())
                },
            )
        }
        .unwrap()
        .expect("a traced context gives a ticket")
    });
    assert!(tickets[0] < tickets[1]);
    gpu.complete_at(events[0], 5 * MS);

    let calls = gpu.calls();
    trace.completed(tickets[0]);
    assert_eq!(trace.collect_completed(), 1, "the first submission's zone");
    assert_eq!(gpu.calls() - calls, 1, "one elapsed_ms, no query");

    let calls = gpu.calls();
    assert_eq!(trace.collect_completed(), 0);
    assert_eq!(gpu.calls() - calls, 0, "the running one is not looked at");
    assert_eq!(trace.collect(), 0, "still running");
    assert_eq!(gpu.calls() - calls, 1, "a full collection queries it");

    gpu.complete_at(events[1], 7 * MS);
    assert_eq!(trace.collect(), 1);
    assert_eq!(gpu.elapsed_not_ready(), 0);
    let ends: Vec<u64> = sink.zones().iter().map(|z| z.end_ns).collect();
    assert_eq!(ends, [5 * MS, 7 * MS]);
    drop(trace);
    for event in events {
        // SAFETY: made by this backend, destroyed once.
        unsafe { gpu.destroy_event(event) };
    }
}

/// A FINE context timing commands by events (no CUPTI) on `gpu`, writing to `sink`.
fn fine_by_events(gpu: &Arc<FakeGpu>, sink: &Arc<MemorySink>) -> TraceContext {
    let config = TraceConfig {
        cupti: crate::CuptiChoice::Off,
        ..TraceConfig::new(Verbosity::Fine, "queue 0")
    };
    TraceContext::with_backend(gpu.clone(), config, sink.clone()).unwrap()
}

/// Records a command zone timed by events at `placement` and returns its events.
fn command(list: &ZoneList, name: &str, placement: EventPlacement) -> (CUevent, CUevent) {
    let timing = list.command_events(name, placement);
    assert!(!timing.by_activity);
    (timing.begin.unwrap(), timing.end.unwrap())
}

use cuhal_command::EventPlacement;

#[test]
fn event_command_zones_lose_the_bias_measured_for_their_placement_once() {
    let gpu = FakeGpu::new();
    gpu.set_event_bias(EventPlacement::Stream, Some(3_000));
    gpu.set_event_bias(EventPlacement::Graph, Some(1_000));
    let sink = Arc::new(MemorySink::new());
    let trace = fine_by_events(&gpu, &sink);
    assert_eq!(gpu.bias_measurements(), 2, "one measurement per placement");
    let stats = trace.stats();
    assert_eq!(stats.fine_source, crate::FineSource::Events);
    let stream = stats.event_bias_stream.expect("measured");
    let graph = stats.event_bias_graph.expect("measured");
    assert_eq!(
        (stream.median_ns, stream.p95_ns, stream.max_ns),
        (3_000, 3_000, 3_000)
    );
    assert_eq!(stream.trials as usize, crate::BIAS_TRIALS);
    assert_eq!(graph.median_ns, 1_000);
    assert_eq!(stats.event_bias_failures, 0);

    let list = trace.zone_list().unwrap();
    let group = list.begin_zone("group").unwrap();
    let s = command(&list, "s", EventPlacement::Stream);
    let g = command(&list, "g", EventPlacement::Graph);
    let group_end = list.end_zone().unwrap();
    // Two issues of the same list: each one's times are read from its events and corrected once.
    for (issue, at) in [(0, 2 * MS), (1, 3 * MS)] {
        list.will_issue();
        gpu.complete_at(group, at);
        complete(&gpu, s, at + 10_000, at + 20_000);
        // Shorter than the bias: corrected to zero length, never negative.
        complete(&gpu, g, at + 30_000, at + 30_600);
        gpu.complete_at(group_end, at + 40_000);
        let collector = list.on_submit().unwrap();
        collector();
        let zones = shown(&sink);
        assert_eq!(zones.len(), 3 * (issue + 1), "{zones:?}");
        assert_eq!(
            zones[3 * issue..],
            [
                // Not a command's zone: as its events read.
                ("group".to_owned(), at, at + 40_000),
                // 10 us less 3 us, half from each side.
                ("s".to_owned(), at + 11_500, at + 18_500),
                ("g".to_owned(), at + 30_300, at + 30_300),
            ],
            "issue {issue}"
        );
        assert_eq!(trace.stats().bias_corrected_zones, 2 * (issue as u64 + 1));
    }
    // Collecting again shows nothing more and corrects nothing more.
    assert_eq!(trace.collect(), 0);
    assert_eq!(trace.stats().bias_corrected_zones, 4);
}

#[test]
fn a_failed_bias_measurement_leaves_its_placement_uncorrected_and_is_counted() {
    let gpu = FakeGpu::new();
    gpu.set_event_bias(EventPlacement::Stream, None);
    gpu.set_event_bias(EventPlacement::Graph, Some(500));
    let sink = Arc::new(MemorySink::new());
    let trace = fine_by_events(&gpu, &sink);
    let stats = trace.stats();
    assert_eq!(stats.event_bias_failures, 1);
    assert_eq!(stats.event_bias_stream, None);
    assert_eq!(stats.event_bias_graph.map(|b| b.median_ns), Some(500));

    let list = trace.zone_list().unwrap();
    let s = command(&list, "s", EventPlacement::Stream);
    let g = command(&list, "g", EventPlacement::Graph);
    complete(&gpu, s, 2 * MS, 2 * MS + 10_000);
    complete(&gpu, g, 2 * MS + 20_000, 2 * MS + 30_000);
    list.on_submit().unwrap()();
    assert_eq!(
        shown(&sink),
        [
            ("s".to_owned(), 2 * MS, 2 * MS + 10_000),
            ("g".to_owned(), 2 * MS + 20_250, 2 * MS + 29_750),
        ]
    );
    assert_eq!(trace.stats().bias_corrected_zones, 1);
}

#[test]
fn kernels_that_leave_no_stamps_fail_the_measurement() {
    use crate::{EventBias, StampedKernel};
    let ran = StampedKernel {
        zone_ns: 7_000,
        span_ns: 5_000,
    };
    let no_stamps = StampedKernel {
        zone_ns: 7_000,
        span_ns: 0,
    };
    let half = crate::BIAS_TRIALS / 2;
    let mut samples = vec![no_stamps; crate::BIAS_TRIALS];
    assert_eq!(EventBias::from_samples(&samples), None, "no kernel ran");
    samples[..half - 1].fill(ran);
    assert_eq!(
        EventBias::from_samples(&samples),
        None,
        "fewer than half ran"
    );
    samples[half - 1] = ran;
    let bias = EventBias::from_samples(&samples).expect("half ran");
    assert_eq!((bias.median_ns, bias.trials as usize), (2_000, half));
    // A zone shorter than its kernel's span (timer steps) counts as no bias, never negative.
    samples.fill(StampedKernel {
        zone_ns: 4_900,
        span_ns: 5_000,
    });
    assert_eq!(EventBias::from_samples(&samples).map(|b| b.max_ns), Some(0));
}

#[test]
fn coarse_zones_are_never_corrected_and_measure_nothing() {
    let gpu = FakeGpu::new();
    gpu.set_event_bias(EventPlacement::Stream, Some(3_000));
    let sink = Arc::new(MemorySink::new());
    let trace = TraceContext::with_backend(
        gpu.clone(),
        TraceConfig::new(Verbosity::Coarse, "queue 0"),
        sink.clone(),
    )
    .unwrap();
    assert_eq!(gpu.bias_measurements(), 0);
    let stats = trace.stats();
    assert_eq!(
        (stats.event_bias_stream, stats.event_bias_graph),
        (None, None)
    );
    assert_eq!(stats.event_bias_failures, 0);
    let list = trace.zone_list().unwrap();
    let z = zone(&list, "group");
    complete(&gpu, z, 2 * MS, 2 * MS + 10_000);
    list.on_submit().unwrap()();
    assert_eq!(
        shown(&sink),
        [("group".to_owned(), 2 * MS, 2 * MS + 10_000)]
    );
    assert_eq!(trace.stats().bias_corrected_zones, 0);
}

/// Issuing a command buffer again before its previous submission was collected reads the
/// previous submission's event times first, under the collector's lock, so the new issue does
/// not overwrite them; a list timed only by stamps has no such times (each submission's stamps
/// have a region of their own), so its issue must not wait for a collection in progress (which
/// may be reading a stamp region back from the device).
#[test]
fn reissuing_a_list_timed_only_by_stamps_never_waits_for_the_collector() {
    use crate::{EventBackend, IssueStep, StreamBefore, SubmissionInfo};
    use cuhal_command::{CommandBuffer, DeferredCommandBuffer};

    let (gpu, _sink, trace) = traced(PoolLimits::default());
    let recorder = trace.recorder().unwrap();
    assert_eq!(recorder.stamp_zone("kernel"), Some(0));
    let cb: Arc<dyn CommandBuffer> = Arc::new(
        DeferredCommandBuffer::new(Some(recorder))
            .unwrap()
            .end()
            .unwrap(),
    );
    let info = SubmissionInfo::new([], []);
    let completions = [gpu.create_event().unwrap(), gpu.create_event().unwrap()];
    // Handles cross to the issuing thread as addresses.
    let handles = completions.map(|event| event as usize);
    let submit = |completion: usize| {
        let completion = completion as CUevent;
        let stream = std::ptr::NonNull::<u8>::dangling().as_ptr().cast();
        // SAFETY: the fake backend made the completion event, which lives past the
        // collections; the stream is never used by the fake.
        unsafe {
            trace.submit::<crate::Error>(
                stream,
                &info,
                std::slice::from_ref(&cb),
                StreamBefore::Traced,
                completion,
                |step| {
                    if step == IssueStep::Completion {
                        gpu.pend(completion);
                    }
                    Ok(())
                },
            )
        }
        .unwrap()
        .expect("a traced context gives a ticket")
    };
    let first = submit(handles[0]);
    gpu.complete_at(completions[0], 5 * MS);
    // The first submission completed and is not collected yet; a collection holds the lock.
    let shared = trace.shared().unwrap().clone();
    let collecting = crate::lock::lock(&shared.collect);
    let (done, issued) = std::sync::mpsc::channel();
    let second = std::thread::scope(|scope| {
        let issuer = scope.spawn(|| {
            let ticket = submit(handles[1]);
            let _ = done.send(());
            ticket
        });
        let waited = issued.recv_timeout(Duration::from_secs(5));
        drop(collecting);
        let ticket = issuer.join().unwrap();
        assert!(
            waited.is_ok(),
            "the second issue waited for the collector's lock"
        );
        ticket
    });
    gpu.complete_at(completions[1], 7 * MS);
    trace.completed(first);
    trace.completed(second);
    trace.collect_completed();
    assert_eq!(trace.stats().stamp_regions_in_use, 0);
    drop(trace);
    for event in completions {
        // SAFETY: made by this backend, destroyed once, after the context that used them.
        unsafe { gpu.destroy_event(event) };
    }
}

/// A context dropped while collectors it handed out run on another thread still gives up
/// everything that was running: none of it is put back after the drain by a collection that
/// took the queue first, so each running submission is counted abandoned exactly once (and its
/// stamp regions, if any, are kept from being freed under its work). A stress test: the
/// collectors run in a loop across the drop, many times.
#[test]
fn a_context_dropped_under_running_collectors_abandons_what_runs_exactly_once() {
    for round in 0..1_000 {
        let (gpu, sink, trace) = traced(PoolLimits::default());
        let list = trace.zone_list().unwrap();
        list.begin_zone("running").unwrap();
        let end = list.end_zone().unwrap();
        gpu.pend(end);
        let first = list.on_submit().unwrap();
        let collectors: Vec<_> = (0..64).map(|_| trace.collector().unwrap()).collect();
        let start = std::sync::Barrier::new(2);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                start.wait();
                for collect in collectors {
                    collect();
                }
            });
            start.wait();
            drop(trace);
        });
        first();
        assert_eq!(
            sink.dropped(DropReason::Abandoned),
            1,
            "round {round}: the running zone is abandoned once"
        );
        drop(list);
        assert_eq!(gpu.live_events(), 0, "round {round}");
    }
}

/// Two threads issuing on one context at once, each re-issuing command buffers the other's
/// submission holds uncollected, never deadlock: a re-issue reads the earlier submission's
/// times under the collector's lock, and a slot that another thread is still issuing into is
/// not waited for there (that thread may be waiting for the collector's lock itself).
#[test]
fn concurrent_issues_that_reissue_each_others_command_buffers_never_deadlock() {
    use crate::{EventBackend, IssueStep, StreamBefore, SubmissionInfo};
    use cuhal_command::{CommandBuffer, DeferredCommandBuffer};
    use std::sync::mpsc;

    let (gpu, _sink, trace) = traced(PoolLimits::default());
    let trace = Arc::new(trace);
    // Three command buffers, each with a zone timed by events.
    let cbs: Vec<Arc<dyn CommandBuffer>> = ["l", "m", "n"]
        .iter()
        .map(|name| {
            let recorder = trace.recorder().unwrap();
            recorder.begin_zone(name).unwrap();
            recorder.end_zone().unwrap();
            Arc::new(
                DeferredCommandBuffer::new(Some(recorder))
                    .unwrap()
                    .end()
                    .unwrap(),
            ) as Arc<dyn CommandBuffer>
        })
        .collect();
    let completions: Vec<usize> = (0..3)
        .map(|_| gpu.create_event().unwrap() as usize)
        .collect();
    // Submits `cbs` with completion event `completion`; `on_issue` runs as each is issued.
    let submit = {
        let (trace, gpu) = (trace.clone(), gpu.clone());
        move |cbs: &[Arc<dyn CommandBuffer>], completion: usize, on_issue: &dyn Fn(usize)| {
            let completion = completion as CUevent;
            let stream = std::ptr::NonNull::<u8>::dangling().as_ptr().cast();
            // SAFETY: the fake backend made the completion event, which outlives the
            // context; the stream is never used by the fake.
            unsafe {
                trace.submit::<crate::Error>(
                    stream,
                    &SubmissionInfo::new([], []),
                    cbs,
                    StreamBefore::Traced,
                    completion,
                    |step| {
                        match step {
                            IssueStep::Completion => gpu.pend(completion),
                            IssueStep::CommandBuffer(i) => on_issue(i),
                            IssueStep::StampedCommandBuffer { .. } => {}
                        }
                        Ok(())
                    },
                )
            }
            .unwrap()
            .unwrap();
        }
    };
    let submit = Arc::new(submit);
    // All three submitted once, never completed: each is uncollected when issued again.
    submit(&cbs, completions[0], &|_| {});
    let (done, finished) = mpsc::channel();
    let (in_m, b_in_m) = mpsc::channel();
    // B issues all three again; while it issues the second (holding its slot, with the first
    // queued in that slot), A re-issues the first, then B goes on to the third (whose earlier
    // submission it reads under the collector's lock).
    let b = {
        let (submit, cbs, done) = (submit.clone(), cbs.clone(), done.clone());
        let completion = completions[1];
        std::thread::spawn(move || {
            submit(&cbs, completion, &|i| {
                if i == 1 {
                    in_m.send(()).unwrap();
                    std::thread::sleep(Duration::from_millis(200));
                }
            });
            let _ = done.send("b");
        })
    };
    b_in_m.recv_timeout(Duration::from_secs(5)).unwrap();
    let a = {
        let (submit, first, done) = (submit.clone(), cbs[0].clone(), done.clone());
        let completion = completions[2];
        std::thread::spawn(move || {
            submit(std::slice::from_ref(&first), completion, &|_| {});
            let _ = done.send("a");
        })
    };
    for _ in 0..2 {
        finished
            .recv_timeout(Duration::from_secs(5))
            .expect("both issues finish (a deadlock holds them)");
    }
    a.join().unwrap();
    b.join().unwrap();
    drop(submit);
    drop(cbs);
    match Arc::try_unwrap(trace) {
        Ok(trace) => drop(trace),
        Err(_) => panic!("the context is still shared"),
    }
    for event in completions {
        // SAFETY: made by this backend, destroyed once, after the context that used them.
        unsafe { gpu.destroy_event(event as CUevent) };
    }
}
