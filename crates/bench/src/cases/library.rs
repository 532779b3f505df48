//! Case 8, a library call in a command buffer: a cuBLAS SGEMM (2048 x 2048 x 2048, loaded at run
//! time) recorded as stream work, replayed and waited for; wall time per replay, submit to the
//! host's return, and GPU time per replay, between two timing events recorded around the work.
//!
//! Floor: the same `cublasSgemm` on a raw stream between two timing events, then a spinning
//! `cuEventSynchronize` on the second, with the same handle, workspace and buffers.
//!
//! cuhal: a command buffer holding only the GEMM as stream work, as a graph (the GEMM captured
//! with `cuStreamBeginCaptureToGraph`) and as a deferred command buffer (the closure called at
//! every replay on the queue's stream); the same two timing events recorded on the queue's
//! stream around `Queue::execute` (one signal), then a host wait on the semaphore.
//!
//! What makes the comparison fair:
//! - the variants take turns in blocks of [`BLOCK`] replays, each round starting with the next
//!   variant, so the GPU's clocks, power and temperature drift alike under all of them (all of
//!   one variant, then all of the next, put the floor first on a cool GPU);
//! - the host waits alike: the floor spins in `cuEventSynchronize` for the whole GEMM, so the
//!   compared cuhal rows wait on a semaphore whose event spin outlasts it. The device's default
//!   wait (spin `completion_policy::HOST_WAIT_SPIN`, then park until the completion side sees the
//!   event, or the waiter's own look at it, 50 us to 1 ms apart, does) is a row of its own: on
//!   work longer than the spin it adds the completion side's latency, which is not the
//!   library's time;
//! - the handle keeps the case's workspace on every stream (the loader sets it again after each
//!   `cublasSetStream`, which resets it) and the stream is set only when it changes.
//!
//! The GPU rows tell the library's own time from cuhal's: equal GPU times and a wall-time gap
//! put the gap on the host side (submission, wait); a GPU-time gap puts it in what reached the
//! GPU (the captured graph's nodes, another kernel).

use std::sync::Arc;

use anyhow::{Context as _, Result, bail};
use cuhal::{CommandBuffer, CommandBufferMode, DeviceOptions, Semaphore, StreamWork, StreamWorkFn};
use cuhal_semaphore::SemaphoreOptions;

use super::{Env, progress, summarize};
use crate::hal::{Hal, WAIT};
use crate::report::{Comparison, Goal, Report};
use cuhal_blas::Cublas;
use cuhal_sys::{Event, Stream, cu};

/// The GEMM's size (square).
pub const SIZE: usize = 2048;
/// Replays per variant (warm-up on top).
pub const REPLAYS: usize = 500;
/// Replays of one variant before the next takes its turn.
pub const BLOCK: usize = 10;
/// The goal: cuhal at most this many times the raw stream.
pub const GOAL_RATIO: f64 = 1.05;
/// cuBLAS's workspace.
const WORKSPACE: usize = 32 << 20;

/// How one variant submits the GEMM.
enum Side {
    /// `cublasSgemm` on the raw stream.
    Raw,
    /// `Queue::execute` of a command buffer, then a host wait on `semaphore`.
    Cuhal {
        cb: Arc<dyn CommandBuffer>,
        semaphore: Semaphore,
        value: u64,
    },
}

/// One variant with its timing events and samples (nanoseconds).
struct Variant {
    label: &'static str,
    side: Side,
    start: Event,
    end: Event,
    wall: Vec<f64>,
    gpu: Vec<f64>,
    /// Replays whose GPU time could not be taken (not issued by the submitting thread).
    unbracketed: usize,
}

/// Runs case 8.
pub fn run(env: &Env<'_>, report: &mut Report) -> Result<()> {
    let n = env.scaled(REPLAYS);
    let warm = env.scaled(20);
    // One device, one cuBLAS handle, one workspace and one set of buffers for every variant:
    // the buffers are memory of the primary context the floor's stream also uses.
    let hal = Hal::open(DeviceOptions::default())?;
    let device = &hal.device;
    device.context().bind()?;
    let cublas = Arc::new(Cublas::load()?);
    let bytes = SIZE * SIZE * 4;
    let workspace = device.create_buffer(WORKSPACE)?;
    let (a, b, c) = (
        device.create_buffer(bytes)?,
        device.create_buffer(bytes)?,
        device.create_buffer(bytes)?,
    );
    // SAFETY: the workspace outlives the handle's uses (every GEMM is waited for below, one at a
    // time).
    unsafe { cublas.set_workspace(workspace.device_ptr(), WORKSPACE) }?;
    for buffer in [&a, &b] {
        let api = device.context().api();
        // SAFETY: the buffer is `bytes` of live device memory; 1.0f32 everywhere.
        unsafe {
            cu!(
                api,
                cuMemsetD32Async(
                    buffer.device_ptr(),
                    1.0f32.to_bits(),
                    SIZE * SIZE,
                    std::ptr::null_mut()
                )
            )
        }?;
    }
    let ctx = device.context().api();
    // SAFETY: no arguments; waits for the fills above (legacy stream).
    unsafe { cu!(ctx, cuCtxSynchronize()) }?;

    let work: Arc<StreamWorkFn> = {
        let cublas = Arc::clone(&cublas);
        Arc::new(move |on: &StreamWork<'_>| {
            let [a, b, c] = on.ranges() else {
                return Err("the GEMM names three ranges".into());
            };
            // SAFETY: the command buffer retains the three buffers, each SIZE x SIZE floats.
            unsafe { cublas.sgemm(on.stream(), SIZE, SIZE, SIZE, a.ptr, b.ptr, c.ptr) }?;
            Ok(())
        })
    };
    let record = |mode: CommandBufferMode| -> Result<Arc<dyn CommandBuffer>> {
        let mut cb = device.queue(0).create_command_buffer_as(mode, 0)?;
        cb.stream_work(&[a.whole(), b.whole(), c.whole()], Arc::clone(&work))
            .with_context(|| format!("recording the GEMM into a {mode:?} command buffer"))?;
        Ok(cb.end()?)
    };
    let (graph, deferred) = (
        record(CommandBufferMode::Graph)?,
        record(CommandBufferMode::Deferred)?,
    );
    // Waits like the floor's: the event spin outlasts any GEMM.
    let spinning = || Semaphore::with_options(0, SemaphoreOptions::new().with_event_spin(WAIT));
    let timing = || Event::new(&env.gpu.ctx, 0);
    let stream = Stream::new(&env.gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?;
    let cuhal = |cb: &Arc<dyn CommandBuffer>, semaphore: Semaphore| Side::Cuhal {
        cb: Arc::clone(cb),
        semaphore,
        value: 0,
    };
    let mut variants = [
        ("raw stream", Side::Raw),
        ("graph", cuhal(&graph, spinning())),
        ("deferred", cuhal(&deferred, spinning())),
        ("graph, default wait", cuhal(&graph, hal.semaphore())),
    ]
    .map(|(label, side)| -> Result<Variant> {
        Ok(Variant {
            label,
            side,
            start: timing()?,
            end: timing()?,
            wall: Vec::with_capacity(n),
            gpu: Vec::with_capacity(n),
            unbracketed: 0,
        })
    })
    .into_iter()
    .collect::<Result<Vec<_>>>()?;

    progress(&format!(
        "case 8 (library): raw stream, graph, deferred and graph with the default wait, \
         {n} replays each in turns of {BLOCK}"
    ));
    let queue = device.queue(0);
    let rounds = (warm + n).div_ceil(BLOCK);
    for round in 0..rounds {
        for turn in 0..variants.len() {
            let count = variants.len();
            let v = &mut variants[(round + turn) % count];
            for i in 0..BLOCK {
                let replay = round * BLOCK + i;
                let issued_before = queue.stats().issued_on_submit;
                let t0 = env.clock.now_ns();
                match &mut v.side {
                    Side::Raw => {
                        v.start.record(&stream)?;
                        // SAFETY: live buffers of the sizes the GEMM reads and writes; a live
                        // stream; each call is waited for before the next.
                        unsafe {
                            cublas.sgemm(
                                stream.raw(),
                                SIZE,
                                SIZE,
                                SIZE,
                                a.device_ptr(),
                                b.device_ptr(),
                                c.device_ptr(),
                            )
                        }?;
                        v.end.record(&stream)?;
                        v.end.synchronize()?;
                    }
                    Side::Cuhal {
                        cb,
                        semaphore,
                        value,
                    } => {
                        *value += 1;
                        // SAFETY: the queue's stream lives as long as the device.
                        unsafe { v.start.record_raw(queue.stream()) }?;
                        queue
                            .execute(&[], &[(&*semaphore, *value)], &[cb])
                            .context("cuhal: Queue::execute")?;
                        // SAFETY: as above.
                        unsafe { v.end.record_raw(queue.stream()) }?;
                        semaphore
                            .wait(*value, WAIT)
                            .context("cuhal: waiting for the semaphore")?;
                    }
                }
                let t1 = env.clock.now_ns();
                // The events bracket cuhal's work only if this thread issued it (the fast path);
                // issued by the queue's worker, the end event may have gone in before it.
                let bracketed = match v.side {
                    Side::Raw => true,
                    Side::Cuhal { .. } => {
                        v.end.synchronize()?;
                        queue.stats().issued_on_submit == issued_before + 1
                    }
                };
                if replay >= warm && v.wall.len() < n {
                    v.wall.push((t1 - t0) as f64);
                    if bracketed {
                        let ms = v
                            .start
                            .elapsed_ms(&v.end)?
                            .context("case 8: timing events not complete after a wait")?;
                        v.gpu.push(f64::from(ms) * 1e6);
                    } else {
                        v.unbracketed += 1;
                    }
                }
            }
        }
    }
    stream.synchronize()?;

    let mut summaries = Vec::with_capacity(variants.len());
    for v in &mut variants {
        if v.unbracketed > 0 {
            report.notes.push(format!(
                "case 8: {} of {n} {} replays were issued by the queue's worker, so their GPU \
                 time is left out (the wall time is kept)",
                v.unbracketed, v.label
            ));
        }
        let wall = summarize(&format!("case 8 {} wall", v.label), &mut v.wall)?;
        let gpu = summarize(&format!("case 8 {} GPU", v.label), &mut v.gpu)?;
        summaries.push((wall, gpu));
    }
    let [
        (raw_wall, raw_gpu),
        (graph_wall, graph_gpu),
        (deferred_wall, deferred_gpu),
        (lazy_wall, _),
    ] = summaries[..]
    else {
        bail!("case 8: four variants expected");
    };
    report.measured(
        "8",
        "floor: cublasSgemm 2048^3 on a raw stream between two timing events + spinning sync, wall per call",
        raw_wall,
    );
    report.measured(
        "8",
        "floor: cublasSgemm 2048^3 on a raw stream, GPU time between the two events",
        raw_gpu,
    );
    let rows = [
        ("graph (captured)", graph_wall, graph_gpu),
        ("deferred (called at replay)", deferred_wall, deferred_gpu),
    ];
    for (kind, wall, gpu) in rows {
        report.comparisons.push(Comparison::new(
            "8",
            format!(
                "library call: cuBLAS SGEMM 2048^3 as stream work, {kind} command buffer, submit + spinning host wait (variants interleaved)"
            ),
            Some(wall),
            Some(raw_wall),
            Goal::RatioAtMost(GOAL_RATIO),
        ));
        report.comparisons.push(Comparison::new(
            "8",
            format!(
                "library call, GPU time: {kind} command buffer between timing events on the queue's stream (floor: the raw stream's)"
            ),
            Some(gpu),
            Some(raw_gpu),
            Goal::Report,
        ));
    }
    report.comparisons.push(
        Comparison::new(
            "8",
            "library call: graph command buffer, the device's default host wait (spin, then park)",
            Some(lazy_wall),
            Some(raw_wall),
            Goal::Report,
        )
        .note(format!(
            "the default wait spins {} us on the event, then parks until the completion \
             side sees the GEMM end (or its own look at the event, 50 us to 1 ms apart, \
             does); the compared rows spin like the floor",
            cuhal::completion_policy::HOST_WAIT_SPIN.as_micros()
        )),
    );
    Ok(())
}
