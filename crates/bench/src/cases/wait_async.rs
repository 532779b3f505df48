//! Case 15, `wait_async` wake latency: a 50 us spin kernel, then a task on a current-thread
//! executor awaits its completion; the time from the kernel's end to the task resuming (its
//! future's poll returning ready).
//!
//! The harness is case 2's (`wake.rs`): the kernel's end is stamped on the host clock by the
//! flag observer, the resumption on the same clock, one spin record counting every launch.
//! The executor is written here, for one future: it polls it, then idles until its waker
//! runs and polls again. It idles spinning on a flag the waker sets (a runtime with a thread
//! to spare, as the floor spins), or parked (`thread::park`, woken by `unpark`: a runtime that
//! sleeps when idle; reported, with no goal, since a parked thread's wake-up is the kernel's
//! cost, not cuhal's).
//!
//! Floor: `cuEventSynchronize` on a spinning event recorded after the kernel (case 2's floor).
//! Reference: the `cuLaunchHostFunc` path (how NVIDIA's `cuda-async` wakes its futures): a
//! host function enqueued after the kernel wakes the awaiting future's waker; reported are the
//! callback's start and the task's resumption, on the same spinning executor. cuhal: the same
//! kernel as a one-dispatch graph command buffer, `Queue::execute` with one signal, then the
//! task awaits `Semaphore::wait_async`: the queue's completion side, told that a future waits,
//! advances the semaphore and the future's listener wakes the task.
//!
//! Goals: cuhal's median at most the floor's plus 2 us, and at most a tenth of the host
//! function's callback latency. The sides take turns of `TURN` samples, who goes first
//! rotating, so the host's drift falls on every side alike.

use std::ffi::c_void;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use cuhal::DeviceOptions;
use cuhal_sys::{Event, Stream, cu, cu_name};

use super::wake::KERNEL_NS;
use super::{Env, in_turns, progress, summarize};
use crate::clock::{Clock, delta};
use crate::gpu::SpinRecord;
use crate::gpu::observer::FlagObserver;
use crate::gpu::raw::{MappedFlags, SyncMode, launch};
use crate::hal::{Hal, WAIT};
use crate::report::{Center, Comparison, Goal, Report};

/// Samples per side (warm-up on top).
pub const SAMPLES: usize = 2_000;
/// The goal: cuhal's median at most the floor's plus this.
pub const GOAL_ADDED_NS: f64 = 2_000.0;
/// The goal against the host-function path: cuhal's median at most this times its callback's.
pub const GOAL_VS_HOST_FUNCTION: f64 = 0.1;
/// The samples of one side's turn.
const TURN: usize = 100;

/// How the executor waits for its waker between polls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Idle {
    /// Spins on the flag the waker sets.
    Spin,
    /// Parks the thread; the waker unparks it.
    Park,
}

/// The waker of [`block_on`]: sets the flag and unparks the executor's thread (an atomic swap
/// while it spins, a futex wake while it is parked).
struct Ready {
    ready: AtomicBool,
    thread: Thread,
}

impl Wake for Ready {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.ready.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// A current-thread executor of one future: polls it until it is ready, idling between polls
/// as `idle` says; returns its output and when the poll that finished it returned (on
/// `clock`). A waker that never comes is an error after [`WAIT`], not a hang.
fn block_on<F: Future>(future: F, idle: Idle, clock: Clock) -> Result<(F::Output, u64)> {
    let ready = Arc::new(Ready {
        ready: AtomicBool::new(false),
        thread: std::thread::current(),
    });
    let waker = Waker::from(ready.clone());
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    let deadline = Instant::now() + WAIT;
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return Ok((output, clock.now_ns()));
        }
        let mut looks = 0u32;
        while !ready.ready.swap(false, Ordering::Acquire) {
            match idle {
                Idle::Spin => {
                    std::hint::spin_loop();
                    looks = looks.wrapping_add(1);
                    if looks.is_multiple_of(4096) && Instant::now() >= deadline {
                        bail!("the future was not woken within {WAIT:?}");
                    }
                }
                Idle::Park => {
                    let now = Instant::now();
                    if now >= deadline {
                        bail!("the future was not woken within {WAIT:?}");
                    }
                    std::thread::park_timeout(deadline - now);
                }
            }
        }
    }
}

/// What the host function shares with the future it wakes.
struct HostFnSlot {
    clock: Clock,
    /// Callbacks run so far.
    ran: AtomicU64,
    /// When the last callback started.
    ran_at: AtomicU64,
    /// The awaiting task's waker.
    waker: Mutex<Option<Waker>>,
}

/// The host function: stamp, count, wake the awaiting task. No CUDA calls, no panics.
unsafe extern "C" fn host_fn(user: *mut c_void) {
    // SAFETY: `user` is a leaked, never freed `HostFnSlot` (see `run`).
    let slot = unsafe { &*(user as *const HostFnSlot) };
    slot.ran_at.store(slot.clock.now_ns(), Ordering::Relaxed);
    slot.ran.fetch_add(1, Ordering::Release);
    let waker = slot
        .waker
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    if let Some(waker) = waker {
        waker.wake();
    }
}

/// A future woken by the host function, as a host-function design builds one: ready once
/// `count` callbacks ran.
struct HostFnWait {
    slot: &'static HostFnSlot,
    count: u64,
}

impl Future for HostFnWait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.slot.ran.load(Ordering::Acquire) >= self.count {
            return Poll::Ready(());
        }
        *self
            .slot
            .waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(cx.waker().clone());
        // A callback between the look and the store found no waker: look again.
        if self.slot.ran.load(Ordering::Acquire) >= self.count {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

/// The case's four sides' samples: kernel end to return (floor) or to resumption.
struct Sides {
    floor: Vec<f64>,
    cuhal_spin: Vec<f64>,
    cuhal_park: Vec<f64>,
    host_fn: Vec<f64>,
    /// Kernel end to the host function's start.
    callback: Vec<f64>,
}

/// Runs case 15.
pub fn run(env: &Env<'_>, report: &mut Report) -> Result<()> {
    let n = env.scaled(SAMPLES);
    let warm = env.scaled(200);
    let total = warm + n;
    let gpu = env.gpu;
    let api = gpu.api();
    let clock = env.clock;
    progress(&format!(
        "case 15 (wait-async): the floor, cuhal on a spinning and on a parking executor and the host-function path in turns of {TURN}, {n} samples each"
    ));
    let flags = Arc::new(MappedFlags::new(&gpu.ctx, 1)?);
    let observer = FlagObserver::start(flags.clone(), clock)?;
    let mut record = SpinRecord::new(gpu)?;
    let stream = Stream::new(&gpu.ctx, cuhal_sys::CU_STREAM_NON_BLOCKING)?;
    let event = Event::new(&gpu.ctx, SyncMode::Spin.flags())?;
    // Leaked (a few dozen bytes, once): a host function still queued when an error ends this
    // function early can then never outlive what it points to.
    let slot: &'static HostFnSlot = Box::leak(Box::new(HostFnSlot {
        clock,
        ran: AtomicU64::new(0),
        ran_at: AtomicU64::new(0),
        waker: Mutex::new(None),
    }));
    let mut callbacks = 0u64;
    let hal = Hal::open(DeviceOptions::default())?;
    let queue = hal.device.queue(0);
    let cb = hal.command_buffer(0, &[record.args(KERNEL_NS, flags.device(0), 0)])?;
    let semaphore = hal.semaphore();
    let mut value = 0u64;
    let mut callback = Vec::with_capacity(n);

    let samples = in_turns::<4>(total.div_ceil(TURN), n, |round, side, times| {
        for i in round * TURN..((round + 1) * TURN).min(total) {
            let (flag, resumed) = match side {
                0 => {
                    let (mut args, count) = record.next(KERNEL_NS, flags.device(0), 0);
                    observer.expect(count as u32);
                    launch(api, gpu.kernels.spin, stream.raw(), &mut args)?;
                    event.record_and_synchronize(&stream)?;
                    (count, clock.now_ns())
                }
                1 | 2 => {
                    let count = record.count_launch();
                    observer.expect(count as u32);
                    value += 1;
                    queue
                        .execute(&[], &[(&semaphore, value)], &[&cb])
                        .context("case 15 cuhal: Queue::execute")?;
                    let idle = if side == 1 { Idle::Spin } else { Idle::Park };
                    let (waited, at) = block_on(semaphore.wait_async(value), idle, clock)?;
                    waited.context("case 15 cuhal: awaiting the semaphore")?;
                    (count, at)
                }
                _ => {
                    let (mut args, count) = record.next(KERNEL_NS, flags.device(0), 0);
                    observer.expect(count as u32);
                    launch(api, gpu.kernels.spin, stream.raw(), &mut args)?;
                    let user = slot as *const HostFnSlot as *mut c_void;
                    // SAFETY: `host_fn` makes no CUDA calls and takes only the slot's lock,
                    // which no CUDA-calling thread holds across a CUDA call; `slot` is 'static.
                    unsafe { cu!(api, cuLaunchHostFunc(stream.raw(), Some(host_fn), user)) }?;
                    callbacks += 1;
                    let wait = HostFnWait {
                        slot,
                        count: callbacks,
                    };
                    let ((), at) = block_on(wait, Idle::Spin, clock)?;
                    (count, at)
                }
            };
            let seen = observer.seen(flag as u32)?;
            stream.synchronize()?;
            record.read("case 15")?;
            if i >= warm {
                times.push(delta(seen, resumed));
                if side == 3 {
                    callback.push(delta(seen, slot.ran_at.load(Ordering::Relaxed)));
                }
            }
        }
        if side == 1 || side == 2 {
            hal.settle("case 15 cuhal")?;
        }
        Ok(())
    })?;
    stream.synchronize()?;
    let [floor, cuhal_spin, cuhal_park, host_fn] = samples;
    publish(
        report,
        Sides {
            floor,
            cuhal_spin,
            cuhal_park,
            host_fn,
            callback,
        },
    )
}

/// Reports the figures and the comparisons.
fn publish(report: &mut Report, mut s: Sides) -> Result<()> {
    let floor = summarize("case 15 floor", &mut s.floor)?;
    let cuhal = summarize("case 15 cuhal", &mut s.cuhal_spin)?;
    let parked = summarize("case 15 cuhal parking", &mut s.cuhal_park)?;
    let host_fn = summarize("case 15 host function", &mut s.host_fn)?;
    let callback = summarize("case 15 host function callback", &mut s.callback)?;
    let sync = cu_name!(cuEventSynchronize);
    let host = cu_name!(cuLaunchHostFunc);
    report.measured(
        "15",
        format!("kernel end -> {sync} returns, spinning event (floor)"),
        floor,
    );
    report.measured(
        "15",
        "kernel end -> task resumes: cuhal execute + wait_async, spinning executor",
        cuhal,
    );
    report.measured(
        "15",
        "kernel end -> task resumes: cuhal execute + wait_async, parking executor",
        parked,
    );
    report.measured(
        "15",
        format!("kernel end -> {host} callback starts (its future's wake)"),
        callback,
    );
    report.measured(
        "15",
        format!("kernel end -> task resumes: {host} wakes the future, spinning executor"),
        host_fn,
    );
    let what = "wait_async wake: 50 us kernel, then a semaphore signal; kernel end -> the awaiting task resumes (current-thread executor, spinning)";
    report.comparisons.push(Comparison::new(
        "15",
        what,
        Some(cuhal),
        Some(floor),
        Goal::AddedAtMost(GOAL_ADDED_NS),
    ));
    report.comparisons.push(Comparison {
        center: Center::P99,
        ..Comparison::new(
            "15",
            format!("{what}; p99"),
            Some(cuhal),
            Some(floor),
            Goal::Report,
        )
    });
    report.comparisons.push(
        Comparison::new(
            "15",
            format!("{what}; against the {host} path (the floor column: its callback's start)"),
            Some(cuhal),
            Some(callback),
            Goal::RatioAtMost(GOAL_VS_HOST_FUNCTION),
        )
        .note(format!(
            "case 15 (wait-async): the {host} path resumes its task {} after the kernel's end (median; p99 {}); a parking executor resumes cuhal's {} after it",
            fmt_us(host_fn.median),
            fmt_us(host_fn.p99),
            fmt_us(parked.median)
        )),
    );
    report.comparisons.push(Comparison::new(
        "15",
        "wait_async wake on a parking executor (thread park/unpark), for comparison",
        Some(parked),
        Some(floor),
        Goal::Report,
    ));
    Ok(())
}

/// Nanoseconds as microseconds, one decimal.
fn fmt_us(ns: f64) -> String {
    format!("{:.1} us", ns / 1_000.0)
}
