//! GPU suite: command buffers (`cuhal-command`).
//!
//! Every behaviour runs on the three kinds (the `graph::`, `stream::` and `deferred::` tests):
//! copies, fills, updates, dispatches, resubmission, a 1000-node group between two barriers,
//! and rejected input. Data is fresh random each run (the seed is printed) and every output is
//! poisoned before it is checked; resubmittable kinds are poisoned and run a second time, so a
//! result left over from the first run cannot pass for the second.

use std::sync::{Arc, Mutex};

use cuhal_command::{
    Buffer, BufferRange, CommandBuffer, CommandBufferState, CommandRecorder, Dispatch, Error,
    Executable, FillPattern, Function, GraphCommandBuffer, HostBuffer, KernelArgs, Verbosity,
    ZoneRecorder,
};
use cuhal_gpu_tests::command_support::*;
use cuhal_gpu_tests::gpu::{Gpu, Rng, seed};
use cuhal_gpu_tests::kernels::{BAD_PTX, BAD_PTX_TOKEN};
use cuhal_sys::{CUevent, CUresult, PrimaryContext};

/// Counts the calling thread's heap allocations, to show that issuing allocates nothing.
struct CountingAllocator;

thread_local! {
    static ALLOCATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

// SAFETY: forwards to the system allocator unchanged; the counter is a const-initialized
// thread-local without a destructor, so touching it never allocates or re-enters.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's layout contract is passed on.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from `alloc` above, i.e. from the system allocator.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: as for alloc and dealloc.
        unsafe { std::alloc::System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn allocations() -> u64 {
    ALLOCATIONS.with(|c| c.get())
}

struct Env {
    gpu: Gpu,
    stream: Stream,
    rng: Rng,
    kernels: Executable,
}

fn env() -> Env {
    let gpu = Gpu::open();
    let stream = stream(gpu.context()).expect("create a stream");
    let kernels =
        Executable::load_ptx(gpu.context(), COMMAND_KERNELS).unwrap_or_else(|e| panic!("{e}"));
    Env {
        gpu,
        stream,
        rng: Rng::new(seed()),
        kernels,
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

    fn random(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.rng.next_u64().to_ne_bytes());
        }
        out.truncate(len);
        out
    }

    fn random_u32(&mut self, len: usize) -> Vec<u32> {
        (0..len).map(|_| self.rng.next_u32()).collect()
    }

    /// A buffer holding `data`.
    fn buffer_with(&self, data: &[u8]) -> Arc<Buffer> {
        let buffer = Buffer::new(self.ctx(), data.len()).unwrap();
        buffer.write(0, data).unwrap();
        buffer
    }

    /// A buffer of random poison, and the poison.
    fn poisoned(&mut self, len: usize) -> (Arc<Buffer>, Vec<u8>) {
        let poison = self.random(len);
        (self.buffer_with(&poison), poison)
    }

    fn submit(&self, cb: &Recording) {
        submit(cb, &self.stream).unwrap_or_else(|e| panic!("submit: {e}"));
    }

    /// Submits, checks; for a resubmittable kind, resets the data and does both again.
    fn run_and_check(&self, cb: &Recording, reset: impl Fn(), check: impl Fn(&str)) {
        self.submit(cb);
        check("first submission");
        if cb.kind().resubmittable() {
            reset();
            self.submit(cb);
            check("second submission");
        }
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
    create_end_and_submit_empty,
    copy_whole_buffer,
    copy_sub_buffers_with_offsets,
    fill_with_1_2_and_4_byte_patterns,
    update_whole_buffer_offsets_and_sub_spans,
    dispatch_with_constants_and_buffers,
    several_entry_points_in_one_module,
    dispatch_over_many_blocks,
    same_command_buffer_submitted_1000_times,
    a_thousand_nodes_between_two_barriers,
    bad_input_is_a_clear_error_and_no_gpu_work,
    tracing_zones_record_real_events,
);

/// An empty command buffer of each kind ends and runs; graph and deferred ones run again. What
/// a queue or `issue` would refuse (a recording not ended, a stream command buffer) is not a
/// `CommandBuffer` at all: compile-fail doctests in `cuhal-command` and `cuhal` keep it so.
fn create_end_and_submit_empty(kind: Kind) {
    let e = env();
    let mut cb = e.cb(kind);
    assert_eq!(cb.state(), CommandBufferState::Recording);
    cb.barrier().unwrap();
    cb.end().unwrap();
    assert_eq!(cb.state(), CommandBufferState::Ended);
    assert_eq!(cb.ended().is_some(), kind != Kind::Stream);
    e.submit(&cb);
    if kind.resubmittable() {
        e.submit(&cb);
        e.submit(&cb);
    }
}

fn copy_whole_buffer(kind: Kind) {
    let mut e = env();
    let n = 64 * 1024 + 3;
    let data = e.random(n);
    let src = e.buffer_with(&data);
    let (dst, _) = e.poisoned(n);
    let mut cb = e.cb(kind);
    cb.copy(&src.whole(), &dst.whole()).unwrap();
    cb.end().unwrap();
    let poison = e.random(n);
    e.run_and_check(
        &cb,
        || dst.write(0, &poison).unwrap(),
        |when| assert!(read(&dst) == data, "{when}: destination differs"),
    );
}

fn copy_sub_buffers_with_offsets(kind: Kind) {
    let mut e = env();
    let data = e.random(1000);
    let src = e.buffer_with(&data);
    let (dst, poison) = e.poisoned(1000);
    let mut cb = e.cb(kind);
    cb.copy(&src.range(13, 501).unwrap(), &dst.range(200, 501).unwrap())
        .unwrap();
    // A sub-range of a sub-range.
    let nested = src.range(600, 300).unwrap().sub(7, 100).unwrap();
    assert_eq!(nested.offset(), 607);
    cb.copy(&nested, &dst.range(800, 100).unwrap()).unwrap();
    // One byte, at the very ends.
    cb.copy(&src.range(999, 1).unwrap(), &dst.range(0, 1).unwrap())
        .unwrap();
    cb.end().unwrap();
    let mut expected = poison.clone();
    expected[200..701].copy_from_slice(&data[13..514]);
    expected[800..900].copy_from_slice(&data[607..707]);
    expected[0] = data[999];
    e.run_and_check(
        &cb,
        || dst.write(0, &poison).unwrap(),
        |when| assert_eq!(read(&dst), expected, "{when}"),
    );
}

fn fill_with_1_2_and_4_byte_patterns(kind: Kind) {
    let mut e = env();
    let (buffer, poison) = e.poisoned(16 * 1024);
    let b8 = e.rng.next_u32() as u8;
    let b16 = e.rng.next_u32() as u16;
    let b32 = e.rng.next_u32();
    // Disjoint ranges with gaps between them, so untouched bytes sit on both sides of each.
    let fills: Vec<(usize, usize, FillPattern)> = vec![
        (3, 1, FillPattern::U8(b8)),
        (10, 5, FillPattern::U8(b8 ^ 0x11)),
        (21, 2, FillPattern::U8(b8 ^ 0x22)),
        (30, 4, FillPattern::U8(b8 ^ 0x33)),
        (37, 5000, FillPattern::U8(b8 ^ 0x44)),
        (6002, 2, FillPattern::U16(b16)),
        (6010, 4, FillPattern::U16(b16 ^ 0x1111)),
        (6020, 10, FillPattern::U16(b16 ^ 0x2222)),
        (6034, 4000, FillPattern::U16(b16 ^ 0x3333)),
        (10100, 4, FillPattern::U32(b32)),
        (10112, 8, FillPattern::U32(b32 ^ 0x1111_1111)),
        (10124, 20, FillPattern::U32(b32 ^ 0x2222_2222)),
        (10200, 4096, FillPattern::U32(b32 ^ 0x3333_3333)),
    ];
    let mut cb = e.cb(kind);
    let mut expected = poison.clone();
    for &(offset, size, pattern) in &fills {
        cb.fill(&buffer.range(offset, size).unwrap(), pattern)
            .unwrap_or_else(|err| panic!("fill {offset}+{size}: {err}"));
        let bytes = match pattern {
            FillPattern::U8(v) => vec![v],
            FillPattern::U16(v) => v.to_ne_bytes().to_vec(),
            FillPattern::U32(v) => v.to_ne_bytes().to_vec(),
        };
        for (i, byte) in expected[offset..offset + size].iter_mut().enumerate() {
            *byte = bytes[i % bytes.len()];
        }
    }
    cb.end().unwrap();
    e.run_and_check(
        &cb,
        || buffer.write(0, &poison).unwrap(),
        |when| {
            let got = read(&buffer);
            if let Some(i) = (0..got.len()).find(|&i| got[i] != expected[i]) {
                panic!(
                    "{when}: byte {i} is {:#x}, expected {:#x} (poison {:#x})",
                    got[i], expected[i], poison[i]
                );
            }
        },
    );
}

fn update_whole_buffer_offsets_and_sub_spans(kind: Kind) {
    let mut e = env();
    let (buffer, poison) = e.poisoned(4096);

    // The whole buffer; the host bytes are changed after recording, which must not matter.
    let mut data = e.random(4096);
    let original = data.clone();
    let mut cb = e.cb(kind);
    cb.update(&buffer.whole(), &data).unwrap();
    cb.end().unwrap();
    data.iter_mut().for_each(|b| *b = !*b);
    e.run_and_check(
        &cb,
        || buffer.write(0, &poison).unwrap(),
        |when| assert!(read(&buffer) == original, "{when}: whole update differs"),
    );

    // Offsets and sub-spans of the host data.
    buffer.write(0, &poison).unwrap();
    let host = e.random(3000);
    let mut cb = e.cb(kind);
    cb.update(&buffer.range(3, 7).unwrap(), &host[0..7])
        .unwrap();
    cb.update(&buffer.range(100, 1).unwrap(), &host[7..8])
        .unwrap();
    cb.update(&buffer.range(1001, 2000).unwrap(), &host[10..2010])
        .unwrap();
    cb.update(&buffer.range(4095, 1).unwrap(), &host[2999..3000])
        .unwrap();
    cb.end().unwrap();
    let mut expected = poison.clone();
    expected[3..10].copy_from_slice(&host[0..7]);
    expected[100] = host[7];
    expected[1001..3001].copy_from_slice(&host[10..2010]);
    expected[4095] = host[2999];
    e.run_and_check(
        &cb,
        || buffer.write(0, &poison).unwrap(),
        |when| assert!(read(&buffer) == expected, "{when}: partial updates differ"),
    );
}

fn scale_add_args(out: &BufferRange, input: &BufferRange, a: u32, b: u32, n: u32) -> KernelArgs {
    KernelArgs::new()
        .with_range(out)
        .with_range(input)
        .with(a)
        .with(b)
        .with(n)
}

fn check_scale_add(when: &str, out: &[u32], input: &[u32], a: u32, b: u32, poison: &[u32]) {
    let n = input.len();
    for i in 0..n {
        let want = input[i].wrapping_mul(a).wrapping_add(b);
        assert_eq!(out[i], want, "{when}: element {i} of {n}");
    }
    if !poison.is_empty() {
        assert_eq!(&out[n..], &poison[n..], "{when}: past the end");
    }
}

fn dispatch_with_constants_and_buffers(kind: Kind) {
    let mut e = env();
    let n = 10_000usize;
    let input = e.random_u32(n);
    let (a, b) = (e.rng.next_u32() | 1, e.rng.next_u32());
    let in_buf = e.buffer_with(&bytes_of(&input));
    let (out_buf, poison) = e.poisoned((n + 16) * 4);
    let poison_words = bytes_to_u32(&poison);
    let f = e.function(SCALE_ADD_NAME);
    let args = scale_add_args(&out_buf.whole(), &in_buf.whole(), a, b, n as u32);
    let mut cb = e.cb(kind);
    cb.dispatch(&Dispatch::new(
        &f,
        [(n as u32).div_ceil(128), 1, 1],
        [128, 1, 1],
        &args,
    ))
    .unwrap();
    cb.end().unwrap();
    e.run_and_check(
        &cb,
        || out_buf.write(0, &poison).unwrap(),
        |when| check_scale_add(when, &read_u32(&out_buf), &input, a, b, &poison_words),
    );
}

fn bytes_to_u32(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

fn several_entry_points_in_one_module(kind: Kind) {
    let mut e = env();
    let scale = e.function(SCALE_ADD_NAME);
    let mixed = e.function(MIXED_ARGS_NAME);
    let add_one = e.function(ADD_ONE_NAME);
    let reverse = e.function(REVERSE_BLOCK_NAME);

    // scale_add
    let n = 300usize;
    let input = e.random_u32(n);
    let (a, b) = (e.rng.next_u32(), e.rng.next_u32());
    let in_buf = e.buffer_with(&bytes_of(&input));
    let (out_buf, out_poison) = e.poisoned((n + 4) * 4);
    let scale_args = scale_add_args(&out_buf.whole(), &in_buf.whole(), a, b, n as u32);

    // mixed_args: every size and alignment of argument.
    let c = e.rng.next_u32() as u8;
    let x = e.rng.next_u64();
    let s = e.rng.next_u32() as u16;
    let w = e.rng.next_u32();
    let f = (e.rng.next_u32() >> 8) as f32 / 7.0;
    let (mixed_buf, mixed_poison) = e.poisoned(5 * 8);
    let mixed_args = KernelArgs::new()
        .with_range(&mixed_buf.whole())
        .with(c)
        .with(x)
        .with(s)
        .with(w)
        .with(f);

    // add_one over 100 elements in blocks of 64.
    let counts = e.random_u32(100);
    let counts_buf = e.buffer_with(&bytes_of(&counts));
    let add_args = KernelArgs::new()
        .with_range(&counts_buf.whole())
        .with(100u32);

    // reverse_block: 4 blocks of 128, through 512 bytes of dynamic shared memory.
    let blocks = e.random_u32(4 * 128);
    let blocks_buf = e.buffer_with(&bytes_of(&blocks));
    let reverse_args = KernelArgs::new().with_range(&blocks_buf.whole());

    let mut cb = e.cb(kind);
    cb.begin_debug_group("entry points").unwrap();
    cb.dispatch(&Dispatch::new(&scale, [3, 1, 1], [128, 1, 1], &scale_args))
        .unwrap();
    cb.dispatch(&Dispatch::new(&mixed, [1, 1, 1], [1, 1, 1], &mixed_args))
        .unwrap();
    cb.barrier().unwrap();
    cb.dispatch(&Dispatch::new(&add_one, [2, 1, 1], [64, 1, 1], &add_args))
        .unwrap();
    cb.dispatch(
        &Dispatch::new(&reverse, [4, 1, 1], [128, 1, 1], &reverse_args).with_shared_memory(512),
    )
    .unwrap();
    cb.end_debug_group().unwrap();
    cb.end().unwrap();

    let reset = || {
        out_buf.write(0, &out_poison).unwrap();
        mixed_buf.write(0, &mixed_poison).unwrap();
        counts_buf.write(0, &bytes_of(&counts)).unwrap();
        blocks_buf.write(0, &bytes_of(&blocks)).unwrap();
    };
    e.run_and_check(&cb, reset, |when| {
        check_scale_add(
            when,
            &read_u32(&out_buf),
            &input,
            a,
            b,
            &bytes_to_u32(&out_poison),
        );
        let got: Vec<u64> = read(&mixed_buf)
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(
            got,
            [
                u64::from(c),
                x,
                u64::from(s),
                u64::from(w),
                u64::from(f.to_bits())
            ],
            "{when}: mixed_args"
        );
        let added: Vec<u32> = counts.iter().map(|v| v.wrapping_add(1)).collect();
        assert_eq!(read_u32(&counts_buf), added, "{when}: add_one");
        let reversed: Vec<u32> = blocks
            .chunks(128)
            .flat_map(|chunk| chunk.iter().rev().copied())
            .collect();
        assert_eq!(read_u32(&blocks_buf), reversed, "{when}: reverse_block");
    });
}

fn dispatch_over_many_blocks(kind: Kind) {
    let mut e = env();
    let n = (1usize << 20) + 37;
    let input = e.random_u32(n);
    let (a, b) = (e.rng.next_u32(), e.rng.next_u32());
    let in_buf = e.buffer_with(&bytes_of(&input));
    let (out_buf, poison) = e.poisoned((n + 64) * 4);
    let f = e.function(SCALE_ADD_NAME);
    let args = scale_add_args(&out_buf.whole(), &in_buf.whole(), a, b, n as u32);
    let grid = (n as u32).div_ceil(256);
    assert_eq!(grid, 4097);
    let mut cb = e.cb(kind);
    cb.dispatch(&Dispatch::new(&f, [grid, 1, 1], [256, 1, 1], &args))
        .unwrap();
    cb.end().unwrap();
    let poison_words = bytes_to_u32(&poison);
    e.run_and_check(
        &cb,
        || out_buf.write(0, &poison).unwrap(),
        |when| check_scale_add(when, &read_u32(&out_buf), &input, a, b, &poison_words),
    );
}

fn same_command_buffer_submitted_1000_times(kind: Kind) {
    let mut e = env();
    let n = 4096usize;
    let input = e.random_u32(n);
    let (a, b) = (e.rng.next_u32(), e.rng.next_u32());
    let in_buf = e.buffer_with(&bytes_of(&input));
    let (out_buf, poison) = e.poisoned((n + 4) * 4);
    let start = e.rng.next_u32();
    let counter = e.buffer_with(&start.to_ne_bytes());
    let scale = e.function(SCALE_ADD_NAME);
    let add_one = e.function(ADD_ONE_NAME);
    let scale_args = scale_add_args(&out_buf.whole(), &in_buf.whole(), a, b, n as u32);
    let count_args = KernelArgs::new().with_range(&counter.whole()).with(1u32);
    let record = |cb: &mut Recording| {
        cb.dispatch(&Dispatch::new(
            &scale,
            [(n as u32).div_ceil(256), 1, 1],
            [256, 1, 1],
            &scale_args,
        ))
        .unwrap();
        cb.barrier().unwrap();
        cb.dispatch(&Dispatch::new(&add_one, [1, 1, 1], [1, 1, 1], &count_args))
            .unwrap();
        cb.end().unwrap();
    };
    const TIMES: u32 = 1000;
    if kind.resubmittable() {
        let mut cb = e.cb(kind);
        record(&mut cb);
        for _ in 0..TIMES {
            // SAFETY: the fixture's stream is live and of the command buffer's context.
            unsafe { cb.issue(e.stream.raw()) }.unwrap();
        }
    } else {
        // One shot: record (and so run) a fresh one each time.
        for _ in 0..TIMES {
            let mut cb = e.cb(kind);
            record(&mut cb);
            // SAFETY: as above.
            unsafe { cb.issue(e.stream.raw()) }.unwrap();
        }
    }
    e.stream.synchronize().unwrap();
    assert_eq!(
        read_u32(&counter),
        [start.wrapping_add(TIMES)],
        "every submission ran once"
    );
    check_scale_add(
        "after 1000 submissions",
        &read_u32(&out_buf),
        &input,
        a,
        b,
        &bytes_to_u32(&poison),
    );
}

/// Records 1000 independent commands (fills and updates, alternating) between two barriers,
/// then a copy of the whole result, which must see all 1000 (the caller ends it).
fn record_thousand(
    cb: &mut dyn CommandRecorder,
    slots: &Arc<Buffer>,
    out: &Arc<Buffer>,
    values: &[u32],
) {
    cb.barrier().unwrap();
    for (i, &v) in values.iter().enumerate() {
        let range = slots.range(4 * i, 4).unwrap();
        if i % 2 == 0 {
            cb.fill(&range, FillPattern::U32(v)).unwrap();
        } else {
            cb.update(&range, &v.to_ne_bytes()).unwrap();
        }
    }
    cb.barrier().unwrap();
    cb.copy(&slots.whole(), &out.whole()).unwrap();
}

fn a_thousand_nodes_between_two_barriers(kind: Kind) {
    let mut e = env();
    let values = e.random_u32(1000);
    let (slots, slot_poison) = e.poisoned(4000);
    let (out, out_poison) = e.poisoned(4000);
    let mut cb = e.cb(kind);
    record_thousand(&mut *cb, &slots, &out, &values);
    cb.end().unwrap();
    e.run_and_check(
        &cb,
        || {
            slots.write(0, &slot_poison).unwrap();
            out.write(0, &out_poison).unwrap();
        },
        |when| assert_eq!(read_u32(&out), values, "{when}"),
    );
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn graph_joins_a_wide_group_with_one_empty_node() {
    let mut e = env();
    let values = e.random_u32(1000);
    let (slots, _) = e.poisoned(4000);
    let (out, _) = e.poisoned(4000);
    let mut cb = GraphCommandBuffer::new(e.ctx(), None).unwrap();
    record_thousand(&mut cb, &slots, &out, &values);
    let cb = cb.end().unwrap();
    // 1000 commands, one join, one copy: no node per barrier, no limit on width.
    assert_eq!(cb.node_count(), 1002);
    // SAFETY: the fixture's stream, live, of the graph's context.
    unsafe { cb.launch(e.stream.raw()) }.unwrap();
    e.stream.synchronize().unwrap();
    assert_eq!(read_u32(&out), values);
}

fn bad_input_is_a_clear_error_and_no_gpu_work(kind: Kind) {
    let mut e = env();
    let (buffer, poison) = e.poisoned(256);
    let start = e.rng.next_u32();
    let counter = e.buffer_with(&start.to_ne_bytes());
    let add_one = e.function(ADD_ONE_NAME);
    let reverse = e.function(REVERSE_BLOCK_NAME);
    let wide = e.random_u32(64);
    let wide_buf = e.buffer_with(&bytes_of(&wide));
    let wide_args = KernelArgs::new().with_range(&wide_buf.whole());

    // Ranges are checked when made.
    assert_eq!(
        buffer.range(200, 57).unwrap_err(),
        Error::OutOfBounds {
            offset: 200,
            length: 57,
            capacity: 256
        }
    );
    assert!(matches!(
        buffer.range(usize::MAX, 2),
        Err(Error::RangeOverflow { .. })
    ));
    assert_eq!(
        buffer.range(0, 128).unwrap().sub(100, 29).unwrap_err(),
        Error::OutOfBounds {
            offset: 100,
            length: 29,
            capacity: 128
        }
    );

    let mut cb = e.cb(kind);
    // Commands are checked when recorded; none of these reaches the GPU.
    let err = cb
        .fill(&buffer.range(2, 8).unwrap(), FillPattern::U32(0))
        .unwrap_err();
    assert_eq!(
        err,
        Error::Misaligned {
            what: "fill offset",
            value: 2,
            alignment: 4
        }
    );
    assert!(err.to_string().contains("not a multiple of 4"), "{err}");
    assert!(matches!(
        cb.fill(&buffer.range(4, 6).unwrap(), FillPattern::U32(0)),
        Err(Error::Misaligned {
            what: "fill length",
            ..
        })
    ));
    assert!(matches!(
        cb.fill(&buffer.range(1, 2).unwrap(), FillPattern::U16(0)),
        Err(Error::Misaligned { .. })
    ));
    assert_eq!(
        cb.fill(&buffer.range(5, 0).unwrap(), FillPattern::U8(0)),
        Err(Error::ZeroSize { what: "fill" })
    );
    assert!(matches!(
        cb.copy(
            &buffer.range(0, 64).unwrap(),
            &buffer.range(32, 64).unwrap()
        ),
        Err(Error::OverlappingCopy { length: 64, .. })
    ));
    assert!(matches!(
        cb.update(&buffer.range(0, 4).unwrap(), &[1, 2]),
        Err(Error::LengthMismatch { .. })
    ));
    let args = KernelArgs::new().with_range(&counter.whole()).with(1u32);
    let err = cb
        .dispatch(&Dispatch::new(&add_one, [1, 1, 1], [128, 1, 1], &args))
        .unwrap_err();
    assert_eq!(
        err,
        Error::BlockTooLarge {
            function: ADD_ONE_NAME.into(),
            block: [128, 1, 1],
            max_threads: ADD_ONE_MAX_THREADS
        }
    );
    assert!(err.to_string().contains(ADD_ONE_NAME), "{err}");
    assert!(matches!(
        cb.dispatch(&Dispatch::new(&add_one, [1, 1, 1], [65, 1, 1], &args)),
        Err(Error::BlockTooLarge { .. })
    ));
    assert!(matches!(
        cb.dispatch(&Dispatch::new(&add_one, [0, 1, 1], [1, 1, 1], &args)),
        Err(Error::BadDimension { what: "grid", .. })
    ));
    let reverse_args = KernelArgs::new().with_range(&buffer.whole());
    // Up to the device's opt-in maximum a dispatch raises the function's limit (below); one
    // byte more than the device allows is refused before the driver sees it.
    let device_max = reverse.max_dynamic_shared_memory_optin();
    let default_max = reverse.max_dynamic_shared_memory();
    assert!(device_max > default_max, "{device_max} <= {default_max}");
    let err = cb
        .dispatch(
            &Dispatch::new(&reverse, [1, 1, 1], [64, 1, 1], &reverse_args)
                .with_shared_memory(device_max + 1),
        )
        .unwrap_err();
    assert_eq!(
        err,
        Error::SharedMemoryTooLarge {
            function: REVERSE_BLOCK_NAME.into(),
            requested: device_max + 1,
            max: device_max
        }
    );
    assert_eq!(
        reverse.max_dynamic_shared_memory(),
        default_max,
        "raised by a refused dispatch"
    );
    // Arguments that do not match the kernel's parameters, as the driver reports them: the
    // launch would read past what was given.
    assert_eq!(add_one.parameter_sizes(), Some(&[8, 4][..]));
    let too_few = KernelArgs::new().with_range(&counter.whole());
    assert!(matches!(
        cb.dispatch(&Dispatch::new(&add_one, [1, 1, 1], [1, 1, 1], &too_few)),
        Err(Error::ArgumentMismatch {
            index: None,
            expected: 2,
            found: 1,
            ..
        })
    ));
    let too_wide = KernelArgs::new().with_range(&counter.whole()).with(1u64);
    assert!(matches!(
        cb.dispatch(&Dispatch::new(&add_one, [1, 1, 1], [1, 1, 1], &too_wide)),
        Err(Error::ArgumentMismatch {
            index: Some(1),
            expected: 4,
            found: 8,
            ..
        })
    ));
    assert_eq!(cb.state(), CommandBufferState::Recording);

    // The valid commands still work: the largest block allowed, and one small fill.
    cb.dispatch(&Dispatch::new(
        &add_one,
        [1, 1, 1],
        [ADD_ONE_MAX_THREADS, 1, 1],
        &args,
    ))
    .unwrap();
    cb.fill(&buffer.range(10, 3).unwrap(), FillPattern::U8(0x5a))
        .unwrap();
    // Above the function's default limit but within the device's maximum: the limit is raised
    // and the dispatch runs (reverse_block on its own buffer, 64 values).
    cb.dispatch(
        &Dispatch::new(&reverse, [1, 1, 1], [64, 1, 1], &wide_args)
            .with_shared_memory(default_max + 1),
    )
    .unwrap();
    assert!(reverse.max_dynamic_shared_memory() > default_max);
    cb.end().unwrap();

    // Recording after end.
    let ended = |operation| Error::InvalidState {
        operation,
        state: CommandBufferState::Ended,
    };
    assert_eq!(
        cb.fill(&buffer.range(0, 4).unwrap(), FillPattern::U8(1)),
        Err(ended("fill"))
    );
    assert_eq!(
        cb.update(&buffer.range(0, 1).unwrap(), &[1]),
        Err(ended("update"))
    );
    assert_eq!(
        cb.copy(&buffer.range(0, 4).unwrap(), &buffer.range(8, 4).unwrap()),
        Err(ended("copy"))
    );
    assert_eq!(
        cb.dispatch(&Dispatch::new(&add_one, [1, 1, 1], [1, 1, 1], &args)),
        Err(ended("dispatch"))
    );
    assert_eq!(cb.barrier(), Err(ended("barrier")));
    assert_eq!(cb.end(), Err(ended("end")));

    e.submit(&cb);
    let mut expected = poison.clone();
    expected[10..13].fill(0x5a);
    assert_eq!(read(&buffer), expected, "only the valid fill ran");
    assert_eq!(read_u32(&counter), [start.wrapping_add(1)]);
    let reversed: Vec<u32> = wide.iter().rev().copied().collect();
    assert_eq!(
        read_u32(&wide_buf),
        reversed,
        "the dispatch above the default limit ran"
    );
}

/// A zone recorder that makes a real timing event for every zone edge, like the tracing
/// crate's pool, and remembers each zone's pair.
struct EventZones {
    context: Arc<PrimaryContext>,
    verbosity: Verbosity,
    state: Mutex<ZoneLog>,
}

#[derive(Default)]
struct ZoneLog {
    open: Vec<(String, CUevent)>,
    closed: Vec<(String, CUevent, CUevent)>,
    events: Vec<cuhal_sys::Event>,
}

// SAFETY: the raw events are only used under the mutex or after the command buffers that
// record them have completed; CUDA events may be used from any thread.
unsafe impl Send for EventZones {}
// SAFETY: as above.
unsafe impl Sync for EventZones {}

impl EventZones {
    fn event(&self, log: &mut ZoneLog) -> CUevent {
        // Default flags: timing enabled.
        let event = cuhal_sys::Event::new(&self.context, 0).unwrap();
        let raw = event.raw();
        log.events.push(event);
        raw
    }
}

// SAFETY: every event is created here with cuEventCreate (timing enabled) in the command
// buffer's context and destroyed only when the recorder drops.
unsafe impl ZoneRecorder for EventZones {
    fn verbosity(&self) -> Verbosity {
        self.verbosity
    }
    fn begin_zone(&self, name: &str) -> Option<CUevent> {
        let mut log = self.state.lock().unwrap();
        let event = self.event(&mut log);
        log.open.push((name.to_owned(), event));
        Some(event)
    }
    fn end_zone(&self) -> Option<CUevent> {
        let mut log = self.state.lock().unwrap();
        let event = self.event(&mut log);
        let (name, begin) = log.open.pop().expect("balanced zones");
        log.closed.push((name, begin, event));
        Some(event)
    }
}

fn tracing_zones_record_real_events(kind: Kind) {
    let mut e = env();
    let zones = Arc::new(EventZones {
        context: Arc::clone(e.ctx()),
        verbosity: Verbosity::Fine,
        state: Mutex::default(),
    });
    let n = 1 << 16;
    let input = e.random_u32(n);
    let in_buf = e.buffer_with(&bytes_of(&input));
    let (out_buf, poison) = e.poisoned(n * 4);
    let f = e.function(SCALE_ADD_NAME);
    let args = scale_add_args(&out_buf.whole(), &in_buf.whole(), 3, 1, n as u32);
    let mut cb = kind
        .create(e.ctx(), &e.stream, Some(zones.clone()))
        .unwrap();
    cb.begin_debug_group("work").unwrap();
    cb.fill(&out_buf.whole(), FillPattern::U32(0)).unwrap();
    cb.barrier().unwrap();
    cb.dispatch(&Dispatch::new(
        &f,
        [(n as u32).div_ceil(256), 1, 1],
        [256, 1, 1],
        &args,
    ))
    .unwrap();
    cb.end_debug_group().unwrap();
    cb.end().unwrap();
    // The ended graph or deferred command buffer carries the recorder to the submission; a
    // stream command buffer ran as it was recorded, is no `CommandBuffer`, and its zones went
    // to the recorder directly (checked below).
    assert_eq!(cb.zones().is_some(), cb.kind() != Kind::Stream);
    e.run_and_check(
        &cb,
        || out_buf.write(0, &poison).unwrap(),
        |when| {
            check_scale_add(when, &read_u32(&out_buf), &input, 3, 1, &[]);
            let log = zones.state.lock().unwrap();
            assert!(log.open.is_empty(), "zones balanced");
            let names: Vec<&str> = log.closed.iter().map(|z| z.0.as_str()).collect();
            // Only a stream command buffer has a whole-buffer zone of its own: graph and
            // deferred ones are timed by the queue's submission.
            let whole = format!("{} command buffer", kind_name(kind));
            let mut expected = vec!["fill", SCALE_ADD_NAME, "work"];
            if kind == Kind::Stream {
                expected.push(whole.as_str());
            }
            assert_eq!(names, expected);
            let api = e.ctx().api();
            for (name, begin, end) in &log.closed {
                // SAFETY: both events are live timing events, recorded by the completed
                // submission.
                let ms = unsafe { cuhal_sys::elapsed_ms(api, *begin, *end) }
                    .unwrap_or_else(|e| panic!("{when}: zone {name}: {e}"))
                    .unwrap_or_else(|| panic!("{when}: zone {name} not complete"));
                assert!(ms >= 0.0, "{when}: zone {name} took {ms} ms");
            }
        },
    );
    drop(cb);
    assert_eq!(
        Arc::strong_count(&zones),
        1,
        "the command buffer released it"
    );
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Graph => "graph",
        Kind::Stream => "stream",
        Kind::Deferred => "deferred",
    }
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn a_graph_may_be_dropped_while_its_launch_runs() {
    let mut e = env();
    let n = 1usize << 22;
    let input = e.random_u32(n);
    let in_buf = e.buffer_with(&bytes_of(&input));
    let (out_buf, _) = e.poisoned(n * 4);
    let f = e.function(SCALE_ADD_NAME);
    let args = scale_add_args(&out_buf.whole(), &in_buf.whole(), 5, 7, n as u32);
    let mut cb = GraphCommandBuffer::new(e.ctx(), None).unwrap();
    // Long enough to still run when the graph is dropped.
    for _ in 0..50 {
        cb.dispatch(&Dispatch::new(
            &f,
            [(n as u32).div_ceil(256), 1, 1],
            [256, 1, 1],
            &args,
        ))
        .unwrap();
        cb.barrier().unwrap();
    }
    let cb = cb.end().unwrap();
    // SAFETY: the fixture's stream, live.
    unsafe { cb.launch(e.stream.raw()) }.unwrap();
    drop(cb);
    e.stream.synchronize().unwrap();
    check_scale_add("after drop", &read_u32(&out_buf), &input, 5, 7, &[]);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn bad_ptx_fails_with_the_jit_log() {
    let gpu = Gpu::open();
    let err = Executable::load_ptx(gpu.context(), BAD_PTX).unwrap_err();
    let Error::ModuleLoad { source, log } = &err else {
        panic!("expected a module load error, got {err:?}");
    };
    println!("{err}");
    assert!(log.contains(BAD_PTX_TOKEN), "JIT log: {log:?}");
    assert!(source.result().is_some(), "{source:?}");
    assert!(err.to_string().contains(log.as_str()));
    assert!(!err.is_sticky(), "a compile error keeps the context");
    // The context still works.
    Executable::load_ptx(gpu.context(), COMMAND_KERNELS).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn bad_cubin_is_an_error() {
    let gpu = Gpu::open();
    assert!(matches!(
        Executable::load_cubin(gpu.context(), &[1, 2]),
        Err(Error::BadImage { .. })
    ));
    // Headers that pass the bounds check but are not a cubin: the driver says so.
    let mut garbage = b"\x7fELF\x02\x01".to_vec();
    garbage.extend(std::iter::repeat_n(0u8, 250));
    assert!(matches!(
        Executable::load_cubin(gpu.context(), &garbage),
        Err(Error::ModuleLoad { .. })
    ));
    // Headers that declare more than the slice holds never reach the driver.
    let mut truncated = garbage.clone();
    truncated[0x28..0x30].copy_from_slice(&200u64.to_le_bytes());
    truncated[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
    truncated[0x3c..0x3e].copy_from_slice(&8u16.to_le_bytes());
    assert!(matches!(
        Executable::load_cubin(gpu.context(), &truncated),
        Err(Error::BadImage { .. })
    ));
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn unknown_function_is_a_clear_error() {
    let e = env();
    let err = e.kernels.function("no_such_kernel").unwrap_err();
    match &err {
        Error::UnknownFunction { name, source } => {
            assert_eq!(name, "no_such_kernel");
            assert_eq!(source.result(), Some(CUresult::ERROR_NOT_FOUND));
        }
        other => panic!("expected UnknownFunction, got {other:?}"),
    }
    assert!(err.to_string().contains("no_such_kernel"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn function_attributes_are_read_and_shared_memory_is_settable() {
    let e = env();
    let add_one = e.function(ADD_ONE_NAME);
    let scale = e.function(SCALE_ADD_NAME);
    let reverse = e.function(REVERSE_BLOCK_NAME);
    println!("JIT info log: {}", e.kernels.info_log());
    let attrs = add_one.attributes();
    println!("{ADD_ONE_NAME}: {attrs:?}");
    assert_eq!(attrs.max_threads_per_block, ADD_ONE_MAX_THREADS);
    assert!(attrs.registers > 0);
    assert_eq!(attrs.ptx_version, 75, "the PTX's .target");
    assert!(attrs.binary_version >= 75, "{attrs:?}");
    assert!(scale.attributes().max_threads_per_block > ADD_ONE_MAX_THREADS);
    assert_eq!(reverse.attributes().static_shared_bytes, 0, "dynamic only");

    let optin = e
        .ctx()
        .attribute(cuhal_sys::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .unwrap() as u32;
    assert!(optin > 48 * 1024, "opt-in shared memory {optin}");
    assert!(reverse.max_dynamic_shared_memory() <= 48 * 1024);
    reverse.set_max_dynamic_shared_memory(optin).unwrap();
    assert_eq!(reverse.max_dynamic_shared_memory(), optin);
    // A dispatch may now ask for all of it.
    let (buffer, _) = {
        let mut e2 = env();
        e2.poisoned(1024)
    };
    let args = KernelArgs::new().with_range(&buffer.whole());
    let mut cb = e.cb(Kind::Graph);
    cb.dispatch(&Dispatch::new(&reverse, [1, 1, 1], [256, 1, 1], &args).with_shared_memory(optin))
        .unwrap();
    cb.end().unwrap();
    e.submit(&cb);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn buffers_are_checked_and_host_buffers_round_trip() {
    let mut e = env();
    assert_eq!(
        Buffer::new(e.ctx(), 0).unwrap_err(),
        Error::ZeroSize { what: "buffer" }
    );
    let data = e.random(100);
    let buffer = e.buffer_with(&data);
    let mut out = vec![0u8; 10];
    buffer.read(90, &mut out).unwrap();
    assert_eq!(out, data[90..]);
    assert!(matches!(
        buffer.read(91, &mut out),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        buffer.write(95, &out),
        Err(Error::OutOfBounds { .. })
    ));

    let mut host = HostBuffer::new(e.ctx(), 64).unwrap();
    host.write(8, &data[..16]).unwrap();
    let mut back = [0u8; 16];
    host.read(8, &mut back).unwrap();
    assert_eq!(back, data[..16]);
    assert!(matches!(
        host.write(60, &data[..8]),
        Err(Error::OutOfBounds { .. })
    ));
    // The graph copies out of a sub-range into the same buffer's other end.
    let mut cb = e.cb(Kind::Graph);
    cb.copy(
        &buffer.range(0, 40).unwrap(),
        &buffer.range(60, 40).unwrap(),
    )
    .unwrap();
    cb.end().unwrap();
    e.submit(&cb);
    let mut expected = data.clone();
    expected.copy_within(0..40, 60);
    assert_eq!(read(&buffer), expected);
}

/// One recorded command buffer issued from several threads at once, each on its own stream:
/// graphs serialize their launches internally, deferred replays only read their arena.
fn issue_from_several_threads(kind: Kind) {
    let mut e = env();
    let n = 1 << 16;
    let input = e.random_u32(n);
    let (a, b) = (e.rng.next_u32(), e.rng.next_u32());
    let in_buf = e.buffer_with(&bytes_of(&input));
    let (out_buf, poison) = e.poisoned(n * 4);
    let f = e.function(SCALE_ADD_NAME);
    let args = scale_add_args(&out_buf.whole(), &in_buf.whole(), a, b, n as u32);
    let mut cb = e.cb(kind);
    cb.dispatch(&Dispatch::new(
        &f,
        [(n as u32).div_ceil(256), 1, 1],
        [256, 1, 1],
        &args,
    ))
    .unwrap();
    cb.end().unwrap();
    let cb: Arc<dyn CommandBuffer> = Arc::clone(cb.ended().expect("a graph or deferred buffer"));
    std::thread::scope(|scope| {
        for _ in 0..4 {
            let cb = Arc::clone(&cb);
            let context = Arc::clone(e.ctx());
            scope.spawn(move || {
                let stream = stream(&context).unwrap();
                for _ in 0..100 {
                    // SAFETY: `stream` is a live stream of the command buffer's context.
                    unsafe { cb.issue(stream.raw()) }.unwrap();
                }
                stream.synchronize().unwrap();
            });
        }
    });
    check_scale_add(
        "after 400 concurrent issues",
        &read_u32(&out_buf),
        &input,
        a,
        b,
        &bytes_to_u32(&poison),
    );
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn a_graph_is_issued_from_several_threads() {
    issue_from_several_threads(Kind::Graph);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn a_deferred_buffer_is_issued_from_several_threads() {
    issue_from_several_threads(Kind::Deferred);
}

/// Issuing a recorded graph or deferred buffer makes no heap allocation (the driver's own
/// memory is not Rust's and is not counted): every command of every kind is in it.
fn issuing_allocates_nothing(kind: Kind) {
    let mut e = env();
    let n = 4096usize;
    let input = e.random_u32(n);
    let in_buf = e.buffer_with(&bytes_of(&input));
    let (out_buf, _) = e.poisoned(n * 4);
    let (scratch, _) = e.poisoned(1024);
    let f = e.function(SCALE_ADD_NAME);
    let args = scale_add_args(&out_buf.whole(), &in_buf.whole(), 9, 4, n as u32);
    let mut cb = e.cb(kind);
    cb.fill(&scratch.range(0, 256).unwrap(), FillPattern::U16(7))
        .unwrap();
    cb.update(&scratch.range(256, 3).unwrap(), &[1, 2, 3])
        .unwrap();
    cb.barrier().unwrap();
    cb.copy(
        &scratch.range(0, 64).unwrap(),
        &scratch.range(512, 64).unwrap(),
    )
    .unwrap();
    cb.dispatch(&Dispatch::new(
        &f,
        [(n as u32).div_ceil(256), 1, 1],
        [256, 1, 1],
        &args,
    ))
    .unwrap();
    cb.end().unwrap();
    // SAFETY: the fixture's stream, live, of the command buffer's context.
    unsafe { cb.issue(e.stream.raw()) }.unwrap(); // the driver's first-launch work
    let before = allocations();
    for _ in 0..100 {
        // SAFETY: as above.
        unsafe { cb.issue(e.stream.raw()) }.unwrap();
    }
    let during = allocations() - before;
    e.stream.synchronize().unwrap();
    assert_eq!(during, 0, "heap allocations while issuing 100 times");
    check_scale_add("after 101 issues", &read_u32(&out_buf), &input, 9, 4, &[]);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn issuing_a_graph_allocates_nothing() {
    issuing_allocates_nothing(Kind::Graph);
}

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn replaying_a_deferred_buffer_allocates_nothing() {
    issuing_allocates_nothing(Kind::Deferred);
}
