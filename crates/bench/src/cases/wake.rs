//! Case 2, host wake latency: a 50 us spin kernel, then the host waits for it; the time from the
//! kernel's end to the waiting thread's return.
//!
//! The kernel's end is taken on the host clock by the flag observer ([`FlagObserver`]): the
//! kernel's last act is a store to mapped host memory and a spinning thread stamps the moment it
//! lands. The waiter stamps its own return on the same clock; the latency is the difference.
//! (It reads a little low, by one GPU-to-host write, the same for every variant.)
//!
//! Also measured, the figure as first taken before this bench existed: the waiter's return minus
//! the launch call, minus the kernel's own duration from `%globaltimer`, which adds the launch
//! latency.
//!
//! Floor: `cuEventSynchronize` on a spinning `CU_EVENT_DISABLE_TIMING` event recorded after the
//! kernel. References: the same with `CU_EVENT_BLOCKING_SYNC`; polling `cuEventQuery` (what a
//! completion thread does); and the seeds' design, a `cuLaunchHostFunc` after the kernel whose
//! callback signals a condition variable the waiter sleeps on.
//!
//! cuhal: the same kernel as a one-dispatch graph command buffer, `Queue::execute` with one
//! signal, then `Semaphore::wait` on the host.

use cuhal_sys::{cu, cu_name};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use cuhal::DeviceOptions;

use super::{Env, progress, summarize};
use crate::clock::{Clock, delta};
use crate::gpu::SpinRecord;
use crate::gpu::observer::FlagObserver;
use crate::gpu::raw::{MappedFlags, SyncMode, launch};
use crate::hal::{Hal, WAIT};
use crate::report::{Comparison, Goal, Report};
use cuhal_sys::{Event, Stream};

/// The kernel's length.
pub const KERNEL_NS: u64 = 50_000;
/// Samples per variant (warm-up on top).
pub const SAMPLES: usize = 5_000;
/// The goal: cuhal's median at most the floor's plus this.
pub const GOAL_ADDED_NS: f64 = 3_000.0;

/// How the host waits for the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    /// `cuEventRecord` + `cuEventSynchronize`, spinning event.
    SpinSync,
    /// The same with a `CU_EVENT_BLOCKING_SYNC` event.
    BlockingSync,
    /// `cuEventRecord`, then `cuEventQuery` until complete.
    QueryPoll,
    /// `cuLaunchHostFunc` whose callback wakes the waiter through a condition variable.
    HostFunc,
}

impl Wait {
    fn describe(self) -> String {
        match self {
            Wait::SpinSync => format!("{}, spinning event", cu_name!(cuEventSynchronize)),
            Wait::BlockingSync => {
                format!("{}, BLOCKING_SYNC event", cu_name!(cuEventSynchronize))
            }
            Wait::QueryPoll => format!("{} polled in a loop", cu_name!(cuEventQuery)),
            Wait::HostFunc => format!(
                "seeds' design: {} signals a condvar, waiter wakes",
                cu_name!(cuLaunchHostFunc)
            ),
        }
    }
}

/// What the seeds' host function shares with the waiter.
struct HostFnSlot {
    clock: Clock,
    /// Callbacks run so far.
    ran: Mutex<u64>,
    woke: Condvar,
    /// When the last callback started.
    ran_at: AtomicU64,
}

/// The seeds' completion callback: stamp, count, wake the waiter. No CUDA calls, no panics.
unsafe extern "C" fn host_fn(user: *mut c_void) {
    // SAFETY: `user` is a leaked, never freed `HostFnSlot` (see `measure`).
    let slot = unsafe { &*(user as *const HostFnSlot) };
    slot.ran_at.store(slot.clock.now_ns(), Ordering::Relaxed);
    let mut ran = slot.ran.lock().unwrap_or_else(PoisonError::into_inner);
    *ran += 1;
    drop(ran);
    slot.woke.notify_one();
}

/// One variant's samples.
struct Samples {
    /// Kernel end (seen by the observer) to the waiter's return.
    latency: Vec<f64>,
    /// Waiter's return minus launch call, minus the kernel's duration.
    beyond_kernel: Vec<f64>,
    /// Host-function variant: kernel end to the callback's start.
    callback: Vec<f64>,
}

/// Runs case 2.
pub fn run(env: &Env<'_>, report: &mut Report) -> Result<()> {
    let n = env.scaled(SAMPLES);
    let warm = env.scaled(200);
    let gpu = env.gpu;
    let flags = Arc::new(MappedFlags::new(&gpu.ctx, 1)?);
    let observer = FlagObserver::start(flags.clone(), env.clock)?;
    let mut record = SpinRecord::new(gpu)?;

    let mut floor = None;
    for wait in [
        Wait::SpinSync,
        Wait::BlockingSync,
        Wait::QueryPoll,
        Wait::HostFunc,
    ] {
        progress(&format!("case 2 (wake): {}, {n} samples", wait.describe()));
        let mut s = measure(env, &flags, &observer, &mut record, wait, warm, n)?;
        let latency = summarize("case 2 latency", &mut s.latency)?;
        report.measured(
            "2",
            format!("kernel end -> waiter returns: {}", wait.describe()),
            latency,
        );
        report.measured(
            "2",
            format!(
                "return - launch - kernel (includes launch latency): {}",
                wait.describe()
            ),
            summarize("case 2 beyond kernel", &mut s.beyond_kernel)?,
        );
        if wait == Wait::HostFunc {
            report.measured(
                "2",
                "kernel end -> host function starts (seeds' design)",
                summarize("case 2 host function", &mut s.callback)?,
            );
        }
        if wait == Wait::SpinSync {
            floor = Some(latency);
        }
    }
    progress(&format!("case 2 (wake): cuhal semaphore wait, {n} samples"));
    let mut s = cuhal_side(env, &flags, &observer, &mut record, warm, n)?;
    let cuhal = summarize("case 2 cuhal latency", &mut s.latency)?;
    report.measured(
        "2",
        "return - launch - kernel (includes launch latency): cuhal execute + semaphore wait",
        summarize("case 2 cuhal beyond kernel", &mut s.beyond_kernel)?,
    );
    report.comparisons.push(Comparison::new(
        "2",
        "wake: 50 us kernel, then a semaphore signal; kernel end -> host semaphore wait returns",
        Some(cuhal),
        floor,
        Goal::AddedAtMost(GOAL_ADDED_NS),
    ));
    Ok(())
}

/// cuhal's side: a one-dispatch graph command buffer running the same kernel, executed with one
/// signal; the host waits on the semaphore.
fn cuhal_side(
    env: &Env<'_>,
    flags: &MappedFlags,
    observer: &FlagObserver,
    record: &mut SpinRecord,
    warm: usize,
    n: usize,
) -> Result<Samples> {
    let hal = Hal::open(DeviceOptions::default())?;
    let queue = hal.device.queue(0);
    let cb = hal.command_buffer(0, &[record.args(KERNEL_NS, flags.device(0), 0)])?;
    let semaphore = hal.semaphore();
    let clock = env.clock;
    let mut out = Samples {
        latency: Vec::with_capacity(n),
        beyond_kernel: Vec::with_capacity(n),
        callback: Vec::new(),
    };
    for i in 0..warm + n {
        let value = (i + 1) as u64;
        let flag = record.count_launch() as u32;
        observer.expect(flag);
        let t_launch = clock.now_ns();
        queue
            .execute(&[], &[(&semaphore, value)], &[&cb])
            .context("cuhal: Queue::execute")?;
        let waited = semaphore.wait(value, WAIT);
        let t_return = clock.now_ns();
        waited.context("cuhal: waiting for the semaphore")?;
        let seen = observer.seen(flag)?;
        let times = record.read("case 2 cuhal")?;
        if i >= warm {
            out.latency.push(delta(seen, t_return));
            let kernel = (times.end - times.start) as f64;
            out.beyond_kernel.push(delta(t_launch, t_return) - kernel);
        }
    }
    Ok(out)
}

fn measure(
    env: &Env<'_>,
    flags: &MappedFlags,
    observer: &FlagObserver,
    record: &mut SpinRecord,
    wait: Wait,
    warm: usize,
    n: usize,
) -> Result<Samples> {
    let gpu = env.gpu;
    let api = gpu.api();
    let clock = env.clock;
    let stream = Stream::new(&gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?;
    let event = Event::new(
        &gpu.ctx,
        if wait == Wait::BlockingSync {
            SyncMode::Blocking
        } else {
            SyncMode::Spin
        }
        .flags(),
    )?;
    // Leaked (once per variant, a few dozen bytes): a host function still queued when an error
    // ends this function early can then never outlive what it points to.
    let slot: &'static HostFnSlot = Box::leak(Box::new(HostFnSlot {
        clock,
        ran: Mutex::new(0),
        woke: Condvar::new(),
        ran_at: AtomicU64::new(0),
    }));
    let mut callbacks = 0u64;
    let mut out = Samples {
        latency: Vec::with_capacity(n),
        beyond_kernel: Vec::with_capacity(n),
        callback: Vec::with_capacity(n),
    };
    for i in 0..warm + n {
        let (mut args, count) = record.next(KERNEL_NS, flags.device(0), 0);
        let value = count as u32;
        observer.expect(value);
        let t_launch = clock.now_ns();
        launch(api, gpu.kernels.spin, stream.raw(), &mut args)?;
        match wait {
            Wait::SpinSync | Wait::BlockingSync => {
                event.record_and_synchronize(&stream)?;
            }
            Wait::QueryPoll => {
                // SAFETY: live event and stream.
                unsafe { cu!(api, cuEventRecord(event.raw(), stream.raw())) }?;
                loop {
                    // SAFETY: a live, recorded event.
                    if unsafe { cu!(ready: api, cuEventQuery(event.raw())) }? {
                        break;
                    }
                    std::hint::spin_loop();
                }
            }
            Wait::HostFunc => {
                let user = slot as *const HostFnSlot as *mut c_void;
                // SAFETY: `host_fn` makes no CUDA calls and takes no lock a CUDA-calling thread
                // holds; `slot` is 'static.
                unsafe { cu!(api, cuLaunchHostFunc(stream.raw(), Some(host_fn), user)) }?;
                callbacks += 1;
                wait_for_callbacks(slot, callbacks)?;
            }
        }
        let t_return = clock.now_ns();
        let seen = observer.seen(value)?;
        stream.synchronize()?;
        let times = record.read("case 2")?;
        if i >= warm {
            out.latency.push(delta(seen, t_return));
            let kernel = (times.end - times.start) as f64;
            out.beyond_kernel.push(delta(t_launch, t_return) - kernel);
            if wait == Wait::HostFunc {
                out.callback
                    .push(delta(seen, slot.ran_at.load(Ordering::Relaxed)));
            }
        }
    }
    stream.synchronize()?;
    Ok(out)
}

/// Sleeps on the condition variable until `count` callbacks ran; a callback that never comes is
/// an error after a few seconds, not a hang.
fn wait_for_callbacks(slot: &HostFnSlot, count: u64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut ran = slot.ran.lock().unwrap_or_else(PoisonError::into_inner);
    while *ran < count {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("the host function did not run within 5 s");
        }
        ran = slot
            .woke
            .wait_timeout(ran, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
    Ok(())
}
