//! [`Driver`] and [`Device`]: loading the driver, opening a device with its queues.

use std::sync::Arc;
use std::time::Duration;

use cuhal_command::{Buffer, Executable, HostBuffer, PatchMethod};
use cuhal_scheduler::{CompletionOptions, QueueOptions, policy};
use cuhal_semaphore::{Failure, SemaphoreOptions};
use cuhal_sys::{DeviceInfo, DriverApi, PrimaryContext};
use cuhal_trace::{CuptiChoice, FineSampling, Sink, TraceConfig, TraceContext, Verbosity};

use crate::Semaphore;
use crate::error::{Error, Result};
use crate::event_pool::TimepointEventPool;
use crate::lost::Lost;
use crate::memory::{BufferMemory, MemoryPool};
use crate::queue::{CommandBufferMode, Queue, QueueSetup};
use crate::submissions::{IssueCount, Submissions};

/// The loaded CUDA driver.
#[derive(Clone, Debug)]
pub struct Driver {
    api: Arc<DriverApi>,
}

impl Driver {
    /// Loads the driver (`libcuda.so.1`, or `CUHAL_CUDA_LIBRARY`) and initializes it. Without a
    /// driver this is a typed error naming what was looked for; it never panics.
    pub fn load() -> Result<Self> {
        Ok(Self {
            api: Arc::new(DriverApi::load()?),
        })
    }

    /// The driver's function table.
    pub fn api(&self) -> &Arc<DriverApi> {
        &self.api
    }

    /// The driver's CUDA version (13000 for 13.0).
    pub fn version(&self) -> i32 {
        self.api.driver_version()
    }

    /// Every device the driver sees.
    pub fn devices(&self) -> Result<Vec<DeviceInfo>> {
        Ok(cuhal_sys::devices(&self.api)?)
    }

    /// Opens device `ordinal`.
    pub fn open(&self, ordinal: i32, options: DeviceOptions) -> Result<Device> {
        Device::open(self, ordinal, options)
    }
}

/// The most events [`DeviceOptions::reserved_events`] may ask for (the pool grows past it on
/// demand).
pub const MAX_RESERVED_EVENTS: usize = 1 << 16;

/// The most queues [`DeviceOptions::queues`] may ask for: each is a stream with two threads of
/// its own, so more is a mistake, refused with a typed error rather than run out of threads.
pub const MAX_QUEUES: usize = 256;

/// How a device is opened.
#[derive(Clone)]
pub struct DeviceOptions {
    /// Number of queues (each a stream with its own worker and completion threads). At least 1,
    /// at most [`MAX_QUEUES`].
    pub queues: usize,
    /// How [`Queue::create_command_buffer`](crate::Queue::create_command_buffer) builds command
    /// buffers; [`Queue::create_command_buffer_as`](crate::Queue::create_command_buffer_as)
    /// chooses per command buffer.
    pub command_buffer_mode: CommandBufferMode,
    /// Tracing verbosity of every queue (unless `queue_tracing` says otherwise); `Off` records
    /// nothing.
    pub tracing: Verbosity,
    /// Per-queue verbosities: entry `i`, where present, overrides `tracing` for queue `i`.
    pub queue_tracing: Vec<Verbosity>,
    /// Per-queue stream priorities (`cuStreamCreateWithPriority`: lower numbers run first; the
    /// driver clamps to `cuCtxGetStreamPriorityRange`). Queues without an entry get 0.
    pub queue_priorities: Vec<i32>,
    /// Where traced zones go (required for tracing to record anything).
    pub trace_sink: Option<Arc<dyn Sink>>,
    /// Where FINE command zones get their times: CUPTI's activity records when it can be had
    /// (the default), timing events otherwise.
    pub cupti: CuptiChoice,
    /// Which replays of each command buffer FINE times from CUPTI (default: every one; see
    /// [`FineSampling`]); the others are traced as COARSE is.
    pub fine_sampling: FineSampling,
    /// How the queues' completion threads spin and gather (see [`CompletionOptions`] and the
    /// scheduler's completion [`policy`](cuhal_scheduler::policy)). Default
    /// [`DEFAULT_COMPLETION`](Self::DEFAULT_COMPLETION).
    pub completion: CompletionOptions,
    /// Events created up front in each queue's pool (a pool grows on demand). Default
    /// [`DEFAULT_RESERVED_EVENTS`](Self::DEFAULT_RESERVED_EVENTS).
    pub reserved_events: usize,
    /// How many submissions a queue may have issued and not yet retired before a submit waits
    /// for its completion side to catch up: bounds the memory and events a backlog can take.
    /// Each queue makes room for this many when the device opens (at most eight gather batches,
    /// at least 256, at most `QueueOptions::MAX_CAPACITY`), so a backlog up to it allocates
    /// nothing.
    pub max_in_flight: usize,
    /// How graph command buffers with binding slots give their executables new addresses: on
    /// the host per changed node, or on the device by a helper node when many kernel nodes
    /// change ([`PatchMethod::Auto`], the default).
    pub patch_method: PatchMethod,
    /// Each traced queue's zone-stamp ring, in 16-byte stamps ([`TraceConfig::stamp_slots`]:
    /// FINE zones of dispatches whose kernels stamp themselves). Default
    /// [`cuhal_trace::DEFAULT_STAMP_SLOTS`]; 0 times such dispatches as any other.
    pub trace_stamp_slots: u32,
}

impl DeviceOptions {
    /// The default [`completion`](Self::completion): the scheduler's spin, a gather of
    /// [`DEFAULT_COMPLETION_GATHER`](Self::DEFAULT_COMPLETION_GATHER) with batches of
    /// [`DEFAULT_COMPLETION_GATHER_BATCH`](Self::DEFAULT_COMPLETION_GATHER_BATCH).
    pub const DEFAULT_COMPLETION: CompletionOptions = CompletionOptions::new()
        .with_gather(Self::DEFAULT_COMPLETION_GATHER)
        .with_gather_batch(Self::DEFAULT_COMPLETION_GATHER_BATCH);
    /// The default completion gather ([`CompletionOptions::gather`]), with
    /// [`DEFAULT_COMPLETION_GATHER_BATCH`](Self::DEFAULT_COMPLETION_GATHER_BATCH): twice the
    /// scheduler's suggestion. `cuhal bench` case 1 runs this, the scheduler's 400 us with
    /// batches of 128, and no gather side by side in one process; the choice and its figures are
    /// in the scheduler's decision record ("Completion gathering").
    pub const DEFAULT_COMPLETION_GATHER: Duration = Duration::from_micros(800);
    /// The default completion gather batch ([`CompletionOptions::gather_batch`]).
    pub const DEFAULT_COMPLETION_GATHER_BATCH: usize = 256;
    /// The scheduler's suggested gather (400 us), this crate's default until bench case 1 chose
    /// [`DEFAULT_COMPLETION_GATHER`](Self::DEFAULT_COMPLETION_GATHER).
    pub const SUGGESTED_COMPLETION_GATHER: Duration = CompletionOptions::SUGGESTED_GATHER;
    /// The default [`reserved_events`](Self::reserved_events): eight gather batches. A queue
    /// that gathers holds up to about three batches' completion events at once (one handed
    /// over, one deferred, one being retired), and the signal semaphores keep theirs until
    /// they pass them, which a host waiter's advance may leave to the next wait: bench case 1,
    /// with a host wait every 250 submissions, reached 256 events in flight and grew the pool
    /// by 256 inside its measured window. Reserving them up front keeps the pool from growing
    /// (one allocation and one `cuEventCreate` per new event) in the middle of a steady flow.
    pub const DEFAULT_RESERVED_EVENTS: usize = 8 * Self::DEFAULT_COMPLETION_GATHER_BATCH;
}

impl Default for DeviceOptions {
    fn default() -> Self {
        Self {
            queues: 1,
            command_buffer_mode: CommandBufferMode::Graph,
            tracing: Verbosity::Off,
            queue_tracing: Vec::new(),
            queue_priorities: Vec::new(),
            trace_sink: None,
            cupti: CuptiChoice::default(),
            fine_sampling: FineSampling::Every,
            completion: Self::DEFAULT_COMPLETION,
            reserved_events: Self::DEFAULT_RESERVED_EVENTS,
            max_in_flight: QueueOptions::DEFAULT_MAX_IN_FLIGHT,
            patch_method: PatchMethod::default(),
            trace_stamp_slots: cuhal_trace::DEFAULT_STAMP_SLOTS,
        }
    }
}

impl std::fmt::Debug for DeviceOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceOptions")
            .field("queues", &self.queues)
            .field("command_buffer_mode", &self.command_buffer_mode)
            .field("tracing", &self.tracing)
            .field("queue_tracing", &self.queue_tracing)
            .field("queue_priorities", &self.queue_priorities)
            .field("cupti", &self.cupti)
            .field("fine_sampling", &self.fine_sampling)
            .field("completion", &self.completion)
            .field("max_in_flight", &self.max_in_flight)
            .field("patch_method", &self.patch_method)
            .field("trace_stamp_slots", &self.trace_stamp_slots)
            .finish_non_exhaustive()
    }
}

/// An open device: its primary context, queues, their event pools and the memory pool.
///
/// Dropping the device shuts its queues down: work already issued completes, work still waiting
/// on semaphores fails, the threads are joined, and nothing leaks. Buffers, executables and
/// command buffers keep the context alive on their own and may outlive the device.
pub struct Device {
    // Queues first: they drop (and join their threads) before the pools they use.
    queues: Vec<Queue>,
    pub(crate) shared: DeviceShared,
    info: DeviceInfo,
    /// Each queue's completion/timepoint events (the queue's own, so that nothing a submission
    /// touches is shared with the other queues), for the counts.
    queue_events: Vec<TimepointEventPool>,
    semaphore_options: SemaphoreOptions,
    /// Ordinals of the devices whose memory this one reaches directly (peer access enabled).
    peers: std::sync::Mutex<Vec<i32>>,
}

/// What a device's queues share with it: the context, the timepoint event pool, the lost state
/// and the stream-ordered memory pool.
pub(crate) struct DeviceShared {
    /// The device's primary context.
    pub(crate) context: Arc<PrimaryContext>,
    /// Events for exported timepoints that need no recording (each queue's completion and
    /// timepoint events come from its own pool).
    pub(crate) events: TimepointEventPool,
    /// Whether a sticky error lost the device.
    pub(crate) lost: Arc<Lost>,
    /// Each queue's issues, which host waits and completion threads watch (`submissions.rs`).
    pub(crate) submissions: Arc<Submissions>,
    /// Stream-ordered allocations.
    pub(crate) memory: Arc<MemoryPool>,
    /// Where `create_buffer` allocates: the same pool, through a stream of its own.
    pub(crate) buffers: Arc<BufferMemory>,
}

impl Device {
    fn open(driver: &Driver, ordinal: i32, options: DeviceOptions) -> Result<Self> {
        let count = cuhal_sys::device_count(&driver.api)?;
        if ordinal < 0 || ordinal >= count {
            return Err(Error::NoSuchDevice { ordinal, count });
        }
        if options.queues == 0 {
            return Err(Error::InvalidArgument(
                "a device needs at least one queue".into(),
            ));
        }
        if options.queues > MAX_QUEUES {
            return Err(Error::InvalidArgument(format!(
                "{} queues: at most {MAX_QUEUES} (each is a stream with two threads)",
                options.queues
            )));
        }
        if options.reserved_events > MAX_RESERVED_EVENTS {
            return Err(Error::InvalidArgument(format!(
                "{} reserved events: at most {MAX_RESERVED_EVENTS} are created up front",
                options.reserved_events
            )));
        }
        let graph_tracing = options.command_buffer_mode == CommandBufferMode::Graph
            && options.trace_sink.is_some()
            && (0..options.queues).any(|i| {
                options
                    .queue_tracing
                    .get(i)
                    .copied()
                    .unwrap_or(options.tracing)
                    != Verbosity::Off
            });
        if graph_tracing && driver.api.cuGraphAddEventRecordNode.is_none() {
            // The one feature that needs the symbol was asked for: refuse it by name.
            return Err(Error::Driver(
                driver
                    .api
                    .missing_symbol(cuhal_sys::cu_name!(cuGraphAddEventRecordNode)),
            ));
        }
        let info = cuhal_sys::device_info(&driver.api, ordinal)?;
        let context = PrimaryContext::retain(driver.api.clone(), ordinal)?;
        let lost = Arc::new(Lost::default());
        let submissions = Arc::new(Submissions::new(options.queues));
        // The device's own pool serves exports only (see `interop.rs`); queues have their own.
        let events =
            TimepointEventPool::new(context.clone(), 0, lost.clone(), submissions.clone(), false)
                .map_err(|e| lost.filter(e))?;
        let memory = Arc::new(MemoryPool::new(context.clone()).map_err(|e| lost.filter(e))?);
        let buffers = BufferMemory::new(memory.clone()).map_err(|e| lost.filter(e))?;
        let shared = DeviceShared {
            context,
            events,
            lost,
            submissions,
            memory,
            buffers,
        };
        let context = &shared.context;
        let mut queue_events = Vec::with_capacity(options.queues);
        let mut queues = Vec::with_capacity(options.queues);
        for index in 0..options.queues {
            let label = format!("cuhal{ordinal}.{index}");
            let verbosity = options
                .queue_tracing
                .get(index)
                .copied()
                .unwrap_or(options.tracing);
            let trace = match (&options.trace_sink, verbosity) {
                (Some(sink), verbosity) if verbosity != Verbosity::Off => Some(
                    TraceContext::new(
                        context.clone(),
                        TraceConfig {
                            cupti: options.cupti.clone(),
                            fine_sampling: options.fine_sampling,
                            stamp_slots: options.trace_stamp_slots,
                            ..TraceConfig::new(verbosity, format!("GPU {ordinal} queue {index}"))
                        },
                        sink.clone(),
                    )
                    .map_err(|e| shared.lost.filter(e.into()))?,
                ),
                _ => None,
            };
            // A traced queue's completion events carry timing: they end its submissions' zones
            // (see the trace crate's submission entry), so tracing records no event of its own.
            let events = TimepointEventPool::new(
                context.clone(),
                options.reserved_events,
                shared.lost.clone(),
                shared.submissions.clone(),
                trace.is_some(),
            )
            .map_err(|e| shared.lost.filter(e))?;
            queue_events.push(events.clone());
            let setup = QueueSetup {
                options: QueueOptions::new(label)
                    .with_completion(options.completion)
                    .with_max_in_flight(options.max_in_flight)
                    .with_capacity(queue_capacity(&options)),
                events,
                issues: IssueCount {
                    submissions: shared.submissions.clone(),
                    queue: index,
                },
                priority: options.queue_priorities.get(index).copied().unwrap_or(0),
                mode: options.command_buffer_mode,
                patch_method: options.patch_method,
                trace,
            };
            queues.push(Queue::new(&shared, setup)?);
        }
        Ok(Self {
            queues,
            shared,
            info,
            queue_events,
            semaphore_options: SemaphoreOptions::new()
                .with_event_spin(policy::HOST_WAIT_SPIN)
                .with_busy_query_pace(policy::BUSY_QUERY_PACE),
            peers: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// What the device is.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The device's primary context.
    pub fn context(&self) -> &Arc<PrimaryContext> {
        &self.shared.context
    }

    /// Queue `index` (panics if out of range, like slice indexing; see [`Device::queues`]).
    pub fn queue(&self, index: usize) -> &Queue {
        &self.queues[index]
    }

    /// All queues.
    pub fn queues(&self) -> &[Queue] {
        &self.queues
    }

    /// The failure that lost the device (a sticky error), if it is lost.
    pub fn lost(&self) -> Option<Failure> {
        self.shared.lost.get().cloned()
    }

    fn check_alive(&self) -> Result<()> {
        self.shared.lost.check()
    }

    /// A timeline semaphore at `initial`, whose host waits spin on recorded device events for the
    /// `completion_policy::HOST_WAIT_SPIN`.
    pub fn create_semaphore(&self, initial: u64) -> Semaphore {
        Semaphore::with_options(initial, self.semaphore_options)
    }

    /// A device allocation of `len` bytes (256-byte aligned), usable by every queue and stream
    /// of the device (and of its peers, see [`Device::enable_peer_access`]) at once.
    ///
    /// The memory comes from the device's memory pool, and goes back to it, in stream order,
    /// when the last reference to the buffer goes: every queued use holds the buffer, so that is
    /// after all of cuhal's work on it, and dropping a buffer never waits for the device (a
    /// `cuMemFree` would wait for all of it, and stall other threads' submissions meanwhile).
    /// Work enqueued on the buffer outside cuhal (raw driver calls on its
    /// [`device_ptr`](Buffer::device_ptr)) must have completed before the last reference goes.
    /// The pool keeps freed memory for later buffers; when an allocation finds no room, it gives
    /// back what it keeps unused and tries again.
    pub fn create_buffer(&self, len: usize) -> Result<Arc<Buffer>> {
        self.check_alive()?;
        self.shared
            .buffers
            .allocate(len)
            .map_err(Error::allocating("buffer", len))
            .map_err(|e| self.shared.lost.filter(e))
    }

    /// A pinned host allocation of `len` bytes, for [`Queue::read`].
    pub fn create_host_buffer(&self, len: usize) -> Result<Arc<HostBuffer>> {
        self.check_alive()?;
        HostBuffer::new(&self.shared.context, len)
            .map(Arc::new)
            .map_err(|e| self.shared.lost.filter(e.into()))
    }

    /// Loads a PTX module (compiled by the driver; a compile error carries the JIT log).
    pub fn load_ptx(&self, ptx: &str) -> Result<Executable> {
        self.check_alive()?;
        Executable::load_ptx(&self.shared.context, ptx)
            .map_err(|e| self.shared.lost.filter(e.into()))
    }

    /// Loads a compiled image: a cubin (ELF, as `nvcc -cubin` or Triton write), a fatbin, or
    /// NUL-terminated PTX. The image's headers are checked before the driver reads it (the
    /// driver takes no length), so a truncated or foreign file is [`Error::Command`] with
    /// `BadImage`, not a read past its end.
    pub fn load_cubin(&self, image: &[u8]) -> Result<Executable> {
        self.check_alive()?;
        Executable::load_cubin(&self.shared.context, image)
            .map_err(|e| self.shared.lost.filter(e.into()))
    }

    /// Ordinals of the devices this one has peer access to (see [`Device::enable_peer_access`]).
    pub fn peers(&self) -> Vec<i32> {
        self.peers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether this device reaches device `ordinal`'s memory directly.
    pub fn has_peer_access(&self, ordinal: i32) -> bool {
        self.peers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(&ordinal)
    }

    pub(crate) fn note_peer(&self, ordinal: i32) {
        let mut peers = self
            .peers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !peers.contains(&ordinal) {
            peers.push(ordinal);
        }
    }

    /// Events of the queues' completion/timepoint pools, all together: (created, in use).
    pub fn event_counts(&self) -> (usize, usize) {
        let pools = std::iter::once(&self.shared.events).chain(&self.queue_events);
        pools.fold((0, 0), |(created, in_use), pool| {
            (created + pool.created(), in_use + pool.in_use())
        })
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.info.ordinal)
            .field("name", &self.info.name)
            .field("queues", &self.queues.len())
            .finish_non_exhaustive()
    }
}

/// The storage a device queue makes up front (`QueueOptions::with_capacity`: body slots,
/// hand-over and retirement lists): room for every action it may have in flight
/// (`max_in_flight`), up to eight gather batches, and never less than the scheduler's default.
///
/// A gathering completion thread holds a batch being handed over, a deferred one and one it
/// retires, and a host wait lets the submitter run on while that thread is late, up to
/// `max_in_flight`. With batches of 128 and room for 256, bench case 1 counted the lists growing
/// (3 allocations in one pass) and the body slots doubling from 512 to 1,024 (another) inside its
/// measured window. With the defaults this makes 1,024 body slots per queue (about 450 KiB) when
/// the device opens; a lower `max_in_flight` makes fewer.
fn queue_capacity(options: &DeviceOptions) -> usize {
    options
        .max_in_flight
        .min(options.completion.gather_batch.saturating_mul(8))
        .max(QueueOptions::DEFAULT_CAPACITY)
}
