//! Tracing through the device: a FINE-traced command buffer submitted again and again, the host
//! waiting between submissions, loses no zone, and zones nest inside their submission.

use std::sync::Arc;

use cuhal::{CommandBufferMode, DeviceOptions, MemorySink, Verbosity};
use cuhal_gpu_tests::device_support::{
    Kernels, command_buffer, open_with, read_u32, record_increment, wait,
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
