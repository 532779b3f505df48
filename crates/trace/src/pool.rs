//! The pool of timing events a tracing context hands to its zones.
//!
//! Events are created on demand, `grow_by` at a time, up to a cap. A zone takes its begin and end
//! events together, so a zone is either fully timed or dropped: when the pool is at its cap and
//! empty, [`TimingEventPool::acquire_pair`] answers `None` and the caller counts a dropped zone (IREE
//! dereferenced the empty free list). Events come back when the list that took them is dropped,
//! which is after every submission that could still record them has been collected.

use std::sync::{Arc, Mutex};

use cuhal_sys::CUevent;

use crate::backend::EventBackend;
use crate::lock::lock;

/// A timing event owned by the pool.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ev(pub(crate) CUevent);

// SAFETY: a CUevent is a driver handle usable from any thread; the pool decides who owns it.
unsafe impl Send for Ev {}
// SAFETY: as above; the handle is only copied and passed to the driver.
unsafe impl Sync for Ev {}

/// Sizes of an [`TimingEventPool`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PoolLimits {
    /// Events created with the pool.
    pub initial: usize,
    /// Events created each time the free list runs dry, while under `max`.
    pub grow_by: usize,
    /// The most events the pool ever creates; beyond it zones are dropped and counted.
    pub max: usize,
}

impl Default for PoolLimits {
    fn default() -> Self {
        Self {
            initial: 64,
            grow_by: 256,
            max: 32_768,
        }
    }
}

struct PoolState {
    free: Vec<Ev>,
    created: usize,
    /// Lowered to `created` when the driver refuses to create an event, so a failing driver is
    /// not asked again on every zone.
    cap: usize,
    create_failures: u64,
}

/// Counts describing a pool, for statistics.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolCounts {
    /// Events created so far (all alive until the pool goes).
    pub created: usize,
    /// Events on the free list.
    pub free: usize,
    /// Times the driver refused to create an event.
    pub create_failures: u64,
}

/// A free list of timing events over an [`EventBackend`].
pub struct TimingEventPool {
    backend: Arc<dyn EventBackend>,
    limits: PoolLimits,
    state: Mutex<PoolState>,
}

impl TimingEventPool {
    /// A pool with `limits.initial` events created now (never more than `limits.max`).
    pub(crate) fn new(backend: Arc<dyn EventBackend>, limits: PoolLimits) -> Self {
        let pool = Self {
            backend,
            limits,
            state: Mutex::new(PoolState {
                free: Vec::with_capacity(limits.initial.min(limits.max)),
                created: 0,
                cap: limits.max,
                create_failures: 0,
            }),
        };
        {
            let mut state = lock(&pool.state);
            pool.grow(&mut state, limits.initial);
        }
        pool
    }

    /// Creates up to `count` events (within the cap) onto the free list.
    fn grow(&self, state: &mut PoolState, count: usize) {
        let count = count.min(state.cap.saturating_sub(state.created));
        if count == 0 {
            return;
        }
        let Ok(_bound) = self.backend.enter() else {
            state.create_failures += 1;
            state.cap = state.created;
            return;
        };
        state.free.reserve(count);
        for _ in 0..count {
            match self.backend.create_event() {
                Ok(event) => {
                    state.free.push(Ev(event));
                    state.created += 1;
                }
                Err(_) => {
                    state.create_failures += 1;
                    state.cap = state.created;
                    return;
                }
            }
        }
    }

    /// Takes two events (a zone's begin and end), growing the pool if needed; `None` when the
    /// pool is at its cap with fewer than two free.
    pub(crate) fn acquire_pair(&self) -> Option<(Ev, Ev)> {
        let mut state = lock(&self.state);
        if state.free.len() < 2 {
            let want = self.limits.grow_by.max(2);
            self.grow(&mut state, want);
            if state.free.len() < 2 {
                return None;
            }
        }
        let a = state.free.pop()?;
        let b = state.free.pop()?;
        Some((a, b))
    }

    /// Takes one event, growing the pool if needed; `None` when the pool is at its cap with
    /// none free.
    pub(crate) fn acquire_one(&self) -> Option<Ev> {
        let mut state = lock(&self.state);
        if state.free.is_empty() {
            let want = self.limits.grow_by.max(1);
            self.grow(&mut state, want);
        }
        state.free.pop()
    }

    /// Puts events back on the free list.
    pub(crate) fn release(&self, events: &[Ev]) {
        if events.is_empty() {
            return;
        }
        lock(&self.state).free.extend_from_slice(events);
    }

    /// The pool's counts now.
    pub fn counts(&self) -> PoolCounts {
        let state = lock(&self.state);
        PoolCounts {
            created: state.created,
            free: state.free.len(),
            create_failures: state.create_failures,
        }
    }

    /// The pool's limits.
    pub fn limits(&self) -> PoolLimits {
        self.limits
    }
}

impl Drop for TimingEventPool {
    fn drop(&mut self) {
        let state = self
            .state
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Every list holds the context (and so this pool) alive, so all events are free here.
        debug_assert_eq!(
            state.free.len(),
            state.created,
            "timing events still in use"
        );
        if state.free.is_empty() {
            return;
        }
        let Ok(_bound) = self.backend.enter() else {
            return;
        };
        for ev in state.free.drain(..) {
            // SAFETY: the pool created every event on its free list with this backend, and
            // destroys each once; no list holds one any more.
            unsafe { self.backend.destroy_event(ev.0) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeGpu;

    fn pool(fake: &Arc<FakeGpu>, initial: usize, grow_by: usize, max: usize) -> TimingEventPool {
        TimingEventPool::new(
            fake.clone(),
            PoolLimits {
                initial,
                grow_by,
                max,
            },
        )
    }

    #[test]
    fn grows_on_demand_up_to_the_cap_then_refuses() {
        let fake = FakeGpu::new();
        let p = pool(&fake, 4, 3, 9);
        assert_eq!(fake.live_events(), 4);
        let mut taken = Vec::new();
        while let Some((a, b)) = p.acquire_pair() {
            taken.push(a);
            taken.push(b);
        }
        // 9 events: four pairs, one left over that cannot make a pair.
        assert_eq!(taken.len(), 8);
        assert_eq!(
            p.counts(),
            PoolCounts {
                created: 9,
                free: 1,
                create_failures: 0
            }
        );
        assert_eq!(fake.live_events(), 9);
        let mut sorted: Vec<usize> = taken.iter().map(|e| e.0 as usize).collect();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 8, "an event was handed out twice");

        p.release(&taken[..2]);
        assert!(p.acquire_pair().is_some());
        assert!(p.acquire_pair().is_none());
        p.release(&taken);
        drop(p);
        assert_eq!(fake.live_events(), 0, "the pool destroys its events");
    }

    #[test]
    fn a_driver_refusal_caps_the_pool_instead_of_failing() {
        let fake = FakeGpu::new();
        fake.fail_creates_after(5);
        let p = pool(&fake, 2, 8, 100);
        let mut taken = Vec::new();
        while let Some((a, b)) = p.acquire_pair() {
            taken.extend([a, b]);
        }
        let counts = p.counts();
        assert_eq!(counts.created, 5);
        assert_eq!(counts.create_failures, 1);
        assert_eq!(taken.len(), 4);
        let creates = fake.creates();
        // Once refused, the pool does not ask again.
        assert!(p.acquire_pair().is_none());
        assert_eq!(fake.creates(), creates);
        p.release(&taken);
    }

    #[test]
    fn a_pool_of_zero_drops_everything() {
        let fake = FakeGpu::new();
        let p = pool(&fake, 0, 16, 0);
        assert!(p.acquire_pair().is_none());
        assert_eq!(fake.creates(), 0);
    }
}
