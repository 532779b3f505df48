//! Collectives recorded into command buffers: one command buffer per local rank, recorded and
//! submitted together ([`CollectiveCommandBuffers`]).
//!
//! # Recording
//!
//! A collective is recorded into every rank's command buffer at once
//! ([`CollectiveCommandBuffers::collective`]), through stream work
//! ([`CommandRecorder::stream_work`]):
//!
//! - graph: the ranks' captures are nested (rank 0's stream-work closure records rank 1's stream
//!   work, and so on), so every rank's stream is capturing when the innermost closure enqueues
//!   every rank's part in one `ncclGroupStart`/`ncclGroupEnd`. NCCL needs that group: with
//!   several ranks on one thread, one rank's call alone can block inside NCCL (connection setup
//!   with its peers) for the others that this thread has not called yet. Each rank's graph then
//!   holds its part as a child graph, ordered after the commands before it and before those
//!   after it;
//! - deferred: each rank's command buffer keeps a closure that enqueues that rank's part alone.
//!   The closures are called only by [`Communicator::execute`], inside a group (below).
//!
//! # Submitting: why no deadlock
//!
//! [`Communicator::execute`] makes one action of the communicator's own queue of the whole set.
//! When every wait is reached or device-waitable, one thread issues it on the communicator's
//! streams (one per rank, used by nothing else):
//!
//! - graph: every rank's `cuGraphLaunch`, back to back, with no host wait between them. NCCL warns
//!   that several GPUs per process under graph launch can deadlock, because a launch may block
//!   until work already queued progresses; a blocked launch here waits only for collectives
//!   whose every rank was launched (all earlier sets were launched whole), so it can always
//!   finish. Nothing else (no device-queue work, no other set) can be queued between two ranks'
//!   launches of one set, since the streams are the communicator's;
//! - deferred: the ranks' buffers are replayed in lockstep: each up to its next collective, then
//!   every rank's part in one group, and so on. One group around whole replays would be wrong:
//!   NCCL enqueues a grouped call on its stream at `ncclGroupEnd`, after whatever the replay
//!   enqueued since (the commands that must follow the collective).
//!
//! The command buffers never leave the set (they can only be submitted this way), and the set
//! keeps the communicator's NCCL state alive: a communicator is destroyed only after every
//! graph that captured it, which NCCL (2.26 and later) waits for in `ncclCommDestroy`.

use std::sync::{Arc, Mutex, PoisonError};

use cuhal_command::{
    BufferRange, CommandBuffer, CommandBufferState, CommandRecorder, DeferredCommandBuffer,
    DeferredExec, GraphCommandBuffer, GraphExec, StreamWork, StreamWorkError, StreamWorkFn,
    WorkRange,
};
use smallvec::SmallVec;

use super::agreement::check_agreement;
use super::backend::CollectivePayload;
use super::comms::Comms;
use super::communicator::Communicator;
use super::group::group;
use super::part::{Collective, CollectivePart, check_part, nccl_call};
use crate::error::{Error, Result};
use crate::memory::use_allocation;
use crate::queue::{CommandBufferMode, Queue, SemaphoreValues};

/// One rank's command buffer while it records.
enum Recording {
    Graph(GraphCommandBuffer),
    Deferred(DeferredCommandBuffer),
}

impl Recording {
    fn recorder(&mut self) -> &mut dyn CommandRecorder {
        match self {
            Recording::Graph(cb) => cb,
            Recording::Deferred(cb) => cb,
        }
    }
}

/// The ended command buffers of a set, as a submission holds them.
pub(crate) enum SetBuffers {
    Graph(SmallVec<[GraphExec; 2]>),
    Deferred {
        buffers: SmallVec<[DeferredExec; 2]>,
        /// Per rank, the command index of each collective, in recording order.
        collectives: SmallVec<[SmallVec<[usize; 4]>; 2]>,
    },
}

impl SetBuffers {
    /// Every buffer the ranks' command buffers recorded.
    fn recorded_buffers(&self) -> impl Iterator<Item = &Arc<cuhal_command::Buffer>> {
        let (graphs, deferred) = match self {
            SetBuffers::Graph(execs) => (&execs[..], &[][..]),
            SetBuffers::Deferred { buffers, .. } => (&[][..], &buffers[..]),
        };
        graphs
            .iter()
            .flat_map(|exec| exec.buffers())
            .chain(deferred.iter().flat_map(|exec| exec.buffers()))
    }
}

/// One command buffer per local rank of a [`Communicator`], recorded and submitted together:
/// per-rank commands ([`CollectiveCommandBuffers::rank`]) and collectives over every rank
/// ([`CollectiveCommandBuffers::collective`]). Submit it with [`Communicator::execute`] any
/// number of times once [`ended`](CollectiveCommandBuffers::end). See the module documentation
/// of `collective/set.rs` (in the crate's docs: docs/decisions/device.md) for why this cannot
/// deadlock.
pub struct CollectiveCommandBuffers {
    /// Recording: the buffers; ended: taken.
    recording: SmallVec<[Recording; 2]>,
    /// Per rank, the command indices of the collectives (deferred).
    collectives: SmallVec<[SmallVec<[usize; 4]>; 2]>,
    ended: Option<Arc<SetBuffers>>,
    mode: CommandBufferMode,
    /// Declared last: dropped after the command buffers (NCCL destroys a communicator only
    /// once every graph that captured it is gone).
    comms: Arc<Comms>,
}

/// The closure handed to a graph's stream work must be `'static`, yet it has to reach the
/// recording frame (the other ranks' command buffers, the streams seen so far). It does so
/// through this slot, which holds a pointer to that frame's closure only while the frame runs
/// (a [`ScopeGuard`] empties it before the frame ends, also when unwinding).
type Step<'a> = dyn FnMut(&StreamWork<'_>) -> std::result::Result<(), StreamWorkError> + 'a;

struct StepPtr(*mut Step<'static>);
// SAFETY: the pointer is only dereferenced under the slot's mutex, by the thread that set it,
// while the frame it points into is alive (see `Step`).
unsafe impl Send for StepPtr {}

struct ScopeGuard<'a>(&'a Mutex<Option<StepPtr>>);
impl Drop for ScopeGuard<'_> {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// What a recorded part does: the collective, element type, count, and whether it has a send
/// and a receive buffer (the stream work's ranges are the present ones, in that order).
type Shape = (Collective, cuhal_sys::NcclDataType, usize, bool, bool);

/// What the innermost closure sees: each rank's capturing stream and its ranges' addresses.
type Seen = SmallVec<[(cuhal_sys::CUstream, SmallVec<[WorkRange; 2]>); 2]>;

/// Records stream work into `buffers[0]` whose closure records into `buffers[1]`, and so on;
/// the innermost closure calls `last` with every rank's stream and addresses.
fn capture_nested(
    buffers: &mut [Recording],
    ranges: &[SmallVec<[BufferRange; 2]>],
    seen: &mut Seen,
    last: &dyn Fn(&Seen) -> std::result::Result<(), StreamWorkError>,
) -> std::result::Result<(), cuhal_command::Error> {
    let Some((first, rest)) = buffers.split_first_mut() else {
        return Ok(());
    };
    let mut step = |on: &StreamWork<'_>| -> std::result::Result<(), StreamWorkError> {
        seen.push((on.stream(), on.ranges().iter().copied().collect()));
        let result = if rest.is_empty() {
            last(seen)
        } else {
            capture_nested(rest, &ranges[1..], seen, last).map_err(|e| Box::new(e) as _)
        };
        seen.pop();
        result
    };
    let step: &mut Step<'_> = &mut step;
    // SAFETY: only the lifetime bound changes (same fat-pointer layout); the pointer is used
    // only while `step` lives, as the slot's guard below ensures.
    let step: *mut Step<'static> = unsafe { std::mem::transmute(step as *mut Step<'_>) };
    let slot = Arc::new(Mutex::new(Some(StepPtr(step))));
    let _guard = ScopeGuard(&slot);
    let reach = Arc::clone(&slot);
    let work: Arc<StreamWorkFn> = Arc::new(move |on: &StreamWork<'_>| {
        let mut held = reach.lock().unwrap_or_else(PoisonError::into_inner);
        match held.as_mut() {
            // SAFETY: the slot holds the pointer only while the frame of `step` runs (the
            // guard empties it before that frame ends), and the mutex keeps it from being
            // emptied during the call.
            Some(step) => unsafe { (*step.0)(on) },
            None => Err("a collective's recording closure called after its recording".into()),
        }
    });
    first.recorder().stream_work(&ranges[0], work)
}

impl CollectiveCommandBuffers {
    /// A new set for `communicator`: `queues[i]` is a queue of local rank `i`'s device (the
    /// command buffers are untraced). `mode` picks graphs or deferred buffers.
    pub fn new(
        communicator: &Communicator,
        queues: &[&Queue],
        mode: CommandBufferMode,
    ) -> Result<Self> {
        let comms = &communicator.comms;
        if queues.len() != comms.ranks.len() {
            return Err(Error::InvalidArgument(format!(
                "{} queues for {} local ranks",
                queues.len(),
                comms.ranks.len()
            )));
        }
        let mut recording = SmallVec::new();
        for (queue, rank) in queues.iter().zip(&comms.ranks) {
            queue.check_usable()?;
            if queue.context().raw() != rank.context.raw() {
                return Err(Error::WrongDevice {
                    what: "queue of a collective command buffer",
                });
            }
            // Untraced: a set's submissions are the communicator's, which has no tracing
            // context to collect zones with.
            let zones = None;
            let created = match mode {
                CommandBufferMode::Graph => {
                    GraphCommandBuffer::new(queue.context(), zones).map(Recording::Graph)
                }
                CommandBufferMode::Deferred => {
                    DeferredCommandBuffer::with_bindings(queue.context(), zones, 0)
                        .map(Recording::Deferred)
                }
            };
            recording.push(created.map_err(|e| rank.lost.filter(e.into()))?);
        }
        Ok(Self {
            collectives: (0..recording.len()).map(|_| SmallVec::new()).collect(),
            recording,
            ended: None,
            mode,
            comms: Arc::clone(comms),
        })
    }

    /// Local rank `index`'s command buffer, to record that rank's own commands (dispatches,
    /// copies, barriers) between collectives. Not to be ended on its own: see
    /// [`CollectiveCommandBuffers::end`].
    pub fn rank(&mut self, index: usize) -> Result<&mut dyn CommandRecorder> {
        let ranks = self.recording.len();
        if self.ended.is_some() {
            return Err(Error::Command(cuhal_command::Error::InvalidState {
                operation: "record",
                state: CommandBufferState::Ended,
            }));
        }
        self.recording
            .get_mut(index)
            .map(Recording::recorder)
            .ok_or_else(|| Error::InvalidArgument(format!("rank {index} of {ranks} local ranks")))
    }

    /// Records one collective over every local rank: `parts[i]` is local rank `i`'s, checked as
    /// [`Communicator::submit`] checks it; its waits and signals must be empty (a submission of
    /// the set takes them). Each rank's part runs after the commands recorded into that rank's
    /// buffer before it (and their barrier) and before those recorded after it.
    pub fn collective(&mut self, parts: &[CollectivePart<'_>]) -> Result<()> {
        let comms = Arc::clone(&self.comms);
        if self.ended.is_some() {
            return Err(Error::Command(cuhal_command::Error::InvalidState {
                operation: "record",
                state: CommandBufferState::Ended,
            }));
        }
        if parts.len() != comms.ranks.len() {
            return Err(Error::InvalidArgument(format!(
                "{} parts for {} local ranks",
                parts.len(),
                comms.ranks.len()
            )));
        }
        check_agreement(&comms.ranks, parts)?;
        let mut ranges: SmallVec<[SmallVec<[BufferRange; 2]>; 2]> = SmallVec::new();
        for (rank, part) in comms.ranks.iter().zip(parts) {
            if !part.waits.is_empty() || !part.signals.is_empty() {
                return Err(Error::InvalidArgument(
                    "a recorded collective takes its waits and signals from each submission".into(),
                ));
            }
            check_part(&comms, rank, part)?;
            ranges.push(part.send.iter().chain(&part.recv).cloned().collect());
        }
        // Which of a part's ranges is the send and which the receive buffer.
        let shapes: SmallVec<[Shape; 2]> = parts
            .iter()
            .map(|p| {
                (
                    p.collective,
                    p.data_type,
                    p.count,
                    p.send.is_some(),
                    p.recv.is_some(),
                )
            })
            .collect();
        let addresses = |shape: &Shape, ranges: &[WorkRange]| {
            let (has_send, has_recv) = (shape.3, shape.4);
            let send = if has_send { ranges[0].ptr } else { 0 };
            let recv = match (has_send, has_recv) {
                (true, true) => ranges[1].ptr,
                (false, true) => ranges[0].ptr,
                _ => 0,
            };
            (send, recv)
        };
        match self.mode {
            CommandBufferMode::Graph => {
                let last = |seen: &Seen| -> std::result::Result<(), StreamWorkError> {
                    let api = &comms.api;
                    // Checked, then released: the watchdog must be able to take the lock and abort
                    // while a call below blocks inside NCCL.
                    if comms.lock().aborted {
                        return Err("the communicator was aborted".into());
                    }
                    let ranks = comms.ranks.iter().zip(&shapes).zip(seen.iter());
                    group(api, ranks, |((rank, shape), (stream, ranges))| {
                        let (send, recv) = addresses(shape, ranges);
                        // SAFETY: the communicator is live (not aborted just above; only the
                        // watchdog aborts while a call is under way, and then this closure's
                        // error ends the recording); the ranges were checked above and the
                        // command buffer retains their buffers; the stream is the rank's
                        // capturing stream.
                        unsafe {
                            nccl_call(
                                api, rank.comm, shape.0, shape.1, shape.2, send, recv, *stream,
                            )
                        }
                    })
                    .map_err(|e| Box::new(e) as _)
                };
                let mut seen = Seen::new();
                capture_nested(&mut self.recording, &ranges, &mut seen, &last)?;
            }
            CommandBufferMode::Deferred => {
                for (index, ((buffer, range), shape)) in self
                    .recording
                    .iter_mut()
                    .zip(&ranges)
                    .zip(&shapes)
                    .enumerate()
                {
                    let Recording::Deferred(cb) = buffer else {
                        return Err(Error::InvalidArgument("mixed command buffer kinds".into()));
                    };
                    let owner = Arc::clone(&comms);
                    let shape = *shape;
                    let work: Arc<StreamWorkFn> = Arc::new(move |on: &StreamWork<'_>| {
                        let rank = &owner.ranks[index];
                        let (send, recv) = addresses(&shape, on.ranges());
                        // Checked, then released (as the watchdog needs the lock to abort).
                        if owner.lock().aborted {
                            return Err("the communicator was aborted".into());
                        }
                        // SAFETY: the communicator is live (not aborted just above, as for the
                        // issuing thread's own calls; the closure holds the NCCL state); the ranges were checked when recorded
                        // and the command buffer retains their buffers; the stream is the
                        // rank's (the set is only issued on the communicator's streams).
                        unsafe {
                            nccl_call(
                                &owner.api,
                                rank.comm,
                                shape.0,
                                shape.1,
                                shape.2,
                                send,
                                recv,
                                on.stream(),
                            )
                        }
                        .map_err(|e| Box::new(e) as _)
                    });
                    cb.stream_work(range, Arc::clone(&work))?;
                    let at = cb.command_count().saturating_sub(1);
                    match cb.stream_work_at(at) {
                        Some(recorded) if Arc::ptr_eq(recorded, &work) => {
                            self.collectives[index].push(at)
                        }
                        _ => {
                            return Err(Error::InvalidArgument(
                                "the collective is not the deferred buffer's last command".into(),
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Ends every rank's command buffer (graphs are instantiated here).
    pub fn end(&mut self) -> Result<()> {
        if self.ended.is_some() {
            return Err(Error::Command(cuhal_command::Error::InvalidState {
                operation: "end",
                state: CommandBufferState::Ended,
            }));
        }
        let mut graphs = SmallVec::new();
        let mut deferred = SmallVec::new();
        for (buffer, rank) in self.recording.iter_mut().zip(&self.comms.ranks) {
            let lost = |e: cuhal_command::Error| rank.lost.filter(e.into());
            match buffer {
                Recording::Graph(cb) => graphs.push(cb.end().map_err(lost)?),
                Recording::Deferred(cb) => deferred.push(cb.end().map_err(lost)?),
            }
        }
        // Every rank's buffer ended: the recordings are spent.
        self.recording.clear();
        let set = match self.mode {
            CommandBufferMode::Graph => SetBuffers::Graph(graphs),
            CommandBufferMode::Deferred => SetBuffers::Deferred {
                buffers: deferred,
                collectives: std::mem::take(&mut self.collectives),
            },
        };
        self.ended = Some(Arc::new(set));
        Ok(())
    }

    /// The kind of command buffers.
    pub fn mode(&self) -> CommandBufferMode {
        self.mode
    }
}

impl std::fmt::Debug for CollectiveCommandBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CollectiveCommandBuffers")
            .field("mode", &self.mode)
            .field("ended", &self.ended.is_some())
            .finish_non_exhaustive()
    }
}

impl SetBuffers {
    /// Issues the set on the communicator's streams (see the module documentation).
    pub(crate) fn issue(&self, comms: &Comms) -> Result<()> {
        match self {
            SetBuffers::Graph(buffers) => {
                for (rank, cb) in comms.ranks.iter().zip(buffers) {
                    let _bound = rank.context.enter()?;
                    // SAFETY: the rank's stream is live and of the command buffer's context
                    // (checked when the set was made); the payload holds the command buffer
                    // until the submission completes.
                    unsafe { cb.issue(rank.stream.raw()) }
                        .map_err(|e| rank.lost.filter(e.into()))?;
                }
            }
            SetBuffers::Deferred {
                buffers,
                collectives,
            } => {
                let steps = collectives.first().map_or(0, SmallVec::len);
                let mut from: SmallVec<[usize; 2]> = buffers.iter().map(|_| 0).collect();
                for step in 0..=steps {
                    // Every rank up to its collective (or its end).
                    for (i, (rank, cb)) in comms.ranks.iter().zip(buffers).enumerate() {
                        let to = collectives[i].get(step).copied().unwrap_or(usize::MAX);
                        // SAFETY: as for graphs; the set has no binding slots.
                        unsafe { cb.replay_commands(rank.stream.raw(), &[], from[i]..to) }
                            .map_err(|e| rank.lost.filter(e.into()))?;
                        from[i] = to;
                    }
                    if step == steps {
                        break;
                    }
                    // Every rank's part of the collective, in one group.
                    let ranks = comms.ranks.iter().zip(buffers).zip(from.iter_mut());
                    group(&comms.api, ranks, |((rank, cb), from)| -> Result<()> {
                        let at = *from;
                        *from = at + 1;
                        // SAFETY: as above; the command replayed is the rank's collective.
                        unsafe { cb.replay_commands(rank.stream.raw(), &[], at..at + 1) }?;
                        Ok(())
                    })?;
                }
            }
        }
        Ok(())
    }
}

impl Communicator {
    /// Submits a set of command buffers recorded with collectives
    /// ([`CollectiveCommandBuffers`], ended): every rank's buffer runs once every wait is
    /// reached or device-waitable, issued together by one thread on the communicator's streams
    /// (see the module documentation); every signal is signalled when every rank's buffer
    /// completed. Failures are those of [`Communicator::submit`].
    pub fn execute(
        &self,
        set: &CollectiveCommandBuffers,
        waits: &SemaphoreValues<'_>,
        signals: &SemaphoreValues<'_>,
    ) -> Result<()> {
        if let Some(failure) = self.comms.failure.get() {
            return Err(Error::Lost(failure.clone()));
        }
        if !Arc::ptr_eq(&set.comms, &self.comms) {
            return Err(Error::InvalidArgument(
                "the command buffers were recorded for another communicator".into(),
            ));
        }
        let Some(buffers) = &set.ended else {
            return Err(Error::Command(cuhal_command::Error::InvalidState {
                operation: "execute",
                state: CommandBufferState::Recording,
            }));
        };
        // The stream-ordered allocations the buffers recorded stay allocated until the work is
        // done; one that `dealloca` released refuses the submission.
        let mut resources = cuhal_scheduler::Resources::new();
        for buffer in buffers.recorded_buffers() {
            use_allocation(buffer, "collective command buffer's buffer", &mut resources)?;
        }
        self.submit_with(
            waits,
            signals,
            CollectivePayload::CommandBuffers(Arc::clone(buffers)),
            resources,
        )
    }
}
