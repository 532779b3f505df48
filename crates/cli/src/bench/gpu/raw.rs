//! Owned raw driver objects for the floors: each is created and destroyed with the plain driver
//! calls the floor measures, nothing of cuhal's in between.
//!
//! Every object keeps the primary context alive and makes it current before it is destroyed, so
//! drop order never matters. Destruction errors are ignored: a benchmark that already failed
//! has reported why.

use std::ffi::{CString, c_char, c_uint, c_void};
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use anyhow::{Context as _, Result, bail};
use cuhal_sys::{
    CU_EVENT_BLOCKING_SYNC, CU_EVENT_DISABLE_TIMING, CU_JIT_ERROR_LOG_BUFFER,
    CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_MEMHOSTALLOC_DEVICEMAP, CU_MEMHOSTALLOC_PORTABLE,
    CU_STREAM_NON_BLOCKING, CUDA_KERNEL_NODE_PARAMS, CUdeviceptr, CUevent, CUfunction, CUgraph,
    CUgraphExec, CUgraphNode, CUjit_option, CUmodule, CUresult, CUstream, DriverApi,
    PrimaryContext,
};

/// A `CU_STREAM_NON_BLOCKING` stream, as cuhal's queues use.
pub struct Stream {
    ctx: Arc<PrimaryContext>,
    raw: CUstream,
}

impl Stream {
    /// Creates a non-blocking stream.
    pub fn new(ctx: &Arc<PrimaryContext>) -> Result<Self> {
        let api = ctx.api();
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the context is current on this thread.
        api.check("cuStreamCreate", unsafe {
            (api.cuStreamCreate)(&mut raw, CU_STREAM_NON_BLOCKING)
        })?;
        Ok(Self {
            ctx: ctx.clone(),
            raw,
        })
    }

    /// The handle.
    pub fn raw(&self) -> CUstream {
        self.raw
    }

    /// Waits for everything on the stream.
    pub fn sync(&self) -> Result<()> {
        let api = self.ctx.api();
        // SAFETY: a live stream.
        api.check("cuStreamSynchronize", unsafe {
            (api.cuStreamSynchronize)(self.raw)
        })?;
        Ok(())
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: a live stream, destroyed once.
        let _ = unsafe { (self.ctx.api().cuStreamDestroy)(self.raw) };
    }
}

/// How an event's host waits behave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    /// `cuEventSynchronize` spins (the default; what cuhal's completion events use).
    Spin,
    /// `CU_EVENT_BLOCKING_SYNC`: the waiting thread sleeps in the driver.
    Blocking,
}

/// A `CU_EVENT_DISABLE_TIMING` event.
pub struct Event {
    ctx: Arc<PrimaryContext>,
    raw: CUevent,
}

impl Event {
    /// Creates an event without timing.
    pub fn new(ctx: &Arc<PrimaryContext>, mode: SyncMode) -> Result<Self> {
        let api = ctx.api();
        let flags = match mode {
            SyncMode::Spin => CU_EVENT_DISABLE_TIMING,
            SyncMode::Blocking => CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC,
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        api.check("cuEventCreate", unsafe {
            (api.cuEventCreate)(&mut raw, flags)
        })?;
        Ok(Self {
            ctx: ctx.clone(),
            raw,
        })
    }

    /// The handle.
    pub fn raw(&self) -> CUevent {
        self.raw
    }

    /// Records the event on `stream` and waits for it (`cuEventRecord` + `cuEventSynchronize`):
    /// the raw driver's way to wait for everything enqueued so far.
    pub fn record_and_sync(&self, stream: &Stream) -> Result<()> {
        let api = self.ctx.api();
        // SAFETY: a live event and a live stream of the same context.
        api.check("cuEventRecord", unsafe {
            (api.cuEventRecord)(self.raw, stream.raw())
        })?;
        // SAFETY: a live, recorded event.
        api.check("cuEventSynchronize", unsafe {
            (api.cuEventSynchronize)(self.raw)
        })?;
        Ok(())
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: a live event, destroyed once (the driver defers the release if it is pending).
        let _ = unsafe { (self.ctx.api().cuEventDestroy)(self.raw) };
    }
}

/// Device memory holding `u64` words.
pub struct DeviceWords {
    ctx: Arc<PrimaryContext>,
    ptr: CUdeviceptr,
    words: usize,
}

impl DeviceWords {
    /// Allocates `words` zeroed words.
    pub fn zeroed(ctx: &Arc<PrimaryContext>, words: usize) -> Result<Self> {
        let api = ctx.api();
        let mut ptr = 0;
        // SAFETY: `ptr` is a valid out-pointer.
        api.check("cuMemAlloc", unsafe {
            (api.cuMemAlloc)(&mut ptr, words * 8)
        })?;
        let this = Self {
            ctx: ctx.clone(),
            ptr,
            words,
        };
        this.write(&vec![0; words])?;
        Ok(this)
    }

    /// The device address.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The address of word `i`.
    pub fn word(&self, i: usize) -> CUdeviceptr {
        debug_assert!(i < self.words);
        self.ptr + 8 * i as u64
    }

    /// Reads every word. Synchronous on the legacy stream only: synchronize the streams that
    /// write it first.
    pub fn read(&self) -> Result<Vec<u64>> {
        let mut out = vec![0u64; self.words];
        let api = self.ctx.api();
        // SAFETY: `out` has room for the allocation's `words * 8` bytes.
        api.check("cuMemcpyDtoH", unsafe {
            (api.cuMemcpyDtoH)(out.as_mut_ptr().cast(), self.ptr, self.words * 8)
        })?;
        Ok(out)
    }

    /// Overwrites the first `values.len()` words.
    pub fn write(&self, values: &[u64]) -> Result<()> {
        if values.len() > self.words {
            bail!("writing {} words into {}", values.len(), self.words);
        }
        let api = self.ctx.api();
        // SAFETY: the source holds `values.len() * 8` bytes; the allocation is at least as large.
        api.check("cuMemcpyHtoD", unsafe {
            (api.cuMemcpyHtoD)(self.ptr, values.as_ptr().cast(), values.len() * 8)
        })?;
        Ok(())
    }
}

impl Drop for DeviceWords {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: a live allocation, freed once.
        let _ = unsafe { (self.ctx.api().cuMemFree)(self.ptr) };
    }
}

/// Pinned host memory mapped into the device's address space: `u32` flags the GPU writes and a
/// host thread watches.
pub struct MappedFlags {
    ctx: Arc<PrimaryContext>,
    host: *mut c_void,
    device: CUdeviceptr,
    count: usize,
}

// SAFETY: the memory is plain pinned host memory, only accessed through atomics; the handle
// values are only read after construction.
unsafe impl Send for MappedFlags {}
// SAFETY: as above.
unsafe impl Sync for MappedFlags {}

impl MappedFlags {
    /// Allocates `count` zeroed flags.
    pub fn new(ctx: &Arc<PrimaryContext>, count: usize) -> Result<Self> {
        let api = ctx.api();
        let bytes = count.max(1) * 4;
        let mut host = std::ptr::null_mut();
        // SAFETY: `host` is a valid out-pointer.
        api.check("cuMemHostAlloc", unsafe {
            (api.cuMemHostAlloc)(
                &mut host,
                bytes,
                CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP,
            )
        })?;
        let mut this = Self {
            ctx: ctx.clone(),
            host,
            device: 0,
            count,
        };
        // SAFETY: `host` points to `bytes` writable bytes that no device work uses yet.
        unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, bytes) };
        let mut device = 0;
        // SAFETY: `host` came from cuMemHostAlloc with DEVICEMAP; flags must be 0.
        api.check("cuMemHostGetDevicePointer", unsafe {
            (api.cuMemHostGetDevicePointer)(&mut device, host, 0)
        })?;
        this.device = device;
        Ok(this)
    }

    /// The device address of flag `i`.
    pub fn device(&self, i: usize) -> CUdeviceptr {
        assert!(i < self.count);
        self.device + 4 * i as u64
    }

    /// Flag `i`, as the host sees it.
    pub fn flag(&self, i: usize) -> &AtomicU32 {
        assert!(i < self.count);
        // SAFETY: in bounds of the allocation, 4-byte aligned (pinned allocations are page
        // aligned), valid for the life of `self`; the GPU only stores whole aligned words.
        unsafe { &*self.host.cast::<AtomicU32>().add(i) }
    }
}

impl Drop for MappedFlags {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: a live pinned allocation, freed once.
        let _ = unsafe { (self.ctx.api().cuMemFreeHost)(self.host) };
    }
}

/// A loaded module.
pub struct Module {
    ctx: Arc<PrimaryContext>,
    raw: CUmodule,
}

impl Module {
    /// Compiles and loads PTX text; a compile error carries the JIT's log.
    pub fn load_ptx(ctx: &Arc<PrimaryContext>, ptx: &str) -> Result<Self> {
        let api = ctx.api();
        let image = CString::new(ptx).context("the PTX text contains a NUL byte")?;
        let mut log = vec![0u8; 16 * 1024];
        let mut options: [CUjit_option; 2] =
            [CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
        // The size option's value travels in the pointer itself, as cuda.h specifies.
        let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), log.len() as *mut c_void];
        let mut raw = std::ptr::null_mut();
        // SAFETY: the image is NUL-terminated PTX; the option arrays have the stated length and
        // the log buffer outlives the call.
        let r = unsafe {
            (api.cuModuleLoadDataEx)(
                &mut raw,
                image.as_ptr().cast(),
                options.len() as c_uint,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        };
        if !r.is_success() {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]).trim().to_owned();
            return Err(api.error("cuModuleLoadDataEx", r))
                .with_context(|| format!("compiling the benchmark kernels: {text}"));
        }
        Ok(Self {
            ctx: ctx.clone(),
            raw,
        })
    }

    /// The kernel `name`.
    pub fn function(&self, name: &str) -> Result<CUfunction> {
        let api = self.ctx.api();
        let cname = CString::new(name)?;
        let mut f = std::ptr::null_mut();
        // SAFETY: a live module, a NUL-terminated name, a valid out-pointer.
        api.check("cuModuleGetFunction", unsafe {
            (api.cuModuleGetFunction)(&mut f, self.raw, cname.as_ptr() as *const c_char)
        })
        .with_context(|| format!("kernel {name}"))?;
        Ok(f)
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: a live module, unloaded once, after every launch of its kernels finished (the
        // benchmarks synchronize before dropping).
        let _ = unsafe { (self.ctx.api().cuModuleUnload)(self.raw) };
    }
}

/// An instantiated graph.
pub struct GraphExec {
    ctx: Arc<PrimaryContext>,
    raw: CUgraphExec,
}

impl GraphExec {
    /// Builds a graph of kernel nodes, each depending on the one before it (a chain; one node
    /// is a one-node graph), and instantiates it. Each node's arguments are copied at creation.
    pub fn chain(ctx: &Arc<PrimaryContext>, nodes: &mut [KernelNode]) -> Result<Self> {
        let api = ctx.api();
        let mut graph: CUgraph = std::ptr::null_mut();
        // SAFETY: `graph` is a valid out-pointer; flags must be 0.
        api.check("cuGraphCreate", unsafe {
            (api.cuGraphCreate)(&mut graph, 0)
        })?;
        let result = Self::fill_and_instantiate(ctx, graph, nodes);
        // SAFETY: the graph is live; the executable does not depend on it after instantiation.
        let _ = unsafe { (api.cuGraphDestroy)(graph) };
        result
    }

    fn fill_and_instantiate(
        ctx: &Arc<PrimaryContext>,
        graph: CUgraph,
        nodes: &mut [KernelNode],
    ) -> Result<Self> {
        let api = ctx.api();
        let mut prev: Option<CUgraphNode> = None;
        for node in nodes.iter_mut() {
            let mut pointers = node.args.pointers();
            let params = CUDA_KERNEL_NODE_PARAMS {
                func: node.function,
                gridDimX: 1,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: 1,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: 0,
                kernelParams: pointers.as_mut_ptr(),
                extra: std::ptr::null_mut(),
                kern: std::ptr::null_mut(),
                ctx: std::ptr::null_mut(),
            };
            let mut added = std::ptr::null_mut();
            let (deps, count) = match &prev {
                Some(p) => (p as *const CUgraphNode, 1),
                None => (std::ptr::null(), 0),
            };
            // SAFETY: a live graph; `deps` points to `count` nodes of it; `params` and the
            // argument values it points to live across the call (the driver copies them).
            api.check("cuGraphAddKernelNode", unsafe {
                (api.cuGraphAddKernelNode)(&mut added, graph, deps, count, &params)
            })?;
            prev = Some(added);
        }
        let mut raw = std::ptr::null_mut();
        // SAFETY: a complete graph; `raw` is a valid out-pointer.
        api.check("cuGraphInstantiateWithFlags", unsafe {
            (api.cuGraphInstantiateWithFlags)(&mut raw, graph, 0)
        })?;
        Ok(Self {
            ctx: ctx.clone(),
            raw,
        })
    }

    /// The handle.
    pub fn raw(&self) -> CUgraphExec {
        self.raw
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: a live executable graph, destroyed once after its launches completed.
        let _ = unsafe { (self.ctx.api().cuGraphExecDestroy)(self.raw) };
    }
}

/// One kernel node of [`GraphExec::chain`].
pub struct KernelNode {
    /// The kernel.
    pub function: CUfunction,
    /// Its arguments.
    pub args: Args,
}

/// A kernel's arguments, by value.
#[derive(Clone, Copy, Debug)]
pub enum Args {
    /// `empty()`.
    None,
    /// `step(counter, errors, index, period)`.
    Step {
        /// Address of the `u32` counter.
        counter: CUdeviceptr,
        /// Address of the `u32` violation count.
        errors: CUdeviceptr,
        /// This launch's place in its chain.
        index: u32,
        /// The chain's length.
        period: u32,
    },
    /// `spin(ns, record, flag, jitter)`.
    Spin {
        /// How long to spin.
        ns: u64,
        /// Address of the three-word record (count, start, end).
        record: CUdeviceptr,
        /// Address of the mapped host flag, or 0.
        flag: CUdeviceptr,
        /// Upper bound of the extra SM cycles spun after `ns` (0 for none).
        jitter: u64,
    },
    /// `timer_probe(out, iters)`.
    Probe {
        /// Address of the three result words.
        out: CUdeviceptr,
        /// Reads to make.
        iters: u32,
    },
}

impl Args {
    /// The `kernelParams` array for these arguments: pointers into `self`, so `self` must stay
    /// where it is until the launch call returns.
    pub fn pointers(&mut self) -> [*mut c_void; 4] {
        fn p<T>(x: &mut T) -> *mut c_void {
            (x as *mut T).cast()
        }
        let null = std::ptr::null_mut();
        match self {
            Args::None => [null; 4],
            Args::Step {
                counter,
                errors,
                index,
                period,
            } => [p(counter), p(errors), p(index), p(period)],
            Args::Spin {
                ns,
                record,
                flag,
                jitter,
            } => [p(ns), p(record), p(flag), p(jitter)],
            Args::Probe { out, iters } => [p(out), p(iters), null, null],
        }
    }
}

/// Launches `function` as one thread on `stream`.
#[inline]
pub fn launch(
    api: &DriverApi,
    function: CUfunction,
    stream: CUstream,
    args: &mut Args,
) -> Result<()> {
    let mut pointers = args.pointers();
    // SAFETY: `pointers` points at argument values in `args` that match the kernel's parameter
    // list (the `Args` variant is chosen per kernel); both outlive the call, which copies them.
    let r: CUresult = unsafe {
        (api.cuLaunchKernel)(
            function,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            stream,
            pointers.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    api.check("cuLaunchKernel", r)?;
    Ok(())
}
