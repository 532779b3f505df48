//! The command buffers' side of the contract: verbosity and the zone-recorder hook.
//!
//! `cuhal-command` owns these (its `trace_hook` module); until it publishes them they are
//! mirrored here, word for word, and replaced by a re-export when it does.

use cuhal_sys::CUevent;

/// How much a queue traces. Chosen per queue at creation.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Verbosity {
    /// Nothing is recorded.
    #[default]
    Off,
    /// Submissions, command buffers and debug groups.
    Coarse,
    /// Also every dispatch, fill and copy.
    Fine,
}

/// A command buffer's list of timing zones, supplied by a tracer. One per command buffer.
pub trait ZoneRecorder: Send + Sync {
    /// The verbosity the command buffer should record at.
    fn verbosity(&self) -> Verbosity;
    /// Opens a zone; returns the event to record where it begins, or `None` if dropped.
    fn begin_zone(&self, name: &str) -> Option<CUevent>;
    /// Closes the innermost open zone; same contract for the returned event.
    fn end_zone(&self) -> Option<CUevent>;
    /// Called when a submission containing this list is issued; returns the collector to run on
    /// the completion thread after it completes.
    fn on_submit(&self) -> Option<Box<dyn FnOnce() + Send>>;
}
