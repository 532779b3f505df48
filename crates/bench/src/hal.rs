//! The cuhal side of the benchmarks: a device opened through the `cuhal` crate, the same PTX
//! kernels loaded through it, and command buffers recorded with its API.
//!
//! The kernels write the same device words as the floors' (a [`StepCounter`], a [`SpinRecord`],
//! the observer's mapped flag), passed as plain addresses: they live in the same primary
//! context, so the same checks prove that cuhal's submissions ran, as often and in the order
//! expected.
//!
//! [`StepCounter`]: crate::gpu::StepCounter
//! [`SpinRecord`]: crate::gpu::SpinRecord

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use cuhal::{
    CommandBuffer, CommandRecorder, Device, DeviceOptions, Dispatch, Driver, Executable, Function,
    GraphCommandBuffer, GraphExec, KernelArgs, PatchMethod, Semaphore,
};

use crate::clock::Clock;
use crate::gpu::ptx;
use crate::gpu::raw::Args;

/// How long any host wait of the benchmarks may take before it is an error, not a hang.
pub const WAIT: Duration = Duration::from_secs(10);

/// A duration in microseconds from the environment, if set and valid.
fn env_micros(name: &str) -> Option<Duration> {
    std::env::var(name)
        .ok()?
        .parse::<u64>()
        .ok()
        .map(Duration::from_micros)
}

/// A cuhal device with the benchmark kernels.
pub struct Hal {
    /// The device (queues, semaphores, command buffers).
    pub device: Device,
    step: Function,
    spin: Function,
    /// `step` timed by the kernel's own zone stamps.
    step_stamped: Function,
    _executable: Executable,
    _stamped: Executable,
    _driver: Driver,
}

impl Hal {
    /// Opens device 0 through cuhal with `options` and loads the kernels.
    ///
    /// `CUHAL_BENCH_COMPLETION_SPIN_US` overrides the completion spin
    /// ([`CompletionOptions::spin`](cuhal::CompletionOptions::spin)), to measure the trade-off it
    /// makes; the policy's other timings are constants (`cuhal::completion_policy`).
    pub fn open(mut options: DeviceOptions) -> Result<Self> {
        if let Some(us) = env_micros("CUHAL_BENCH_COMPLETION_SPIN_US") {
            options.completion.spin = us;
        }
        let driver = Driver::load().context("cuhal: loading the driver")?;
        let device = driver.open(0, options).context("cuhal: opening device 0")?;
        let executable = device
            .load_ptx(ptx::MODULE)
            .context("cuhal: loading the benchmark kernels")?;
        let step = executable.function("step")?;
        let spin = executable.function("spin")?;
        let stamped = device
            .load_ptx(ptx::STAMPED_MODULE)
            .context("cuhal: loading the stamped step kernel")?;
        let step_stamped = stamped.function("step_stamped")?;
        Ok(Self {
            device,
            step,
            spin,
            step_stamped,
            _executable: executable,
            _stamped: stamped,
            _driver: driver,
        })
    }

    /// Waits, with short sleeps, until every queue has retired all it was given and its
    /// threads are parked (a completion thread looks for more work for a while before it parks:
    /// a side that measures in turns with others waits for this, off every clock, so that its
    /// threads' spin falls on its own turn and not on the next side's). Fails after [`WAIT`].
    pub fn settle(&self, what: &str) -> Result<()> {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let idle = self.device.queues().iter().all(|queue| {
                let stats = queue.stats();
                stats.completed + stats.failed >= stats.submitted
                    && stats.completion_parked
                    && stats.worker_parked
            });
            if idle {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                anyhow::bail!("{what}: the queues did not retire their work within {WAIT:?}");
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// A finished command buffer of queue `queue`'s mode holding one one-thread dispatch per
    /// entry of `dispatches` (`step` or `spin` arguments), with a barrier between consecutive
    /// ones, so each depends on the one before.
    pub fn command_buffer(
        &self,
        queue: usize,
        dispatches: &[Args],
    ) -> Result<Arc<dyn CommandBuffer>> {
        self.command_buffer_of(queue, dispatches, false)
    }

    /// [`Hal::command_buffer`], with each `step` dispatched as `step_stamped` (timed by its own
    /// zone stamps when the queue traces at FINE) where `stamped`.
    pub fn command_buffer_of(
        &self,
        queue: usize,
        dispatches: &[Args],
        stamped: bool,
    ) -> Result<Arc<dyn CommandBuffer>> {
        let mut cb = self
            .device
            .queue(queue)
            .create_command_buffer()
            .context("cuhal: creating a command buffer")?;
        for (i, args) in dispatches.iter().enumerate() {
            if i > 0 {
                cb.barrier()?;
            }
            let (mut function, mut kernel_args) = self.kernel(args)?;
            if stamped && matches!(args, Args::Step { .. }) {
                function = &self.step_stamped;
                kernel_args.push_zone_stamp();
            }
            cb.dispatch(&Dispatch::new(function, [1, 1, 1], [1, 1, 1], &kernel_args))?;
        }
        cb.end().context("cuhal: ending a command buffer")
    }

    /// A finished command buffer of queue `queue`'s mode: a chain of `count` one-thread `step`
    /// dispatches (indices `0..count`, a barrier between consecutive ones) whose counter and
    /// error words are binding slots 0 and 1, given at every submission.
    pub fn bound_step_chain(&self, queue: usize, count: u32) -> Result<Arc<dyn CommandBuffer>> {
        let mut cb = self
            .device
            .queue(queue)
            .create_command_buffer_with_bindings(2)
            .context("cuhal: creating a command buffer with binding slots")?;
        self.record_bound_steps(&mut *cb, count)?;
        cb.end().context("cuhal: ending a command buffer")
    }

    /// [`Self::bound_step_chain`] as a graph command buffer that patches its bindings with
    /// `method` (and can report where it did).
    pub fn bound_step_graph(&self, count: u32, method: PatchMethod) -> Result<Arc<GraphExec>> {
        let mut cb = GraphCommandBuffer::with_bindings(self.device.context(), None, 2)
            .context("cuhal: creating a graph command buffer with binding slots")?;
        cb.set_patch_method(method)?;
        self.record_bound_steps(&mut cb, count)?;
        let cb = cb.end().context("cuhal: ending a command buffer")?;
        Ok(Arc::new(cb))
    }

    /// Records the chain of [`Self::bound_step_chain`] into `cb`.
    fn record_bound_steps(&self, cb: &mut dyn CommandRecorder, count: u32) -> Result<()> {
        for index in 0..count {
            if index > 0 {
                cb.barrier()?;
            }
            let args = KernelArgs::new()
                .with_binding(0, 0)
                .with_binding(1, 0)
                .with(index)
                .with(count.max(1));
            cb.dispatch(&Dispatch::new(&self.step, [1, 1, 1], [1, 1, 1], &args))?;
        }
        Ok(())
    }

    /// The kernel and packed arguments for `args`.
    fn kernel(&self, args: &Args) -> Result<(&Function, KernelArgs)> {
        Ok(match *args {
            Args::Step {
                counter,
                errors,
                index,
                period,
            } => (
                &self.step,
                KernelArgs::new()
                    .with(counter)
                    .with(errors)
                    .with(index)
                    .with(period),
            ),
            Args::Spin {
                ns,
                record,
                flag,
                jitter,
            } => (
                &self.spin,
                KernelArgs::new()
                    .with(ns)
                    .with(record)
                    .with(flag)
                    .with(jitter),
            ),
            Args::None | Args::Probe { .. } => {
                anyhow::bail!("the cuhal side dispatches only step and spin kernels")
            }
        })
    }

    /// A semaphore at 0.
    pub fn semaphore(&self) -> Semaphore {
        self.device.create_semaphore(0)
    }

    /// One round trip: submits `cb` on queue `queue`, signalling `semaphore` to `value` (not
    /// reached yet), and waits for it on the host; the submit-to-return time in nanoseconds.
    pub fn round_trip(
        &self,
        queue: usize,
        cb: &Arc<dyn CommandBuffer>,
        semaphore: &Semaphore,
        value: u64,
        clock: Clock,
    ) -> Result<f64> {
        let queue = self.device.queue(queue);
        let t0 = clock.now_ns();
        queue
            .execute(&[], &[(semaphore, value)], &[cb])
            .context("cuhal: Queue::execute")?;
        let waited = semaphore.wait(value, WAIT);
        let t1 = clock.now_ns();
        waited.context("cuhal: waiting for the semaphore")?;
        Ok((t1 - t0) as f64)
    }

    /// [`Hal::round_trip`] `warm + n` times on a fresh semaphore; returns the last `n` times.
    pub fn time_round_trips(
        &self,
        queue: usize,
        cb: &Arc<dyn CommandBuffer>,
        clock: Clock,
        warm: usize,
        n: usize,
    ) -> Result<Vec<f64>> {
        let semaphore = self.semaphore();
        let mut samples = Vec::with_capacity(n);
        for i in 0..warm + n {
            let time = self.round_trip(queue, cb, &semaphore, (i + 1) as u64, clock)?;
            if i >= warm {
                samples.push(time);
            }
        }
        Ok(samples)
    }
}

/// Waits on the host for `semaphore` to reach `value`, or fails after [`WAIT`].
pub fn wait(semaphore: &Semaphore, value: u64) -> Result<()> {
    semaphore
        .wait(value, WAIT)
        .with_context(|| format!("waiting for a cuhal semaphore to reach {value}"))
}
