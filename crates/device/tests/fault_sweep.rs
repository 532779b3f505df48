//! Fault injection over a representative workload on the fake driver: for every driver function
//! the workload calls, runs in which one of its calls fails, once with a plain error and once
//! with a sticky one. Every run must end without a panic or a hang, every host wait must return,
//! no driver object may leak, and every read that succeeds must return the right bytes.
//!
//! Every call is tried; past [`PER_FUNCTION`] calls of one function, call numbers are sampled
//! deterministically (spread from the first to the last) so the sweep stays within CI's budget.
//! The sweep's size and results are printed.

mod fake_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use cuhal::{
    CommandBuffer, CommandRecorder, DeviceOptions, Dispatch, Driver, FillPattern, KernelArgs,
    MemorySink, Verbosity,
};
use cuhal_command::DeferredCommandBuffer;
use cuhal_fake_driver::control::Counts;
use cuhal_fake_driver::status;
use fake_support::*;

/// Call numbers tried per function (all of them when it is called fewer times). Every call of
/// the workload fits under it today (the sweep takes seconds); a workload that grows is sampled.
const PER_FUNCTION: u64 = 256;
/// A run that takes longer than this hung.
const WATCHDOG: Duration = Duration::from_secs(30);
/// Bytes per buffer.
const N: usize = 1024;

/// How one run ended.
#[derive(Debug, Default)]
struct Outcome {
    /// Reads that succeeded with wrong bytes.
    wrong_bytes: Vec<String>,
    /// Host waits that timed out.
    timeouts: Vec<String>,
}

/// The workload: open (two queues, tracing), allocate, write, a graph and a deferred command
/// buffer with dispatch, fill and copy, cross-queue waits, alloca/dealloca, a host call, reads
/// back, and drop. Any error is accepted (it is what the faults cause); a read that succeeds
/// must be right, and no wait may time out.
fn workload(driver: &Driver) -> Outcome {
    let mut out = Outcome::default();
    let sink = Arc::new(MemorySink::new());
    let Ok(device) = driver.open(
        0,
        DeviceOptions {
            queues: 2,
            tracing: Verbosity::Coarse,
            trace_sink: Some(sink),
            ..DeviceOptions::default()
        },
    ) else {
        return out;
    };
    let (q0, q1) = (device.queue(0), device.queue(1));
    let data: Vec<u8> = (0..N).map(|i| (i * 7 + 1) as u8).collect();
    let check = |out: &mut Outcome, what: &str, result: Result<(), cuhal_semaphore::Error>| {
        if let Err(cuhal_semaphore::Error::Timeout) = result {
            out.timeouts.push(what.to_owned());
        }
        result.is_ok()
    };
    let (s, t) = (device.create_semaphore(0), device.create_semaphore(0));
    let run = |out: &mut Outcome| -> Result<(), cuhal::Error> {
        let a = device.create_buffer(N)?;
        let b = device.create_buffer(N)?;
        let c = device.create_buffer(N)?;
        q0.write(&[], &[(&s, 1)], &a.whole(), &data)?;
        let module = device.load_ptx(PTX)?;
        let add_one = module.function("add_one")?;
        let mut graph = q0.create_command_buffer()?;
        graph.fill(&b.range(0, N / 2)?, FillPattern::U8(7))?;
        graph.dispatch(&Dispatch::new(
            &add_one,
            [1, 1, 1],
            [32, 1, 1],
            &KernelArgs::new().with_range(&c.whole()).with(0u32),
        ))?;
        graph.barrier()?;
        graph.copy(&a.range(0, N / 2)?, &b.range(N / 2, N / 2)?)?;
        // Stream work captured into the graph (begin, the closure's call, end): a refused
        // capture is an error like any other, and leaves neither a graph nor a capturing stream.
        graph.stream_work(&[c.range(512, 256)?], zero_fill())?;
        let graph: Arc<dyn CommandBuffer> = graph.end()?;
        q0.execute(&[(&s, 1)], &[(&s, 2)], &[&graph])?;

        let mut deferred = DeferredCommandBuffer::with_context(device.context(), None)?;
        deferred.fill(&c.range(0, 256)?, FillPattern::U32(0x0303_0303))?;
        let deferred: Arc<dyn CommandBuffer> = Arc::new(deferred.end()?);
        // Cross-queue: waits for the graph on queue 0.
        q1.execute(&[(&s, 2)], &[(&t, 1)], &[&deferred])?;
        let tmp = q1.alloca(&[(&t, 1)], &[(&t, 2)], 256)?;
        q1.fill(&[(&t, 2)], &[(&t, 3)], &tmp.whole(), FillPattern::U8(9))?;
        q1.copy(&[(&t, 3)], &[(&t, 4)], &tmp.whole(), &c.range(256, 256)?)?;
        q1.dealloca(&[(&t, 4)], &[(&t, 5)], &tmp)?;
        q0.host_call(&[(&t, 5)], &[(&s, 3)], || Ok(()))?;

        let host = device.create_host_buffer(2 * N)?;
        q0.read(&[(&s, 3)], &[(&s, 4)], &b.whole(), &host, 0)?;
        q1.read(&[(&s, 4)], &[(&t, 6)], &c.range(0, 512)?, &host, N)?;
        if check(out, "final read", t.wait(6, TIMEOUT)) {
            let mut bytes = vec![0; 2 * N];
            host.read(0, &mut bytes)?;
            let mut expected = vec![7u8; N / 2];
            expected.extend_from_slice(&data[..N / 2]);
            expected.extend_from_slice(&[3; 256]);
            expected.extend_from_slice(&[9; 256]);
            if bytes[..N + 512] != expected[..] {
                out.wrong_bytes.push("the final read".into());
            }
        }
        Ok(())
    };
    // Only a chain that was accepted whole is waited for (inside `run`): a refused submission
    // leaves its semaphores where they are, as it should.
    let _ = run(&mut out);
    drop(device);
    out
}

/// Stream work that zeroes its one range (`cuMemsetD8Async` on the stream it is handed).
fn zero_fill() -> Arc<cuhal::StreamWorkFn> {
    Arc::new(|on: &cuhal::StreamWork<'_>| {
        let range = on.ranges()[0];
        // SAFETY: the range is live device memory the command buffer retains; the stream is the
        // one handed to the closure.
        unsafe {
            cuhal_sys::cu!(
                on.context().api(),
                cuMemsetD8Async(range.ptr, 0, range.len, on.stream())
            )
        }?;
        Ok(())
    })
}

/// Panics anywhere in the process (the queues' threads included).
static PANICS: AtomicUsize = AtomicUsize::new(0);

#[test]
fn every_injected_fault_is_survived() {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::Relaxed);
        hook(info);
    }));
    let (fake, driver) = load("fault-sweep");
    let driver = Arc::new(driver);
    let names: Vec<&str> = cuhal_sys::DriverApi::REQUIRED_SYMBOLS
        .iter()
        .chain(cuhal_sys::DriverApi::OPTIONAL_SYMBOLS)
        .copied()
        .collect();

    // A clean run: the bytes are right, nothing leaks, and how often each function is called.
    let before: Vec<u64> = names.iter().map(|n| fake.calls(n)).collect();
    let clean = workload(&driver);
    assert!(
        clean.wrong_bytes.is_empty() && clean.timeouts.is_empty(),
        "{clean:?}"
    );
    assert_eq!(live(&fake), Counts::default());
    let mut calls = BTreeMap::new();
    for (name, before) in names.iter().zip(before) {
        let n = fake.calls(name) - before;
        if n > 0 {
            calls.insert(*name, n);
        }
    }

    let mut runs = 0;
    let mut not_reached = 0;
    let mut failures = Vec::new();
    for (&name, &count) in &calls {
        let picks: Vec<u64> = if count <= PER_FUNCTION {
            (1..=count).collect()
        } else {
            let mut p: Vec<u64> = (0..PER_FUNCTION)
                .map(|i| 1 + i * (count - 1) / (PER_FUNCTION - 1))
                .collect();
            p.dedup();
            p
        };
        for nth in picks {
            for code in [status::INVALID_VALUE, status::ILLEGAL_ADDRESS] {
                runs += 1;
                let calls_before = fake.calls(name);
                let live_before = live(&fake);
                fake.fail_calls(name, nth, 1, code);
                let panics = PANICS.load(Ordering::Relaxed);
                let (tx, rx) = mpsc::channel();
                let d = driver.clone();
                std::thread::spawn(move || {
                    let outcome =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| workload(&d)));
                    let _ = tx.send(outcome);
                });
                let what = format!("{name} call {nth} failing with {code}");
                match rx.recv_timeout(WATCHDOG) {
                    Err(_) => {
                        failures.push(format!("{what}: hang (no end within {WATCHDOG:?})"));
                        // The fake's state is unknown from here: stop the sweep.
                        break;
                    }
                    Ok(Err(_)) => failures.push(format!("{what}: panic")),
                    Ok(Ok(outcome)) => {
                        if !outcome.timeouts.is_empty() {
                            failures.push(format!("{what}: hang in {:?}", outcome.timeouts));
                        }
                        if !outcome.wrong_bytes.is_empty() {
                            failures
                                .push(format!("{what}: wrong bytes in {:?}", outcome.wrong_bytes));
                        }
                    }
                }
                fake.clear_faults();
                if fake.calls(name) < calls_before + nth {
                    not_reached += 1;
                }
                if PANICS.load(Ordering::Relaxed) != panics {
                    failures.push(format!("{what}: a thread panicked"));
                }
                // A release the driver refuses leaves its object, whatever the caller does: only
                // the calls that make or use objects must leak nothing when they fail.
                let releases = ["Destroy", "Release", "Free", "Unload"]
                    .iter()
                    .any(|r| name.contains(r));
                let leaked = live(&fake);
                if !releases && leaked != live_before {
                    failures.push(format!(
                        "{what}: leaked (now {leaked:?}, before {live_before:?})"
                    ));
                }
            }
        }
    }
    let count = |kind: &str| failures.iter().filter(|f| f.contains(kind)).count();
    println!(
        "fault sweep: {} functions, {} calls in the workload, {runs} runs ({} call sites x plain \
         and sticky), {} survived, {} panics, {} hangs, {} leaks, {} wrong reads; {not_reached} \
         faults were not reached (a polling call made fewer times in that run); failed \
         releases are not leak-checked",
        calls.len(),
        calls.values().sum::<u64>(),
        runs / 2,
        runs - failures.len(),
        count("panic"),
        count("hang"),
        count("leaked"),
        count("wrong bytes"),
    );
    assert!(failures.is_empty(), "{failures:#?}");
}
