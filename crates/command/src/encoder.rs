//! [`Encoder`]: what each command buffer kind supplies to the shared
//! [`Recorder`](crate::recorder::Recorder): it turns commands the recorder has checked into
//! graph nodes, stream calls or arena entries, with the zone events
//! ([`CommandZone`]) the recorder's zone hooks took around each.

use std::sync::Arc;

use cuhal_sys::{CUevent, CUgraphNode};

use crate::binding::Operand;
use crate::indirect::{Indirect, IndirectLaunch};
use crate::launch::AttributePath;
use crate::zone_hooks::CommandZone;
use crate::{Dispatch, Error, EventPlacement, FillPattern, StreamWorkFn};

/// What a command buffer kind does with checked commands. Operands are addresses, or slots
/// (only in command buffers with a binding capacity) bound at each submission.
pub(crate) trait Encoder {
    /// How this kind passes launch attributes to the driver.
    const ATTRIBUTE_PATH: AttributePath;
    /// Whether stream work may name slot ranges: kinds that call the closure at each
    /// submission (deferred) or capture it again when a binding it names changes (graph).
    const BINDS_STREAM_WORK: bool;
    /// Whether a tracer may time this kind's commands from activity records (no events): only
    /// kinds a queue issues, where the launches of an issue are captured.
    const ACTIVITY_TIMING: bool = true;
    /// Where this kind records a command's FINE zone events: a queue's stream (the stream kind
    /// as recorded, the deferred kind at replay) or event-record nodes of a graph.
    const EVENT_PLACEMENT: EventPlacement = EventPlacement::Stream;

    fn fill(
        &mut self,
        target: Operand,
        length: usize,
        pattern: FillPattern,
        zone: CommandZone,
    ) -> Result<(), Error>;
    fn update(&mut self, target: Operand, data: &[u8], zone: CommandZone) -> Result<(), Error>;
    fn copy(
        &mut self,
        source: Operand,
        target: Operand,
        length: usize,
        zone: CommandZone,
    ) -> Result<(), Error>;
    fn dispatch(&mut self, dispatch: &Dispatch<'_>, zone: CommandZone) -> Result<(), Error>;
    /// An indirect dispatch: the fragment of [`crate::indirect::add_fragment`], in command order.
    fn dispatch_indirect(
        &mut self,
        launch: &IndirectLaunch<'_>,
        indirect: &Indirect,
        zone: CommandZone,
    ) -> Result<(), Error>;
    fn barrier(&mut self) -> Result<(), Error>;
    /// Records stream work over `ranges` (checked, retained by the recorder). An
    /// [`Error::Capture`] or [`Error::CaptureUnsupported`] means nothing was recorded (the
    /// encoder undid what it had started); any other error leaves the command buffer failed.
    fn stream_work(
        &mut self,
        ranges: &[(Operand, usize)],
        work: &Arc<StreamWorkFn>,
    ) -> Result<(), Error>;
    /// Records a coarse zone edge (command buffer or debug group begin/end). Everything before
    /// it happens before it, everything after it happens after it.
    fn zone_event(&mut self, event: CUevent) -> Result<(), Error>;
    /// Whether this kind binds a dispatch's zone-stamp argument per submission (graph and
    /// deferred): only then does the recorder ask the tracer for a stamp.
    const BINDS_STAMPS: bool = true;
    /// Gives the stamp bindings recorded with [`STAMP_SLOT_PENDING`](crate::binding::STAMP_SLOT_PENDING)
    /// their slot, now known (called once, right before [`Encoder::end`], when any was
    /// recorded).
    fn set_stamp_slot(&mut self, slot: u32) {
        let _ = slot;
    }
    fn end(&mut self) -> Result<(), Error>;
    /// The graph node the last command was recorded as (graph command buffers only).
    fn last_command_node(&self) -> Option<CUgraphNode> {
        None
    }
}
