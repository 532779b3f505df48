//! The body slots an action travels in, recycled between the issue side and the completion side.

use std::sync::PoisonError;

use cuhal_semaphore::Semaphore;

use crate::action::{Boxed, SlotCleanups, SlotResources, Spare, Spares};
use crate::backend::Backend;
use crate::shared::Shared;
use crate::state::State;

impl<B: Backend> Shared<B> {
    /// A recycled slot (one of the issue side's spares, else, taking every slot the completion
    /// side gave back since, a returned one, else one more put in rotation) with an action
    /// written into it: its signals (cloned handles), then what `fill` adds to the slot's
    /// (empty) resources and cleanups, and the payload it returns; its waits are added only if
    /// it goes pending ([`Boxed::own_waits`]). The rotation grows by as many slots as it holds
    /// already, taken from the reserve made at start, else made new: a queue whose in-flight
    /// count grows past its capacity allocates a logarithmic number of times, as a growing
    /// vector would.
    #[inline]
    pub(crate) fn fill_slot(
        &self,
        state: &mut State<B>,
        signals: &[(&Semaphore<B::Event>, u64)],
        fill: impl FnOnce(&mut SlotResources, &mut SlotCleanups) -> B::Payload,
    ) -> Boxed<B> {
        if state.spare.is_empty() {
            let mut returned = self.returned.lock().unwrap_or_else(PoisonError::into_inner);
            std::mem::swap(&mut state.spare, &mut *returned);
            if state.spare.is_empty() {
                // Doubling, but never past the reserve while it lasts: a capacity that is not a
                // power of two would otherwise make new slots (and grow both lists) for a
                // backlog within it.
                let mut more = Spares::<B>::grown(state.boxes) - state.boxes;
                let reserve = &mut state.reserve;
                if !reserve.is_empty() {
                    more = more.min(reserve.len());
                }
                state.boxes += more;
                // Every slot in rotation may be in either list at once: room for all of them
                // (within the capacity made at start, this allocates nothing).
                returned.reserve_total(state.boxes);
                state.spare.reserve_total(state.boxes);
                state
                    .spare
                    .refill(more, || Some(reserve.pop().unwrap_or_else(Spare::new)));
            }
        }
        // Refilled above when it was empty; the next one is warmed for the next submission.
        let Spare(mut slot) = state.spare.pop_warm(Spare::body).unwrap_or_else(Spare::new);
        let body = &mut *slot;
        for (semaphore, value) in signals {
            body.signals.push(((*semaphore).clone(), *value));
        }
        body.payload = Some(fill(&mut body.resources, &mut body.cleanups));
        Boxed(slot)
    }

    /// Gives the body slots a batch emptied back to the issue side (`spares` is left empty, its
    /// capacity kept).
    pub(crate) fn give_back(&self, spares: &mut Vec<Spare<B>>) {
        if !spares.is_empty() {
            self.returned
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .append(spares);
        }
    }
}
