//! The command buffers' side of the contract: verbosity and the zone-recorder hook.
//!
//! `cuhal-command` owns these (its `trace_hook` module) so it never depends on a tracer; this
//! crate implements [`ZoneRecorder`] with [`crate::ZoneList`].

pub use cuhal_command::{Verbosity, ZoneInfo, ZoneRecorder};
