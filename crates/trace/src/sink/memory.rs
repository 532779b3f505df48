//! An in-memory sink, for tests: keeps every call, and pairs begins with ends.

use std::sync::Mutex;

use super::{DropReason, FineSample, Sink, SubmissionDetails, TrackId};
use crate::Error;
use crate::clock_sync::ClockSnapshot;
use crate::lock::lock;
use crate::thread::thread_id;

/// One call a [`MemorySink`] received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemoryRecord {
    /// [`Sink::register_gpu_track`].
    Track {
        /// The track handed out.
        track: TrackId,
        /// Its name.
        name: String,
    },
    /// [`Sink::gpu_zone_begin`].
    Begin {
        /// The track.
        track: TrackId,
        /// The zone's name.
        name: String,
        /// Trace-clock nanoseconds.
        ns: u64,
    },
    /// [`Sink::gpu_zone_end`].
    End {
        /// The track.
        track: TrackId,
        /// Trace-clock nanoseconds.
        ns: u64,
    },
    /// [`Sink::gpu_zone_stamped`]: a whole zone timed by the kernel's own stamps.
    Stamped {
        /// The track.
        track: TrackId,
        /// The zone's name.
        name: String,
        /// Trace-clock nanoseconds.
        begin_ns: u64,
        /// Trace-clock nanoseconds.
        end_ns: u64,
    },
    /// [`Sink::zones_dropped`].
    Dropped {
        /// The track.
        track: TrackId,
        /// Why.
        reason: DropReason,
        /// How many.
        count: u64,
    },
    /// [`Sink::cpu_zone`].
    Cpu {
        /// The zone's name.
        name: String,
        /// The thread ([`crate::thread_id`]).
        thread: u64,
        /// Trace-clock nanoseconds.
        begin_ns: u64,
        /// Trace-clock nanoseconds.
        end_ns: u64,
    },
}

/// A GPU zone reassembled from a begin and its end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryZone {
    /// The track.
    pub track: TrackId,
    /// The zone's name.
    pub name: String,
    /// Trace-clock nanoseconds.
    pub begin_ns: u64,
    /// Trace-clock nanoseconds.
    pub end_ns: u64,
    /// How many zones of the same track were open around it.
    pub depth: usize,
    /// Timed by the kernel's own stamps ([`Sink::gpu_zone_stamped`]), not by events or CUPTI.
    pub stamped: bool,
}

impl MemoryZone {
    /// `end_ns - begin_ns`.
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.begin_ns)
    }
}

/// A submission's details as a [`MemorySink`] received them ([`Sink::submission_begin`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemorySubmission {
    /// The GPU track.
    pub track: TrackId,
    /// The queue's name.
    pub queue: String,
    /// The ordinal in its queue.
    pub ordinal: u64,
    /// Waits as (semaphore id, value).
    pub waits: Vec<(u64, u64)>,
    /// Signals as (semaphore id, value).
    pub signals: Vec<(u64, u64)>,
    /// Command buffer labels.
    pub command_buffers: Vec<String>,
    /// How long the GPU waited on other queues' work before starting it, if it did.
    pub device_wait_ns: Option<u64>,
    /// The submitting thread.
    pub thread: u64,
    /// The thread that issued it.
    pub issuing_thread: u64,
    /// The flow id linking host and GPU zones.
    pub flow: u64,
    /// When its GPU zone begins.
    pub begin_ns: u64,
    /// When the queue took it.
    pub submitted_ns: u64,
    /// Whether its command zones were sampled ([`SubmissionDetails::fine_sample`]).
    pub fine_sample: Option<FineSample>,
}

/// A sink that keeps everything in memory.
#[derive(Debug, Default)]
pub struct MemorySink {
    records: Mutex<Vec<MemoryRecord>>,
    tracks: Mutex<u32>,
    submissions: Mutex<Vec<MemorySubmission>>,
    snapshots: Mutex<Vec<(TrackId, ClockSnapshot)>>,
}

impl MemorySink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// The clock snapshots received so far ([`Sink::clock_snapshot`]), in order, with their
    /// tracks.
    pub fn clock_snapshots(&self) -> Vec<(TrackId, ClockSnapshot)> {
        lock(&self.snapshots).clone()
    }

    /// Every call so far, in order (clock snapshots apart: [`MemorySink::clock_snapshots`]).
    pub fn records(&self) -> Vec<MemoryRecord> {
        lock(&self.records).clone()
    }

    /// Forgets everything received so far.
    pub fn clear(&self) {
        lock(&self.records).clear();
        lock(&self.submissions).clear();
        lock(&self.snapshots).clear();
    }

    /// The details of every submission received so far, in order.
    pub fn submissions(&self) -> Vec<MemorySubmission> {
        lock(&self.submissions).clone()
    }

    /// The GPU zones received so far, in the order they began; a begin still open is left out.
    pub fn zones(&self) -> Vec<MemoryZone> {
        let records = lock(&self.records);
        let mut zones: Vec<Option<MemoryZone>> = Vec::new();
        // Per track, the indices (into `zones`) of open zones.
        let mut open: Vec<(TrackId, Vec<usize>)> = Vec::new();
        let mut built: Vec<(TrackId, String, u64, usize)> = Vec::new();
        for r in records.iter() {
            match r {
                MemoryRecord::Begin { track, name, ns } => {
                    let stack = match open.iter_mut().find(|(t, _)| t == track) {
                        Some((_, s)) => s,
                        None => {
                            open.push((*track, Vec::new()));
                            &mut open.last_mut().expect("just pushed").1
                        }
                    };
                    built.push((*track, name.clone(), *ns, stack.len()));
                    zones.push(None);
                    stack.push(built.len() - 1);
                }
                MemoryRecord::End { track, ns } => {
                    let Some((_, stack)) = open.iter_mut().find(|(t, _)| t == track) else {
                        continue;
                    };
                    let Some(i) = stack.pop() else { continue };
                    let (track, name, begin_ns, depth) = built[i].clone();
                    zones[i] = Some(MemoryZone {
                        track,
                        name,
                        begin_ns,
                        end_ns: *ns,
                        depth,
                        stamped: false,
                    });
                }
                MemoryRecord::Stamped {
                    track,
                    name,
                    begin_ns,
                    end_ns,
                } => {
                    let depth = open
                        .iter()
                        .find(|(t, _)| t == track)
                        .map_or(0, |(_, s)| s.len());
                    built.push((*track, name.clone(), *begin_ns, depth));
                    zones.push(Some(MemoryZone {
                        track: *track,
                        name: name.clone(),
                        begin_ns: *begin_ns,
                        end_ns: *end_ns,
                        depth,
                        stamped: true,
                    }));
                }
                _ => {}
            }
        }
        zones.into_iter().flatten().collect()
    }

    /// Zones dropped for `reason`, over all tracks.
    pub fn dropped(&self, reason: DropReason) -> u64 {
        lock(&self.records)
            .iter()
            .map(|r| match r {
                MemoryRecord::Dropped {
                    reason: r, count, ..
                } if *r == reason => *count,
                _ => 0,
            })
            .sum()
    }

    /// Begins minus ends on `track`: zero when every zone is closed.
    pub fn open_zones(&self, track: TrackId) -> i64 {
        lock(&self.records)
            .iter()
            .map(|r| match r {
                MemoryRecord::Begin { track: t, .. } if *t == track => 1,
                MemoryRecord::End { track: t, .. } if *t == track => -1,
                _ => 0,
            })
            .sum()
    }
}

impl Sink for MemorySink {
    fn register_gpu_track(&self, name: &str, _now_ns: u64) -> Result<TrackId, Error> {
        let track = {
            let mut n = lock(&self.tracks);
            *n += 1;
            TrackId(*n - 1)
        };
        lock(&self.records).push(MemoryRecord::Track {
            track,
            name: name.to_owned(),
        });
        Ok(track)
    }

    fn gpu_zone_begin(&self, track: TrackId, name: &str, timestamp_ns: u64) {
        lock(&self.records).push(MemoryRecord::Begin {
            track,
            name: name.to_owned(),
            ns: timestamp_ns,
        });
    }

    fn submission_begin(
        &self,
        track: TrackId,
        name: &str,
        timestamp_ns: u64,
        details: &SubmissionDetails<'_>,
    ) {
        lock(&self.submissions).push(MemorySubmission {
            track,
            queue: details.queue.to_owned(),
            ordinal: details.ordinal,
            waits: details.waits.to_vec(),
            signals: details.signals.to_vec(),
            command_buffers: details
                .command_buffers
                .iter()
                .map(|l| (*l).to_owned())
                .collect(),
            device_wait_ns: details.device_wait_ns,
            thread: details.host.thread,
            issuing_thread: details.host.issuing_thread,
            flow: details.flow,
            begin_ns: timestamp_ns,
            submitted_ns: details.host.submitted_ns,
            fine_sample: details.fine_sample,
        });
        self.gpu_zone_begin(track, name, timestamp_ns);
    }

    fn gpu_zone_end(&self, track: TrackId, timestamp_ns: u64) {
        lock(&self.records).push(MemoryRecord::End {
            track,
            ns: timestamp_ns,
        });
    }

    fn gpu_zone_stamped(&self, track: TrackId, name: &str, begin_ns: u64, end_ns: u64) {
        lock(&self.records).push(MemoryRecord::Stamped {
            track,
            name: name.to_owned(),
            begin_ns,
            end_ns,
        });
    }

    fn zones_dropped(&self, track: TrackId, reason: DropReason, count: u64) {
        lock(&self.records).push(MemoryRecord::Dropped {
            track,
            reason,
            count,
        });
    }

    fn clock_snapshot(&self, track: TrackId, snapshot: &ClockSnapshot) {
        lock(&self.snapshots).push((track, *snapshot));
    }

    fn cpu_zone(&self, name: &str, begin_ns: u64, end_ns: u64) {
        lock(&self.records).push(MemoryRecord::Cpu {
            name: name.to_owned(),
            thread: thread_id(),
            begin_ns,
            end_ns,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zones_pair_per_track_with_depth() {
        let s = MemorySink::new();
        let a = s.register_gpu_track("a", 0).unwrap();
        let b = s.register_gpu_track("b", 0).unwrap();
        assert_ne!(a, b);
        s.gpu_zone_begin(a, "outer", 10);
        s.gpu_zone_begin(b, "other", 11);
        s.gpu_zone_begin(a, "inner", 12);
        s.gpu_zone_end(a, 13);
        s.gpu_zone_end(b, 14);
        s.gpu_zone_end(a, 20);
        s.gpu_zone_begin(a, "open", 30);
        s.zones_dropped(a, DropReason::PoolExhausted, 3);
        s.zones_dropped(b, DropReason::PoolExhausted, 2);
        let z = s.zones();
        let names: Vec<_> = z
            .iter()
            .map(|z| (z.name.as_str(), z.depth, z.begin_ns, z.end_ns))
            .collect();
        assert_eq!(
            names,
            [
                ("outer", 0, 10, 20),
                ("other", 0, 11, 14),
                ("inner", 1, 12, 13)
            ]
        );
        assert_eq!(s.dropped(DropReason::PoolExhausted), 5);
        assert_eq!(s.dropped(DropReason::Superseded), 0);
        assert_eq!(s.open_zones(a), 1);
        assert_eq!(s.open_zones(b), 0);
    }
}
