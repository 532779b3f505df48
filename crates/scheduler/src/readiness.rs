//! Readiness of an action's waits (docs/architecture.md, "The life of a submission", step 5).
//!
//! Per wait `(semaphore, value)`: reached, drop it; a device signal for a value at least as high is
//! recorded, wait on the device; otherwise the action stays pending on that semaphore. A wait
//! never moves backwards (a device-waitable value becomes reached, or the semaphore fails), so
//! waits before the first pending one need not be looked at again until the action is issued.
//!
//! The wait whose semaphore fired the action's listener is answered by the notification where it
//! can ([`Hint`]): the semaphore said what it did (reached a value, or recorded a device signal and
//! handed over its event), so the look at it (its lock and a search of its timepoints) is
//! skipped. A chain's next step, made ready by the step before it recording its signal, is issued
//! that way.

use cuhal_semaphore::{
    DeviceEvent, Error as SemaphoreError, Failure, Notice, Semaphore, SemaphoreId, WaitPoint,
};

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

/// What a semaphore's notification said it did (see [`Notice`]), kept with the notified key until
/// the action it names is looked at: the point a look would find for a wait up to `value`.
pub(crate) struct Hint<E> {
    semaphore: SemaphoreId,
    /// The value reached, or the recorded device signal's.
    value: u64,
    /// `Reached`, or `Device` on the recorded signal's event.
    point: WaitPoint<E>,
}

impl<E: DeviceEvent> Hint<E> {
    /// The hint a notice gives, if any: none for a bare change, nor for a recorded signal whose
    /// event an earlier listener took.
    #[inline]
    pub(crate) fn from_notice(semaphore: SemaphoreId, notice: Notice<'_, E>) -> Option<Self> {
        let (value, point) = match notice {
            Notice::Reached(value) => (value, WaitPoint::Reached),
            Notice::Recorded { value, event } => {
                let event = event.take()?;
                (value, WaitPoint::Device { value, event })
            }
            Notice::Changed => return None,
        };
        Some(Hint {
            semaphore,
            value,
            point,
        })
    }

    /// What the wait for `value` on `semaphore` needs, if this hint answers for it: it came from
    /// that semaphore, for `value` or higher, and the semaphore has not failed since (a failure
    /// must fail the action, as a look would find). `None`: look at the semaphore.
    #[inline]
    pub(crate) fn point_for(self, semaphore: &Semaphore<E>, value: u64) -> Option<WaitPoint<E>> {
        (self.semaphore == semaphore.id() && self.value >= value && !semaphore.has_failed())
            .then_some(self.point)
    }
}

/// Examines `waits[from..]`. With `device_waits`, collects the event of every device-waitable wait
/// that `ordered` (the backend's [`orders`](crate::Backend::orders)) does not accept (the caller
/// is about to issue; then `from` is 0); without, any recorded device signal will do and no
/// event is collected.
///
/// The wait at `skip`, if any, is not looked at: a [`Hint`] answered for it (and its event, if
/// it needs one, is collected already).
pub(crate) fn examine<E: DeviceEvent>(
    waits: &SemaphoreList<E>,
    from: usize,
    device_waits: Option<Collect<'_, E>>,
    skip: Option<usize>,
) -> Readiness {
    // Nothing left to look at (a chain's step, whose one wait the hint answered).
    if from + usize::from(skip == Some(from)) >= waits.len() {
        return Readiness::Ready;
    }
    examine_borrowed(waits.iter().map(|(s, v)| (s, *v)), from, device_waits, skip)
}

/// [`examine`] over borrowed waits: the submission's own list, before any of it is cloned (an
/// action issued at once never needs its wait semaphores again).
pub(crate) fn examine_borrowed<'a, E: DeviceEvent + 'a>(
    waits: impl Iterator<Item = (&'a Semaphore<E>, u64)>,
    from: usize,
    mut device_waits: Option<Collect<'_, E>>,
    skip: Option<usize>,
) -> Readiness {
    for (index, (semaphore, value)) in waits.enumerate().skip(from) {
        if skip == Some(index) {
            continue;
        }
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

#[cfg(test)]
mod tests {
    use cuhal_semaphore::testing::FlagEvent;
    use cuhal_semaphore::{Failure, Notice, Semaphore, WaitPoint};

    use super::Hint;

    /// A hint answers only for a wait on the semaphore it came from, for a value it covers, while
    /// that semaphore has not failed; otherwise the wait is looked at (`None`).
    #[test]
    fn a_hint_answers_only_for_its_own_semaphore_while_it_has_not_failed() {
        let (s, other) = (Semaphore::<FlagEvent>::new(0), Semaphore::new(0));
        let event = FlagEvent::new();
        let recorded = || {
            let mut handed_over = Some(event.clone());
            let notice = Notice::Recorded {
                value: 5,
                event: &mut handed_over,
            };
            Hint::from_notice(s.id(), notice).expect("a recorded signal's hint")
        };
        let reached = |value| Hint::from_notice(s.id(), Notice::Reached(value)).unwrap();
        match recorded().point_for(&s, 5) {
            Some(WaitPoint::Device { value: 5, event: e }) => assert!(e.ptr_eq(&event)),
            _ => panic!("a recorded signal at the waited value answers with its event"),
        }
        assert!(
            recorded().point_for(&s, 3).is_some(),
            "below the recorded value"
        );
        assert!(
            recorded().point_for(&s, 6).is_none(),
            "above the recorded value"
        );
        assert!(
            recorded().point_for(&other, 5).is_none(),
            "another semaphore"
        );
        assert!(matches!(
            reached(4).point_for(&s, 4),
            Some(WaitPoint::Reached)
        ));
        assert!(reached(4).point_for(&s, 5).is_none());
        assert!(Hint::<FlagEvent>::from_notice(s.id(), Notice::Changed).is_none());
        s.fail(Failure::msg("failed since the notice"));
        assert!(recorded().point_for(&s, 5).is_none(), "failed since");
        assert!(reached(4).point_for(&s, 4).is_none());
    }
}
