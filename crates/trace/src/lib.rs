//! GPU timestamp zones for cuhal queues, collected after the work completes.
//!
//! The story of a zone, after IREE's CUDA tracing (`tracing.c`, and the change that moved its
//! collection after command-buffer completion), with IREE's defects fixed:
//!
//! 1. Each queue owns a [`TraceContext`] with a [`Verbosity`] chosen at creation. At `Off` it
//!    holds nothing and does nothing: no events, no locks.
//! 2. Each command buffer gets a [`ZoneList`] ([`TraceContext::recorder`]), the
//!    [`ZoneRecorder`] of `cuhal-command`. A zone takes a begin and an end timing event from the
//!    context's [`pool`](TimingEventPool); the command buffer records them on its stream
//!    (`cuEventRecord`) or into its graph (`cuGraphAddEventRecordNode`). The pool grows on demand
//!    up to a cap; past it, zones are dropped and counted, never a crash (IREE dereferenced an
//!    empty free list).
//! 3. A queue issues each submission through [`TraceContext::submit`], its one tracing call:
//!    the issue is a closure the entry calls per [`IssueStep`], the entry keeps the submission's
//!    host side and details in a recycled slot, and the queue's one cleanup runs
//!    [`TraceContext::collect`] on its completion thread after the submission completed (never
//!    in a driver callback). At COARSE the submission's and command buffers' zones come from
//!    the queue's completion event, with no GPU work of their own. Collection turns events into
//!    times (`cuEventElapsedTime`) and hands zones to a [`Sink`], nested submission, command
//!    buffer, recorded zones; a submission whose work is not complete stays queued. A list used
//!    on its own is queued by [`ZoneList::on_submit`], whose collector does the same. A list's
//!    events return to the pool when the command buffer is dropped and no submission of it is
//!    left to collect.
//! 4. Times are trace-clock nanoseconds ([`clock`]). The context calibrates a base event against
//!    the host clock through the GPU's `%globaltimer` ([`clock_sync`]: a clock exchange over
//!    mapped memory, and the base recorded between two kernels that stamp the timer; a host
//!    bracket around the base when that fails), tells the sink ([`ClockSnapshot`]), and
//!    re-calibrates when the base is older than 8 s, so the `f32`
//!    milliseconds of `cuEventElapsedTime` span about that much at most (more only for work
//!    that ran longer itself) and a time's step stays under 0.5 us at any uptime (IREE measured from one start-up base: a 0.25 ms step after an
//!    hour). The arithmetic lives in [`timebase`].
//! 5. At FINE, commands are timed from CUPTI's activity records when CUPTI can be had
//!    ([`mod@cupti`], [`CuptiChoice`]): no events around them, so no extra graph nodes; the
//!    launches of each issue are captured and matched to the records at collection. Without
//!    CUPTI, FINE falls back to events and says so ([`TraceStats::cupti_unavailable`]).
//!    A dispatch whose kernel stamps itself (`include/cuhal_zone_stamp.cuh`,
//!    `KernelArgs::push_zone_stamp`) is timed by its own `%globaltimer` readings instead
//!    ([`ZoneList::stamp_zone`]): no events, no activity record. Each submitted command buffer
//!    with stamps gets a region of the context's stamp ring ([`TraceConfig::stamp_slots`]),
//!    bound at its hidden stamp slot; collection reads it back, zeroes it and gives it back.
//!    A full ring binds discard memory and counts the stamps as dropped.
//! 6. Sinks: [`MemorySink`] for tests, [`JsonSink`] for Chrome/Perfetto trace-event JSON, and
//!    with the `tracy` feature `TracySink`, which uses Tracy's manual GPU API with its `u16` query
//!    ids recycled safely ([`query_ids`]) whatever the pool's size.
//!
//! ```
//! use std::sync::Arc;
//! use cuhal_trace::{fake::FakeGpu, MemorySink, TraceConfig, TraceContext, Verbosity};
//!
//! let gpu = FakeGpu::new();
//! let sink = Arc::new(MemorySink::new());
//! let trace = TraceContext::with_backend(gpu.clone(), TraceConfig::new(Verbosity::Coarse, "queue 0"), sink.clone())?;
//! let list = trace.zone_list().expect("tracing is on");
//! let begin = list.begin_zone("dispatch").unwrap();
//! let end = list.end_zone().unwrap();
//! gpu.complete_at(begin, 5_000_000);
//! gpu.complete_at(end, 5_040_000);
//! let collector = list.on_submit().unwrap();
//! collector(); // on the completion thread, after the submission completed
//! assert_eq!(sink.zones()[0].duration_ns(), 40_000);
//! # Ok::<(), cuhal_trace::Error>(())
//! ```

mod backend;
pub mod clock;
pub mod clock_sync;
mod context;
mod cpu_zone;
pub mod cupti;
mod error;
mod exchange;
pub mod fake;
mod hook;
mod list;
mod lock;
mod pool;
pub mod query_ids;
pub mod sink;
mod stamped;
mod stamps;
mod submission;
mod thread;
pub mod timebase;

pub use backend::{CudaEvents, EventBackend};
pub use clock_sync::{ClockSnapshot, ClockSource, ClockSync};
pub use context::{
    BIAS_SPIN_NS, BIAS_TRIALS, BUDGET_FIRST_ONE_IN, CuptiChoice, DropCounts, EXCHANGE_ROUNDS,
    EXCHANGE_TIMEOUT, EventBias, FineSampling, FineSource, MAX_ONE_IN, TraceConfig, TraceContext,
    TraceStats,
};
pub use cpu_zone::CpuZone;
pub use error::Error;
pub use hook::{Verbosity, ZoneInfo, ZoneRecorder};
pub use list::ZoneList;
pub use pool::{PoolCounts, PoolLimits, TimingEventPool};
#[cfg(feature = "tracy")]
pub use sink::TracySink;
pub use sink::{
    DropReason, Fanout, FineSample, HostSpan, JsonSink, MemoryRecord, MemorySink, MemorySubmission,
    MemoryZone, NullSink, Sink, SubmissionDetails, TrackId,
};
pub use stamped::StampedKernel;
pub use stamps::DEFAULT_STAMP_SLOTS;
pub use submission::{
    INLINE_SEMAPHORES, IssueStep, StreamBefore, SubmissionInfo, SubmissionTicket,
};
pub use thread::thread_id;
#[cfg(test)]
mod clock_tests;
#[cfg(test)]
mod tests;

/// The README's examples, compiled (and run where they need no GPU) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
