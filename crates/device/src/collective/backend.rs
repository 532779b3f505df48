//! The communicator's scheduler backend: what one submission holds ([`CollectivePayload`]), how
//! it is issued (every local rank's part in one group on the communicator's streams, rank 0's
//! stream joining the others) and how its completion is awaited (the completion event, the
//! ranks' asynchronous errors and the timeout).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cuhal_scheduler::{Backend, ThreadRole};
use cuhal_semaphore::Failure;
use smallvec::SmallVec;

use super::comms::{Comms, Rank, on_stream};
use super::group::group;
use super::part::{RankPart, nccl_call};
use super::set::SetBuffers;
use crate::error::{Error, Result};
use crate::event_pool::{CudaEvent, TimepointEventPool};

/// The work of one submission. (The parts are inline: the payload moves into the action's slot
/// once, and a boxed variant would allocate per submission.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum CollectivePayload {
    /// Every local rank's part of one collective, enqueued in one group.
    Parts(SmallVec<[RankPart; 2]>),
    /// One command buffer per local rank, recorded together ([`CollectiveCommandBuffers`]).
    CommandBuffers(Arc<SetBuffers>),
}

/// The communicator's scheduler backend: issues every local rank's part in one group.
pub(crate) struct CollectiveBackend {
    /// The communicator's NCCL state.
    pub(super) comms: Arc<Comms>,
    /// The completion events (of rank 0's context).
    pub(super) events: TimepointEventPool,
    /// How often the completion side polls the ranks' asynchronous errors.
    pub(super) poll_interval: Duration,
}

impl CollectiveBackend {
    /// Issues `payload` after `device_waits`: every rank's part (or command buffer) in one go,
    /// then rank 0's stream joins the others and records the completion event it returns.
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
                return Err(comms.lost());
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
            return Err(comms.lost());
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
        group(&comms.api, comms.ranks.iter().zip(parts), |(rank, part)| {
            self.enqueue_part(rank, part)
        })
    }

    /// Enqueues one rank's part (inside the group).
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

    /// Queries the completion event; once it completed, the ranks' asynchronous errors (a
    /// collective can end with an error its kernels met; NCCL reports it there).
    fn query_event(&self, event: &CudaEvent) -> std::result::Result<bool, Failure> {
        match event.query_raw() {
            Ok(true) => match self.comms.async_error() {
                Some(error) => Err(self.comms.fail(error)),
                None => Ok(true),
            },
            Ok(false) => Ok(false),
            Err(e) => Err(self.comms.fail(Error::from(e))),
        }
    }

    /// Polls the completion event between sleeps of the communicator's poll interval (at most
    /// 1 ms); between polls, the ranks' asynchronous errors and the timeout (the hook of the
    /// completion side for NCCL).
    fn block_on_event(&self, event: &CudaEvent) -> std::result::Result<(), Failure> {
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
            std::thread::sleep(self.poll_interval.min(Duration::from_millis(1)));
        }
    }
}
