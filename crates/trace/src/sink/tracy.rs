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
    sent: std::sync::atomic::AtomicU64,
}

impl TracySink {
    /// Starts the Tracy client (if not already running).
    pub fn new() -> Self {
        Self {
            client: Client::start(),
            tracks: Mutex::new(Vec::new()),
            dropped_for_ids: std::sync::atomic::AtomicU64::new(0),
            sent: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Zones sent to Tracy whole (begin and end uploaded).
    pub fn zones_sent(&self) -> u64 {
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
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
            self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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

    /// Tracy gets the same GPU zones as any other sink: a submission's and its command buffer's
    /// (through the default `submission_begin` and `command_buffer_begin`), and FINE command
    /// zones made from CUPTI activity records (here the fake CUPTI's).
    #[test]
    fn tracy_gets_the_same_zones_as_memory_including_cupti_ones() {
        use std::sync::Arc;

        use crate::cupti::fake::FakeCupti;
        use crate::cupti::ffi::cbid;
        use crate::fake::FakeGpu;
        use crate::{
            CuptiChoice, Fanout, FineSource, HostSpan, MemorySink, SubmissionDetails, TraceConfig,
            TraceContext, Verbosity,
        };

        let fake = FakeCupti::install();
        // CUPTI's clock reads this when the fake GPU's reads 1 ms.
        const CUPTI_AT_1MS: u64 = 50_000_000_000;
        let to_cupti = |ns: u64| ns - 1_000_000 + CUPTI_AT_1MS;
        fake.set_timestamp(Some(CUPTI_AT_1MS));
        let gpu = FakeGpu::new();
        let memory = Arc::new(MemorySink::new());
        let tracy = Arc::new(TracySink::new());
        let sink = Arc::new(Fanout::new(vec![memory.clone(), tracy.clone()]));
        let config = TraceConfig {
            cupti: CuptiChoice::Api {
                api: fake.api(),
                required: true,
            },
            ..TraceConfig::new(Verbosity::Fine, "tracy queue")
        };
        let trace = TraceContext::with_backend(gpu.clone(), config, sink.clone()).unwrap();
        assert_eq!(trace.stats().fine_source, FineSource::Cupti);
        let list = trace.zone_list().unwrap();
        let begin = list.begin_zone("group").unwrap();
        assert!(
            list.command_zone("saxpy", cuhal_command::EventPlacement::Graph)
                .by_activity
        );
        let end = list.end_zone().unwrap();
        list.will_issue();
        let saxpy = fake.launch(cbid::LAUNCH_KERNEL);
        drop(list.on_submit());
        gpu.complete_at(begin, 2_000_000);
        gpu.complete_at(end, 2_100_000);
        fake.complete_kernel(saxpy, to_cupti(2_010_000), to_cupti(2_050_000), 0);
        assert_eq!(trace.collect(), 2);
        assert_eq!(trace.stats().activity_zones, 1, "one zone from CUPTI");

        // A submission's and a command buffer's zones, as a queue's collection sends them.
        let track = trace.track().unwrap();
        let details = SubmissionDetails {
            queue: "tracy queue",
            ordinal: 1,
            waits: &[],
            signals: &[(1, 1)],
            command_buffers: &["graph command buffer"],
            device_wait_ns: None,
            host: HostSpan {
                thread: 1,
                thread_name: None,
                issuing_thread: 1,
                submitted_ns: 2_200_000,
                issue_begin_ns: 2_200_000,
                issue_end_ns: 2_210_000,
            },
            flow: 1,
            fine_sample: None,
        };
        sink.submission_begin(track, "submission", 2_300_000, &details);
        sink.command_buffer_begin(track, "graph command buffer", 2_300_000, 1, 0);
        sink.gpu_zone_end(track, 2_400_000);
        sink.gpu_zone_end(track, 2_400_000);

        let names: Vec<String> = memory.zones().into_iter().map(|z| z.name).collect();
        assert_eq!(
            names,
            ["group", "saxpy", "submission", "graph command buffer"]
        );
        assert_eq!(tracy.zones_sent(), names.len() as u64);
        assert_eq!(tracy.dropped_for_query_ids(), 0);
    }
}
