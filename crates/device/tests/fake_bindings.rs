//! Binding tables on the fake driver, in both modes: one recording run on fresh buffers at every
//! submission with exact results (the fake runs `cuhal_fake_add_u32`, so kernel arguments are
//! checked too), graphs patching only the nodes whose bindings changed, one command buffer on
//! two queues with two executables, every bad table a typed error that leaves the queue
//! working, and tables with tracing on.

mod fake_support;

use cuhal_sys::cu_name;
use std::sync::Arc;

use cuhal::{
    BindingError, Buffer, BufferRange, CommandBuffer, CommandBufferMode, CommandRecorder, Device,
    DeviceOptions, Dispatch, Error, FillPattern, Function, KernelArgs, MemorySink, Queue,
    Verbosity,
};
use cuhal_fake_driver::harness::FakeDriver;
use cuhal_fake_driver::module::ADD_KERNEL;
use fake_support::add::add_kernel;
use fake_support::*;

/// Words each slot's chain works on.
const N: usize = 64;
const BYTES: usize = N * 4;
/// The fill pattern and update bytes the command buffer writes into slot 3.
const FILL: u32 = 0x5a5a_0007;
const UPDATE: [u8; 16] = *b"binding tables!!";

fn graph_and_deferred(test: fn(CommandBufferMode)) {
    test(CommandBufferMode::Graph);
    test(CommandBufferMode::Deferred);
}

fn options(mode: CommandBufferMode, queues: usize) -> DeviceOptions {
    DeviceOptions {
        command_buffer_mode: mode,
        ..fake_support::queues(queues)
    }
}

/// `dst = src + k` over `N` words, both naming slots.
fn add(cb: &mut dyn CommandRecorder, add: &Function, dst: u32, src: u32, k: u32) {
    let args = KernelArgs::new()
        .with_range(&BufferRange::slot(dst, 0, BYTES).unwrap())
        .with_binding(src, 0)
        .with(k)
        .with(N as u32);
    cb.dispatch(&Dispatch::new(add, [1, 1, 1], [N as u32, 1, 1], &args))
        .unwrap();
}

/// Slots: 0 input, 1 output, 2 scratch, 3 a record of fills, updates and copies.
/// `out = in + 3`; slot 3 = [FILL x 16 words][UPDATE][out copied].
fn record(queue: &Queue, function: &Function) -> Arc<dyn CommandBuffer> {
    let mut cb = queue.create_command_buffer_with_bindings(4).unwrap();
    cb.fill(
        &BufferRange::slot(3, 0, 64).unwrap(),
        FillPattern::U32(FILL),
    )
    .unwrap();
    cb.update(&BufferRange::slot(3, 64, 16).unwrap(), &UPDATE)
        .unwrap();
    add(&mut *cb, function, 2, 0, 1);
    cb.barrier().unwrap();
    add(&mut *cb, function, 1, 2, 2);
    cb.barrier().unwrap();
    cb.copy(
        &BufferRange::slot(1, 0, BYTES).unwrap(),
        &BufferRange::slot(3, 80, BYTES).unwrap(),
    )
    .unwrap();
    cb.end().unwrap()
}

struct Slots {
    input: Arc<Buffer>,
    output: Arc<Buffer>,
    scratch: Arc<Buffer>,
    record: Arc<Buffer>,
}

impl Slots {
    fn new(device: &Device, queue: &Queue, rng: &mut Rng) -> Slots {
        let make = |len| device.create_buffer(len).unwrap();
        let slots = Slots {
            input: make(BYTES),
            output: make(BYTES),
            scratch: make(BYTES),
            record: make(80 + BYTES),
        };
        let done = device.create_semaphore(0);
        queue
            .write(&[], &[(&done, 1)], &slots.input.whole(), &rng.bytes(BYTES))
            .unwrap();
        wait(&done, 1);
        for b in [&slots.output, &slots.record] {
            poison(device, queue, &b.whole());
        }
        slots
    }

    fn table(&self) -> [BufferRange; 4] {
        [
            self.input.whole(),
            self.output.whole(),
            self.scratch.whole(),
            self.record.whole(),
        ]
    }

    /// Checks the outputs against the input.
    fn check(&self, device: &Device, queue: &Queue, what: &str) {
        let input = words(&read(device, queue, &self.input.whole()));
        let expected: Vec<u32> = input.iter().map(|w| w.wrapping_add(3)).collect();
        assert_eq!(
            words(&read(device, queue, &self.output.whole())),
            expected,
            "{what}: output"
        );
        let record = read(device, queue, &self.record.whole());
        assert!(
            words(&record[..64]).iter().all(|&w| w == FILL),
            "{what}: fill"
        );
        assert_eq!(record[64..80], UPDATE, "{what}: update");
        assert_eq!(words(&record[80..]), expected, "{what}: copy");
    }
}

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn submit(
    queue: &Queue,
    cb: &Arc<dyn CommandBuffer>,
    table: &[BufferRange],
    done: &cuhal::Semaphore,
    value: u64,
) {
    queue
        .execute_with_bindings(&[], &[(done, value)], &[(cb, table)])
        .unwrap_or_else(|e| panic!("submission {value}: {e}"));
    wait(done, value);
}

#[test]
fn one_recording_runs_on_fresh_buffers_every_submission() {
    graph_and_deferred(fresh_buffers);
}

fn fresh_buffers(mode: CommandBufferMode) {
    let (fake, _driver, device) = open("bind-fresh", options(mode, 1));
    let q = device.queue(0);
    let function = add_kernel(&device);
    let cb = record(q, &function);
    assert_eq!(cb.bindings().slots_used(), 4);
    assert_eq!(cb.bindings().extent(3), Some(80 + BYTES));
    let mut rng = Rng::new();
    let done = device.create_semaphore(0);
    for i in 1..=20u64 {
        let slots = Slots::new(&device, q, &mut rng);
        submit(q, &cb, &slots.table(), &done, i);
        slots.check(&device, q, &format!("{mode:?} submission {i}"));
    }
    assert_eq!(fake.launches(ADD_KERNEL), 40);
    drop(cb);
    drop(function);
    drop(device);
    assert_eq!(live(&fake).graph_execs, 0, "every executable destroyed");
}

/// Calls of the three patch entry points so far.
fn patches(fake: &FakeDriver) -> [u64; 3] {
    [
        cu_name!(cuGraphExecKernelNodeSetParams),
        cu_name!(cuGraphExecMemsetNodeSetParams),
        cu_name!(cuGraphExecMemcpyNodeSetParams),
    ]
    .map(|name| fake.calls(name))
}

#[test]
fn graphs_patch_only_the_nodes_whose_bindings_changed() {
    let (fake, _driver, device) = open("bind-patch", options(CommandBufferMode::Graph, 1));
    let q = device.queue(0);
    let cb = record(q, &add_kernel(&device));
    let mut rng = Rng::new();
    let done = device.create_semaphore(0);
    let a = Slots::new(&device, q, &mut rng);

    // First launch: every node with a slot is patched: 2 kernels, 1 memset, and the update and
    // the copy, which run as copy kernels (memcpy nodes never take slots).
    submit(q, &cb, &a.table(), &done, 1);
    assert_eq!(patches(&fake), [4, 1, 0]);
    a.check(&device, q, "first");

    // The same table again: nothing to patch.
    submit(q, &cb, &a.table(), &done, 2);
    assert_eq!(
        patches(&fake),
        [4, 1, 0],
        "an unchanged table patches nothing"
    );

    // Only the input moves: only the kernel reading slot 0.
    let b = Slots::new(&device, q, &mut rng);
    let mut table = a.table();
    table[0] = b.input.whole();
    poison(&device, q, &a.output.whole());
    submit(q, &cb, &table, &done, 3);
    assert_eq!(patches(&fake), [5, 1, 0]);
    let input = words(&read(&device, q, &b.input.whole()));
    let out = words(&read(&device, q, &a.output.whole()));
    assert_eq!(
        out,
        input.iter().map(|w| w.wrapping_add(3)).collect::<Vec<_>>()
    );

    // Only the output moves: the kernel writing slot 1 and the copy reading it.
    table[1] = b.output.whole();
    submit(q, &cb, &table, &done, 4);
    assert_eq!(patches(&fake), [7, 1, 0]);

    // A sub-range at another offset of the same buffer is another address: patched.
    let wide = device.create_buffer(2 * BYTES).unwrap();
    table[2] = wide.range(BYTES, BYTES).unwrap();
    submit(q, &cb, &table, &done, 5);
    assert_eq!(patches(&fake), [9, 1, 0]);
    let with_b = Slots {
        input: b.input.clone(),
        output: b.output.clone(),
        scratch: wide,
        record: a.record.clone(),
    };
    with_b.check(&device, q, "after partial patches");
}

#[test]
fn stream_ordered_allocations_bind_to_every_command() {
    graph_and_deferred(stream_ordered);
}

/// Every slot bound to pool memory from `Queue::alloca`, in turn with plain `cuMemAlloc`
/// buffers: the fake refuses a memcpy node update whose memory is mapped otherwise than at
/// instantiation, as the driver does, so slot updates and copies must not be memcpy nodes.
fn stream_ordered(mode: CommandBufferMode) {
    let (fake, _driver, device) = open("bind-alloca", options(mode, 1));
    let q = device.queue(0);
    let cb = record(q, &add_kernel(&device));
    let mut rng = Rng::new();
    let done = device.create_semaphore(0);
    let mut value = 0;
    for round in 0..4 {
        value += 1;
        let slots = if round % 2 == 0 {
            let lens = [BYTES, BYTES, BYTES, 80 + BYTES];
            let [input, output, scratch, record] = lens.map(|len| q.alloca(&[], &[], len).unwrap());
            q.write(&[], &[], &input.whole(), &rng.bytes(BYTES))
                .unwrap();
            for b in [&output, &record] {
                poison(&device, q, &b.whole());
            }
            Slots {
                input,
                output,
                scratch,
                record,
            }
        } else {
            Slots::new(&device, q, &mut rng)
        };
        submit(q, &cb, &slots.table(), &done, value);
        slots.check(&device, q, &format!("{mode:?} round {round}"));
        if round % 2 == 0 {
            for b in slots.table() {
                q.dealloca(&[], &[], b.buffer().unwrap()).unwrap();
            }
        }
    }
    assert!(q.lost().is_none());
    if mode == CommandBufferMode::Graph {
        assert_eq!(fake.calls("cuGraphExecMemcpyNodeSetParams"), 0);
    }
}

#[test]
fn one_command_buffer_on_two_queues_gets_an_executable_per_queue() {
    graph_and_deferred(two_queues);
}

fn two_queues(mode: CommandBufferMode) {
    let (fake, _driver, device) = open("bind-queues", options(mode, 2));
    let function = add_kernel(&device);
    let cb = record(device.queue(0), &function);
    let mut rng = Rng::new();
    let (x, y) = (device.create_semaphore(0), device.create_semaphore(0));
    let execs = live(&fake).graph_execs;
    for i in 1..=5u64 {
        let a = Slots::new(&device, device.queue(0), &mut rng);
        let b = Slots::new(&device, device.queue(1), &mut rng);
        let (ta, tb) = (a.table(), b.table());
        device
            .queue(0)
            .execute_with_bindings(&[], &[(&x, i)], &[(&cb, &ta)])
            .unwrap();
        device
            .queue(1)
            .execute_with_bindings(&[], &[(&y, i)], &[(&cb, &tb)])
            .unwrap();
        drop((ta, tb));
        wait(&x, i);
        wait(&y, i);
        a.check(&device, device.queue(0), "queue 0");
        b.check(&device, device.queue(1), "queue 1");
    }
    if mode == CommandBufferMode::Graph {
        assert_eq!(
            live(&fake).graph_execs,
            execs + 1,
            "a second executable for the second queue, and no more"
        );
    }
}

/// `result` is the binding error `expected`.
fn assert_binding(result: Result<(), Error>, expected: BindingError, what: &str) {
    match result {
        Err(Error::Command(cuhal_command::Error::Binding(e))) => assert_eq!(e, expected, "{what}"),
        other => panic!("{what}: expected {expected:?}, got {other:?}"),
    }
}

#[test]
fn every_bad_table_is_a_typed_error_and_the_queue_keeps_working() {
    graph_and_deferred(bad_tables);
}

fn bad_tables(mode: CommandBufferMode) {
    let (fake, _driver, device) = open("bind-bad", options(mode, 1));
    let q = device.queue(0);
    let cb = record(q, &add_kernel(&device));
    let mut rng = Rng::new();
    let slots = Slots::new(&device, q, &mut rng);
    let good = slots.table();
    let s = device.create_semaphore(0);
    let launches = fake.launches(ADD_KERNEL);
    let exec = |table: &[BufferRange]| q.execute_with_bindings(&[], &[(&s, 1)], &[(&cb, table)]);

    assert_binding(
        q.execute(&[], &[(&s, 1)], &[&cb]),
        BindingError::TableMissing { needed: 4 },
        "no table",
    );
    assert_binding(
        exec(&good[..3]),
        BindingError::TableTooShort {
            given: 3,
            needed: 4,
        },
        "short",
    );
    let mut five = good.to_vec();
    five.push(good[0].clone());
    assert_binding(
        exec(&five),
        BindingError::TableTooLong {
            given: 5,
            capacity: 4,
        },
        "long",
    );
    let mut small = good.clone();
    small[3] = slots.record.range(0, 80 + BYTES - 4).unwrap();
    assert_binding(
        exec(&small),
        BindingError::BindingTooSmall {
            slot: 3,
            length: 80 + BYTES - 4,
            extent: 80 + BYTES,
        },
        "too small",
    );
    let mut misaligned = good.clone();
    let wide = device.create_buffer(2 * BYTES).unwrap();
    misaligned[3] = wide.range(2, 80 + BYTES).unwrap();
    assert_binding(
        exec(&misaligned),
        BindingError::BindingMisaligned {
            slot: 3,
            address: wide.device_ptr() + 2,
            alignment: 4,
        },
        "misaligned for the U32 fill",
    );
    let mut slot_entry = good.clone();
    slot_entry[0] = BufferRange::slot(0, 0, BYTES).unwrap();
    assert_binding(
        exec(&slot_entry),
        BindingError::SlotRangeNotBound {
            what: "a binding table entry",
            slot: 0,
        },
        "a slot range as a binding",
    );
    let mut overlap = good.clone();
    // Slot 1 (copied from) bound inside slot 3's copy target.
    overlap[1] = slots.record.range(80, BYTES).unwrap();
    overlap[3] = slots.record.whole();
    assert!(
        matches!(
            exec(&overlap),
            Err(Error::Command(cuhal_command::Error::Binding(
                BindingError::OverlappingCopy { length: BYTES, .. }
            )))
        ),
        "overlapping copy"
    );

    let mut plain = q.create_command_buffer().unwrap();
    plain
        .fill(&slots.scratch.whole(), FillPattern::U8(1))
        .unwrap();
    assert!(matches!(
        plain.fill(&BufferRange::slot(0, 0, 4).unwrap(), FillPattern::U8(1)),
        Err(cuhal_command::Error::Binding(
            BindingError::SlotOutOfCapacity {
                slot: 0,
                capacity: 0
            }
        ))
    ));
    let plain: Arc<dyn CommandBuffer> = plain.end().unwrap();
    assert_binding(
        q.execute_with_bindings(&[], &[(&s, 1)], &[(&plain, &good)]),
        BindingError::TableNotExpected { given: 4 },
        "a table for a command buffer without slots",
    );
    assert_binding(
        q.fill(
            &[],
            &[(&s, 1)],
            &BufferRange::slot(0, 0, 4).unwrap(),
            FillPattern::U8(0),
        ),
        BindingError::SlotRangeNotBound {
            what: "fill target",
            slot: 0,
        },
        "a slot range in a queue fill",
    );

    assert_eq!(
        fake.launches(ADD_KERNEL),
        launches,
        "nothing bad was issued"
    );
    assert!(q.lost().is_none() && device.lost().is_none());
    assert_eq!(s.query().unwrap(), 0, "no rejected submission signalled");
    // The queue still works, with a table and without.
    exec(&good).unwrap();
    wait(&s, 1);
    slots.check(&device, q, "after the bad tables");
    q.execute_with_bindings(&[], &[(&s, 2)], &[(&plain, &[])])
        .unwrap();
    wait(&s, 2);
}

#[test]
fn tables_work_with_tracing() {
    graph_and_deferred(traced);
}

fn traced(mode: CommandBufferMode) {
    let sink = Arc::new(MemorySink::new());
    let options = DeviceOptions {
        tracing: Verbosity::Fine,
        trace_sink: Some(sink.clone()),
        ..options(mode, 1)
    };
    let (_fake, _driver, device) = open("bind-trace", options);
    let q = device.queue(0);
    let cb = record(q, &add_kernel(&device));
    let mut rng = Rng::new();
    let done = device.create_semaphore(0);
    for i in 1..=3u64 {
        let slots = Slots::new(&device, q, &mut rng);
        submit(q, &cb, &slots.table(), &done, i);
        slots.check(&device, q, &format!("traced {mode:?} {i}"));
    }
    settle(q);
    q.trace().unwrap().collect();
    let names: Vec<String> = sink.zones().into_iter().map(|z| z.name).collect();
    for name in [ADD_KERNEL, "fill", "update", "copy"] {
        assert_eq!(
            names.iter().filter(|n| *n == name).count(),
            if name == ADD_KERNEL { 6 } else { 3 },
            "{mode:?}: {name} zones in {names:?}"
        );
    }
}

#[test]
fn a_failed_patch_fails_its_submission_and_the_command_buffer_still_runs_elsewhere() {
    let (fake, _driver, device) = open("bind-fault", options(CommandBufferMode::Graph, 2));
    let cb = record(device.queue(0), &add_kernel(&device));
    let mut rng = Rng::new();
    let a = Slots::new(&device, device.queue(1), &mut rng);
    let s = device.create_semaphore(0);
    // The second kernel node's patch fails (not a sticky error): the first is patched already.
    fake.fail_calls(
        cu_name!(cuGraphExecKernelNodeSetParams),
        2,
        1,
        cuhal_fake_driver::status::INVALID_VALUE,
    );
    device
        .queue(0)
        .execute_with_bindings(&[], &[(&s, 1)], &[(&cb, &a.table())])
        .ok();
    let failure = failure_of(&s, 1);
    assert_driver_result(&failure, cuhal_sys::CUresult::ERROR_INVALID_VALUE);
    assert_eq!(fake.launches(ADD_KERNEL), 0, "the graph was not launched");
    // An error while issuing loses that queue, not the device.
    assert!(device.queue(0).lost().is_some());
    assert!(device.lost().is_none(), "not a sticky error");
    // The other queue runs the same command buffer with its own executable, patched in full.
    let before = patches(&fake);
    let t = device.create_semaphore(0);
    device
        .queue(1)
        .execute_with_bindings(&[], &[(&t, 1)], &[(&cb, &a.table())])
        .unwrap();
    wait(&t, 1);
    let after = patches(&fake);
    assert_eq!(
        [
            after[0] - before[0],
            after[1] - before[1],
            after[2] - before[2]
        ],
        [4, 1, 0]
    );
    a.check(&device, device.queue(1), "after the failed patch");
}

/// A binding capacity no table can reach is a typed error in every mode, not an allocation of
/// the whole declared table (`u32::MAX` slots once aborted the process); the largest allowed
/// capacity costs nothing until slots are named, and the queue keeps working.
#[test]
fn a_capacity_past_the_limit_is_a_typed_error() {
    let (_fake, _driver, device) = open("bind-capacity", fake_support::queues(1));
    let q = device.queue(0);
    for mode in [CommandBufferMode::Graph, CommandBufferMode::Deferred] {
        for capacity in [cuhal::MAX_BINDING_CAPACITY + 1, u32::MAX] {
            match q.create_command_buffer_as(mode, capacity) {
                Err(Error::Command(cuhal_command::Error::Binding(e))) => assert_eq!(
                    e,
                    BindingError::CapacityTooLarge {
                        capacity,
                        max: cuhal::MAX_BINDING_CAPACITY
                    },
                    "{mode:?}"
                ),
                Err(other) => panic!("{mode:?}, capacity {capacity}: {other:?}"),
                Ok(_) => panic!("{mode:?}, capacity {capacity}: accepted"),
            }
        }
    }
    for mode in [CommandBufferMode::Graph, CommandBufferMode::Deferred] {
        let mut cb = q
            .create_command_buffer_as(mode, cuhal::MAX_BINDING_CAPACITY)
            .unwrap();
        let buffer = device.create_buffer(BYTES).unwrap();
        cb.fill(
            &BufferRange::slot(cuhal::MAX_BINDING_CAPACITY - 1, 0, BYTES).unwrap(),
            FillPattern::U32(FILL),
        )
        .unwrap();
        let cb = cb.end().unwrap();
        let mut table = vec![buffer.range(0, BYTES).unwrap(); cuhal::MAX_BINDING_CAPACITY as usize];
        table[0] = buffer.range(0, 4).unwrap();
        let s = device.create_semaphore(0);
        q.execute_with_bindings(&[], &[(&s, 1)], &[(&cb, &table)])
            .unwrap();
        s.wait(1, TIMEOUT).unwrap();
        assert_eq!(
            words(&read(&device, q, &buffer.range(0, BYTES).unwrap())),
            vec![FILL; N],
            "{mode:?}"
        );
    }
}
