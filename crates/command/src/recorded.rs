//! [`Recorded`]: what an ended command buffer keeps of its recording besides its encoder
//! (context, tracer, retained resources, indirect-dispatch state, binding layout). The
//! recorder hands it over at `end()`; [`CommandBuffer`](crate::CommandBuffer)'s methods that
//! do not issue read it.

use std::sync::Arc;

use cuhal_sys::PrimaryContext;

use crate::binding::BindingLayout;
use crate::indirect::Indirect;
use crate::retained::Retained;
use crate::{BufferRange, Error, ZoneRecorder};

/// What an ended command buffer keeps of its recording besides its encoder: its context,
/// tracer, the resources its commands use, the indirect-dispatch state and the binding layout.
/// Every kind's submittable form holds one; [`CommandBuffer`](crate::CommandBuffer)'s methods
/// that do not issue read it.
#[doc(hidden)]
pub struct Recorded {
    pub(crate) context: Option<Arc<PrimaryContext>>,
    pub(crate) zones: Option<Arc<dyn ZoneRecorder>>,
    pub(crate) retained: Retained,
    pub(crate) indirect: Option<Indirect>,
    pub(crate) layout: BindingLayout,
}

impl Recorded {
    pub(crate) fn context(&self) -> Option<&Arc<PrimaryContext>> {
        self.context.as_ref()
    }

    /// Whether a submission that completed without a driver error did what it should: an
    /// indirect dispatch whose count was out of range is reported here, once.
    pub(crate) fn check_completed(&self) -> Result<(), Error> {
        self.indirect.as_ref().map_or(Ok(()), Indirect::check)
    }

    /// Whether [`Recorded::check_completed`] can fail: an indirect dispatch was recorded.
    pub(crate) fn checks_completion(&self) -> bool {
        self.indirect.is_some()
    }

    /// Refuses a binding table shorter than the slots the commands use (and the stamp slot,
    /// for a command buffer with stamped dispatches: see [`BindingLayout::stamped_table_into`]).
    pub(crate) fn check_table_length(&self, bindings: &[BufferRange]) -> Result<(), Error> {
        let needed = self.layout.issue_table_len();
        if bindings.len() < needed {
            return Err(crate::BindingError::TableTooShort {
                given: bindings.len(),
                needed,
            }
            .into());
        }
        Ok(())
    }
}
