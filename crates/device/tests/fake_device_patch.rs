//! Binding patches applied on the device, on the fake driver. The fake emulates the helper
//! kernel `cuhal_bindings_apply` (it reads the patch list from mapped memory and writes each
//! value into its device-updatable node of the executable) and runs `cuhal_fake_add_u32`, so
//! these check exact bytes over many submissions with alternating tables, which launches patch
//! on the device and which on the host (the threshold, memset nodes, unchanged tables), one
//! executable per queue each with a graph of its own, and the fallbacks to host patching.

mod fake_support;

use cuhal_sys::cu_name;
use std::sync::Arc;

use cuhal::{
    Buffer, BufferRange, CommandBuffer, Device, DeviceOptions, Function, GraphCommandBuffer,
    GraphExec, PatchMethod, Queue,
};
use cuhal_command::{BINDINGS_HELPER, DEVICE_PATCH_MIN_NODES};
use cuhal_fake_driver::harness::FakeDriver;
use fake_support::add::{add_kernel, record_add_chain};
use fake_support::helpers::{BOTH_HELPERS, install_helpers};
use fake_support::*;

/// Words each buffer holds.
const N: usize = 32;
const BYTES: usize = N * 4;
/// Dispatches in the chain: enough for [`PatchMethod::Auto`] to patch on the device.
const CHAIN: u32 = 12;
const FILL: u32 = 0x0bad_cafe;

/// Slots: 0 input (its second half: the binding's offset is BYTES), 1 output, 2 and 3
/// scratch, 4 a filled record.
/// The chain: 2 = in + 1, then 3 = 2 + 1 and 2 = 3 + 1 in turn, then out = last + 1, so
/// out = in + CHAIN; slot 4 is filled with FILL (a memset node).
fn record(device: &Device, add: &Function, method: PatchMethod) -> Arc<GraphExec> {
    let mut cb = GraphCommandBuffer::with_bindings(device.context(), None, 5).unwrap();
    cb.set_patch_method(method).unwrap();
    record_add_chain(&mut cb, add, FILL, CHAIN, N, BYTES as u64);
    Arc::new(cb.end().unwrap())
}

struct Slots {
    buffers: Vec<Arc<Buffer>>,
}

impl Slots {
    fn new(device: &Device) -> Slots {
        let mut buffers: Vec<_> = (0..4)
            .map(|slot| {
                device
                    .create_buffer(if slot == 0 { 2 * BYTES } else { BYTES })
                    .unwrap()
            })
            .collect();
        buffers.push(device.create_buffer(64).unwrap());
        Slots { buffers }
    }

    fn table(&self) -> Vec<BufferRange> {
        self.buffers.iter().map(|b| b.whole()).collect()
    }
}

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Writes fresh input into `table`'s slot 0, poisons its output and record, submits `cb` with
/// it on `queue`, and checks out = in + CHAIN and the fill.
fn run_checked(
    device: &Device,
    queue: &Queue,
    cb: &Arc<dyn CommandBuffer>,
    table: &[BufferRange],
    rng: &mut Rng,
    what: &str,
) {
    // The first half differs from the input the chain must read.
    let mut bytes = rng.bytes(2 * BYTES);
    let input = bytes.split_off(BYTES);
    bytes.extend_from_slice(&input);
    let done = device.create_semaphore(0);
    queue.write(&[], &[(&done, 1)], &table[0], &bytes).unwrap();
    wait(&done, 1);
    poison(device, queue, &table[1]);
    poison(device, queue, &table[4]);
    let done = device.create_semaphore(0);
    queue
        .execute_with_bindings(&[], &[(&done, 1)], &[(cb, table)])
        .unwrap();
    wait(&done, 1);
    check_output(device, queue, table, &input, what);
}

/// Checks out = in + CHAIN and the fill of a completed submission on `table`, read on `queue`.
fn check_output(device: &Device, queue: &Queue, table: &[BufferRange], input: &[u8], what: &str) {
    let expected: Vec<u32> = words(input).iter().map(|w| w.wrapping_add(CHAIN)).collect();
    assert_eq!(
        words(&read(device, queue, &table[1])),
        expected,
        "{what}: output"
    );
    assert!(
        words(&read(device, queue, &table[4]))
            .iter()
            .all(|&w| w == FILL),
        "{what}: fill"
    );
}

/// Round `round` of checked submissions over `sets` of slots: on queue `round` modulo the
/// device's queues, with the table of set `round` modulo their number.
fn run_round(
    device: &Device,
    cb: &Arc<dyn CommandBuffer>,
    sets: &[Slots],
    rng: &mut Rng,
    round: usize,
) {
    let queue = device.queue(round % device.queues().len());
    let table = sets[round % sets.len()].table();
    run_checked(device, queue, cb, &table, rng, &format!("round {round}"));
}

/// `rounds` checked submissions on queue 0, each on freshly allocated buffers.
fn run_fresh_rounds(device: &Device, cb: &Arc<dyn CommandBuffer>, rng: &mut Rng, rounds: usize) {
    for round in 0..rounds {
        let table = Slots::new(device).table();
        run_checked(
            device,
            device.queue(0),
            cb,
            &table,
            rng,
            &format!("{round}"),
        );
    }
}

fn open_fake(tag: &str, queues: usize) -> (FakeDriver, cuhal::Driver, Device, Function) {
    install_helpers("device-patch", BOTH_HELPERS);
    let (fake, driver, device) = open(tag, fake_support::queues(queues));
    let add = add_kernel(&device);
    (fake, driver, device, add)
}

#[test]
fn alternating_tables_patch_on_the_device_with_exact_bytes() {
    let (fake, _driver, device, add) = open_fake("device-patch-bytes", 1);
    let mut rng = Rng::new();
    let graph = record(&device, &add, PatchMethod::Auto);
    assert!(
        graph.patches_on_device(),
        "a chain of {CHAIN} bound dispatches"
    );
    let cb: Arc<dyn CommandBuffer> = graph.clone();
    let sets: Vec<Slots> = (0..3).map(|_| Slots::new(&device)).collect();
    let queue = device.queue(0);
    let kernel_sets = || fake.calls(cu_name!(cuGraphExecKernelNodeSetParams));
    let memset_sets = || fake.calls(cu_name!(cuGraphExecMemsetNodeSetParams));
    let rounds = 30;
    for round in 0..rounds {
        let (kernels, memsets) = (kernel_sets(), memset_sets());
        run_round(&device, &cb, &sets, &mut rng, round);
        // Every slot changed: the helper node gets its list (one host call), the memset node
        // is patched on the host, no kernel node is.
        assert_eq!(
            kernel_sets() - kernels,
            1,
            "round {round}: one call, for the helper"
        );
        assert_eq!(
            memset_sets() - memsets,
            1,
            "round {round}: memset nodes on the host"
        );
    }
    assert_eq!(fake.launches(BINDINGS_HELPER), rounds as u64);
    assert_eq!(graph.device_patched_launches(), rounds as u64);
    assert!(
        fake.calls(cu_name!(cuGraphUpload)) >= 1,
        "uploaded before its first launch"
    );

    // Fresh buffers at every submission, as a runtime gives them. Every round's buffers stay
    // allocated to the end: a freed round's memory could come back at the same addresses (when
    // the queue let go of it before the next allocation), leaving slots unchanged and the launch
    // below the device-patching threshold.
    let mut kept = Vec::new();
    for round in 0..10 {
        let fresh = Slots::new(&device);
        run_checked(
            &device,
            queue,
            &cb,
            &fresh.table(),
            &mut rng,
            &format!("fresh {round}"),
        );
        kept.push(fresh);
    }
    assert_eq!(graph.device_patched_launches(), rounds as u64 + 10);
}

#[test]
fn few_changed_nodes_memsets_and_unchanged_tables_stay_on_the_host() {
    let (fake, _driver, device, add) = open_fake("device-patch-threshold", 1);
    let mut rng = Rng::new();
    let graph = record(&device, &add, PatchMethod::Auto);
    let cb: Arc<dyn CommandBuffer> = graph.clone();
    let queue = device.queue(0);
    let slots = Slots::new(&device);
    let mut table = slots.table();
    run_checked(&device, queue, &cb, &table, &mut rng, "first");
    assert_eq!(
        fake.launches(BINDINGS_HELPER),
        1,
        "the first launch binds every node"
    );
    let kernel_sets = || fake.calls(cu_name!(cuGraphExecKernelNodeSetParams));
    let enables = || fake.calls(cu_name!(cuGraphNodeSetEnabled));

    // Unchanged: nothing patched, the helper disabled (one call) and not run.
    let (k, e) = (kernel_sets(), enables());
    run_checked(&device, queue, &cb, &table, &mut rng, "unchanged");
    assert_eq!(kernel_sets(), k);
    assert_eq!(enables() - e, 1, "the helper is disabled");
    assert_eq!(fake.launches(BINDINGS_HELPER), 1);
    let e = enables();
    run_checked(&device, queue, &cb, &table, &mut rng, "unchanged again");
    assert_eq!(enables(), e, "and stays disabled without another call");

    // Only the input changes: one kernel node, below the threshold: the host patches it.
    let input = device.create_buffer(2 * BYTES).unwrap();
    table[0] = input.whole();
    let k = kernel_sets();
    run_checked(&device, queue, &cb, &table, &mut rng, "input only");
    assert_eq!(kernel_sets() - k, 1, "one node on the host");
    assert_eq!(fake.launches(BINDINGS_HELPER), 1);

    // Only the record changes: a memset node, always on the host.
    let record = device.create_buffer(64).unwrap();
    table[4] = record.whole();
    let (k, m) = (
        kernel_sets(),
        fake.calls(cu_name!(cuGraphExecMemsetNodeSetParams)),
    );
    run_checked(&device, queue, &cb, &table, &mut rng, "record only");
    assert_eq!(kernel_sets(), k);
    assert_eq!(fake.calls(cu_name!(cuGraphExecMemsetNodeSetParams)) - m, 1);
    assert_eq!(fake.launches(BINDINGS_HELPER), 1);

    // A scratch slot names CHAIN - 1 kernel nodes: the device patches them.
    assert!(CHAIN as usize > DEVICE_PATCH_MIN_NODES);
    let scratch = device.create_buffer(BYTES).unwrap();
    table[2] = scratch.whole();
    let (k, e) = (kernel_sets(), enables());
    run_checked(&device, queue, &cb, &table, &mut rng, "scratch");
    assert_eq!(kernel_sets() - k, 1, "only the helper's list");
    assert_eq!(enables() - e, 1, "the helper is enabled again");
    assert_eq!(fake.launches(BINDINGS_HELPER), 2);
}

#[test]
fn the_method_is_honoured() {
    let (fake, _driver, device, add) = open_fake("device-patch-method", 1);
    let mut rng = Rng::new();
    let queue = device.queue(0);
    let sets = [Slots::new(&device), Slots::new(&device)];

    // Host: no helper node at all, every changed node patched on the host.
    let host = record(&device, &add, PatchMethod::Host);
    assert!(!host.patches_on_device());
    let cb: Arc<dyn CommandBuffer> = host.clone();
    for round in 0..4 {
        let k = fake.calls(cu_name!(cuGraphExecKernelNodeSetParams));
        run_checked(
            &device,
            queue,
            &cb,
            &sets[round % 2].table(),
            &mut rng,
            "host",
        );
        assert_eq!(
            fake.calls(cu_name!(cuGraphExecKernelNodeSetParams)) - k,
            u64::from(CHAIN)
        );
    }
    assert_eq!(fake.launches(BINDINGS_HELPER), 0);

    // Device: even one changed kernel node goes to the device.
    let dev = record(&device, &add, PatchMethod::Device);
    let cb: Arc<dyn CommandBuffer> = dev.clone();
    let mut table = sets[0].table();
    run_checked(&device, queue, &cb, &table, &mut rng, "device, first");
    let input = device.create_buffer(2 * BYTES).unwrap();
    table[0] = input.whole();
    let k = fake.calls(cu_name!(cuGraphExecKernelNodeSetParams));
    run_checked(&device, queue, &cb, &table, &mut rng, "device, input only");
    assert_eq!(fake.calls(cu_name!(cuGraphExecKernelNodeSetParams)) - k, 1);
    assert_eq!(dev.device_patched_launches(), 2);

    // The method is chosen before end().
    assert!(dev.patch_method() == PatchMethod::Device);
    let mut ended = GraphCommandBuffer::with_bindings(device.context(), None, 1).unwrap();
    ended.end().unwrap();
    assert!(ended.set_patch_method(PatchMethod::Host).is_err());
}

#[test]
fn each_queue_gets_an_executable_with_a_graph_of_its_own() {
    let (fake, _driver, device, add) = open_fake("device-patch-pool", 2);
    let mut rng = Rng::new();
    let graph = record(&device, &add, PatchMethod::Auto);
    let cb: Arc<dyn CommandBuffer> = graph.clone();
    let sets: Vec<Slots> = (0..4).map(|_| Slots::new(&device)).collect();
    for round in 0..16 {
        run_round(&device, &cb, &sets, &mut rng, round);
    }
    // A graph with device-updatable nodes can have one executable at a time (the fake refuses
    // a second, as the driver does): each executable was instantiated from its own clone.
    assert_eq!(graph.executable_count(), 2);
    assert_eq!(graph.shared_launches(), 0);
    assert_eq!(fake.calls(cu_name!(cuGraphClone)), 2);
    assert_eq!(graph.device_patched_launches(), 16);
}

#[test]
fn without_what_device_patching_needs_the_host_patches() {
    // A driver without cuGraphNodeSetEnabled: no helper node.
    install_helpers("device-patch", BOTH_HELPERS);
    let (fake, _driver) = load_with("device-patch-no-enable", |fake| {
        fake.hide("cuGraphNodeSetEnabled")
    });
    let device = _driver.open(0, DeviceOptions::default()).unwrap();
    let add = add_kernel(&device);
    let mut rng = Rng::new();
    let graph = record(&device, &add, PatchMethod::Device);
    assert!(!graph.patches_on_device());
    let cb: Arc<dyn CommandBuffer> = graph.clone();
    run_fresh_rounds(&device, &cb, &mut rng, 4);
    assert_eq!(fake.launches(BINDINGS_HELPER), 0);

    // The driver refuses the clone: the executable is the plain graph's.
    let (fake, _driver, device, add) = open_fake("device-patch-no-clone", 1);
    fake.fail("cuGraphClone", cuhal_fake_driver::status::NOT_SUPPORTED);
    let graph = record(&device, &add, PatchMethod::Device);
    assert!(!graph.patches_on_device());
    let cb: Arc<dyn CommandBuffer> = graph.clone();
    run_fresh_rounds(&device, &cb, &mut rng, 4);
    assert_eq!(fake.launches(BINDINGS_HELPER), 0);
}

#[test]
fn an_executable_without_its_clone_patches_on_the_host_beside_one_with() {
    let (fake, _driver, device, add) = open_fake("device-patch-mixed-pool", 2);
    let mut rng = Rng::new();
    let graph = record(&device, &add, PatchMethod::Auto);
    let cb: Arc<dyn CommandBuffer> = graph.clone();
    // The second executable's clone is refused: it is the plain graph's, patched on the host.
    fake.fail_calls(
        "cuGraphClone",
        1,
        1,
        cuhal_fake_driver::status::OUT_OF_MEMORY,
    );
    let sets: Vec<Slots> = (0..3).map(|_| Slots::new(&device)).collect();
    let mut host_launches = 0;
    for round in 0..12 {
        let kernels = fake.calls(cu_name!(cuGraphExecKernelNodeSetParams));
        run_round(&device, &cb, &sets, &mut rng, round);
        if fake.calls(cu_name!(cuGraphExecKernelNodeSetParams)) - kernels == u64::from(CHAIN) {
            host_launches += 1;
        }
    }
    assert_eq!(graph.executable_count(), 2);
    assert!(graph.patches_on_device());
    assert_eq!(graph.device_patched_launches(), 6, "queue 0's launches");
    assert_eq!(
        host_launches, 6,
        "queue 1's launches, every kernel node on the host"
    );
}

/// How long each graph launch keeps its stream busy on the fake's model clock in the tests
/// below: long enough that a submission on another queue always comes while it still runs.
const LAUNCH: std::time::Duration = std::time::Duration::from_millis(20);

/// The graph launches that took an executable still running from a launch on another stream,
/// or that ran with parameters patched while such a launch ran (on the model clock): on a GPU,
/// each would have waited for the other queue's launch.
fn launches_sharing_a_running_executable(fake: &FakeDriver) -> Vec<String> {
    fake.graph_launches()
        .iter()
        .enumerate()
        .filter(|(_, l)| l.running_elsewhere != 0 || l.patched_while_running_elsewhere != 0)
        .map(|(i, l)| {
            format!(
                "launch {i}: executable {:#x} on stream {:#x} (running elsewhere: {}, patched \
                 while running elsewhere: {})",
                l.exec, l.stream, l.running_elsewhere, l.patched_while_running_elsewhere
            )
        })
        .collect()
}

/// One queue's submission in a round: its table and the input it was given.
struct Submitted {
    slots: Arc<Slots>,
    input: Vec<u8>,
}

/// Writes fresh input into `slots` and submits `cb` with them on `queue`, signalling
/// `(done, value)`; nothing waits.
fn submit_unwaited(
    queue: &Queue,
    cb: &Arc<dyn CommandBuffer>,
    slots: &Arc<Slots>,
    rng: &mut Rng,
    done: (&cuhal::Semaphore, u64),
) -> Submitted {
    let table = slots.table();
    let input = rng.bytes(BYTES);
    queue
        .write(&[], &[], &table[0].sub(BYTES, BYTES).unwrap(), &input)
        .unwrap();
    queue
        .execute_with_bindings(&[], &[done], &[(cb, &table)])
        .unwrap();
    Submitted {
        slots: slots.clone(),
        input,
    }
}

/// Checks out = in + CHAIN and the fill of a submission that completed, read on `queue`.
fn check_submitted(device: &Device, queue: &Queue, s: &Submitted, what: &str) {
    check_output(device, queue, &s.slots.table(), &s.input, what);
}

/// Which tables the queues submit with.
#[derive(Copy, Clone, Debug)]
enum Tables {
    /// Fresh buffers at every submission: every binding changes.
    Fresh,
    /// Each queue always the same table: after its first launch nothing is patched.
    Unchanged,
}

/// `rounds` rounds of one submission of `cb` per queue of `device`, each submitted while the
/// others' launches still run (the model clock keeps every launch `LAUNCH` in flight), in an
/// order that turns every round, waiting for the round only every third round (so later rounds
/// find the executables warm and still running). Checks every output and that no launch took
/// or patched an executable running on another queue's stream.
fn concurrent_rounds(
    fake: &FakeDriver,
    device: &Device,
    graph: &Arc<GraphExec>,
    tables: Tables,
    rounds: usize,
    what: &str,
) {
    let cb: Arc<dyn CommandBuffer> = graph.clone();
    let queues = device.queues().len();
    let mut rng = Rng::new();
    let own: Vec<Arc<Slots>> = (0..queues).map(|_| Arc::new(Slots::new(device))).collect();
    let done: Vec<_> = (0..queues).map(|_| device.create_semaphore(0)).collect();
    fake.clear_graph_launches();
    fake.set_timing(LAUNCH, std::time::Duration::ZERO);
    let mut last: Vec<Option<Submitted>> = (0..queues).map(|_| None).collect();
    for round in 0..rounds {
        for k in 0..queues {
            let q = (k + round) % queues;
            let slots = match tables {
                Tables::Fresh => Arc::new(Slots::new(device)),
                Tables::Unchanged => own[q].clone(),
            };
            let value = round as u64 + 1;
            last[q] = Some(submit_unwaited(
                device.queue(q),
                &cb,
                &slots,
                &mut rng,
                (&done[q], value),
            ));
            assert_eq!(
                launches_sharing_a_running_executable(fake),
                Vec::<String>::new(),
                "{what}, round {round}, queue {q}: an executable running on another queue's \
                 stream was launched or patched for this one"
            );
        }
        if round % 3 == 2 || round + 1 == rounds {
            for (q, s) in done.iter().enumerate() {
                wait(s, round as u64 + 1);
                let submitted = last[q].as_ref().unwrap();
                check_submitted(
                    device,
                    device.queue(q),
                    submitted,
                    &format!("{what}, round {round}, queue {q}"),
                );
            }
        }
    }
    fake.set_timing(std::time::Duration::ZERO, std::time::Duration::ZERO);
    fake.finish_work();
    // Each queue's launches went to an executable no other queue's stream had at that moment.
    let mut seen = std::collections::HashSet::new();
    for q in 0..queues {
        let index = graph
            .executable_on(device.queue(q).stream())
            .unwrap_or_else(|| panic!("{what}: queue {q} launched the graph"));
        assert!(
            seen.insert(index),
            "{what}: queue {q} shares executable {index}"
        );
    }
    assert_eq!(graph.shared_launches(), 0, "{what}");
}

#[test]
fn two_queues_never_launch_or_patch_an_executable_running_on_the_other() {
    for method in [PatchMethod::Host, PatchMethod::Device] {
        for tables in [Tables::Fresh, Tables::Unchanged] {
            let what = format!("{method:?} patching, {tables:?} tables");
            let (fake, _driver, device, add) = open_fake("pool-two-queues", 2);
            let graph = record(&device, &add, method);
            assert_eq!(graph.patches_on_device(), method == PatchMethod::Device);
            concurrent_rounds(&fake, &device, &graph, tables, 8, &what);
            assert_eq!(graph.executable_count(), 2, "{what}");
            if method == PatchMethod::Device && matches!(tables, Tables::Fresh) {
                assert_eq!(graph.device_patched_launches(), 16, "{what}");
            }
        }
    }
}

#[test]
fn more_queues_than_executables_kept_before_each_get_an_executable() {
    // Six queues: more than the four executables the pool was once bounded by, past which a
    // queue took the least recently used executable even while it ran on another stream.
    for method in [PatchMethod::Host, PatchMethod::Device] {
        let what = format!("{method:?} patching, six queues");
        let (fake, _driver, device, add) = open_fake("pool-six-queues", 6);
        let graph = record(&device, &add, method);
        concurrent_rounds(&fake, &device, &graph, Tables::Fresh, 4, &what);
        assert_eq!(graph.executable_count(), 6, "{what}");
    }
}

#[test]
fn a_new_queue_takes_an_idle_executable_and_never_a_running_one() {
    let (fake, _driver, device, add) = open_fake("pool-idle", 3);
    let graph = record(&device, &add, PatchMethod::Host);
    let cb: Arc<dyn CommandBuffer> = graph.clone();
    let mut rng = Rng::new();
    let slots: Vec<Arc<Slots>> = (0..3).map(|_| Arc::new(Slots::new(&device))).collect();
    let done: Vec<_> = (0..3).map(|_| device.create_semaphore(0)).collect();
    fake.set_timing(LAUNCH, std::time::Duration::ZERO);
    let mut submit = |q: usize, value: u64| {
        submit_unwaited(device.queue(q), &cb, &slots[q], &mut rng, (&done[q], value))
    };
    // Queues 0 and 1 at once: two executables.
    let a = submit(0, 1);
    let b = submit(1, 1);
    wait(&done[0], 1);
    wait(&done[1], 1);
    assert_eq!(graph.executable_count(), 2);
    // Both idle now: queue 2 takes one of them, patched for its table.
    let c = submit(2, 1);
    wait(&done[2], 1);
    assert_eq!(graph.executable_count(), 2, "an idle executable was taken");
    check_submitted(&device, device.queue(0), &a, "queue 0");
    check_submitted(&device, device.queue(1), &b, "queue 1");
    check_submitted(
        &device,
        device.queue(2),
        &c,
        "queue 2, on a taken executable",
    );
    // All three at once: whichever queue lost its executable to queue 2 gets a new one.
    let runs: Vec<Submitted> = (0..3).map(|q| submit(q, 2)).collect();
    for (q, s) in done.iter().enumerate() {
        wait(s, 2);
        check_submitted(&device, device.queue(q), &runs[q], "all three at once");
    }
    assert_eq!(graph.executable_count(), 3);
    assert_eq!(graph.shared_launches(), 0);
    assert_eq!(
        launches_sharing_a_running_executable(&fake),
        Vec::<String>::new()
    );
    fake.set_timing(std::time::Duration::ZERO, std::time::Duration::ZERO);
}

#[test]
fn at_a_set_limit_a_running_executable_is_shared_and_counted() {
    // The fake's record catches a shared executable: with the limit at one, the second queue
    // must take the executable running on the first one's stream.
    let (fake, _driver, device, add) = open_fake("pool-limit", 2);
    let graph = record(&device, &add, PatchMethod::Host);
    graph.set_executable_limit(1);
    let cb: Arc<dyn CommandBuffer> = graph.clone();
    let mut rng = Rng::new();
    let slots: Vec<Arc<Slots>> = (0..2).map(|_| Arc::new(Slots::new(&device))).collect();
    let done: Vec<_> = (0..2).map(|_| device.create_semaphore(0)).collect();
    fake.clear_graph_launches();
    fake.set_timing(LAUNCH, std::time::Duration::ZERO);
    let runs: Vec<Submitted> = (0..2)
        .map(|q| submit_unwaited(device.queue(q), &cb, &slots[q], &mut rng, (&done[q], 1)))
        .collect();
    for (q, s) in done.iter().enumerate() {
        wait(s, 1);
        check_submitted(&device, device.queue(q), &runs[q], "limit 1");
    }
    assert_eq!(graph.executable_count(), 1);
    assert_eq!(graph.shared_launches(), 1);
    let shared = launches_sharing_a_running_executable(&fake);
    assert_eq!(shared.len(), 1, "{shared:?}");
    fake.set_timing(std::time::Duration::ZERO, std::time::Duration::ZERO);
}

/// A kernel whose second parameter is 16-byte aligned, before a pointer: the driver lays the
/// pointer at byte 32, where `KernelArgs` packing the 16 bytes with 4-byte alignment puts it at
/// 24.
const ALIGNED_PTX: &str = "
.version 8.0
.target sm_90
.address_size 64

.visible .entry cuhal_fake_aligned(
    .param .u32 cuhal_fake_aligned_param_0,
    .param .align 16 .b8 cuhal_fake_aligned_param_1[16],
    .param .u64 cuhal_fake_aligned_param_2
)
{
    ret;
}
";

/// A patch applied on the device writes each address where the driver lays the parameter out
/// (`cuFuncGetParamInfo`), not where `KernelArgs` packed it: here an argument less aligned
/// than its parameter moves the bound pointer after it from byte 24 to 32. (The fake's helper
/// fails the launch, as overwritten arguments would on a GPU, when a patch lands anywhere but
/// on an 8-byte parameter.)
#[test]
fn device_patches_land_where_the_driver_lays_the_parameter() {
    let (fake, _driver, device, _add) = open_fake("device-patch-aligned", 1);
    let function = device
        .load_ptx(ALIGNED_PTX)
        .unwrap()
        .function("cuhal_fake_aligned")
        .unwrap();
    assert_eq!(function.parameter_offsets(), Some(&[0, 16, 32][..]));
    let mut cb = GraphCommandBuffer::with_bindings(device.context(), None, 1).unwrap();
    cb.set_patch_method(PatchMethod::Device).unwrap();
    for i in 0..DEVICE_PATCH_MIN_NODES as u32 {
        let mut args = cuhal::KernelArgs::new();
        args.push(i)
            .push_bytes(&[0u8; 16], 4)
            .unwrap()
            .push_binding(0, 0);
        assert_eq!(
            args.slots()[2].offset,
            24,
            "packed after 20 bytes, 8-aligned"
        );
        cuhal::CommandRecorder::dispatch(
            &mut cb,
            &cuhal::Dispatch::new(&function, [1, 1, 1], [32, 1, 1], &args),
        )
        .unwrap();
    }
    let graph = Arc::new(cb.end().unwrap());
    assert!(graph.patches_on_device());
    let cb: Arc<dyn CommandBuffer> = graph.clone();
    let queue = device.queue(0);
    let done = device.create_semaphore(0);
    let buffers: Vec<_> = (0..3).map(|_| device.create_buffer(64).unwrap()).collect();
    for (n, buffer) in (1..).zip(&buffers) {
        queue
            .execute_with_bindings(&[], &[(&done, n)], &[(&cb, &[buffer.whole()][..])])
            .unwrap();
        wait(&done, n);
    }
    assert!(queue.lost().is_none());
    assert_eq!(fake.launches(BINDINGS_HELPER), 3);
    assert_eq!(graph.device_patched_launches(), 3);
}
