//! What a rank does in a collective: the kinds ([`Collective`]), one rank's part of a submission
//! ([`CollectivePart`]), the checks of its buffers, and the NCCL call that enqueues it.

use cuhal_command::BufferRange;
use cuhal_sys::{NcclApi, NcclComm, NcclDataType, NcclRedOp, nccl};

use super::comms::{Comms, Rank};
use crate::error::{Error, Result};
use crate::queue::SemaphoreValues;

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

/// One rank's part as a submission's payload holds it (without its waits and signals).
#[derive(Clone)]
pub(super) struct RankPart {
    pub(super) collective: Collective,
    pub(super) data_type: NcclDataType,
    pub(super) count: usize,
    pub(super) send: Option<BufferRange>,
    pub(super) recv: Option<BufferRange>,
}

/// Enqueues one rank's part of a collective on `stream` (inside a group, or alone).
///
/// # Safety
/// `comm` is live (not aborted or destroyed); `send` and `recv` (0 where the collective uses
/// none) are device memory of the communicator's device, as long as the collective reads and
/// writes, alive until the work completes; `stream` is a live stream of that device.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn nccl_call(
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
    unsafe {
        match collective {
            Collective::AllReduce(op) => {
                nccl!(api, ncclAllReduce(send, recv, count, t, op, comm, stream))
            }
            Collective::AllGather => nccl!(api, ncclAllGather(send, recv, count, t, comm, stream)),
            Collective::ReduceScatter(op) => {
                nccl!(
                    api,
                    ncclReduceScatter(send, recv, count, t, op, comm, stream)
                )
            }
            Collective::Broadcast { root } => {
                nccl!(api, ncclBroadcast(send, recv, count, t, root, comm, stream))
            }
            Collective::Reduce { op, root } => {
                nccl!(
                    api,
                    ncclReduce(send, recv, count, t, op, root, comm, stream)
                )
            }
            Collective::Send { peer } => nccl!(api, ncclSend(send, count, t, peer, comm, stream)),
            Collective::Recv { peer } => nccl!(api, ncclRecv(recv, count, t, peer, comm, stream)),
        }
    }
}

/// Checks one part's buffers: on the rank's device, as long as the collective reads and
/// writes, and present where it needs them.
pub(super) fn check_part(comms: &Comms, rank: &Rank, part: &CollectivePart<'_>) -> Result<()> {
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

/// Checks that `root` is a rank of a communicator of `n`.
fn check_root(root: i32, n: usize) -> Result<()> {
    if root < 0 || root as usize >= n {
        return Err(Error::InvalidArgument(format!(
            "root {root} of a communicator of {n}"
        )));
    }
    Ok(())
}
