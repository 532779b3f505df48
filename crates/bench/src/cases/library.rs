//! Case 8, a library call in a command buffer: a cuBLAS SGEMM (2048 x 2048 x 2048, loaded at run
//! time) recorded as stream work, replayed and waited for; wall time per replay, submit to the
//! host's return.
//!
//! Floor: the same `cublasSgemm` on a raw stream, then `cuEventRecord` + `cuEventSynchronize`
//! (spinning event), with the same handle and workspace.
//!
//! cuhal: a command buffer holding only the GEMM as stream work, as a graph (the GEMM captured
//! into the graph with `cuStreamBeginCaptureToGraph`) and as a deferred command buffer (the
//! closure called at every replay on the queue's stream); `Queue::execute` with one signal,
//! then a host wait on the semaphore. The GEMM is long (hundreds of microseconds), so the ratio
//! says whether capturing or replaying through cuhal slows the library's work itself.

use std::sync::Arc;

use anyhow::{Context as _, Result};
use cuhal::{CommandBufferMode, DeviceOptions, StreamWork, StreamWorkFn};

use super::{Env, progress, summarize};
use crate::cublas::Cublas;
use crate::gpu::raw::SyncMode;
use crate::hal::Hal;
use crate::report::{Comparison, Goal, Report};
use cuhal_sys::{Event, Stream, cu};

/// The GEMM's size (square).
pub const SIZE: usize = 2048;
/// Replays per variant (warm-up on top).
pub const REPLAYS: usize = 500;
/// The goal: cuhal at most this many times the raw stream.
pub const GOAL_RATIO: f64 = 1.05;
/// cuBLAS's workspace.
const WORKSPACE: usize = 32 << 20;

/// Runs case 8.
pub fn run(env: &Env<'_>, report: &mut Report) -> Result<()> {
    let n = env.scaled(REPLAYS);
    let warm = env.scaled(20);
    // One device (and one cuBLAS handle, one workspace) for the floor and both modes: the
    // buffers are device memory of the primary context the floor's stream also uses.
    let graph_hal = Hal::open(DeviceOptions {
        command_buffer_mode: CommandBufferMode::Graph,
        ..DeviceOptions::default()
    })?;
    let device = &graph_hal.device;
    device.context().bind()?;
    let cublas = Arc::new(Cublas::load().map_err(anyhow::Error::msg)?);
    let bytes = SIZE * SIZE * 4;
    let workspace = device.create_buffer(WORKSPACE)?;
    let (a, b, c) = (
        device.create_buffer(bytes)?,
        device.create_buffer(bytes)?,
        device.create_buffer(bytes)?,
    );
    // SAFETY: the workspace outlives the handle's uses (every GEMM is waited for below).
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

    progress(&format!(
        "case 8 (library): raw-stream SGEMM floor, {n} calls"
    ));
    let stream = Stream::new(&env.gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?;
    let event = Event::new(&env.gpu.ctx, SyncMode::Spin.flags())?;
    let mut floor = Vec::with_capacity(n);
    for i in 0..warm + n {
        let t0 = env.clock.now_ns();
        // SAFETY: live buffers of the sizes the GEMM reads and writes; a live stream; each call
        // is waited for before the next.
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
        event.record_and_synchronize(&stream)?;
        let t1 = env.clock.now_ns();
        if i >= warm {
            floor.push((t1 - t0) as f64);
        }
    }
    let floor = summarize("case 8 raw-stream SGEMM", &mut floor)?;
    report.measured(
        "8",
        "floor: cublasSgemm 2048^3 on a raw stream + record + sync, per call",
        floor,
    );

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
    let deferred_hal = Hal::open(DeviceOptions {
        command_buffer_mode: CommandBufferMode::Deferred,
        ..DeviceOptions::default()
    })?;
    for (mode, hal) in [
        (CommandBufferMode::Graph, &graph_hal),
        (CommandBufferMode::Deferred, &deferred_hal),
    ] {
        progress(&format!("case 8 (library): cuhal {mode:?}, {n} replays"));
        let mut cb = hal.device.queue(0).create_command_buffer()?;
        cb.stream_work(&[a.whole(), b.whole(), c.whole()], Arc::clone(&work))
            .with_context(|| format!("recording the GEMM into a {mode:?} command buffer"))?;
        cb.end()?;
        let cb = Arc::from(cb);
        let mut samples = hal.time_round_trips(0, &cb, env.clock, warm, n)?;
        let cuhal = summarize("case 8 cuhal", &mut samples)?;
        report.comparisons.push(Comparison::new(
            "8",
            format!(
                "library call: cuBLAS SGEMM 2048^3 as stream work, {} command buffer, submit + host wait",
                match mode {
                    CommandBufferMode::Graph => "graph (captured)",
                    CommandBufferMode::Deferred => "deferred (called at replay)",
                }
            ),
            Some(cuhal),
            Some(floor),
            Goal::RatioAtMost(GOAL_RATIO),
        ));
    }
    stream.synchronize()?;
    Ok(())
}
