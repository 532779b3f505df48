//! Case 1, submission overhead: the host cost of one submission of a 1-dispatch graph with one
//! wait and one signal, chained (each waits on the one before), in two forms:
//!
//! - **same queue**: every submission on one queue, waiting for the one before it. Floor:
//!   `cuGraphLaunch` (a one-kernel-node graph) + `cuEventRecord` (a `CU_EVENT_DISABLE_TIMING`
//!   event) on one stream: the wait is on the same stream, which orders it already, so cuhal
//!   makes no `cuStreamWaitEvent` for it either;
//! - **across queues**: submissions alternate between two queues, each waiting for the one
//!   before it, on the other queue. Floor: `cuStreamWaitEvent` (on the other stream's last
//!   event) + `cuGraphLaunch` + `cuEventRecord`, alternating between two streams.
//!
//! Each submission is timed alone on the host clock. Every `BATCH` submissions the host waits
//! for the GPU, untimed, so the figure is the host's cost and never back-pressure from a full
//! launch queue. Beside the wall time per call, the process's CPU time (all threads,
//! `getrusage`) over the whole measured loop, per submission: cuhal's completion and worker
//! threads count there. The kernel checks its order (a period-2 step chain across queues) and
//! counts its launches; both are checked at the end.
//!
//! cuhal: `Queue::execute(&[(s, i)], &[(s, i + 1)], &[&cb])` with a one-dispatch graph command
//! buffer (one per queue), timed per call the same way, the host waiting on the semaphore every
//! `BATCH`. The process's heap allocations are counted across the measured submissions of both
//! sides (`alloc_count`); the floor's count checks the instrument (it must be 0). Both forms also
//! run without completion gathering (`completion_gather` zero: the completion thread retires
//! whatever has finished as soon as it sees it, instead of letting a batch gather after one
//! nobody waited for), with gather batches of 128 and a 400 us gather instead of 64 and 200 us,
//! and the same-queue form with `eager_completion` (the completion thread polls every batch
//! whether or not anybody waits), all reported for comparison.

use anyhow::{Context as _, Result, bail};
use cuhal::DeviceOptions;
use cuhal_sys::cu;

use super::{Env, progress, summarize};
use crate::alloc_count::allocations;
use crate::cpu_time::{cpu_by_role, current_tid, process_cpu_ns, threads_cpu_ns};
use crate::gpu::raw::{GraphExec, KernelNode, SyncMode};
use crate::gpu::{Gpu, StepCounter};
use crate::hal::{Hal, wait};
use crate::report::{Center, Comparison, Goal, Report, Unit};
use crate::stats::Summary;
use cuhal_sys::{Event, Stream};

/// Submissions measured (warm-up comes on top).
pub const SUBMISSIONS: usize = 10_000;
/// The host waits for the GPU after this many submissions (untimed).
pub const BATCH: usize = 250;
/// Events the floor cycles through, as an event pool would.
const RING: usize = 64;

/// The gather batch and gather of the comparison rows with larger batches.
const BIG_BATCH: usize = 128;
const BIG_GATHER: std::time::Duration = std::time::Duration::from_micros(400);

/// The device queues' default gather, in microseconds (for the labels of the rows without it).
const GATHER_US: u128 = DeviceOptions::DEFAULT_COMPLETION_GATHER.as_micros();

/// The goal on medians: at most this many times the floor.
pub const GOAL_RATIO: f64 = 1.2;
/// The goal on the tail: cuhal's p99 at most this many times the floor's p99.
pub const GOAL_P99_RATIO: f64 = 2.0;
/// The goal on process CPU time per submission: at most this many times the floor's.
pub const GOAL_CPU_RATIO: f64 = 1.5;

/// Where the chained submissions go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// All on one queue (stream).
    SameQueue,
    /// Alternating between two queues (streams).
    AcrossQueues,
}

impl Form {
    fn queues(self) -> usize {
        match self {
            Form::SameQueue => 1,
            Form::AcrossQueues => 2,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Form::SameQueue => "same queue",
            Form::AcrossQueues => "across queues",
        }
    }

    /// The step kernel's period: 2 across queues, so a launch that ran before the other
    /// stream's is caught.
    fn period(self) -> u32 {
        self.queues() as u32
    }
}

/// Runs case 1.
pub fn run(env: &Env<'_>, report: &mut Report) -> Result<()> {
    if !crate::alloc_count::is_counting() {
        bail!(
            "heap allocations cannot be counted: the program's global allocator is not \
             cuhal_bench::alloc_count::Counting"
        );
    }
    let n = env.scaled(SUBMISSIONS);
    let warm = env.scaled(1_000);
    for form in [Form::SameQueue, Form::AcrossQueues] {
        run_form(env, report, form, warm, n)?;
    }
    Ok(())
}

fn run_form(env: &Env<'_>, report: &mut Report, form: Form, warm: usize, n: usize) -> Result<()> {
    let label = form.label();
    progress(&format!(
        "case 1 (submit, {label}): floor, {n} chained submissions"
    ));
    let floor = floor(env, form, warm, n)?;
    let floor_name = match form {
        Form::SameQueue => {
            "floor (same queue): cuGraphLaunch (1 node) + cuEventRecord, per submission"
        }
        Form::AcrossQueues => {
            "floor (across queues): cuStreamWaitEvent + cuGraphLaunch (1 node) + cuEventRecord, per submission"
        }
    };
    report.measured("1", floor_name, floor.total);
    if let Some(threads) = &floor.stats {
        report
            .notes
            .push(format!("case 1 ({label}), floor: {threads}"));
    }
    if form == Form::AcrossQueues {
        let parts = floor_parts(env, warm, n)?;
        report.measured("1", "  of which cuStreamWaitEvent", parts.wait);
        report.measured("1", "  of which cuGraphLaunch, 1 kernel node", parts.launch);
        report.measured(
            "1",
            "  of which cuEventRecord, DISABLE_TIMING",
            parts.record,
        );
    }

    progress(&format!(
        "case 1 (submit, {label}): cuhal, {n} chained submissions"
    ));
    let cuhal = cuhal_side(env, form, DeviceOptions::default(), warm, n)?;
    if let Some(stats) = &cuhal.stats {
        report
            .notes
            .push(format!("case 1 ({label}), cuhal's queues: {stats}"));
    }
    let what = format!(
        "submit ({label}): queue execute, 1-dispatch graph, 1 wait + 1 signal, chained; host cost per submission"
    );
    report.comparisons.push(Comparison::new(
        "1",
        what.clone(),
        Some(cuhal.total),
        Some(floor.total),
        Goal::RatioAtMost(GOAL_RATIO),
    ));
    report.comparisons.push(Comparison {
        center: Center::P99,
        ..Comparison::new(
            "1",
            format!("submit ({label}): tail, p99 against the floor's p99"),
            Some(cuhal.total),
            Some(floor.total),
            Goal::RatioAtMost(GOAL_P99_RATIO),
        )
    });
    report.comparisons.push(Comparison::new(
        "1",
        format!(
            "submit ({label}): process CPU time per submission, all threads (getrusage; host waits every {BATCH} included)"
        ),
        cuhal.cpu,
        floor.cpu,
        Goal::RatioAtMost(GOAL_CPU_RATIO),
    ));
    report.comparisons.push(Comparison {
        unit: Unit::Count,
        ..Comparison::new(
            "1",
            format!(
                "submit ({label}): heap allocations per submission, whole process (floor column: the floor's loop)"
            ),
            Some(cuhal.allocations),
            Some(floor.allocations),
            Goal::AtMost(0.0),
        )
    });
    progress(&format!(
        "case 1 (submit, {label}): cuhal without completion gathering, {n} chained submissions"
    ));
    let ungathered_options = DeviceOptions {
        completion_gather: std::time::Duration::ZERO,
        ..DeviceOptions::default()
    };
    let ungathered = cuhal_side(env, form, ungathered_options, warm, n)?;
    let ungathered_label =
        format!("without completion gathering (default {GATHER_US} us; for comparison)");
    push_variant(report, &what, label, &ungathered_label, &ungathered, &floor);
    report.comparisons.push(Comparison {
        unit: Unit::Count,
        ..Comparison::new(
            "1",
            format!("submit ({label}): heap allocations per submission; {ungathered_label}"),
            Some(ungathered.allocations),
            Some(floor.allocations),
            Goal::Report,
        )
    });
    progress(&format!(
        "case 1 (submit, {label}): cuhal with gather batches of {BIG_BATCH}, {n} chained submissions"
    ));
    let big_options = DeviceOptions {
        completion_gather_batch: BIG_BATCH,
        completion_gather: BIG_GATHER,
        ..DeviceOptions::default()
    };
    let big = cuhal_side(env, form, big_options, warm, n)?;
    let big_label = format!(
        "gather batches of {BIG_BATCH} and a {} us gather (default {} and {GATHER_US} us; for comparison)",
        BIG_GATHER.as_micros(),
        DeviceOptions::default().completion_gather_batch
    );
    push_variant(report, &what, label, &big_label, &big, &floor);
    if let Some(stats) = &big.stats {
        report.notes.push(format!(
            "case 1 ({label}), cuhal's queues with gather batches of {BIG_BATCH}: {stats}"
        ));
    }
    if form == Form::SameQueue {
        progress(&format!(
            "case 1 (submit, {label}): cuhal with eager completion, {n} chained submissions"
        ));
        let eager_options = DeviceOptions {
            eager_completion: true,
            ..DeviceOptions::default()
        };
        let eager = cuhal_side(env, form, eager_options, warm, n)?;
        report.comparisons.push(Comparison::new(
            "1",
            format!("{what}; eager completion (for comparison)"),
            Some(eager.total),
            Some(floor.total),
            Goal::Report,
        ));
        report.comparisons.push(Comparison::new(
            "1",
            format!(
                "submit ({label}): process CPU per submission; eager completion (for comparison)"
            ),
            eager.cpu,
            floor.cpu,
            Goal::Report,
        ));
    }
    Ok(())
}

/// The median, p99 and process-CPU rows of a cuhal variant, for comparison: `what` names the
/// median row, `label` the form, `variant` the options that differ from the defaults.
fn push_variant(
    report: &mut Report,
    what: &str,
    label: &str,
    variant: &str,
    side: &Side,
    floor: &Side,
) {
    report.comparisons.push(Comparison::new(
        "1",
        format!("{what}; {variant}"),
        Some(side.total),
        Some(floor.total),
        Goal::Report,
    ));
    report.comparisons.push(Comparison {
        center: Center::P99,
        ..Comparison::new(
            "1",
            format!("submit ({label}): p99; {variant}"),
            Some(side.total),
            Some(floor.total),
            Goal::Report,
        )
    });
    report.comparisons.push(Comparison::new(
        "1",
        format!("submit ({label}): process CPU per submission; {variant}"),
        side.cpu,
        floor.cpu,
        Goal::Report,
    ));
}

/// CPU time per submission between two readings, if both were available.
fn cpu_per_item(
    before: Option<u64>,
    after: Option<u64>,
    n: usize,
    what: &str,
) -> Result<Option<Summary>> {
    match (before, after) {
        (Some(before), Some(after)) => {
            let per = after.saturating_sub(before) as f64 / n as f64;
            Ok(Some(summarize(what, &mut [per])?))
        }
        _ => Ok(None),
    }
}

/// cuhal's side: `Queue::execute` of a one-dispatch graph command buffer, waiting for the
/// previous submission's signal and signalling the next value, timed per call; the host waits
/// for the semaphore every `BATCH` submissions (untimed), as the floor synchronizes.
fn cuhal_side(
    env: &Env<'_>,
    form: Form,
    mut options: DeviceOptions,
    warm: usize,
    n: usize,
) -> Result<Side> {
    options.queues = form.queues();
    let hal = Hal::open(options)?;
    let mut counter = StepCounter::new(env.gpu)?;
    let cbs = (0..form.queues())
        .map(|q| hal.command_buffer(q, &[counter.args(q as u32, form.period())]))
        .collect::<Result<Vec<_>>>()?;
    let semaphore = hal.semaphore();
    let clock = env.clock;
    let mut total = Vec::with_capacity(n);
    let mut allocations_at_warm = 0;
    let mut cpu_at_warm = None;
    let mut threads_at_warm = Vec::new();
    let tid = current_tid();
    for i in 0..warm + n {
        if i == warm {
            threads_at_warm = threads_cpu_ns();
            allocations_at_warm = allocations();
            cpu_at_warm = process_cpu_ns();
        }
        let q = i % form.queues();
        let queue = hal.device.queue(q);
        let value = i as u64;
        let t0 = clock.now_ns();
        let result = queue.execute(
            &[(&semaphore, value)],
            &[(&semaphore, value + 1)],
            &[&cbs[q]],
        );
        let t1 = clock.now_ns();
        result.context("cuhal: Queue::execute")?;
        if i >= warm {
            total.push((t1 - t0) as f64);
        }
        if (i + 1) % BATCH == 0 {
            wait(&semaphore, value + 1)?;
        }
    }
    wait(&semaphore, (warm + n) as u64)?;
    let cpu_at_end = process_cpu_ns();
    let allocations = (allocations() - allocations_at_warm) as f64 / n as f64;
    // Read after the allocation count: reading `/proc` allocates.
    let threads = cpu_by_role(&threads_at_warm, &threads_cpu_ns(), tid).per_item(n);
    let stats = (0..form.queues())
        .map(|q| {
            let s = hal.device.queue(q).stats();
            format!(
                "queue {q}: {} submitted, {} issued on submit, {} by the worker, {} retire \
                 batches, {} completion parks, {} worker parks",
                s.submitted,
                s.issued_on_submit,
                s.issued_by_worker,
                s.retire_batches,
                s.completion_parks,
                s.worker_parks
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let stats = format!("{stats}; {threads}");
    counter.expect_more((warm + n) as u64);
    counter.check("case 1 cuhal")?;
    Ok(Side {
        total: summarize("case 1 cuhal", &mut total)?,
        allocations: summarize("case 1 cuhal allocations", &mut [allocations])?,
        cpu: cpu_per_item(cpu_at_warm, cpu_at_end, n, "case 1 cuhal CPU")?,
        stats: Some(stats),
    })
}

/// The figures of one side.
pub struct Side {
    /// Per submission: the driver calls, or one `Queue::execute`.
    pub total: Summary,
    /// Heap allocations per measured submission, whole process (for the floor, 0 unless the
    /// measuring loop itself allocates: a check of the instrument).
    pub allocations: Summary,
    /// Process CPU time per measured submission, all threads (`None` without `getrusage`).
    pub cpu: Option<Summary>,
    /// cuhal's queue counters over the run (none for the floor).
    pub stats: Option<String>,
}

/// Per-call figures of the floor across queues, from a second pass with a stamp between calls.
pub struct Parts {
    /// `cuStreamWaitEvent`.
    pub wait: Summary,
    /// `cuGraphLaunch`.
    pub launch: Summary,
    /// `cuEventRecord`.
    pub record: Summary,
}

/// What one pass of the floor recorded.
struct Pass {
    /// Heap allocations per measured submission.
    allocations: f64,
    /// Process CPU time per measured submission.
    cpu: Option<Summary>,
    /// The same, by thread (see `cpu_by_role`).
    threads: String,
    total: Vec<f64>,
    wait: Vec<f64>,
    launch: Vec<f64>,
    record: Vec<f64>,
}

fn floor(env: &Env<'_>, form: Form, warm: usize, n: usize) -> Result<Side> {
    let mut pass = floor_pass(env, form, warm, n, false)?;
    Ok(Side {
        total: summarize("case 1 floor", &mut pass.total)?,
        allocations: summarize("case 1 floor allocations", &mut [pass.allocations])?,
        cpu: pass.cpu,
        stats: Some(pass.threads),
    })
}

fn floor_parts(env: &Env<'_>, warm: usize, n: usize) -> Result<Parts> {
    let mut pass = floor_pass(env, Form::AcrossQueues, warm, n, true)?;
    Ok(Parts {
        wait: summarize("case 1 cuStreamWaitEvent", &mut pass.wait)?,
        launch: summarize("case 1 cuGraphLaunch", &mut pass.launch)?,
        record: summarize("case 1 cuEventRecord", &mut pass.record)?,
    })
}

/// One chain of `warm + n` submissions. With `parts`, stamps between the calls too (which adds
/// two clock reads to the total, so the total of that pass is not used).
fn floor_pass(env: &Env<'_>, form: Form, warm: usize, n: usize, parts: bool) -> Result<Pass> {
    let gpu: &Gpu = env.gpu;
    let api = gpu.api();
    let clock = env.clock;
    let streams = (0..form.queues())
        .map(|_| Stream::new(&gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING))
        .collect::<Result<Vec<_>, _>>()?;
    let events = (0..RING)
        .map(|_| Event::new(&gpu.ctx, SyncMode::Spin.flags()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut counter = StepCounter::new(gpu)?;
    let execs = (0..form.queues())
        .map(|q| {
            GraphExec::chain(
                &gpu.ctx,
                &mut [KernelNode {
                    function: gpu.kernels.step,
                    args: counter.args(q as u32, form.period()),
                }],
            )
        })
        .collect::<Result<Vec<_>>>()?;
    if parts && form != Form::AcrossQueues {
        bail!("the parts of case 1's floor are measured across queues");
    }
    let mut pass = Pass {
        allocations: 0.0,
        cpu: None,
        threads: String::new(),
        total: Vec::with_capacity(n),
        wait: Vec::with_capacity(if parts { n } else { 0 }),
        launch: Vec::with_capacity(if parts { n } else { 0 }),
        record: Vec::with_capacity(if parts { n } else { 0 }),
    };
    let cross = form == Form::AcrossQueues;
    let mut allocations_at_warm = 0;
    let mut cpu_at_warm = None;
    let mut threads_at_warm = Vec::new();
    let tid = current_tid();
    for i in 0..warm + n {
        if i == warm {
            threads_at_warm = threads_cpu_ns();
            allocations_at_warm = allocations();
            cpu_at_warm = process_cpu_ns();
        }
        let q = i % form.queues();
        let s = streams[q].raw();
        let g = execs[q].raw();
        // Across queues, the wait is on the event the other stream recorded last (the first
        // submission's is never recorded: a no-op, as for a semaphore value already reached).
        let prev = events[(i + RING - 1) % RING].raw();
        let cur = events[i % RING].raw();
        let t0 = clock.now_ns();
        let r1 = if cross {
            // SAFETY: live stream and event of the current context.
            unsafe { cu!(api, cuStreamWaitEvent(s, prev, 0)) }
        } else {
            Ok(())
        };
        let t1 = if parts { clock.now_ns() } else { 0 };
        // SAFETY: a live executable graph and stream.
        let r2 = unsafe { cu!(api, cuGraphLaunch(g, s)) };
        let t2 = if parts { clock.now_ns() } else { 0 };
        // SAFETY: live event and stream.
        let r3 = unsafe { cu!(api, cuEventRecord(cur, s)) };
        let t3 = clock.now_ns();
        // Checked after the clock reads, so the figures hold the calls alone.
        r1?;
        r2?;
        r3?;
        if i >= warm {
            pass.total.push((t3 - t0) as f64);
            if parts {
                pass.wait.push((t1 - t0) as f64);
                pass.launch.push((t2 - t1) as f64);
                pass.record.push((t3 - t2) as f64);
            }
        }
        if (i + 1) % BATCH == 0 {
            for stream in &streams {
                stream.synchronize()?;
            }
        }
    }
    for stream in &streams {
        stream.synchronize()?;
    }
    pass.cpu = cpu_per_item(cpu_at_warm, process_cpu_ns(), n, "case 1 floor CPU")?;
    pass.allocations = (allocations() - allocations_at_warm) as f64 / n as f64;
    // Read after the allocation count: reading `/proc` allocates.
    pass.threads = cpu_by_role(&threads_at_warm, &threads_cpu_ns(), tid).per_item(n);
    counter.expect_more((warm + n) as u64);
    counter.check("case 1 floor")?;
    Ok(pass)
}
