//! The zone-stamp ABI end to end on the fake driver: a dispatch whose kernel takes a
//! `cuhal_zone_stamp*` (`KernelArgs::push_zone_stamp`) gets its FINE zone from the stamps the
//! kernel folds into its slot of the queue's stamp ring. The fake's `cuhal_fake_stamp` kernel
//! folds the readings it is given with a max, as the header's reductions do, so a slot bound
//! to the wrong place, not patched per submission, or not zeroed before reuse shows in the
//! zones.

mod fake_support;

use std::sync::Arc;
use std::time::Duration;

use cuhal::{
    BufferRange, CommandBuffer, CommandBufferMode, CommandRecorder, CuptiChoice, Device,
    DeviceOptions, Dispatch, Function, KernelArgs, MemorySink, PatchMethod, Queue, Verbosity,
};
use cuhal_fake_driver::module::{ADD_KERNEL, STAMP_KERNEL};
use cuhal_sys::cu_name;
use cuhal_trace::{DropReason, MemoryZone};
use fake_support::add::add_kernel;
use fake_support::stamp::stamp_kernel;
use fake_support::*;

const N: usize = 16;

fn options(mode: CommandBufferMode, verbosity: Verbosity, sink: &Arc<MemorySink>) -> DeviceOptions {
    DeviceOptions {
        command_buffer_mode: mode,
        tracing: verbosity,
        trace_sink: Some(sink.clone()),
        cupti: CuptiChoice::Off,
        patch_method: PatchMethod::Host,
        ..DeviceOptions::default()
    }
}

/// Records a stamped dispatch that reads `begin` and `end` on the GPU's clock.
fn stamped(cb: &mut dyn CommandRecorder, f: &Function, begin: u64, end: u64) {
    let args = KernelArgs::new().with_zone_stamp().with(begin).with(end);
    cb.dispatch(&Dispatch::new(f, [1, 1, 1], [32, 1, 1], &args))
        .unwrap();
}

/// `slot 1 = slot 0 + 5` over `N` words.
fn add(cb: &mut dyn CommandRecorder, f: &Function) {
    let args = KernelArgs::new()
        .with_range(&BufferRange::slot(1, 0, N * 4).unwrap())
        .with_binding(0, 0)
        .with(5u32)
        .with(N as u32);
    cb.dispatch(&Dispatch::new(f, [1, 1, 1], [N as u32, 1, 1], &args))
        .unwrap();
}

fn stamped_zones(sink: &MemorySink) -> Vec<MemoryZone> {
    sink.zones().into_iter().filter(|z| z.stamped).collect()
}

/// Submits `cb` with `table` `times` times, each waited for and collected.
fn run(
    device: &Device,
    queue: &Queue,
    cb: &Arc<dyn CommandBuffer>,
    table: &[BufferRange],
    times: u64,
) {
    let done = device.create_semaphore(0);
    for n in 1..=times {
        queue
            .execute_with_bindings(&[], &[(&done, n)], &[(cb, table)])
            .unwrap();
        wait(&done, n);
        settle(queue);
    }
}

fn stamps_become_zones(mode: CommandBufferMode) {
    let sink = Arc::new(MemorySink::new());
    let tag = format!("zone-stamps-{mode:?}");
    let (fake, _driver, device) = open(&tag, options(mode, Verbosity::Fine, &sink));
    let queue = device.queue(0);
    let (stamp, adder) = (stamp_kernel(&device), add_kernel(&device));
    let nodes_before = fake.calls(cu_name!(cuGraphAddEventRecordNode));
    let mut cb = queue.create_command_buffer_with_bindings(2).unwrap();
    cb.begin_debug_group("work").unwrap();
    stamped(&mut *cb, &stamp, 1_000, 1_250);
    add(&mut *cb, &adder);
    stamped(&mut *cb, &stamp, 2_000, 2_040);
    stamped(&mut *cb, &stamp, 3_000, 0); // never reached its end
    stamped(&mut *cb, &stamp, 3_000, 2_000); // inverted
    cb.end_debug_group().unwrap();
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    let layout = cb.bindings();
    assert_eq!(layout.slots_used(), 2);
    assert_eq!(layout.stamp_count(), 4);
    assert_eq!(layout.stamp_slot(), Some(2), "one past the user's slots");
    if mode == CommandBufferMode::Graph {
        // The debug group's pair and the add's pair: stamped dispatches record no event.
        assert_eq!(
            fake.calls(cu_name!(cuGraphAddEventRecordNode)) - nodes_before,
            4
        );
    }
    let input = device.create_buffer(N * 4).unwrap();
    let output = device.create_buffer(N * 4).unwrap();
    let done = device.create_semaphore(0);
    let words: Vec<u8> = (0..N as u32).flat_map(|w| (w * 3).to_ne_bytes()).collect();
    queue
        .write(&[], &[(&done, 1)], &input.whole(), &words)
        .unwrap();
    wait(&done, 1);
    let table = [input.whole(), output.whole()];
    // The user's table is checked as ever: the stamp slot is not theirs.
    layout.check(&table, device.context().raw()).unwrap();
    let patches = fake.calls(cu_name!(cuGraphExecKernelNodeSetParams));
    run(&device, queue, &cb, &table, N as u64);
    if mode == CommandBufferMode::Graph {
        // Every submission's region is elsewhere in the ring: the four stamped nodes are
        // patched each time (the add node only at the first).
        let patched = fake.calls(cu_name!(cuGraphExecKernelNodeSetParams)) - patches;
        assert!(patched >= 4 * N as u64, "{patched} patches");
    }
    let out = read(&device, queue, &output.whole());
    let expected: Vec<u8> = (0..N as u32)
        .flat_map(|w| (w * 3 + 5).to_ne_bytes())
        .collect();
    assert_eq!(out, expected, "the user's bound arguments");
    let stats = queue.trace().unwrap().stats();
    assert_eq!(stats.stamp_regions_in_use, 0, "every region given back");
    drop(cb);
    drop(device);
    let zones = stamped_zones(&sink);
    assert_eq!(zones.len(), 2 * N, "{zones:?}");
    for pair in zones.chunks(2) {
        assert_eq!(pair[0].name, STAMP_KERNEL);
        assert_eq!(pair[0].duration_ns(), 250);
        assert_eq!(pair[1].duration_ns(), 40);
        assert!(
            pair[0].end_ns <= pair[1].begin_ns,
            "in their order: {pair:?}"
        );
        // submission > command buffer > "work" > the dispatch.
        assert_eq!(pair[0].depth, 3);
    }
    assert_eq!(sink.dropped(DropReason::StampEmpty), 2 * N as u64);
    assert_eq!(sink.dropped(DropReason::StampsExhausted), 0);
    let work: Vec<MemoryZone> = sink
        .zones()
        .into_iter()
        .filter(|z| z.name == "work")
        .collect();
    assert_eq!(work.len(), N);
    for (zone, group) in zones.chunks(2).zip(&work) {
        // No clock exchange on the fake: the first stamp is placed where its group begins.
        assert_eq!(zone[0].begin_ns, group.begin_ns);
    }
    let adds = sink
        .zones()
        .into_iter()
        .filter(|z| z.name == ADD_KERNEL)
        .count();
    assert_eq!(adds, N, "the add is timed by its events");
}

#[test]
fn graph_stamps_become_zones() {
    stamps_become_zones(CommandBufferMode::Graph);
}

#[test]
fn deferred_stamps_become_zones() {
    stamps_become_zones(CommandBufferMode::Deferred);
}

/// Two command buffers take turns on a ring of three stamps: regions are reused, and each is
/// zeroed before it is (else the fake's max folds would mix the two kernels' readings).
#[test]
fn a_small_ring_is_reused_and_zeroed() {
    let sink = Arc::new(MemorySink::new());
    let (_fake, _driver, device) = open(
        "zone-stamps-ring",
        DeviceOptions {
            trace_stamp_slots: 3,
            ..options(CommandBufferMode::Graph, Verbosity::Fine, &sink)
        },
    );
    let queue = device.queue(0);
    let stamp = stamp_kernel(&device);
    let record = |begin, end| {
        let mut cb = queue.create_command_buffer().unwrap();
        stamped(&mut *cb, &stamp, begin, end);
        let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
        cb
    };
    let (a, b) = (record(500, 600), record(1_000, 1_010));
    for _ in 0..N {
        run(&device, queue, &a, &[], 1);
        run(&device, queue, &b, &[], 1);
    }
    drop((a, b));
    drop(device);
    let durations: Vec<u64> = stamped_zones(&sink)
        .iter()
        .map(|z| z.duration_ns())
        .collect();
    assert_eq!(durations, [100, 10].repeat(N));
    assert_eq!(sink.dropped(DropReason::StampsExhausted), 0);
}

/// A command buffer with more stamps than the ring holds runs as ever, bound to discard
/// memory: its stamps are dropped and counted.
#[test]
fn an_exhausted_ring_drops_and_counts() {
    let sink = Arc::new(MemorySink::new());
    let (_fake, _driver, device) = open(
        "zone-stamps-exhausted",
        DeviceOptions {
            trace_stamp_slots: 1,
            ..options(CommandBufferMode::Graph, Verbosity::Fine, &sink)
        },
    );
    let queue = device.queue(0);
    let stamp = stamp_kernel(&device);
    let mut cb = queue.create_command_buffer().unwrap();
    stamped(&mut *cb, &stamp, 1, 2);
    stamped(&mut *cb, &stamp, 3, 4);
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    run(&device, queue, &cb, &[], 3);
    drop(cb);
    drop(device);
    assert!(stamped_zones(&sink).is_empty());
    assert_eq!(sink.dropped(DropReason::StampsExhausted), 6);
}

/// Without FINE the stamp argument stays null: nothing is bound, no zone is made, and the
/// kernel writes nothing.
#[test]
fn coarse_and_off_leave_the_stamp_null() {
    for verbosity in [Verbosity::Coarse, Verbosity::Off] {
        let sink = Arc::new(MemorySink::new());
        let tag = format!("zone-stamps-{verbosity:?}");
        let (_fake, _driver, device) =
            open(&tag, options(CommandBufferMode::Graph, verbosity, &sink));
        let queue = device.queue(0);
        let stamp = stamp_kernel(&device);
        let mut cb = queue.create_command_buffer().unwrap();
        stamped(&mut *cb, &stamp, 1, 2);
        let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
        assert_eq!(cb.bindings().stamp_count(), 0);
        assert_eq!(cb.bindings().stamp_slot(), None);
        run(&device, queue, &cb, &[], 2);
        drop(cb);
        drop(device);
        assert!(stamped_zones(&sink).is_empty());
    }
}

/// A second zone-stamp argument is refused when the dispatch is recorded.
#[test]
fn a_second_stamp_is_refused() {
    let sink = Arc::new(MemorySink::new());
    let (_fake, _driver, device) = open(
        "zone-stamps-twice",
        options(CommandBufferMode::Graph, Verbosity::Fine, &sink),
    );
    let queue = device.queue(0);
    // A second zone stamp where `begin` would be (the same three 8-byte parameters).
    let f = stamp_kernel(&device);
    let args = KernelArgs::new()
        .with_zone_stamp()
        .with_zone_stamp()
        .with(1u64);
    let mut cb = queue.create_command_buffer().unwrap();
    let refused = cb.dispatch(&Dispatch::new(&f, [1, 1, 1], [1, 1, 1], &args));
    assert!(
        matches!(refused, Err(cuhal_command::Error::BadKernelArgument { .. })),
        "{refused:?}"
    );
    // The recording goes on.
    stamped(&mut *cb, &f, 1, 2);
}

/// A command buffer submitted again while its last submission is in flight: a submission whose
/// events were recorded again before its collection loses its event-timed zones (counted as
/// superseded), never its stamps, which are its own: each submission shows its stamped zone.
/// (Whether the fake's collection comes late enough to supersede is its scheduling's; the GPU
/// suite's traced decoder, 8 steps ahead, is superseded for certain.)
#[test]
fn stamps_outlive_a_resubmission_before_collection() {
    const SUBMISSIONS: u64 = 4;
    let sink = Arc::new(MemorySink::new());
    let (fake, _driver, device) = open(
        "zone-stamps-resubmitted",
        options(CommandBufferMode::Graph, Verbosity::Fine, &sink),
    );
    let queue = device.queue(0);
    let stamp = stamp_kernel(&device);
    let mut cb = queue.create_command_buffer().unwrap();
    cb.begin_debug_group("work").unwrap();
    stamped(&mut *cb, &stamp, 1_000, 1_300);
    cb.end_debug_group().unwrap();
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    // Every launch stays in flight until `finish_work`: each submission is issued before the
    // one before it can be collected.
    fake.set_timing(Duration::from_secs(3600), Duration::ZERO);
    let done = device.create_semaphore(0);
    for n in 1..=SUBMISSIONS {
        queue.execute(&[], &[(&done, n)], &[&cb]).unwrap();
    }
    fake.finish_work();
    wait(&done, SUBMISSIONS);
    settle(queue);
    drop(cb);
    drop(device);
    let zones = stamped_zones(&sink);
    assert_eq!(zones.len() as u64, SUBMISSIONS, "{zones:?}");
    assert!(zones.iter().all(|z| z.duration_ns() == 300), "{zones:?}");
    let groups = sink.zones().iter().filter(|z| z.name == "work").count() as u64;
    assert_eq!(
        sink.dropped(DropReason::Superseded),
        SUBMISSIONS - groups,
        "the superseded submissions' groups, and only those, are dropped"
    );
}

/// A command buffer with zone stamps, recorded on a queue that traces at FINE, is refused by an
/// untraced queue before anything is issued (its stamp slot would be unbound, or a user's
/// buffer); the queue then runs other work, and the traced queue runs the command buffer.
#[test]
fn an_untraced_queue_refuses_stamped_command_buffers() {
    let sink = Arc::new(MemorySink::new());
    let (_fake, _driver, device) = open(
        "zone-stamps-untraced-queue",
        DeviceOptions {
            queues: 2,
            queue_tracing: vec![Verbosity::Fine, Verbosity::Off],
            ..options(CommandBufferMode::Graph, Verbosity::Fine, &sink)
        },
    );
    let (traced, untraced) = (device.queue(0), device.queue(1));
    let stamp = stamp_kernel(&device);
    let mut cb = traced.create_command_buffer().unwrap();
    stamped(&mut *cb, &stamp, 100, 150);
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    assert_eq!(cb.bindings().stamp_count(), 1);
    let done = device.create_semaphore(0);
    let refused = untraced.execute(&[], &[(&done, 1)], &[&cb]);
    assert!(
        matches!(&refused, Err(cuhal::Error::InvalidArgument(why)) if why.contains("zone stamps")),
        "{refused:?}"
    );
    let mut plain = untraced.create_command_buffer().unwrap();
    stamped(&mut *plain, &stamp, 1, 2);
    let plain: Arc<dyn CommandBuffer> = plain.end().unwrap();
    assert_eq!(
        plain.bindings().stamp_count(),
        0,
        "untraced: the stamp stays null"
    );
    untraced.execute(&[], &[(&done, 1)], &[&plain]).unwrap();
    wait(&done, 1);
    run(&device, traced, &cb, &[], 1);
    drop((cb, plain));
    drop(device);
    let zones = stamped_zones(&sink);
    assert_eq!(zones.len(), 1, "{zones:?}");
    assert_eq!(zones[0].duration_ns(), 50);
}

/// A stamped zone is kept inside its enclosing zone, whatever the two clocks' mappings say:
/// here a stamp a second long inside a debug group the fake's events time in far less. Viewers
/// need the nesting; the zone keeps its own length where the group has room for it.
#[test]
fn a_stamp_longer_than_its_group_is_kept_inside_it() {
    let sink = Arc::new(MemorySink::new());
    let (_fake, _driver, device) = open(
        "zone-stamps-nested",
        options(CommandBufferMode::Graph, Verbosity::Fine, &sink),
    );
    let queue = device.queue(0);
    let stamp = stamp_kernel(&device);
    let mut cb = queue.create_command_buffer().unwrap();
    cb.begin_debug_group("work").unwrap();
    stamped(&mut *cb, &stamp, 1_000, 1_000_001_000);
    cb.end_debug_group().unwrap();
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    run(&device, queue, &cb, &[], 2);
    drop(cb);
    drop(device);
    let zones = sink.zones();
    let groups: Vec<_> = zones.iter().filter(|z| z.name == "work").collect();
    let stamps = stamped_zones(&sink);
    assert_eq!((groups.len(), stamps.len()), (2, 2));
    for (group, stamp) in groups.iter().zip(&stamps) {
        assert!(group.duration_ns() < 1_000_000_000, "{group:?}");
        assert!(
            stamp.begin_ns >= group.begin_ns && stamp.end_ns <= group.end_ns,
            "{stamp:?} outside {group:?}"
        );
    }
}
