//! What a resident queue cannot run, refused at submission with a typed reason: the
//! [`Launchable`] description of an executable, its [`NodeKind`]s, and [`Refusal`].

use cuhal_semaphore::SemaphoreId;

/// How an executable replays: only a graph can be launched from the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecutableKind {
    /// A graph command buffer's executable.
    Graph,
    /// A stream command buffer: its work runs on a host stream as it is recorded.
    Stream,
    /// A deferred command buffer: replayed onto a stream by the host.
    Deferred,
}

/// A node of a graph, as `cuGraphNodeGetType` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// A kernel launch.
    Kernel,
    /// A copy.
    Memcpy,
    /// A fill.
    Memset,
    /// An empty node (a barrier's join point).
    Empty,
    /// An event record (tracing zones, timepoints).
    EventRecord,
    /// An event wait.
    EventWait,
    /// A child graph (captured stream work).
    ChildGraph,
    /// A host function.
    Host,
    /// A stream-ordered allocation or free.
    MemoryAlloc,
    /// A conditional node, an external semaphore, a batch memory operation, or any other kind.
    Other,
}

impl NodeKind {
    /// Whether a graph holding this node can be instantiated for device launch. Only the kinds
    /// the driver documents for device-launchable graphs are accepted (kernel, memcpy, memset);
    /// anything else waits until it is validated on a GPU.
    pub fn device_launchable(self) -> bool {
        matches!(self, NodeKind::Kernel | NodeKind::Memcpy | NodeKind::Memset)
    }
}

/// What a resident queue needs to know about an executable to accept it.
pub trait Launchable: Send + Sync {
    /// How it replays.
    fn kind(&self) -> ExecutableKind;
    /// The kinds of its graph's nodes (empty for a stream or deferred command buffer).
    fn nodes(&self) -> &[NodeKind];
    /// The handle the device scheduler launches (a device-launchable `CUgraphExec`; in the CPU
    /// model, any number the launcher understands).
    fn handle(&self) -> u64;
}

/// Why a resident queue refused a submission. Nothing was published; no semaphore changed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// Only graphs launch from the device: a stream or deferred command buffer is refused.
    NotAGraph {
        /// What was submitted.
        kind: ExecutableKind,
    },
    /// The graph holds a node device launch refuses.
    NodeKind {
        /// The node's kind.
        kind: NodeKind,
        /// Its position in [`Launchable::nodes`].
        index: usize,
    },
    /// A semaphore with no slot in this queue's table: the device cannot see its value.
    /// [`ResidentQueue::bind`](crate::ResidentQueue::bind) gives it one.
    UnboundSemaphore {
        /// The semaphore.
        semaphore: SemaphoreId,
        /// `"wait"` or `"signal"`.
        role: &'static str,
    },
    /// More waits than a descriptor holds.
    TooManyWaits {
        /// Asked for.
        count: usize,
        /// [`MAX_WAITS`](crate::MAX_WAITS).
        max: usize,
    },
    /// More signals than a descriptor holds.
    TooManySignals {
        /// Asked for.
        count: usize,
        /// [`MAX_SIGNALS`](crate::MAX_SIGNALS).
        max: usize,
    },
    /// A value with the top bit set: the slot table keeps that bit for failure.
    ValueOutOfRange {
        /// The value.
        value: u64,
    },
    /// A command buffer that records binding slots: its addresses are patched per submission
    /// by the host, which a resident submission does not pass through.
    BindingSlots {
        /// The slots it uses.
        slots: usize,
    },
    /// A command buffer whose completion the host must check (an indirect dispatch records
    /// out-of-range counts for the host to read), which a resident queue does not do.
    ChecksCompletion,
    /// A command buffer recorded with tracing zones (their event nodes do not launch from the
    /// device).
    Traced,
    /// An executable prepared for another resident queue.
    OtherQueue,
    /// A signal to a value its semaphore has already reached: timeline values only rise, so it
    /// could never take effect (as a normal queue refuses it).
    SignalNotAbove {
        /// The value signalled.
        value: u64,
        /// The semaphore's value at submission.
        current: u64,
    },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NotAGraph { kind } => write!(
                f,
                "a {kind:?} command buffer cannot be launched from the device; only graphs can"
            ),
            Refusal::NodeKind { kind, index } => write!(
                f,
                "graph node {index} is a {kind:?} node, which device graph launch refuses \
                 (kernel, memcpy and memset nodes only)"
            ),
            Refusal::UnboundSemaphore { semaphore, role } => write!(
                f,
                "{role} semaphore {semaphore:?} has no slot in this resident queue's table"
            ),
            Refusal::TooManyWaits { count, max } => {
                write!(
                    f,
                    "{count} waits; a resident submission holds at most {max}"
                )
            }
            Refusal::TooManySignals { count, max } => {
                write!(
                    f,
                    "{count} signals; a resident submission holds at most {max}"
                )
            }
            Refusal::ValueOutOfRange { value } => write!(
                f,
                "value {value:#x} has the top bit set, which the slot table keeps for failure"
            ),
            Refusal::BindingSlots { slots } => write!(
                f,
                "the command buffer records {slots} binding slots; a resident queue launches \
                 executables as recorded, with no binding table"
            ),
            Refusal::ChecksCompletion => f.write_str(
                "the command buffer records an indirect dispatch, whose completion the host \
                 must check; a resident queue does not",
            ),
            Refusal::OtherQueue => f.write_str(
                "the graph was prepared for another resident queue; prepare it for this one",
            ),
            Refusal::Traced => f.write_str(
                "the command buffer records tracing zones, whose event nodes device graph \
                 launch refuses",
            ),
            Refusal::SignalNotAbove { value, current } => write!(
                f,
                "a signal to {value}, which the semaphore has already reached (it is at \
                 {current}): timeline values only rise"
            ),
        }
    }
}
