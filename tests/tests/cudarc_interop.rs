//! GPU suite: cudarc memory and streams with cuhal queues, through `cuhal-cudarc`.
//!
//! A cudarc producer stream spins on the GPU (2 ms) before it writes the input; cuhal borrows
//! the input (a foreign range recorded into a graph command buffer) and the output (a
//! binding-table entry) through a third cudarc stream, spins again, and writes the output; a
//! cudarc consumer stream reads the output. No host wait anywhere between them, and three
//! different cudarc streams, so the result is exact only if every crossing ordered the work
//! on the device: cudarc's event tracking into the crossing stream, the crossing stream into
//! the queue, the queue back into the crossing stream, and cudarc's tracking out to the
//! consumer.

use std::ffi::c_void;

use cuhal::{BufferRange, CommandBufferMode};
use cuhal_cudarc::SliceLoan;
use cuhal_cudarc::cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use cuhal_gpu_tests::device_support::*;
use cuhal_gpu_tests::gpu::{Gpu, Module, Rng, arg, seed};
use cuhal_sys::cu;

/// A GPU spin long enough that a missing dependency would let the next step run first (2 ms).
const SPIN_NS: u64 = 2_000_000;
/// Words per buffer.
const WORDS: usize = 1 << 16;
const POISON: u32 = 0xDEAD_BEEF;

/// The suite's kernels launched on cudarc streams, each use of a slice going through cudarc's
/// own tracking (`device_ptr` / `device_ptr_mut`), as any library launching on cudarc memory
/// does.
struct Launcher {
    gpu: Gpu,
    kernels: Module,
}

impl Launcher {
    fn new() -> Launcher {
        let gpu = Gpu::open();
        let kernels = gpu
            .load_ptx(DEVICE_KERNELS)
            .unwrap_or_else(|e| panic!("kernels for cudarc streams: {e:?}"));
        Launcher { gpu, kernels }
    }

    fn launch(&self, stream: &CudaStream, name: &str, params: &mut [*mut c_void]) {
        let function = self.kernels.function(name).expect("kernel");
        let api = self.gpu.api();
        self.gpu.context().bind().unwrap();
        // SAFETY: the function belongs to the live module; `params` holds one pointer per
        // kernel parameter, each to a value of its size, live for the call; the stream is
        // borrowed, so live, and of the same (primary) context.
        unsafe {
            cu!(
                api,
                cuLaunchKernel(
                    function.raw(),
                    (WORDS as u32).div_ceil(BLOCK),
                    1,
                    1,
                    BLOCK,
                    1,
                    1,
                    0,
                    stream.cu_stream().cast(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut()
                )
            )
        }
        .unwrap();
    }

    /// On `stream`: `slice[i] = value` after a GPU spin of `ns`.
    fn spin_fill(&self, stream: &CudaStream, slice: &mut CudaSlice<u32>, ns: u64, value: u32) {
        let (ptr, _record) = slice.device_ptr_mut(stream);
        let (mut ns, mut ptr, mut value, mut n) = (ns, ptr, value, WORDS as u32);
        self.launch(
            stream,
            "spin_fill_u32",
            &mut [arg(&mut ns), arg(&mut ptr), arg(&mut value), arg(&mut n)],
        );
    }

    /// On `stream`: `dst[i] = src[i] + k`.
    fn add(&self, stream: &CudaStream, dst: &mut CudaSlice<u32>, src: &CudaSlice<u32>, k: u32) {
        let (dst, _record_dst) = dst.device_ptr_mut(stream);
        let (src, _record_src) = src.device_ptr(stream);
        let (mut dst, mut src, mut k, mut n) = (dst, src, k, WORDS as u32);
        self.launch(
            stream,
            "add_u32",
            &mut [arg(&mut dst), arg(&mut src), arg(&mut k), arg(&mut n)],
        );
    }
}

/// cudarc (producer stream) -> cuhal graph command buffer -> cudarc (consumer stream):
/// `out = (data + 1) + 7`, exact.
#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn cudarc_slices_through_a_graph_command_buffer_and_back() {
    let mut rng = Rng::new(seed());
    let device = open(CommandBufferMode::Graph, 1);
    let kernels = Kernels::load(&device);
    let q = device.queue(0);
    let launcher = Launcher::new();
    let ctx = CudaContext::new(usize::try_from(ordinal()).unwrap()).unwrap();
    let producer = ctx.new_stream().unwrap();
    let crossing = ctx.new_stream().unwrap();
    let consumer = ctx.new_stream().unwrap();
    assert!(
        ctx.is_managing_stream_synchronization(),
        "cudarc tracks slices' uses across its streams"
    );

    let data: Vec<u32> = (0..WORDS).map(|_| rng.next_u64() as u32).collect();
    let staged = producer.clone_htod(&data).unwrap();
    let mut x = producer.clone_htod(&vec![POISON; WORDS]).unwrap();
    let mut w = producer.clone_htod(&vec![POISON; WORDS]).unwrap();
    // cudarc produces: spin 2 ms (keeping x poisoned), then x = data.
    launcher.spin_fill(&producer, &mut x, SPIN_NS, POISON);
    launcher.add(&producer, &mut x, &staged, 0);

    // cuhal borrows x (read) and w (written) through the crossing stream: the queue's signal 1
    // comes once the crossing stream has waited for x's and w's last cudarc uses.
    let s = device.create_semaphore(0);
    // SAFETY: both loans are given back (ordering cudarc's later uses, frees included, after
    // signal 2) and the command buffer, the only other holder of x's buffer, is dropped
    // before x and w (declared after them).
    let mut x_loan = unsafe { SliceLoan::lend(&device, q, &x, &crossing, &[]) }.unwrap();
    // SAFETY: as above.
    let mut w_loan = unsafe { SliceLoan::lend_mut(&device, q, &mut w, &crossing, &[(&s, 1)]) }
        .unwrap_or_else(|e| panic!("lend: {e}"));

    // The graph: spin 2 ms on the output (slot 0, poisoned), then slot 0 = x + 1. x is a
    // foreign range recorded in the graph; the output comes from the binding table.
    let out_slot = BufferRange::slot(0, 0, WORDS * 4).unwrap();
    let mut cb = q.create_command_buffer_with_bindings(1).unwrap();
    record_spin_fill(&mut *cb, &kernels, SPIN_NS, &out_slot, POISON);
    cb.barrier().unwrap();
    record_add(&mut *cb, &kernels, &out_slot, &x_loan.range(), 1);
    let cb = cb.end().unwrap();
    q.execute_with_bindings(&[(&s, 1)], &[(&s, 2)], &[(&cb, &[w_loan.range()])])
        .unwrap_or_else(|e| panic!("execute: {e}"));

    // Back to cudarc: the crossing stream waits for signal 2, then cudarc records the slices'
    // uses on it.
    x_loan.give_back(&s, 2, TIMEOUT).unwrap();
    w_loan.give_back(&s, 2, TIMEOUT).unwrap();
    drop((x_loan, w_loan));

    // cudarc consumes on a third stream, ordered only by cudarc's tracking of w.
    let mut out = consumer.alloc_zeros::<u32>(WORDS).unwrap();
    launcher.add(&consumer, &mut out, &w, 7);
    let got = consumer.clone_dtoh(&out).unwrap();
    for (i, (g, d)) in got.iter().zip(&data).enumerate() {
        assert_eq!(
            *g,
            d.wrapping_add(1).wrapping_add(7),
            "word {i}: a crossing did not order the work on the device"
        );
    }
    wait(&s, 2);
    drop(cb);
}
