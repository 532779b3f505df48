//! The JSON sink writes valid trace-event JSON whose GPU zones nest as recorded.

use std::collections::BTreeMap;
use std::sync::Arc;

use cuhal_trace::fake::FakeGpu;
use cuhal_trace::{
    CpuZone, DropReason, JsonSink, PoolLimits, Sink, TraceConfig, TraceContext, Verbosity,
};

/// A JSON value, parsed by the small recursive-descent parser below.
#[derive(Clone, Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Number(f64),
    String(String),
    Array(Vec<Json>),
    Object(BTreeMap<String, Json>),
}

impl Json {
    fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(m) => m.get(key),
            _ => None,
        }
    }
    fn str(&self, key: &str) -> Option<&str> {
        match self.get(key) {
            Some(Json::String(s)) => Some(s),
            _ => None,
        }
    }
    fn num(&self, key: &str) -> Option<f64> {
        match self.get(key) {
            Some(Json::Number(n)) => Some(*n),
            _ => None,
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn parse(text: &str) -> Result<Json, String> {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.value()?;
        p.ws();
        if p.i != p.s.len() {
            return Err(format!("trailing data at {}", p.i));
        }
        Ok(v)
    }
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\n' | b'\r' | b'\t') {
            self.i += 1;
        }
    }
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }
    fn expect(&mut self, c: u8) -> Result<(), String> {
        self.ws();
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!("expected {:?} at {}", c as char, self.i))
        }
    }
    fn literal(&mut self, word: &str, v: Json) -> Result<Json, String> {
        if self.s[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            Ok(v)
        } else {
            Err(format!("bad literal at {}", self.i))
        }
    }
    fn value(&mut self) -> Result<Json, String> {
        self.ws();
        match self.peek().ok_or("unexpected end")? {
            b'{' => {
                self.i += 1;
                let mut m = BTreeMap::new();
                self.ws();
                if self.peek() == Some(b'}') {
                    self.i += 1;
                    return Ok(Json::Object(m));
                }
                loop {
                    self.ws();
                    let Json::String(k) = self.string()? else {
                        unreachable!()
                    };
                    self.expect(b':')?;
                    let v = self.value()?;
                    if m.insert(k.clone(), v).is_some() {
                        return Err(format!("duplicate key {k}"));
                    }
                    self.ws();
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Json::Object(m));
                        }
                        _ => return Err(format!("bad object at {}", self.i)),
                    }
                }
            }
            b'[' => {
                self.i += 1;
                let mut a = Vec::new();
                self.ws();
                if self.peek() == Some(b']') {
                    self.i += 1;
                    return Ok(Json::Array(a));
                }
                loop {
                    a.push(self.value()?);
                    self.ws();
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Json::Array(a));
                        }
                        _ => return Err(format!("bad array at {}", self.i)),
                    }
                }
            }
            b'"' => self.string(),
            b't' => self.literal("true", Json::Bool(true)),
            b'f' => self.literal("false", Json::Bool(false)),
            b'n' => self.literal("null", Json::Null),
            _ => self.number(),
        }
    }
    fn string(&mut self) -> Result<Json, String> {
        if self.peek() != Some(b'"') {
            return Err(format!("expected a string at {}", self.i));
        }
        self.i += 1;
        let mut out = String::new();
        loop {
            let c = self.peek().ok_or("unterminated string")?;
            self.i += 1;
            match c {
                b'"' => return Ok(Json::String(out)),
                b'\\' => {
                    let e = self.peek().ok_or("bad escape")?;
                    self.i += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'u' => {
                            let hex = std::str::from_utf8(&self.s[self.i..self.i + 4])
                                .map_err(|e| e.to_string())?;
                            let code = u32::from_str_radix(hex, 16).map_err(|e| e.to_string())?;
                            out.push(char::from_u32(code).ok_or("bad \\u")?);
                            self.i += 4;
                        }
                        _ => return Err(format!("bad escape at {}", self.i)),
                    }
                }
                c if c < 0x20 => return Err(format!("raw control character at {}", self.i)),
                _ => {
                    // Copy one UTF-8 sequence.
                    let start = self.i - 1;
                    let len = match c {
                        0x00..=0x7f => 1,
                        0xc0..=0xdf => 2,
                        0xe0..=0xef => 3,
                        _ => 4,
                    };
                    let chunk = std::str::from_utf8(&self.s[start..start + len])
                        .map_err(|e| e.to_string())?;
                    out.push_str(chunk);
                    self.i = start + len;
                }
            }
        }
    }
    fn number(&mut self) -> Result<Json, String> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        let digits = |p: &mut Self| {
            let s = p.i;
            while p.peek().is_some_and(|c| c.is_ascii_digit()) {
                p.i += 1;
            }
            p.i > s
        };
        if !digits(self) {
            return Err(format!("bad number at {start}"));
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if !digits(self) {
                return Err(format!("bad fraction at {start}"));
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if !digits(self) {
                return Err(format!("bad exponent at {start}"));
            }
        }
        let text = std::str::from_utf8(&self.s[start..self.i]).unwrap();
        text.parse()
            .map(Json::Number)
            .map_err(|e| format!("{e}: {text}"))
    }
}

#[test]
fn the_parser_rejects_what_it_should() {
    for bad in [
        "[1,]",
        "{\"a\":1,}",
        "[1 2]",
        "\"a",
        "{\"a\" 1}",
        "[01x]",
        "[\"\u{1}\"]",
        "[1]]",
    ] {
        assert!(Parser::parse(bad).is_err(), "accepted {bad:?}");
    }
    assert_eq!(
        Parser::parse(r#" {"a":[1,-2.5e3,true,null,"x\"\u0041"]} "#).unwrap(),
        Json::Object(BTreeMap::from([(
            "a".to_owned(),
            Json::Array(vec![
                Json::Number(1.0),
                Json::Number(-2500.0),
                Json::Bool(true),
                Json::Null,
                Json::String("x\"A".to_owned())
            ])
        )]))
    );
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
    match Parser::parse(&text) {
        Ok(Json::Array(events)) => events,
        Ok(other) => panic!("not an array: {other:?}"),
        Err(e) => panic!("invalid JSON ({e}):\n{text}"),
    }
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
    let Json::Array(events) = Parser::parse(&text).unwrap() else {
        panic!("not an array")
    };
    let z = events.iter().find(|e| e.str("ph") == Some("X")).unwrap();
    assert_eq!((z.num("ts"), z.num("dur")), (Some(1.5), Some(1.25)));
}
