//! Chrome trace-event JSON, which ui.perfetto.dev and chrome://tracing open.
//!
//! The file is one JSON array of events. Each GPU track is a named thread of the process
//! (thread ids from 1,000,000 up, so they sort after the CPU threads); each CPU thread that
//! reports a zone gets its own track, named after the thread. Zones are complete events
//! (`"ph":"X"`, with `ts` and `dur` in microseconds with nanosecond decimals), written when
//! they end; dropped zones are a counter track per GPU track (`"ph":"C"`, cumulative per reason).
//! The array is closed by [`JsonSink::finish`] (or on drop), which makes the file valid JSON.
//!
//! Each (re-)calibration of a GPU track's clock is a metadata event on that track, a clock
//! snapshot (`"name":"clock_snapshot"`, `"ph":"M"`, `ts` when it was taken), whose `args` say
//! how its GPU times reach the trace clock and how far they can be off: `calibration` (its
//! number), `clock` (`"globaltimer"` or the fallback's `"host bracket"`), `base_ns` and
//! `uncertainty_ns` (the base event's trace-clock time, and how far every event time can be
//! off either way), and through `%globaltimer` also `globaltimer_ns` and `trace_ns` (a
//! `%globaltimer` reading and the trace-clock time it maps to), `offset_ns` (trace clock minus
//! `%globaltimer`), `offset_uncertainty_ns`, `round_trip_ns`, `rounds` and, from the second on,
//! `drift_ns` (how far the previous map had drifted). The two 64-bit clock values that exceed
//! 2^53 (`globaltimer_ns`, `offset_ns`) are decimal strings, so no JSON reader rounds them.
//! (Perfetto's own clock snapshots exist only in its protobuf format; its JSON importer keeps
//! unknown metadata out of the way.)
//!
//! A queue submission shows on both sides: a `submit` zone on the submitting thread's track (from
//! when the queue took it to the end of its issue), a flow arrow (`"ph":"s"` there, `"ph":"f"`
//! with `"bp":"e"` on the GPU track, sharing an `id`) to the `submission` zone on the GPU track,
//! and details in `args`: the queue, the submission's ordinal, its waits and signals as
//! `[semaphore, value]` pairs, its command buffers' labels, how long it waited on the host for
//! its waits, and, when the GPU waited for other queues' work before starting it, which
//! semaphores and for how long (`device_wait_us`, `waited_on`). Command buffer zones carry their
//! label, the submission's ordinal and their index in it.
//!
//! The file is streamed, one event at a time, into a reused line buffer: each event's fixed
//! skeleton (keys, numbers) is formatted in place and every string in it (zone, track and
//! thread names, which users choose) is written by serde_json, so escaping is serde_json's.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

use super::{DropReason, Sink, SubmissionDetails, TrackId};
use crate::Error;
use crate::clock;
use crate::clock_sync::{ClockSnapshot, ClockSource};
use crate::lock::lock;
use crate::thread::thread_id;

/// The thread id of GPU track 0 in the JSON file.
const GPU_TID_BASE: u64 = 1_000_000;

/// A zone begun and not ended yet.
struct OpenZone {
    name: String,
    begin_ns: u64,
    /// The zone's `args` object, written out.
    args: Option<Vec<u8>>,
    /// The flow arrow that ends at it.
    flow: Option<u64>,
}

struct Track {
    /// Open zones.
    open: Vec<OpenZone>,
    dropped: [u64; DropReason::ALL.len()],
}

struct State<W: Write> {
    out: Option<W>,
    /// Events written so far (for the separators).
    written: u64,
    tracks: Vec<Track>,
    /// CPU threads already named.
    named_threads: Vec<u64>,
    error: Option<std::io::Error>,
    /// Reused for formatting one event.
    line: Vec<u8>,
}

/// A sink writing Chrome/Perfetto trace-event JSON to `W` (a file by default).
pub struct JsonSink<W: Write + Send = BufWriter<File>> {
    pid: u32,
    state: Mutex<State<W>>,
}

impl JsonSink<BufWriter<File>> {
    /// Creates (or truncates) the file at `path` and writes the array's opening.
    pub fn create(path: impl AsRef<Path>) -> Result<Self, Error> {
        let file = File::create(path.as_ref()).map_err(|source| Error::Io {
            what: "a JSON trace",
            source,
        })?;
        Self::new(BufWriter::new(file))
    }
}

/// Appends `s` to `out` as a JSON string literal, escaped by serde_json.
fn push_json_string(out: &mut Vec<u8>, s: &str) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Appends nanoseconds as microseconds with three exact decimals.
fn push_us(out: &mut Vec<u8>, ns: u64) {
    let _ = write!(out, "{}.{:03}", ns / 1_000, ns % 1_000);
}

impl<W: Write + Send> JsonSink<W> {
    /// A sink writing to `out`; writes the array's opening and the process name now.
    pub fn new(out: W) -> Result<Self, Error> {
        let sink = Self {
            pid: std::process::id(),
            state: Mutex::new(State {
                out: Some(out),
                written: 0,
                tracks: Vec::new(),
                named_threads: Vec::new(),
                error: None,
                line: Vec::with_capacity(256),
            }),
        };
        {
            let mut st = lock(&sink.state);
            st.write_raw(b"[");
            let mut line = std::mem::take(&mut st.line);
            line.clear();
            let _ = write!(
                line,
                r#"{{"name":"process_name","ph":"M","pid":{},"tid":0,"args":{{"name":"cuhal"}}}}"#,
                sink.pid
            );
            st.event(&line);
            st.line = line;
            if let Some(e) = st.error.take() {
                return Err(Error::Io {
                    what: "a JSON trace",
                    source: e,
                });
            }
        }
        Ok(sink)
    }

    /// Closes the array, flushes, and hands back the writer (`None` if already finished). The
    /// first write error met since creation, if any, is returned instead.
    pub fn finish(&self) -> Result<Option<W>, Error> {
        let mut st = lock(&self.state);
        if st.out.is_none() {
            return Ok(None);
        }
        st.write_raw(b"\n]\n");
        let mut out = st.out.take();
        if let (Some(w), None) = (out.as_mut(), st.error.as_ref())
            && let Err(e) = w.flush()
        {
            st.error = Some(e);
        }
        match st.error.take() {
            Some(source) => Err(Error::Io {
                what: "a JSON trace",
                source,
            }),
            None => Ok(out),
        }
    }

    fn with_line(&self, f: impl FnOnce(&mut State<W>, &mut Vec<u8>)) {
        let mut st = lock(&self.state);
        if st.out.is_none() {
            return;
        }
        let mut line = std::mem::take(&mut st.line);
        line.clear();
        f(&mut st, &mut line);
        st.line = line;
    }

    fn gpu_tid(track: TrackId) -> u64 {
        GPU_TID_BASE + u64::from(track.0)
    }
}

impl<W: Write> State<W> {
    fn write_raw(&mut self, s: &[u8]) {
        if self.error.is_some() {
            return;
        }
        if let Some(out) = self.out.as_mut()
            && let Err(e) = out.write_all(s)
        {
            self.error = Some(e);
        }
    }

    /// Writes one event object, with its separator.
    fn event(&mut self, json: &[u8]) {
        let sep: &[u8] = if self.written == 0 { b"\n" } else { b",\n" };
        self.write_raw(sep);
        self.write_raw(json);
        self.written += 1;
    }
}

/// Appends a complete ("X") event, with `args` (a JSON object) if given.
#[allow(clippy::too_many_arguments)]
fn push_complete(
    line: &mut Vec<u8>,
    pid: u32,
    tid: u64,
    cat: &str,
    name: &str,
    begin_ns: u64,
    end_ns: u64,
    args: Option<&[u8]>,
) {
    line.extend_from_slice(br#"{"name":"#);
    push_json_string(line, name);
    let _ = write!(
        line,
        r#","cat":"{cat}","ph":"X","pid":{pid},"tid":{tid},"ts":"#
    );
    push_us(line, begin_ns);
    line.extend_from_slice(br#","dur":"#);
    push_us(line, end_ns.saturating_sub(begin_ns));
    if let Some(args) = args {
        line.extend_from_slice(br#","args":"#);
        line.extend_from_slice(args);
    }
    line.push(b'}');
}

/// Appends one end of a flow arrow: `"s"` (its start, on the host) or `"f"` (its end, bound to
/// the enclosing GPU zone).
fn push_flow(line: &mut Vec<u8>, pid: u32, tid: u64, phase: char, id: u64, ns: u64) {
    let _ = write!(
        line,
        r#"{{"name":"submission","cat":"flow","ph":"{phase}","id":{id},"bind_id":{id},"pid":{pid},"tid":{tid},"ts":"#
    );
    push_us(line, ns);
    if phase == 'f' {
        line.extend_from_slice(br#","bp":"e""#);
    }
    line.push(b'}');
}

/// Appends `[[a, b], ...]`.
fn push_pairs(out: &mut Vec<u8>, pairs: &[(u64, u64)]) {
    out.push(b'[');
    for (i, (a, b)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = write!(out, "[{a},{b}]");
    }
    out.push(b']');
}

/// The `args` of a submission's GPU zone.
fn submission_args(details: &SubmissionDetails<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(192);
    out.extend_from_slice(br#"{"queue":"#);
    push_json_string(&mut out, details.queue);
    let _ = write!(out, r#","ordinal":{},"waits":"#, details.ordinal);
    push_pairs(&mut out, details.waits);
    out.extend_from_slice(br#","signals":"#);
    push_pairs(&mut out, details.signals);
    out.extend_from_slice(br#","command_buffers":["#);
    for (i, label) in details.command_buffers.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_json_string(&mut out, label);
    }
    out.extend_from_slice(br#"],"host_wait_us":"#);
    push_us(
        &mut out,
        details
            .host
            .issue_begin_ns
            .saturating_sub(details.host.submitted_ns),
    );
    if let Some(wait) = details.device_wait_ns {
        out.extend_from_slice(br#","device_wait_us":"#);
        push_us(&mut out, wait);
        out.extend_from_slice(br#","waited_on":["#);
        for (i, (semaphore, _)) in details.waits.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let _ = write!(out, "{semaphore}");
        }
        out.push(b']');
    }
    if let Some(sample) = details.fine_sample {
        let _ = write!(
            out,
            r#","sampled":{},"replay":{},"one_in":{}"#,
            sample.sampled, sample.replay, sample.one_in
        );
    }
    out.push(b'}');
    out
}

/// The `args` of a clock snapshot (see the module).
fn snapshot_args(out: &mut Vec<u8>, snapshot: &ClockSnapshot) {
    let clock = match snapshot.source {
        ClockSource::GlobalTimer(_) => "globaltimer",
        ClockSource::HostBracket => "host bracket",
    };
    let _ = write!(
        out,
        r#"{{"calibration":{},"clock":"{clock}","base_ns":{},"uncertainty_ns":{}"#,
        snapshot.calibration, snapshot.base_ns, snapshot.uncertainty_ns
    );
    if let ClockSource::GlobalTimer(sync) = snapshot.source {
        let _ = write!(
            out,
            r#","globaltimer_ns":"{}","trace_ns":{},"offset_ns":"{}","offset_uncertainty_ns":{},"round_trip_ns":{},"rounds":{}"#,
            sync.gpu_ns,
            sync.host_ns,
            sync.offset_ns(),
            sync.uncertainty_ns,
            sync.round_trip_ns,
            sync.rounds
        );
    }
    if let Some(drift) = snapshot.drift_ns {
        let _ = write!(out, r#","drift_ns":{drift}"#);
    }
    out.push(b'}');
}

impl<W: Write> State<W> {
    /// Names CPU thread `tid` once, after `name`.
    fn name_thread(&mut self, line: &mut Vec<u8>, pid: u32, tid: u64, name: Option<&str>) {
        if self.named_threads.contains(&tid) {
            return;
        }
        self.named_threads.push(tid);
        let _ = write!(
            line,
            r#"{{"name":"thread_name","ph":"M","pid":{pid},"tid":{tid},"args":{{"name":"#
        );
        push_json_string(line, &format!("{} ({tid})", name.unwrap_or("thread")));
        line.extend_from_slice(b"}}");
        self.event(line);
        line.clear();
    }
}

impl<W: Write + Send> Sink for JsonSink<W> {
    fn register_gpu_track(&self, name: &str, _now_ns: u64) -> Result<TrackId, Error> {
        let mut track = TrackId(0);
        let pid = self.pid;
        self.with_line(|st, line| {
            track = TrackId(st.tracks.len() as u32);
            st.tracks.push(Track {
                open: Vec::new(),
                dropped: [0; DropReason::ALL.len()],
            });
            let tid = Self::gpu_tid(track);
            let _ = write!(
                line,
                r#"{{"name":"thread_name","ph":"M","pid":{pid},"tid":{tid},"args":{{"name":"#
            );
            push_json_string(line, name);
            line.extend_from_slice(b"}}");
            st.event(line);
            line.clear();
            let _ = write!(
                line,
                r#"{{"name":"thread_sort_index","ph":"M","pid":{pid},"tid":{tid},"args":{{"sort_index":{}}}}}"#,
                -1_000_000 + i64::from(track.0)
            );
            st.event(line);
        });
        Ok(track)
    }

    fn gpu_zone_begin(&self, track: TrackId, name: &str, timestamp_ns: u64) {
        let mut st = lock(&self.state);
        if let Some(t) = st.tracks.get_mut(track.0 as usize) {
            t.open.push(OpenZone {
                name: name.to_owned(),
                begin_ns: timestamp_ns,
                args: None,
                flow: None,
            });
        }
    }

    fn submission_begin(
        &self,
        track: TrackId,
        name: &str,
        timestamp_ns: u64,
        details: &SubmissionDetails<'_>,
    ) {
        let pid = self.pid;
        let host = details.host;
        self.with_line(|st, line| {
            if st.tracks.get(track.0 as usize).is_none() {
                return;
            }
            // The host side: the submitting thread's zone, from when the queue took the
            // submission to the end of its issue (when another thread issued it, the zone
            // marks only when it was taken).
            st.name_thread(line, pid, host.thread, host.thread_name);
            let end = if host.issuing_thread == host.thread {
                host.issue_end_ns.max(host.submitted_ns)
            } else {
                host.submitted_ns
            };
            let mut args = Vec::with_capacity(64);
            args.extend_from_slice(br#"{"queue":"#);
            push_json_string(&mut args, details.queue);
            let _ = write!(args, r#","ordinal":{}}}"#, details.ordinal);
            push_complete(
                line,
                pid,
                host.thread,
                "host",
                "submit",
                host.submitted_ns,
                end,
                Some(&args),
            );
            st.event(line);
            line.clear();
            push_flow(
                line,
                pid,
                host.thread,
                's',
                details.flow,
                host.submitted_ns + (end - host.submitted_ns) / 2,
            );
            st.event(line);
            if let Some(t) = st.tracks.get_mut(track.0 as usize) {
                t.open.push(OpenZone {
                    name: name.to_owned(),
                    begin_ns: timestamp_ns,
                    args: Some(submission_args(details)),
                    flow: Some(details.flow),
                });
            }
        });
    }

    fn command_buffer_begin(
        &self,
        track: TrackId,
        label: &str,
        timestamp_ns: u64,
        ordinal: u64,
        index: usize,
    ) {
        let mut args = Vec::with_capacity(80);
        args.extend_from_slice(br#"{"label":"#);
        push_json_string(&mut args, label);
        let _ = write!(args, r#","ordinal":{ordinal},"index":{index}}}"#);
        let mut st = lock(&self.state);
        if let Some(t) = st.tracks.get_mut(track.0 as usize) {
            t.open.push(OpenZone {
                name: label.to_owned(),
                begin_ns: timestamp_ns,
                args: Some(args),
                flow: None,
            });
        }
    }

    fn gpu_zone_end(&self, track: TrackId, timestamp_ns: u64) {
        let pid = self.pid;
        self.with_line(|st, line| {
            let Some(zone) = st
                .tracks
                .get_mut(track.0 as usize)
                .and_then(|t| t.open.pop())
            else {
                return;
            };
            let tid = Self::gpu_tid(track);
            push_complete(
                line,
                pid,
                tid,
                "gpu",
                &zone.name,
                zone.begin_ns,
                timestamp_ns,
                zone.args.as_deref(),
            );
            st.event(line);
            if let Some(flow) = zone.flow {
                line.clear();
                push_flow(line, pid, tid, 'f', flow, zone.begin_ns);
                st.event(line);
            }
        });
    }

    fn zones_dropped(&self, track: TrackId, reason: DropReason, count: u64) {
        let pid = self.pid;
        let now = clock::now_ns();
        self.with_line(|st, line| {
            let Some(t) = st.tracks.get_mut(track.0 as usize) else {
                return;
            };
            let i = DropReason::ALL
                .iter()
                .position(|r| *r == reason)
                .unwrap_or(0);
            t.dropped[i] = t.dropped[i].saturating_add(count);
            let total = t.dropped[i];
            let tid = Self::gpu_tid(track);
            let _ = write!(
                line,
                r#"{{"name":"dropped zones (track {})","ph":"C","pid":{pid},"tid":{tid},"ts":"#,
                track.0
            );
            push_us(line, now);
            line.extend_from_slice(br#","args":{"#);
            push_json_string(line, reason.as_str());
            let _ = write!(line, ":{total}}}}}");
            st.event(line);
        });
    }

    fn clock_snapshot(&self, track: TrackId, snapshot: &ClockSnapshot) {
        let pid = self.pid;
        self.with_line(|st, line| {
            if st.tracks.get(track.0 as usize).is_none() {
                return;
            }
            let tid = Self::gpu_tid(track);
            let _ = write!(
                line,
                r#"{{"name":"clock_snapshot","ph":"M","pid":{pid},"tid":{tid},"ts":"#
            );
            push_us(line, snapshot.taken_at_ns);
            line.extend_from_slice(br#","args":"#);
            snapshot_args(line, snapshot);
            line.push(b'}');
            st.event(line);
        });
    }

    fn cpu_zone(&self, name: &str, begin_ns: u64, end_ns: u64) {
        let pid = self.pid;
        let tid = thread_id();
        self.with_line(|st, line| {
            let current = std::thread::current();
            st.name_thread(line, pid, tid, current.name());
            push_complete(line, pid, tid, "cpu", name, begin_ns, end_ns, None);
            st.event(line);
        });
    }
}

impl<W: Write + Send> Drop for JsonSink<W> {
    fn drop(&mut self) {
        // Errors were the caller's to collect through `finish`; a drop only closes the array.
        let _ = self.finish();
    }
}
