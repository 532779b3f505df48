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

mod agreement;
mod backend;
mod comms;
mod communicator;
mod group;
mod library;
mod part;
mod set;

pub use agreement::PartField;
pub use communicator::{Communicator, CommunicatorOptions};
pub use library::{Nccl, UniqueId};
pub use part::{Collective, CollectivePart};
pub use set::CollectiveCommandBuffers;
