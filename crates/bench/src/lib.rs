//! The harness behind `cuhal bench`: cuhal against the raw CUDA driver, in one process.
//!
//! Every cuhal figure stands beside a raw-driver floor measured in the same run, with the same
//! kernels, so the ratio says what cuhal costs whatever the machine's day. The run:
//!
//! 1. loads the driver (stopping cleanly without one or without a device), retains device 0's
//!    primary context and compiles the benchmark kernels (hand-written PTX, `gpu::ptx`);
//! 2. measures `%globaltimer`'s resolution, which also proves that kernels run;
//! 3. runs each selected case (`cases`): warm-up, then many timed repetitions of the floor and
//!    of cuhal's side; every case checks on the device that its kernels ran, as often and in the
//!    order expected, and fails loudly otherwise. A failed case is reported and the others run;
//! 4. returns a markdown table (median, p99, the floor beside, ratio, goal, met?) and the raw
//!    figures, and writes the same as JSON (`--json`, default `cuhal-bench.json`).
//!
//! The cuhal side goes through the public API of the `cuhal` crate only (`Driver`, `Device`,
//! `Queue::execute`, semaphores, command buffers; `hal`), with the device opened as a user
//! would, one device per case (and per command-buffer mode or tracing level).
//!
//! The whole run is sized to take well under a minute on an H200, far inside the three minutes
//! it may have (`--quick`: a tenth of that). Progress goes to stderr; [`run`] returns the
//! report for the caller (the `cuhal` binary) to print. docs/benchmarks.md explains each case's
//! method.

pub mod alloc_count;
mod cases;
mod clock;
mod cpu_time;
mod gpu;
mod hal;
mod json;
mod machine;
pub mod options;
mod report;
mod stats;
mod watchdog;

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result};
use cuhal_sys::{CUresult, DriverApi, Error, format_cuda_version};

use cases::{Env, progress};
use clock::{Clock, utc_now};
use gpu::Gpu;
pub use options::{Case, Options};
use report::Report;
use watchdog::Watchdog;

/// The run is given up (exit 1) past this: a full run takes well under a minute.
const WATCHDOG_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

/// How a run ended, for the caller to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The selected cases ran (or failed one by one); the report is also in the JSON file.
    Finished {
        /// The markdown report: facts, the comparison table, the raw figures and the notes.
        markdown: String,
        /// How many cases (or the first-kernel probe) failed; their notes say why.
        failures: usize,
    },
    /// No CUDA driver library could be loaded; the text says what was tried.
    NoDriver(String),
    /// A driver was loaded but sees no usable device; the text says why.
    NoDevice(String),
}

/// Runs the cases `opts` selects and writes the JSON report to `opts.json` (after every case,
/// so a run cut short keeps what it measured). Progress goes to stderr.
///
/// An error is a failure of the run itself (writing the report, an unusable driver); a case
/// that fails is counted in [`Outcome::Finished`] instead. A run that hangs past five minutes
/// is ended by a watchdog with exit status 1, after a line on stderr naming the stage.
pub fn run(opts: &Options) -> Result<Outcome> {
    let started = Instant::now();
    let watchdog = Watchdog::start(
        WATCHDOG_LIMIT,
        format!(
            "The cases finished before it are in {}.",
            opts.json.display()
        ),
    );
    let clock = Clock::new();
    let mut report = Report::default();
    report.fact("date", utc_now());
    report.fact("cuhal", env!("CARGO_PKG_VERSION"));
    report.fact(
        "mode",
        if opts.quick {
            "quick (a tenth of the repetitions: a smoke run, not figures to quote)"
        } else {
            "full"
        },
    );
    report.fact(
        "host",
        format!(
            "{} ({} logical CPUs)",
            machine::cpu_model().unwrap_or_else(|| "unknown CPU".to_owned()),
            machine::logical_cpus()
        ),
    );

    let gpu = if opts.cases.iter().any(|c| c.needs_gpu()) {
        match open_gpu()? {
            Ok(gpu) => Some(gpu),
            Err(stop) => return Ok(stop),
        }
    } else {
        None
    };
    let mut failures = 0;
    let probe = gpu.as_ref().map(|gpu| {
        describe_gpu(gpu, &mut report);
        watchdog.stage("the %globaltimer probe");
        gpu.timer_resolution()
            .context("the first kernel launch (the %globaltimer probe) failed")
    });
    let timer = match probe {
        Some(Err(e)) => {
            let text = format!("no GPU case ran: {e:#}");
            eprintln!("cuhal bench: {text}");
            report.notes.push(text);
            failures += 1;
            None
        }
        Some(Ok(timer)) => {
            report.fact(
                "%globaltimer",
                format!(
                    "smallest step {} ns, mean step {:.0} ns",
                    timer.step_ns, timer.mean_step_ns
                ),
            );
            Some(timer)
        }
        None => None,
    };
    if let (Some(gpu), Some(timer)) = (&gpu, timer) {
        let env = Env {
            gpu,
            clock,
            quick: opts.quick,
            timer,
        };
        for &case in opts.cases.iter().filter(|c| c.needs_gpu()) {
            watchdog.stage(format!("case {} ({})", case.number(), case.name()));
            let result = match case {
                Case::Submit => cases::submit::run(&env, &mut report),
                Case::Wake => cases::wake::run(&env, &mut report),
                Case::Dependency => cases::dependency::run(&env, &mut report),
                Case::Replay => cases::replay::run(&env, &mut report),
                Case::RoundTrip => cases::round_trip::run(&env, &mut report),
                Case::Tracing => cases::tracing::run(&env, &mut report),
                Case::Library => cases::library::run(&env, &mut report),
                Case::Chain => cases::chain::run(&env, &mut report),
                Case::Signal => cases::signal::run(&env, &mut report),
                Case::Bindings => cases::bindings::run(&env, &mut report),
                Case::Pdl => cases::pdl::run(&env, &mut report),
                Case::Collectives => cases::collectives::run(&env, &mut report),
                Case::Waiter => cases::waiter::run(&env, &mut report),
                Case::WaitAsync => cases::wait_async::run(&env, &mut report),
                Case::Decoder => cases::decoder::run(&env, &mut report),
                Case::Scheduler => Ok(()),
            };
            failures += record_failure(case, result, &mut report);
            // Written after every case, so a run cut short still leaves what it measured.
            let _ = write_json(&report, opts);
        }
    }
    if opts.cases.contains(&Case::Scheduler) {
        watchdog.stage("case 7 (scheduler)");
        let result = cases::scheduler::run(opts.quick, clock, &mut report);
        failures += record_failure(Case::Scheduler, result, &mut report);
    }
    watchdog.stage("shutting down");
    drop(gpu);
    drop(watchdog);

    report.fact(
        "bench wall time",
        format!("{:.1} s", started.elapsed().as_secs_f64()),
    );
    write_json(&report, opts)?;
    progress(&format!("wrote {}", opts.json.display()));
    Ok(Outcome::Finished {
        markdown: report.to_markdown(),
        failures,
    })
}

fn write_json(report: &Report, opts: &Options) -> Result<()> {
    let json = report.to_json().to_pretty() + "\n";
    std::fs::write(&opts.json, json).with_context(|| format!("writing {}", opts.json.display()))
}

/// Loads the driver and opens device 0; `Err(outcome)` for the clean stops (no driver, no
/// device), whose text the caller prints as one line, as `cuhal info` does.
fn open_gpu() -> Result<std::result::Result<Gpu, Outcome>> {
    let no_device = |e: &dyn std::fmt::Display| {
        Ok(Err(Outcome::NoDevice(format!(
            "a CUDA driver was found but it sees no device: {e}"
        ))))
    };
    let api = match DriverApi::load() {
        Ok(api) => api,
        Err(e @ Error::LibraryNotFound { .. }) => {
            return Ok(Err(Outcome::NoDriver(format!("no CUDA driver found: {e}"))));
        }
        Err(e) if e.result() == Some(CUresult::ERROR_NO_DEVICE) => return no_device(&e),
        Err(e) => return Err(e).context("the CUDA driver could not be used"),
    };
    match cuhal_sys::device_count(&api) {
        Ok(n) if n > 0 => {}
        Ok(_) => {
            return no_device(&format!(
                "{} reports 0 devices",
                cuhal_sys::cu_name!(cuDeviceGetCount)
            ));
        }
        Err(e) if e.result() == Some(CUresult::ERROR_NO_DEVICE) => return no_device(&e),
        Err(e) => return Err(e).context("counting CUDA devices"),
    }
    Ok(Ok(Gpu::open(Arc::new(api))?))
}

fn describe_gpu(gpu: &Gpu, report: &mut Report) {
    let info = &gpu.info;
    report.fact(
        "gpu",
        format!(
            "{} (compute {}.{}, {} SMs, {:.0} GiB)",
            info.name,
            info.compute_capability.0,
            info.compute_capability.1,
            info.multiprocessors,
            info.total_memory as f64 / (1u64 << 30) as f64
        ),
    );
    let cuda = format_cuda_version(gpu.api().driver_version());
    report.fact(
        "driver",
        match machine::nvidia_module_version() {
            Some(v) => format!("{v} (CUDA {cuda})"),
            None => format!("CUDA {cuda}"),
        },
    );
}

/// Notes a failed case in the report; returns 1 for a failure, else 0.
fn record_failure(case: Case, result: Result<()>, report: &mut Report) -> usize {
    match result {
        Ok(()) => 0,
        Err(e) => {
            let text = format!("case {} ({}) FAILED: {e:#}", case.number(), case.name());
            eprintln!("cuhal bench: {text}");
            report.notes.push(text);
            1
        }
    }
}
