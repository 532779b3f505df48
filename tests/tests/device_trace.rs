//! Tracing through the device: a FINE-traced command buffer submitted again and again, the host
//! waiting between submissions, loses no zone, and zones nest inside their submission.

use std::sync::Arc;

use cuhal::{CommandBufferMode, DeviceOptions, MemorySink, Verbosity};
use cuhal_gpu_tests::device_support::{
    Kernels, command_buffer, open_with, read_u32, record_increment, record_spin_fill, wait,
};
use cuhal_trace::DropReason;

const SUBMISSIONS: u64 = 50;
const DISPATCHES: usize = 3;

fn resubmitted_command_buffers_lose_no_zones(mode: CommandBufferMode) {
    let sink = Arc::new(MemorySink::new());
    let device = open_with(DeviceOptions {
        command_buffer_mode: mode,
        tracing: Verbosity::Fine,
        trace_sink: Some(sink.clone()),
        ..DeviceOptions::default()
    });
    let kernels = Kernels::load(&device);
    let queue = device.queue(0);
    let counter = device.create_buffer(4).unwrap();
    counter.write(0, &0u32.to_ne_bytes()).unwrap();
    let cb = command_buffer(queue, |cb| {
        cb.begin_debug_group("increments").unwrap();
        for _ in 0..DISPATCHES {
            record_increment(cb, &kernels, &counter.whole());
            cb.barrier().unwrap();
        }
        cb.end_debug_group().unwrap();
    });
    let done = device.create_semaphore(0);
    for n in 1..=SUBMISSIONS {
        queue.execute(&[], &[(&done, n)], &[&cb]).unwrap();
        wait(&done, n);
    }
    assert_eq!(
        read_u32(&counter),
        [(SUBMISSIONS as usize * DISPATCHES) as u32]
    );
    let stats = queue.trace().expect("tracing is on").stats();
    // Dropping the device joins its completion threads: everything is collected by then.
    drop((cb, kernels, counter));
    drop(device);

    assert_eq!(
        sink.dropped(DropReason::Superseded),
        0,
        "zones of a completed submission were dropped when it was resubmitted ({stats:?})"
    );
    let zones = sink.zones();
    let count = |name: &str| zones.iter().filter(|z| z.name == name).count() as u64;
    assert_eq!(count("submission"), SUBMISSIONS, "{stats:?}");
    assert_eq!(count("increments"), SUBMISSIONS, "{stats:?}");
    assert_eq!(
        count("increment_u32"),
        SUBMISSIONS * DISPATCHES as u64,
        "{stats:?}"
    );
    // Every zone lies inside a submission zone of the same track.
    let submissions: Vec<_> = zones.iter().filter(|z| z.name == "submission").collect();
    for zone in zones.iter().filter(|z| z.name != "submission") {
        assert!(
            submissions.iter().any(|s| s.track == zone.track
                && s.begin_ns <= zone.begin_ns
                && zone.end_ns <= s.end_ns),
            "{zone:?} is outside every submission"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn graph_resubmissions_lose_no_zones() {
    resubmitted_command_buffers_lose_no_zones(CommandBufferMode::Graph);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn deferred_resubmissions_lose_no_zones() {
    resubmitted_command_buffers_lose_no_zones(CommandBufferMode::Deferred);
}

/// COARSE on the GPU: a submission's zone and its command buffer's come from the queue's
/// completion event (no event of their own), contain the kernel's spin, and a submission whose
/// stream waited on the device for another queue's work says so, with the wait's length.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn coarse_zones_come_from_completion_events_and_show_device_waits() {
    const SPIN_NS: u64 = 200_000;
    const ROUNDS: u64 = 20;
    let sink = Arc::new(MemorySink::new());
    let device = open_with(DeviceOptions {
        queues: 2,
        tracing: Verbosity::Coarse,
        trace_sink: Some(sink.clone()),
        ..DeviceOptions::default()
    });
    let kernels = Kernels::load(&device);
    let (q0, q1) = (device.queue(0), device.queue(1));
    let buffer = device.create_buffer(4096).unwrap();
    let slow = command_buffer(q0, |cb| {
        record_spin_fill(cb, &kernels, SPIN_NS, &buffer.whole(), 1);
    });
    let quick = command_buffer(q1, |cb| {
        record_spin_fill(cb, &kernels, 1_000, &buffer.whole(), 2);
    });
    let (ready, done) = (device.create_semaphore(0), device.create_semaphore(0));
    for n in 1..=ROUNDS {
        // Queue 1's submission waits for queue 0's, which is not submitted yet: once queue 0
        // issues its spin, queue 1 waits for it on the device.
        q1.execute(&[(&ready, n)], &[(&done, n)], &[&quick])
            .unwrap();
        q0.execute(&[(&done, n - 1)], &[(&ready, n)], &[&slow])
            .unwrap();
        wait(&done, n);
    }
    let (t0, t1) = (q0.trace().unwrap().track(), q1.trace().unwrap().track());
    drop((slow, quick, kernels, buffer));
    drop(device);

    let submissions = sink.submissions();
    let waited: Vec<_> = submissions.iter().filter(|s| Some(s.track) == t1).collect();
    assert_eq!(waited.len() as u64, ROUNDS, "{submissions:?}");
    for s in &waited {
        assert_eq!(s.waits, [(ready.id().get(), s.ordinal)], "{s:?}");
        let wait = s
            .device_wait_ns
            .unwrap_or_else(|| panic!("no device wait shown: {s:?}"));
        assert!(
            wait >= SPIN_NS / 4,
            "waited {wait} ns for a {SPIN_NS} ns spin: {s:?}"
        );
    }
    let zones = sink.zones();
    let on = |track, name: &str| -> Vec<_> {
        zones
            .iter()
            .filter(|z| Some(z.track) == track && z.name == name)
            .collect()
    };
    let (subs, cbs) = (on(t0, "submission"), on(t0, "graph command buffer"));
    assert_eq!((subs.len() as u64, cbs.len() as u64), (ROUNDS, ROUNDS));
    for (s, c) in subs.iter().zip(&cbs) {
        assert!(c.duration_ns() >= SPIN_NS, "{c:?}");
        assert!(
            s.begin_ns <= c.begin_ns && c.end_ns <= s.end_ns,
            "{s:?} {c:?}"
        );
        // Nothing else ran in the submission: the zones end together (the completion event).
        assert_eq!(s.end_ns, c.end_ns);
    }
    assert_eq!(sink.dropped(DropReason::EventError), 0);
}
