//! GPU suite: what Hopper kernels need from a dispatch (`cuhal-command`), on the three kinds
//! (`graph::`, `stream::`, `deferred::` tests): thread-block clusters with distributed shared
//! memory (a compiled-in cluster and one given at launch), a cooperative grid that synchronizes
//! as a whole, a chain of programmatic dependent launches, indirect dispatch with counts written
//! on the device (including zero and out-of-range counts), large dynamic shared memory, and bad
//! attributes refused at recording with the stream healthy afterwards.
//!
//! Outputs are poisoned before every run and resubmittable kinds run twice.

use std::sync::Arc;

use cuhal_command::{
    Buffer, Dispatch, Error, Executable, FillPattern, Function, HostBuffer, KernelArgs,
};
use cuhal_gpu_tests::command_support::*;
use cuhal_gpu_tests::gpu::{Gpu, Rng, seed};
use cuhal_gpu_tests::hopper_kernels::HOPPER_KERNELS;
use cuhal_sys::{CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, PrimaryContext};

struct Env {
    gpu: Gpu,
    stream: Stream,
    rng: Rng,
    kernels: Executable,
    command: Executable,
}

fn env() -> Env {
    let gpu = Gpu::open();
    let stream = stream(gpu.context()).expect("create a stream");
    let kernels =
        Executable::load_ptx(gpu.context(), HOPPER_KERNELS).unwrap_or_else(|e| panic!("{e}"));
    let command =
        Executable::load_ptx(gpu.context(), COMMAND_KERNELS).unwrap_or_else(|e| panic!("{e}"));
    Env {
        gpu,
        stream,
        rng: Rng::new(seed()),
        kernels,
        command,
    }
}

impl Env {
    fn ctx(&self) -> &Arc<PrimaryContext> {
        self.gpu.context()
    }

    fn cb(&self, kind: Kind) -> Recording {
        kind.create(self.ctx(), &self.stream, None)
            .expect("command buffer")
    }

    fn function(&self, name: &str) -> Function {
        self.kernels.function(name).unwrap()
    }

    fn words(&self, words: &[u32]) -> Arc<Buffer> {
        let buffer = Buffer::new(self.ctx(), words.len() * 4).unwrap();
        buffer.write(0, &bytes_of(words)).unwrap();
        buffer
    }

    fn poison(&mut self, buffer: &Buffer) {
        let poison: Vec<u32> = (0..buffer.len() / 4).map(|_| self.rng.next_u32()).collect();
        buffer.write(0, &bytes_of(&poison)).unwrap();
    }

    fn submit(&self, cb: &Recording) {
        submit(cb, &self.stream).unwrap_or_else(|e| panic!("submit: {e}"));
    }
}

/// Generates `graph::NAME`, `stream::NAME` and `deferred::NAME` for each `fn NAME(Kind)`.
macro_rules! on_each_kind {
    ($($test:ident),* $(,)?) => {
        mod graph {
            $(
                #[test]
                #[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
                fn $test() {
                    super::$test(super::Kind::Graph)
                }
            )*
        }
        mod stream {
            $(
                #[test]
                #[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
                fn $test() {
                    super::$test(super::Kind::Stream)
                }
            )*
        }
        mod deferred {
            $(
                #[test]
                #[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
                fn $test() {
                    super::$test(super::Kind::Deferred)
                }
            )*
        }
    };
}

on_each_kind!(
    hopper_clusters_share_memory,
    hopper_cooperative_grid_synchronizes,
    hopper_programmatic_chain_is_exact,
    hopper_indirect_counts_from_the_device,
    hopper_indirect_out_of_range_fails_and_stream_stays_healthy,
    hopper_large_dynamic_shared_memory,
    hopper_bad_attributes_are_refused_at_recording,
);

/// Blocks per cluster test grid.
const CLUSTER_BLOCKS: u32 = 8;

fn hopper_clusters_share_memory(kind: Kind) {
    let mut e = env();
    let compiled = e.function("cluster_swap");
    let any = e.function("cluster_swap_any");
    let out_a = e.words(&[0; 2 * CLUSTER_BLOCKS as usize]);
    let out_b = e.words(&[0; 2 * CLUSTER_BLOCKS as usize]);
    let args_a = KernelArgs::new().with_range(&out_a.whole());
    let args_b = KernelArgs::new().with_range(&out_b.whole());
    let grid = [CLUSTER_BLOCKS, 1, 1];
    for run in 0..if kind.resubmittable() { 2 } else { 1 } {
        e.poison(&out_a);
        e.poison(&out_b);
        let mut cb = e.cb(kind);
        if run == 0 || kind != Kind::Stream {
            cb.dispatch(&Dispatch::new(&compiled, grid, [32, 1, 1], &args_a))
                .unwrap();
            cb.dispatch(&Dispatch::new(&any, grid, [32, 1, 1], &args_b).with_cluster([2, 1, 1]))
                .unwrap();
        }
        cb.end().unwrap();
        e.submit(&cb);
        let expected: Vec<u32> = (0..CLUSTER_BLOCKS)
            .flat_map(|b| {
                let rank = b % 2;
                [(rank ^ 1) * 1000 + (b ^ 1), rank]
            })
            .collect();
        assert_eq!(read_u32(&out_a), expected, "compiled-in cluster, run {run}");
        assert_eq!(
            read_u32(&out_b),
            expected,
            "cluster given at launch, run {run}"
        );
    }
}

fn hopper_cooperative_grid_synchronizes(kind: Kind) {
    let mut e = env();
    let sum = e.function("grid_sum");
    let sms = e
        .ctx()
        .attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .unwrap() as u32;
    let blocks = 2 * sms;
    let slots = e.words(&vec![0; blocks as usize]);
    let counter = e.words(&[0]);
    let out = e.words(&vec![0; blocks as usize]);
    let args = KernelArgs::new()
        .with_range(&slots.whole())
        .with_range(&counter.whole())
        .with_range(&out.whole());
    let mut cb = e.cb(kind);
    // Refused at recording: far more blocks than the device holds at once.
    let too_many = cb
        .dispatch(&Dispatch::new(&sum, [blocks * 1000, 1, 1], [1024, 1, 1], &args).cooperative())
        .unwrap_err();
    assert!(
        matches!(too_many, Error::CooperativeGridTooLarge { .. }),
        "{too_many}"
    );
    e.poison(&out);
    cb.fill(&counter.whole(), FillPattern::U32(0)).unwrap();
    cb.barrier().unwrap();
    cb.dispatch(&Dispatch::new(&sum, [blocks, 1, 1], [128, 1, 1], &args).cooperative())
        .unwrap();
    cb.end().unwrap();
    let expected = 3 * blocks * (blocks - 1) / 2 + blocks;
    for run in 0..if kind.resubmittable() { 2 } else { 1 } {
        if run > 0 {
            e.poison(&out);
            e.submit(&cb);
        } else {
            e.submit(&cb);
        }
        assert_eq!(
            read_u32(&out),
            vec![expected; blocks as usize],
            "every block sees every slot after the grid barrier (run {run})"
        );
    }
}

fn hopper_programmatic_chain_is_exact(kind: Kind) {
    let mut e = env();
    let step = e.function("pdl_step");
    const N: u32 = 1024;
    const STEPS: u32 = 100;
    let start: Vec<u32> = (0..N).map(|_| e.rng.next_u32() >> 1).collect();
    let data = e.words(&start);
    let args = KernelArgs::new().with_range(&data.whole()).with(N);
    let d = Dispatch::new(&step, [N / 256, 1, 1], [256, 1, 1], &args);
    let mut cb = e.cb(kind);
    cb.dispatch(&d).unwrap();
    for _ in 1..STEPS {
        cb.barrier().unwrap();
        cb.dispatch(&d.programmatic()).unwrap();
    }
    cb.end().unwrap();
    e.submit(&cb);
    let after: Vec<u32> = start.iter().map(|v| v + STEPS).collect();
    assert_eq!(read_u32(&data), after, "every step saw the one before");
    if kind.resubmittable() {
        e.submit(&cb);
        let twice: Vec<u32> = start.iter().map(|v| v + 2 * STEPS).collect();
        assert_eq!(read_u32(&data), twice, "second submission");
    }
}

/// Host-mapped flag the gate kernel polls (pinned memory is mapped at the same address under
/// unified addressing).
struct Flag(HostBuffer);

impl Flag {
    fn new(ctx: &Arc<PrimaryContext>) -> Flag {
        let mut flag = HostBuffer::new(ctx, 4).unwrap();
        flag.write(0, &[0; 4]).unwrap();
        Flag(flag)
    }

    fn device(&self) -> u64 {
        self.0.as_ptr() as u64
    }

    fn set(&self, value: u32) {
        set_flag(self.0.as_ptr() as usize, value);
    }

    /// Runs `record` while, for a stream command buffer, another thread sets the flag after
    /// 200 ms; other kinds run nothing before `issue`, so their flag stays clear until the test
    /// sets it. A stream command buffer executes as it records, and the set-up of its indirect
    /// dispatch (the helper's module, the dispatch's graph) may wait for the device's earlier
    /// work, the gate already launched. Returns `record`'s result; whether recording returned
    /// before the flag was set is printed, so the GPU log shows which it was.
    fn record_behind_gate<T>(&self, kind: Kind, record: impl FnOnce() -> T) -> T {
        if kind != Kind::Stream {
            return record();
        }
        let address = self.0.as_ptr() as usize;
        let released = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(200));
                released.store(true, std::sync::atomic::Ordering::SeqCst);
                set_flag(address, 1);
            });
            let started = std::time::Instant::now();
            let out = record();
            let waited = released.load(std::sync::atomic::Ordering::SeqCst);
            eprintln!(
                "stream recording behind the gate took {:?}: {}",
                started.elapsed(),
                if waited {
                    "it waited for the gate (released by the timer)"
                } else {
                    "it returned with the gate still closed"
                }
            );
            out
        })
    }
}

/// Writes `value` to the flag word at `address`.
fn set_flag(address: usize, value: u32) {
    // SAFETY: `address` is a live `Flag`'s 4 bytes of pinned memory (the flag outlives every
    // thread that sets it: `record_behind_gate` joins its thread in a scope); the device only
    // reads it.
    unsafe { std::ptr::write_volatile(address as *mut u32, value) };
}

/// Records: clear hits; gate (polls the flag, then writes `count` to `counts`); barrier;
/// indirect `count_blocks` over `counts`. Returns after `end()`, before the flag is set.
fn record_indirect(
    e: &Env,
    kind: Kind,
    flag: &Flag,
    counts: &Arc<Buffer>,
    hits: &Arc<Buffer>,
    count: [u32; 3],
) -> Recording {
    let gate = e.function("gate_counts");
    let count_blocks = e.function("count_blocks");
    let gate_args = KernelArgs::new()
        .with(flag.device())
        .with_range(&counts.whole())
        .with(count[0])
        .with(count[1])
        .with(count[2]);
    let hit_args = KernelArgs::new().with_range(&hits.whole());
    let mut cb = e.cb(kind);
    cb.fill(&hits.whole(), FillPattern::U32(0)).unwrap();
    cb.dispatch(&Dispatch::new(&gate, [1, 1, 1], [1, 1, 1], &gate_args))
        .unwrap();
    cb.barrier().unwrap();
    cb.dispatch_indirect(
        &Dispatch::new(&count_blocks, [1, 1, 1], [64, 1, 1], &hit_args),
        &counts.whole(),
    )
    .unwrap();
    cb.end().unwrap();
    cb
}

fn hopper_indirect_counts_from_the_device(kind: Kind) {
    let mut e = env();
    for count in [[3, 2, 1], [0, 4, 1], [5, 1, 2], [1, 1, 0]] {
        let flag = Flag::new(e.ctx());
        // Poison a host read would see: the device writes the real counts only after the flag.
        let counts = e.words(&[7, 7, 7]);
        let hits = e.words(&[0; 4]);
        e.poison(&hits);
        let cb = flag.record_behind_gate(kind, || {
            record_indirect(&e, kind, &flag, &counts, &hits, count)
        });
        // SAFETY: the test's stream, live; `cb` outlives the synchronize below.
        unsafe { cb.issue(e.stream.raw()) }.unwrap();
        // Graph and deferred kinds: issue returned while the gate still holds the counts back,
        // so nothing read them on the host. Now let the device write them (a stream command
        // buffer's gate may be open already: see `record_behind_gate`).
        flag.set(1);
        e.stream.synchronize().unwrap();
        cb.check_completed().unwrap();
        let blocks = count.iter().product::<u32>();
        let expected = if blocks == 0 {
            vec![0; 4]
        } else {
            vec![blocks * 64, count[0], count[1], count[2]]
        };
        assert_eq!(read_u32(&hits), expected, "count {count:?}");
        if kind.resubmittable() {
            e.poison(&hits);
            e.submit(&cb);
            cb.check_completed().unwrap();
            assert_eq!(read_u32(&hits), expected, "count {count:?}, again");
        }
    }
}

fn hopper_indirect_out_of_range_fails_and_stream_stays_healthy(kind: Kind) {
    let mut e = env();
    let flag = Flag::new(e.ctx());
    let counts = e.words(&[0, 0, 0]);
    let hits = e.words(&[0; 4]);
    e.poison(&hits);
    let cb = flag.record_behind_gate(kind, || {
        record_indirect(&e, kind, &flag, &counts, &hits, [1, 70_000, 1])
    });
    flag.set(1);
    e.submit(&cb);
    let failure = cb.check_completed().unwrap_err();
    assert!(
        matches!(
            failure,
            Error::IndirectCountOutOfRange {
                dispatch: 0,
                count: [1, 70_000, 1],
                ..
            }
        ),
        "{failure}"
    );
    assert_eq!(cb.check_completed(), Ok(()), "reported once");
    assert_eq!(read_u32(&hits), vec![0; 4], "the dispatch did not run");
    // The stream and context are fine: a good count runs.
    let cb = record_indirect(&e, kind, &flag, &counts, &hits, [2, 2, 2]);
    e.submit(&cb);
    cb.check_completed().unwrap();
    assert_eq!(read_u32(&hits), vec![8 * 64, 2, 2, 2]);
}

fn hopper_large_dynamic_shared_memory(kind: Kind) {
    let mut e = env();
    let reverse = e.command.function(REVERSE_BLOCK_NAME).unwrap();
    let optin = reverse.max_dynamic_shared_memory_optin();
    assert!(
        optin > 200 * 1024,
        "Hopper opts in to about 227 KiB, got {optin}"
    );
    let data: Vec<u32> = (0..512).map(|_| e.rng.next_u32()).collect();
    let buffer = e.words(&data);
    let args = KernelArgs::new().with_range(&buffer.whole());
    let mut cb = e.cb(kind);
    let too_big = cb
        .dispatch(
            &Dispatch::new(&reverse, [4, 1, 1], [128, 1, 1], &args).with_shared_memory(optin + 4),
        )
        .unwrap_err();
    assert!(
        matches!(too_big, Error::SharedMemoryTooLarge { max, .. } if max == optin),
        "{too_big}"
    );
    cb.dispatch(
        &Dispatch::new(&reverse, [4, 1, 1], [128, 1, 1], &args).with_shared_memory(100 * 1024),
    )
    .unwrap();
    assert!(reverse.max_dynamic_shared_memory() >= 100 * 1024);
    cb.end().unwrap();
    e.submit(&cb);
    let reversed: Vec<u32> = data
        .chunks(128)
        .flat_map(|c| c.iter().rev().copied())
        .collect();
    assert_eq!(read_u32(&buffer), reversed);
}

fn hopper_bad_attributes_are_refused_at_recording(kind: Kind) {
    let mut e = env();
    let compiled = e.function("cluster_swap");
    let any = e.function("cluster_swap_any");
    let step = e.function("pdl_step");
    let out = e.words(&[0; 2 * CLUSTER_BLOCKS as usize]);
    let args = KernelArgs::new().with_range(&out.whole());
    let grid = [CLUSTER_BLOCKS, 1, 1];
    let mut cb = e.cb(kind);
    let refused = [
        cb.dispatch(&Dispatch::new(&any, grid, [32, 1, 1], &args).with_cluster([3, 1, 1])),
        cb.dispatch(&Dispatch::new(&any, [16, 1, 1], [32, 1, 1], &args).with_cluster([16, 1, 1])),
        cb.dispatch(&Dispatch::new(&compiled, grid, [32, 1, 1], &args).with_cluster([4, 1, 1])),
        cb.dispatch(&Dispatch::new(&compiled, [3, 1, 1], [32, 1, 1], &args)),
        cb.dispatch(&Dispatch::new(&any, grid, [32, 1, 1], &args).with_priority(1000)),
        cb.dispatch(
            &Dispatch::new(
                &step,
                [1, 1, 1],
                [32, 1, 1],
                &KernelArgs::new().with(0u64).with(0u32),
            )
            .programmatic(),
        ),
    ];
    for (i, r) in refused.iter().enumerate() {
        let e = r.as_ref().expect_err("refused");
        assert!(
            matches!(
                e,
                Error::BadCluster { .. }
                    | Error::ClusterTooLarge { .. }
                    | Error::BadPriority { .. }
                    | Error::NoProgrammaticPredecessor { .. }
            ),
            "case {i}: {e}"
        );
    }
    // Nothing was recorded by the refusals; a good dispatch runs.
    e.poison(&out);
    cb.dispatch(&Dispatch::new(&any, grid, [32, 1, 1], &args).with_cluster([2, 1, 1]))
        .unwrap();
    cb.end().unwrap();
    e.submit(&cb);
    assert_eq!(read_u32(&out)[1], 0, "block 0 is cluster rank 0");
    assert_eq!(read_u32(&out)[0], 1000 + 1);
}
