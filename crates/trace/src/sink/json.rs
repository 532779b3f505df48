//! Chrome trace-event JSON, which ui.perfetto.dev and chrome://tracing open.
//!
//! The file is one JSON array of events. Each GPU track is a named thread of the process
//! (thread ids from 1,000,000 up, so they sort after the CPU threads); each CPU thread that
//! reports a zone gets its own track, named after the thread. Zones are complete events
//! (`"ph":"X"`, with `ts` and `dur` in microseconds with nanosecond decimals), written when
//! they end; dropped zones are a counter track per GPU track (`"ph":"C"`, cumulative per reason).
//! The array is closed by [`JsonSink::finish`] (or on drop), which makes the file valid JSON.
//!
//! The file is streamed, one event at a time, into a reused line buffer: each event's fixed
//! skeleton (keys, numbers) is formatted in place and every string in it (zone, track and
//! thread names, which users choose) is written by serde_json, so escaping is serde_json's.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

use super::{DropReason, Sink, TrackId};
use crate::Error;
use crate::clock;
use crate::cpu_zone::thread_id;
use crate::lock::lock;

/// The thread id of GPU track 0 in the JSON file.
const GPU_TID_BASE: u64 = 1_000_000;

struct Track {
    /// Open zones: name and begin time.
    open: Vec<(String, u64)>,
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

/// Appends a complete ("X") event.
fn push_complete(
    line: &mut Vec<u8>,
    pid: u32,
    tid: u64,
    cat: &str,
    name: &str,
    begin_ns: u64,
    end_ns: u64,
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
    line.push(b'}');
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
            t.open.push((name.to_owned(), timestamp_ns));
        }
    }

    fn gpu_zone_end(&self, track: TrackId, timestamp_ns: u64) {
        let pid = self.pid;
        self.with_line(|st, line| {
            let Some((name, begin)) = st
                .tracks
                .get_mut(track.0 as usize)
                .and_then(|t| t.open.pop())
            else {
                return;
            };
            push_complete(
                line,
                pid,
                Self::gpu_tid(track),
                "gpu",
                &name,
                begin,
                timestamp_ns,
            );
            st.event(line);
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

    fn cpu_zone(&self, name: &str, begin_ns: u64, end_ns: u64) {
        let pid = self.pid;
        let tid = thread_id();
        self.with_line(|st, line| {
            if !st.named_threads.contains(&tid) {
                st.named_threads.push(tid);
                let current = std::thread::current();
                let thread_name = current.name().unwrap_or("thread");
                let _ = write!(
                    line,
                    r#"{{"name":"thread_name","ph":"M","pid":{pid},"tid":{tid},"args":{{"name":"#
                );
                push_json_string(line, &format!("{thread_name} ({tid})"));
                line.extend_from_slice(b"}}");
                st.event(line);
                line.clear();
            }
            push_complete(line, pid, tid, "cpu", name, begin_ns, end_ns);
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
