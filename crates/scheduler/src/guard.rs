//! Backend calls that may panic, kept from unwinding through the scheduler's threads and locks,
//! and what each answer means when the backend panicked. (`Backend::issue`, `query_event` and
//! `completed` are guarded where they are called, with the failure their callers need.)

use std::panic::{AssertUnwindSafe, catch_unwind};

use cuhal_semaphore::{DeviceEvent, Failure};

use crate::backend::Backend;
use crate::resource::Resource;

/// [`Backend::traffic`]; a panic reads as no traffic (the policy's default pace).
pub(crate) fn traffic<B: Backend>(backend: &B) -> u64 {
    catch_unwind(AssertUnwindSafe(|| backend.traffic())).unwrap_or(0)
}

/// [`Backend::orders`] (called under a semaphore's lock); a panic reads as not ordered, which
/// only makes the wait a device wait on the event.
pub(crate) fn orders<B: Backend>(backend: &B, event: &B::Event) -> bool {
    catch_unwind(AssertUnwindSafe(|| backend.orders(event))).unwrap_or(false)
}

/// [`Backend::checks_completion`], asked before the action is issued; a panic fails the issue.
pub(crate) fn checks_completion<B: Backend>(
    backend: &B,
    payload: &B::Payload,
) -> Result<bool, Failure> {
    catch_unwind(AssertUnwindSafe(|| backend.checks_completion(payload))).map_err(|_| {
        Failure::msg("the backend panicked deciding whether to check an action's completion")
    })
}

/// [`Backend::issued`], after the action was issued; a panic is the failure that loses the
/// queue (the issued action itself still completes).
pub(crate) fn issued<B: Backend>(backend: &B, resources: &[Resource]) -> Result<(), Failure> {
    catch_unwind(AssertUnwindSafe(|| backend.issued(resources)))
        .map_err(|_| Failure::msg("the backend panicked noting an issued action's resources"))
}

/// A device wait's event, queried for an upstream failure; a panic is such a failure.
pub(crate) fn query<E: DeviceEvent>(event: &E) -> Result<bool, Failure> {
    catch_unwind(AssertUnwindSafe(|| event.query()))
        .unwrap_or_else(|_| Err(Failure::msg("a device wait's event panicked when queried")))
}
