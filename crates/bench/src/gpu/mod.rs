//! The raw-driver side of the benchmarks: the device's primary context, the PTX kernels, owned
//! driver objects, and the host thread that sees a kernel's end.

pub mod observer;
pub mod ptx;
pub mod raw;

use std::sync::Arc;

use anyhow::{Context as _, Result, bail};
use cuhal_sys::{CUfunction, DeviceInfo, DriverApi, PrimaryContext};

use cuhal_sys::{Module, Stream};
use raw::{Args, DeviceWords, launch};

/// The benchmark's kernels, loaded once.
pub struct Kernels {
    /// `empty()`.
    pub empty: CUfunction,
    /// `step(counter, errors, index, period)`.
    pub step: CUfunction,
    /// `spin(ns, record, flag, jitter)`.
    pub spin: CUfunction,
    /// `timer_probe(out, iters)`.
    pub probe: CUfunction,
    // Declared last so the functions above are never used after it is unloaded.
    _module: Module,
}

/// Device 0, ready for the floors.
pub struct Gpu {
    /// Its primary context, current on the benchmark's thread.
    pub ctx: Arc<PrimaryContext>,
    /// What it is.
    pub info: DeviceInfo,
    /// The benchmark kernels.
    pub kernels: Kernels,
}

impl Gpu {
    /// Retains device 0's primary context and loads the kernels.
    pub fn open(api: Arc<DriverApi>) -> Result<Self> {
        let info = cuhal_sys::device_info(&api, 0).context("reading device 0")?;
        let ctx = PrimaryContext::retain(api, 0).context("retaining device 0's context")?;
        let module =
            Module::load_ptx(&ctx, ptx::MODULE).context("compiling the benchmark kernels")?;
        let kernels = Kernels {
            empty: module.function("empty")?,
            step: module.function("step")?,
            spin: module.function("spin")?,
            probe: module.function("timer_probe")?,
            _module: module,
        };
        Ok(Self { ctx, info, kernels })
    }

    /// The driver table.
    pub fn api(&self) -> &DriverApi {
        self.ctx.api()
    }

    /// Measures `%globaltimer`'s resolution: the smallest step between two reads in a tight
    /// loop, in nanoseconds. Also proves that kernels run at all before any case relies on it.
    pub fn timer_resolution(&self) -> Result<TimerResolution> {
        let stream = Stream::new(&self.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?;
        let out = DeviceWords::zeroed(&self.ctx, 3)?;
        let mut args = Args::Probe {
            out: out.ptr(),
            iters: 200_000,
        };
        launch(self.api(), self.kernels.probe, stream.raw(), &mut args)?;
        stream.synchronize()?;
        let words = out.read()?;
        let (step, steps, span) = (words[0], words[1], words[2]);
        if steps == 0 || span == 0 {
            bail!(
                "the timer probe kernel saw %globaltimer never advance ({steps} steps over {span} ns): \
                 the kernels did not run or the timer is stopped"
            );
        }
        Ok(TimerResolution {
            step_ns: step,
            mean_step_ns: span as f64 / steps as f64,
        })
    }
}

/// What [`Gpu::timer_resolution`] found.
#[derive(Clone, Copy, Debug)]
pub struct TimerResolution {
    /// The smallest step seen.
    pub step_ns: u64,
    /// The mean step.
    pub mean_step_ns: f64,
}

/// A `spin` kernel's three-word record, with the launch count the host expects in it.
pub struct SpinRecord {
    words: DeviceWords,
    launched: u64,
}

/// One reading of a [`SpinRecord`].
#[derive(Clone, Copy, Debug)]
pub struct SpinTimes {
    /// The kernel's first `%globaltimer` read.
    pub start: u64,
    /// Its last, when it stopped spinning.
    pub end: u64,
}

impl SpinRecord {
    /// A zeroed record.
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(Self {
            words: DeviceWords::zeroed(&gpu.ctx, 3)?,
            launched: 0,
        })
    }

    /// A zeroed record in the memory of `ctx`'s device (another GPU than the bench's).
    pub fn in_context(ctx: &Arc<PrimaryContext>) -> Result<Self> {
        let _bound = ctx.enter()?;
        Ok(Self {
            words: DeviceWords::zeroed(ctx, 3)?,
            launched: 0,
        })
    }

    /// Arguments for one more launch writing this record; returns them with the launch count
    /// (and flag value) that launch will write.
    pub fn next(&mut self, ns: u64, flag: u64, jitter: u64) -> (Args, u64) {
        (self.args(ns, flag, jitter), self.count_launch())
    }

    /// Notes one more launch made with [`SpinRecord::args`] (fixed arguments, as a graph or a
    /// recorded command buffer has); returns the count (and flag value) it will write.
    pub fn count_launch(&mut self) -> u64 {
        self.launched += 1;
        self.launched
    }

    /// The arguments of a launch writing this record; count each launch made with them with
    /// [`SpinRecord::count_launch`].
    pub fn args(&self, ns: u64, flag: u64, jitter: u64) -> Args {
        Args::Spin {
            ns,
            record: self.words.ptr(),
            flag,
            jitter,
        }
    }

    /// Reads the record (after the stream that wrote it was synchronized) and checks that every
    /// launch made ran: the count must match exactly.
    pub fn read(&self, what: &str) -> Result<SpinTimes> {
        let w = self.words.read()?;
        if w[0] != self.launched {
            bail!(
                "{what}: the spin kernel ran {} times where {} launches were made",
                w[0],
                self.launched
            );
        }
        if w[2] < w[1] {
            bail!(
                "{what}: the spin kernel ended ({}) before it started ({})",
                w[2],
                w[1]
            );
        }
        Ok(SpinTimes {
            start: w[1],
            end: w[2],
        })
    }
}

/// A `step` kernel's counter and violation count.
pub struct StepCounter {
    words: DeviceWords,
    launched: u64,
}

impl StepCounter {
    /// A zeroed counter.
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(Self {
            words: DeviceWords::zeroed(&gpu.ctx, 2)?,
            launched: 0,
        })
    }

    /// Arguments for launch `index` of a chain of `period`.
    pub fn args(&self, index: u32, period: u32) -> Args {
        Args::Step {
            counter: self.words.word(0),
            errors: self.words.word(1),
            index,
            period: period.max(1),
        }
    }

    /// One one-node `step` graph per stream `0..streams`, launch `q` of a chain of `period` on
    /// stream `q`: the raw floors' graphs beside a cuhal queue per stream.
    pub fn graphs(&self, gpu: &Gpu, streams: u32, period: u32) -> Result<Vec<raw::GraphExec>> {
        (0..streams)
            .map(|q| {
                raw::GraphExec::chain(
                    &gpu.ctx,
                    &mut [raw::KernelNode {
                        function: gpu.kernels.step,
                        args: self.args(q, period),
                    }],
                )
            })
            .collect()
    }

    /// A binding table for a command buffer whose `step` dispatches name their counter and
    /// error words as slots 0 and 1.
    pub fn table(&self) -> [cuhal::BufferRange; 2] {
        // SAFETY: both words are device memory of the benchmark's (primary) context, which every
        // cuhal device of the run shares, and live as long as this counter, which each case keeps
        // until its submissions have completed.
        [0, 1].map(|i| unsafe { cuhal::BufferRange::from_raw(self.words.word(i), 8) })
    }

    /// Notes `n` more launches.
    pub fn expect_more(&mut self, n: u64) {
        self.launched += n;
    }

    /// Checks (after synchronizing the streams that ran them) that exactly the launches made
    /// ran, and every one after those it depends on. The counter is 32 bits wide on the device.
    pub fn check(&self, what: &str) -> Result<()> {
        let w = self.words.read()?;
        // Each word holds a u32 in its low half (little-endian).
        let (count, errors) = (w[0] & 0xffff_ffff, w[1] & 0xffff_ffff);
        if count != self.launched & 0xffff_ffff {
            bail!(
                "{what}: the step kernel ran {count} times where {} launches were made",
                self.launched
            );
        }
        if errors != 0 {
            bail!("{what}: {errors} step kernels ran before a launch they depend on");
        }
        Ok(())
    }
}
