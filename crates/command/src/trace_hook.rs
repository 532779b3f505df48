//! The hook through which a tracer times command buffers, without this crate knowing the tracer.
//!
//! `cuhal-trace` implements [`ZoneRecorder`]; a command buffer is given one at creation (or
//! `None`). The command buffer asks it for a timing event wherever a zone begins or ends and
//! records that event where the work is: `cuEventRecord` on a stream, an event-record node in a
//! graph, or an event command in a deferred buffer's arena. With no recorder, or one whose
//! verbosity is [`Verbosity::Off`], recording costs one branch per command and nothing more.

use cuhal_sys::{CUevent, CUgraphNode};

/// How much a queue traces. Chosen per queue at creation.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub enum Verbosity {
    /// No zones at all.
    #[default]
    Off,
    /// Submissions, whole command buffers and debug groups.
    Coarse,
    /// Also every dispatch, fill, copy and update.
    Fine,
}

/// Source of a zone, for viewers (static so recording never allocates).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ZoneInfo {
    /// The zone's name.
    pub name: &'static str,
    /// The source file that opened it.
    pub file: &'static str,
    /// The line in `file`.
    pub line: u32,
}

/// How one command's FINE zone is timed: by events the command buffer records around it, or by
/// the driver's own activity records (CUPTI), which need no extra GPU work.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CommandTiming {
    /// The event to record before the command, if timed by events.
    pub begin: Option<CUevent>,
    /// The event to record after the command, if timed by events.
    pub end: Option<CUevent>,
    /// The tracer times the command from activity records: the command buffer records no event
    /// and reports the command's graph node ([`ZoneRecorder::command_node`]) if it has one.
    pub by_activity: bool,
}

/// Where a command buffer records the events of a command's FINE zone. The events sit right
/// around the command either way, but what they add to the zone differs: a stream's
/// `cuEventRecord`s are commands of their own on the stream, a graph's event-record nodes are
/// nodes of the same launch. A tracer that corrects for what events add measures each placement
/// apart.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum EventPlacement {
    /// `cuEventRecord` on a stream, before and after the command (stream command buffers as
    /// they record, deferred ones as they replay).
    Stream,
    /// Event-record nodes of a graph: begin node, then the command's node, then end node.
    Graph,
}

/// A command buffer's list of timing zones, supplied by a tracer. One per command buffer.
///
/// Events handed out are owned by the recorder: the command buffer only records them. The
/// recorder returns them to its pool when it is dropped (which happens when the command buffer
/// is dropped), never while a submission may still record them.
///
/// # Safety
/// The command buffer hands every event that [`ZoneRecorder::begin_zone`] and
/// [`ZoneRecorder::end_zone`] return straight to the driver (`cuEventRecord`,
/// `cuGraphAddEventRecordNode`). An implementation must return only live events of the context
/// of the command buffer it was given to, created with timing enabled, that stay live until the
/// recorder is dropped. A made-up handle would reach the driver, so implementing this trait is
/// `unsafe`:
///
/// ```compile_fail
/// use cuhal_command::{Verbosity, ZoneRecorder};
/// use cuhal_sys::{CUevent, CUgraphNode};
/// struct Forged;
/// impl ZoneRecorder for Forged {
///     fn verbosity(&self) -> Verbosity { Verbosity::Fine }
///     fn begin_zone(&self, _: &str) -> Option<CUevent> { Some(0x1234 as CUevent) }
///     fn end_zone(&self) -> Option<CUevent> { Some(0x1234 as CUevent) }
/// }
/// ```
pub unsafe trait ZoneRecorder: Send + Sync {
    /// The verbosity this recorder wants. Read once, when the command buffer is created.
    fn verbosity(&self) -> Verbosity;

    /// Opens a zone. Returns the timing event the command buffer must record where the zone
    /// begins (stream: `cuEventRecord` on the stream; graph: a `cuGraphAddEventRecordNode`
    /// wired into the graph's dependencies), or `None` if the zone is dropped (pool exhausted:
    /// the tracer counts it).
    fn begin_zone(&self, name: &str) -> Option<CUevent>;

    /// Closes the innermost open zone; same contract for the returned event. Called once for
    /// every `begin_zone`, even one that returned `None`, so the recorder keeps nesting balanced.
    fn end_zone(&self) -> Option<CUevent>;

    /// Opens and closes the FINE zone of one command of a kind the tracer may time from
    /// activity records. Timed by events, they are recorded at `placement`. The default times
    /// it by events, as [`ZoneRecorder::command_events`].
    fn command_zone(&self, name: &str, placement: EventPlacement) -> CommandTiming {
        self.command_events(name, placement)
    }

    /// Opens and closes the FINE zone of one command timed by events, which the command buffer
    /// records right around the command at `placement`. The default: a
    /// [`ZoneRecorder::begin_zone`] and [`ZoneRecorder::end_zone`] pair.
    fn command_events(&self, name: &str, placement: EventPlacement) -> CommandTiming {
        let _ = placement;
        CommandTiming {
            begin: self.begin_zone(name),
            end: self.end_zone(),
            by_activity: false,
        }
    }

    /// Opens and closes the FINE zone of a dispatch that stamps itself (its kernel takes a
    /// `cuhal_zone_stamp*`, [`KernelArgs::push_zone_stamp`](crate::KernelArgs::push_zone_stamp)).
    /// Returns the zone's stamp index in this command buffer (0, 1, 2, ... in recording order):
    /// the command buffer records no event and no activity zone for the dispatch and binds its
    /// stamp argument, per submission, to the 16 bytes at `index * 16` of the command buffer's
    /// stamp region ([`BindingLayout::stamp_slot`](crate::BindingLayout::stamp_slot)). `None`:
    /// the tracer takes no stamps, and the dispatch is timed as any other command (its stamp
    /// argument stays null). The default: `None`.
    ///
    /// Called only at [`Verbosity::Fine`], only for dispatches with a zone-stamp argument, and
    /// only by graph and deferred command buffers: a stream command buffer has no per-submission
    /// table, so its stamp arguments stay null and its dispatches are timed as before.
    fn stamp_zone(&self, name: &str) -> Option<u32> {
        let _ = name;
        None
    }

    /// The graph node a command whose zone is timed by activity was recorded as (graph command
    /// buffers only; called right after that command's `command_zone`). The default ignores it.
    ///
    /// # Safety
    /// `node` must be a live node of the command buffer's graph.
    unsafe fn command_node(&self, node: CUgraphNode) {
        let _ = node;
    }

    /// The recorder as [`std::any::Any`], so the tracer that made it can find its own type
    /// behind the trait object when the queue submits the command buffer (one tracing entry per
    /// submission, in the tracer). The default: not a tracer's recorder.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}
