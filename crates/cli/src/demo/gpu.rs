//! The demo's pipeline on a GPU, through the device crate, traced at FINE verbosity.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cuhal::{CommandBuffer, DeviceOptions, Dispatch, Driver, FillPattern, KernelArgs, Verbosity};
use cuhal_sys::DeviceInfo;
use cuhal_trace::sink::{Fanout, JsonSink, MemorySink, Sink};

use super::{ELEMENTS, Options, Summary, busy_time, check, input};

/// `out[i] = fma(in[i], a, b)` for `i < n`.
pub(super) const SCALE_ADD_PTX: &str = include_str!("scale_add.ptx");

/// Records the demo's transform on `queue`: `middle = 2 * input + 1` ("scale"), a barrier, then
/// `output = 0.5 * middle - 0.5` ("unscale"), so `output` holds `input` again. The one-GPU and
/// the two-GPU pipelines run it.
pub(super) fn record_transform(
    queue: &cuhal::Queue,
    scale_add: &cuhal::Function,
    [input, middle, output]: [&Arc<cuhal::Buffer>; 3],
) -> Result<Arc<dyn CommandBuffer>> {
    let block = 256u32;
    let grid = (ELEMENTS as u32).div_ceil(block);
    let args = |from: &Arc<cuhal::Buffer>, to: &Arc<cuhal::Buffer>, a: f32, b: f32| {
        KernelArgs::new()
            .with_range(&from.whole())
            .with_range(&to.whole())
            .with(a)
            .with(b)
            .with(ELEMENTS as u32)
    };
    let mut transform = queue.create_command_buffer()?;
    transform.begin_debug_group("scale")?;
    let scale_args = args(input, middle, 2.0, 1.0);
    transform.dispatch(&Dispatch::new(
        scale_add,
        [grid, 1, 1],
        [block, 1, 1],
        &scale_args,
    ))?;
    transform.end_debug_group()?;
    transform.barrier()?;
    transform.begin_debug_group("unscale")?;
    let unscale_args = args(middle, output, 0.5, -0.5);
    transform.dispatch(&Dispatch::new(
        scale_add,
        [grid, 1, 1],
        [block, 1, 1],
        &unscale_args,
    ))?;
    transform.end_debug_group()?;
    Ok(transform.end()?)
}

/// Runs the pipeline on device 0.
pub fn run(driver: &Driver, info: &DeviceInfo, options: &Options) -> Result<Summary> {
    println!(
        "running on {} (compute capability {}.{}), CUDA driver {}",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        cuhal_sys::format_cuda_version(driver.version())
    );
    let memory = Arc::new(MemorySink::new());
    let json = Arc::new(JsonSink::create(&options.trace).context("creating the trace file")?);
    #[allow(unused_mut)] // only the `tracy` feature adds a sink
    let mut sinks: Vec<Arc<dyn Sink>> = vec![memory.clone(), json.clone()];
    #[cfg(feature = "tracy")]
    sinks.push(Arc::new(cuhal_trace::TracySink::new()));
    let sink: Arc<dyn Sink> = Arc::new(Fanout::new(sinks));
    let device = driver.open(
        0,
        DeviceOptions {
            queues: 2,
            tracing: Verbosity::Fine,
            trace_sink: Some(sink),
            ..DeviceOptions::default()
        },
    )?;
    let executable = device.load_ptx(SCALE_ADD_PTX)?;
    let scale_add = executable.function("scale_add")?;
    let bytes = ELEMENTS * 4;
    let [input_buf, middle, output, copy] = [(); 4].map(|()| device.create_buffer(bytes));
    let (input_buf, middle, output, copy) = (input_buf?, middle?, output?, copy?);
    let host = device.create_host_buffer(bytes)?;
    let (upload, compute) = (device.queue(0), device.queue(1));

    let transform = record_transform(compute, &scale_add, [&input_buf, &middle, &output])?;

    let mut publish = upload.create_command_buffer()?;
    publish.begin_debug_group("publish")?;
    publish.copy(&output.whole(), &copy.whole())?;
    publish.fill(&middle.whole(), FillPattern::U32(0x7fc0_0000))?;
    publish.end_debug_group()?;
    let publish: Arc<dyn CommandBuffer> = publish.end()?;

    let [uploaded, transformed, copied, read] = [(); 4].map(|()| device.create_semaphore(0));
    let start = Instant::now();
    let mut submissions = 0;
    let mut checked = 0;
    for i in 1..=options.iterations {
        let data = input(0x5eed ^ i, ELEMENTS);
        let raw: Vec<u8> = data.iter().flat_map(|x| x.to_ne_bytes()).collect();
        upload.write(
            &[(&read, i - 1)],
            &[(&uploaded, i)],
            &input_buf.whole(),
            &raw,
        )?;
        compute.execute(&[(&uploaded, i)], &[(&transformed, i)], &[&transform])?;
        upload.execute(&[(&transformed, i)], &[(&copied, i)], &[&publish])?;
        compute.read(&[(&copied, i)], &[(&read, i)], &copy.whole(), &host, 0)?;
        submissions += 4;
        read.wait(i, Duration::from_secs(30))
            .with_context(|| format!("waiting for iteration {i}"))?;
        let mut result = vec![0u8; bytes];
        host.read(0, &mut result)?;
        let values = result
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
        check(i, values, &data)?;
        checked += ELEMENTS as u64;
    }
    let wall = start.elapsed();
    // Dropping the device joins the completion threads, so every zone is collected.
    drop((transform, publish));
    drop(device);
    json.finish().context("writing the trace file")?;
    // Read after the device is gone: its last collection may have counted drops too.
    let dropped: u64 = cuhal_trace::DropReason::ALL
        .iter()
        .map(|&reason| memory.dropped(reason))
        .sum();
    let zones = memory.zones();
    // Two traced submissions per iteration (the transform and the publish); the writes and
    // reads are queue operations without command buffers.
    let links = super::check_trace(&options.trace, 2 * options.iterations as usize)
        .context("checking the trace")?;
    Ok(Summary {
        backend: format!(
            "{} (2 queues, graph command buffers, FINE tracing)",
            info.name
        ),
        submissions,
        checked,
        wall,
        busy: busy_time(
            zones
                .iter()
                .filter(|z| z.depth == 0)
                .map(|z| (z.begin_ns, z.end_ns))
                .collect(),
        ),
        zones: zones.len(),
        dropped,
        links: Some(links),
    })
}
