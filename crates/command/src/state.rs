//! [`CommandBufferState`]: where a command buffer is in its life. The recorder moves it from
//! recording to ended or failed; errors name it (`Error::InvalidState`), so it depends on
//! nothing else of the crate.

use std::fmt;

/// Where a command buffer is in its life.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum CommandBufferState {
    /// Commands may be recorded (from creation until `end()`).
    Recording,
    /// `end()` succeeded: it may be issued.
    Ended,
    /// A driver call failed while recording or ending; it can be neither recorded nor issued.
    Failed,
}

impl fmt::Display for CommandBufferState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CommandBufferState::Recording => "recording",
            CommandBufferState::Ended => "ended",
            CommandBufferState::Failed => "failed",
        })
    }
}
