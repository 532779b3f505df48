//! The communicator's NCCL state: its local ranks, the lock that orders group calls against
//! aborts, the abort rule, the asynchronous-error poll and the watchdog that aborts a group call
//! blocked past the timeout.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cuhal_semaphore::Failure;
use cuhal_sys::{
    CU_EVENT_DISABLE_TIMING, CU_STREAM_NON_BLOCKING, Event, NcclApi, NcclComm, PrimaryContext,
    Stream, nccl_name,
};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::lost::Lost;

/// One local rank: its NCCL communicator, its device and its private stream.
pub(crate) struct Rank {
    /// The rank's communicator (null until `ncclCommInitRank` made it).
    pub(super) comm: NcclComm,
    /// The rank's number in the communicator.
    pub(super) rank: i32,
    /// The rank's device.
    pub(super) context: Arc<PrimaryContext>,
    /// The device's loss, which errors of the rank's stream calls report to.
    pub(super) lost: Arc<Lost>,
    /// The rank's stream, used by nothing but the communicator.
    pub(super) stream: Stream,
    /// Recorded at the end of this rank's part, for rank 0's stream to join (ranks > 0).
    pub(super) done: Event,
    /// Set once a stream call failed outside the rank's context and succeeded inside it: the
    /// issuing path then enters the context for them (see `on_stream`).
    enter_for_stream_calls: AtomicBool,
}

/// The communicator's NCCL state, shared by the issuing thread, the completion thread and the
/// watchdog.
pub(crate) struct Comms {
    /// NCCL.
    pub(super) api: Arc<NcclApi>,
    /// This process's ranks, in local order.
    pub(super) ranks: Vec<Rank>,
    /// The number of ranks of the whole communicator.
    pub(super) nranks: i32,
    /// How long a join or a collective may take before the communicator is aborted.
    pub(super) timeout: Duration,
    /// When the group call in progress started, if one is.
    pub(super) issuing: Mutex<Issuing>,
    /// The failure that ended the communicator (an abort, an async error): every later
    /// submission fails with it.
    pub(super) failure: std::sync::OnceLock<Failure>,
    /// Set when the communicator is dropped: the watchdog stops.
    pub(super) closing: AtomicBool,
    /// Wakes the watchdog.
    pub(super) wake: Condvar,
}

/// The group-call state that the issuing thread, the completion side and the watchdog share
/// under the communicator's lock.
#[derive(Default)]
pub(super) struct Issuing {
    /// When the group call in progress started, if one is.
    pub(super) since: Option<Instant>,
    /// Set while the watchdog waits with no deadline (no group call in progress when it last
    /// looked): only then must a group call wake it. Otherwise it already sleeps until an
    /// earlier deadline than the new call's and looks again then, so a submission costs no
    /// wake-up (a futex call and a thread switch on the issuing path).
    pub(super) watchdog_idle: bool,
    /// Set once `ncclCommAbort` ran: the NCCL handles are gone.
    pub(super) aborted: bool,
}

// SAFETY: NCCL communicators and CUDA streams and events may be used from any thread; the
// communicator handles are only used under the rules of `Issuing` (never after an abort).
unsafe impl Send for Comms {}
// SAFETY: as above.
unsafe impl Sync for Comms {}

impl Comms {
    /// The group-call state, under the communicator's lock.
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Issuing> {
        self.issuing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Aborts every local rank (once) and records `failure` as the communicator's end. With the
    /// lock held by the caller.
    pub(super) fn abort(&self, issuing: &mut Issuing, failure: Failure) -> Failure {
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

    /// The error a submission to the aborted communicator gets: its recorded failure.
    pub(super) fn lost(&self) -> Error {
        Error::Lost(
            self.failure
                .get()
                .cloned()
                .unwrap_or_else(|| Failure::msg("aborted")),
        )
    }

    /// Ends the communicator with `error`. While a group call is in progress, the issuing thread
    /// still passes the handles to NCCL: the failure is recorded and that thread aborts once its
    /// call returned (only the watchdog aborts under a running call, which is blocked in NCCL).
    pub(super) fn fail(&self, error: Error) -> Failure {
        let mut issuing = self.lock();
        if issuing.since.is_some() {
            return self.failure.get_or_init(|| Failure::new(error)).clone();
        }
        self.abort(&mut issuing, Failure::new(error))
    }

    /// `ncclCommGetAsyncError` of every local rank: the first error, if any.
    pub(super) fn async_error(&self) -> Option<Error> {
        let issuing = self.lock();
        if issuing.aborted {
            return None;
        }
        for rank in &self.ranks {
            let mut error = cuhal_sys::NCCL_SUCCESS;
            // SAFETY: the handle is live (checked under the lock); `error` is an out-pointer.
            let r = unsafe { (self.api.ncclCommGetAsyncError)(rank.comm, &mut error) };
            let (call, result) = if r != cuhal_sys::NCCL_SUCCESS {
                (nccl_name!(ncclCommGetAsyncError), r)
            } else {
                (
                    nccl_name!(ncclCommGetAsyncError, " (asynchronous error)"),
                    error,
                )
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

/// Runs a stream-ordered driver call on one of `rank`'s streams (`cuEventRecord`,
/// `cuStreamWaitEvent`) without making the rank's context current: the driver takes the context
/// from the stream, so the issuing path pays no `cuCtxPushCurrent`/`cuCtxPopCurrent` pair per
/// rank and submission. Should a driver fail the call all the same (wrappers of the driver
/// report drivers that want the stream's context current), the call is made again inside the
/// context, and if that succeeds the rank enters its context for these calls from then on: the
/// shortcut can cost one failed call, never a failure or a call per submission. (A failed call
/// enqueued nothing, so making it again is safe; an error that is the device's fails again.)
pub(super) fn on_stream<T>(
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

/// Aborts the communicator when a group call has been blocked for longer than the timeout (a
/// peer that never arrived, inside NCCL): the blocked call then returns with an error.
pub(super) fn watchdog(comms: &Comms) {
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

impl Rank {
    /// Rank `rank` on `device`, with its stream and event; its communicator is made later.
    pub(super) fn new(device: &Device, rank: i32) -> Result<Self> {
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
