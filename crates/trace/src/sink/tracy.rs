//! Tracy, through tracy-client's manual GPU API.
//!
//! Each track is a Tracy GPU context whose clock is the trace clock (period 1 ns), synchronized
//! with Tracy's CPU clock when the track is registered. Zones reach Tracy only once collected, so
//! each zone's begin and end are emitted and their timestamps uploaded together, in recording
//! order (which keeps Tracy's per-context nesting and its rule of increasing upload order within
//! nested zones). Each timestamp needs a `u16` query id that Tracy keys the upload by; ids come
//! from a per-track [`QueryIds`] free list and go back right after their upload, so they recycle
//! however many events the pool holds.

use std::sync::Mutex;

use tracy_client::{Client, GpuContext, GpuContextType};

use super::{DropReason, Sink, TrackId};
use crate::Error;
use crate::lock::lock;
use crate::query_ids::QueryIds;

struct Track {
    context: GpuContext,
    ids: QueryIds,
    /// Per open zone, the query id reserved for its end (`None`: dropped for lack of ids).
    open: Vec<Option<u16>>,
}

/// A sink sending GPU zones to a Tracy profiler on localhost.
pub struct TracySink {
    client: Client,
    tracks: Mutex<Vec<Track>>,
    dropped_for_ids: std::sync::atomic::AtomicU64,
}

impl TracySink {
    /// Starts the Tracy client (if not already running).
    pub fn new() -> Self {
        Self {
            client: Client::start(),
            tracks: Mutex::new(Vec::new()),
            dropped_for_ids: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Zones this sink dropped because every query id of their track was in flight.
    pub fn dropped_for_query_ids(&self) -> u64 {
        self.dropped_for_ids
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Default for TracySink {
    fn default() -> Self {
        Self::new()
    }
}

fn as_tracy_time(ns: u64) -> i64 {
    i64::try_from(ns).unwrap_or(i64::MAX)
}

impl Sink for TracySink {
    fn register_gpu_track(&self, name: &str, now_ns: u64) -> Result<TrackId, Error> {
        let context = self
            .client
            .clone()
            .new_gpu_context(
                Some(name),
                GpuContextType::Invalid,
                as_tracy_time(now_ns),
                1.0,
            )
            .map_err(|e| Error::Sink {
                sink: "tracy",
                reason: e.to_string(),
            })?;
        let mut tracks = lock(&self.tracks);
        tracks.push(Track {
            context,
            ids: QueryIds::new(),
            open: Vec::new(),
        });
        Ok(TrackId(tracks.len() as u32 - 1))
    }

    fn gpu_zone_begin(&self, track: TrackId, name: &str, timestamp_ns: u64) {
        let mut tracks = lock(&self.tracks);
        let Some(t) = tracks.get_mut(track.0 as usize) else {
            return;
        };
        match t.ids.acquire_pair() {
            Some((begin, end)) => {
                t.context.begin_span_alloc(name, "", "", 0, begin);
                t.context
                    .upload_gpu_timestamp(begin, as_tracy_time(timestamp_ns));
                // Uploaded: Tracy no longer needs the id.
                t.ids.release(begin);
                t.open.push(Some(end));
            }
            None => {
                t.open.push(None);
                drop(tracks);
                self.dropped_for_ids
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    fn gpu_zone_end(&self, track: TrackId, timestamp_ns: u64) {
        let mut tracks = lock(&self.tracks);
        let Some(t) = tracks.get_mut(track.0 as usize) else {
            return;
        };
        if let Some(Some(end)) = t.open.pop() {
            t.context.end_span(end);
            t.context
                .upload_gpu_timestamp(end, as_tracy_time(timestamp_ns));
            t.ids.release(end);
        }
    }

    fn zones_dropped(&self, track: TrackId, reason: DropReason, count: u64) {
        self.client.message(
            &format!(
                "cuhal: {count} GPU zones of track {} dropped ({})",
                track.0,
                reason.as_str()
            ),
            0,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Far more zones than there are query ids go through one track; nothing is dropped, and
    /// every id is back when the zones are closed.
    #[test]
    fn query_ids_recycle_through_the_sink() {
        let sink = TracySink::new();
        let track = sink.register_gpu_track("cuhal tracy test", 0).unwrap();
        let mut t = 1_000u64;
        for _ in 0..40_000 {
            sink.gpu_zone_begin(track, "outer", t);
            sink.gpu_zone_begin(track, "inner", t + 1);
            sink.gpu_zone_end(track, t + 2);
            sink.gpu_zone_end(track, t + 3);
            t += 10;
        }
        assert_eq!(sink.dropped_for_query_ids(), 0);
        let tracks = lock(&sink.tracks);
        assert_eq!(tracks[0].ids.outstanding(), 0);
        assert!(tracks[0].open.is_empty());
    }
}
