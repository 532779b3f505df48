//! [`Scheduler`]: the device half of a resident queue, as `cuhal-resident` drives it. It owns
//! the scheduler graph (one kernel node, `cuhal_resident_schedule` from
//! `kernels/resident/scheduler.cu`, instantiated for device launch), the stream its chains run
//! on, and the kernel's device-memory state; it starts a chain when none runs, stops it at
//! shutdown, and reports the device's health.
//!
//! Starting and exiting follow `cuhal_resident::ChainStarter` (the host) and
//! `cuhal_resident::chain_try_exit` (the kernel's steps, in Rust), modelled together in loom: a
//! chain is started with `cuGraphLaunch` on the queue's stream, behind any chain still running,
//! so two never run at once.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cuhal_resident::ChainStarter;
use cuhal_semaphore::Failure;
use cuhal_sys::{
    CU_STREAM_NON_BLOCKING, CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH, CUDA_KERNEL_NODE_PARAMS,
    CUdeviceptr, CUgraph, CUgraphExec, CUgraphNode, PrimaryContext, Stream, cu,
};

use super::memory::{
    Block, CONSUMED, CONTROL, EXITS, LOST, PRODUCED, RINGS, SHUTTING_DOWN, TAIL_FAILURES,
};
use crate::error::{Error, Result};

/// The scheduler kernel's name in its cubins.
const KERNEL: &str = "cuhal_resident_schedule";
/// The cubins' module name in a context's resident modules.
const MODULE: &str = "cuhal-resident-scheduler";

/// The scheduler cubins built into cuhal (`kernels/resident/build.sh`, CUDA 13.0):
/// (architecture as major * 10 + minor, image).
const BUILT_IN: &[(u32, &[u8])] = &[
    (
        80,
        include_bytes!("../../kernels/resident/scheduler_sm_80.cubin"),
    ),
    (
        86,
        include_bytes!("../../kernels/resident/scheduler_sm_86.cubin"),
    ),
    (
        89,
        include_bytes!("../../kernels/resident/scheduler_sm_89.cubin"),
    ),
    (
        90,
        include_bytes!("../../kernels/resident/scheduler_sm_90.cubin"),
    ),
    (
        100,
        include_bytes!("../../kernels/resident/scheduler_sm_100.cubin"),
    ),
    (
        120,
        include_bytes!("../../kernels/resident/scheduler_sm_120.cubin"),
    ),
];

/// A directory holding `scheduler_sm_XY.cubin` files, looked at before the built-in cubins (for
/// other architectures).
pub const RESIDENT_SCHEDULER_DIR_ENV: &str = "CUHAL_RESIDENT_SCHEDULER_DIR";

/// The scheduler cubin for compute capability `cc` ([`cuhal_sys::cubin_from_dir_or`]).
pub(crate) fn image(cc: (i32, i32)) -> Option<std::borrow::Cow<'static, [u8]>> {
    cuhal_sys::cubin_from_dir_or(cc, RESIDENT_SCHEDULER_DIR_ENV, "scheduler", BUILT_IN)
}

/// The kernel's one parameter, `SchedulerParams` in `scheduler.cu`, field for field.
#[derive(Clone, Copy)]
#[repr(C)]
struct Params {
    produced: CUdeviceptr,
    consumed: CUdeviceptr,
    rings: CUdeviceptr,
    exits: CUdeviceptr,
    control: CUdeviceptr,
    tail_failures: CUdeviceptr,
    descriptors: CUdeviceptr,
    completions: CUdeviceptr,
    launch_errors: CUdeviceptr,
    host_slots: CUdeviceptr,
    device_slots: CUdeviceptr,
    state: CUdeviceptr,
    capacity: u64,
    idle_ns: u64,
    next: u64,
    slots: u32,
    max_launches: u32,
}

const _: () = assert!(std::mem::size_of::<Params>() == 128);

/// How many times `stop` starts a chain to finish what is left in the ring.
const STOP_TRIES: usize = 3;

/// Device memory the kernel keeps between executions: the launched batch's end, executions,
/// chains running and a flag set if two ever ran at once (8 words).
const STATE_BYTES: usize = 64;

/// A resident queue's device scheduler.
pub(crate) struct Scheduler {
    context: Arc<PrimaryContext>,
    block: Arc<Block>,
    stream: Stream,
    /// The graph the host launches to start a chain; it tail-launches `twin`.
    start: Owned,
    /// The graph only the device launches: every later execution of a chain.
    twin: Owned,
    state: CUdeviceptr,
    /// Chains started (`exits` reaching their count means none runs).
    starter: ChainStarter,
    /// Failed tail launches already answered with a restart.
    restarted: AtomicU64,
    /// Set once `stop` has returned: no ring starts a chain after it (the executables the ring
    /// named may be gone).
    stopped: std::sync::atomic::AtomicBool,
}

// SAFETY: the graph, executable and state are owned handles, used under the driver's own thread
// safety (launches and queries of one executable are serialized by `starts`' lock or are
// read-only); they are destroyed once, in Drop.
unsafe impl Send for Scheduler {}
// SAFETY: as above.
unsafe impl Sync for Scheduler {}

impl Scheduler {
    /// Builds the scheduler graph for `block` on `context` (current on this thread).
    pub(crate) fn new(
        context: &Arc<PrimaryContext>,
        block: Arc<Block>,
        image: &[u8],
        idle_exit: Duration,
        max_launches: u32,
    ) -> Result<Self> {
        let api = context.api();
        let _bound = context.enter()?;
        let module =
            context.resident_module(MODULE, |c| cuhal_sys::Module::load_cubin(c, image))?;
        let function = module.function(KERNEL)?;
        let stream = Stream::new(context, CU_STREAM_NON_BLOCKING)?;
        let mut state: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the context is current.
        unsafe { cu!(api, cuMemAlloc(&mut state, STATE_BYTES)) }?;
        let mut this = Scheduler {
            context: context.clone(),
            block,
            stream,
            start: Owned::none(),
            twin: Owned::none(),
            state,
            starter: ChainStarter::new(),
            restarted: AtomicU64::new(0),
            stopped: std::sync::atomic::AtomicBool::new(false),
        };
        // SAFETY: `state` is a live allocation of STATE_BYTES; the stream is live.
        unsafe {
            cu!(
                api,
                cuMemsetD8Async(state, 0, STATE_BYTES, this.stream.raw())
            )
        }?;
        let layout = this.block.layout;
        let line = |l: usize| this.block.device(l * 128);
        let params = Params {
            produced: line(PRODUCED),
            consumed: line(CONSUMED),
            rings: line(RINGS),
            exits: line(EXITS),
            control: line(CONTROL),
            tail_failures: line(TAIL_FAILURES),
            descriptors: this.block.device(layout.descriptors()),
            completions: this.block.device(layout.completions()),
            launch_errors: this.block.device(layout.launch_errors()),
            host_slots: this.block.device(layout.host_slots()),
            device_slots: this.block.device(layout.device_slots()),
            state,
            capacity: layout.capacity as u64,
            idle_ns: u64::try_from(idle_exit.as_nanos()).unwrap_or(u64::MAX),
            next: 0,
            slots: layout.slots as u32,
            max_launches,
        };
        this.twin = Owned::new(context, &this.stream, function, params)?;
        let start = Params {
            next: this.twin.exec as u64,
            ..params
        };
        this.start = Owned::new(context, &this.stream, function, start)?;
        this.stream.synchronize()?;
        Ok(this)
    }

    /// Starts a chain on the queue's stream (the ring found none running).
    #[cold]
    fn launch_chain(&self) -> Result<()> {
        let _bound = self.context.enter()?;
        // SAFETY: a live device-launchable executable, uploaded, and the queue's live stream.
        unsafe {
            cu!(
                self.context.api(),
                cuGraphLaunch(self.start.exec, self.stream.raw())
            )
        }?;
        Ok(())
    }

    /// The context the scheduler runs in.
    pub(crate) fn context(&self) -> &Arc<PrimaryContext> {
        &self.context
    }

    /// The queue's mapped block.
    pub(crate) fn block(&self) -> &Block {
        &self.block
    }

    /// Chains the host started.
    pub(crate) fn starts(&self) -> u64 {
        self.starter.starts()
    }

    /// The kernel's state words (for stats and tests): batch end, executions, chains running,
    /// and 1 if two chains ever ran at once. Synchronizes with the scheduler's stream.
    pub(crate) fn state(&self) -> Result<[u64; 4]> {
        let _bound = self.context.enter()?;
        let mut words = [0u64; 4];
        // SAFETY: `state` is a live allocation of at least 32 bytes; `words` is 32 bytes.
        unsafe {
            cu!(
                self.context.api(),
                cuMemcpyDtoH(words.as_mut_ptr().cast(), self.state, 32)
            )
        }?;
        Ok(words)
    }

    /// The chains the device says have ended.
    pub(crate) fn exits(&self) -> u64 {
        self.block.line(EXITS).load(Ordering::SeqCst)
    }
}

impl Scheduler {
    /// Rings; starts a chain if none runs.
    fn ring_and_start(&self) -> std::result::Result<(), Failure> {
        self.starter
            .ring(self.block.line(RINGS), self.block.line(EXITS), || {
                self.launch_chain()
            })
            .map(drop)
            .map_err(Failure::new)
    }

    /// Whether the ring holds descriptors the device has not finished.
    fn has_left(&self) -> bool {
        self.block.line(PRODUCED).load(Ordering::SeqCst)
            != self.block.line(CONSUMED).load(Ordering::SeqCst)
    }
}

impl cuhal_resident::DeviceScheduler for Scheduler {
    fn ring(&self) -> std::result::Result<(), Failure> {
        if self.stopped.load(Ordering::SeqCst) {
            self.block.line(RINGS).fetch_add(1, Ordering::SeqCst);
            return Ok(());
        }
        self.ring_and_start()
    }

    fn stop(&self, lost: bool) {
        // Only upward: a shutdown after a loss must not let a chain launch again.
        let control = if lost { LOST } else { SHUTTING_DOWN };
        self.block
            .line(CONTROL)
            .fetch_max(control, Ordering::SeqCst);
        // A chain must see it and finish what is in the ring: start one if none runs. A chain
        // that ends on a failed relaunch leaves its batch for the next: look again, a few
        // times, then as lost (a lost chain launches nothing, so it never relaunches: it
        // finishes everything).
        for attempt in 0..=STOP_TRIES {
            if !self.has_left() {
                self.block.line(RINGS).fetch_add(1, Ordering::SeqCst);
                break;
            }
            if attempt == STOP_TRIES {
                self.block.line(CONTROL).fetch_max(LOST, Ordering::SeqCst);
            }
            let _ = self.ring_and_start();
            if self.stream.synchronize().is_err() {
                break;
            }
        }
        self.stopped.store(true, Ordering::SeqCst);
        let _ = self.stream.synchronize();
    }

    fn restart_stalled(&self) -> std::result::Result<(), Failure> {
        let failures = self.block.line(TAIL_FAILURES).load(Ordering::SeqCst);
        // Answered only by a start made once the failed chain has said it ended: until then
        // (or while another chain runs, which publishes the batch anyway) a ring starts nothing.
        if self.restarted.load(Ordering::SeqCst) == failures || self.exits() < self.starts() {
            return Ok(());
        }
        cuhal_resident::DeviceScheduler::ring(self)?;
        self.restarted.store(failures, Ordering::SeqCst);
        Ok(())
    }

    fn health(&self) -> std::result::Result<(), Failure> {
        match self.stream.query() {
            Ok(_) => Ok(()),
            Err(error) => Err(Failure::new(Error::Driver(error))),
        }
    }

    fn launch_failure(&self, sequence: u64) -> Option<Failure> {
        let cell = (sequence % self.block.layout.capacity as u64) as usize;
        let word = self.block.launch_errors()[cell].load(Ordering::Acquire);
        (word >> 16 == sequence & (u64::MAX >> 16)).then(|| {
            Failure::msg(format!(
                "the device could not launch resident submission {sequence}: cudaGraphLaunch \
                 returned cudaError {}",
                word & 0xffff
            ))
        })
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        let api = self.context.api();
        let Ok(_bound) = self.context.enter() else {
            return;
        };
        let _ = self.stream.synchronize();
        self.start.destroy(&self.context);
        self.twin.destroy(&self.context);
        // SAFETY: a live allocation, freed once; no chain runs (the stream is synchronized, and
        // the queue stopped it before).
        unsafe {
            let _ = (api.cuMemFree)(self.state);
        }
    }
}

/// One scheduler graph: a kernel node of the scheduler with its parameters, instantiated for
/// device launch and uploaded.
struct Owned {
    graph: CUgraph,
    exec: CUgraphExec,
}

impl Owned {
    fn none() -> Self {
        Owned {
            graph: std::ptr::null_mut(),
            exec: std::ptr::null_mut(),
        }
    }

    /// Builds the graph of `function` with `params` (the context current), uploaded on `stream`.
    fn new(
        context: &Arc<PrimaryContext>,
        stream: &Stream,
        function: cuhal_sys::CUfunction,
        mut params: Params,
    ) -> Result<Self> {
        let api = context.api();
        let mut this = Owned::none();
        let mut args: [*mut c_void; 1] = [(&raw mut params).cast()];
        let node_params = CUDA_KERNEL_NODE_PARAMS::one_thread(function, args.as_mut_ptr());
        let made = (|| -> Result<()> {
            // SAFETY: valid out-pointer; the context is current.
            unsafe { cu!(api, cuGraphCreate(&mut this.graph, 0)) }?;
            let mut node: CUgraphNode = std::ptr::null_mut();
            // SAFETY: a live graph; `node_params` points at `args`, which points at `params`,
            // all alive for the call (the driver copies the parameter values).
            unsafe {
                cu!(
                    api,
                    cuGraphAddKernelNode(&mut node, this.graph, std::ptr::null(), 0, &node_params)
                )
            }?;
            // SAFETY: a live graph holding one kernel node; valid out-pointer.
            unsafe {
                cu!(
                    api,
                    cuGraphInstantiateWithFlags(
                        &mut this.exec,
                        this.graph,
                        CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH
                    )
                )
            }?;
            // SAFETY: a live executable and stream; device launch needs the upload first.
            unsafe { cu!(api, cuGraphUpload(this.exec, stream.raw())) }?;
            Ok(())
        })();
        if let Err(error) = made {
            this.destroy(context);
            return Err(error);
        }
        Ok(this)
    }

    /// Destroys what was made (the context's stream synchronized: nothing runs it).
    fn destroy(&mut self, context: &PrimaryContext) {
        let api = context.api();
        // SAFETY: each handle is live or null (never made), and destroyed once (nulled here).
        unsafe {
            if !self.exec.is_null() {
                let _ = (api.cuGraphExecDestroy)(self.exec);
            }
            if !self.graph.is_null() {
                let _ = (api.cuGraphDestroy)(self.graph);
            }
        }
        *self = Owned::none();
    }
}
