//! GPU suite: binding patches applied on the device. A graph command buffer whose chain of
//! dispatches names slots runs with the `cuhal_bindings_apply` helper node patching its kernel
//! arguments: exact bytes over alternating and fresh tables on two queues (each queue's
//! executable is instantiated from its own clone of the graph), and host and device patches
//! interleaved on one executable while earlier launches are still queued behind a long kernel.

use std::sync::Arc;

use cuhal::{
    Buffer, BufferRange, CommandBuffer, CommandBufferMode, CommandRecorder, Device, Dispatch,
    FillPattern, GraphCommandBuffer, GraphExec, KernelArgs, PatchMethod, Queue,
};
use cuhal_command::DEVICE_PATCH_RING;
use cuhal_gpu_tests::device_support::*;
use cuhal_gpu_tests::gpu::{Rng, seed};

/// Words per buffer.
const WORDS: usize = 1024;
const BYTES: usize = WORDS * 4;
/// Dispatches in the chain (more than `DEVICE_PATCH_MIN_NODES`).
const CHAIN: u32 = 16;
const FILL: u32 = 0x0BAD_CAFE;

/// Slots: 0 input (bound at offset BYTES: its second half), 1 output, 2 and 3 scratch, 4 a
/// filled record (a memset node, patched on the host). out = in + CHAIN.
fn record(device: &Device, kernels: &Kernels, method: PatchMethod) -> Arc<GraphExec> {
    let mut cb = GraphCommandBuffer::with_bindings(device.context(), None, 5).unwrap();
    cb.set_patch_method(method).unwrap();
    cb.fill(
        &BufferRange::slot(4, 0, 64).unwrap(),
        FillPattern::U32(FILL),
    )
    .unwrap();
    let mut from = 0;
    for i in 0..CHAIN {
        let to = if i + 1 == CHAIN { 1 } else { 2 + i % 2 };
        let args = KernelArgs::new()
            .with_binding(to, 0)
            .with_binding(from, if from == 0 { BYTES as u64 } else { 0 })
            .with(1u32)
            .with(WORDS as u32);
        let grid = [(WORDS as u32).div_ceil(BLOCK), 1, 1];
        cb.dispatch(&Dispatch::new(&kernels.add, grid, [BLOCK, 1, 1], &args))
            .unwrap();
        cb.barrier().unwrap();
        from = to;
    }
    let cb = cb.end().unwrap_or_else(|e| panic!("end: {e}"));
    assert!(
        cb.patches_on_device(),
        "the graph carries the helper node (is there a helper cubin for this GPU?)"
    );
    Arc::new(cb)
}

/// One table's buffers: the input (random second half, other first half), output and scratch
/// poisoned.
struct Slots {
    buffers: Vec<Arc<Buffer>>,
    input: Vec<u32>,
}

impl Slots {
    fn new(device: &Device, rng: &mut Rng) -> Slots {
        let sizes = [2 * BYTES, BYTES, BYTES, BYTES, 64];
        let buffers: Vec<_> = sizes
            .iter()
            .map(|&n| device.create_buffer(n).unwrap())
            .collect();
        let all: Vec<u32> = (0..2 * WORDS).map(|_| rng.next_u32()).collect();
        let bytes: Vec<u8> = all.iter().flat_map(|w| w.to_ne_bytes()).collect();
        buffers[0].write(0, &bytes).unwrap();
        for b in &buffers[1..] {
            poison(b, 0xDEAD_BEEF);
        }
        Slots {
            buffers,
            input: all[WORDS..].to_vec(),
        }
    }

    fn table(&self) -> Vec<BufferRange> {
        self.buffers.iter().map(|b| b.whole()).collect()
    }

    fn check(&self, what: &str) {
        let expected: Vec<u32> = self.input.iter().map(|w| w.wrapping_add(CHAIN)).collect();
        assert_eq!(read_u32(&self.buffers[1]), expected, "{what}: output");
        assert_all(&self.buffers[4], FILL, &format!("{what}: fill"));
    }
}

fn submit(device: &Device, queue: &Queue, cb: &Arc<dyn CommandBuffer>, table: &[BufferRange]) {
    let done = device.create_semaphore(0);
    queue
        .execute_with_bindings(&[], &[(&done, 1)], &[(cb, table)])
        .unwrap_or_else(|e| panic!("submission: {e}"));
    wait(&done, 1);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn alternating_and_fresh_tables_on_two_queues_are_exact() {
    let device = open(CommandBufferMode::Graph, 2);
    let kernels = Kernels::load(&device);
    let graph = record(&device, &kernels, PatchMethod::Device);
    let cb: Arc<dyn CommandBuffer> = graph.clone();
    let mut rng = Rng::new(seed());
    let sets: Vec<Slots> = (0..3).map(|_| Slots::new(&device, &mut rng)).collect();
    let mut launches = 0;
    for round in 0..300 {
        let queue = device.queue(round % 2);
        if round % 4 == 3 {
            let fresh = Slots::new(&device, &mut rng);
            submit(&device, queue, &cb, &fresh.table());
            fresh.check(&format!("round {round}, fresh"));
        } else {
            let set = &sets[round % 3];
            for b in &set.buffers[1..] {
                poison(b, 0xDEAD_BEEF);
            }
            submit(&device, queue, &cb, &set.table());
            set.check(&format!("round {round}"));
        }
        launches += 1;
    }
    assert_eq!(graph.executable_count(), 2, "one executable per queue");
    assert_eq!(graph.shared_launches(), 0);
    assert_eq!(graph.device_patched_launches(), launches);
    for q in 0..2 {
        assert!(device.queue(q).lost().is_none());
    }
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn host_and_device_patches_interleave_behind_queued_launches() {
    let device = open(CommandBufferMode::Graph, 1);
    let kernels = Kernels::load(&device);
    let queue = device.queue(0);
    let graph = record(&device, &kernels, PatchMethod::Auto);
    let cb: Arc<dyn CommandBuffer> = graph.clone();
    let mut rng = Rng::new(seed());
    let input = Slots::new(&device, &mut rng);
    let scratch = [Slots::new(&device, &mut rng), Slots::new(&device, &mut rng)];
    // Bind everything once, so later launches change only what each round changes.
    submit(&device, queue, &cb, &input.table());
    input.check("first");
    let before = graph.device_patched_launches();

    // A long kernel holds the queue, so the launches below are all queued while the host
    // patches the executable for the next ones: a new output each round changes one kernel
    // node (host), and every third round new scratch slots change CHAIN - 1 (device). More
    // such rounds than the executable has patch lists: once every list is unread, the rest
    // patch on the host.
    let gate = device.create_buffer(BYTES).unwrap();
    let spin = command_buffer(queue, |cb| {
        record_spin_fill(cb, &kernels, 200_000_000, &gate.whole(), 1)
    });
    let done = device.create_semaphore(0);
    queue.execute(&[], &[(&done, 1)], &[&spin]).unwrap();
    let rounds = 3 * (DEVICE_PATCH_RING + 4);
    let outputs: Vec<Arc<Buffer>> = (0..rounds)
        .map(|_| {
            let b = device.create_buffer(BYTES).unwrap();
            poison(&b, 0xDEAD_BEEF);
            b
        })
        .collect();
    let mut device_rounds = 0;
    for (round, output) in outputs.iter().enumerate() {
        let mut table = input.table();
        table[1] = output.whole();
        let s = &scratch[(round / 3) % 2];
        if round % 3 == 0 {
            device_rounds += 1;
        }
        table[2] = s.buffers[2].whole();
        table[3] = s.buffers[3].whole();
        queue
            .execute_with_bindings(&[], &[(&done, round as u64 + 2)], &[(&cb, &table)])
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
    wait(&done, rounds as u64 + 1);
    let expected: Vec<u32> = input.input.iter().map(|w| w.wrapping_add(CHAIN)).collect();
    for (round, output) in outputs.iter().enumerate() {
        assert_eq!(read_u32(output), expected, "round {round}: output");
    }
    let on_device = graph.device_patched_launches() - before;
    println!(
        "{on_device} launches patched on the device, of {device_rounds} that changed the scratch \
         ({DEVICE_PATCH_RING} patch lists)"
    );
    assert!(on_device >= 1 && on_device <= device_rounds);
    assert!(queue.lost().is_none());
}
