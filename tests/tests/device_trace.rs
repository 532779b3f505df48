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

/// The suite's stamped kernel (`tests/kernels/zone_stamp_spin.cu`, the zone-stamp ABI around a
/// spin, with the kernel's own readings beside it).
const ZONE_STAMP_SPIN: &str = include_str!("../kernels/zone_stamp_spin.ptx");

/// How much later than the kernel's last own reading a stamped zone may end: the header reads
/// `%globaltimer` after a `__syncthreads` following it, which a block whose next instructions
/// are not yet in its SM's instruction cache takes a few hundred nanoseconds to reach.
const STAMP_END_SLACK_NS: u64 = 1_000;

/// A FINE queue's stamped dispatches show the kernels' own spans: each submission binds the
/// kernels' own readings (slot 0) and their stamps (the tracer's slot) to new memory. The
/// kernel stores the start the header read, so a zone's length is the kernel's span from its
/// earliest start to its last reading before the header's end, plus the header's lag there.
fn stamped_kernels_time_themselves(mode: CommandBufferMode) {
    const KERNELS: usize = 6;
    const BLOCKS: u32 = 4;
    const SUBMISSIONS: usize = 8;
    const SPIN_NS: u64 = 20_000;
    let own_bytes = KERNELS * BLOCKS as usize * 16;
    let sink = Arc::new(MemorySink::new());
    let device = open_with(DeviceOptions {
        command_buffer_mode: mode,
        tracing: Verbosity::Fine,
        trace_sink: Some(sink.clone()),
        ..DeviceOptions::default()
    });
    let module = device.load_ptx(ZONE_STAMP_SPIN).unwrap();
    let spin = module.function("zone_stamp_spin").unwrap();
    let queue = device.queue(0);
    let mut cb = queue.create_command_buffer_with_bindings(1).unwrap();
    for k in 0..KERNELS {
        let own =
            cuhal::BufferRange::slot(0, k * BLOCKS as usize * 16, BLOCKS as usize * 16).unwrap();
        let args = cuhal::KernelArgs::new()
            .with(SPIN_NS)
            .with_range(&own)
            .with_zone_stamp();
        cb.dispatch(&cuhal::Dispatch::new(
            &spin,
            [BLOCKS, 1, 1],
            [64, 1, 1],
            &args,
        ))
        .unwrap();
        cb.barrier().unwrap();
    }
    let cb: Arc<dyn cuhal::CommandBuffer> = cb.end().unwrap();
    assert_eq!(cb.bindings().stamp_count(), KERNELS as u32);
    let own: Vec<_> = (0..SUBMISSIONS)
        .map(|_| device.create_buffer(own_bytes).unwrap())
        .collect();
    let done = device.create_semaphore(0);
    for (n, own) in own.iter().enumerate() {
        let n = n as u64 + 1;
        queue
            .execute_with_bindings(&[], &[(&done, n)], &[(&cb, &[own.whole()][..])])
            .unwrap();
        wait(&done, n);
    }
    let stats = queue.trace().expect("tracing is on").stats();
    drop(cb);
    drop(device);

    let zones: Vec<_> = sink.zones().into_iter().filter(|z| z.stamped).collect();
    assert_eq!(
        zones.len(),
        KERNELS * SUBMISSIONS,
        "one stamped zone per kernel and submission ({stats:?})"
    );
    let mut errors = Vec::new();
    for (s, own) in own.iter().enumerate() {
        let mut bytes = vec![0u8; own_bytes];
        own.read(0, &mut bytes).unwrap();
        let word = |i: usize| u64::from_ne_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
        for k in 0..KERNELS {
            let blocks = (0..BLOCKS as usize).map(|b| (k * BLOCKS as usize + b) * 2);
            let start = blocks.clone().map(word).min().unwrap();
            let end = blocks.map(|i| word(i + 1)).max().unwrap();
            let zone = &zones[s * KERNELS + k];
            assert_eq!(zone.name, "zone_stamp_spin");
            assert!(
                end - start >= SPIN_NS,
                "the kernel's own span: {start}..{end}"
            );
            // The begin is exact, so the length gives the end's lag.
            let lag = zone.duration_ns().checked_sub(end - start);
            assert!(
                lag.is_some_and(|lag| lag <= STAMP_END_SLACK_NS),
                "submission {s}, kernel {k}: zone {zone:?} lasts {} ns, the kernel read {} ns of itself",
                zone.duration_ns(),
                end - start
            );
            errors.push(lag.unwrap_or(0));
        }
    }
    errors.sort_unstable();
    println!(
        "{mode:?}: {} stamped zones against the kernels' own readings: from the header's start, the end later by a median {} ns, at most {} ns",
        errors.len(),
        errors[errors.len() / 2],
        errors[errors.len() - 1]
    );
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn stamped_kernels_time_themselves_in_graphs() {
    stamped_kernels_time_themselves(CommandBufferMode::Graph);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn stamped_kernels_time_themselves_in_deferred_replays() {
    stamped_kernels_time_themselves(CommandBufferMode::Deferred);
}
