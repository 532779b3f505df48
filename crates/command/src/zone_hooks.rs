//! [`ZoneHooks`]: the tracer attached to a command buffer, as the recorder asks it for zone
//! events (coarse zones at debug groups and around a whole stream command buffer, a
//! [`CommandZone`] around each command at FINE verbosity). The tracer itself is the
//! [`ZoneRecorder`](crate::ZoneRecorder) of `trace_hook`; encoders record the events.

use std::sync::Arc;

use cuhal_sys::{CUevent, CUgraphNode};

use crate::{EventPlacement, Verbosity, ZoneRecorder};

/// The tracing events around one command (FINE verbosity).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CommandZone {
    pub(crate) begin: Option<CUevent>,
    pub(crate) end: Option<CUevent>,
    /// Timed from activity records: no events, and the tracer wants the command's graph node.
    pub(crate) by_activity: bool,
}

/// The tracer attached to a command buffer, with its verbosity read once.
pub(crate) struct ZoneHooks {
    recorder: Option<Arc<dyn ZoneRecorder>>,
    pub(crate) verbosity: Verbosity,
}

impl ZoneHooks {
    pub(crate) fn new(recorder: Option<Arc<dyn ZoneRecorder>>) -> Self {
        let verbosity = recorder.as_ref().map_or(Verbosity::Off, |r| r.verbosity());
        Self {
            recorder,
            verbosity,
        }
    }

    /// Takes the tracer out, leaving tracing off.
    pub(crate) fn take(&mut self) -> Option<Arc<dyn ZoneRecorder>> {
        self.verbosity = Verbosity::Off;
        self.recorder.take()
    }

    /// Opens a coarse zone if tracing is on: `Some(event)` to record.
    pub(crate) fn begin_coarse(&self, name: &str) -> Option<CUevent> {
        match &self.recorder {
            Some(r) if self.verbosity >= Verbosity::Coarse => r.begin_zone(name),
            _ => None,
        }
    }

    pub(crate) fn end_coarse(&self) -> Option<CUevent> {
        match &self.recorder {
            Some(r) if self.verbosity >= Verbosity::Coarse => r.end_zone(),
            _ => None,
        }
    }

    /// Opens and closes the zone of one command at FINE verbosity. Both events are taken
    /// before the command is encoded; the encoder records them around it, at `placement`.
    /// `activity`: the kind may be timed from activity records instead.
    pub(crate) fn command(
        &self,
        name: &str,
        activity: bool,
        placement: EventPlacement,
    ) -> CommandZone {
        match &self.recorder {
            Some(r) if self.verbosity >= Verbosity::Fine => {
                let timing = if activity {
                    r.command_zone(name, placement)
                } else {
                    r.command_events(name, placement)
                };
                CommandZone {
                    begin: timing.begin,
                    end: timing.end,
                    by_activity: timing.by_activity,
                }
            }
            _ => CommandZone::default(),
        }
    }

    /// Opens and closes the stamped zone of a dispatch at FINE verbosity: its stamp index, or
    /// `None` when the tracer takes no stamps (or tracing is not FINE).
    pub(crate) fn stamp(&self, name: &str) -> Option<u32> {
        match &self.recorder {
            Some(r) if self.verbosity >= Verbosity::Fine => r.stamp_zone(name),
            _ => None,
        }
    }

    /// Tells the tracer which graph node an activity-timed command became.
    pub(crate) fn command_node(&self, zone: CommandZone, node: Option<CUgraphNode>) {
        if let (true, Some(r), Some(node)) = (zone.by_activity, &self.recorder, node) {
            // SAFETY: the encoder just added `node` to its graph, which lives as long as the
            // command buffer.
            unsafe { r.command_node(node) };
        }
    }
}
