//! The JSON sink writes valid trace-event JSON whose GPU zones nest as recorded.

use std::sync::Arc;

use cuhal_trace::fake::FakeGpu;
use cuhal_trace::{
    CpuZone, DropReason, JsonSink, PoolLimits, Sink, TraceConfig, TraceContext, Verbosity,
};

/// A JSON value as serde_json reads it back.
type Json = serde_json::Value;

/// Field access in the shapes the checks below use.
trait Fields {
    fn str(&self, key: &str) -> Option<&str>;
    fn num(&self, key: &str) -> Option<f64>;
}

impl Fields for Json {
    fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Json::as_str)
    }
    fn num(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(Json::as_f64)
    }
}

/// Parses a whole trace file: a JSON array of events.
fn parse_events(text: &str) -> Vec<Json> {
    match serde_json::from_str::<Json>(text) {
        Ok(Json::Array(events)) => events,
        Ok(other) => panic!("not an array: {other:?}"),
        Err(e) => panic!("invalid JSON ({e}):\n{text}"),
    }
}

/// Writes a trace through the whole pipeline on the fake device, and returns the parsed events.
fn traced_events() -> Vec<Json> {
    let sink = Arc::new(JsonSink::new(Vec::<u8>::new()).unwrap());
    let gpu = FakeGpu::new();
    {
        let config = TraceConfig {
            pool: PoolLimits {
                initial: 0,
                grow_by: 4,
                max: 8,
            },
            ..TraceConfig::new(Verbosity::Fine, "GPU 0 \"queue\" 0")
        };
        let trace = TraceContext::with_backend(gpu.clone(), config, sink.clone()).unwrap();
        let list = trace.zone_list().unwrap();
        let cb = list.begin_zone("command buffer").unwrap();
        let mut stamps = vec![(cb, 1_000_000)];
        for (i, name) in ["fill\n", "dispatch \\ 1"].iter().enumerate() {
            let b = list.begin_zone(name).unwrap();
            let e = list.end_zone().unwrap();
            let t = 1_000_000 + 10_000 * (i as u64 + 1);
            stamps.push((b, t));
            stamps.push((e, t + 5_123));
        }
        // Pool exhausted (8 events = 4 zones; one more asked for than fits).
        let last = list.begin_zone("copy").unwrap();
        assert!(list.begin_zone("dropped").is_none());
        list.end_zone();
        let last_end = list.end_zone().unwrap();
        stamps.push((last, 1_040_000));
        stamps.push((last_end, 1_041_000));
        let cb_end = list.end_zone().unwrap();
        stamps.push((cb_end, 1_050_000));
        for (e, t) in stamps {
            gpu.complete_at(e, t);
        }
        list.on_submit().unwrap()();
        {
            let _cpu = CpuZone::new(sink.as_ref(), "host work");
        }
        sink.zones_dropped(trace.track().unwrap(), DropReason::Superseded, 2);
    }
    let bytes = sink
        .finish()
        .unwrap()
        .expect("first finish returns the writer");
    assert!(
        sink.finish().unwrap().is_none(),
        "finishing twice is harmless"
    );
    let text = String::from_utf8(bytes).unwrap();
    parse_events(&text)
}

#[test]
fn the_trace_is_valid_json_with_named_tracks() {
    let events = traced_events();
    for e in &events {
        let ph = e.str("ph").expect("every event has a phase");
        assert!(matches!(ph, "X" | "M" | "C"), "{ph}");
        assert!(e.num("pid").is_some());
    }
    let names: Vec<_> = events
        .iter()
        .filter(|e| e.str("name") == Some("thread_name"))
        .filter_map(|e| e.get("args").and_then(|a| a.str("name")))
        .collect();
    assert!(names.contains(&"GPU 0 \"queue\" 0"), "{names:?}");
    assert!(
        names.iter().any(|n| n.contains('(')),
        "the CPU thread is named: {names:?}"
    );
    let counters: Vec<_> = events.iter().filter(|e| e.str("ph") == Some("C")).collect();
    let dropped: Vec<_> = counters
        .iter()
        .filter_map(|e| {
            let args = e.get("args")?;
            Some((args.num("pool exhausted"), args.num("superseded")))
        })
        .collect();
    assert!(dropped.contains(&(Some(1.0), None)), "{dropped:?}");
    assert!(dropped.contains(&(None, Some(2.0))), "{dropped:?}");
}

#[test]
fn gpu_zones_nest_on_their_track_and_cpu_zones_have_their_own() {
    let events = traced_events();
    let gpu_tid = events
        .iter()
        .find(|e| {
            e.str("name") == Some("thread_name")
                && e.get("args").and_then(|a| a.str("name")) == Some("GPU 0 \"queue\" 0")
        })
        .and_then(|e| e.num("tid"))
        .unwrap();
    let mut zones: Vec<(String, f64, f64)> = events
        .iter()
        .filter(|e| e.str("ph") == Some("X") && e.str("cat") == Some("gpu"))
        .map(|e| {
            assert_eq!(e.num("tid"), Some(gpu_tid));
            let ts = e.num("ts").unwrap();
            (
                e.str("name").unwrap().to_owned(),
                ts,
                ts + e.num("dur").unwrap(),
            )
        })
        .collect();
    zones.sort_by(|a, b| a.1.partial_cmp(&b.1).unwrap());
    let names: Vec<_> = zones.iter().map(|z| z.0.as_str()).collect();
    assert_eq!(names, ["command buffer", "fill\n", "dispatch \\ 1", "copy"]);
    // Microseconds with exact nanosecond decimals.
    assert_eq!((zones[0].1, zones[0].2), (1_000.0, 1_050.0));
    assert_eq!((zones[1].1, zones[1].2), (1_010.0, 1_015.123));
    // The outer zone contains the others, which do not overlap each other.
    for inner in &zones[1..] {
        assert!(zones[0].1 <= inner.1 && inner.2 <= zones[0].2, "{inner:?}");
    }
    for w in zones[1..].windows(2) {
        assert!(w[0].2 <= w[1].1, "{w:?}");
    }
    let cpu: Vec<_> = events
        .iter()
        .filter(|e| e.str("ph") == Some("X") && e.str("cat") == Some("cpu"))
        .collect();
    assert_eq!(cpu.len(), 1);
    assert_eq!(cpu[0].str("name"), Some("host work"));
    assert_ne!(cpu[0].num("tid"), Some(gpu_tid));
}

#[test]
fn a_file_sink_closes_the_array_on_drop() {
    let path = std::env::temp_dir().join(format!("cuhal-trace-{}.json", std::process::id()));
    {
        let sink = JsonSink::create(&path).unwrap();
        let track = sink.register_gpu_track("q", 0).unwrap();
        sink.gpu_zone_begin(track, "z", 1_500);
        sink.gpu_zone_end(track, 2_750);
    }
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).ok();
    let events = parse_events(&text);
    let z = events.iter().find(|e| e.str("ph") == Some("X")).unwrap();
    assert_eq!((z.num("ts"), z.num("dur")), (Some(1.5), Some(1.25)));
}

#[test]
fn hostile_names_come_back_as_written() {
    let hostile = [
        "\"}], {\"ph\":\"X\", \"injected\": true",
        "back\\slash\\\"quote\\",
        "\u{0}nul\u{1b}[31mescape\u{7f}del\u{1f}",
        "line\nbreak\r\n\t\u{2028}\u{2029}",
        "emoji 🚀 \u{fffd} µs",
    ];
    let sink = JsonSink::new(Vec::<u8>::new()).unwrap();
    let mut tracks = Vec::new();
    for (i, name) in hostile.iter().enumerate() {
        let track = sink.register_gpu_track(name, 0).unwrap();
        sink.gpu_zone_begin(track, name, 1_000 * i as u64);
        sink.gpu_zone_end(track, 1_000 * i as u64 + 500);
        tracks.push(track);
    }
    sink.cpu_zone(hostile[0], 10, 20);
    let text = String::from_utf8(sink.finish().unwrap().unwrap()).unwrap();
    let events = parse_events(&text);
    // 1 process name, 2 metadata events per track, 1 zone per track, 1 CPU thread name and zone.
    assert_eq!(events.len(), 1 + 3 * hostile.len() + 2, "{text}");
    for name in hostile {
        let named = events
            .iter()
            .filter(|e| {
                e.str("name") == Some("thread_name")
                    && e.get("args").and_then(|a| a.str("name")) == Some(name)
            })
            .count();
        assert_eq!(named, 1, "track {name:?} in {text}");
        let zones = events
            .iter()
            .filter(|e| e.str("ph") == Some("X") && e.str("name") == Some(name))
            .count();
        // The first name is also the CPU zone's.
        let expected = if name == hostile[0] { 2 } else { 1 };
        assert_eq!(zones, expected, "zone {name:?} in {text}");
    }
    assert!(events.iter().all(|e| e.get("injected").is_none()));
}

/// Each calibration is a `clock_snapshot` metadata event on its GPU track: through
/// `%globaltimer` with the offset, its uncertainty and (from the second on) the drift; the
/// fallback's host bracket without them.
#[test]
fn every_calibration_is_written_as_a_clock_snapshot() {
    const EPOCH_GPU: i64 = 1_700_000_000_000_000_000;
    let sink = Arc::new(JsonSink::new(Vec::<u8>::new()).unwrap());
    let gpu = FakeGpu::new();
    // 20 ppm fast; the smallest round trip (1,000 ns) is 200 ns longer on the way back.
    gpu.set_gpu_clock(EPOCH_GPU, 20_000);
    gpu.set_exchange_legs(vec![(1_000, 1_000), (400, 600), (5_000, 50)]);
    gpu.set_stamp_half_width(100);
    let gpu_at_start = gpu.gpu_time(gpu.now());
    {
        let trace = TraceContext::with_backend(
            gpu.clone(),
            TraceConfig::new(Verbosity::Coarse, "q"),
            sink.clone(),
        )
        .unwrap();
        gpu.advance(1_000_000_000);
        trace.recalibrate().unwrap();
        gpu.fail_clock_exchange(true);
        gpu.advance(1_000_000);
        trace.recalibrate().unwrap();
    }
    let text = String::from_utf8(sink.finish().unwrap().unwrap()).unwrap();
    let events = parse_events(&text);
    let gpu_tid = events
        .iter()
        .find(|e| {
            e.str("name") == Some("thread_name")
                && e.get("args").and_then(|a| a.str("name")) == Some("q")
        })
        .and_then(|e| e.num("tid"))
        .unwrap();
    let snapshots: Vec<&Json> = events
        .iter()
        .filter(|e| e.str("name") == Some("clock_snapshot"))
        .collect();
    assert_eq!(snapshots.len(), 3, "{text}");
    for s in &snapshots {
        assert_eq!(s.str("ph"), Some("M"));
        assert_eq!(s.num("tid"), Some(gpu_tid));
    }
    let args = |i: usize| snapshots[i].get("args").unwrap();
    let u64_of = |v: &Json, key: &str| v.get(key).and_then(Json::as_u64);
    // The first, when the context was made (1 ms).
    let first = args(0);
    assert_eq!(snapshots[0].num("ts"), Some(1_000.0));
    assert_eq!(u64_of(first, "calibration"), Some(1));
    assert_eq!(first.str("clock"), Some("globaltimer"));
    assert_eq!(
        first.str("globaltimer_ns"),
        Some(&*gpu_at_start.to_string())
    );
    assert_eq!(u64_of(first, "trace_ns"), Some(1_000_100));
    let offset = 1_000_100 - gpu_at_start as i64;
    assert_eq!(first.str("offset_ns"), Some(&*offset.to_string()));
    assert_eq!(u64_of(first, "offset_uncertainty_ns"), Some(500));
    assert_eq!(u64_of(first, "round_trip_ns"), Some(1_000));
    assert_eq!(
        u64_of(first, "rounds"),
        Some(cuhal_trace::EXCHANGE_ROUNDS as u64)
    );
    assert_eq!(u64_of(first, "base_ns"), Some(1_000_100));
    assert_eq!(u64_of(first, "uncertainty_ns"), Some(600));
    assert!(first.get("drift_ns").is_none());
    // The second, 1 s later: the first map had drifted by 20 ppm of 1 s.
    let second = args(1);
    assert_eq!(u64_of(second, "calibration"), Some(2));
    assert_eq!(second.str("clock"), Some("globaltimer"));
    assert_eq!(second.get("drift_ns").and_then(Json::as_i64), Some(20_000));
    // The third fell back to the host bracket: no %globaltimer figures.
    let third = args(2);
    assert_eq!(u64_of(third, "calibration"), Some(3));
    assert_eq!(third.str("clock"), Some("host bracket"));
    assert_eq!(u64_of(third, "base_ns"), Some(1_002_000_000));
    assert!(third.get("globaltimer_ns").is_none() && third.get("drift_ns").is_none());
}
