//! The host side of bench cases 1, 9 and 10 on the fake driver, with work that takes time on the
//! fake's model clock: per-submission host cost, process CPU time (all threads, `getrusage`),
//! heap allocations, the queues' counters (who issued, batches, parks) and the driver calls per
//! submission. A profile of the scheduler's host path, not a measurement of a GPU: the fake's
//! calls cost what a mutex and a hash map cost, so compare runs with each other, not with the
//! H200's figures.
//!
//! ```text
//! cargo run --release -p cuhal --example fake_profile -- [same|across|chain|signal] [N] [LAUNCH_US] [CROSS_US] [GATHER_US]
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cuhal::{CommandBuffer, Device, DeviceOptions, Driver, FillPattern};
use cuhal_fake_driver::harness::FakeDriver;

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `alloc`'s contract, which we pass on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `dealloc`; the caller upholds `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// `struct timeval` and `struct rusage` of 64-bit Linux (only the two times are read).
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Timeval {
    sec: i64,
    usec: i64,
}

#[repr(C)]
#[derive(Default)]
struct Rusage {
    utime: Timeval,
    stime: Timeval,
    rest: [i64; 14],
}

unsafe extern "C" {
    fn getrusage(who: i32, usage: *mut Rusage) -> i32;
}

/// Process CPU time so far (user + system, every thread), in nanoseconds.
fn cpu_ns() -> u64 {
    let mut usage = Rusage::default();
    // SAFETY: `usage` is a writable `struct rusage` with 64-bit Linux's layout; 0 is RUSAGE_SELF.
    let r = unsafe { getrusage(0, &mut usage) };
    assert_eq!(r, 0, "getrusage");
    let ns = |t: Timeval| t.sec as u64 * 1_000_000_000 + t.usec as u64 * 1_000;
    ns(usage.utime) + ns(usage.stime)
}

const BATCH: usize = 250;
const CALLS: [&str; 6] = [
    "cuEventQuery",
    "cuStreamWaitEvent",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuGraphLaunch",
    "cuCtxGetCurrent",
];

fn command_buffer(device: &Device, q: usize) -> Arc<dyn CommandBuffer> {
    let buffer = device.create_buffer(256).unwrap();
    let mut cb = device.queue(q).create_command_buffer().unwrap();
    cb.fill(&buffer.whole(), FillPattern::U32(5)).unwrap();
    cb.end().unwrap()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// CPU time each thread of the process has run so far (`schedstat`, in nanoseconds), by name.
fn thread_ticks() -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for task in tasks.flatten() {
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let ran = std::fs::read_to_string(task.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split(' ').next().and_then(|t| t.parse().ok()))
            .unwrap_or(0);
        out.push((name.trim().to_string(), ran));
    }
    out
}

/// What a measured loop saw, before the per-submission division.
struct Window {
    threads: Vec<(String, u64)>,
    cpu: u64,
    allocations: u64,
    calls: Vec<u64>,
}

fn window(fake: &FakeDriver) -> Window {
    Window {
        threads: thread_ticks(),
        cpu: cpu_ns(),
        allocations: ALLOCATIONS.load(Ordering::Relaxed),
        calls: CALLS.iter().map(|c| fake.calls(c)).collect(),
    }
}

fn report(
    label: &str,
    fake: &FakeDriver,
    device: &Device,
    before: Window,
    n: usize,
    mut samples: Vec<f64>,
) {
    let after = window(fake);
    samples.sort_by(f64::total_cmp);
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    println!(
        "{label}: host ns per call median {:.0} p99 {:.0} mean {:.0}; process CPU ns per call {:.0}; allocations per call {:.4}",
        percentile(&samples, 0.5),
        percentile(&samples, 0.99),
        mean,
        (after.cpu - before.cpu) as f64 / n as f64,
        (after.allocations - before.allocations) as f64 / n as f64,
    );
    let calls: Vec<String> = CALLS
        .iter()
        .zip(after.calls.iter().zip(&before.calls))
        .map(|(name, (a, b))| format!("{name} {:.3}", (a - b) as f64 / n as f64))
        .collect();
    println!("  driver calls per call: {}", calls.join(", "));
    // CPU ns per call by thread.
    let per_thread: Vec<String> = after
        .threads
        .iter()
        .map(|(name, t)| {
            let b = before
                .threads
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0, |(_, t)| *t);
            format!("{name} {:.0}", (t - b) as f64 / n as f64)
        })
        .collect();
    println!("  CPU ns per call by thread: {}", per_thread.join(", "));
    for q in 0..device.queues().len() {
        println!("  queue {q}: {:?}", device.queue(q).stats());
    }
}

fn chained(fake: &FakeDriver, device: &Device, queues: usize, n: usize) {
    let cbs: Vec<_> = (0..queues).map(|q| command_buffer(device, q)).collect();
    let semaphore = device.create_semaphore(0);
    let warm = 2_000;
    let mut samples = Vec::with_capacity(n);
    let mut before = None;
    for i in 0..warm + n {
        if i == warm {
            before = Some(window(fake));
        }
        let q = i % queues;
        let value = i as u64;
        let t0 = Instant::now();
        device
            .queue(q)
            .execute(
                &[(&semaphore, value)],
                &[(&semaphore, value + 1)],
                &[&cbs[q]],
            )
            .unwrap();
        let t = t0.elapsed();
        if i >= warm {
            samples.push(t.as_nanos() as f64);
        }
        if (i + 1) % BATCH == 0 {
            semaphore.wait(value + 1, Duration::from_secs(10)).unwrap();
        }
    }
    semaphore
        .wait((warm + n) as u64, Duration::from_secs(10))
        .unwrap();
    let label = if queues == 1 {
        "case 1 same queue"
    } else {
        "case 1 across queues"
    };
    report(label, fake, device, before.unwrap(), n, samples);
}

/// Case 9: an alternating chain across the two queues, all submitted before the first step's
/// wait (a host gate) is met, then released by one host signal; timed from the signal to the
/// host's return on the last step's signal, per step.
fn alternating(fake: &FakeDriver, device: &Device, n: usize) {
    const STEPS: usize = 100;
    let cbs: Vec<_> = (0..2).map(|q| command_buffer(device, q)).collect();
    let warm = 20;
    let chains = (n / STEPS).max(1);
    let mut samples = Vec::with_capacity(chains);
    let mut before = None;
    for c in 0..warm + chains {
        if c == warm {
            before = Some(window(fake));
        }
        let gate = device.create_semaphore(0);
        let chain = device.create_semaphore(0);
        for i in 0..STEPS {
            let q = i % 2;
            let waits = if i == 0 {
                [(&gate, 1)]
            } else {
                [(&chain, i as u64)]
            };
            device
                .queue(q)
                .execute(&waits, &[(&chain, i as u64 + 1)], &[&cbs[q]])
                .unwrap();
        }
        let t0 = Instant::now();
        gate.signal(1).unwrap();
        chain.wait(STEPS as u64, Duration::from_secs(10)).unwrap();
        if c >= warm {
            samples.push(t0.elapsed().as_nanos() as f64 / STEPS as f64);
        }
    }
    report(
        "case 9 alternating chain, per step (calls = steps)",
        fake,
        device,
        before.unwrap(),
        chains * STEPS,
        samples,
    );
}

/// Case 10: a host signal releases a pending submission; a waiting thread's return is timed.
fn signal(fake: &FakeDriver, device: &Device, n: usize) {
    let queue = device.queue(0);
    let cb = command_buffer(device, 0);
    let gate = device.create_semaphore(0);
    let out = device.create_semaphore(0);
    let want = AtomicU64::new(0);
    let waiting = AtomicU64::new(0);
    let returned = AtomicU64::new(0);
    let returned_at = std::sync::Mutex::new(Instant::now());
    let stop = AtomicBool::new(false);
    let warm = 200;
    let mut samples = Vec::with_capacity(n);
    let mut before = None;
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut last = 0;
            while !stop.load(Ordering::Acquire) {
                let value = want.load(Ordering::Acquire);
                if value == last {
                    std::hint::spin_loop();
                    continue;
                }
                last = value;
                waiting.store(value, Ordering::Release);
                out.wait(value, Duration::from_secs(10)).unwrap();
                *returned_at.lock().unwrap() = Instant::now();
                returned.store(value, Ordering::Release);
            }
        });
        for i in 0..warm + n {
            if i == warm {
                before = Some(window(fake));
            }
            let value = i as u64 + 1;
            queue
                .execute(&[(&gate, value)], &[(&out, value)], &[&cb])
                .unwrap();
            want.store(value, Ordering::Release);
            while waiting.load(Ordering::Acquire) != value {
                std::hint::spin_loop();
            }
            let settle = Instant::now() + Duration::from_micros(20);
            while Instant::now() < settle {
                std::hint::spin_loop();
            }
            let t0 = Instant::now();
            gate.signal(value).unwrap();
            while returned.load(Ordering::Acquire) != value {
                std::hint::spin_loop();
            }
            if i >= warm {
                let at = *returned_at.lock().unwrap();
                samples.push(at.duration_since(t0).as_nanos() as f64);
            }
        }
        stop.store(true, Ordering::Release);
    });
    report(
        "case 10 signal to waiter",
        fake,
        device,
        before.unwrap(),
        n,
        samples,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let form = args.get(1).map_or("across", String::as_str);
    let n = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let launch = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(2);
    let cross = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(1);
    let gather = args.get(5).and_then(|a| a.parse().ok()).map_or(
        DeviceOptions::default().completion.gather,
        Duration::from_micros,
    );
    let fake = FakeDriver::private("profile").unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: set before any other thread of this program exists.
    unsafe { std::env::set_var(cuhal_sys::LIBRARY_ENV, fake.path()) };
    let driver = Driver::load().unwrap();
    let device = driver
        .open(
            0,
            DeviceOptions {
                queues: 2,
                completion: DeviceOptions::DEFAULT_COMPLETION.with_gather(gather),
                ..DeviceOptions::default()
            },
        )
        .unwrap();
    fake.set_timing(Duration::from_micros(launch), Duration::from_micros(cross));
    println!(
        "fake GPU: {launch} us per launch, {cross} us cross-stream gap; {n} calls; completion gather {gather:?}"
    );
    match form {
        "same" => chained(&fake, &device, 1, n),
        "across" => chained(&fake, &device, 2, n),
        "signal" => signal(&fake, &device, n),
        "chain" => alternating(&fake, &device, n),
        other => panic!("unknown form {other}: same, across, chain or signal"),
    }
}
