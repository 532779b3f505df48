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
//! launch queue. cuhal: `Queue::execute(&[(s, i)], &[(s, i + 1)], &[&cb])` with a one-dispatch
//! graph command buffer (one per queue), the host waiting on the semaphore every `BATCH`.
//!
//! **The floor and cuhal take turns.** Every side (the floor, cuhal with the default options,
//! and cuhal's comparison variants) runs its chain in turns of `TURN` submissions, the sides
//! one turn each in turn (who goes first rotates), so that all of them are measured over the
//! same stretch of time. The host's speed drifts by up to 1.6x within a run (seen on the H200's
//! machines: the same loop at 1.3 us, then 2.1 us, tens of milliseconds apart); sides measured
//! one after the other compared the floor in one state with cuhal in another.
//!
//! Beside the wall time per call, the process's CPU time (all threads) per submission: over a
//! side's turns, plus what its own threads (cuhal's completion and worker threads, the
//! driver's) spend after its host wait until they are idle again, which it waits for off every
//! clock before the next side's turn starts. It is split into the submitting thread's and the
//! other threads'. The kernel checks its order (a period-2 step chain across queues) and counts
//! its launches; both are checked at the end.
//!
//! The process's heap allocations are counted over each side's measured turns (and its
//! threads' settling after them); the floor's count checks the instrument (it must be 0). Both
//! forms also run, for comparison: cuhal without completion gathering (`completion_gather` zero:
//! the completion thread retires whatever has finished as soon as it sees it, instead of letting
//! a batch gather after one nobody waited for); with the scheduler's suggested gather (batches of
//! 128, a 400 us gather) instead of the device's (256, 800 us); with the completion side deferred
//! past the turn (a 6 ms gather, batches of 4,096: the completion thread defers the turn's first
//! action and retires the rest while the side settles, so no retirement meets the measured
//! submissions, which shows what the submitting thread costs alone).

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use cuhal::DeviceOptions;
use cuhal_sys::cu;
use cuhal_sys::{Event, Stream};

use super::{Env, progress, summarize};
use crate::alloc_count::allocations;
use crate::cpu_time::{ThreadCpu, cpu_by_role, process_cpu_ns, thread_cpu_ns, threads_cpu_ns};
use crate::gpu::StepCounter;
use crate::gpu::raw::{GraphExec, SyncMode};
use crate::hal::{Hal, wait};
use crate::report::{Center, Comparison, Goal, Report, Unit};
use crate::stats::Summary;

/// Submissions measured (warm-up comes on top).
pub const SUBMISSIONS: usize = 10_000;
/// The host waits for the GPU after this many submissions (untimed).
pub const BATCH: usize = 250;
/// The submissions of one side's turn: eight host waits. A turn ends with the side's threads
/// idle, and a completion thread spins for the queue's `idle_spin` (100 us) before it parks:
/// counted against cuhal, that is 0.05 us per submission over a turn this long.
const TURN: usize = 8 * BATCH;
/// Events the floor cycles through, as an event pool would.
const RING: usize = 64;

/// The gather batch of the comparison rows with the scheduler's suggested gather (the device
/// queues' default until this case chose larger batches).
const SMALL_BATCH: usize = cuhal::CompletionOptions::DEFAULT_GATHER_BATCH;
/// The gather of those rows.
const SHORT_GATHER: Duration = DeviceOptions::SUGGESTED_COMPLETION_GATHER;

/// The gather of the comparison rows whose completion waits until the turn is over: longer than
/// a turn (2,000 submissions at 1 to 3 us), so the completion thread retires a turn's work while
/// the bench waits for the side to settle, not while it submits.
const TURN_GATHER: Duration = Duration::from_millis(6);
/// Their gather batch, and the actions they may have in flight: more than a turn submits.
const TURN_BATCH: usize = 4_096;

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

/// cuhal's comparison variants in a form, beside the default options (the row with the goals).
fn variants() -> Vec<(String, DeviceOptions)> {
    let variants = vec![
        (
            format!("without completion gathering (default {GATHER_US} us; for comparison)"),
            DeviceOptions {
                completion: DeviceOptions::DEFAULT_COMPLETION.with_gather(Duration::ZERO),
                ..DeviceOptions::default()
            },
        ),
        (
            format!(
                "gather batches of {SMALL_BATCH} and a {} us gather (default {} and {GATHER_US} us; for comparison)",
                SHORT_GATHER.as_micros(),
                DeviceOptions::default().completion.gather_batch
            ),
            DeviceOptions {
                completion: DeviceOptions::DEFAULT_COMPLETION
                    .with_gather_batch(SMALL_BATCH)
                    .with_gather(SHORT_GATHER),
                ..DeviceOptions::default()
            },
        ),
        (
            format!(
                "completion deferred past the turn ({} ms gather, batches of {TURN_BATCH}; for comparison)",
                TURN_GATHER.as_millis()
            ),
            DeviceOptions {
                completion: DeviceOptions::DEFAULT_COMPLETION
                    .with_gather_batch(TURN_BATCH)
                    .with_gather(TURN_GATHER),
                max_in_flight: 2 * TURN_BATCH,
                reserved_events: 2 * TURN_BATCH,
                ..DeviceOptions::default()
            },
        ),
    ];
    variants
}

fn run_form(env: &Env<'_>, report: &mut Report, form: Form, warm: usize, n: usize) -> Result<()> {
    let label = form.label();
    let variants = variants();
    progress(&format!(
        "case 1 (submit, {label}): the floor and {} cuhal variants in turns of {TURN}, {n} chained submissions each",
        variants.len() + 1
    ));
    let mut sides = vec![
        Side::Floor(FloorSide::new(env, form, false)?),
        Side::Cuhal(Box::new(CuhalSide::new(
            env,
            form,
            DeviceOptions::default(),
        )?)),
    ];
    for (_, options) in &variants {
        sides.push(Side::Cuhal(Box::new(CuhalSide::new(
            env,
            form,
            options.clone(),
        )?)));
    }
    let tallies = race(&mut sides, warm, n)?;
    let mut figures = Vec::with_capacity(sides.len());
    for (side, tally) in sides.into_iter().zip(tallies) {
        figures.push(side.finish(tally, warm + n, n)?);
    }
    let (floor, cuhal) = (&figures[0], &figures[1]);

    let floor_name = match form {
        Form::SameQueue => {
            "floor (same queue): cuGraphLaunch (1 node) + cuEventRecord, per submission"
        }
        Form::AcrossQueues => {
            "floor (across queues): cuStreamWaitEvent + cuGraphLaunch (1 node) + cuEventRecord, per submission"
        }
    };
    report.measured("1", floor_name, floor.total);
    report
        .notes
        .push(format!("case 1 ({label}), floor: {}", floor.note));
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

    let what = format!(
        "submit ({label}): queue execute, 1-dispatch graph, 1 wait + 1 signal, chained; host cost per submission"
    );
    report
        .notes
        .push(format!("case 1 ({label}), cuhal's queues: {}", cuhal.note));
    push_default(report, &what, label, cuhal, floor);
    for ((variant, _), side) in variants.iter().zip(&figures[2..]) {
        report.notes.push(format!(
            "case 1 ({label}), cuhal's queues, {variant}: {}",
            side.note
        ));
        push_variant(report, &what, label, variant, side, floor);
    }
    Ok(())
}

/// The rows of cuhal with the default options, with the goals.
fn push_default(report: &mut Report, what: &str, label: &str, cuhal: &Figures, floor: &Figures) {
    report.comparisons.push(Comparison::new(
        "1",
        what.to_owned(),
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
            "submit ({label}): process CPU time per submission, all threads (host waits every {BATCH} included)"
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
                "submit ({label}): heap allocations per submission, whole process (floor column: the floor's turns)"
            ),
            Some(cuhal.allocations),
            Some(floor.allocations),
            Goal::AtMost(0.0),
        )
    });
}

/// The median, p99, process-CPU and allocation rows of a cuhal variant, for comparison: `what`
/// names the median row, `label` the form, `variant` the options that differ from the defaults.
fn push_variant(
    report: &mut Report,
    what: &str,
    label: &str,
    variant: &str,
    side: &Figures,
    floor: &Figures,
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
    report.comparisons.push(Comparison {
        unit: Unit::Count,
        ..Comparison::new(
            "1",
            format!("submit ({label}): heap allocations per submission; {variant}"),
            Some(side.allocations),
            Some(floor.allocations),
            Goal::Report,
        )
    });
}

/// What a side's measured turns added up to.
#[derive(Default)]
struct Tally {
    /// Each measured submission's wall time, in nanoseconds.
    times: Vec<f64>,
    /// Process CPU over the side's measured turns and its threads' settling after them, and
    /// the submitting thread's share of it (`None` without the clocks).
    cpu_ns: Option<(u64, u64)>,
    /// Heap allocations, whole process, over the same stretches.
    allocations: u64,
    /// The side's own threads' CPU over the measured turns, by role (cuhal's completion and
    /// issue threads), when `/proc` tells.
    own_threads: Option<(u64, u64)>,
}

/// Runs every side's chain of `warm + n` submissions in turns of [`TURN`]: each side one turn,
/// then the next, the first side of a round rotating. Returns each side's tally of its
/// measured turns (those after the first `warm` submissions).
fn race<C: Contender>(sides: &mut [C], warm: usize, n: usize) -> Result<Vec<Tally>> {
    let mut tallies: Vec<Tally> = (0..sides.len())
        .map(|_| Tally {
            times: Vec::with_capacity(n),
            cpu_ns: Some((0, 0)),
            allocations: 0,
            own_threads: None,
        })
        .collect();
    // The sides' own threads, read when the measured turns begin and once they end (reading
    // `/proc` allocates, so never inside a turn's window).
    let mut threads_at_start: Vec<ThreadCpu> = Vec::new();
    let mut start = 0;
    let mut round = 0;
    while start < warm + n {
        let end = if start < warm { warm } else { warm + n };
        let count = TURN.min(end - start);
        let timed = start >= warm;
        if start == warm {
            threads_at_start = threads_cpu_ns();
        }
        for k in 0..sides.len() {
            let index = (k + round) % sides.len();
            let (side, tally) = (&mut sides[index], &mut tallies[index]);
            if !timed {
                side.turn(start, count, None)?;
                side.settle()?;
                continue;
            }
            let allocations_before = allocations();
            let process_before = process_cpu_ns();
            let thread_before = thread_cpu_ns();
            side.turn(start, count, Some(&mut tally.times))?;
            let process_waited = process_cpu_ns();
            let thread_waited = thread_cpu_ns();
            side.settle()?;
            let process_after = process_cpu_ns();
            let thread_after = thread_cpu_ns();
            tally.allocations += allocations() - allocations_before;
            // The turn's CPU, all threads; then, while it settles, all but this thread's (which
            // only watches).
            let spent = (|| {
                let turn = process_waited?.checked_sub(process_before?)?;
                let own = thread_waited?.checked_sub(thread_before?)?;
                let settling = process_after?.checked_sub(process_waited?)?;
                let watching = thread_after?.checked_sub(thread_waited?)?;
                Some((turn + settling.saturating_sub(watching), own))
            })();
            tally.cpu_ns = tally
                .cpu_ns
                .zip(spent)
                .map(|((cpu, own), (turn, turn_own))| (cpu + turn, own + turn_own));
        }
        start += count;
        round += 1;
    }
    let threads_at_end = threads_cpu_ns();
    for (side, tally) in sides.iter().zip(&mut tallies) {
        let own = |list: &[ThreadCpu]| -> Vec<ThreadCpu> {
            list.iter()
                .filter(|t| side.threads().contains(&t.tid))
                .cloned()
                .collect()
        };
        if !side.threads().is_empty() && !threads_at_end.is_empty() {
            let roles = cpu_by_role(&own(&threads_at_start), &own(&threads_at_end), None);
            tally.own_threads = Some((roles.completion, roles.issue));
        }
    }
    Ok(tallies)
}

/// The figures of one side.
struct Figures {
    /// Per submission: the driver calls, or one `Queue::execute`.
    total: Summary,
    /// Heap allocations per measured submission, whole process (for the floor, 0 unless the
    /// measuring loop itself allocates: a check of the instrument).
    allocations: Summary,
    /// Process CPU time per measured submission, all threads (`None` without the clocks).
    cpu: Option<Summary>,
    /// The CPU split by thread, and cuhal's queue counters.
    note: String,
}

/// What [`race`] asks of a side.
trait Contender {
    /// Submissions `start..start + count`, each timed into `times` if given, the host waiting
    /// for the GPU (untimed) every [`BATCH`] and at the end.
    fn turn(&mut self, start: usize, count: usize, times: Option<&mut Vec<f64>>) -> Result<()>;

    /// Waits until the side's own threads have nothing left to do with its submissions.
    fn settle(&mut self) -> Result<()>;

    /// The threads the side started (cuhal's queue threads), by id.
    fn threads(&self) -> &[u32];
}

impl Contender for Side {
    fn turn(&mut self, start: usize, count: usize, times: Option<&mut Vec<f64>>) -> Result<()> {
        match self {
            Side::Floor(floor) => floor.turn(start, count, times),
            Side::Cuhal(cuhal) => cuhal.turn(start, count, times),
        }
    }

    fn settle(&mut self) -> Result<()> {
        match self {
            Side::Floor(_) => Ok(()),
            Side::Cuhal(cuhal) => cuhal.hal.settle("case 1 cuhal"),
        }
    }

    fn threads(&self) -> &[u32] {
        match self {
            Side::Floor(_) => &[],
            Side::Cuhal(cuhal) => &cuhal.threads,
        }
    }
}

/// A contestant of the race.
enum Side {
    Floor(FloorSide),
    // Boxed: a cuhal side holds a whole device (clippy: large size difference).
    Cuhal(Box<CuhalSide>),
}

impl Side {
    /// Checks the side's kernels and sums up `tally` over `n` measured submissions of `total`.
    fn finish(self, mut tally: Tally, total: usize, n: usize) -> Result<Figures> {
        let (what, note) = match self {
            Side::Floor(mut floor) => {
                floor.counter.expect_more(total as u64);
                floor.counter.check("case 1 floor")?;
                ("case 1 floor", String::new())
            }
            Side::Cuhal(mut cuhal) => {
                cuhal.counter.expect_more(total as u64);
                cuhal.counter.check("case 1 cuhal")?;
                ("case 1 cuhal", cuhal.stats())
            }
        };
        let per = |ns: u64| ns as f64 / n.max(1) as f64;
        let split = match (tally.cpu_ns, tally.own_threads) {
            (Some((cpu, own)), Some((completion, issue))) => format!(
                "CPU per submission by thread: submitting {:.2} us, completion {:.2} us, issue workers {:.2} us, other threads {:.2} us",
                per(own) / 1e3,
                per(completion) / 1e3,
                per(issue) / 1e3,
                per(cpu.saturating_sub(own + completion + issue)) / 1e3
            ),
            (Some((cpu, own)), None) => format!(
                "CPU per submission by thread: submitting {:.2} us, other threads {:.2} us",
                per(own) / 1e3,
                per(cpu.saturating_sub(own)) / 1e3
            ),
            _ => "CPU time not available".to_owned(),
        };
        let note = if note.is_empty() {
            split
        } else {
            format!("{note}; {split}")
        };
        Ok(Figures {
            total: summarize(what, &mut tally.times)?,
            allocations: summarize(what, &mut [tally.allocations as f64 / n.max(1) as f64])?,
            cpu: match tally.cpu_ns {
                Some((cpu, _)) => Some(summarize(what, &mut [per(cpu)])?),
                None => None,
            },
            note,
        })
    }
}

/// The floor: raw streams, a ring of events, one executable graph per stream.
struct FloorSide {
    api: std::sync::Arc<cuhal_sys::DriverApi>,
    clock: crate::clock::Clock,
    form: Form,
    streams: Vec<Stream>,
    events: Vec<Event>,
    execs: Vec<GraphExec>,
    counter: StepCounter,
    /// With a stamp between the calls (which adds two clock reads to each total): the calls'
    /// own times.
    parts: Option<Parts>,
}

impl FloorSide {
    fn new(env: &Env<'_>, form: Form, parts: bool) -> Result<Self> {
        let gpu = env.gpu;
        let streams = (0..form.queues())
            .map(|_| Stream::new(&gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING))
            .collect::<Result<Vec<_>, _>>()?;
        let events = (0..RING)
            .map(|_| Event::new(&gpu.ctx, SyncMode::Spin.flags()))
            .collect::<Result<Vec<_>, _>>()?;
        let counter = StepCounter::new(gpu)?;
        let execs = counter.graphs(gpu, form.queues() as u32, form.period())?;
        Ok(Self {
            api: gpu.ctx.api().clone(),
            clock: env.clock,
            form,
            streams,
            events,
            execs,
            counter,
            parts: parts.then(Parts::default),
        })
    }

    fn turn(&mut self, start: usize, count: usize, mut times: Option<&mut Vec<f64>>) -> Result<()> {
        let api = &*self.api;
        let cross = self.form == Form::AcrossQueues;
        let stamp = self.parts.is_some();
        for i in start..start + count {
            let q = i % self.form.queues();
            let s = self.streams[q].raw();
            let g = self.execs[q].raw();
            // Across queues, the wait is on the event the other stream recorded last (the first
            // submission's is never recorded: a no-op, as for a semaphore value already reached).
            let prev = self.events[(i + RING - 1) % RING].raw();
            let cur = self.events[i % RING].raw();
            let t0 = self.clock.now_ns();
            let r1 = if cross {
                // SAFETY: live stream and event of the current context.
                unsafe { cu!(api, cuStreamWaitEvent(s, prev, 0)) }
            } else {
                Ok(())
            };
            let t1 = if stamp { self.clock.now_ns() } else { 0 };
            // SAFETY: a live executable graph and stream.
            let r2 = unsafe { cu!(api, cuGraphLaunch(g, s)) };
            let t2 = if stamp { self.clock.now_ns() } else { 0 };
            // SAFETY: live event and stream.
            let r3 = unsafe { cu!(api, cuEventRecord(cur, s)) };
            let t3 = self.clock.now_ns();
            // Checked after the clock reads, so the figures hold the calls alone.
            r1?;
            r2?;
            r3?;
            if let Some(times) = times.as_deref_mut() {
                times.push((t3 - t0) as f64);
                if let Some(parts) = &mut self.parts {
                    parts.wait.push((t1 - t0) as f64);
                    parts.launch.push((t2 - t1) as f64);
                    parts.record.push((t3 - t2) as f64);
                }
            }
            if (i + 1) % BATCH == 0 || i + 1 == start + count {
                for stream in &self.streams {
                    stream.synchronize()?;
                }
            }
        }
        Ok(())
    }
}

/// cuhal: a device with one queue per stream of the form, a one-dispatch graph command buffer
/// per queue, one semaphore for the chain.
struct CuhalSide {
    hal: Hal,
    clock: crate::clock::Clock,
    form: Form,
    cbs: Vec<std::sync::Arc<dyn cuhal::CommandBuffer>>,
    semaphore: cuhal::Semaphore,
    counter: StepCounter,
    /// The threads its device started.
    threads: Vec<u32>,
}

impl CuhalSide {
    fn new(env: &Env<'_>, form: Form, mut options: DeviceOptions) -> Result<Self> {
        options.queues = form.queues();
        let before = threads_cpu_ns();
        let hal = Hal::open(options)?;
        let threads = threads_cpu_ns()
            .into_iter()
            .map(|t| t.tid)
            .filter(|tid| !before.iter().any(|t| t.tid == *tid))
            .collect();
        let counter = StepCounter::new(env.gpu)?;
        let cbs = (0..form.queues())
            .map(|q| hal.command_buffer(q, &[counter.args(q as u32, form.period())]))
            .collect::<Result<Vec<_>>>()?;
        let semaphore = hal.semaphore();
        Ok(Self {
            hal,
            clock: env.clock,
            form,
            cbs,
            semaphore,
            counter,
            threads,
        })
    }

    fn turn(&mut self, start: usize, count: usize, mut times: Option<&mut Vec<f64>>) -> Result<()> {
        for i in start..start + count {
            let q = i % self.form.queues();
            let queue = self.hal.device.queue(q);
            let value = i as u64;
            let t0 = self.clock.now_ns();
            let result = queue.execute(
                &[(&self.semaphore, value)],
                &[(&self.semaphore, value + 1)],
                &[&self.cbs[q]],
            );
            let t1 = self.clock.now_ns();
            result.context("cuhal: Queue::execute")?;
            if let Some(times) = times.as_deref_mut() {
                times.push((t1 - t0) as f64);
            }
            if (i + 1) % BATCH == 0 || i + 1 == start + count {
                wait(&self.semaphore, value + 1)?;
            }
        }
        Ok(())
    }

    /// The queues' counters, as a note.
    fn stats(&self) -> String {
        (0..self.form.queues())
            .map(|q| {
                let s = self.hal.device.queue(q).stats();
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
            .join("; ")
    }
}

/// Per-call figures of the floor across queues, from a pass of its own with a stamp between
/// calls.
#[derive(Default)]
struct Parts {
    wait: Vec<f64>,
    launch: Vec<f64>,
    record: Vec<f64>,
}

/// The same, summed up.
struct PartFigures {
    wait: Summary,
    launch: Summary,
    record: Summary,
}

fn floor_parts(env: &Env<'_>, warm: usize, n: usize) -> Result<PartFigures> {
    let mut floor = FloorSide::new(env, Form::AcrossQueues, true)?;
    floor.turn(0, warm, None)?;
    floor.turn(warm, n, Some(&mut Vec::with_capacity(n)))?;
    floor.counter.expect_more((warm + n) as u64);
    floor.counter.check("case 1 floor, by call")?;
    let mut parts = floor.parts.take().context("case 1: the floor's parts")?;
    Ok(PartFigures {
        wait: summarize("case 1 cuStreamWaitEvent", &mut parts.wait)?,
        launch: summarize("case 1 cuGraphLaunch", &mut parts.launch)?,
        record: summarize("case 1 cuEventRecord", &mut parts.record)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spins until the calling thread has used `ns` more nanoseconds of CPU, on its own clock
    /// (the one `race` reads).
    fn spin_cpu(ns: u64) {
        let start = thread_cpu_ns().expect("the CPU-time clocks work on Linux");
        while thread_cpu_ns().unwrap() - start < ns {
            std::hint::spin_loop();
        }
    }

    /// A side that notes its turns, spins `turn_ns` in each, and while it settles has another
    /// thread spin `settle_ns` as the calling thread spins too (a watcher polling).
    #[derive(Default)]
    struct Probe {
        turns: Vec<(usize, usize, bool)>,
        turn_ns: u64,
        settle_ns: u64,
        order: std::rc::Rc<std::cell::RefCell<Vec<usize>>>,
        id: usize,
    }

    impl Contender for Probe {
        fn turn(&mut self, start: usize, count: usize, times: Option<&mut Vec<f64>>) -> Result<()> {
            self.turns.push((start, count, times.is_some()));
            self.order.borrow_mut().push(self.id);
            spin_cpu(self.turn_ns);
            if let Some(times) = times {
                times.extend((0..count).map(|_| 1.0));
            }
            Ok(())
        }

        fn settle(&mut self) -> Result<()> {
            let ns = self.settle_ns;
            let worker = std::thread::spawn(move || spin_cpu(ns));
            spin_cpu(ns);
            worker.join().unwrap();
            Ok(())
        }

        fn threads(&self) -> &[u32] {
            &[]
        }
    }

    /// Every side runs the whole chain in order, turn by turn; warm-up turns are not timed; who
    /// goes first rotates; and a side's CPU counts its turns and its threads' settling, not the
    /// watching thread's share of the settling.
    #[test]
    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    fn sides_take_turns_and_each_pays_for_its_own() {
        let _serial = crate::cpu_time::CPU_TESTS
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let order = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut sides: Vec<Probe> = (0..3)
            .map(|id| Probe {
                turn_ns: 200_000,
                settle_ns: if id == 2 { 2_000_000 } else { 0 },
                order: order.clone(),
                id,
                ..Probe::default()
            })
            .collect();
        let (warm, n) = (TURN / 2, 3 * TURN + 7);
        let tallies = race(&mut sides, warm, n).unwrap();
        for side in &sides {
            let mut next = 0;
            for &(start, count, timed) in &side.turns {
                assert_eq!(start, next, "turns follow the chain");
                assert_eq!(timed, start >= warm, "only turns after warm-up are timed");
                next += count;
            }
            assert_eq!(next, warm + n);
        }
        let order = order.borrow();
        let firsts: Vec<usize> = order.chunks(3).map(|round| round[0]).collect();
        assert_eq!(firsts[..3], [0, 1, 2], "who goes first rotates");
        let timed_turns = sides[0].turns.iter().filter(|t| t.2).count() as u64;
        for (id, tally) in tallies.iter().enumerate() {
            assert_eq!(tally.times.len(), n);
            let (cpu, own) = tally.cpu_ns.unwrap();
            assert!(
                own >= timed_turns * 200_000,
                "side {id}: {own} ns submitting"
            );
            // Side 2's settling spun 2 ms per turn on another thread (counted) and 2 ms on the
            // watching one (not counted).
            let settling = cpu - own;
            if id == 2 {
                assert!(
                    settling >= timed_turns * 2_000_000,
                    "{settling} ns settling"
                );
                assert!(settling < timed_turns * 3_500_000, "{settling} ns settling");
            } else {
                assert!(
                    settling < timed_turns * 1_000_000,
                    "side {id}: {settling} ns"
                );
            }
        }
    }
}
