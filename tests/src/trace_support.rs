//! Helpers for the tracing tests (`tests/trace.rs`): a stream, a graph, and a kernel that spins
//! for a given number of nanoseconds of `%globaltimer`, so a zone around it has a known length.

use std::ffi::c_void;
use std::sync::Arc;

use cuhal_sys::{
    CUDA_KERNEL_NODE_PARAMS, CUfunction, CUgraph, CUgraphExec, CUgraphNode, Error, Module,
    PrimaryContext, cu,
};
use cuhal_trace::{CuptiChoice, MemorySink, PoolLimits, TraceConfig, TraceContext, Verbosity};

/// `spin(u64 ns, u64 *out)`: one thread reads `%globaltimer` until `ns` nanoseconds have passed
/// since it started; if `out` is not null it writes the start and end readings to `out[0..2]`.
pub const SPIN_PTX: &str = r#"
.version 7.0
.target sm_52
.address_size 64

.visible .entry spin(
    .param .u64 spin_ns,
    .param .u64 spin_out
)
{
    .reg .pred  %p<3>;
    .reg .b64   %rd<8>;

    ld.param.u64        %rd1, [spin_ns];
    ld.param.u64        %rd2, [spin_out];
    mov.u64             %rd3, %globaltimer;
SPIN_LOOP:
    mov.u64             %rd4, %globaltimer;
    sub.u64             %rd5, %rd4, %rd3;
    setp.lt.u64         %p1, %rd5, %rd1;
    @%p1 bra            SPIN_LOOP;

    setp.eq.u64         %p2, %rd2, 0;
    @%p2 bra            SPIN_DONE;
    cvta.to.global.u64  %rd6, %rd2;
    st.global.u64       [%rd6], %rd3;
    st.global.u64       [%rd6+8], %rd4;
SPIN_DONE:
    ret;
}
"#;

/// The entry point of [`SPIN_PTX`].
pub const SPIN_NAME: &str = "spin";

/// `spin_span(u64 ns, u64 *out)`: as [`SPIN_PTX`], but it stamps its whole span, not only its
/// loop. It writes four `%globaltimer` readings to `out[0..4]`: its first instruction (before
/// it loads its parameters), the loop's start (after them; the spin is timed from here, as
/// `spin`'s), the loop's last reading, and a reading after its stores of the first three have
/// reached global memory (`membar.gl`). `out[3] - out[0]` is as much of the kernel as a kernel
/// can time itself; only its launch before the first instruction, its last store and its exit
/// stay outside.
pub const SPIN_SPAN_PTX: &str = r#"
.version 7.0
.target sm_52
.address_size 64

.visible .entry spin_span(
    .param .u64 spin_ns,
    .param .u64 spin_out
)
{
    .reg .pred  %p<2>;
    .reg .b64   %rd<10>;

    mov.u64             %rd1, %globaltimer;
    ld.param.u64        %rd2, [spin_ns];
    ld.param.u64        %rd3, [spin_out];
    cvta.to.global.u64  %rd4, %rd3;
    mov.u64             %rd5, %globaltimer;
SPAN_LOOP:
    mov.u64             %rd6, %globaltimer;
    sub.u64             %rd7, %rd6, %rd5;
    setp.lt.u64         %p1, %rd7, %rd2;
    @%p1 bra            SPAN_LOOP;

    st.global.u64       [%rd4], %rd1;
    st.global.u64       [%rd4+8], %rd5;
    st.global.u64       [%rd4+16], %rd6;
    membar.gl;
    mov.u64             %rd8, %globaltimer;
    st.global.u64       [%rd4+24], %rd8;
    ret;
}
"#;

/// The entry point of [`SPIN_SPAN_PTX`].
pub const SPIN_SPAN_NAME: &str = "spin_span";

/// A non-blocking stream of its own (the command helpers' [`Stream`](crate::command_support::Stream)), and its constructor.
pub use crate::command_support::{Stream as TraceStream, stream as trace_stream};

/// The spin kernel, loaded.
pub struct Spin {
    context: Arc<PrimaryContext>,
    /// Keeps `function` loaded.
    #[allow(dead_code)]
    module: Module,
    function: CUfunction,
}

impl Spin {
    /// JIT-compiles [`SPIN_PTX`] in `context`.
    pub fn load(context: &Arc<PrimaryContext>) -> Result<Self, Error> {
        let module = Module::load_ptx(context, SPIN_PTX)?;
        let function = module.function(SPIN_NAME)?;
        Ok(Self {
            context: context.clone(),
            module,
            function,
        })
    }

    /// Enqueues one thread spinning for `ns` nanoseconds on `stream`.
    pub fn launch(&self, stream: &TraceStream, ns: u64) -> Result<(), Error> {
        let api = self.context.api();
        let mut ns = ns;
        let mut out: u64 = 0;
        let mut params: [*mut c_void; 2] = [(&raw mut ns).cast(), (&raw mut out).cast()];
        // SAFETY: `spin` takes (u64, u64) and `params` points at one of each, read during the
        // call; the stream and function are live objects of this context.
        unsafe {
            cu!(
                api,
                cuLaunchKernel(
                    self.function,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    stream.raw(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut()
                )
            )
        }
    }

    /// The raw function, for command buffers.
    pub fn raw(&self) -> CUfunction {
        self.function
    }

    /// Adds a node running one thread spinning for `ns` to `graph`, after `deps`.
    pub fn add_node(
        &self,
        graph: &Graph,
        deps: &[CUgraphNode],
        ns: u64,
    ) -> Result<CUgraphNode, Error> {
        let api = self.context.api();
        let mut ns = ns;
        let mut out: u64 = 0;
        let mut params: [*mut c_void; 2] = [(&raw mut ns).cast(), (&raw mut out).cast()];
        let node_params = CUDA_KERNEL_NODE_PARAMS::one_thread(self.function, params.as_mut_ptr());
        let mut node: CUgraphNode = std::ptr::null_mut();
        // SAFETY: the parameters are copied into the graph during the call; `deps` are nodes
        // of `graph`; every handle is live.
        unsafe {
            cu!(
                api,
                cuGraphAddKernelNode(
                    &mut node,
                    graph.raw(),
                    deps.as_ptr(),
                    deps.len(),
                    &node_params
                )
            )
        }?;
        Ok(node)
    }
}

/// A graph and, once instantiated, its executable.
pub struct Graph {
    context: Arc<PrimaryContext>,
    graph: CUgraph,
    exec: CUgraphExec,
}

impl Graph {
    /// An empty graph.
    pub fn new(context: &Arc<PrimaryContext>) -> Result<Self, Error> {
        context.bind()?;
        let api = context.api();
        let mut graph: CUgraph = std::ptr::null_mut();
        // SAFETY: valid out-pointer; flags must be 0.
        unsafe { cu!(api, cuGraphCreate(&mut graph, 0)) }?;
        Ok(Self {
            context: context.clone(),
            graph,
            exec: std::ptr::null_mut(),
        })
    }

    /// The raw graph.
    pub fn raw(&self) -> CUgraph {
        self.graph
    }

    /// Instantiates the graph.
    pub fn instantiate(&mut self) -> Result<(), Error> {
        let api = self.context.api();
        // SAFETY: valid out-pointer; the graph is complete.
        unsafe {
            cu!(
                api,
                cuGraphInstantiateWithFlags(&mut self.exec, self.graph, 0)
            )
        }
    }

    /// Launches the instantiated graph on `stream`.
    pub fn launch(&self, stream: &TraceStream) -> Result<(), Error> {
        assert!(!self.exec.is_null(), "instantiate first");
        let api = self.context.api();
        // SAFETY: both handles are live objects of this context.
        unsafe { cu!(api, cuGraphLaunch(self.exec, stream.raw())) }
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if self.context.bind().is_ok() {
            let api = self.context.api();
            // SAFETY: created here, destroyed once; launched work completes on its own.
            unsafe {
                if !self.exec.is_null() {
                    let _ = cu!(api, cuGraphExecDestroy(self.exec));
                }
                let _ = cu!(api, cuGraphDestroy(self.graph));
            }
        }
    }
}

/// A tracing context at `verbosity` with a pool of `limits`, collecting into a memory sink.
pub fn traced(
    context: &Arc<PrimaryContext>,
    verbosity: Verbosity,
    limits: PoolLimits,
) -> (TraceContext, Arc<MemorySink>) {
    let sink = Arc::new(MemorySink::new());
    // These tests time commands by events (issued by hand, without a queue's launch capture);
    // CUPTI's zones have their own tests.
    let config = TraceConfig {
        pool: limits,
        cupti: CuptiChoice::Off,
        ..TraceConfig::new(verbosity, "test queue")
    };
    let trace = TraceContext::new(context.clone(), config, sink.clone()).expect("tracing context");
    (trace, sink)
}
