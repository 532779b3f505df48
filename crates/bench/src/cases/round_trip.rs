//! Case 5, round trip: submit one tiny dispatch and wait for it on the host, per call.
//!
//! Floor: the same work through the raw driver: `cuGraphLaunch` of a one-node graph (a
//! one-thread `step`) + `cuEventRecord` + `cuEventSynchronize` (spinning event), timed together.
//! References: the same with `cuLaunchKernel` instead of the graph; the host cost of an
//! empty-kernel `cuLaunchKernel` back to back (3.7 us a call when the project's goals were set);
//! and a completion word's round trip: a one-node graph whose kernel writes its launch count to
//! host-mapped memory, which the host polls with no driver call (what a per-queue completion
//! word would save against event polling; see `docs/decisions/device.md`). Goals: at most 1.1x
//! the graph floor, and the project's 10 us per call whatever the floor.
//!
//! cuhal: a one-dispatch graph command buffer, `Queue::execute` with one signal, then
//! `Semaphore::wait`, timed together; also without completion gathering, for comparison.
//!
//! The floor and the two cuhal sides take turns of `TURN` round trips, who goes first rotating,
//! as case 1's sides do (the host's speed drifts within a run); after its turn a cuhal side
//! waits, untimed, until its queue's threads are parked. The references run after them.

use anyhow::Result;
use cuhal::DeviceOptions;
use cuhal_sys::cu;

use super::{Env, in_turns, progress, summarize};
use crate::gpu::raw::{Args, GraphExec, KernelNode, MappedFlags, SyncMode, launch};
use crate::gpu::{SpinRecord, StepCounter};
use crate::hal::Hal;
use crate::hal::WAIT;
use crate::report::{Comparison, Goal, Report};
use cuhal_sys::{Event, Stream};

/// Round trips per variant (warm-up on top).
pub const CALLS: usize = 5_000;
/// The design's goal for one dispatch, submit to host return.
pub const GOAL_NS: f64 = 10_000.0;
/// The goal against the raw graph round trip.
pub const GOAL_RATIO: f64 = 1.1;
/// The round trips of one side's turn: the floor and the cuhal sides take turns.
const TURN: usize = 250;
/// Empty launches per timed batch in the launch-cost reference.
const LAUNCH_BATCH: usize = 100;

/// How the dispatch is submitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submit {
    /// `cuLaunchKernel`.
    Kernel,
    /// `cuGraphLaunch` of a one-node graph.
    Graph,
}

/// Runs case 5.
pub fn run(env: &Env<'_>, report: &mut Report) -> Result<()> {
    let n = env.scaled(CALLS);
    let warm = env.scaled(500);
    progress(&format!(
        "case 5 (round trip): the graph floor, cuhal and cuhal without completion gathering in turns of {TURN}, {n} calls each"
    ));
    let eager_options = DeviceOptions {
        completion: DeviceOptions::DEFAULT_COMPLETION.with_gather(std::time::Duration::ZERO),
        ..DeviceOptions::default()
    };
    let mut floor = FloorTrips::new(env, Submit::Graph)?;
    let mut cuhal = CuhalTrips::new(env, DeviceOptions::default(), "case 5 cuhal")?;
    let mut eager = CuhalTrips::new(env, eager_options, "case 5 cuhal ungathered")?;
    let total = warm + n;
    let [mut graph, mut cuhal_times, mut eager_times] =
        in_turns(total.div_ceil(TURN), n, |turn, side, times| {
            for call in turn * TURN..((turn + 1) * TURN).min(total) {
                let time = match side {
                    0 => floor.trip(env)?,
                    1 => cuhal.trip()?,
                    _ => eager.trip()?,
                };
                if call >= warm {
                    times.push(time);
                }
            }
            match side {
                0 => Ok(()),
                1 => cuhal.hal.settle(cuhal.what),
                _ => eager.hal.settle(eager.what),
            }
        })?;
    floor.finish(total)?;
    cuhal.finish(total)?;
    eager.finish(total)?;

    let mut kernel = measure(env, Submit::Kernel, warm, n)?;
    let graph = summarize("case 5 floor", &mut graph)?;
    report.measured(
        "5",
        "floor: cuGraphLaunch (1 node) + cuEventRecord + cuEventSynchronize (spinning)",
        graph,
    );
    report.measured(
        "5",
        "reference: cuLaunchKernel + cuEventRecord + cuEventSynchronize (spinning)",
        summarize("case 5 kernel", &mut kernel)?,
    );
    let mut word = completion_word(env, warm, n)?;
    report.measured(
        "5",
        "reference: cuGraphLaunch (1 node writing a host-mapped word) + host spin on the word, no event",
        summarize("case 5 completion word", &mut word)?,
    );
    let mut launches = launch_cost(env, env.scaled(200), env.scaled(2_000))?;
    report.measured(
        "5",
        "reference: cuLaunchKernel of an empty kernel, back to back, host cost each",
        summarize("case 5 launch cost", &mut launches)?.per_item(LAUNCH_BATCH as f64),
    );
    let cuhal = summarize("case 5 cuhal", &mut cuhal_times)?;
    let what = "round trip: submit 1 dispatch (graph command buffer), host waits on its semaphore";
    report.comparisons.push(Comparison::new(
        "5",
        what,
        Some(cuhal),
        Some(graph),
        Goal::RatioAtMost(GOAL_RATIO),
    ));
    report.comparisons.push(Comparison::new(
        "5",
        format!("{what} (design goal < 10 us)"),
        Some(cuhal),
        Some(graph),
        Goal::AtMost(GOAL_NS),
    ));
    let eager = summarize("case 5 cuhal ungathered", &mut eager_times)?;
    report.comparisons.push(Comparison::new(
        "5",
        format!("{what}; without completion gathering (for comparison)"),
        Some(eager),
        Some(graph),
        Goal::Report,
    ));
    Ok(())
}

/// The raw round trip, a call at a time: launch (as `submit` says) + `cuEventRecord` + a
/// spinning `cuEventSynchronize`, timed together.
struct FloorTrips {
    clock: crate::clock::Clock,
    submit: Submit,
    stream: Stream,
    event: Event,
    counter: StepCounter,
    args: Args,
    exec: GraphExec,
}

impl FloorTrips {
    fn new(env: &Env<'_>, submit: Submit) -> Result<Self> {
        let gpu = env.gpu;
        let stream = Stream::new(&gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?;
        let event = Event::new(&gpu.ctx, SyncMode::Spin.flags())?;
        let counter = StepCounter::new(gpu)?;
        let args = counter.args(0, 1);
        let exec = GraphExec::chain(
            &gpu.ctx,
            &mut [KernelNode {
                function: gpu.kernels.step,
                args,
            }],
        )?;
        Ok(Self {
            clock: env.clock,
            submit,
            stream,
            event,
            counter,
            args,
            exec,
        })
    }

    fn trip(&mut self, env: &Env<'_>) -> Result<f64> {
        let api = env.gpu.api();
        let stream = self.stream.raw();
        let t0 = self.clock.now_ns();
        match self.submit {
            Submit::Kernel => launch(api, env.gpu.kernels.step, stream, &mut self.args)?,
            // SAFETY: a live executable graph and stream.
            Submit::Graph => unsafe { cu!(api, cuGraphLaunch(self.exec.raw(), stream)) }?,
        }
        self.event.record_and_synchronize(&self.stream)?;
        let t1 = self.clock.now_ns();
        Ok((t1 - t0) as f64)
    }

    /// Checks the kernel after `calls` round trips in all.
    fn finish(mut self, calls: usize) -> Result<()> {
        self.stream.synchronize()?;
        self.counter.expect_more(calls as u64);
        self.counter.check("case 5")
    }
}

/// cuhal, a call at a time: `Queue::execute` of a one-dispatch graph command buffer with one
/// signal, then a host wait on the semaphore, timed together ([`Hal::round_trip`]).
struct CuhalTrips {
    hal: Hal,
    clock: crate::clock::Clock,
    cb: std::sync::Arc<dyn cuhal::CommandBuffer>,
    semaphore: cuhal::Semaphore,
    counter: StepCounter,
    value: u64,
    what: &'static str,
}

impl CuhalTrips {
    fn new(env: &Env<'_>, options: DeviceOptions, what: &'static str) -> Result<Self> {
        let hal = Hal::open(options)?;
        let counter = StepCounter::new(env.gpu)?;
        let cb = hal.command_buffer(0, &[counter.args(0, 1)])?;
        let semaphore = hal.semaphore();
        Ok(Self {
            hal,
            clock: env.clock,
            cb,
            semaphore,
            counter,
            value: 0,
            what,
        })
    }

    fn trip(&mut self) -> Result<f64> {
        self.value += 1;
        self.hal
            .round_trip(0, &self.cb, &self.semaphore, self.value, self.clock)
    }

    /// Checks the kernel after `calls` round trips in all.
    fn finish(mut self, calls: usize) -> Result<()> {
        self.counter.expect_more(calls as u64);
        self.counter.check(self.what)
    }
}

/// The raw round trip ([`FloorTrips`]), `warm + n` times; returns the last `n`.
pub fn measure(env: &Env<'_>, submit: Submit, warm: usize, n: usize) -> Result<Vec<f64>> {
    let mut floor = FloorTrips::new(env, submit)?;
    let mut samples = Vec::with_capacity(n);
    for i in 0..warm + n {
        let time = floor.trip(env)?;
        if i >= warm {
            samples.push(time);
        }
    }
    floor.finish(warm + n)?;
    Ok(samples)
}

/// Case 11's raw floor for a 1-dispatch round trip with a new binding table each call: case 5's
/// graph floor with the node's arguments switched between two counters before every launch
/// (`cuGraphExecKernelNodeSetParams` + `cuGraphLaunch` + `cuEventRecord` + spinning
/// `cuEventSynchronize`, timed together), as a caller of the driver rebinds a graph.
pub fn measure_rebound(env: &Env<'_>, warm: usize, n: usize) -> Result<Vec<f64>> {
    let gpu = env.gpu;
    let api = gpu.api();
    let clock = env.clock;
    let stream = Stream::new(&gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?;
    let event = Event::new(&gpu.ctx, SyncMode::Spin.flags())?;
    let mut counters = [StepCounter::new(gpu)?, StepCounter::new(gpu)?];
    let mut nodes = counters.each_ref().map(|c| KernelNode {
        function: gpu.kernels.step,
        args: c.args(0, 1),
    });
    let exec = GraphExec::chain(
        &gpu.ctx,
        &mut [KernelNode {
            function: gpu.kernels.step,
            args: nodes[0].args,
        }],
    )?;
    let mut samples = Vec::with_capacity(n);
    for i in 0..warm + n {
        let t0 = clock.now_ns();
        exec.set_kernel_args(0, &mut nodes[i % 2])?;
        // SAFETY: a live executable graph and stream.
        unsafe { cu!(api, cuGraphLaunch(exec.raw(), stream.raw())) }?;
        event.record_and_synchronize(&stream)?;
        let t1 = clock.now_ns();
        if i >= warm {
            samples.push((t1 - t0) as f64);
        }
    }
    stream.synchronize()?;
    let total = warm + n;
    for (i, counter) in counters.iter_mut().enumerate() {
        counter.expect_more((total / 2 + usize::from(i < total % 2)) as u64);
        counter.check(&format!("case 11 rebound floor, counter {i}"))?;
    }
    Ok(samples)
}

/// The round trip of a completion word: a one-node graph whose `spin` kernel (no spin) writes
/// its launch count to a host-mapped flag after a system-wide fence; the host spins on the flag.
fn completion_word(env: &Env<'_>, warm: usize, n: usize) -> Result<Vec<f64>> {
    let gpu = env.gpu;
    let api = gpu.api();
    let clock = env.clock;
    let stream = Stream::new(&gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?;
    let flags = MappedFlags::new(&gpu.ctx, 1)?;
    let mut record = SpinRecord::new(gpu)?;
    let exec = GraphExec::chain(
        &gpu.ctx,
        &mut [KernelNode {
            function: gpu.kernels.spin,
            args: record.args(0, flags.device(0), 0),
        }],
    )?;
    let flag = flags.flag(0);
    let mut samples = Vec::with_capacity(n);
    for i in 0..warm + n {
        let expected = record.count_launch() as u32;
        let t0 = clock.now_ns();
        // SAFETY: a live executable graph and stream.
        unsafe { cu!(api, cuGraphLaunch(exec.raw(), stream.raw())) }?;
        let deadline = std::time::Instant::now() + WAIT;
        while flag.load(std::sync::atomic::Ordering::Acquire) != expected {
            if std::time::Instant::now() > deadline {
                anyhow::bail!("case 5: the completion word never reached {expected}");
            }
            std::hint::spin_loop();
        }
        let t1 = clock.now_ns();
        if i >= warm {
            samples.push((t1 - t0) as f64);
        }
    }
    stream.synchronize()?;
    record.read("case 5 completion word")?;
    Ok(samples)
}

/// Batches of `LAUNCH_BATCH` empty launches, each batch timed, then the stream drained
/// (untimed): the host cost of a launch when the queue is not full.
fn launch_cost(env: &Env<'_>, warm: usize, n: usize) -> Result<Vec<f64>> {
    let gpu = env.gpu;
    let api = gpu.api();
    let clock = env.clock;
    let stream = Stream::new(&gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?;
    let mut args = Args::None;
    let mut samples = Vec::with_capacity(n);
    for i in 0..warm + n {
        let t0 = clock.now_ns();
        for _ in 0..LAUNCH_BATCH {
            launch(api, gpu.kernels.empty, stream.raw(), &mut args)?;
        }
        let t1 = clock.now_ns();
        stream.synchronize()?;
        if i >= warm {
            samples.push((t1 - t0) as f64);
        }
    }
    Ok(samples)
}
