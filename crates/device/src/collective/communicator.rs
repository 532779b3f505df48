//! [`Communicator`]: this process's ranks of one NCCL communicator, joined together, with the
//! scheduler queue that issues their collectives (see the module documentation of
//! `collective`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use cuhal_scheduler::{Cleanups, QueueOptions, Resources};
use cuhal_semaphore::Failure;
use cuhal_sys::nccl;
use smallvec::SmallVec;

use super::agreement::check_agreement;
use super::backend::{CollectiveBackend, CollectivePayload};
use super::comms::{Comms, Issuing, Rank, watchdog};
use super::group::Group;
use super::library::{Nccl, UniqueId};
use super::part::{CollectivePart, RankPart, check_part};
use crate::Semaphore;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::event_pool::TimepointEventPool;
use crate::memory::use_allocation;
use crate::queue::SemaphoreValues;
use crate::submissions::Submissions;

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

/// This process's ranks of one NCCL communicator, one per device, with the scheduler queue that
/// issues their collectives (see the module documentation).
pub struct Communicator {
    /// Taken and dropped first when the communicator drops: its threads finish (or fail)
    /// everything submitted while the watchdog still guards the group calls.
    queue: Option<cuhal_scheduler::Queue<CollectiveBackend>>,
    pub(super) comms: Arc<Comms>,
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
        let group = Group::start(&api)?;
        let init: Result<()> = group.each(&mut local, |rank| {
            let _bound = rank.context.enter()?;
            // SAFETY: `comm` is a valid out-pointer; the rank's context is current, which is how
            // NCCL picks the device.
            unsafe {
                nccl!(
                    api,
                    ncclCommInitRank(&mut rank.comm, nranks, id.0, rank.rank)
                )
            }?;
            Ok(())
        });
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
            // The first init error, else the end's.
            let ended = group.end(init);
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
        let failed = ended.err();
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
        check_agreement(&self.comms.ranks, parts)?;
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
    pub(super) fn submit_with(
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

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("ranks", &self.comms.nranks)
            .field("local", &self.local_ranks())
            .field("failure", &self.comms.failure.get())
            .finish_non_exhaustive()
    }
}
