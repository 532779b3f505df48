//! cuhal next to other CUDA code in the same process, one worked example per direction:
//!
//! 1. memory and ordering *in*: another runtime allocates a buffer, fills it on its own stream
//!    and records an event; cuhal imports the buffer (checked with `cuPointerGetAttribute`), waits
//!    for the event on the device, and copies the buffer; the other runtime's release callback
//!    (here: `cuMemFree`) runs once cuhal's last use has completed;
//! 2. memory and ordering *out*: cuhal fills a buffer; its semaphore value is exported as a
//!    `CUevent`, which the other runtime's stream waits on before copying from the exported
//!    pointer;
//! 3. a library call *inside* a command buffer: a cuBLAS SGEMM (libcublas.so.13, loaded at run
//!    time when present, by `cuhal_blas`) recorded as stream work into a graph command buffer
//!    between two fills.
//!
//! The "other runtime" is plain driver calls. No step waits on the host between producer and
//! consumer.
//!
//! ```text
//! cargo run -p cuhal-bench --example interop
//! ```
//!
//! Without a CUDA driver (or device) it says so and exits successfully. The GPU suite runs it
//! too (`tests/tests/examples.rs`), with cuBLAS required.

#[path = "../../device/examples/common/mod.rs"]
mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cuhal::{
    CommandBuffer, DeviceOptions, Driver, ExportedBuffer, FillPattern, ForeignEvent, StreamWork,
    StreamWorkFn,
};
use cuhal_blas::Cublas;
use cuhal_sys::{CU_EVENT_DISABLE_TIMING, CU_STREAM_NON_BLOCKING, DriverApi, Event, Stream, cu};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    let Some(driver) = common::driver_with_a_device() else {
        return ExitCode::SUCCESS;
    };
    match run(&driver, false) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("interop: {e}");
            ExitCode::FAILURE
        }
    }
}

const WORDS: usize = 1 << 16;
const BYTES: usize = WORDS * 4;

/// Runs the three examples on device 0. Without cuBLAS the third is skipped (said so on
/// stdout), unless `require_library`: then it is an error (the GPU suite runs this example as a
/// test, and a skipped step there would pass for a checked one).
pub fn run(driver: &Driver, require_library: bool) -> Result {
    let device = driver.open(0, DeviceOptions::default())?;
    let q = device.queue(0);
    let context = device.context().clone();
    let api: &DriverApi = context.api();
    let _bound = context.enter()?;

    // The other runtime's stream and event.
    let their_stream = Stream::new(&context, CU_STREAM_NON_BLOCKING)?;
    let their_event = Event::new(&context, CU_EVENT_DISABLE_TIMING)?;
    let (stream, event) = (their_stream.raw(), their_event.raw());

    // 1. In: the other runtime allocates and fills; cuhal imports, waits, copies.
    let mut theirs = 0;
    // SAFETY: valid out-pointer; the context is current.
    unsafe { cu!(api, cuMemAlloc(&mut theirs, BYTES)) }?;
    // SAFETY: `theirs` is BYTES of device memory; the stream and event are live.
    unsafe {
        cu!(api, cuMemsetD32Async(theirs, 0x1234_5678, WORDS, stream))?;
        cu!(api, cuEventRecord(event, stream))?;
    }
    let released = Arc::new(AtomicBool::new(false));
    let release = {
        let (context, released) = (context.clone(), released.clone());
        Box::new(move || {
            // Runs once, after cuhal's last use: the owner frees its memory.
            if let Ok(_bound) = context.enter() {
                let api = context.api();
                // SAFETY: allocated above, freed once, no longer used by anyone.
                let _ = unsafe { cu!(api, cuMemFree(theirs)) };
            }
            released.store(true, Ordering::SeqCst);
        })
    };
    // SAFETY: the memory stays allocated until the release callback frees it.
    let imported = unsafe { device.import_buffer(theirs, BYTES, Some(release)) }?;
    // SAFETY: the event outlives every wait on it (`their_event` drops at the end, after a sync).
    let foreign_event = unsafe { ForeignEvent::from_raw(event, None) };
    let ours = device.create_buffer(BYTES)?;
    let timeline = device.create_semaphore(0);
    q.wait_event(&[], &[(&timeline, 1)], &foreign_event)?;
    q.copy(
        &[(&timeline, 1)],
        &[(&timeline, 2)],
        &imported.whole(),
        &ours.whole(),
    )?;
    drop(imported);
    timeline.wait(2, Duration::from_secs(10))?;
    check(&ours, 0x1234_5678, "imported buffer copied by cuhal")?;
    // The completion thread drops the copy's handle just after signalling.
    for _ in 0..1000 {
        if released.load(Ordering::SeqCst) {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    println!(
        "1. in:  foreign buffer + event -> cuhal copy: ok; release callback ran: {}",
        released.load(Ordering::SeqCst)
    );

    // 2. Out: cuhal fills; the other runtime waits on the exported timepoint and copies.
    let filled = device.create_buffer(BYTES)?;
    q.fill(
        &[],
        &[(&timeline, 3)],
        &filled.whole(),
        FillPattern::U32(0xcafe),
    )?;
    let exported = device.export_timepoint(&timeline, 3, Duration::from_secs(10))?;
    let lent = ExportedBuffer::new(&filled)?;
    let mut copy_of = 0;
    // SAFETY: valid out-pointer; then a stream-ordered copy between two live allocations,
    // behind a device-side wait on the exported event (kept until the wait is enqueued).
    unsafe {
        cu!(api, cuMemAlloc(&mut copy_of, BYTES))?;
        cu!(api, cuStreamWaitEvent(stream, exported.raw(), 0))?;
        cu!(
            api,
            cuMemcpyDtoDAsync(copy_of, lent.device_ptr(), lent.len(), stream)
        )?;
    }
    drop(exported);
    // SAFETY: the stream is live.
    unsafe { cu!(api, cuStreamSynchronize(stream)) }?;
    drop(lent);
    let mut words = vec![0u32; WORDS];
    // SAFETY: `words` holds BYTES; `copy_of` is BYTES of device memory, then freed once.
    unsafe {
        cu!(api, cuMemcpyDtoH(words.as_mut_ptr().cast(), copy_of, BYTES))?;
        cu!(api, cuMemFree(copy_of))?;
    }
    if words.iter().any(|&w| w != 0xcafe) {
        return Err("the foreign copy ran before cuhal's fill".into());
    }
    println!("2. out: cuhal fill -> exported timepoint -> foreign copy: ok");

    // 3. A library call in a graph command buffer.
    match Cublas::load() {
        Ok(cublas) => gemm(&device, Arc::new(cublas))?,
        Err(e) if require_library => return Err(e.into()),
        Err(e) => println!("3. library: skipped, {e}"),
    }

    Ok(())
}

/// `C = A * B` (n x n, all ones, so every element of C is n) between two fills, as a graph.
fn gemm(device: &cuhal::Device, cublas: Arc<Cublas>) -> Result {
    const N: usize = 512;
    let q = device.queue(0);
    let bytes = N * N * 4;
    let (a, b, c) = (
        device.create_buffer(bytes)?,
        device.create_buffer(bytes)?,
        device.create_buffer(bytes)?,
    );
    let workspace = device.create_buffer(32 << 20)?;
    // SAFETY: the workspace is device memory that outlives every use of the handle (it is
    // dropped after the last GEMM has completed, below).
    unsafe { cublas.set_workspace(workspace.device_ptr(), workspace.len()) }?;
    // Warm cuBLAS up outside any capture (its first call may load modules, which capture
    // forbids), with a GEMM on the queue's own stream.
    let work: Arc<StreamWorkFn> = {
        let cublas = cublas.clone();
        Arc::new(move |on: &StreamWork<'_>| {
            let [a, b, c] = on.ranges() else {
                return Err("three ranges".into());
            };
            // SAFETY: the three ranges are n x n floats of device memory the command buffer
            // retains; `on.stream()` is a live stream of the device.
            unsafe { cublas.sgemm(on.stream(), N, N, N, a.ptr, b.ptr, c.ptr) }?;
            Ok(())
        })
    };
    // SAFETY: the buffers are n x n floats, alive until the queue is drained; the queue's
    // stream is live.
    unsafe {
        cublas.sgemm(
            q.stream(),
            N,
            N,
            N,
            a.device_ptr(),
            b.device_ptr(),
            c.device_ptr(),
        )
    }?;

    let mut cb = q.create_command_buffer()?;
    cb.fill(&a.whole(), FillPattern::U32(1.0f32.to_bits()))?;
    cb.fill(&b.whole(), FillPattern::U32(1.0f32.to_bits()))?;
    cb.barrier()?;
    cb.stream_work(&[a.whole(), b.whole(), c.whole()], work)?;
    let cb: Arc<dyn CommandBuffer> = cb.end()?;
    let done = device.create_semaphore(0);
    q.execute(&[], &[(&done, 1)], &[&cb])?;
    done.wait(1, Duration::from_secs(10))?;
    check(
        &c,
        (N as f32).to_bits(),
        "cuBLAS GEMM in a graph command buffer",
    )?;
    println!("3. library: cuBLAS SGEMM {N}^3 captured into a graph command buffer: ok");
    drop(cb);
    drop(workspace);
    Ok(())
}

fn check(buffer: &cuhal::Buffer, expected: u32, what: &str) -> Result {
    let mut bytes = vec![0u8; buffer.len()];
    buffer.read(0, &mut bytes)?;
    if bytes
        .chunks_exact(4)
        .any(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]) != expected)
    {
        return Err(format!("{what}: wrong result").into());
    }
    Ok(())
}
