//! A service on tokio: many concurrent tasks on a runtime of 2 worker threads, each sending
//! requests through the GPU and awaiting them with `Semaphore::wait_async`, no thread blocked
//! per request.
//!
//! A request of task `t`: write request-unique bytes to the task's buffer, copy them within it
//! through a command buffer recorded once per task, read the copy back into pinned host memory,
//! each step ordered after the one before by the task's own semaphore (three submissions); the
//! task awaits the read's signal, then checks the bytes. Prints submissions/s and the requests'
//! p50 and p99 latency (first submission to result checked). `--blocking` runs the same load
//! with one blocking OS thread per task (`Semaphore::wait`), for comparison.
//!
//! ```text
//! cargo run -p cuhal --release --example tokio_service [-- --blocking] [--tasks N] [--requests N]
//! ```
//!
//! Without a CUDA driver (or device) it says so and exits successfully. With
//! `CUHAL_CUDA_LIBRARY` naming the fake driver's library it runs on the CPU.

use std::error::Error;
mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuhal::{Buffer, CommandBuffer, Device, DeviceOptions, Driver, HostBuffer, Semaphore};

/// Bytes a request writes, copies and reads back.
const REQUEST_BYTES: usize = 64;
/// How long a blocking wait may take before the request is called failed.
const WAIT_LIMIT: Duration = Duration::from_secs(30);

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

/// What the command line asks for.
struct Options {
    tasks: usize,
    requests: usize,
    blocking: bool,
}

fn parse() -> std::result::Result<Options, String> {
    let mut options = Options {
        tasks: 1_000,
        requests: 10,
        blocking: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> std::result::Result<usize, String> {
            args.next()
                .and_then(|n| n.parse().ok())
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{name} needs a positive number"))
        };
        match arg.as_str() {
            "--blocking" => options.blocking = true,
            "--tasks" => options.tasks = number("--tasks")?,
            "--requests" => options.requests = number("--requests")?,
            other => {
                return Err(format!(
                    "unknown argument {other:?} (usage: tokio_service [--blocking] [--tasks N] [--requests N])"
                ));
            }
        }
    }
    Ok(options)
}

fn main() -> ExitCode {
    let options = match parse() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("tokio_service: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(driver) = common::driver_with_a_device() else {
        return ExitCode::SUCCESS;
    };
    match run(&driver, &options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tokio_service: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One task's own resources: a device buffer (the request at 0, its copy after it), the
/// command buffer that copies, pinned memory to read into, and its timeline.
struct Task {
    queue: usize,
    buffer: Arc<Buffer>,
    copy: Arc<dyn CommandBuffer>,
    host: Arc<HostBuffer>,
    timeline: Semaphore,
}

impl Task {
    fn new(device: &Device, index: usize) -> Result<Self> {
        let queue = index % device.queues().len();
        let buffer = device.create_buffer(2 * REQUEST_BYTES)?;
        let mut cb = device.queue(queue).create_command_buffer()?;
        cb.copy(
            &buffer.range(0, REQUEST_BYTES)?,
            &buffer.range(REQUEST_BYTES, REQUEST_BYTES)?,
        )?;
        Ok(Task {
            queue,
            buffer,
            copy: cb.end()?,
            host: device.create_host_buffer(REQUEST_BYTES)?,
            timeline: device.create_semaphore(0),
        })
    }

    /// Submits request `request` of task `task`: write, copy, read back, each after the one
    /// before; returns the bytes it sent and the value its read signals.
    fn submit(&self, device: &Device, task: usize, request: usize) -> Result<(Vec<u8>, u64)> {
        let queue = device.queue(self.queue);
        let base = 3 * request as u64;
        let (written, copied, read) = (base + 1, base + 2, base + 3);
        let sent = payload(task, request);
        let t = &self.timeline;
        queue.write(
            &[(t, base)],
            &[(t, written)],
            &self.buffer.range(0, REQUEST_BYTES)?,
            &sent,
        )?;
        queue.execute(&[(t, written)], &[(t, copied)], &[&self.copy])?;
        queue.read(
            &[(t, copied)],
            &[(t, read)],
            &self.buffer.range(REQUEST_BYTES, REQUEST_BYTES)?,
            &self.host,
            0,
        )?;
        Ok((sent, read))
    }

    /// Checks what the read brought back against what the request sent.
    fn check(&self, sent: &[u8], task: usize, request: usize) -> Result<()> {
        let mut got = vec![0u8; REQUEST_BYTES];
        self.host.read(0, &mut got)?;
        if got != sent {
            return Err(format!(
                "task {task}, request {request}: read back {got:?}, sent {sent:?}"
            )
            .into());
        }
        Ok(())
    }
}

/// Request-unique bytes.
fn payload(task: usize, request: usize) -> Vec<u8> {
    let seed = (task as u64) << 32 | request as u64;
    (0..REQUEST_BYTES as u64)
        .map(|i| {
            (seed
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .wrapping_add(i * 131)
                >> 24) as u8
        })
        .collect()
}

/// Every request's latency, in order of completion; the run's wall time.
struct Measured {
    latencies: Vec<Duration>,
    wall: Duration,
}

fn run(driver: &Driver, options: &Options) -> Result<()> {
    let device = Arc::new(driver.open(
        0,
        DeviceOptions {
            queues: 2,
            ..DeviceOptions::default()
        },
    )?);
    println!("{}", device.info().name);
    let tasks: Vec<Arc<Task>> = (0..options.tasks)
        .map(|i| Task::new(&device, i).map(Arc::new))
        .collect::<Result<_>>()?;
    let (what, measured) = if options.blocking {
        (
            format!("{} blocking OS threads", options.tasks),
            blocking(&device, &tasks, options.requests)?,
        )
    } else {
        (
            format!("{} tokio tasks on 2 worker threads", options.tasks),
            on_tokio(&device, &tasks, options.requests)?,
        )
    };
    report(&what, measured);
    Ok(())
}

/// The load on a tokio runtime of 2 worker threads: one task per [`Task`], awaiting each
/// request with `wait_async`.
fn on_tokio(device: &Arc<Device>, tasks: &[Arc<Task>], requests: usize) -> Result<Measured> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()?;
    runtime.block_on(async {
        let start = Instant::now();
        let handles: Vec<_> = tasks
            .iter()
            .enumerate()
            .map(|(index, task)| {
                let (device, task) = (device.clone(), task.clone());
                tokio::spawn(async move {
                    let mut latencies = Vec::with_capacity(requests);
                    for request in 0..requests {
                        let t0 = Instant::now();
                        let (sent, value) = task.submit(&device, index, request)?;
                        task.timeline.wait_async(value).await?;
                        task.check(&sent, index, request)?;
                        latencies.push(t0.elapsed());
                    }
                    Ok::<_, Box<dyn Error + Send + Sync>>(latencies)
                })
            })
            .collect();
        let mut latencies = Vec::with_capacity(tasks.len() * requests);
        for handle in handles {
            latencies.extend(handle.await??);
        }
        Ok(Measured {
            latencies,
            wall: start.elapsed(),
        })
    })
}

/// The same load with one OS thread per task, each blocking in `Semaphore::wait`.
fn blocking(device: &Arc<Device>, tasks: &[Arc<Task>], requests: usize) -> Result<Measured> {
    let start = Instant::now();
    let per_task: Vec<Result<Vec<Duration>>> = std::thread::scope(|scope| {
        let threads: Vec<_> = tasks
            .iter()
            .enumerate()
            .map(|(index, task)| {
                scope.spawn(move || {
                    let mut latencies = Vec::with_capacity(requests);
                    for request in 0..requests {
                        let t0 = Instant::now();
                        let (sent, value) = task.submit(device, index, request)?;
                        task.timeline.wait(value, WAIT_LIMIT)?;
                        task.check(&sent, index, request)?;
                        latencies.push(t0.elapsed());
                    }
                    Ok(latencies)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err("a task's thread panicked".into()))
            })
            .collect()
    });
    let wall = start.elapsed();
    let mut latencies = Vec::with_capacity(tasks.len() * requests);
    for task in per_task {
        latencies.extend(task?);
    }
    Ok(Measured { latencies, wall })
}

fn report(what: &str, mut measured: Measured) {
    measured.latencies.sort_unstable();
    let requests = measured.latencies.len();
    let percentile = |p: f64| {
        let index = ((requests as f64 * p).ceil() as usize).clamp(1, requests) - 1;
        measured.latencies[index]
    };
    let seconds = measured.wall.as_secs_f64();
    println!(
        "{what}: {requests} requests ({} submissions) checked in {:.2} s: {:.0} submissions/s, {:.0} requests/s; request latency p50 {:.1} us, p99 {:.1} us",
        3 * requests,
        seconds,
        3.0 * requests as f64 / seconds,
        requests as f64 / seconds,
        micros(percentile(0.50)),
        micros(percentile(0.99)),
    );
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
