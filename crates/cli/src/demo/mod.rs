//! `cuhal demo`: one pipeline, two queues, traced.
//!
//! Each iteration uploads fresh random data on queue 0, transforms it on queue 1 with a graph
//! command buffer of two dispatches (`y = 2x + 1`, then `z = 0.5y - 0.5`, each in its own debug
//! group), copies the result on queue 0 with a second command buffer, and reads it back on
//! queue 1. Semaphores order the four steps across the two queues; the host only waits for the read.
//! Every result is checked against the same fused multiply-adds on the CPU, bit for bit.
//!
//! On a GPU the queues trace at FINE verbosity into `cuhal-trace.json` (open it in
//! ui.perfetto.dev), which the demo reads back to check that every traced submission has its
//! host zone, its GPU zone with details, and a flow arrow between them. Without a driver the same pipeline runs on the scheduler's CPU host
//! backend, and says so.
//!
//! With two GPUs and NCCL the demo then runs the pipeline across GPUs 0 and 1 (`multi.rs`):
//! compute on each, one all-reduce over both, every element checked bit for bit, both GPUs
//! traced into `<trace>-2gpu.json`. With fewer GPUs, or no NCCL, it says what it skipped.

mod gpu;
mod host;
mod multi;
mod trace_check;

pub use trace_check::{TraceCheck, check_trace};

use std::path::PathBuf;
use std::time::Duration;

use crate::exit;

/// Elements per iteration.
pub const ELEMENTS: usize = 1 << 20;

/// What the demo does, from the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Pipeline iterations.
    pub iterations: u64,
    /// Where the Perfetto JSON goes.
    pub trace: PathBuf,
    /// Run on the host backend even if a GPU is present.
    pub host: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            iterations: 8,
            trace: PathBuf::from("cuhal-trace.json"),
            host: false,
        }
    }
}

/// Parses `cuhal demo [--iterations N] [--trace PATH] [--host]`.
pub fn parse(args: &[String]) -> Result<Options, String> {
    let mut options = Options::default();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--iterations" => {
                let value = args.next().ok_or("--iterations needs a number")?;
                options.iterations =
                    value.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        format!("--iterations: {value:?} is not a positive number")
                    })?;
            }
            "--trace" => {
                options.trace = args.next().ok_or("--trace needs a path")?.into();
            }
            "--host" => options.host = true,
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    Ok(options)
}

/// What one run did, for the summary.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Where it ran.
    pub backend: String,
    /// Queue operations submitted.
    pub submissions: u64,
    /// Elements checked against the CPU.
    pub checked: u64,
    /// Wall time of the pipeline.
    pub wall: Duration,
    /// Time any queue was busy (union of top-level zones).
    pub busy: Duration,
    /// Zones written to the trace.
    pub zones: usize,
    /// Zones dropped by the tracer.
    pub dropped: u64,
    /// What the trace shows of the submissions, checked (GPU runs only).
    pub links: Option<TraceCheck>,
}

/// The values one element goes through: the same fused multiply-adds as the kernel.
pub fn expected(x: f32) -> f32 {
    x.mul_add(2.0, 1.0).mul_add(0.5, -0.5)
}

/// Checks iteration `iteration`'s `results` against [`expected`] of its `input`, element by
/// element, and names the first that differs.
pub fn check(
    iteration: u64,
    results: impl IntoIterator<Item = f32>,
    input: &[f32],
) -> anyhow::Result<()> {
    for (index, (got, x)) in results.into_iter().zip(input).enumerate() {
        if got.to_bits() != expected(*x).to_bits() {
            anyhow::bail!(
                "iteration {iteration}, element {index}: got {got}, expected {}",
                expected(*x)
            );
        }
    }
    Ok(())
}

/// Random input for iteration `i` (xorshift; values in [-1000, 1000)).
pub fn input(seed: u64, len: usize) -> Vec<f32> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2000.0 - 1000.0
        })
        .collect()
}

/// Union length of `[begin, end)` intervals.
pub fn busy_time(mut intervals: Vec<(u64, u64)>) -> Duration {
    intervals.sort_unstable();
    let mut total = 0;
    let mut current: Option<(u64, u64)> = None;
    for (begin, end) in intervals {
        match &mut current {
            Some((_, e)) if begin <= *e => *e = (*e).max(end),
            _ => {
                if let Some((b, e)) = current {
                    total += e - b;
                }
                current = Some((begin, end));
            }
        }
    }
    if let Some((b, e)) = current {
        total += e - b;
    }
    Duration::from_nanos(total)
}

/// Runs `cuhal demo`.
pub fn run(args: &[String]) -> u8 {
    let options = match parse(args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!(
                "cuhal demo: {message}\nusage: cuhal demo [--iterations N] [--trace PATH] [--host]"
            );
            return exit::USAGE;
        }
    };
    let result = if options.host {
        host::run(&options, "--host")
    } else {
        match cuhal::Driver::load() {
            Ok(driver) => match driver.devices() {
                Ok(devices) if !devices.is_empty() => gpu::run(&driver, &devices[0], &options)
                    .and_then(|summary| {
                        across(&driver, devices.len(), &options)?;
                        Ok(summary)
                    }),
                Ok(_) => host::run(&options, "the CUDA driver sees no device"),
                Err(e) => host::run(&options, &format!("the CUDA driver failed: {e}")),
            },
            Err(cuhal::Error::Driver(cuhal_sys::Error::LibraryNotFound { .. })) => host::run(
                &options,
                "no CUDA driver found; CUHAL_CUDA_LIBRARY can point at libcuda.so.1",
            ),
            Err(e) => host::run(&options, &format!("the CUDA driver could not be used: {e}")),
        }
    };
    match result {
        Ok(summary) => {
            print_summary(&summary, &options);
            if summary.links.is_none() {
                println!("skipped: the pipeline across GPUs (it needs 2 GPUs; this run had none)");
            }
            exit::OK
        }
        Err(e) => {
            eprintln!("cuhal demo failed: {e:#}");
            exit::FAILURE
        }
    }
}

/// The pipeline across two GPUs when there are two and NCCL loads; otherwise says what it
/// skipped.
fn across(driver: &cuhal::Driver, gpus: usize, options: &Options) -> anyhow::Result<()> {
    if gpus < 2 {
        println!("skipped: the pipeline across GPUs (needs 2 GPUs, {gpus} found)");
        return Ok(());
    }
    static NVLS: std::sync::Once = std::sync::Once::new();
    NVLS.call_once(|| {
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            // SAFETY: set once, before NCCL is loaded, on the demo's only thread; read only
            // by NCCL afterwards.
            unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
        }
    });
    let nccl = match cuhal::Nccl::load(None) {
        Ok(nccl) => nccl,
        Err(e) => {
            println!("skipped: the pipeline across GPUs (NCCL: {e})");
            return Ok(());
        }
    };
    let s = multi::run(driver, &nccl, options)?;
    println!(
        "across GPUs ({}): {} iterations, compute on each GPU, all-reduce (NCCL {}), {} elements          checked bit for bit: all correct, {:.3} ms",
        s.gpus.join(" + "),
        options.iterations,
        cuhal_sys::format_nccl_version(nccl.version()),
        s.checked,
        s.wall.as_secs_f64() * 1e3
    );
    println!(
        "both GPUs traced ({} and {} submissions; {} linked host to GPU) -> {}",
        s.zones[0],
        s.zones[1],
        s.links.linked,
        s.trace.display()
    );
    Ok(())
}

fn print_summary(s: &Summary, options: &Options) {
    println!("ran on: {}", s.backend);
    println!(
        "{} iterations, {} submissions, {} elements checked: all correct",
        options.iterations, s.submissions, s.checked
    );
    println!(
        "wall time {:.3} ms; queues busy {:.3} ms",
        s.wall.as_secs_f64() * 1e3,
        s.busy.as_secs_f64() * 1e3
    );
    println!(
        "{} zones traced ({} dropped) -> {} (open it in ui.perfetto.dev)",
        s.zones,
        s.dropped,
        options.trace.display()
    );
    if let Some(links) = s.links {
        println!(
            "trace checked: {} submissions linked host to GPU by flow arrows, with details; {} \
             waited on the device for the other queue",
            links.linked, links.device_waits
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn options_parse() {
        assert_eq!(parse(&[]), Ok(Options::default()));
        let o = parse(&args("--iterations 3 --trace t.json --host")).unwrap();
        assert_eq!(o.iterations, 3);
        assert_eq!(o.trace, PathBuf::from("t.json"));
        assert!(o.host);
        assert!(parse(&args("--iterations 0")).is_err());
        assert!(parse(&args("--iterations")).is_err());
        assert!(parse(&args("--frob")).is_err());
    }

    #[test]
    fn the_trace_across_gpus_goes_beside_the_single_gpu_trace() {
        let options = Options {
            trace: PathBuf::from("out/run.json"),
            ..Options::default()
        };
        assert_eq!(
            multi::trace_path(&options),
            PathBuf::from("out/run-2gpu.json")
        );
        assert_eq!(
            multi::trace_path(&Options::default()),
            PathBuf::from("cuhal-trace-2gpu.json")
        );
    }

    #[test]
    fn busy_time_is_the_union() {
        assert_eq!(busy_time(vec![]), Duration::ZERO);
        assert_eq!(
            busy_time(vec![(0, 10), (5, 20), (30, 40), (35, 36)]),
            Duration::from_nanos(30)
        );
    }

    #[test]
    fn inputs_are_fresh_and_in_range() {
        let a = input(1, 1000);
        let b = input(2, 1000);
        assert_ne!(a, b);
        assert!(a.iter().all(|x| (-1000.0..1000.0).contains(x)));
    }

    #[test]
    fn the_host_pipeline_checks_every_element() {
        let dir = std::env::temp_dir().join(format!("cuhal-demo-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let options = Options {
            iterations: 3,
            trace: dir.join("trace.json"),
            host: true,
        };
        let summary = host::run(&options, "test").unwrap();
        assert_eq!(summary.submissions, 12);
        assert_eq!(summary.checked, 3 * ELEMENTS as u64);
        assert_eq!(summary.zones, 12);
        let text = std::fs::read_to_string(&options.trace).unwrap();
        assert!(text.trim_start().starts_with('[') && text.trim_end().ends_with(']'));
        assert!(text.contains("\"transform\""), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
