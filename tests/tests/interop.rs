//! GPU suite: interoperation with other CUDA code in the same process.
//!
//! The "foreign runtime" is raw driver calls through a driver table of its own (as another
//! library in the process would have): its own stream, module, allocations and events. It
//! shares buffers and events with cuhal in both directions, and the consumer always runs behind
//! a producer that spins on the GPU first (2 ms), with no host wait between them, so a result
//! can only be right if the device-side ordering held. Results are checked bit for bit.
//!
//! Then cuBLAS (loaded at run time): an SGEMM recorded into graph and deferred command buffers
//! between two cuhal dispatches that produce its input and consume its output, checked bit for
//! bit against the same cuBLAS call on a raw stream and against the exact product (the inputs
//! are small multiples of 1/8, so every sum is exact in any order).

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuhal::{
    BufferRange, CommandBufferMode, Dispatch, ExportedBuffer, ForeignEvent, KernelArgs, StreamWork,
    StreamWorkFn,
};
use cuhal_gpu_tests::command_support::{Stream, stream};
use cuhal_gpu_tests::cublas::Cublas;
use cuhal_gpu_tests::device_support::*;
use cuhal_gpu_tests::gpu::{Gpu, Rng, arg, seed};
use cuhal_sys::{CU_EVENT_DISABLE_TIMING, CUevent, cu};

/// A GPU spin long enough that a missing dependency would let the consumer run first (2 ms).
const SPIN_NS: u64 = 2_000_000;
/// Words per buffer.
const WORDS: usize = 1 << 16;
const POISON: u32 = 0xDEAD_BEEF;

/// Kernels of the foreign runtime and of cuhal's float dispatches.
const INTEROP_KERNELS: &str = r#"
.version 7.0
.target sm_75
.address_size 64

.visible .entry scale_f32(
    .param .u64 scale_f32_dst,
    .param .u64 scale_f32_src,
    .param .f32 scale_f32_k,
    .param .u32 scale_f32_n
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<7>;
    .reg .f32   %f<4>;
    .reg .b64   %rd<8>;

    ld.param.u64        %rd1, [scale_f32_dst];
    ld.param.u64        %rd2, [scale_f32_src];
    ld.param.f32        %f1, [scale_f32_k];
    ld.param.u32        %r2, [scale_f32_n];
    mov.u32             %r3, %ctaid.x;
    mov.u32             %r4, %ntid.x;
    mov.u32             %r5, %tid.x;
    mad.lo.u32          %r6, %r3, %r4, %r5;
    setp.ge.u32         %p1, %r6, %r2;
    @%p1 bra            SCALE_F32_DONE;
    cvta.to.global.u64  %rd3, %rd1;
    cvta.to.global.u64  %rd4, %rd2;
    mul.wide.u32        %rd5, %r6, 4;
    add.s64             %rd6, %rd4, %rd5;
    ld.global.f32       %f2, [%rd6];
    mul.rn.f32          %f3, %f2, %f1;
    add.s64             %rd7, %rd3, %rd5;
    st.global.f32       [%rd7], %f3;
SCALE_F32_DONE:
    ret;
}
"#;

/// Another runtime in the process: raw driver calls through its own driver table.
struct Foreign {
    gpu: Gpu,
    stream: Stream,
    kernels: cuhal_gpu_tests::gpu::Module,
}

impl Foreign {
    fn new() -> Foreign {
        let gpu = Gpu::open();
        let stream = stream(gpu.context()).expect("foreign stream");
        let kernels = gpu
            .load_ptx(DEVICE_KERNELS)
            .unwrap_or_else(|e| panic!("foreign module: {e:?}"));
        Foreign {
            gpu,
            stream,
            kernels,
        }
    }

    fn launch(&self, name: &str, n: u32, params: &mut [*mut c_void]) {
        let function = self.kernels.function(name).expect("foreign kernel");
        let api = self.gpu.api();
        self.gpu.context().bind().unwrap();
        // SAFETY: the function belongs to the live module; `params` holds one pointer per
        // kernel parameter, each to a value of its size, live for the call.
        unsafe {
            cu!(
                api,
                cuLaunchKernel(
                    function.raw(),
                    n.div_ceil(BLOCK).max(1),
                    1,
                    1,
                    BLOCK,
                    1,
                    1,
                    0,
                    self.stream.raw(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut()
                )
            )
        }
        .unwrap();
    }

    /// `ptr[i] = value` after a GPU spin of `ns`.
    fn spin_fill(&self, ns: u64, ptr: u64, value: u32, n: u32) {
        let (mut ns, mut ptr, mut value, mut n) = (ns, ptr, value, n);
        self.launch(
            "spin_fill_u32",
            n,
            &mut [arg(&mut ns), arg(&mut ptr), arg(&mut value), arg(&mut n)],
        );
    }

    /// `dst[i] = src[i] + k`.
    fn add(&self, dst: u64, src: u64, k: u32, n: u32) {
        let (mut dst, mut src, mut k, mut n) = (dst, src, k, n);
        self.launch(
            "add_u32",
            n,
            &mut [arg(&mut dst), arg(&mut src), arg(&mut k), arg(&mut n)],
        );
    }

    fn event(&self) -> CUevent {
        let api = self.gpu.api();
        let mut event = std::ptr::null_mut();
        self.gpu.context().bind().unwrap();
        // SAFETY: valid out-pointer and flags.
        unsafe { cu!(api, cuEventCreate(&mut event, CU_EVENT_DISABLE_TIMING)) }.unwrap();
        event
    }

    fn record(&self, event: CUevent) {
        let api = self.gpu.api();
        // SAFETY: both live.
        unsafe { cu!(api, cuEventRecord(event, self.stream.raw())) }.unwrap();
    }

    fn wait(&self, event: CUevent) {
        let api = self.gpu.api();
        // SAFETY: the stream is live; the caller keeps the event live until this returns.
        unsafe { cu!(api, cuStreamWaitEvent(self.stream.raw(), event, 0)) }.unwrap();
    }
}

fn grid(n: usize) -> [u32; 3] {
    [(n as u32).div_ceil(BLOCK), 1, 1]
}

macro_rules! in_both_modes {
    ($($name:ident),* $(,)?) => {
        mod graph {
            $(
                #[test]
                #[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
                fn $name() {
                    super::$name(cuhal::CommandBufferMode::Graph)
                }
            )*
        }
        mod deferred {
            $(
                #[test]
                #[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
                fn $name() {
                    super::$name(cuhal::CommandBufferMode::Deferred)
                }
            )*
        }
    };
}

in_both_modes!(
    foreign_buffer_and_event_into_cuhal,
    cuhal_buffer_and_timepoint_out_to_foreign,
    cublas_gemm_between_two_dispatches,
    cublas_gemm_follows_binding_tables,
);

/// The foreign runtime produces (spin, then `x[i] = v`, then `x[i] += 0` through its own add),
/// records an event; cuhal imports its buffer, waits on the event on the device, and computes
/// `y = x + 1`. No host wait between the two.
fn foreign_buffer_and_event_into_cuhal(mode: CommandBufferMode) {
    let mut rng = Rng::new(seed());
    let device = open(mode, 1);
    let kernels = Kernels::load(&device);
    let q = device.queue(0);
    let foreign = Foreign::new();
    let x = foreign.gpu.alloc(WORDS * 4).unwrap();
    let data: Vec<u32> = (0..WORDS).map(|_| rng.next_u64() as u32).collect();
    let staged = foreign.gpu.alloc(WORDS * 4).unwrap();
    staged.upload(&data).unwrap();
    x.upload(&vec![POISON; WORDS]).unwrap();
    let y = device.create_buffer(WORDS * 4).unwrap();
    poison(&y, POISON);
    let released = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&released);
    // SAFETY: `x` is freed only after the callback ran (checked below) and every use is done.
    let x_in = unsafe {
        device.import_buffer(
            x.ptr(),
            x.bytes(),
            Some(Box::new(move || {
                counter.fetch_add(1, Ordering::SeqCst);
            })),
        )
    }
    .unwrap_or_else(|e| panic!("import: {e}"));

    // Foreign: spin 2 ms, then x = staged + 0 (the data), then record.
    let n = WORDS as u32;
    foreign.spin_fill(SPIN_NS, x.ptr(), POISON, n);
    foreign.add(x.ptr(), staged.ptr(), 0, n);
    let event = foreign.event();
    foreign.record(event);
    // SAFETY: the event is destroyed only after every operation waiting on it completed.
    let foreign_event = unsafe { ForeignEvent::from_raw(event, None) };

    // cuhal: wait for it on the device, then y = x + 1.
    let s = device.create_semaphore(0);
    q.wait_event(&[], &[(&s, 1)], &foreign_event).unwrap();
    let cb = command_buffer(q, |cb| {
        record_add(cb, &kernels, &y.whole(), &x_in.whole(), 1);
    });
    q.execute(&[(&s, 1)], &[(&s, 2)], &[&cb]).unwrap();
    drop((x_in, cb, foreign_event));
    wait(&s, 2);

    let got = read_u32(&y);
    for (i, (g, d)) in got.iter().zip(&data).enumerate() {
        assert_eq!(
            *g,
            d.wrapping_add(1),
            "word {i}: cuhal ran before the foreign data"
        );
    }
    // Every handle is gone and the work completed: released exactly once.
    let deadline = std::time::Instant::now() + TIMEOUT;
    while released.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(released.load(Ordering::SeqCst), 1);
    foreign.stream.synchronize().unwrap();
    let api = foreign.gpu.api();
    // SAFETY: nothing waits on the event any more.
    let _ = unsafe { cu!(api, cuEventDestroy(event)) };
}

/// cuhal produces (a command buffer that spins 2 ms, then `z = data + 5`); the semaphore value
/// is exported as an event; the foreign runtime waits on it on the device and computes
/// `w = z + 7` from the exported pointer. The only host wait is the foreign stream's own, at the
/// end.
fn cuhal_buffer_and_timepoint_out_to_foreign(mode: CommandBufferMode) {
    let mut rng = Rng::new(seed());
    let device = open(mode, 1);
    let kernels = Kernels::load(&device);
    let q = device.queue(0);
    let foreign = Foreign::new();
    let data: Vec<u32> = (0..WORDS).map(|_| rng.next_u64() as u32).collect();
    let source = device.create_buffer(WORDS * 4).unwrap();
    let bytes: Vec<u8> = data.iter().flat_map(|w| w.to_ne_bytes()).collect();
    source.write(0, &bytes).unwrap();
    let z = device.create_buffer(WORDS * 4).unwrap();
    poison(&z, POISON);
    let w = foreign.gpu.alloc(WORDS * 4).unwrap();
    w.upload(&vec![POISON; WORDS]).unwrap();

    let cb = command_buffer(q, |cb| {
        record_spin_fill(cb, &kernels, SPIN_NS, &z.whole(), POISON);
        cb.barrier().unwrap();
        record_add(cb, &kernels, &z.whole(), &source.whole(), 5);
    });
    let s = device.create_semaphore(0);
    q.execute(&[], &[(&s, 1)], &[&cb]).unwrap();

    let exported = device
        .export_timepoint(&s, 1, TIMEOUT)
        .unwrap_or_else(|e| panic!("export: {e}"));
    let lent = ExportedBuffer::new(&z).unwrap();
    foreign.wait(exported.raw());
    foreign.add(w.ptr(), lent.device_ptr(), 7, WORDS as u32);
    // The foreign side has enqueued its wait: the event may go back to cuhal.
    drop(exported);
    foreign.stream.synchronize().unwrap();
    drop(lent);

    let got = w.download().unwrap();
    for (i, (g, d)) in got.iter().zip(&data).enumerate() {
        assert_eq!(
            *g,
            d.wrapping_add(12),
            "word {i}: the foreign stream ran before cuhal's data"
        );
    }
    wait(&s, 1);
}

/// Small multiples of 1/8 in [-4, 4]: every product and sum below is exact in FP32 (and TF32).
fn eighths(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| ((rng.next_u64() % 65) as i32 - 32) as f32 / 8.0)
        .collect()
}

fn write_f32(buffer: &cuhal::Buffer, values: &[f32]) {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    buffer.write(0, &bytes).unwrap();
}

fn read_f32(buffer: &cuhal::Buffer) -> Vec<f32> {
    read_u32(buffer).into_iter().map(f32::from_bits).collect()
}

/// The GEMM sizes of the test (column-major `C[m x n] = A[m x k] * B[k x n]`).
const M: usize = 256;
const N: usize = 192;
const K: usize = 128;
/// cuBLAS workspace.
const WORKSPACE: usize = 32 << 20;

fn cublas_gemm_between_two_dispatches(mode: CommandBufferMode) {
    let mut rng = Rng::new(seed());
    let device = open(mode, 1);
    let q = device.queue(0);
    let module = device.load_ptx(INTEROP_KERNELS).unwrap();
    let scale = module.function("scale_f32").unwrap();
    device.context().bind().unwrap();
    let cublas = Arc::new(Cublas::load().unwrap_or_else(|e| panic!("{e}")));
    let workspace = device.create_buffer(WORKSPACE).unwrap();
    // SAFETY: the workspace outlives the handle (dropped after it below).
    unsafe { cublas.set_workspace(workspace.device_ptr(), WORKSPACE) }.unwrap();

    let (a_src, b) = (eighths(&mut rng, M * K), eighths(&mut rng, K * N));
    let (a0, a, bb, c, d) = (
        device.create_buffer(M * K * 4).unwrap(),
        device.create_buffer(M * K * 4).unwrap(),
        device.create_buffer(K * N * 4).unwrap(),
        device.create_buffer(M * N * 4).unwrap(),
        device.create_buffer(M * N * 4).unwrap(),
    );
    write_f32(&a0, &a_src);
    write_f32(&bb, &b);

    // The reference: the same cuBLAS call on a raw stream (also warms cuBLAS up, so the
    // capture below does not load modules), with A = 2 * A0 and D = C / 2 done on the host.
    let a_ref: Vec<f32> = a_src.iter().map(|v| v * 2.0).collect();
    write_f32(&a, &a_ref);
    poison(&c, POISON);
    let raw = stream(device.context()).unwrap();
    // SAFETY: the buffers are live and large enough; the stream is synchronized below.
    unsafe {
        cublas.sgemm(
            raw.raw(),
            M,
            N,
            K,
            a.device_ptr(),
            bb.device_ptr(),
            c.device_ptr(),
        )
    }
    .unwrap();
    raw.synchronize().unwrap();
    let reference: Vec<f32> = read_f32(&c).iter().map(|v| v * 0.5).collect();
    // The exact product, on the host.
    for j in 0..N {
        for i in 0..M {
            let exact: f32 = (0..K).map(|l| a_ref[l * M + i] * b[j * K + l]).sum::<f32>() * 0.5;
            assert_eq!(
                reference[j * M + i].to_bits(),
                exact.to_bits(),
                "raw cuBLAS ({i}, {j})"
            );
        }
    }

    // cuhal: A = 2 * A0 (dispatch), C = A * B (cuBLAS as stream work), D = C / 2 (dispatch).
    poison(&a, POISON);
    poison(&c, POISON);
    poison(&d, POISON);
    let gemm = gemm_work(&cublas);
    let cb = command_buffer(q, |cb| {
        record_scale(cb, &scale, &a.whole(), &a0.whole(), 2.0);
        cb.barrier().unwrap();
        cb.stream_work(&[a.whole(), bb.whole(), c.whole()], Arc::clone(&gemm))
            .unwrap_or_else(|e| panic!("recording the GEMM: {e}"));
        cb.barrier().unwrap();
        record_scale(cb, &scale, &d.whole(), &c.whole(), 0.5);
    });
    let s = device.create_semaphore(0);
    for round in 1..=3 {
        if round > 1 {
            poison(&d, POISON);
        }
        q.execute(&[], &[(&s, round)], &[&cb]).unwrap();
        wait(&s, round);
        let got = read_f32(&d);
        for (i, (g, r)) in got.iter().zip(&reference).enumerate() {
            assert_eq!(
                g.to_bits(),
                r.to_bits(),
                "{mode:?} round {round}, element {i}"
            );
        }
    }
    drop(cb);
    drop(gemm);
    drop(cublas);
}

/// `(2 * A0) * B / 2` on the host, exactly (column-major, the test's sizes).
fn exact_gemm(a0: &[f32], b: &[f32]) -> Vec<f32> {
    let mut d = vec![0f32; M * N];
    for j in 0..N {
        for i in 0..M {
            d[j * M + i] = (0..K)
                .map(|l| a0[l * M + i] * 2.0 * b[j * K + l])
                .sum::<f32>()
                * 0.5;
        }
    }
    d
}

/// Binding tables reach a library call: the cuBLAS GEMM names slots (A, B, C) between two
/// dispatches that also do (A = 2 * A0, D = C / 2), and submissions alternate between two
/// tables with different inputs. Every result is bit-exact for that submission's table, and the
/// other table's output is untouched. A graph command buffer captures the GEMM at recording over
/// placeholder memory and again, with the table's addresses, whenever the table moves a slot it
/// names (once per change, none for a repeated table); a deferred one calls cuBLAS at every
/// replay with the table's addresses.
fn cublas_gemm_follows_binding_tables(mode: CommandBufferMode) {
    let mut rng = Rng::new(seed());
    let device = open(mode, 1);
    let q = device.queue(0);
    let module = device.load_ptx(INTEROP_KERNELS).unwrap();
    let scale = module.function("scale_f32").unwrap();
    device.context().bind().unwrap();
    let cublas = Arc::new(Cublas::load().unwrap_or_else(|e| panic!("{e}")));
    let workspace = device.create_buffer(WORKSPACE).unwrap();
    // SAFETY: the workspace outlives the handle (dropped after it below).
    unsafe { cublas.set_workspace(workspace.device_ptr(), WORKSPACE) }.unwrap();

    // Slots: 0 A0, 1 A, 2 B, 3 C, 4 D. Two tables, each with inputs of its own.
    let sizes = [M * K, M * K, K * N, M * N, M * N];
    let tables: Vec<Vec<Arc<cuhal::Buffer>>> = (0..2)
        .map(|_| {
            sizes
                .iter()
                .map(|n| device.create_buffer(n * 4).unwrap())
                .collect()
        })
        .collect();
    let expected: Vec<Vec<f32>> = tables
        .iter()
        .map(|t| {
            let (a0, b) = (eighths(&mut rng, M * K), eighths(&mut rng, K * N));
            write_f32(&t[0], &a0);
            write_f32(&t[2], &b);
            exact_gemm(&a0, &b)
        })
        .collect();
    assert_ne!(
        expected[0], expected[1],
        "the two tables give different results"
    );
    // Warm cuBLAS up on a raw stream, outside any capture (its first call may load modules).
    let raw = stream(device.context()).unwrap();
    // SAFETY: table 0's A0, B and C are live and sized for the GEMM; synchronized below.
    unsafe {
        cublas.sgemm(
            raw.raw(),
            M,
            N,
            K,
            tables[0][0].device_ptr(),
            tables[0][2].device_ptr(),
            tables[0][3].device_ptr(),
        )
    }
    .unwrap();
    raw.synchronize().unwrap();

    let calls = Arc::new(AtomicUsize::new(0));
    let gemm = {
        let inner = gemm_work(&cublas);
        let calls = Arc::clone(&calls);
        let work: Arc<StreamWorkFn> = Arc::new(move |on: &StreamWork<'_>| {
            calls.fetch_add(1, Ordering::SeqCst);
            inner(on)
        });
        work
    };
    let slot = |s: u32| BufferRange::slot(s, 0, sizes[s as usize] * 4).unwrap();
    let mut cb = q.create_command_buffer_with_bindings(5).unwrap();
    record_scale(&mut *cb, &scale, &slot(1), &slot(0), 2.0);
    cb.barrier().unwrap();
    cb.stream_work(&[slot(1), slot(2), slot(3)], Arc::clone(&gemm))
        .unwrap_or_else(|e| panic!("recording the GEMM over slots: {e}"));
    cb.barrier().unwrap();
    record_scale(&mut *cb, &scale, &slot(4), &slot(3), 0.5);
    let cb: Arc<dyn cuhal::CommandBuffer> = cb.end().unwrap();
    let recorded = calls.load(Ordering::SeqCst);
    assert_eq!(
        recorded,
        usize::from(mode == CommandBufferMode::Graph),
        "captured at recording (graph) or not called yet (deferred)"
    );

    let s = device.create_semaphore(0);
    let order = [0, 1, 0, 1, 1];
    for (round, &t) in order.iter().enumerate() {
        for table in &tables {
            for buffer in &table[3..] {
                poison(buffer, POISON);
            }
        }
        let ranges: Vec<BufferRange> = tables[t].iter().map(|b| b.whole()).collect();
        let value = round as u64 + 1;
        q.execute_with_bindings(&[], &[(&s, value)], &[(&cb, &ranges)])
            .unwrap();
        wait(&s, value);
        let got = read_f32(&tables[t][4]);
        for (i, (g, e)) in got.iter().zip(&expected[t]).enumerate() {
            assert_eq!(
                g.to_bits(),
                e.to_bits(),
                "{mode:?} round {round} (table {t}), element {i}"
            );
        }
        let other = read_u32(&tables[1 - t][4]);
        assert!(
            other.iter().all(|&v| v == POISON),
            "{mode:?} round {round}: the other table's output was written"
        );
    }
    let replayed = calls.load(Ordering::SeqCst) - recorded;
    match mode {
        // Four table changes (the first launch included), then a repeated table.
        CommandBufferMode::Graph => assert_eq!(replayed, 4, "captures at launch"),
        CommandBufferMode::Deferred => assert_eq!(replayed, 5, "one call per replay"),
    }
    drop(cb);
    drop(gemm);
    drop(cublas);
}

/// `C = A * B` by cuBLAS on the stream it is handed (ranges: A, B, C).
fn gemm_work(cublas: &Arc<Cublas>) -> Arc<StreamWorkFn> {
    let cublas = Arc::clone(cublas);
    Arc::new(move |on: &StreamWork<'_>| {
        let [a, b, c] = on.ranges() else {
            return Err("the GEMM names three ranges".into());
        };
        // SAFETY: the command buffer retains the three buffers, sized for these dimensions.
        unsafe { cublas.sgemm(on.stream(), M, N, K, a.ptr, b.ptr, c.ptr) }?;
        Ok(())
    })
}

fn record_scale(
    cb: &mut dyn cuhal::CommandRecorder,
    scale: &cuhal::Function,
    dst: &BufferRange,
    src: &BufferRange,
    k: f32,
) {
    let n = dst.len() / 4;
    let args = KernelArgs::new()
        .with_range(dst)
        .with_range(src)
        .with(k)
        .with(n as u32);
    cb.dispatch(&Dispatch::new(scale, grid(n), [BLOCK, 1, 1], &args))
        .unwrap();
}

/// A closure that synchronizes its stream cannot be captured on the real driver either: the
/// driver's complaint comes back typed and the graph keeps nothing of it.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn a_synchronizing_capture_is_refused_by_the_driver() {
    let device = open(CommandBufferMode::Graph, 1);
    let q = device.queue(0);
    let buffer = device.create_buffer(4096).unwrap();
    let mut cb = q.create_command_buffer().unwrap();
    let work: Arc<StreamWorkFn> = Arc::new(|on: &StreamWork<'_>| {
        let api = on.context().api();
        let range = on.ranges()[0];
        // SAFETY: the range is live device memory retained by the command buffer.
        unsafe { cu!(api, cuMemsetD8Async(range.ptr, 1, range.len, on.stream())) }?;
        // SAFETY: the stream is live; capture forbids this.
        unsafe { cu!(api, cuStreamSynchronize(on.stream())) }?;
        Ok(())
    });
    let e = cb.stream_work(&[buffer.whole()], work).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, cuhal_command::Error::Capture { .. }), "{e:?}");
    assert!(text.contains("STREAM_CAPTURE"), "{text}");
    assert_eq!(cb.state(), cuhal_command::CommandBufferState::Recording);
    cb.end().unwrap();
}

/// The driver's contract for a capture into an existing graph that is invalidated, which graph
/// command buffers are built around (so a driver that changes it shows up here first): an empty
/// graph's node list cannot be read into a non-null array (only the count call works);
/// `cuStreamEndCapture` reports the invalidation, gives no graph and destroys the graph captured
/// into, though the caller created it (its handle is refused afterwards); the stream is no
/// longer capturing and can capture again, into another graph. Every answer is printed first.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn capture_into_a_graph_contract() {
    use cuhal_sys::{
        CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_STATUS_NONE, CUgraph, CUgraphNode,
        CUresult,
    };
    let gpu = Gpu::open();
    let api = gpu.api();
    let stream = stream(gpu.context()).expect("stream");
    let memory = gpu.alloc(4096).expect("alloc");
    let begin = api
        .cuStreamBeginCaptureToGraph
        .expect("cuStreamBeginCaptureToGraph (CUDA 12.3)");
    gpu.context().bind().unwrap();
    let new_graph = || {
        let mut graph: CUgraph = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the context is current.
        unsafe { cuhal_sys::cu!(api, cuGraphCreate(&mut graph, 0)) }.unwrap();
        graph
    };
    let count_of = |graph: CUgraph| {
        let mut count = 0usize;
        // SAFETY: null array: only the count is written.
        let r = unsafe { (api.cuGraphGetNodes)(graph, std::ptr::null_mut(), &mut count) };
        (r, count)
    };
    let graph = new_graph();
    let empty_count = count_of(graph);
    let mut none: Vec<CUgraphNode> = Vec::new();
    let mut zero = 0usize;
    // SAFETY: room for zero handles, the length passed in.
    let empty_list = unsafe { (api.cuGraphGetNodes)(graph, none.as_mut_ptr(), &mut zero) };
    println!("empty graph: count {empty_count:?}, list with room 0 {empty_list:?}");

    let mut root: CUgraphNode = std::ptr::null_mut();
    // SAFETY: valid out-pointer, live graph, no dependencies.
    unsafe {
        cuhal_sys::cu!(
            api,
            cuGraphAddEmptyNode(&mut root, graph, std::ptr::null(), 0)
        )
    }
    .unwrap();
    // Captures a memset into `graph` (after `deps`), then the forbidden synchronize if asked.
    let capture = |graph: CUgraph, deps: &[CUgraphNode], with_sync: bool| {
        // SAFETY: live stream and graph; `deps` are nodes of the graph.
        let began = unsafe {
            begin(
                stream.raw(),
                graph,
                deps.as_ptr(),
                std::ptr::null(),
                deps.len(),
                CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        };
        // SAFETY: live allocation of 4096 bytes; the stream is capturing.
        let memset = unsafe { (api.cuMemsetD8Async)(memory.ptr(), 1, 4096, stream.raw()) };
        // SAFETY: live stream; under capture this is forbidden, which is the point.
        let sync = with_sync.then(|| unsafe { (api.cuStreamSynchronize)(stream.raw()) });
        let mut captured: CUgraph = std::ptr::null_mut();
        // SAFETY: live stream, valid out-pointer.
        let ended = unsafe { (api.cuStreamEndCapture)(stream.raw(), &mut captured) };
        let mut after = CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: live stream, valid out-pointer.
        let after_r = unsafe { (api.cuStreamIsCapturing)(stream.raw(), &mut after) };
        println!(
            "capture (sync {with_sync}): begin {began:?}, memset {memset:?}, sync {sync:?}, \
             end {ended:?}, graph returned {}, capturing after {after_r:?}/{after}, \
             graph's nodes {:?}",
            captured == graph,
            count_of(graph)
        );
        (began, ended, captured, after_r, after)
    };
    let (began, ended, captured, after_r, after) = capture(graph, &[root], true);
    let gone = count_of(graph);
    let other = new_graph();
    let (again_began, again_ended, again_graph, _, _) = capture(other, &[], false);
    let other_count = count_of(other);
    // SAFETY: `other` is live and ours (`graph` is already destroyed by the driver).
    unsafe { cuhal_sys::cu!(api, cuGraphDestroy(other)) }.unwrap();

    assert_eq!(empty_count, (CUresult::SUCCESS, 0));
    assert_eq!(empty_list, CUresult::ERROR_INVALID_VALUE);
    assert!(began.is_success(), "{began:?}");
    assert_eq!(ended, CUresult::ERROR_STREAM_CAPTURE_INVALIDATED);
    assert!(captured.is_null());
    assert!(after_r.is_success() && after == CU_STREAM_CAPTURE_STATUS_NONE);
    assert_eq!(
        gone.0,
        CUresult::ERROR_INVALID_VALUE,
        "the graph outlived the capture"
    );
    assert!(again_began.is_success() && again_ended.is_success());
    assert_eq!(again_graph, other);
    assert_eq!(other_count, (CUresult::SUCCESS, 1));
}

/// A release callback that counts its runs.
fn counted(counter: &Arc<AtomicUsize>) -> Option<cuhal::Release> {
    let counter = Arc::clone(counter);
    Some(Box::new(move || {
        counter.fetch_add(1, Ordering::SeqCst);
    }))
}

/// What the real driver says of bad foreign pointers, as typed errors: plain host memory (the
/// driver does not know it), pinned host memory (known, host), and ranges past the end of a
/// foreign allocation (from its start and from inside it). A refused import never runs its
/// callback; the exact allocation and a range inside it are accepted.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn bad_foreign_pointers_are_typed_errors() {
    use cuhal::Error;
    let device = open(CommandBufferMode::Graph, 1);
    let never = Arc::new(AtomicUsize::new(0));

    let host = vec![0u8; 4096];
    // SAFETY: refused, so nothing keeps the pointer.
    let e = unsafe { device.import_buffer(host.as_ptr() as u64, 64, counted(&never)) }.unwrap_err();
    println!("host memory: {e}");
    assert!(
        matches!(
            e,
            Error::NotDeviceMemory {
                memory_type: None,
                ..
            }
        ),
        "{e:?}"
    );

    let pinned = device.create_host_buffer(4096).unwrap();
    // SAFETY: refused.
    let e =
        unsafe { device.import_buffer(pinned.as_ptr() as u64, 64, counted(&never)) }.unwrap_err();
    println!("pinned host memory: {e}");
    assert!(
        matches!(
            e,
            Error::NotDeviceMemory {
                memory_type: Some(cuhal_sys::CU_MEMORYTYPE_HOST),
                ..
            }
        ),
        "{e:?}"
    );

    // A foreign allocation of 2 MiB (a whole allocation granule, so the driver's range is
    // exactly what was asked for).
    const SIZE: usize = 2 << 20;
    let foreign = Gpu::open();
    let memory = foreign.alloc(SIZE).unwrap();
    let base = memory.ptr();
    for (offset, len) in [
        (0, SIZE + 1),
        (SIZE as u64 / 2, SIZE / 2 + 1),
        (SIZE as u64 - 1, 2),
    ] {
        // SAFETY: refused.
        let e = unsafe { device.import_buffer(base + offset, len, counted(&never)) }.unwrap_err();
        println!("({offset}, {len}): {e}");
        match e {
            Error::PastAllocation {
                ptr,
                len: l,
                allocation_start,
                allocation_size,
            } => {
                assert_eq!((ptr, l), (base + offset, len));
                assert_eq!((allocation_start, allocation_size), (base, SIZE));
            }
            other => panic!("({offset}, {len}): {other:?}"),
        }
    }
    // SAFETY: `memory` outlives both buffers (dropped below, before it).
    let whole = unsafe { device.import_buffer(base, SIZE, None) }.unwrap();
    // SAFETY: as above.
    let inner = unsafe { device.import_buffer(base + 4096, 8192, None) }.unwrap();
    assert_eq!((whole.device_ptr(), whole.len()), (base, SIZE));
    assert_eq!((inner.device_ptr(), inner.len()), (base + 4096, 8192));
    drop((whole, inner));
    assert_eq!(
        never.load(Ordering::SeqCst),
        0,
        "a refused import never releases"
    );
}

/// Memory of another device is refused, naming both devices. Needs two GPUs: with fewer it says
/// reports itself skipped (the fake driver's test covers the check on CPU).
#[test]
#[ignore = "needs two CUDA GPUs (cargo xtask gpu-test)"]
fn another_devices_pointer_is_refused() {
    let driver = cuhal::Driver::load().expect("the CUDA driver loads");
    let count = driver.devices().expect("devices").len();
    if count < 2 {
        cuhal_gpu_tests::skip::skip(&format!("needs 2 GPUs ({count} found)"));
        return;
    }
    let devices = driver
        .open_many(&[0, 1], cuhal::DeviceOptions::default())
        .expect("opening GPUs 0 and 1");
    let theirs = devices[1].create_buffer(4096).unwrap();
    // SAFETY: refused.
    let e = unsafe { devices[0].import_buffer(theirs.device_ptr(), 4096, None) }.unwrap_err();
    println!("device 1's memory offered to device 0: {e}");
    assert!(
        matches!(e, cuhal::Error::OtherDevice { owner: 1, device: 0, ptr } if ptr == theirs.device_ptr()),
        "{e:?}"
    );
}

/// A foreign event that was never recorded waits on nothing, as CUDA defines: the queue's wait
/// signals at once, and work behind it runs.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn a_never_recorded_foreign_event_waits_on_nothing() {
    let device = open(CommandBufferMode::Graph, 1);
    let q = device.queue(0);
    let foreign = Foreign::new();
    let event = foreign.event();
    let released = Arc::new(AtomicUsize::new(0));
    // SAFETY: the event is destroyed below, after the release ran (every wait completed).
    let foreign_event = unsafe { ForeignEvent::from_raw(event, counted(&released)) };
    let buffer = device.create_buffer(4096).unwrap();
    poison(&buffer, POISON);
    let s = device.create_semaphore(0);
    q.wait_event(&[], &[(&s, 1)], &foreign_event).unwrap();
    q.fill(
        &[(&s, 1)],
        &[(&s, 2)],
        &buffer.whole(),
        cuhal::FillPattern::U32(7),
    )
    .unwrap();
    drop(foreign_event);
    wait(&s, 2);
    assert!(read_u32(&buffer).iter().all(|&v| v == 7));
    let deadline = std::time::Instant::now() + TIMEOUT;
    while released.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(released.load(Ordering::SeqCst), 1, "released once");
    let api = foreign.gpu.api();
    // SAFETY: nothing waits on the event any more.
    let _ = unsafe { cu!(api, cuEventDestroy(event)) };
}

/// Closures that call what capture forbids, after capturing some work, on the real driver: an
/// allocation, a context synchronize, a query of the capturing stream. Each is refused with a
/// typed error naming the driver's complaint, and the command buffer keeps nothing of them: it
/// still records, and runs exactly the commands around them.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn forbidden_calls_in_a_capture_are_refused_and_leave_nothing() {
    use cuhal_sys::CUresult;
    let device = open(CommandBufferMode::Graph, 1);
    let q = device.queue(0);
    let (a, b) = (
        device.create_buffer(4096).unwrap(),
        device.create_buffer(4096).unwrap(),
    );
    /// A call the closure makes under capture, returning the driver's answer.
    type Forbidden = fn(&StreamWork<'_>) -> CUresult;
    let memset_then = |forbidden: Forbidden| -> Arc<StreamWorkFn> {
        Arc::new(move |on: &StreamWork<'_>| {
            let api = on.context().api();
            let range = on.ranges()[0];
            // SAFETY: the range is live device memory retained by the command buffer.
            unsafe {
                cu!(
                    api,
                    cuMemsetD32Async(range.ptr, 9, range.len / 4, on.stream())
                )
            }?;
            api.check("the forbidden call", forbidden(on))?;
            Ok(())
        })
    };
    let forbidden: [(&str, Forbidden); 3] = [
        (cuhal_sys::cu_name!(cuMemAlloc), |on| {
            let api = on.context().api();
            let mut ptr = 0;
            // SAFETY: valid out-pointer; freed at once if the driver allows it.
            let r = unsafe { (api.cuMemAlloc)(&mut ptr, 1 << 20) };
            if r.is_success() {
                // SAFETY: allocated just above.
                let _ = unsafe { (api.cuMemFree)(ptr) };
            }
            r
        }),
        (cuhal_sys::cu_name!(cuCtxSynchronize), |on| {
            // SAFETY: no arguments.
            unsafe { (on.context().api().cuCtxSynchronize)() }
        }),
        (cuhal_sys::cu_name!(cuStreamQuery), |on| {
            // SAFETY: the stream is live.
            unsafe { (on.context().api().cuStreamQuery)(on.stream()) }
        }),
    ];
    let mut cb = q.create_command_buffer().unwrap();
    cb.fill(&a.whole(), cuhal::FillPattern::U32(4)).unwrap();
    for (name, call) in forbidden {
        let Err(e) = cb.stream_work(&[b.whole()], memset_then(call)) else {
            panic!("{name}: the driver allowed it in a thread-local capture");
        };
        let text = e.to_string();
        println!("{name} in a capture: {text}");
        assert!(
            matches!(e, cuhal_command::Error::Capture { .. }),
            "{name}: {e:?}"
        );
        assert!(text.contains("STREAM_CAPTURE"), "{name}: {text}");
        assert_eq!(
            cb.state(),
            cuhal_command::CommandBufferState::Recording,
            "{name}"
        );
    }
    let cb: Arc<dyn cuhal::CommandBuffer> = cb.end().unwrap();
    poison(&a, POISON);
    poison(&b, POISON);
    let s = device.create_semaphore(0);
    q.execute(&[], &[(&s, 1)], &[&cb]).unwrap();
    wait(&s, 1);
    assert!(read_u32(&a).iter().all(|&v| v == 4), "the fill ran");
    assert!(
        read_u32(&b).iter().all(|&v| v == POISON),
        "nothing of the refused captures ran"
    );
}
