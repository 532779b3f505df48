//! GPU suite: a dispatch that faults (PTX `trap`) loses the device, and nothing hangs.
//!
//! A trap is a sticky error: it poisons the CUDA context for the rest of the process. So this is
//! a test binary of its own, and its one test runs the scenario in child processes of itself, one
//! per command-buffer mode, each on a fresh context. The parent only checks that each child
//! passed (and within a time bound), and shows the child's output.
//!
//! The scenario: a batch whose kernel spins 50 ms and then traps, signalling two semaphores; a
//! host waiter that is blocked on one of them before the fault; a batch on another queue that
//! waits for it on the device; and an action pending on the faulting queue behind a semaphore
//! nobody signals. Then: the waiter wakes with the driver's (sticky) error, which is the failure
//! its semaphore holds; every signal fails with a sticky driver error; the device and both
//! queues report themselves lost; every later call returns `Error::Lost`; dropping the device
//! returns promptly.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cuhal::{CommandBufferMode, Error, Failure, cuda_of_failure};
use cuhal_gpu_tests::device_support::*;

/// Set in a child: the mode to run the scenario in.
const CHILD_ENV: &str = "CUHAL_TRAP_CHILD_MODE";
/// This test's name, for the child's filter.
const TEST_NAME: &str = "trap_a_faulting_dispatch_fails_its_semaphores_and_loses_the_device";
/// How long the kernel spins before it traps.
const SPIN_NS: u64 = 50_000_000;

/// `trap_`: the kernel faults on purpose, which a sanitizer reports as an error, so
/// `run --sanitize` skips it.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn trap_a_faulting_dispatch_fails_its_semaphores_and_loses_the_device() {
    match std::env::var(CHILD_ENV).as_deref() {
        Ok("graph") => scenario(CommandBufferMode::Graph),
        Ok("deferred") => scenario(CommandBufferMode::Deferred),
        Ok(other) => panic!("{CHILD_ENV}={other:?}: expected graph or deferred"),
        Err(_) => {
            for mode in ["graph", "deferred"] {
                run_child(mode);
            }
        }
    }
}

/// Runs the scenario in a child process and asserts it passed within a minute.
fn run_child(mode: &str) {
    let exe = std::env::current_exe().expect("the test executable's path");
    let mut child = Command::new(exe)
        .args([
            TEST_NAME,
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the child process");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("polling the child") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = child
        .wait_with_output()
        .expect("collecting the child's output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("---- {mode} child: stdout\n{stdout}\n---- {mode} child: stderr\n{stderr}");
    let status = status.unwrap_or_else(|| panic!("{mode}: the child hung (killed after 60 s)"));
    assert!(status.success(), "{mode}: the child failed ({status})");
    assert!(
        stdout.contains("1 passed"),
        "{mode}: the child did not run the scenario"
    );
}

/// The sticky driver error inside `failure`, or a panic naming what it was instead.
fn sticky(failure: &Failure, what: &str) -> cuhal_sys::CUresult {
    let cuda = cuda_of_failure(failure)
        .unwrap_or_else(|| panic!("{what}: {failure} carries no driver error"));
    assert!(cuda.is_sticky(), "{what}: {cuda} is not a sticky error");
    cuda.result().expect("a sticky error has a status code")
}

fn failure_of(semaphore: &cuhal::Semaphore, value: u64, what: &str) -> Failure {
    match semaphore.wait(value, TIMEOUT) {
        Err(cuhal_semaphore::Error::Failed(failure)) => failure,
        other => panic!("{what}: expected a failure, the wait returned {other:?}"),
    }
}

fn scenario(mode: CommandBufferMode) {
    let device = open(mode, 2);
    let kernels = Kernels::load(&device);
    let (q0, q1) = (device.queue(0), device.queue(1));
    let (s, s2, t, never, pending, later) = (
        device.create_semaphore(0),
        device.create_semaphore(0),
        device.create_semaphore(0),
        device.create_semaphore(0),
        device.create_semaphore(0),
        device.create_semaphore(0),
    );
    // Everything works before the fault.
    let ok = device.create_semaphore(0);
    q0.execute(&[], &[(&ok, 1)], &[]).unwrap();
    wait(&ok, 1);

    let faulting = command_buffer(q0, |cb| {
        let args = cuhal::KernelArgs::new().with(SPIN_NS);
        cb.dispatch(&cuhal::Dispatch::new(
            &kernels.spin_trap,
            [1, 1, 1],
            [1, 1, 1],
            &args,
        ))
        .unwrap();
    });
    let out = device.create_buffer(4096).unwrap();
    poison(&out, 0xDEAD_BEEF);
    let downstream = command_buffer(q1, |cb| record_spin_fill(cb, &kernels, 0, &out.whole(), 7));

    q0.execute(&[], &[(&s, 1), (&s2, 3)], &[&faulting]).unwrap();
    let before = q1.stats();
    q1.execute(&[(&s, 1)], &[(&t, 1)], &[&downstream]).unwrap();
    assert_eq!(
        q1.stats().issued_on_submit,
        before.issued_on_submit + 1,
        "the downstream batch waits for the faulting one on the device"
    );
    q0.execute(&[(&never, 1)], &[(&pending, 1)], &[]).unwrap();
    // Pending on the other queue, on a semaphore nothing will signal: the device's loss must
    // fail it too rather than leave it waiting.
    let pending_elsewhere = device.create_semaphore(0);
    q1.execute(&[(&never, 1)], &[(&pending_elsewhere, 1)], &[])
        .unwrap();

    // A host waiter, blocked while the kernel still spins.
    let waiter = {
        let s = s.clone();
        std::thread::spawn(move || s.wait(1, TIMEOUT))
    };
    let deadline = Instant::now() + Duration::from_millis(40);
    while s.waiter_count() == 0 {
        assert!(Instant::now() < deadline, "the host waiter never blocked");
        std::thread::sleep(Duration::from_micros(100));
    }
    assert!(
        matches!(s.query(), Ok(0)),
        "the waiter must block before the fault: {:?}",
        s.query()
    );
    assert!(device.lost().is_none(), "lost before the fault");

    let woke = waiter.join().unwrap();
    let failure = match woke {
        Err(cuhal_semaphore::Error::Failed(failure)) => failure,
        other => panic!("the host waiter returned {other:?}"),
    };
    let code = sticky(&failure, "the host waiter's error");
    println!("{mode:?}: the trap surfaced as {code}: {failure}");
    assert!(
        s.failure().is_some_and(|f| f.ptr_eq(&failure)),
        "the waiter's error is the failure its semaphore holds"
    );
    assert_eq!(sticky(&failure_of(&s2, 3, "s2"), "s2"), code);
    assert_eq!(
        sticky(&failure_of(&t, 1, "t"), "the downstream batch"),
        code
    );
    // The faulting queue fails what was pending on it, and so does the other queue.
    sticky(&failure_of(&pending, 1, "pending"), "the pending action");
    assert_eq!(
        sticky(
            &failure_of(&pending_elsewhere, 1, "pending_elsewhere"),
            "the action pending on the other queue"
        ),
        code
    );

    // The device, and both its queues, report themselves lost, with the driver's error.
    let deadline = Instant::now() + TIMEOUT;
    let lost = loop {
        if let Some(lost) = device.lost() {
            break lost;
        }
        assert!(
            Instant::now() < deadline,
            "the device never reported itself lost"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(sticky(&lost, "device.lost()"), code);
    for q in [q0, q1] {
        let queue_lost = q.lost().expect("a queue of a lost device is lost");
        sticky(&queue_lost, q.label());
    }

    // Every later call returns Error::Lost, carrying the device's failure, and changes nothing.
    let is_lost = |result: Result<(), Error>, what: &str| match result {
        Err(Error::Lost(f)) => assert!(f.ptr_eq(&lost), "{what}: another failure: {f}"),
        other => panic!("{what}: expected Error::Lost, got {other:?}"),
    };
    is_lost(q0.execute(&[], &[(&later, 1)], &[]), "q0.execute");
    is_lost(
        q1.execute(&[], &[(&later, 1)], &[&downstream]),
        "q1.execute",
    );
    is_lost(q0.barrier(&[], &[(&later, 1)]), "q0.barrier");
    is_lost(q1.host_call(&[], &[(&later, 1)], || Ok(())), "q1.host_call");
    is_lost(q0.alloca(&[], &[(&later, 1)], 64).map(drop), "q0.alloca");
    is_lost(device.create_buffer(64).map(drop), "create_buffer");
    is_lost(
        device.create_host_buffer(64).map(drop),
        "create_host_buffer",
    );
    is_lost(
        q1.create_command_buffer().map(drop),
        "create_command_buffer",
    );
    is_lost(device.load_ptx(DEVICE_KERNELS).map(drop), "load_ptx");
    std::thread::sleep(Duration::from_millis(5));
    assert!(matches!(later.query(), Ok(0)), "a refused call signalled");

    let start = Instant::now();
    drop((faulting, downstream, kernels, out));
    drop(device);
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "dropping the lost device took {took:?}"
    );
    assert!(matches!(never.query(), Ok(0)));
}
