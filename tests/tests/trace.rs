//! GPU suite: tracing. Zones around kernels of known length measure that length; zones on one
//! stream are ordered and nested; streams, graphs and command buffers all produce zones; a small
//! pool carries many zones; nothing is collected before its work completed; timestamps land
//! where the host saw the work happen.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cuhal_command::{Dispatch, Executable, KernelArgs};
use cuhal_gpu_tests::command_support::Kind;
use cuhal_gpu_tests::gpu::Gpu;
use cuhal_gpu_tests::trace_support::{
    Graph, SPIN_NAME, SPIN_PTX, Spin, TraceStream, trace_stream, traced,
};
use cuhal_trace::{DropReason, MemoryZone, PoolLimits, Verbosity, clock};

const US: u64 = 1_000;

fn big_pool() -> PoolLimits {
    PoolLimits::default()
}

/// Zones named `name`.
fn named<'a>(zones: &'a [MemoryZone], name: &str) -> Vec<&'a MemoryZone> {
    zones.iter().filter(|z| z.name == name).collect()
}

/// The shortest of 9 zones around one launch of the spin kernel for `ns` (noise, such as the
/// GPU being slow to start the kernel, only ever adds time), and all 9.
fn shortest_zone_around_spin(
    trace: &cuhal_trace::TraceContext,
    sink: &cuhal_trace::MemorySink,
    stream: &TraceStream,
    spin: &Spin,
    ns: u64,
) -> (u64, Vec<u64>) {
    let mut durations = Vec::new();
    for _ in 0..9 {
        sink.clear();
        let list = trace.zone_list().unwrap();
        // SAFETY: `stream` is a live stream of the context.
        unsafe { list.begin_on_stream(stream.raw(), "spin").unwrap() };
        spin.launch(stream, ns).unwrap();
        // SAFETY: as above.
        unsafe { list.end_on_stream(stream.raw()).unwrap() };
        let collector = list.on_submit().unwrap();
        stream.synchronize().unwrap();
        collector();
        let zones = sink.zones();
        assert_eq!(zones.len(), 1, "{zones:?}");
        durations.push(zones[0].duration_ns());
    }
    let shortest = durations.iter().copied().min().unwrap_or(0);
    (shortest, durations)
}

fn median(values: &[u64]) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted[sorted.len() / 2]
}

/// A zone around one launch also holds the launch itself (the GPU starting and retiring the
/// kernel: 4 to 7 us on an H200), so the kernel's own length is the zone's duration minus that
/// of a zone around a launch that spins for 0 ns, measured in the same run. `timing_`: it checks
/// measured lengths to 10%, so `run --sanitize` (instrumented kernels) skips it.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn timing_a_zone_around_a_spin_kernel_measures_its_length() {
    let gpu = Gpu::open();
    let stream = trace_stream(gpu.context()).unwrap();
    let spin = Spin::load(gpu.context()).unwrap();
    let (trace, sink) = traced(gpu.context(), Verbosity::Coarse, big_pool());
    // Warm up: the first launch of a module pays for its upload.
    spin.launch(&stream, 10 * US).unwrap();
    stream.synchronize().unwrap();

    // Medians, not minima: one unusually quick launch in the 0 ns run would skew every
    // difference (seen on the H200: a 3.2 us minimum among launches of 4.3 to 6.1 us).
    let (_, all) = shortest_zone_around_spin(&trace, &sink, &stream, &spin, 0);
    let launch = median(&all);
    println!("zone around a 0 ns spin (the launch itself): median {launch} ns (all: {all:?})");
    let mut failures = Vec::new();
    for n in [10 * US, 100 * US, 1_000 * US] {
        let (shortest, all) = shortest_zone_around_spin(&trace, &sink, &stream, &spin, n);
        let d = median(&all);
        let kernel = d.saturating_sub(launch);
        println!("spin {n} ns: median zone {d} ns, minus the launch {kernel} ns (all: {all:?})");
        if shortest < n {
            failures.push(format!(
                "a zone around a {n} ns spin measured only {shortest} ns"
            ));
        }
        if kernel.abs_diff(n) * 10 > n {
            failures.push(format!(
                "a {n} ns spin measured {kernel} ns net of the launch ({d} ns gross): over 10% off"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn zones_on_one_stream_are_ordered_and_nested() {
    let gpu = Gpu::open();
    let stream = trace_stream(gpu.context()).unwrap();
    let spin = Spin::load(gpu.context()).unwrap();
    let (trace, sink) = traced(gpu.context(), Verbosity::Coarse, big_pool());
    let list = trace.zone_list().unwrap();
    let s = stream.raw();
    // SAFETY: `s` is a live stream of the context for the whole block.
    unsafe {
        list.begin_on_stream(s, "outer").unwrap();
        list.begin_on_stream(s, "a").unwrap();
        spin.launch(&stream, 20 * US).unwrap();
        list.end_on_stream(s).unwrap();
        list.begin_on_stream(s, "b").unwrap();
        spin.launch(&stream, 10 * US).unwrap();
        list.begin_on_stream(s, "b.inner").unwrap();
        spin.launch(&stream, 30 * US).unwrap();
        list.end_on_stream(s).unwrap();
        list.end_on_stream(s).unwrap();
        list.end_on_stream(s).unwrap();
    }
    let collector = list.on_submit().unwrap();
    stream.synchronize().unwrap();
    collector();
    let zones = sink.zones();
    let names: Vec<_> = zones.iter().map(|z| (z.name.as_str(), z.depth)).collect();
    assert_eq!(names, [("outer", 0), ("a", 1), ("b", 1), ("b.inner", 2)]);
    let (outer, a, b, inner) = (&zones[0], &zones[1], &zones[2], &zones[3]);
    for z in &zones {
        assert!(z.begin_ns <= z.end_ns, "{z:?}");
    }
    assert!(
        outer.begin_ns <= a.begin_ns && b.end_ns <= outer.end_ns,
        "{zones:?}"
    );
    assert!(a.end_ns <= b.begin_ns, "a before b: {zones:?}");
    assert!(
        b.begin_ns <= inner.begin_ns && inner.end_ns <= b.end_ns,
        "{zones:?}"
    );
    assert!(
        a.duration_ns() >= 20 * US && inner.duration_ns() >= 30 * US,
        "{zones:?}"
    );
    assert!(b.duration_ns() >= 40 * US, "{zones:?}");
}

/// `timing_`: a zone must also stay under 5 ms around a 50 us node, which an instrumented kernel
/// (`run --sanitize`) does not keep; graph zones' structure is checked under the sanitizer by
/// `graph_stream_and_deferred_command_buffers_produce_zones`.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn timing_graph_zones_wrap_their_nodes_on_every_launch() {
    let gpu = Gpu::open();
    let stream = trace_stream(gpu.context()).unwrap();
    let spin = Spin::load(gpu.context()).unwrap();
    let (trace, sink) = traced(gpu.context(), Verbosity::Coarse, big_pool());
    let list = trace.zone_list().unwrap();
    let mut graph = Graph::new(gpu.context()).unwrap();
    // SAFETY: `graph` is a live graph of the context and every node passed is one of its nodes.
    unsafe {
        let begin = list
            .begin_in_graph(graph.raw(), &[], "graph")
            .unwrap()
            .unwrap();
        let work = spin.add_node(&graph, &[begin], 50 * US).unwrap();
        list.end_in_graph(graph.raw(), &[work]).unwrap().unwrap();
    }
    graph.instantiate().unwrap();
    for launch in 0..3 {
        graph.launch(&stream).unwrap();
        let collector = list.on_submit().unwrap();
        stream.synchronize().unwrap();
        collector();
        let zones = named(&sink.zones(), "graph")
            .into_iter()
            .cloned()
            .collect::<Vec<_>>();
        assert_eq!(zones.len(), launch + 1, "{zones:?}");
        let z = zones.last().unwrap();
        assert!(z.duration_ns() >= 50 * US, "{z:?}");
        assert!(z.duration_ns() < 5_000 * US, "{z:?}");
        if launch > 0 {
            assert!(
                zones[launch - 1].end_ns <= z.begin_ns,
                "launches in order: {zones:?}"
            );
        }
    }
    assert_eq!(trace.stats().dropped.total(), 0);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn graph_stream_and_deferred_command_buffers_produce_zones() {
    let gpu = Gpu::open();
    let context = gpu.context();
    let stream = trace_stream(context).unwrap();
    let executable = Executable::load_ptx(context, SPIN_PTX).unwrap();
    let function = executable.function(SPIN_NAME).unwrap();
    let (trace, sink) = traced(context, Verbosity::Fine, big_pool());
    for kind in [Kind::Graph, Kind::Stream, Kind::Deferred] {
        sink.clear();
        let zones = trace.recorder();
        let mut cb = kind.create(context, &stream, zones.clone()).unwrap();
        let args = KernelArgs::new().with(40 * US).with(0u64);
        cb.begin_debug_group("group").unwrap();
        cb.dispatch(&Dispatch::new(&function, [1, 1, 1], [1, 1, 1], &args))
            .unwrap();
        cb.end_debug_group().unwrap();
        cb.end().unwrap();
        // SAFETY: `stream` is a live stream of `context` (the one a stream command buffer
        // recorded onto), and `cb` outlives the synchronize below.
        unsafe { cb.issue(stream.raw()).unwrap() };
        let collector = zones
            .as_ref()
            .and_then(|z| z.as_any())
            .and_then(|a| a.downcast_ref::<cuhal_trace::ZoneList>())
            .expect("the trace context's zone list")
            .on_submit()
            .expect("zones to collect");
        stream.synchronize().unwrap();
        collector();
        let zones = sink.zones();
        let kind = match kind {
            Kind::Graph => "graph",
            Kind::Stream => "stream",
            Kind::Deferred => "deferred",
        };
        println!("{kind}: {zones:?}");
        // Only a stream command buffer times itself whole: graph and deferred ones get their
        // whole zone from the queue's submission (its completion event), not issued here.
        let whole = named(&zones, &format!("{kind} command buffer"));
        let group = named(&zones, "group");
        let dispatch = named(&zones, SPIN_NAME);
        let wholes = usize::from(kind == "stream");
        assert_eq!(
            (whole.len(), group.len(), dispatch.len()),
            (wholes, 1, 1),
            "{kind}: {zones:?}"
        );
        let (group, dispatch) = (group[0], dispatch[0]);
        assert_eq!(
            (group.depth, dispatch.depth),
            (wholes, wholes + 1),
            "{kind}"
        );
        assert!(dispatch.duration_ns() >= 40 * US, "{kind}: {dispatch:?}");
        assert!(group.begin_ns <= dispatch.begin_ns, "{kind}");
        assert!(dispatch.end_ns <= group.end_ns, "{kind}");
        for whole in whole {
            assert!(whole.begin_ns <= group.begin_ns, "{kind}");
            assert!(group.end_ns <= whole.end_ns, "{kind}");
        }
        drop(cb);
    }
    let s = trace.stats();
    assert_eq!(
        s.events_created, s.events_free,
        "every command buffer gave its events back"
    );
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn a_hundred_thousand_zones_through_a_pool_of_a_thousand_events() {
    let gpu = Gpu::open();
    let stream = trace_stream(gpu.context()).unwrap();
    let limits = PoolLimits {
        initial: 0,
        grow_by: 100,
        max: 1_000,
    };
    let (trace, sink) = traced(gpu.context(), Verbosity::Coarse, limits);
    let mut in_flight = std::collections::VecDeque::new();
    let mut zones = 0u64;
    while zones < 100_000 {
        let list = trace.zone_list().unwrap();
        for _ in 0..100 {
            // SAFETY: `stream` is a live stream of the context.
            unsafe {
                assert!(list.begin_on_stream(stream.raw(), "z").unwrap());
                assert!(list.end_on_stream(stream.raw()).unwrap());
            }
        }
        zones += 100;
        let collector = list.on_submit().unwrap();
        in_flight.push_back((list, collector));
        // Four command buffers alive at once (800 events); the oldest completes first.
        if in_flight.len() == 4 {
            let (list, collector) = in_flight.pop_front().unwrap();
            stream.synchronize().unwrap();
            collector();
            drop(list);
            // Keep memory flat: the sink only needs to have counted them.
            sink.clear();
        }
    }
    stream.synchronize().unwrap();
    for (list, collector) in in_flight.drain(..) {
        collector();
        drop(list);
    }
    let s = trace.stats();
    println!("{s:?}");
    assert_eq!(s.zones_collected, 100_000);
    assert_eq!(s.dropped.total(), 0);
    assert!(s.events_created <= 1_000);
    assert_eq!(s.events_created, s.events_free, "no event leaked");
    assert_eq!(s.pending_submissions, 0);

    // Past the cap: zones are dropped and counted, never a crash.
    let list = trace.zone_list().unwrap();
    let mut timed = 0;
    for _ in 0..1_000 {
        // SAFETY: as above.
        if unsafe { list.begin_on_stream(stream.raw(), "over").unwrap() } {
            timed += 1;
        }
    }
    for _ in 0..1_000 {
        // SAFETY: as above.
        unsafe { list.end_on_stream(stream.raw()).unwrap() };
    }
    assert_eq!(timed, 500);
    let collector = list.on_submit().unwrap();
    stream.synchronize().unwrap();
    collector();
    assert_eq!(sink.zones().len(), 500);
    assert_eq!(sink.dropped(DropReason::PoolExhausted), 500);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn a_zone_whose_work_is_still_running_is_not_collected() {
    let gpu = Gpu::open();
    let stream = trace_stream(gpu.context()).unwrap();
    let spin = Spin::load(gpu.context()).unwrap();
    let (trace, sink) = traced(gpu.context(), Verbosity::Coarse, big_pool());
    let list = trace.zone_list().unwrap();
    // SAFETY: `stream` is a live stream of the context.
    unsafe { list.begin_on_stream(stream.raw(), "long").unwrap() };
    spin.launch(&stream, 300_000 * US).unwrap();
    // SAFETY: as above.
    unsafe { list.end_on_stream(stream.raw()).unwrap() };
    let collector = list.on_submit().unwrap();
    // Run the collector while the kernel still spins (it has 300 ms to go).
    collector();
    assert!(
        sink.zones().is_empty(),
        "collected before completion: {:?}",
        sink.zones()
    );
    assert_eq!(trace.stats().pending_submissions, 1);
    assert_eq!(trace.collect(), 0);
    stream.synchronize().unwrap();
    assert_eq!(trace.collect(), 1);
    let z = &sink.zones()[0];
    assert!(z.duration_ns() >= 300_000 * US, "{z:?}");
}

/// `timing_`: zone times must land within 50 us of the host's clock around the work, which an
/// instrumented driver (`run --sanitize`) does not keep.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn timing_zone_times_land_where_the_host_saw_the_work() {
    let gpu = Gpu::open();
    let stream = trace_stream(gpu.context()).unwrap();
    let spin = Spin::load(gpu.context()).unwrap();
    let (trace, sink) = traced(gpu.context(), Verbosity::Coarse, big_pool());
    spin.launch(&stream, US).unwrap();
    stream.synchronize().unwrap();
    for round in 0..3 {
        let list = trace.zone_list().unwrap();
        let before = clock::now_ns();
        // SAFETY: `stream` is a live stream of the context.
        unsafe { list.begin_on_stream(stream.raw(), "z").unwrap() };
        spin.launch(&stream, 2_000 * US).unwrap();
        // SAFETY: as above.
        unsafe { list.end_on_stream(stream.raw()).unwrap() };
        let collector = list.on_submit().unwrap();
        stream.synchronize().unwrap();
        let after = clock::now_ns();
        if round > 0 {
            // A base taken after the work: measured backwards from it (negative elapsed times).
            std::thread::sleep(Duration::from_millis(20));
            trace.recalibrate().unwrap();
        }
        collector();
        let z = sink.zones().pop().unwrap();
        let slack = 50 * US + trace.stats().calibration_uncertainty_ns;
        println!(
            "round {round}: host [{before}, {after}], zone [{}, {}], uncertainty {} ns",
            z.begin_ns,
            z.end_ns,
            trace.stats().calibration_uncertainty_ns
        );
        assert!(
            z.begin_ns + slack >= before,
            "zone began before it was enqueued: {z:?}"
        );
        assert!(
            z.end_ns <= after + slack,
            "zone ended after the host saw it end: {z:?}"
        );
        assert!(z.duration_ns() >= 2_000 * US);
    }
    assert!(trace.stats().calibrations >= 3);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn collection_from_the_completion_side_keeps_up_with_submissions() {
    // Collectors run on another thread, as the scheduler's completion thread runs them, while
    // this thread keeps recording and submitting.
    let gpu = Gpu::open();
    let stream = trace_stream(gpu.context()).unwrap();
    let spin = Spin::load(gpu.context()).unwrap();
    let (trace, sink) = traced(
        gpu.context(),
        Verbosity::Coarse,
        PoolLimits {
            initial: 0,
            grow_by: 16,
            max: 128,
        },
    );
    let (tx, rx) =
        std::sync::mpsc::channel::<(Box<dyn FnOnce() + Send>, Arc<cuhal_sys::PrimaryContext>)>();
    let completer = std::thread::spawn(move || {
        for (collector, context) in rx {
            context.bind().unwrap();
            collector();
        }
    });
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut submitted = 0u64;
    while submitted < 2_000 && Instant::now() < deadline {
        let list = trace.zone_list().unwrap();
        // SAFETY: `stream` is a live stream of the context.
        unsafe { list.begin_on_stream(stream.raw(), "s").unwrap() };
        spin.launch(&stream, 5 * US).unwrap();
        // SAFETY: as above.
        unsafe { list.end_on_stream(stream.raw()).unwrap() };
        if let Some(c) = list.on_submit() {
            tx.send((c, gpu.context().clone())).unwrap();
        }
        submitted += 1;
    }
    drop(tx);
    completer.join().unwrap();
    stream.synchronize().unwrap();
    trace.collect();
    let s = trace.stats();
    println!("{submitted} submissions: {s:?}");
    assert_eq!(s.zones_collected + s.dropped.total(), submitted);
    assert_eq!(s.zones_collected, sink.zones().len() as u64);
    assert_eq!(s.pending_submissions, 0);
    assert_eq!(s.events_created, s.events_free);
}
