//! The parts of one collective agree across ranks, or nothing is issued.
//!
//! NCCL takes each rank's call on trust: ranks that call different collectives, or the same one
//! with another element count, data type, reduction or root, compute garbage or hang.
//! [`check_agreement`] compares the local ranks' parts wherever they are combined
//! ([`Communicator::submit`](super::Communicator::submit),
//! [`CollectiveCommandBuffers::collective`](super::CollectiveCommandBuffers::collective))
//! before anything is issued, recorded or held. Ranks of other processes are out of its reach
//! (each process gives only its own parts); the fake NCCL checks every rank when they meet.

use std::fmt;

use cuhal_sys::{NcclDataType, NcclRedOp};

use super::comms::Rank;
use super::part::{Collective, CollectivePart};
use crate::error::{Error, Result};

/// One field of a rank's [`CollectivePart`] with that rank's value, as
/// [`Error::CollectiveMismatch`] reports a disagreement. Fields are compared in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartField {
    /// What the rank does. The kinds must be the same, except that a send and a receive pair
    /// up: a send's (or receive's) peer, when it is a local rank, must receive from (or send
    /// to) the first rank.
    Kind(Collective),
    /// The element count.
    Count(usize),
    /// The element type.
    DataType(NcclDataType),
    /// The reduction (all-reduce, reduce-scatter, reduce).
    Op(NcclRedOp),
    /// The root rank (broadcast, reduce).
    Root(i32),
    /// The peer a send or receive names.
    Peer(i32),
}

impl PartField {
    /// The field's name, as messages give it.
    pub fn name(&self) -> &'static str {
        match self {
            PartField::Kind(_) => "kind",
            PartField::Count(_) => "element count",
            PartField::DataType(_) => "data type",
            PartField::Op(_) => "reduction",
            PartField::Root(_) => "root",
            PartField::Peer(_) => "peer",
        }
    }
}

impl fmt::Display for PartField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PartField::Kind(c) => write!(f, "{c:?}"),
            PartField::Count(n) => write!(f, "{n}"),
            PartField::DataType(t) => write!(f, "{t:?}"),
            PartField::Op(op) => write!(f, "{op:?}"),
            PartField::Root(r) | PartField::Peer(r) => write!(f, "{r}"),
        }
    }
}

/// Checks that `parts[i]` (local rank `ranks[i]`'s) agree: every part is the same collective
/// as the first, of the same count, data type, reduction and root; or every part is a send or a
/// receive, each paired with its peer's part where that peer is local. The error names the
/// first disagreement ([`Error::CollectiveMismatch`]).
pub(super) fn check_agreement(ranks: &[Rank], parts: &[CollectivePart<'_>]) -> Result<()> {
    let Some(first) = parts.first() else {
        return Ok(());
    };
    for (rank, part) in ranks.iter().zip(parts).skip(1) {
        let kinds_differ = if peer(first.collective).is_some() {
            peer(part.collective).is_none()
        } else {
            std::mem::discriminant(&first.collective) != std::mem::discriminant(&part.collective)
        };
        if kinds_differ {
            return Err(mismatch(
                (ranks[0].rank, PartField::Kind(first.collective)),
                (rank.rank, PartField::Kind(part.collective)),
            ));
        }
        if peer(first.collective).is_none() {
            compare((ranks[0].rank, first), (rank.rank, part))?;
        }
    }
    // Sends and receives: each with its local peer's part.
    for (rank, part) in ranks.iter().zip(parts) {
        let Some(to) = peer(part.collective) else {
            continue;
        };
        let Some((other, partner)) = ranks.iter().zip(parts).find(|(r, _)| r.rank == to) else {
            continue;
        };
        let (a, b) = ((rank.rank, part), (other.rank, partner));
        // The peer the partner names, if it is the other direction.
        let back = match (part.collective, partner.collective) {
            (Collective::Send { .. }, Collective::Recv { peer })
            | (Collective::Recv { .. }, Collective::Send { peer }) => peer,
            _ => {
                return Err(mismatch(
                    (a.0, PartField::Kind(part.collective)),
                    (b.0, PartField::Kind(partner.collective)),
                ));
            }
        };
        if back != rank.rank {
            return Err(mismatch(
                (a.0, PartField::Peer(to)),
                (b.0, PartField::Peer(back)),
            ));
        }
        compare(a, b)?;
    }
    Ok(())
}

/// The first of count, data type, reduction and root in which `b`'s part differs from `a`'s
/// (whose kinds agree).
fn compare(a: (i32, &CollectivePart<'_>), b: (i32, &CollectivePart<'_>)) -> Result<()> {
    let fields = |p: &CollectivePart<'_>| {
        [
            Some(PartField::Count(p.count)),
            Some(PartField::DataType(p.data_type)),
            op(p.collective).map(PartField::Op),
            root(p.collective).map(PartField::Root),
        ]
    };
    for (x, y) in fields(a.1).into_iter().zip(fields(b.1)) {
        if let (Some(x), Some(y)) = (x, y)
            && x != y
        {
            return Err(mismatch((a.0, x), (b.0, y)));
        }
    }
    Ok(())
}

fn mismatch((rank, value): (i32, PartField), (other_rank, other_value): (i32, PartField)) -> Error {
    Error::CollectiveMismatch {
        rank,
        value,
        other_rank,
        other_value,
    }
}

fn op(collective: Collective) -> Option<NcclRedOp> {
    match collective {
        Collective::AllReduce(op) | Collective::ReduceScatter(op) => Some(op),
        Collective::Reduce { op, .. } => Some(op),
        _ => None,
    }
}

fn root(collective: Collective) -> Option<i32> {
    match collective {
        Collective::Broadcast { root } | Collective::Reduce { root, .. } => Some(root),
        _ => None,
    }
}

fn peer(collective: Collective) -> Option<i32> {
    match collective {
        Collective::Send { peer } | Collective::Recv { peer } => Some(peer),
        _ => None,
    }
}
