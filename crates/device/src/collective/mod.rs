//! NCCL collectives as queue operations.
//!
//! [`Nccl`] is the library, loaded at run time ([`Nccl::load`]: an explicit path, then
//! `CUHAL_NCCL_LIBRARY`, then the loader's path; the version checked). A [`Communicator`] holds
//! this process's ranks of one NCCL communicator, one per [`Device`]: all of them
//! ([`Communicator::local`]) or some, with the unique id the caller passed to every process
//! ([`Communicator::join`]).
//!
//! # One submission, every local rank at once
//!
//! [`Communicator::submit`] takes one [`CollectivePart`] per local rank, each with its own waits,
//! signals and buffers, and makes of them one action of the communicator's own scheduler queue.
//! When every wait is reached or device-waitable, that action is issued by one thread: each
//! rank's stream waits for the device waits, then one `ncclGroupStart`/`ncclGroupEnd` enqueues
//! every rank's part, then rank 0's stream joins the others' ends and records the completion
//! event, which is the device-signal timepoint of every signal.
//!
//! This is what makes the deadlock NCCL's guide warns of (several GPUs per process, one thread
//! launching, one launch blocking before the others are made) impossible here: a rank's part
//! is never enqueued without every other local rank's part, in the same group call, so no
//! stream of the communicator ever holds a collective whose peers are not launched, and a
//! launch that blocks (a full launch queue) waits only for work that can finish. The streams
//! are the communicator's own, so nothing a device queue does can sit between a rank's part and
//! its peers' either; queue operations are ordered by semaphores, and so are these.
//!
//! # Failures
//!
//! A NCCL error while issuing fails the action's signals with NCCL's message
//! ([`Error::Nccl`]). The completion side polls `ncclCommGetAsyncError` of every local rank
//! while it waits for a collective and once it completed (the issuing path does not: it stays
//! as short as a raw group call); an error fails that collective and the communicator. (A host
//! waiter that sees a collective's completion event first may advance its signals before the
//! poll: the error then fails the next collective, or the next submission.) A collective that has not
//! completed, or a group call that has not returned, after the communicator's timeout is a peer
//! that never arrived: the communicator is aborted (`ncclCommAbort`), the collective fails with
//! [`Error::CollectiveTimeout`], and so does everything submitted later. Nothing hangs.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cuhal_command::BufferRange;
use cuhal_scheduler::{Backend, Cleanups, QueueOptions, Resources, ThreadRole};
use cuhal_semaphore::Failure;
use cuhal_sys::{
    CU_EVENT_DISABLE_TIMING, CU_STREAM_NON_BLOCKING, Event, NcclApi, NcclComm, NcclDataType,
    NcclRedOp, NcclUniqueId, PrimaryContext, Stream,
};
use smallvec::SmallVec;

use crate::Semaphore;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::event_pool::{CudaEvent, TimepointEventPool};
use crate::lost::Lost;
use crate::memory::use_allocation;
use crate::queue::SemaphoreValues;
use crate::submissions::Submissions;

mod agreement;
mod set;
pub use agreement::PartField;
pub use set::CollectiveCommandBuffers;

/// The NCCL library, loaded at run time.
#[derive(Clone, Debug)]
pub struct Nccl {
    api: Arc<NcclApi>,
}

impl Nccl {
    /// Loads NCCL from `path`, else from `CUHAL_NCCL_LIBRARY`, else `libnccl.so.2` through the
    /// loader's path, and checks its version. Without NCCL this is a typed error
    /// ([`Error::Nccl`]); nothing else of cuhal needs it.
    pub fn load(path: Option<PathBuf>) -> Result<Self> {
        Ok(Self {
            api: Arc::new(NcclApi::load(path)?),
        })
    }

    /// The version (`ncclGetVersion`'s encoding: 22805 for 2.28.5).
    pub fn version(&self) -> i32 {
        self.api.version()
    }

    /// The library loaded.
    pub fn library_path(&self) -> &str {
        self.api.library_path()
    }

    /// A new unique id (`ncclGetUniqueId`): made by one process, passed by the caller to every
    /// process that joins the communicator ([`UniqueId::to_bytes`]).
    pub fn unique_id(&self) -> Result<UniqueId> {
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: `id` is a valid out-pointer.
        let r = unsafe { (self.api.ncclGetUniqueId)(&mut id) };
        checked(&self.api, "ncclGetUniqueId", r)?;
        Ok(UniqueId(id))
    }
}

/// A communicator's unique id, as bytes to pass between processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UniqueId(NcclUniqueId);

impl UniqueId {
    /// The id's 128 bytes.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0.internal
    }

    /// The id from bytes another process sent.
    pub fn from_bytes(bytes: [u8; 128]) -> Self {
        UniqueId(NcclUniqueId { internal: bytes })
    }
}

/// What one rank does in a submission (NCCL's data types and built-in reductions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    /// Every rank's `send` reduced into every rank's `recv` (`count` elements each).
    AllReduce(NcclRedOp),
    /// Every rank's `send` (`count` elements) gathered, in rank order, into every `recv`
    /// (`count * ranks` elements).
    AllGather,
    /// Every rank's `send` (`count * ranks` elements) reduced, and block `rank` of the result
    /// (`count` elements) written to `recv`.
    ReduceScatter(NcclRedOp),
    /// Rank `root`'s `send` copied into every rank's `recv` (`send` only on the root).
    Broadcast {
        /// The rank that sends.
        root: i32,
    },
    /// Every rank's `send` reduced into rank `root`'s `recv` (`recv` only on the root).
    Reduce {
        /// The reduction.
        op: NcclRedOp,
        /// The rank that receives.
        root: i32,
    },
    /// `send` to rank `peer` (which receives it in the same submission or its process's).
    Send {
        /// The receiving rank.
        peer: i32,
    },
    /// `recv` from rank `peer`.
    Recv {
        /// The sending rank.
        peer: i32,
    },
}

/// One local rank's part of a submission: what it does, on which of its device's buffers, and
/// its own waits and signals.
#[derive(Clone)]
pub struct CollectivePart<'a> {
    /// What the rank does.
    pub collective: Collective,
    /// The element type.
    pub data_type: NcclDataType,
    /// Elements per rank (see [`Collective`] for how each uses it).
    pub count: usize,
    /// Read from here (where the collective reads on this rank).
    pub send: Option<BufferRange>,
    /// Written here (where the collective writes on this rank).
    pub recv: Option<BufferRange>,
    /// Reached (or device-waitable) before this rank's part starts.
    pub waits: &'a SemaphoreValues<'a>,
    /// Signalled when the submission completes.
    pub signals: &'a SemaphoreValues<'a>,
}

impl<'a> CollectivePart<'a> {
    /// An all-reduce of `count` elements from `send` into `recv` (which may be the same range).
    pub fn all_reduce(
        send: &BufferRange,
        recv: &BufferRange,
        count: usize,
        data_type: NcclDataType,
        op: NcclRedOp,
    ) -> Self {
        Self {
            collective: Collective::AllReduce(op),
            data_type,
            count,
            send: Some(send.clone()),
            recv: Some(recv.clone()),
            waits: &[],
            signals: &[],
        }
    }

    /// Any collective (see [`Collective`] for which buffers each needs).
    pub fn new(
        collective: Collective,
        data_type: NcclDataType,
        count: usize,
        send: Option<&BufferRange>,
        recv: Option<&BufferRange>,
    ) -> Self {
        Self {
            collective,
            data_type,
            count,
            send: send.cloned(),
            recv: recv.cloned(),
            waits: &[],
            signals: &[],
        }
    }

    /// With `waits`.
    pub fn waits(mut self, waits: &'a SemaphoreValues<'a>) -> Self {
        self.waits = waits;
        self
    }

    /// With `signals`.
    pub fn signals(mut self, signals: &'a SemaphoreValues<'a>) -> Self {
        self.signals = signals;
        self
    }
}

/// How a communicator runs.
#[derive(Clone, Copy, Debug)]
pub struct CommunicatorOptions {
    /// How long joining ([`Communicator::join`], [`Communicator::local`]: until every rank
    /// joined) and each collective (to be issued, and to complete) may take before the
    /// communicator is aborted (`ncclCommAbort`): a peer that never arrives. Default 60 s.
    pub timeout: Duration,
    /// How often the completion side polls `ncclCommGetAsyncError` while it waits.
    pub poll_interval: Duration,
}

impl Default for CommunicatorOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(60),
            poll_interval: Duration::from_micros(100),
        }
    }
}

/// One local rank: its NCCL communicator, its device and its private stream.
pub(crate) struct Rank {
    comm: NcclComm,
    rank: i32,
    context: Arc<PrimaryContext>,
    lost: Arc<Lost>,
    stream: Stream,
    /// Recorded at the end of this rank's part, for rank 0's stream to join (ranks > 0).
    done: Event,
    /// Set once a stream call failed outside the rank's context and succeeded inside it: the
    /// issuing path then enters the context for them (see `on_stream`).
    enter_for_stream_calls: AtomicBool,
}

/// The communicator's NCCL state, shared by the issuing thread, the completion thread and the
/// watchdog.
pub(crate) struct Comms {
    api: Arc<NcclApi>,
    ranks: Vec<Rank>,
    nranks: i32,
    timeout: Duration,
    /// When the group call in progress started, if one is.
    issuing: Mutex<Issuing>,
    /// The failure that ended the communicator (an abort, an async error): every later
    /// submission fails with it.
    failure: std::sync::OnceLock<Failure>,
    /// Set when the communicator is dropped: the watchdog stops.
    closing: AtomicBool,
    wake: Condvar,
}

#[derive(Default)]
struct Issuing {
    since: Option<Instant>,
    /// Set while the watchdog waits with no deadline (no group call in progress when it last
    /// looked): only then must a group call wake it. Otherwise it already sleeps until an
    /// earlier deadline than the new call's and looks again then, so a submission costs no
    /// wake-up (a futex call and a thread switch on the issuing path).
    watchdog_idle: bool,
    /// Set once `ncclCommAbort` ran: the NCCL handles are gone.
    aborted: bool,
}

// SAFETY: NCCL communicators and CUDA streams and events may be used from any thread; the
// communicator handles are only used under the rules of `Issuing` (never after an abort).
unsafe impl Send for Comms {}
// SAFETY: as above.
unsafe impl Sync for Comms {}

impl Comms {
    fn lock(&self) -> std::sync::MutexGuard<'_, Issuing> {
        self.issuing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Aborts every local rank (once) and records `failure` as the communicator's end. With the
    /// lock held by the caller.
    fn abort(&self, issuing: &mut Issuing, failure: Failure) -> Failure {
        let failure = self.failure.get_or_init(|| failure).clone();
        if !issuing.aborted {
            issuing.aborted = true;
            for rank in &self.ranks {
                // SAFETY: the handle is live (not yet aborted or destroyed); ncclCommAbort may
                // run while another thread is blocked in a call on the communicator: that is
                // what it is for. Its result is irrelevant: the communicator is gone either way.
                let _ = unsafe { (self.api.ncclCommAbort)(rank.comm) };
            }
        }
        failure
    }

    /// Ends the communicator with `error`. While a group call is in progress, the issuing thread
    /// still passes the handles to NCCL: the failure is recorded and that thread aborts once its
    /// call returned (only the watchdog aborts under a running call, which is blocked in NCCL).
    fn fail(&self, error: Error) -> Failure {
        let mut issuing = self.lock();
        if issuing.since.is_some() {
            return self.failure.get_or_init(|| Failure::new(error)).clone();
        }
        self.abort(&mut issuing, Failure::new(error))
    }

    /// `ncclCommGetAsyncError` of every local rank: the first error, if any.
    fn async_error(&self) -> Option<Error> {
        let issuing = self.lock();
        if issuing.aborted {
            return None;
        }
        for rank in &self.ranks {
            let mut error = cuhal_sys::NCCL_SUCCESS;
            // SAFETY: the handle is live (checked under the lock); `error` is an out-pointer.
            let r = unsafe { (self.api.ncclCommGetAsyncError)(rank.comm, &mut error) };
            let (call, result) = if r != cuhal_sys::NCCL_SUCCESS {
                ("ncclCommGetAsyncError", r)
            } else {
                ("ncclCommGetAsyncError (asynchronous error)", error)
            };
            if result != cuhal_sys::NCCL_SUCCESS && result != cuhal_sys::NCCL_IN_PROGRESS {
                return Some(Error::Nccl(
                    // SAFETY: the handle is live (checked under the held lock).
                    unsafe { self.api.error(call, result, rank.comm) },
                ));
            }
        }
        None
    }
}

/// The work of one submission. (The parts are inline: the payload moves into the action's slot
/// once, and a boxed variant would allocate per submission.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum CollectivePayload {
    /// Every local rank's part of one collective, enqueued in one group.
    Parts(SmallVec<[RankPart; 2]>),
    /// One command buffer per local rank, recorded together ([`CollectiveCommandBuffers`]).
    CommandBuffers(Arc<set::SetBuffers>),
}

#[derive(Clone)]
pub(crate) struct RankPart {
    collective: Collective,
    data_type: NcclDataType,
    count: usize,
    send: Option<BufferRange>,
    recv: Option<BufferRange>,
}

/// The communicator's scheduler backend: issues every local rank's part in one group.
pub(crate) struct CollectiveBackend {
    comms: Arc<Comms>,
    events: TimepointEventPool,
    poll_interval: Duration,
}

impl CollectiveBackend {
    fn enqueue(
        &self,
        device_waits: &[CudaEvent],
        payload: &CollectivePayload,
    ) -> Result<CudaEvent> {
        let comms = &self.comms;
        // No `ncclCommGetAsyncError` here: the completion side polls every rank while it waits
        // for a collective and once each completed, and an error it finds aborts the
        // communicator, which the lock below sees. Polling here too cost two NCCL calls under
        // the communicator's lock on every submission, and caught nothing the completion side
        // misses: a collective enqueued after an unseen error is failed by that poll.
        let completion = self.events.acquire()?;
        // Device waits on every rank's stream: a collective cannot finish before every rank's
        // inputs are ready anyway, and this keeps one wait list per submission.
        for rank in &comms.ranks {
            for event in device_waits {
                // SAFETY: the stream and the event are live; CUDA takes events of any context.
                on_stream(rank, || unsafe { rank.stream.wait_raw_event(event.raw()) })?;
            }
        }
        let now = Instant::now();
        let wake_watchdog = {
            let mut issuing = comms.lock();
            if issuing.aborted {
                return Err(Error::Lost(
                    comms
                        .failure
                        .get()
                        .cloned()
                        .unwrap_or_else(|| Failure::msg("aborted")),
                ));
            }
            issuing.since = Some(now);
            std::mem::take(&mut issuing.watchdog_idle)
        };
        if wake_watchdog {
            comms.wake.notify_all();
        }
        let grouped = match payload {
            CollectivePayload::Parts(parts) => self.group(parts),
            CollectivePayload::CommandBuffers(set) => set.issue(comms),
        };
        let aborted = {
            let mut issuing = comms.lock();
            issuing.since = None;
            // The completion side failed the communicator during the call (see `Comms::fail`).
            if let Some(failure) = comms.failure.get().filter(|_| !issuing.aborted) {
                comms.abort(&mut issuing, failure.clone());
            }
            issuing.aborted
        };
        if aborted {
            // The watchdog aborted the communicator while the group call was blocked.
            return Err(Error::Lost(
                comms
                    .failure
                    .get()
                    .cloned()
                    .unwrap_or_else(|| Failure::msg("aborted")),
            ));
        }
        grouped?;
        // Rank 0's stream joins the other ranks' ends; the completion event follows. (Three
        // driver calls for two ranks; no context is entered for them: see `on_stream`.)
        let first = &comms.ranks[0];
        for rank in &comms.ranks[1..] {
            on_stream(rank, || rank.done.record(&rank.stream))?;
            // CUDA takes events of any context.
            on_stream(first, || first.stream.wait_event(&rank.done))?;
        }
        // SAFETY: the completion event (of rank 0's context) is live while held.
        on_stream(first, || unsafe {
            first.stream.record_raw_event(completion.raw())
        })?;
        Ok(completion)
    }

    /// Enqueues every rank's part in one NCCL group.
    fn group(&self, parts: &[RankPart]) -> Result<()> {
        let comms = &self.comms;
        let api = &comms.api;
        // SAFETY: group calls have no arguments; every started group is ended below.
        let r = unsafe { (api.ncclGroupStart)() };
        checked(api, "ncclGroupStart", r)?;
        let mut first_error = None;
        for (rank, part) in comms.ranks.iter().zip(parts) {
            if let Err(error) = self.enqueue_part(rank, part) {
                first_error.get_or_insert(error);
                break;
            }
        }
        // SAFETY: ends the group started above (also after a failed call, as NCCL requires).
        let ended = checked(api, "ncclGroupEnd", unsafe { (api.ncclGroupEnd)() });
        match first_error {
            Some(error) => Err(error),
            None => ended.map_err(Error::from),
        }
    }

    fn enqueue_part(&self, rank: &Rank, part: &RankPart) -> Result<()> {
        let send = part.send.as_ref().map_or(0, |r| r.device_ptr());
        let recv = part.recv.as_ref().map_or(0, |r| r.device_ptr());
        // SAFETY: the ranges were checked at submission against the rank's device and the
        // lengths the collective reads and writes, and the payload keeps their buffers alive
        // until the submission completed; the communicator is live (not aborted: checked under
        // the lock before the group started, and only the watchdog aborts while a group is in
        // progress, after which nothing here touches it again).
        Ok(unsafe {
            nccl_call(
                &self.comms.api,
                rank.comm,
                part.collective,
                part.data_type,
                part.count,
                send,
                recv,
                rank.stream.raw(),
            )
        }?)
    }
}

/// Runs a stream-ordered driver call on one of `rank`'s streams (`cuEventRecord`,
/// `cuStreamWaitEvent`) without making the rank's context current: the driver takes the context
/// from the stream, so the issuing path pays no `cuCtxPushCurrent`/`cuCtxPopCurrent` pair per
/// rank and submission. Should a driver fail the call all the same (wrappers of the driver
/// report drivers that want the stream's context current), the call is made again inside the
/// context, and if that succeeds the rank enters its context for these calls from then on: the
/// shortcut can cost one failed call, never a failure or a call per submission. (A failed call
/// enqueued nothing, so making it again is safe; an error that is the device's fails again.)
fn on_stream<T>(
    rank: &Rank,
    call: impl Fn() -> std::result::Result<T, cuhal_sys::Error>,
) -> Result<T> {
    let result = if rank.enter_for_stream_calls.load(Ordering::Relaxed) {
        let _bound = rank.context.enter()?;
        call()
    } else {
        match call() {
            Err(cuhal_sys::Error::Cuda { .. }) => {
                let _bound = rank.context.enter()?;
                let again = call();
                if again.is_ok() {
                    rank.enter_for_stream_calls.store(true, Ordering::Relaxed);
                }
                again
            }
            result => result,
        }
    };
    result.map_err(|e| rank.lost.filter(e.into()))
}

/// Enqueues one rank's part of a collective on `stream` (inside a group, or alone).
///
/// # Safety
/// `comm` is live (not aborted or destroyed); `send` and `recv` (0 where the collective uses
/// none) are device memory of the communicator's device, as long as the collective reads and
/// writes, alive until the work completes; `stream` is a live stream of that device.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn nccl_call(
    api: &NcclApi,
    comm: NcclComm,
    collective: Collective,
    t: NcclDataType,
    count: usize,
    send: cuhal_sys::CUdeviceptr,
    recv: cuhal_sys::CUdeviceptr,
    stream: cuhal_sys::CUstream,
) -> std::result::Result<(), cuhal_sys::NcclError> {
    let send = send as usize as *const std::ffi::c_void;
    let recv = recv as usize as *mut std::ffi::c_void;
    // SAFETY: the caller's contract.
    let (call, r) = unsafe {
        match collective {
            Collective::AllReduce(op) => (
                "ncclAllReduce",
                (api.ncclAllReduce)(send, recv, count, t, op, comm, stream),
            ),
            Collective::AllGather => (
                "ncclAllGather",
                (api.ncclAllGather)(send, recv, count, t, comm, stream),
            ),
            Collective::ReduceScatter(op) => (
                "ncclReduceScatter",
                (api.ncclReduceScatter)(send, recv, count, t, op, comm, stream),
            ),
            Collective::Broadcast { root } => (
                "ncclBroadcast",
                (api.ncclBroadcast)(send, recv, count, t, root, comm, stream),
            ),
            Collective::Reduce { op, root } => (
                "ncclReduce",
                (api.ncclReduce)(send, recv, count, t, op, root, comm, stream),
            ),
            Collective::Send { peer } => (
                "ncclSend",
                (api.ncclSend)(send, count, t, peer, comm, stream),
            ),
            Collective::Recv { peer } => (
                "ncclRecv",
                (api.ncclRecv)(recv, count, t, peer, comm, stream),
            ),
        }
    };
    checked(api, call, r)
}

impl Backend for CollectiveBackend {
    type Event = CudaEvent;
    type Payload = CollectivePayload;
    type IssueLocal = ();
    /// Every completion event is recorded on rank 0's stream, which runs in order, and both
    /// kinds of error are sticky: a device fault poisons the context (every later event reports
    /// it) and a communicator's asynchronous error stays until it is aborted. So the newest
    /// event of a batch, and one `ncclCommGetAsyncError` round, answer for the whole batch; the
    /// earlier ones are not queried again (each query would take the driver's lock that the
    /// issuing thread's group calls need).
    const STICKY_ERRORS: bool = true;

    fn bind_thread(&self, _role: ThreadRole) -> std::result::Result<(), Failure> {
        self.comms.ranks[0]
            .context
            .bind()
            .map_err(|e| Failure::new(Error::from(e)))
    }

    fn issue(
        &self,
        _local: &mut (),
        device_waits: &[CudaEvent],
        payload: &mut CollectivePayload,
    ) -> std::result::Result<CudaEvent, Failure> {
        self.enqueue(device_waits, payload)
            .map_err(|error| match error {
                Error::Lost(failure) => failure,
                error => self.comms.fail(error),
            })
    }

    fn issue_local(&self) {}

    /// Polls the completion event; between polls, the ranks' asynchronous errors and the
    /// timeout (the hook of the completion side for NCCL).
    fn wait_event(&self, event: &CudaEvent, spin: Duration) -> std::result::Result<(), Failure> {
        let start = Instant::now();
        let mut next_check = start;
        loop {
            match event.query_raw() {
                Ok(true) => {
                    // A collective can end with an error its kernels met; NCCL reports it here.
                    return match self.comms.async_error() {
                        Some(error) => Err(self.comms.fail(error)),
                        None => Ok(()),
                    };
                }
                Ok(false) => {}
                Err(e) => return Err(self.comms.fail(Error::from(e))),
            }
            let now = Instant::now();
            if now >= next_check {
                if let Some(error) = self.comms.async_error() {
                    return Err(self.comms.fail(error));
                }
                if now.duration_since(start) >= self.comms.timeout {
                    return Err(self.comms.fail(Error::CollectiveTimeout {
                        timeout: self.comms.timeout,
                        stage: "running on the devices",
                    }));
                }
                next_check = now + self.poll_interval;
            }
            if now.duration_since(start) > spin {
                std::thread::sleep(self.poll_interval.min(Duration::from_millis(1)));
            } else {
                // Paced like the device queues' polling: each query takes the driver's lock
                // that the issuing thread's group calls need.
                let next = now + QUERY_PACE;
                while Instant::now() < next {
                    std::hint::spin_loop();
                }
            }
        }
    }
}

/// The least time between two queries of a completion event while the completion side spins.
const QUERY_PACE: Duration = Duration::from_micros(1);

/// This process's ranks of one NCCL communicator, one per device, with the scheduler queue that
/// issues their collectives (see the module documentation).
pub struct Communicator {
    /// Taken and dropped first when the communicator drops: its threads finish (or fail)
    /// everything submitted while the watchdog still guards the group calls.
    queue: Option<cuhal_scheduler::Queue<CollectiveBackend>>,
    comms: Arc<Comms>,
    watchdog: Option<JoinHandle<()>>,
}

impl Communicator {
    /// A communicator over `devices` (of this process), rank `i` on `devices[i]`.
    pub fn local(nccl: &Nccl, devices: &[&Device], options: CommunicatorOptions) -> Result<Self> {
        let id = nccl.unique_id()?;
        let ranks: Vec<(&Device, i32)> = devices
            .iter()
            .enumerate()
            .map(|(i, d)| (*d, i as i32))
            .collect();
        Self::join(nccl, id, devices.len() as i32, &ranks, options)
    }

    /// This process's ranks `(device, rank)` of a communicator of `nranks` ranks across
    /// processes (or hosts), all of which pass the same `id` (made by one of them with
    /// [`Nccl::unique_id`] and sent by the caller). Returns once every rank joined, or with
    /// [`Error::JoinTimeout`] after `options.timeout` (the ranks made here aborted with
    /// `ncclCommAbort`): a process that never joins cannot hang this one.
    pub fn join(
        nccl: &Nccl,
        id: UniqueId,
        nranks: i32,
        ranks: &[(&Device, i32)],
        options: CommunicatorOptions,
    ) -> Result<Self> {
        if ranks.is_empty() || nranks < ranks.len() as i32 {
            return Err(Error::InvalidArgument(format!(
                "{} local ranks of a communicator of {nranks}",
                ranks.len()
            )));
        }
        for (i, (device, rank)) in ranks.iter().enumerate() {
            if *rank < 0 || *rank >= nranks {
                return Err(Error::InvalidArgument(format!(
                    "rank {rank} of a communicator of {nranks}"
                )));
            }
            if ranks[..i]
                .iter()
                .any(|(d, r)| r == rank || d.info().ordinal == device.info().ordinal)
            {
                return Err(Error::InvalidArgument(
                    "each local rank needs its own rank number and its own device".into(),
                ));
            }
        }
        let api = nccl.api.clone();
        let mut local = Vec::with_capacity(ranks.len());
        // Streams and events first, so a failure leaves nothing of NCCL to undo.
        for (device, rank) in ranks {
            local.push(Rank::new(device, *rank)?);
        }
        // SAFETY: no arguments; the group is ended below.
        let r = unsafe { (api.ncclGroupStart)() };
        checked(&api, "ncclGroupStart", r)?;
        let mut init = Ok(());
        for rank in &mut local {
            let bound = rank.context.enter();
            let r = match bound {
                // SAFETY: `comm` is a valid out-pointer; the rank's context is current, which
                // is how NCCL picks the device.
                Ok(_guard) => unsafe {
                    (api.ncclCommInitRank)(&mut rank.comm, nranks, id.0, rank.rank)
                },
                Err(e) => {
                    init = Err(Error::from(e));
                    break;
                }
            };
            if let Err(e) = checked(&api, "ncclCommInitRank", r) {
                init = Err(e.into());
                break;
            }
        }
        // The group's end is where NCCL waits for every rank to join. A rank that never joins
        // would block it for ever: a timer aborts the ranks made so far (their handles exist
        // once `ncclCommInitRank` returned inside the group), which makes the blocked end
        // return with an error.
        let made: Vec<usize> = local
            .iter()
            .filter(|r| !r.comm.is_null())
            .map(|r| r.comm.expose_provenance())
            .collect();
        let joined = (Mutex::new(false), Condvar::new());
        let aborted = AtomicBool::new(false);
        let ended = std::thread::scope(|scope| {
            scope.spawn(|| {
                let (done, wake) = (&joined.0, &joined.1);
                let guard = done.lock().unwrap_or_else(PoisonError::into_inner);
                let (guard, waited) = wake
                    .wait_timeout_while(guard, options.timeout, |done| !*done)
                    .unwrap_or_else(PoisonError::into_inner);
                if waited.timed_out() && !*guard {
                    aborted.store(true, Ordering::Release);
                    for &comm in &made {
                        // SAFETY: the handle was made by `ncclCommInitRank` above and is not
                        // destroyed (that happens only after this scope); aborting a
                        // communicator whose initialization blocks is what the call is for.
                        let _ = unsafe {
                            (api.ncclCommAbort)(std::ptr::with_exposed_provenance_mut(comm))
                        };
                    }
                }
            });
            // SAFETY: ends the group started above.
            let ended = checked(&api, "ncclGroupEnd", unsafe { (api.ncclGroupEnd)() });
            *joined.0.lock().unwrap_or_else(PoisonError::into_inner) = true;
            joined.1.notify_all();
            ended
        });
        if aborted.load(Ordering::Acquire) {
            // The handles are gone (aborted): nothing to destroy.
            return Err(Error::JoinTimeout {
                timeout: options.timeout,
            });
        }
        let failed = init.err().or(ended.err().map(Error::from));
        let comms = Arc::new(Comms {
            api,
            ranks: local,
            nranks,
            timeout: options.timeout,
            issuing: Mutex::new(Issuing::default()),
            failure: std::sync::OnceLock::new(),
            closing: AtomicBool::new(false),
            wake: Condvar::new(),
        });
        if let Some(error) = failed {
            // Dropping `comms` destroys whatever was made.
            return Err(error);
        }
        let first = &comms.ranks[0];
        // A collective's events report no submissions: host waits on them never hold back.
        let events = TimepointEventPool::new(
            first.context.clone(),
            8,
            first.lost.clone(),
            Arc::new(Submissions::new(0)),
            false,
        )?;
        let backend = CollectiveBackend {
            comms: comms.clone(),
            events,
            poll_interval: options.poll_interval,
        };
        let label = format!(
            "nccl{}",
            comms
                .ranks
                .iter()
                .map(|r| r.rank.to_string())
                .collect::<Vec<_>>()
                .join("+")
        );
        let queue = cuhal_scheduler::Queue::new(backend, QueueOptions::new(label))?;
        let watched = comms.clone();
        let watchdog = std::thread::Builder::new()
            .name("cuhal-nccl-watchdog".into())
            .spawn(move || watchdog(&watched))
            .map_err(|e| Error::InvalidArgument(format!("starting the NCCL watchdog: {e}")))?;
        Ok(Self {
            queue: Some(queue),
            comms,
            watchdog: Some(watchdog),
        })
    }

    /// The number of ranks of the whole communicator.
    pub fn ranks(&self) -> i32 {
        self.comms.nranks
    }

    /// This process's ranks, in the order their parts are given to [`Communicator::submit`].
    pub fn local_ranks(&self) -> Vec<i32> {
        self.comms.ranks.iter().map(|r| r.rank).collect()
    }

    /// The failure that ended the communicator (an abort after a timeout, an asynchronous
    /// error), if one did.
    pub fn failure(&self) -> Option<Failure> {
        self.comms.failure.get().cloned()
    }

    /// Submits one collective: `parts[i]` is local rank `i`'s (see the module documentation).
    /// Every rank's part runs once all waits of all parts are reached or device-waitable; every
    /// signal is signalled when every part completed. Parts that disagree (another collective,
    /// count, data type, reduction or root; a send whose local peer does not receive it) are
    /// refused with [`Error::CollectiveMismatch`] before anything is submitted.
    pub fn submit(&self, parts: &[CollectivePart<'_>]) -> Result<()> {
        if let Some(failure) = self.comms.failure.get() {
            return Err(Error::Lost(failure.clone()));
        }
        if parts.len() != self.comms.ranks.len() {
            return Err(Error::InvalidArgument(format!(
                "{} parts for {} local ranks",
                parts.len(),
                self.comms.ranks.len()
            )));
        }
        agreement::check_agreement(&self.comms.ranks, parts)?;
        let mut rank_parts = SmallVec::new();
        let mut waits: SmallVec<[(&Semaphore, u64); 8]> = SmallVec::new();
        let mut signals: SmallVec<[(&Semaphore, u64); 8]> = SmallVec::new();
        let mut resources = Resources::new();
        for (rank, part) in self.comms.ranks.iter().zip(parts) {
            check_part(&self.comms, rank, part)?;
            for range in part.send.iter().chain(&part.recv) {
                if let Some(buffer) = range.buffer() {
                    use_allocation(buffer, "collective buffer", &mut resources)?;
                }
            }
            waits.extend(part.waits.iter().copied());
            signals.extend(part.signals.iter().copied());
            rank_parts.push(RankPart {
                collective: part.collective,
                data_type: part.data_type,
                count: part.count,
                send: part.send.clone(),
                recv: part.recv.clone(),
            });
        }
        self.submit_with(
            &waits,
            &signals,
            CollectivePayload::Parts(rank_parts),
            resources,
        )
    }

    /// Submits `payload` to the communicator's queue, holding `resources` until it completes.
    fn submit_with(
        &self,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
        payload: CollectivePayload,
        resources: Resources,
    ) -> Result<()> {
        let Some(queue) = &self.queue else {
            return Err(Error::InvalidArgument(
                "the communicator is shutting down".into(),
            ));
        };
        queue
            .submit(waits, signals, payload, resources, Cleanups::new())
            .map_err(|e| match self.comms.failure.get() {
                Some(failure) => Error::Lost(failure.clone()),
                None => Error::Queue(e),
            })
    }

    /// The communicator's queue counters.
    pub fn stats(&self) -> cuhal_scheduler::QueueStats {
        self.queue.as_ref().map(|q| q.stats()).unwrap_or_default()
    }
}

/// [`NcclApi::check`] for this module's calls. No communicator is passed for the message:
/// NCCL keeps its last error per thread and ignores the communicator `ncclGetLastError` takes
/// (documented as unused, may be null), and a call that failed because the watchdog or the
/// completion side aborted the communicator meanwhile must not hand NCCL the freed handle.
fn checked(
    api: &NcclApi,
    call: &'static str,
    result: cuhal_sys::NcclResult,
) -> std::result::Result<(), cuhal_sys::NcclError> {
    // SAFETY: a null communicator is always valid here (see above).
    unsafe { api.check(call, result, std::ptr::null_mut()) }
}

/// Checks one part's buffers: on the rank's device, as long as the collective reads and
/// writes, and present where it needs them.
fn check_part(comms: &Comms, rank: &Rank, part: &CollectivePart<'_>) -> Result<()> {
    let n = comms.nranks as usize;
    let element = part.data_type.size();
    let bytes = |elements: usize| {
        elements
            .checked_mul(element)
            .ok_or_else(|| Error::InvalidArgument("element count overflows".into()))
    };
    let one = bytes(part.count)?;
    let all = bytes(part.count.saturating_mul(n))?;
    let is_root = |root: i32| root == rank.rank;
    let check_peer = |peer: i32| {
        if peer < 0 || peer >= comms.nranks || peer == rank.rank {
            Err(Error::InvalidArgument(format!(
                "peer {peer} of rank {} in a communicator of {n}",
                rank.rank
            )))
        } else {
            Ok(())
        }
    };
    let (send, recv) = match part.collective {
        Collective::AllReduce(_) => (Some(one), Some(one)),
        Collective::AllGather => (Some(one), Some(all)),
        Collective::ReduceScatter(_) => (Some(all), Some(one)),
        Collective::Broadcast { root } => {
            check_root(root, n)?;
            (is_root(root).then_some(one), Some(one))
        }
        Collective::Reduce { root, .. } => {
            check_root(root, n)?;
            (Some(one), is_root(root).then_some(one))
        }
        Collective::Send { peer } => {
            check_peer(peer)?;
            (Some(one), None)
        }
        Collective::Recv { peer } => {
            check_peer(peer)?;
            (None, Some(one))
        }
    };
    for (range, needed, what) in [
        (&part.send, send, "collective send buffer"),
        (&part.recv, recv, "collective receive buffer"),
    ] {
        match (range, needed) {
            (Some(range), Some(len)) => {
                if range.len() != len {
                    return Err(Error::InvalidArgument(format!(
                        "the {what} of rank {} holds {} bytes; {:?} of {} x {:?} needs {len}",
                        rank.rank,
                        range.len(),
                        part.collective,
                        part.count,
                        part.data_type
                    )));
                }
                // A slot range has no memory: collectives take no binding tables.
                range.check_not_slot(what)?;
                match range.buffer() {
                    Some(buffer) if buffer.context().raw() == rank.context.raw() => {}
                    Some(_) => return Err(Error::WrongDevice { what }),
                    None => {}
                }
            }
            (None, Some(_)) => {
                return Err(Error::InvalidArgument(format!(
                    "{:?} on rank {} needs a {what}",
                    part.collective, rank.rank
                )));
            }
            (_, None) => {}
        }
    }
    if part.count == 0 {
        return Err(Error::InvalidArgument("a collective of 0 elements".into()));
    }
    Ok(())
}

fn check_root(root: i32, n: usize) -> Result<()> {
    if root < 0 || root as usize >= n {
        return Err(Error::InvalidArgument(format!(
            "root {root} of a communicator of {n}"
        )));
    }
    Ok(())
}

/// Aborts the communicator when a group call has been blocked for longer than the timeout (a
/// peer that never arrived, inside NCCL): the blocked call then returns with an error.
fn watchdog(comms: &Comms) {
    let mut issuing = comms.lock();
    loop {
        if comms.closing.load(Ordering::Acquire) || issuing.aborted {
            return;
        }
        let wait = match issuing.since {
            Some(since) => {
                let elapsed = since.elapsed();
                if elapsed >= comms.timeout {
                    comms.abort(
                        &mut issuing,
                        Failure::new(Error::CollectiveTimeout {
                            timeout: comms.timeout,
                            stage: "being issued (inside NCCL)",
                        }),
                    );
                    return;
                }
                comms.timeout - elapsed
            }
            None => Duration::from_secs(3600),
        };
        issuing.watchdog_idle = issuing.since.is_none();
        issuing = comms
            .wake
            .wait_timeout(issuing, wait)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // The queue first: its threads finish what was issued (the completion side's timeout
        // bounds that) and fail what is pending, while the watchdog still guards group calls.
        drop(self.queue.take());
        self.comms.closing.store(true, Ordering::Release);
        self.comms.wake.notify_all();
        if let Some(watchdog) = self.watchdog.take() {
            let _ = watchdog.join();
        }
    }
}

impl Rank {
    fn new(device: &Device, rank: i32) -> Result<Self> {
        let context = device.context().clone();
        let lost = device.shared.lost.clone();
        let _bound = context.enter()?;
        Ok(Rank {
            comm: std::ptr::null_mut(),
            rank,
            stream: Stream::new(&context, CU_STREAM_NON_BLOCKING)?,
            done: Event::new(&context, CU_EVENT_DISABLE_TIMING)?,
            enter_for_stream_calls: AtomicBool::new(false),
            context,
            lost,
        })
    }
}

impl Drop for Comms {
    fn drop(&mut self) {
        let aborted = self.lock().aborted;
        for rank in &self.ranks {
            if !aborted && !rank.comm.is_null() {
                // SAFETY: the communicator is live and no thread uses it any more (the queue's
                // threads were joined); destroy waits for its work, which has completed.
                let _ = unsafe { (self.api.ncclCommDestroy)(rank.comm) };
            }
        }
    }
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("ranks", &self.comms.nranks)
            .field("local", &self.local_ranks())
            .field("failure", &self.comms.failure.get())
            .finish_non_exhaustive()
    }
}
