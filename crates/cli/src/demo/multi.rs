//! The demo's pipeline across two GPUs: each GPU transforms its own fresh data with a graph
//! command buffer (`y = 0.5 (2x + 1) - 0.5`, the single-GPU pipeline's kernels), one NCCL
//! all-reduce (sum) over both GPUs adds the two results, and both GPUs' copies are read back and
//! checked bit for bit against the CPU (`f32` addition of two values is the same in either
//! order). Both devices trace at FINE verbosity into one Perfetto file, which is read back and
//! checked like the single-GPU trace.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cuhal::{
    CollectivePart, CommandBuffer, Communicator, CommunicatorOptions, DeviceOptions, Driver, Nccl,
    NcclDataType, NcclRedOp, Verbosity,
};
use cuhal_trace::sink::{Fanout, JsonSink, MemorySink, Sink};

use super::{ELEMENTS, Options, TraceCheck, expected, input};

/// What the run across GPUs did.
#[derive(Debug, Clone)]
pub struct AcrossSummary {
    /// The GPUs' names.
    pub gpus: Vec<String>,
    /// Elements checked, over both GPUs.
    pub checked: u64,
    /// Wall time.
    pub wall: Duration,
    /// GPU submission zones traced on GPUs 0 and 1.
    pub zones: [usize; 2],
    /// The trace, checked.
    pub links: TraceCheck,
    /// Where the trace went.
    pub trace: std::path::PathBuf,
}

/// Where the trace across GPUs goes: beside the single-GPU one.
pub fn trace_path(options: &Options) -> std::path::PathBuf {
    let stem = options.trace.file_stem().map_or_else(
        || "cuhal-trace".into(),
        |s| s.to_string_lossy().into_owned(),
    );
    options.trace.with_file_name(format!("{stem}-2gpu.json"))
}

/// Runs the pipeline across GPUs 0 and 1 (the caller checked there are two).
pub fn run(driver: &Driver, nccl: &Nccl, options: &Options) -> Result<AcrossSummary> {
    let trace = trace_path(options);
    let memory = Arc::new(MemorySink::new());
    let json = Arc::new(JsonSink::create(&trace).context("creating the trace file")?);
    let sink: Arc<dyn Sink> = Arc::new(Fanout::new(vec![memory.clone(), json.clone()]));
    let devices = driver.open_many(
        &[0, 1],
        DeviceOptions {
            tracing: Verbosity::Fine,
            trace_sink: Some(sink),
            ..DeviceOptions::default()
        },
    )?;
    let comm = Communicator::local(
        nccl,
        &[&devices[0], &devices[1]],
        CommunicatorOptions::default(),
    )?;
    let bytes = ELEMENTS * 4;
    struct Gpu {
        input: Arc<cuhal::Buffer>,
        output: Arc<cuhal::Buffer>,
        host: Arc<cuhal::HostBuffer>,
        transform: Arc<dyn CommandBuffer>,
        _executable: cuhal::Executable,
    }
    let mut gpus = Vec::new();
    for device in &devices {
        let executable = device.load_ptx(super::gpu::SCALE_ADD_PTX)?;
        let scale_add = executable.function("scale_add")?;
        let [input_buf, middle, output] = [(); 3].map(|()| device.create_buffer(bytes));
        let (input_buf, middle, output) = (input_buf?, middle?, output?);
        let transform = super::gpu::record_transform(
            device.queue(0),
            &scale_add,
            [&input_buf, &middle, &output],
        )?;
        gpus.push(Gpu {
            input: input_buf,
            output,
            host: device.create_host_buffer(bytes)?,
            transform,
            _executable: executable,
        });
    }
    let sems: Vec<[cuhal::Semaphore; 4]> = devices
        .iter()
        .map(|d| [(); 4].map(|()| d.create_semaphore(0)))
        .collect();
    let start = Instant::now();
    let mut checked = 0;
    for i in 1..=options.iterations {
        let data: Vec<Vec<f32>> = (0..2)
            .map(|rank| input(0x2c0de ^ (i << 1) ^ rank, ELEMENTS))
            .collect();
        for (((device, gpu), [uploaded, transformed, _, read]), values) in
            devices.iter().zip(&gpus).zip(&sems).zip(&data)
        {
            let raw: Vec<u8> = values.iter().flat_map(|x| x.to_ne_bytes()).collect();
            let queue = device.queue(0);
            queue.write(&[(read, i - 1)], &[(uploaded, i)], &gpu.input.whole(), &raw)?;
            queue.execute(&[(uploaded, i)], &[(transformed, i)], &[&gpu.transform])?;
        }
        let waits: Vec<[(&cuhal::Semaphore, u64); 1]> = sems.iter().map(|s| [(&s[1], i)]).collect();
        let signals: Vec<[(&cuhal::Semaphore, u64); 1]> =
            sems.iter().map(|s| [(&s[2], i)]).collect();
        let parts: Vec<CollectivePart<'_>> = gpus
            .iter()
            .zip(waits.iter().zip(&signals))
            .map(|(gpu, (w, s))| {
                let range = gpu.output.whole();
                CollectivePart::all_reduce(
                    &range,
                    &range,
                    ELEMENTS,
                    NcclDataType::F32,
                    NcclRedOp::Sum,
                )
                .waits(w)
                .signals(s)
            })
            .collect();
        comm.submit(&parts)?;
        for ((device, gpu), [_, _, reduced, read]) in devices.iter().zip(&gpus).zip(&sems) {
            device.queue(0).read(
                &[(reduced, i)],
                &[(read, i)],
                &gpu.output.whole(),
                &gpu.host,
                0,
            )?;
        }
        for ((device, gpu), [.., read]) in devices.iter().zip(&gpus).zip(&sems) {
            read.wait(i, Duration::from_secs(30)).with_context(|| {
                format!("waiting for iteration {i} on GPU {}", device.info().ordinal)
            })?;
            let mut result = vec![0u8; bytes];
            gpu.host.read(0, &mut result)?;
            for (index, (got, (a, b))) in result
                .chunks_exact(4)
                .zip(data[0].iter().zip(&data[1]))
                .enumerate()
            {
                let got = f32::from_ne_bytes([got[0], got[1], got[2], got[3]]);
                let want = expected(*a) + expected(*b);
                if got.to_bits() != want.to_bits() {
                    bail!(
                        "iteration {i}, GPU {}, element {index}: got {got}, expected {want}",
                        device.info().ordinal
                    );
                }
            }
            checked += ELEMENTS as u64;
        }
    }
    let wall = start.elapsed();
    let names = devices.iter().map(|d| d.info().name.clone()).collect();
    drop(gpus);
    drop(comm);
    drop(devices);
    json.finish().context("writing the trace file")?;
    // One traced submission per GPU and iteration (the transform).
    let links = super::check_trace(&trace, 2 * options.iterations as usize)
        .context("checking the trace across GPUs")?;
    // Both GPUs traced: each GPU's queue has its GPU submission zones.
    let text = std::fs::read_to_string(&trace)?;
    let events: Vec<serde_json::Value> = serde_json::from_str(&text)?;
    let on = |device: u32| submission_zones_on(&events, device);
    let zones = [on(0), on(1)];
    if zones != [options.iterations as usize; 2] {
        bail!(
            "expected {} GPU submission zones on each GPU, found {zones:?}",
            options.iterations
        );
    }
    let _ = memory.zones();
    Ok(AcrossSummary {
        gpus: names,
        checked,
        wall,
        zones,
        links,
        trace,
    })
}

/// The GPU submission zones of `events` (a Perfetto JSON trace) whose queue is one of GPU
/// `device`'s: a queue's tracing label is `GPU <ordinal> queue <index>` (the zone's `ordinal`
/// arg is the submission's number on its queue, not the device's).
fn submission_zones_on(events: &[serde_json::Value], device: u32) -> usize {
    let prefix = format!("GPU {device} queue ");
    events
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "submission")
        .filter(|e| {
            e["args"]["queue"]
                .as_str()
                .is_some_and(|q| q.starts_with(&prefix))
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::submission_zones_on;

    #[test]
    fn submission_zones_are_counted_per_gpu_by_their_queue() {
        let zone = |queue: &str, ordinal: u64| {
            serde_json::json!({"ph": "X", "name": "submission",
                "args": {"queue": queue, "ordinal": ordinal}})
        };
        let events = vec![
            zone("GPU 0 queue 0", 1),
            zone("GPU 0 queue 1", 1),
            zone("GPU 1 queue 0", 0),
            zone("GPU 10 queue 0", 1),
            serde_json::json!({"ph": "X", "name": "submit", "args": {"queue": "GPU 1 queue 0"}}),
            serde_json::json!({"ph": "s", "name": "submission", "args": {"queue": "GPU 1 queue 0"}}),
        ];
        assert_eq!(submission_zones_on(&events, 0), 2);
        assert_eq!(submission_zones_on(&events, 1), 1);
        assert_eq!(submission_zones_on(&events, 2), 0);
    }
}
