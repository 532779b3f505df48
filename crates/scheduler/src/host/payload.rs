//! [`HostPayload`]: the work of a host-backend action.

use std::fmt;
use std::sync::Arc;

use cuhal_semaphore::Failure;

/// What a host-backend action runs on its queue's executor thread. An `Err` (or a panic) is a
/// device error: it fails the action and loses the queue.
pub enum HostPayload {
    /// Nothing: the action only orders semaphores.
    Nop,
    /// A plain function with a word of data. Allocates nothing.
    Call(fn(u64) -> Result<(), Failure>, u64),
    /// A shared closure; cloning the `Arc` per action allocates nothing.
    Shared(Arc<dyn Fn() -> Result<(), Failure> + Send + Sync>),
    /// A one-shot closure (boxing allocates).
    Once(Box<dyn FnOnce() -> Result<(), Failure> + Send>),
}

impl HostPayload {
    /// A function called with `data`.
    pub fn call(function: fn(u64) -> Result<(), Failure>, data: u64) -> Self {
        HostPayload::Call(function, data)
    }

    /// A one-shot closure.
    pub fn once(work: impl FnOnce() -> Result<(), Failure> + Send + 'static) -> Self {
        HostPayload::Once(Box::new(work))
    }

    /// A shared closure.
    pub fn shared(work: &Arc<dyn Fn() -> Result<(), Failure> + Send + Sync>) -> Self {
        HostPayload::Shared(work.clone())
    }

    pub(crate) fn run(self) -> Result<(), Failure> {
        match self {
            HostPayload::Nop => Ok(()),
            HostPayload::Call(function, data) => function(data),
            HostPayload::Shared(work) => work(),
            HostPayload::Once(work) => work(),
        }
    }
}

impl fmt::Debug for HostPayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HostPayload::Nop => "HostPayload::Nop",
            HostPayload::Call(..) => "HostPayload::Call",
            HostPayload::Shared(_) => "HostPayload::Shared",
            HostPayload::Once(_) => "HostPayload::Once",
        })
    }
}
