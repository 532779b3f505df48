//! The demo's pipeline on the scheduler's CPU host backend: the same steps, semaphores and
//! checks as on the GPU, with host closures standing in for the transfers and kernels.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cuhal_scheduler::host::{self, HostPayload, HostSemaphore};
use cuhal_scheduler::{Cleanups, QueueOptions, Resources};
use cuhal_semaphore::Failure;
use cuhal_trace::sink::{Fanout, JsonSink, MemorySink, Sink, TrackId};

use super::{ELEMENTS, Options, Summary, busy_time, check, expected, input};

type Data = Arc<Mutex<Vec<f32>>>;

/// Runs the pipeline on two host queues; `why` says why not on a GPU.
pub fn run(options: &Options, why: &str) -> Result<Summary> {
    println!("no GPU used ({why}): running the pipeline on the scheduler's CPU host backend");
    let memory = Arc::new(MemorySink::new());
    let json = Arc::new(JsonSink::create(&options.trace).context("creating the trace file")?);
    let sink: Arc<dyn Sink> = Arc::new(Fanout::new(vec![memory.clone(), json.clone()]));
    let now = cuhal_trace::clock::now_ns();
    let tracks = [
        sink.register_gpu_track("host queue 0", now)?,
        sink.register_gpu_track("host queue 1", now)?,
    ];
    let queues = [
        host::queue(QueueOptions::new("demo-host-0"))?,
        host::queue(QueueOptions::new("demo-host-1"))?,
    ];
    let [uploaded, transformed, copied, read] = [(); 4].map(|()| HostSemaphore::new(0));
    let device_in: Data = Arc::new(Mutex::new(vec![0.0; ELEMENTS]));
    let device_out: Data = Arc::new(Mutex::new(vec![0.0; ELEMENTS]));
    let device_copy: Data = Arc::new(Mutex::new(vec![0.0; ELEMENTS]));
    let host_result: Data = Arc::new(Mutex::new(vec![0.0; ELEMENTS]));

    let start = Instant::now();
    let mut submissions = 0;
    let mut checked = 0;
    for i in 1..=options.iterations {
        let data = input(0x5eed ^ i, ELEMENTS);
        let step = |track: TrackId, name: &'static str, work: Box<dyn FnOnce() + Send>| {
            let sink = sink.clone();
            HostPayload::once(move || {
                sink.gpu_zone_begin(track, name, cuhal_trace::clock::now_ns());
                work();
                sink.gpu_zone_end(track, cuhal_trace::clock::now_ns());
                Ok::<(), Failure>(())
            })
        };
        let (to, upload_data) = (device_in.clone(), data.clone());
        queues[0].submit(
            &[(&read, i - 1)],
            &[(&uploaded, i)],
            step(
                tracks[0],
                "upload",
                Box::new(move || lock(&to).copy_from_slice(&upload_data)),
            ),
            Resources::new(),
            Cleanups::new(),
        )?;
        let (from, to) = (device_in.clone(), device_out.clone());
        queues[1].submit(
            &[(&uploaded, i)],
            &[(&transformed, i)],
            step(
                tracks[1],
                "transform",
                Box::new(move || {
                    let from = lock(&from);
                    for (out, x) in lock(&to).iter_mut().zip(from.iter()) {
                        *out = expected(*x);
                    }
                }),
            ),
            Resources::new(),
            Cleanups::new(),
        )?;
        let (from, to) = (device_out.clone(), device_copy.clone());
        queues[0].submit(
            &[(&transformed, i)],
            &[(&copied, i)],
            step(
                tracks[0],
                "copy",
                Box::new(move || lock(&to).copy_from_slice(&lock(&from))),
            ),
            Resources::new(),
            Cleanups::new(),
        )?;
        let (from, to) = (device_copy.clone(), host_result.clone());
        queues[1].submit(
            &[(&copied, i)],
            &[(&read, i)],
            step(
                tracks[1],
                "read back",
                Box::new(move || lock(&to).copy_from_slice(&lock(&from))),
            ),
            Resources::new(),
            Cleanups::new(),
        )?;
        submissions += 4;
        read.wait(i, Duration::from_secs(30))
            .with_context(|| format!("waiting for iteration {i}"))?;
        let result = lock(&host_result);
        check(i, result.iter().copied(), &data)?;
        checked += ELEMENTS as u64;
    }
    let wall = start.elapsed();
    drop(queues);
    json.finish().context("writing the trace file")?;
    let zones = memory.zones();
    Ok(Summary {
        backend: "the CPU host backend of cuhal-scheduler (2 queues)".into(),
        submissions,
        checked,
        wall,
        busy: busy_time(zones.iter().map(|z| (z.begin_ns, z.end_ns)).collect()),
        zones: zones.len(),
        dropped: 0,
        links: None,
    })
}

fn lock(data: &Data) -> std::sync::MutexGuard<'_, Vec<f32>> {
    data.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
