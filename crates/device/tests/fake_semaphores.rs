//! Semaphores on the fake driver: two queues chained through device waits, host calls in
//! order, and a failure that reaches every downstream signal as the very same failure.

mod fake_support;

use cuhal_fake_driver::harness::FakeDriver;
use cuhal_sys::cu_name;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuhal::{CommandBuffer, Device, DeviceOptions, Driver, Failure, FillPattern, Semaphore};
use fake_support::*;

#[test]
fn two_queues_chain_through_semaphores() {
    let (fake, _driver, device) = open("chain", queues(2));
    const WORDS: usize = 128;
    let x = device.create_buffer(WORDS * 4).unwrap();
    let mut rng = Rng::new();
    poison(&device, device.queue(0), &x.whole());
    let first = rng.bytes(4);
    let written = device.create_semaphore(0);
    device
        .queue(0)
        .write(&[], &[(&written, 1)], &x.range(0, 4).unwrap(), &first)
        .unwrap();
    wait(&written, 1);
    // Submit the whole chain before its start: step i copies word i-1 to word i on queue i % 2,
    // after step i-1 on the other queue. Out of order, a word would copy poison.
    let s = device.create_semaphore(0);
    for i in 1..WORDS {
        let q = device.queue(i % 2);
        let source = x.range((i - 1) * 4, 4).unwrap();
        let target = x.range(i * 4, 4).unwrap();
        q.copy(&[(&s, i as u64)], &[(&s, i as u64 + 1)], &source, &target)
            .unwrap();
    }
    assert_eq!(s.query().unwrap(), 0);
    assert_eq!(
        fake.calls(cu_name!(cuMemcpyDtoDAsync)),
        0,
        "nothing ran before its wait"
    );
    s.signal(1).unwrap();
    wait(&s, WORDS as u64);
    assert_eq!(s.query().unwrap(), WORDS as u64);
    let got = read(&device, device.queue(1), &x.whole());
    assert_eq!(fake.calls(cu_name!(cuMemcpyDtoDAsync)), WORDS as u64 - 1);
    assert_eq!(got, first.repeat(WORDS));
}

#[test]
fn host_calls_run_in_order_and_fail_every_downstream_signal() {
    let (_fake, _driver, device) = open("host", queues(2));
    let (q0, q1) = (device.queue(0), device.queue(1));
    let a = device.create_buffer(64).unwrap();

    // A host call without waits runs after the queue's earlier work.
    let s = device.create_semaphore(0);
    q0.fill(&[], &[(&s, 1)], &a.whole(), FillPattern::U32(0xabcd_0123))
        .unwrap();
    let seen: Arc<Mutex<Option<u64>>> = Arc::default();
    let h = device.create_semaphore(0);
    {
        let (seen, s) = (seen.clone(), s.clone());
        q0.host_call(&[], &[(&h, 1)], move || {
            *seen.lock().unwrap() = Some(s.query().unwrap_or(0));
            Ok(())
        })
        .unwrap();
    }
    wait(&h, 1);
    assert_eq!(
        *seen.lock().unwrap(),
        Some(1),
        "ran before the earlier fill signalled"
    );

    // One that waits does not run before its wait; work after it follows it.
    let (w, t) = (device.create_semaphore(0), device.create_semaphore(0));
    let ran = Arc::new(AtomicU64::new(0));
    {
        let ran = ran.clone();
        q1.host_call(&[(&w, 1)], &[(&h, 2)], move || {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
    }
    q0.fill(&[(&h, 2)], &[(&t, 1)], &a.whole(), FillPattern::U8(1))
        .unwrap();
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(ran.load(Ordering::SeqCst), 0, "ran before its wait");
    assert_eq!(t.query().unwrap(), 0);
    w.signal(1).unwrap();
    wait(&t, 1);
    assert_eq!(ran.load(Ordering::SeqCst), 1);

    // A failed host call fails its signals, and everything downstream, with that same failure.
    let (x, y, z, last) = (
        device.create_semaphore(0),
        device.create_semaphore(0),
        device.create_semaphore(0),
        device.create_semaphore(0),
    );
    let refused = Failure::msg("host call refused");
    {
        let refused = refused.clone();
        q1.host_call(&[], &[(&x, 1), (&y, 4)], move || Err(refused))
            .unwrap();
    }
    q0.fill(&[(&x, 1)], &[(&z, 1)], &a.whole(), FillPattern::U8(2))
        .unwrap();
    q1.barrier(&[(&z, 1), (&y, 4)], &[(&last, 7)]).unwrap();
    for (name, semaphore, value) in [("x", &x, 1), ("y", &y, 4), ("z", &z, 1), ("last", &last, 7)] {
        let got = failure_of(semaphore, value);
        assert!(got.ptr_eq(&refused), "{name} failed with {got}");
    }
    // The fill that waited on the failure never ran; the queues go on.
    assert_eq!(read(&device, q0, &a.range(0, 4).unwrap()), [1; 4]);
    let after = device.create_semaphore(0);
    q1.barrier(&[], &[(&after, 1)]).unwrap();
    wait(&after, 1);
}

/// A device's events report how many actions its queues have issued (every queue's, barriers
/// included): what a host wait on one of them watches to tell whether its queries would contend
/// with submissions (`completion_policy::BUSY_QUERY_PACE`; the pacing itself is tested in the
/// semaphore crate).
#[test]
fn a_device_event_counts_the_issues_of_every_queue() {
    use cuhal_semaphore::DeviceEvent;
    let (fake, _driver, device) = open("event-submissions", queues(2));
    let buffer = device.create_buffer(256).unwrap();
    let mut cb = device.queue(1).create_command_buffer().unwrap();
    cb.fill(&buffer.whole(), FillPattern::U32(5)).unwrap();
    let cb = cb.end().unwrap();
    // The graph launch keeps queue 1's stream busy long enough to look at its event.
    fake.set_timing(Duration::from_millis(200), Duration::ZERO);
    let done = device.create_semaphore(0);
    device.queue(1).execute(&[], &[(&done, 1)], &[&cb]).unwrap();
    let event = done
        .device_wait_event(1)
        .expect("the execute's completion event, not yet complete");
    let before = event.submissions();
    let other = device.create_semaphore(0);
    for value in 1..=3 {
        device.queue(0).barrier(&[], &[(&other, value)]).unwrap();
    }
    device.queue(1).barrier(&[], &[(&other, 4)]).unwrap();
    assert_eq!(event.submissions() - before, 4);
    // Another device's count is its own.
    let (_fake2, _driver2, elsewhere) = open("event-submissions-2", queues(1));
    let theirs = elsewhere.create_semaphore(0);
    elsewhere.queue(0).barrier(&[], &[(&theirs, 1)]).unwrap();
    assert_eq!(event.submissions() - before, 4);
    fake.set_timing(Duration::ZERO, Duration::ZERO);
    wait(&done, 1);
}

/// Work of 300 ms on the model GPU.
const STEP: Duration = Duration::from_millis(300);

/// A one-queue device gathering completions for `gather`, whose host waits spin 1 ms, with a
/// one-fill graph command buffer and a semaphore its first submission (already retired) brought
/// to 1; work submitted from now on takes `STEP`.
fn slow_queue(
    tag: &str,
    gather: Duration,
) -> (
    FakeDriver,
    Driver,
    Device,
    Arc<dyn CommandBuffer>,
    Semaphore,
) {
    let (fake, driver, device) = open(
        tag,
        DeviceOptions {
            completion: DeviceOptions::DEFAULT_COMPLETION.with_gather(gather),
            ..queues(1)
        },
    );
    let queue = device.queue(0);
    let buffer = device.create_buffer(256).unwrap();
    let mut cb = queue.create_command_buffer().unwrap();
    cb.fill(&buffer.whole(), FillPattern::U32(5)).unwrap();
    let cb = cb.end().unwrap();
    let done = device.create_semaphore(0);
    queue.execute(&[], &[(&done, 1)], &[&cb]).unwrap();
    wait(&done, 1);
    settle(queue);
    fake.set_timing(STEP, Duration::ZERO);
    (fake, driver, device, cb, done)
}

/// A host wait that outlasts its spin parks; its park ends the completion thread's gather, so
/// the work it waited for is retired when done, not a gather later. The gather here (20 s) is
/// far longer than the work.
#[test]
fn a_parked_host_wait_ends_the_completion_gather() {
    let (fake, _driver, device, cb, done) = slow_queue("parked-wait", Duration::from_secs(20));
    // The first submission retired: the completion thread now gathers.
    let queue = device.queue(0);
    let start = std::time::Instant::now();
    queue.execute(&[], &[(&done, 2)], &[&cb]).unwrap();
    done.wait(2, Duration::from_secs(15)).unwrap();
    fake.set_timing(Duration::ZERO, Duration::ZERO);
    // The waiter may have seen its event complete itself; the retirement is the completion
    // thread's, which the park hurried.
    let deadline = start + Duration::from_secs(5);
    while queue.stats().completed < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the parked wait's work was not retired within 5 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A pipelined wait: the host submits step 2 and step 3, then waits for step 2. Its wait
/// outlasts the spin and parks; the completion side retires both steps as one batch, waiting for
/// the newest, step 3. The wait must still return when step 2 is done, not when step 3 is: it
/// looks at its own event again while parked.
#[test]
fn a_wait_for_earlier_work_returns_before_later_work_completes() {
    let (fake, _driver, device, cb, done) =
        slow_queue("pipelined-wait", DeviceOptions::DEFAULT_COMPLETION_GATHER);
    let queue = device.queue(0);
    let start = std::time::Instant::now();
    queue.execute(&[], &[(&done, 2)], &[&cb]).unwrap();
    queue.execute(&[], &[(&done, 3)], &[&cb]).unwrap();
    done.wait(2, Duration::from_secs(15)).unwrap();
    let first = start.elapsed();
    done.wait(3, Duration::from_secs(15)).unwrap();
    let second = start.elapsed();
    fake.set_timing(Duration::ZERO, Duration::ZERO);
    assert!(
        first < STEP + Duration::from_millis(200) && second >= 2 * STEP - Duration::from_millis(50),
        "step 2 seen done after {first:?}, step 3 after {second:?} ({STEP:?} each)"
    );
}

/// Timeline values only rise: a submission that would signal a semaphore to a value it has
/// already reached is refused with a typed error naming the queue and both values, whatever the
/// operation (a command's signal, a host call's), and nothing is queued.
#[test]
fn a_signal_to_a_value_already_reached_is_refused_by_every_operation() {
    let (_fake, _driver, device) = open("signal-not-above", queues(1));
    let q = device.queue(0);
    let a = device.create_buffer(64).unwrap();
    let s = device.create_semaphore(0);
    s.signal(2).unwrap();
    let refused = |result: cuhal::Result<()>, what: &str| match result {
        Err(cuhal::Error::Queue(cuhal_scheduler::Error::SignalNotAbove {
            value, current, ..
        })) => assert_eq!(current, 2, "{what}: signal to {value}"),
        other => panic!("{what}: {other:?}"),
    };
    for value in [0, 2] {
        refused(
            q.fill(&[], &[(&s, value)], &a.whole(), FillPattern::U32(1)),
            "fill",
        );
        refused(q.host_call(&[], &[(&s, value)], || Ok(())), "host call");
    }
    let error = q
        .fill(&[], &[(&s, 1)], &a.whole(), FillPattern::U32(1))
        .unwrap_err();
    assert!(error.to_string().contains("already reached"), "{error}");
    // A value above is taken as ever.
    q.host_call(&[], &[(&s, 3)], || Ok(())).unwrap();
    wait(&s, 3);
    assert!(q.lost().is_none());
}
