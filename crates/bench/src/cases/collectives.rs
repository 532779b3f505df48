//! Case 13, collectives and peers over two GPUs (says "skipped: needs 2 GPUs" on one, and
//! "skipped: no NCCL" without NCCL).
//!
//! All-reduce (`f32`, max, in place, both GPUs of one process) from 8 B to 1 GiB, time per
//! collective averaged over back-to-back collectives (as nccl-tests times them), three ways in
//! turns per size:
//! - floor: raw NCCL in the same process: `ncclCommInitAll` communicators, every rank's
//!   `ncclAllReduce` in one group on raw streams, `cuStreamSynchronize` after the last;
//! - cuhal queue operation: `Communicator::submit`, one signal each, a host wait on the last
//!   that spins like the floor's `cuStreamSynchronize` (not the device's default spin-then-park
//!   wait, whose wake-up latency is the completion side's, not the collectives');
//! - cuhal graph command buffer: a `CollectiveCommandBuffers` set holding the all-reduce,
//!   replayed with `Communicator::execute`;
//! - reference: the floor plus the join cuhal issues after each collective (rank 1's end
//!   recorded, rank 0's stream waiting for it, a completion event recorded): the queue
//!   operation against it is what the scheduler adds, and the floor against it what one
//!   completion event over both GPUs costs.
//!
//! Bus bandwidth is `2 (n - 1) / n * bytes / time` (n = 2), printed in the row's name at the
//! median. Goals: at >= 64 MiB the queue operation within 1/0.95 of the floor's time (>= 95% of
//! its bus bandwidth); at 8 B the queue operation <= floor + 2 us and the graph replay <= the
//! floor.
//!
//! Peer copy: 256 MiB from GPU 0 to GPU 1, `Queue::copy_peer` against raw `cuMemcpyPeerAsync`
//! on a stream of GPU 0, back to back; goal >= 95% of the raw bandwidth.
//!
//! Cross-device wait gap, on one clock: round trips A (GPU 0) -> B (GPU 1) -> C (GPU 0), gap
//! per hop `(C.start - A.end - (B.end - B.start)) / 2`, cuhal queues and semaphores against raw
//! graphs with `cuStreamWaitEvent` across the devices' streams, and against the same round trip
//! with B on GPU 0's second queue; goal: cuhal's cross-device gap at most its same-GPU gap
//! + 1 us (see `cross_device_gap`).

use std::cell::Cell;
use std::sync::Arc;

use anyhow::{Context as _, Result, bail};
use cuhal::{
    CollectiveCommandBuffers, CollectivePart, CommandBufferMode, Communicator, CommunicatorOptions,
    Device, DeviceOptions, Driver, FillPattern, Nccl, NcclDataType, NcclRedOp, Semaphore,
};
use cuhal_semaphore::SemaphoreOptions;
use cuhal_sys::{
    CU_EVENT_DISABLE_TIMING, CU_STREAM_NON_BLOCKING, CU_STREAM_WAIT_VALUE_GEQ, Event, NcclApi,
    NcclComm, Stream, cu,
};

use super::{Env, progress, summarize};
use crate::gpu::ptx;
use crate::gpu::raw::Args;
use crate::hal::WAIT;
use crate::report::{Center, Comparison, Goal, Report};

/// The sizes measured, in bytes.
pub const SIZES: [usize; 8] = [
    8,
    64 << 10,
    1 << 20,
    16 << 20,
    64 << 20,
    256 << 20,
    512 << 20,
    1 << 30,
];
/// The peer copy's size.
pub const PEER_COPY: usize = 256 << 20;
/// Bandwidth goal: cuhal's time at most the floor's over this.
pub const BANDWIDTH_SHARE: f64 = 0.95;
/// Latency goal of the queue operation at 8 B: at most the floor plus this (ns).
pub const LATENCY_ADDED_NS: f64 = 2000.0;
/// The completion side's error polling of the comparison row that polls rarely.
const RARE_POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// Collectives per sample and samples, by size.
fn reps(env: &Env<'_>, bytes: usize) -> (usize, usize) {
    let (per, samples) = match bytes {
        b if b <= 1 << 20 => (50, 20),
        b if b <= 64 << 20 => (10, 10),
        _ => (3, 6),
    };
    (per, if env.quick { 3 } else { samples })
}

/// Bus bandwidth in GB/s of an all-reduce of `bytes` over two ranks taking `ns`.
fn bus_gbs(bytes: usize, ns: f64) -> f64 {
    bytes as f64 / ns
}

fn size_name(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// Raw NCCL: one communicator per GPU, made with `ncclCommInitAll`, and a raw stream each.
struct Raw {
    api: Arc<NcclApi>,
    comms: [NcclComm; 2],
    streams: [Stream; 2],
    /// For the reference with cuhal's join: recorded on rank 1's stream after each group.
    joined: Event,
    /// For the reference with cuhal's join: recorded on rank 0's stream after the join.
    completion: Event,
    /// Set if a join call failed outside rank 1's context (as cuhal does, it is then made
    /// inside it, from then on).
    enter_rank1: Cell<bool>,
}

impl Raw {
    fn new(api: Arc<NcclApi>, devices: &[Device]) -> Result<Self> {
        let mut comms: [NcclComm; 2] = [std::ptr::null_mut(); 2];
        let list = [devices[0].info().ordinal, devices[1].info().ordinal];
        // SAFETY: room for two handles; a list of two device ordinals.
        unsafe { cuhal_sys::nccl!(api, ncclCommInitAll(comms.as_mut_ptr(), 2, list.as_ptr())) }?;
        let streams = [
            Stream::new(devices[0].context(), CU_STREAM_NON_BLOCKING)?,
            Stream::new(devices[1].context(), CU_STREAM_NON_BLOCKING)?,
        ];
        Ok(Self {
            api,
            comms,
            streams,
            joined: Event::new(devices[1].context(), CU_EVENT_DISABLE_TIMING)?,
            completion: Event::new(devices[0].context(), CU_EVENT_DISABLE_TIMING)?,
            enter_rank1: Cell::new(false),
        })
    }

    /// The join cuhal adds to each collective's issue: rank 1's end recorded, rank 0's stream
    /// waiting for it, a completion event recorded on rank 0's stream.
    fn join(&self, devices: &[Device]) -> Result<()> {
        let record = || self.joined.record(&self.streams[1]);
        if self.enter_rank1.get() {
            let _bound = devices[1].context().enter()?;
            record()?;
        } else if record().is_err() {
            let _bound = devices[1].context().enter()?;
            record()?;
            self.enter_rank1.set(true);
        }
        self.streams[0].wait_event(&self.joined)?;
        self.completion.record(&self.streams[0])?;
        Ok(())
    }

    /// `count` all-reduces in place over `ptrs`, each rank's in one group, then a wait. Returns
    /// the host time of the issuing loop (before the wait), in ns on `clock`.
    fn all_reduce(
        &self,
        devices: &[Device],
        ptrs: [u64; 2],
        elements: usize,
        count: usize,
        with_join: bool,
        clock: &crate::clock::Clock,
    ) -> Result<u64> {
        let api = &self.api;
        let t0 = clock.now_ns();
        for _ in 0..count {
            // SAFETY: the group is ended below; the buffers hold `elements` floats on their
            // rank's device; the streams and communicators are live.
            unsafe {
                (api.ncclGroupStart)();
                for ((ptr, comm), stream) in ptrs.iter().zip(self.comms).zip(&self.streams) {
                    let p = *ptr as usize as *mut std::ffi::c_void;
                    (api.ncclAllReduce)(
                        p,
                        p,
                        elements,
                        NcclDataType::F32,
                        NcclRedOp::Max,
                        comm,
                        stream.raw(),
                    );
                }
                let r = (api.ncclGroupEnd)();
                if r != cuhal_sys::NCCL_SUCCESS {
                    bail!("raw ncclGroupEnd failed ({r})");
                }
            }
            if with_join {
                self.join(devices)?;
            }
        }
        let issued = clock.now_ns() - t0;
        for (device, stream) in devices.iter().zip(&self.streams) {
            let _bound = device.context().enter()?;
            stream.synchronize()?;
        }
        Ok(issued)
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        for comm in self.comms {
            // SAFETY: live communicators whose work was waited for.
            let _ = unsafe { (self.api.ncclCommDestroy)(comm) };
        }
    }
}

/// Runs case 13.
pub fn run(env: &Env<'_>, report: &mut Report) -> Result<()> {
    let driver = Driver::load()?;
    let count = driver.devices()?.len();
    if count < 2 {
        report.notes.push(format!(
            "case 13 (collectives): skipped: needs 2 GPUs ({count} found)"
        ));
        progress("case 13 (collectives): skipped: needs 2 GPUs");
        return Ok(());
    }
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        // SAFETY: set before NCCL is loaded (below) and read only by NCCL; the bench writes the
        // environment nowhere else while cases run.
        unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    }
    let nccl = match Nccl::load(None) {
        Ok(nccl) => nccl,
        Err(e) => {
            report
                .notes
                .push(format!("case 13 (collectives): skipped: no NCCL ({e})"));
            return Ok(());
        }
    };
    report.fact(
        "NCCL",
        format!(
            "{} ({})",
            cuhal_sys::format_nccl_version(nccl.version()),
            nccl.library_path()
        ),
    );
    // Two queues each: the same-GPU reference of the cross-device gap uses GPU 0's second.
    let devices = driver.open_many(
        &[0, 1],
        DeviceOptions {
            queues: 2,
            ..DeviceOptions::default()
        },
    )?;
    let comm = Communicator::local(
        &nccl,
        &[&devices[0], &devices[1]],
        CommunicatorOptions::default(),
    )?;
    let api = Arc::new(NcclApi::load(Some(nccl.library_path().into()))?);
    let raw = Raw::new(api, &devices)?;
    let largest = *SIZES.last().unwrap_or(&8);
    let bufs = [
        devices[0].create_buffer(largest)?,
        devices[1].create_buffer(largest)?,
    ];
    for (rank, (device, buffer)) in devices.iter().zip(&bufs).enumerate() {
        let done = device.create_semaphore(0);
        device.queue(0).fill(
            &[],
            &[(&done, 1)],
            &buffer.whole(),
            FillPattern::U32((rank as f32 + 1.0).to_bits()),
        )?;
        done.wait(1, WAIT)?;
    }
    // The host waits like the floor's: `cuStreamSynchronize` spins for the whole batch, so the
    // cuhal rows wait on a semaphore whose event spin outlasts it. The device's default wait
    // (spin `completion_policy::HOST_WAIT_SPIN`, then park until the completion side, which naps between polls,
    // or the waiter's own look at its event, 50 us to 1 ms apart, sees the last collective end)
    // adds up to a nap to every batch: at 64 MiB, batches of 10
    // collectives of ~0.3 ms, that alone is a few percent of bus bandwidth that is not the
    // collectives' time.
    let done = Semaphore::with_options(0, SemaphoreOptions::new().with_event_spin(WAIT));
    let mut value = 0u64;
    let sizes: &[usize] = if env.quick { &SIZES[..4] } else { &SIZES };
    for &bytes in sizes {
        let elements = bytes / 4;
        let ranges = [bufs[0].range(0, bytes)?, bufs[1].range(0, bytes)?];
        let parts = |_: ()| {
            [
                CollectivePart::all_reduce(
                    &ranges[0],
                    &ranges[0],
                    elements,
                    NcclDataType::F32,
                    NcclRedOp::Max,
                ),
                CollectivePart::all_reduce(
                    &ranges[1],
                    &ranges[1],
                    elements,
                    NcclDataType::F32,
                    NcclRedOp::Max,
                ),
            ]
        };
        let queues = [devices[0].queue(0), devices[1].queue(0)];
        let mut set = CollectiveCommandBuffers::new(&comm, &queues, CommandBufferMode::Graph)?;
        set.collective(&parts(()))?;
        set.end()
            .context("recording the all-reduce into a graph set")?;
        let (per, samples) = reps(env, bytes);
        progress(&format!(
            "case 13 (collectives): all-reduce {}: raw NCCL, queue operation, graph set, raw NCCL + join, {samples} x {per} each",
            size_name(bytes)
        ));
        let ptrs = [ranges[0].device_ptr(), ranges[1].device_ptr()];
        let mut times: [Vec<f64>; 4] = Default::default();
        // Host time of the issuing loops, per collective: the queue operation's and the raw
        // group calls' with the join.
        let mut issuing: [Vec<f64>; 2] = Default::default();
        let stats_before = comm.stats();
        // Warm-up, then turns.
        for sample in 0..=samples {
            for turn in 0..4 {
                let variant = (sample + turn) % 4;
                let t0 = env.clock.now_ns();
                match variant {
                    0 => {
                        raw.all_reduce(&devices, ptrs, elements, per, false, &env.clock)?;
                    }
                    1 => {
                        for _ in 0..per {
                            value += 1;
                            let s = [(&done, value)];
                            let [p0, p1] = parts(());
                            comm.submit(&[p0.signals(&s), p1])?;
                        }
                        if sample > 0 {
                            issuing[0].push((env.clock.now_ns() - t0) as f64 / per as f64);
                        }
                        done.wait(value, WAIT)?;
                    }
                    2 => {
                        for _ in 0..per {
                            value += 1;
                            comm.execute(&set, &[], &[(&done, value)])?;
                        }
                        done.wait(value, WAIT)?;
                    }
                    _ => {
                        let issued =
                            raw.all_reduce(&devices, ptrs, elements, per, true, &env.clock)?;
                        if sample > 0 {
                            issuing[1].push(issued as f64 / per as f64);
                        }
                    }
                }
                let ns = (env.clock.now_ns() - t0) as f64 / per as f64;
                if sample > 0 {
                    times[variant].push(ns);
                }
            }
        }
        if bytes == 8 {
            let after = comm.stats();
            report.notes.push(format!(
                "case 13, all-reduce 8 B: the communicator's queue over these rows: {} submitted, \
                 {} issued on submit, {} by its worker, {} retired in {} batches, {} completion \
                 parks, {} worker parks",
                after.submitted - stats_before.submitted,
                after.issued_on_submit - stats_before.issued_on_submit,
                after.issued_by_worker - stats_before.issued_by_worker,
                after.retired() - stats_before.retired(),
                after.retire_batches - stats_before.retire_batches,
                after.completion_parks - stats_before.completion_parks,
                after.worker_parks - stats_before.worker_parks,
            ));
            let [queue_i, joined_i] = issuing.map(|mut t| summarize("issuing", &mut t));
            report.comparisons.push(Comparison::new(
                "13",
                "all-reduce 8 B, host time per collective of the issuing loop (before the wait): \
                 Communicator::submit against raw group calls + cuhal's join, for comparison",
                Some(queue_i?),
                Some(joined_i?),
                Goal::Report,
            ));
        }
        let [raw_t, queue_t, graph_t, joined_t] =
            times.map(|mut t| summarize("all-reduce", &mut t));
        let (raw_t, queue_t, graph_t, joined_t) = (raw_t?, queue_t?, graph_t?, joined_t?);
        // Every variant ran: max over (1, 2) is 2 everywhere.
        for (device, buffer) in devices.iter().zip(&bufs) {
            let host = device.create_host_buffer(4)?;
            let read = device.create_semaphore(0);
            device
                .queue(0)
                .read(&[], &[(&read, 1)], &buffer.range(0, 4)?, &host, 0)?;
            read.wait(1, WAIT)?;
            let mut word = [0u8; 4];
            host.read(0, &mut word)?;
            if f32::from_le_bytes(word) != 2.0 {
                bail!(
                    "the all-reduce of {} left {} on GPU {}",
                    size_name(bytes),
                    f32::from_le_bytes(word),
                    device.info().ordinal
                );
            }
        }
        let bw = |s: &crate::stats::Summary| bus_gbs(bytes, s.median);
        let name = size_name(bytes);
        let goal = if bytes >= 64 << 20 {
            Goal::RatioAtMost(1.0 / BANDWIDTH_SHARE)
        } else if bytes == 8 {
            Goal::AddedAtMost(LATENCY_ADDED_NS)
        } else {
            Goal::Report
        };
        report.comparisons.push(Comparison::new(
            "13",
            format!(
                "all-reduce {name}, queue operation: time per collective (bus {:.1} GB/s; raw NCCL {:.1} GB/s)",
                bw(&queue_t),
                bw(&raw_t)
            ),
            Some(queue_t),
            Some(raw_t),
            goal,
        ));
        report.comparisons.push(Comparison::new(
            "13",
            format!(
                "all-reduce {name}, graph command-buffer set replay: time per collective (bus {:.1} GB/s; raw NCCL {:.1} GB/s)",
                bw(&graph_t),
                bw(&raw_t)
            ),
            Some(graph_t),
            Some(raw_t),
            if bytes == 8 { Goal::RatioAtMost(1.0) } else { Goal::Report },
        ));
        report.comparisons.push(Comparison::new(
            "13",
            format!(
                "all-reduce {name}, queue operation against raw NCCL + cuhal's join (cuEventRecord \
                 on rank 1, cuStreamWaitEvent on rank 0, cuEventRecord): what the scheduler adds \
                 (bus {:.1} GB/s; raw + join {:.1} GB/s)",
                bw(&queue_t),
                bw(&joined_t)
            ),
            Some(queue_t),
            Some(joined_t),
            Goal::Report,
        ));
    }
    drop(raw);
    latency_variants(env, &nccl, &devices, &comm, &bufs, report)?;
    peer_copy(env, &devices, report)?;
    cross_device_gap(env, &devices, report)?;
    Ok(())
}

/// The 8 B all-reduce as a queue operation, against variants that each leave one part of
/// cuhal's work out, to place its cost: a communicator whose completion side polls NCCL's
/// asynchronous errors only every 10 ms, and batches that signal a semaphore only on their last
/// collective.
fn latency_variants(
    env: &Env<'_>,
    nccl: &Nccl,
    devices: &[Device],
    comm: &Communicator,
    bufs: &[Arc<cuhal::Buffer>; 2],
    report: &mut Report,
) -> Result<()> {
    let (per, samples) = reps(env, 8);
    progress("case 13 (collectives): all-reduce 8 B, variants of the queue operation");
    let rare = Communicator::local(
        nccl,
        &[&devices[0], &devices[1]],
        CommunicatorOptions {
            poll_interval: RARE_POLL,
            ..CommunicatorOptions::default()
        },
    )?;
    let ranges = [bufs[0].range(0, 8)?, bufs[1].range(0, 8)?];
    let part = |r: usize| {
        CollectivePart::all_reduce(&ranges[r], &ranges[r], 2, NcclDataType::F32, NcclRedOp::Max)
    };
    let done = Semaphore::with_options(0, SemaphoreOptions::new().with_event_spin(WAIT));
    let mut value = 0u64;
    let mut times: [Vec<f64>; 3] = Default::default();
    for sample in 0..=samples {
        for turn in 0..3 {
            let variant = (sample + turn) % 3;
            let t0 = env.clock.now_ns();
            for i in 0..per {
                let signal = variant != 2 || i + 1 == per;
                let by = if variant == 1 { &rare } else { comm };
                if signal {
                    value += 1;
                    let s = [(&done, value)];
                    by.submit(&[part(0).signals(&s), part(1)])?;
                } else {
                    by.submit(&[part(0), part(1)])?;
                }
            }
            done.wait(value, WAIT)?;
            if sample > 0 {
                times[variant].push((env.clock.now_ns() - t0) as f64 / per as f64);
            }
        }
    }
    let [base, rare_t, unsignalled] = times.map(|mut t| summarize("all-reduce variant", &mut t));
    let base = base?;
    for (what, t) in [
        (
            format!(
                "completion side polling NCCL's asynchronous errors every {} ms (default {} us)",
                RARE_POLL.as_millis(),
                CommunicatorOptions::default().poll_interval.as_micros()
            ),
            rare_t?,
        ),
        (
            "a semaphore signal on the batch's last collective only".to_owned(),
            unsignalled?,
        ),
    ] {
        report.comparisons.push(Comparison::new(
            "13",
            format!(
                "all-reduce 8 B, queue operation with {what}, against the queue operation as \
                 measured above, for comparison"
            ),
            Some(t),
            Some(base),
            Goal::Report,
        ));
    }
    Ok(())
}

/// 256 MiB from GPU 0 to GPU 1: `Queue::copy_peer` against raw `cuMemcpyPeerAsync`.
fn peer_copy(env: &Env<'_>, devices: &[Device], report: &mut Report) -> Result<()> {
    let (per, samples) = (5, if env.quick { 3 } else { 10 });
    progress(&format!(
        "case 13 (collectives): peer copy 256 MiB, raw and queue, {samples} x {per}"
    ));
    let source = devices[0].create_buffer(PEER_COPY)?;
    let target = devices[1].create_buffer(PEER_COPY)?;
    let stream = Stream::new(devices[0].context(), CU_STREAM_NON_BLOCKING)?;
    let api = devices[0].context().api();
    let queue = devices[0].queue(0);
    // The host waits like the floor's `cuStreamSynchronize`, spinning for the whole batch (see
    // the all-reduce rows): a default semaphore would add its park and wake to each batch.
    let done = Semaphore::with_options(0, SemaphoreOptions::new().with_event_spin(WAIT));
    // The device's default semaphore, for comparison.
    let parked = devices[0].create_semaphore(0);
    let (mut value, mut parked_value) = (0, 0);
    let mut times: [Vec<f64>; 3] = Default::default();
    for sample in 0..=samples {
        for turn in 0..3 {
            let variant = (sample + turn) % 3;
            let t0 = env.clock.now_ns();
            if variant == 0 {
                let _bound = devices[0].context().enter()?;
                for _ in 0..per {
                    // SAFETY: live buffers of PEER_COPY bytes on their contexts; a live stream.
                    unsafe {
                        cu!(
                            api,
                            cuMemcpyPeerAsync(
                                target.device_ptr(),
                                devices[1].context().raw(),
                                source.device_ptr(),
                                devices[0].context().raw(),
                                PEER_COPY,
                                stream.raw()
                            )
                        )
                    }?;
                }
                stream.synchronize()?;
            } else if variant == 1 {
                for _ in 0..per {
                    value += 1;
                    queue.copy_peer(&[], &[(&done, value)], &source.whole(), &target.whole())?;
                }
                done.wait(value, WAIT)?;
            } else {
                for _ in 0..per {
                    parked_value += 1;
                    queue.copy_peer(
                        &[],
                        &[(&parked, parked_value)],
                        &source.whole(),
                        &target.whole(),
                    )?;
                }
                parked.wait(parked_value, WAIT)?;
            }
            if sample > 0 {
                times[variant].push((env.clock.now_ns() - t0) as f64 / per as f64);
            }
        }
    }
    let [raw_t, queue_t, parked_t] = times.map(|mut t| summarize("peer copy", &mut t));
    let (raw_t, queue_t, parked_t) = (raw_t?, queue_t?, parked_t?);
    report.comparisons.push(Comparison::new(
        "13",
        format!(
            "peer copy 256 MiB GPU 0 -> GPU 1, Queue::copy_peer: time per copy ({:.1} GB/s; raw cuMemcpyPeerAsync {:.1} GB/s)",
            PEER_COPY as f64 / queue_t.median,
            PEER_COPY as f64 / raw_t.median
        ),
        Some(queue_t),
        Some(raw_t),
        Goal::RatioAtMost(1.0 / BANDWIDTH_SHARE),
    ));
    report.comparisons.push(Comparison::new(
        "13",
        format!(
            "peer copy 256 MiB, Queue::copy_peer waited on with the device's default semaphore \
             (spin, then park until the batch end is seen), for comparison \
             ({:.1} GB/s)",
            PEER_COPY as f64 / parked_t.median
        ),
        Some(parked_t),
        Some(raw_t),
        Goal::Report,
    ));
    Ok(())
}

/// Round trips per variant of the cross-device gap (warm-up on top).
pub const ROUND_TRIPS: usize = 2_000;
/// The goal: a cross-device wait's gap at most the same-GPU gap plus this (ns).
pub const CROSS_DEVICE_ADDED_NS: f64 = 1000.0;

/// Which round trip: B on GPU 1 (cross-device) or on a second stream of GPU 0 (same GPU), and
/// raw driver calls or cuhal queues.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Trip {
    RawCross,
    RawSame,
    CuhalCross,
    CuhalSame,
    /// Raw, cross-device, ordered by 32-bit words instead of events: the signalling stream
    /// writes a word in the waiting GPU's memory (`cuStreamWriteValue32` over the link), the
    /// waiting stream polls it (`cuStreamWaitValue32`).
    RawCrossWord,
}

/// The GPU gap of a cross-device semaphore wait, on one clock.
///
/// `%globaltimer` is per GPU, so one hop's gap (A's end on GPU 0 to B's start on GPU 1) cannot
/// be read off two clocks. A round trip can: A on GPU 0 (spinning long enough, with a dithered
/// end, that everything after it is queued before it ends), B on GPU 1 waiting for A, C on
/// GPU 0 waiting for B. `C.start - A.end` is on GPU 0's clock and `B.end - B.start` on GPU 1's;
/// their difference is the two hops' gaps, and half of it the gap per hop.
///
/// - raw floor: one-node graphs on raw streams (A and C on one stream of GPU 0, B on a stream of
///   GPU 1), `cuEventRecord` after A and B, `cuStreamWaitEvent` before B and C: the calls cuhal
///   makes for two queues of two devices;
/// - cuhal: graph command buffers on queue 0 of each device, B waiting for A's semaphore value
///   and C for B's (device waits on another context's event);
/// - the same two with B on a second stream (queue) of GPU 0: the same-GPU gap per hop, the
///   issue's reference (case 3's dependency, measured here in the same run).
///
/// Goal (the issue's): cuhal's cross-device gap per hop at most its same-GPU gap per hop plus
/// 1 us. The raw cross-device row says how much of a miss is the hardware's.
fn cross_device_gap(env: &Env<'_>, devices: &[Device], report: &mut Report) -> Result<()> {
    let measured = cross_device_round_trips(env, devices, report);
    // GPU 1's objects bind their context when dropped: the bench's thread gets GPU 0's back.
    env.gpu.ctx.bind()?;
    measured
}

fn cross_device_round_trips(env: &Env<'_>, devices: &[Device], report: &mut Report) -> Result<()> {
    use super::dependency::{A_NS, FINE_TIMER_NS, JITTER_CYCLES};
    use crate::gpu::SpinRecord;
    use crate::gpu::raw::{GraphExec, KernelNode};
    use cuhal::{Dispatch, KernelArgs};
    use cuhal_sys::Module;

    let n = env.scaled(ROUND_TRIPS);
    let warm = env.scaled(50);
    progress(&format!(
        "case 13 (collectives): cross-device wait gap, round trips GPU 0 -> GPU 1 -> GPU 0 and \
         GPU 0 -> GPU 0 -> GPU 0, raw and cuhal, {n} each"
    ));
    let ctx = [devices[0].context().clone(), devices[1].context().clone()];
    // Records: A and C on GPU 0; B on GPU 1 (cross-device) and on GPU 0 (same GPU).
    let mut rec_a = SpinRecord::in_context(&ctx[0])?;
    let mut rec_c = SpinRecord::in_context(&ctx[0])?;
    let mut rec_b = [
        SpinRecord::in_context(&ctx[1])?,
        SpinRecord::in_context(&ctx[0])?,
    ];
    let a_args = rec_a.args(A_NS, 0, JITTER_CYCLES);
    let c_args = rec_c.args(0, 0, 0);
    let b_args = [rec_b[0].args(0, 0, 0), rec_b[1].args(0, 0, 0)];

    // Raw: one module, streams and events per context.
    let modules = [
        Module::load_ptx(&ctx[0], ptx::MODULE).context("loading the kernels on GPU 0")?,
        Module::load_ptx(&ctx[1], ptx::MODULE).context("loading the kernels on GPU 1")?,
    ];
    let spin = [modules[0].function("spin")?, modules[1].function("spin")?];
    let graph = |c: usize, args: Args| -> Result<GraphExec> {
        let _bound = ctx[c].enter()?;
        GraphExec::chain(
            &ctx[c],
            &mut [KernelNode {
                function: spin[c],
                args,
            }],
        )
    };
    let (graph_a, graph_c) = (graph(0, a_args)?, graph(0, c_args)?);
    // B's graph, stream and event per placement: [cross-device (GPU 1), same GPU (GPU 0)].
    let graph_b = [graph(1, b_args[0])?, graph(0, b_args[1])?];
    let b_ctx = [&ctx[1], &ctx[0]];
    let s0 = Stream::new(&ctx[0], CU_STREAM_NON_BLOCKING)?;
    let s_b = [
        Stream::new(&ctx[1], CU_STREAM_NON_BLOCKING)?,
        Stream::new(&ctx[0], CU_STREAM_NON_BLOCKING)?,
    ];
    let event_a = Event::new(&ctx[0], CU_EVENT_DISABLE_TIMING)?;
    let event_b = [
        Event::new(&ctx[1], CU_EVENT_DISABLE_TIMING)?,
        Event::new(&ctx[0], CU_EVENT_DISABLE_TIMING)?,
    ];
    let api = ctx[0].api();

    // cuhal: one-dispatch graph command buffers (the queues' default kind).
    let executables = [
        devices[0].load_ptx(ptx::MODULE)?,
        devices[1].load_ptx(ptx::MODULE)?,
    ];
    let command_buffer = |device: usize, queue: usize, args: Args| {
        let Args::Spin {
            ns,
            record,
            flag,
            jitter,
        } = args
        else {
            bail!("the round trip dispatches spin kernels only");
        };
        let function = executables[device].function("spin")?;
        let mut cb = devices[device].queue(queue).create_command_buffer()?;
        let kernel_args = KernelArgs::new()
            .with(ns)
            .with(record)
            .with(flag)
            .with(jitter);
        cb.dispatch(&Dispatch::new(
            &function,
            [1, 1, 1],
            [1, 1, 1],
            &kernel_args,
        ))?;
        cb.end()
            .context("cuhal: ending a round-trip command buffer")
    };
    let cb_a = command_buffer(0, 0, a_args)?;
    let cb_c = command_buffer(0, 0, c_args)?;
    let cb_b = [
        command_buffer(1, 0, b_args[0])?,
        command_buffer(0, 1, b_args[1])?,
    ];
    let queue_b = [devices[1].queue(0), devices[0].queue(1)];
    let queue_0 = devices[0].queue(0);
    let spinning = || Semaphore::with_options(0, SemaphoreOptions::new().with_event_spin(WAIT));
    let (sem_a, sem_b, sem_c) = (spinning(), spinning(), spinning());
    let mut value = 0u64;
    // The words of the word-ordered trip, each in its waiter's memory: B's on GPU 1, C's on
    // GPU 0 (only where the driver has the CUDA 12 stream memory operations).
    let words = match (api.cuStreamWriteValue32, api.cuStreamWaitValue32) {
        (Some(_), Some(_)) => {
            let word_b = cuhal::Buffer::new(&ctx[1], 4)?;
            let word_c = cuhal::Buffer::new(&ctx[0], 4)?;
            word_b.write(0, &[0; 4])?;
            word_c.write(0, &[0; 4])?;
            Some((word_b, word_c))
        }
        _ => {
            report.notes.push(
                "case 13: the driver has no CUDA 12 stream memory operations: no word-ordered \
                 cross-device row"
                    .into(),
            );
            None
        }
    };
    let mut word = 0u32;

    let mut trips = vec![
        Trip::RawCross,
        Trip::RawSame,
        Trip::CuhalCross,
        Trip::CuhalSame,
    ];
    if words.is_some() {
        trips.push(Trip::RawCrossWord);
    }
    let mut hops: [Vec<f64>; 5] = Default::default();
    for sample in 0..warm + n {
        for turn in 0..trips.len() {
            let index = (sample + turn) % trips.len();
            let trip = trips[index];
            let b = match trip {
                Trip::RawCross | Trip::CuhalCross | Trip::RawCrossWord => 0,
                Trip::RawSame | Trip::CuhalSame => 1,
            };
            rec_a.count_launch();
            rec_b[b].count_launch();
            rec_c.count_launch();
            match trip {
                Trip::RawCross | Trip::RawSame => {
                    {
                        let _bound = ctx[0].enter()?;
                        // SAFETY: live graphs, streams and events; each graph launched and each
                        // event recorded on a stream of its own context, made current around
                        // the calls; a stream wait takes an event of any context.
                        unsafe {
                            cu!(api, cuGraphLaunch(graph_a.raw(), s0.raw()))?;
                            cu!(api, cuEventRecord(event_a.raw(), s0.raw()))?;
                        }
                    }
                    {
                        let _bound = b_ctx[b].enter()?;
                        // SAFETY: as above.
                        unsafe {
                            cu!(api, cuStreamWaitEvent(s_b[b].raw(), event_a.raw(), 0))?;
                            cu!(api, cuGraphLaunch(graph_b[b].raw(), s_b[b].raw()))?;
                            cu!(api, cuEventRecord(event_b[b].raw(), s_b[b].raw()))?;
                        }
                    }
                    let _bound = ctx[0].enter()?;
                    // SAFETY: as above.
                    unsafe {
                        cu!(api, cuStreamWaitEvent(s0.raw(), event_b[b].raw(), 0))?;
                        cu!(api, cuGraphLaunch(graph_c.raw(), s0.raw()))?;
                    }
                    s0.synchronize()?;
                }
                Trip::RawCrossWord => {
                    let Some((word_b, word_c)) = &words else {
                        bail!("the word-ordered trip runs only with the words");
                    };
                    word += 1;
                    {
                        let _bound = ctx[0].enter()?;
                        // SAFETY: live graphs and streams, each of the context made current
                        // around its calls; the words are live 4-byte allocations, B's on GPU 1
                        // (which GPU 0 reaches: peer access is on) and C's on GPU 0.
                        unsafe {
                            cu!(api, cuGraphLaunch(graph_a.raw(), s0.raw()))?;
                            cu!(optional: api, cuStreamWriteValue32(s0.raw(), word_b.device_ptr(), word, 0))?;
                        }
                    }
                    {
                        let _bound = ctx[1].enter()?;
                        // SAFETY: as above.
                        unsafe {
                            cu!(optional: api, cuStreamWaitValue32(s_b[0].raw(), word_b.device_ptr(), word, CU_STREAM_WAIT_VALUE_GEQ))?;
                            cu!(api, cuGraphLaunch(graph_b[0].raw(), s_b[0].raw()))?;
                            cu!(optional: api, cuStreamWriteValue32(s_b[0].raw(), word_c.device_ptr(), word, 0))?;
                        }
                    }
                    let _bound = ctx[0].enter()?;
                    // SAFETY: as above.
                    unsafe {
                        cu!(optional: api, cuStreamWaitValue32(s0.raw(), word_c.device_ptr(), word, CU_STREAM_WAIT_VALUE_GEQ))?;
                        cu!(api, cuGraphLaunch(graph_c.raw(), s0.raw()))?;
                    }
                    s0.synchronize()?;
                }
                Trip::CuhalCross | Trip::CuhalSame => {
                    value += 1;
                    queue_0
                        .execute(&[], &[(&sem_a, value)], &[&cb_a])
                        .context("cuhal: the round trip's A")?;
                    queue_b[b]
                        .execute(&[(&sem_a, value)], &[(&sem_b, value)], &[&cb_b[b]])
                        .context("cuhal: the round trip's B")?;
                    queue_0
                        .execute(&[(&sem_b, value)], &[(&sem_c, value)], &[&cb_c])
                        .context("cuhal: the round trip's C")?;
                    sem_c.wait(value, WAIT)?;
                }
            }
            let ta = rec_a.read("case 13 round trip").context("kernel A")?;
            let tb = {
                let _bound = b_ctx[b].enter()?;
                rec_b[b].read("case 13 round trip").context("kernel B")?
            };
            let tc = rec_c.read("case 13 round trip").context("kernel C")?;
            // Two hops: A's end to C's start on GPU 0's clock, less B's own time on B's clock.
            let two_hops = (tc.start as f64 - ta.end as f64) - (tb.end as f64 - tb.start as f64);
            if sample >= warm {
                hops[index].push(two_hops / 2.0);
            }
        }
    }
    let [raw_cross, raw_same, cuhal_cross, cuhal_same, raw_word] =
        hops.map(|mut h| summarize("cross-device gap", &mut h));
    let (raw_cross, raw_same, cuhal_cross, cuhal_same) =
        (raw_cross?, raw_same?, cuhal_cross?, cuhal_same?);
    let center = if env.timer.step_ns > FINE_TIMER_NS {
        report.notes.push(format!(
            "case 13: %globaltimer steps by {} ns, so the round-trip gaps are judged on means of \
             dithered samples",
            env.timer.step_ns
        ));
        Center::Mean
    } else {
        Center::Median
    };
    report.measured(
        "13",
        "floor: same-GPU wait gap per hop, round trip A -> B (second stream) -> C on GPU 0, \
         1-node graphs + events",
        raw_same,
    );
    let mut floor = Comparison::new(
        "13",
        "cross-device wait gap per hop: round trip A (GPU 0) -> B (GPU 1, waits for A's \
         semaphore) -> C (GPU 0, waits for B's), cuhal queues against raw graphs + \
         cuStreamWaitEvent across the devices' streams",
        Some(cuhal_cross),
        Some(raw_cross),
        Goal::Report,
    );
    floor.center = center;
    report.comparisons.push(floor);
    let mut goal = Comparison::new(
        "13",
        "cross-device wait gap per hop against the same-GPU gap per hop (B on GPU 0's second \
         queue), both cuhal: the issue's goal, at most 1 us more",
        Some(cuhal_cross),
        Some(cuhal_same),
        Goal::AddedAtMost(CROSS_DEVICE_ADDED_NS),
    );
    goal.center = center;
    report.comparisons.push(goal);
    if words.is_some() {
        let mut by_words = Comparison::new(
            "13",
            "raw cross-device gap per hop ordered by words (cuStreamWriteValue32 into the \
             waiter's memory, cuStreamWaitValue32) against raw events (cuStreamWaitEvent), for \
             comparison",
            Some(raw_word?),
            Some(raw_cross),
            Goal::Report,
        );
        by_words.center = center;
        report.comparisons.push(by_words);
    }
    Ok(())
}
