//! Calibration through `%globaltimer` on the fake device: the exchange's round with the
//! smallest round trip places the zones, a failed exchange falls back to the host bracket and
//! is counted, a drifting GPU clock is corrected at re-calibration, and each calibration
//! reaches the sink as a clock snapshot.

use std::sync::Arc;

use crate::clock_sync::{ClockSource, ClockSync};
use crate::fake::FakeGpu;
use crate::{EXCHANGE_ROUNDS, MemorySink, PoolLimits, TraceConfig, TraceContext, Verbosity};

const MS: u64 = 1_000_000;

/// A `%globaltimer` offset of the kind the driver reports (nanoseconds since 1970), far beyond
/// what an `f64` holds to the nanosecond.
const EPOCH_GPU: i64 = 1_700_000_000_000_000_000;

/// Three rounds' legs (to the GPU, back to the host): the second has the smallest round trip
/// (1,000 ns) and is 200 ns longer on the way back, so its midpoint maps the GPU's reading
/// 100 ns late. Taking the first round would map it 1,450 ns early, the symmetric third exactly,
/// and an average of the three's midpoints 450 ns early.
const LEGS: [(u64, u64); 3] = [(3_000, 100), (400, 600), (2_000, 2_000)];

fn context(gpu: &Arc<FakeGpu>, sink: &Arc<MemorySink>) -> TraceContext {
    let config = TraceConfig {
        pool: PoolLimits::default(),
        ..TraceConfig::new(Verbosity::Fine, "queue 0")
    };
    TraceContext::with_backend(gpu.clone(), config, sink.clone()).unwrap()
}

/// Records one zone, completes it at `begin_ns` (host time) for 40 us, collects it and returns
/// its begin as shown (its length checked to within the drift a test may give the GPU clock).
fn zone_at(gpu: &FakeGpu, sink: &MemorySink, trace: &TraceContext, begin_ns: u64) -> u64 {
    let list = trace.zone_list().unwrap();
    let b = list.begin_zone("z").unwrap();
    let e = list.end_zone().unwrap();
    gpu.complete_at(b, begin_ns);
    gpu.complete_at(e, begin_ns + 40_000);
    list.on_submit().unwrap()();
    let z = sink.zones().pop().unwrap();
    assert!(z.duration_ns().abs_diff(40_000) <= 5, "{z:?}");
    z.begin_ns
}

#[test]
fn the_round_with_the_smallest_round_trip_places_the_zones() {
    let gpu = FakeGpu::new();
    gpu.set_gpu_clock(EPOCH_GPU, 0);
    gpu.set_exchange_legs(LEGS.to_vec());
    gpu.set_stamp_half_width(250);
    let sink = Arc::new(MemorySink::new());
    let start = gpu.now();
    let trace = context(&gpu, &sink);
    let stats = trace.stats();
    let sync = stats.clock_sync.expect("calibrated through %globaltimer");
    assert_eq!(
        sync,
        ClockSync {
            gpu_ns: gpu.gpu_time(start),
            host_ns: start + 100,
            uncertainty_ns: 500,
            round_trip_ns: 1_000,
            rounds: EXCHANGE_ROUNDS as u32,
            taken_at_ns: start + 2_000,
        }
    );
    assert_eq!(stats.calibrations, 1);
    assert_eq!(stats.clock_syncs, 1);
    assert_eq!(stats.clock_sync_failures, 0);
    // The exchange's half round trip plus half the base event's %globaltimer bracket.
    assert_eq!(stats.calibration_uncertainty_ns, 500 + 250);
    // A zone 2 ms later is shown where the chosen round puts it: 100 ns late.
    gpu.advance(2 * MS);
    let at = gpu.now();
    assert_eq!(zone_at(&gpu, &sink, &trace, at), at + 100);
    // A kernel's own %globaltimer stamp maps the same way.
    assert_eq!(sync.to_trace_ns(gpu.gpu_time(at)), at + 100);
}

#[test]
fn a_failed_exchange_falls_back_to_the_host_bracket_and_is_counted() {
    let gpu = FakeGpu::new();
    gpu.set_gpu_clock(EPOCH_GPU, 0);
    gpu.set_exchange_legs(LEGS.to_vec());
    gpu.fail_clock_exchange(true);
    let sink = Arc::new(MemorySink::new());
    let trace = context(&gpu, &sink);
    let stats = trace.stats();
    assert_eq!(stats.calibrations, 1, "the context was made all the same");
    assert_eq!((stats.clock_syncs, stats.clock_sync_failures), (0, 1));
    assert_eq!(stats.clock_sync, None);
    assert_eq!(
        stats.clock_sync_failure,
        Some("the exchange kernel did not answer in time")
    );
    // The host bracket (exact on the fake) places zones, whatever %globaltimer reads.
    gpu.advance(MS);
    let at = gpu.now();
    assert_eq!(zone_at(&gpu, &sink, &trace, at), at);
    // Once the exchange works again, the next calibration uses it.
    gpu.fail_clock_exchange(false);
    gpu.advance(MS);
    trace.recalibrate().unwrap();
    let stats = trace.stats();
    assert_eq!((stats.clock_syncs, stats.clock_sync_failures), (1, 1));
    assert!(stats.clock_sync.is_some());
    gpu.advance(MS);
    let at = gpu.now();
    assert_eq!(zone_at(&gpu, &sink, &trace, at), at + 100);
    let sources: Vec<bool> = sink
        .clock_snapshots()
        .iter()
        .map(|(_, s)| matches!(s.source, ClockSource::GlobalTimer(_)))
        .collect();
    assert_eq!(sources, [false, true]);
}

#[test]
fn base_events_stamped_half_way_fall_back_and_the_broken_base_is_not_used() {
    let gpu = FakeGpu::new();
    gpu.set_exchange_legs(LEGS.to_vec());
    let sink = Arc::new(MemorySink::new());
    let trace = context(&gpu, &sink);
    // The first base event is re-recorded (now, 5 ms on), the second fails: the fallback
    // re-records them all and calibrates from its bracket.
    gpu.advance(5 * MS);
    gpu.fail_event_stamps(true);
    trace.recalibrate().unwrap();
    let stats = trace.stats();
    assert_eq!((stats.calibrations, stats.clock_sync_failures), (2, 1));
    assert_eq!(stats.clock_sync, None);
    assert_eq!(stats.clock_sync_failure, Some("a driver call failed"));
    gpu.advance(MS);
    let at = gpu.now();
    assert_eq!(
        zone_at(&gpu, &sink, &trace, at),
        at,
        "the bracket's exact time"
    );
}

#[test]
fn a_drifting_gpu_clock_is_corrected_at_re_calibration() {
    // The GPU clock runs 50 ppm fast, from a 1970-based offset.
    let gpu = FakeGpu::new();
    gpu.set_gpu_clock(EPOCH_GPU, 50_000);
    let sink = Arc::new(MemorySink::new());
    let trace = context(&gpu, &sink); // calibrated at 1 ms
    assert_eq!(gpu.now(), MS);
    // 7.9 s on, still inside the 8 s re-base age: event times measured from the base drift
    // with the GPU clock, 50 ppm of 7.899 s = 395 us late.
    gpu.advance(7_899 * MS);
    let at = gpu.now();
    let drifted = zone_at(&gpu, &sink, &trace, at) - at;
    assert!(
        (394_000..=396_000).contains(&drifted),
        "drifted by {drifted} ns"
    );
    assert_eq!(trace.stats().calibrations, 1);
    // Past the re-base age, collection re-calibrates first: the new exchange corrects it.
    gpu.advance(200 * MS);
    let at = gpu.now();
    let error = zone_at(&gpu, &sink, &trace, at).abs_diff(at);
    assert!(error <= 1_000, "{error} ns off after re-calibrating");
    let stats = trace.stats();
    assert_eq!((stats.calibrations, stats.clock_syncs), (2, 2));
    // The first map, 8.099 s on, read 50 ppm of that late.
    assert_eq!(stats.clock_drift_ns, Some(404_950));
    let snapshots = sink.clock_snapshots();
    assert_eq!(snapshots.len(), 2);
    assert_eq!(snapshots[0].1.drift_ns, None);
    assert_eq!(snapshots[1].1.drift_ns, Some(404_950));
    assert_eq!(
        snapshots
            .iter()
            .map(|(_, s)| (s.calibration, s.taken_at_ns))
            .collect::<Vec<_>>(),
        [(1, MS), (2, 8_100 * MS)]
    );
}

#[test]
fn every_calibration_reaches_the_sink_as_a_snapshot() {
    let gpu = FakeGpu::new();
    gpu.set_exchange_legs(LEGS.to_vec());
    let sink = Arc::new(MemorySink::new());
    let trace = context(&gpu, &sink);
    gpu.advance(MS);
    trace.recalibrate().unwrap();
    let snapshots = sink.clock_snapshots();
    assert_eq!(snapshots.len(), 2);
    let (track, first) = snapshots[0];
    assert_eq!(Some(track), trace.track());
    assert_eq!(first.calibration, 1);
    assert_eq!(first.base_ns, MS + 100);
    assert_eq!(first.uncertainty_ns, 500);
    let ClockSource::GlobalTimer(sync) = first.source else {
        panic!("{first:?}");
    };
    assert_eq!((sync.host_ns, sync.uncertainty_ns), (MS + 100, 500));
    assert_eq!(snapshots[1].1.calibration, 2);
    assert_eq!(snapshots[1].1.drift_ns, Some(0), "no drift on this clock");
}
