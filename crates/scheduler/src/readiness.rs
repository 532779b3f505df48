//! Readiness of an action's waits (docs/architecture.md, "The life of a submission", step 2).
//!
//! Per wait `(semaphore, value)`: reached, drop it; a device signal for a value at least as high is
//! recorded, wait on the device; otherwise the action stays pending on that semaphore. A wait
//! never moves backwards (a device-waitable value becomes reached, or the semaphore fails), so
//! waits before the first pending one need not be looked at again until the action is issued.

use cuhal_semaphore::{DeviceEvent, Error as SemaphoreError, Failure, Semaphore, WaitPoint};

use crate::action::{EventList, SemaphoreList};

/// What the waits from some index on need.
pub(crate) enum Readiness {
    /// Every wait is reached or device-waitable.
    Ready,
    /// The wait at this index is neither reached nor device-waitable.
    Blocked(usize),
    /// A wait semaphore failed.
    Failed(Failure),
}

/// Where an examination that precedes an issue collects the events to wait on: each
/// device-waitable wait's event that `ordered` (the backend's [`orders`](crate::Backend::orders))
/// does not accept.
pub(crate) struct Collect<'a, E> {
    pub(crate) events: &'a mut EventList<E>,
    pub(crate) ordered: &'a dyn Fn(&E) -> bool,
}

/// Examines `waits[from..]`. With `device_waits`, collects the event of every device-waitable wait
/// that `ordered` (the backend's [`orders`](crate::Backend::orders)) does not accept (the caller
/// is about to issue; then `from` is 0); without, any recorded device signal will do and no
/// event is collected.
pub(crate) fn examine<E: DeviceEvent>(
    waits: &SemaphoreList<E>,
    from: usize,
    device_waits: Option<Collect<'_, E>>,
) -> Readiness {
    examine_borrowed(waits.iter().map(|(s, v)| (s, *v)), from, device_waits)
}

/// [`examine`] over borrowed waits: the submission's own list, before any of it is cloned (an
/// action issued at once never needs its wait semaphores again).
pub(crate) fn examine_borrowed<'a, E: DeviceEvent + 'a>(
    waits: impl Iterator<Item = (&'a Semaphore<E>, u64)>,
    from: usize,
    mut device_waits: Option<Collect<'_, E>>,
) -> Readiness {
    for (index, (semaphore, value)) in waits.enumerate().skip(from) {
        let point = match device_waits.as_ref() {
            Some(collect) => semaphore.wait_point_ordered(value, collect.ordered),
            None => semaphore.wait_point_ordered(value, |_| true),
        };
        match point {
            Ok(WaitPoint::Reached) => {}
            Ok(WaitPoint::Device { event, .. }) => {
                if let Some(collect) = device_waits.as_mut() {
                    collect.events.push(event);
                }
            }
            Ok(WaitPoint::Pending) => return Readiness::Blocked(index),
            Err(SemaphoreError::Failed(failure)) => return Readiness::Failed(failure),
            Err(other) => return Readiness::Failed(Failure::new(other)),
        }
    }
    Readiness::Ready
}
