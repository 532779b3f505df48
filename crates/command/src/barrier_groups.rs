//! [`Groups`]: the shape of the commands between barriers, which the recorder tracks so that
//! a programmatic dispatch is only accepted right after a barrier that closed a group of
//! exactly one dispatch.

use crate::Error;

/// The shape of the commands recorded since the last barriers, for programmatic dispatches:
/// one may only follow a barrier that closed a group of exactly one dispatch.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Groups {
    /// Commands recorded since the last barrier.
    current: u32,
    /// The current group is exactly one dispatch.
    current_is_one_dispatch: bool,
    /// The group the last barrier closed was exactly one dispatch, with nothing (no tracing
    /// zone edge) recorded after it.
    previous_is_one_dispatch: bool,
}

impl Groups {
    pub(crate) fn command(&mut self, dispatch: bool) {
        self.current += 1;
        self.current_is_one_dispatch = self.current == 1 && dispatch;
    }

    pub(crate) fn barrier(&mut self) {
        if self.current > 0 {
            self.previous_is_one_dispatch = self.current_is_one_dispatch;
            self.current = 0;
            self.current_is_one_dispatch = false;
        }
    }

    /// A tracing zone edge: a serialization point between whatever came before and after.
    pub(crate) fn zone_edge(&mut self) {
        self.barrier();
        self.previous_is_one_dispatch = false;
    }

    pub(crate) fn check_programmatic(&self) -> Result<(), Error> {
        if self.current > 0 {
            return Err(Error::NoProgrammaticPredecessor {
                reason: "it must be the first command after a barrier",
            });
        }
        if !self.previous_is_one_dispatch {
            return Err(Error::NoProgrammaticPredecessor {
                reason: "the group before the barrier must be exactly one dispatch",
            });
        }
        Ok(())
    }
}
