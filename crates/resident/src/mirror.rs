//! The host's mirror of the device-visible values, both ways.
//!
//! Device to host ([`Shared::retire`]): the completion words are read in sequence order; each
//! finished submission's signal semaphores advance (or fail, with the launch's failure, the
//! failed wait's, or the shutdown's), its executable is released, and submitters waiting for
//! room wake. On the device a host completion thread polls the words; the CPU model calls it
//! from the scheduler thread.
//!
//! Host to device ([`SlotListener`]): a wait on a semaphore that a host thread or a normal queue
//! signals is pushed into its slot when the value is reached (a listener on the semaphore), and
//! the doorbell rings so that a scheduler that went idle looks again.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use cuhal_semaphore::{DeviceEvent, Failure, Listener, Semaphore, SemaphoreId};

use crate::engine::Engine;
use crate::error::Error;
use crate::memory::SharedMemory;
use crate::shared::{Retained, Shared, lock};
use crate::slots::{Completion, SlotTable};

impl<E: DeviceEvent> Shared<E> {
    /// Retires every submission whose completion word is written, in order.
    pub(crate) fn retire(&self) {
        let capacity = self.options.capacity as u64;
        let completions = self.memory.completions();
        self.retained.retire(
            |front| {
                let word =
                    completions[(front.sequence % capacity) as usize].load(Ordering::Acquire);
                // Read on every look: a `retire_as` on another thread leaves it to this one.
                Completion::decode(word, front.sequence).or(self.unwritten.get().copied())
            },
            |batch| {
                let Some(last) = batch.last().map(|(entry, _)| entry.sequence) else {
                    return;
                };
                for (entry, completion) in batch.drain(..) {
                    self.finish(&entry, completion);
                    self.counters.retained.fetch_sub(1, Ordering::Relaxed);
                }
                // `fetch_max`, not a store: two threads may retire at once (an exiting consumer
                // and its successor), and the one that popped the earlier batch may store last.
                self.retired.fetch_max(last + 1, Ordering::AcqRel);
                self.notify_room();
            },
        );
    }

    /// Retires every submission, those without a completion word as `completion`: no
    /// scheduler will write another word (a device lost or stopped). Whichever thread holds
    /// the retiring role applies it (the first such `completion` stays).
    pub(crate) fn retire_as(&self, completion: Completion) {
        let _ = self.unwritten.set(completion);
        self.retire();
    }

    /// Advances or fails one retired submission's signals.
    fn finish(&self, entry: &Retained<E>, completion: Completion) {
        let failure = match completion {
            Completion::Done => {
                // The model counts its launches as it makes them; a device's are counted here.
                if matches!(self.engine, Engine::Device(_)) {
                    self.counters.launched.fetch_add(1, Ordering::Relaxed);
                }
                for (semaphore, value) in &entry.signals {
                    // An error here is the semaphore's own failure (already failed): nothing to do.
                    let _ = semaphore.advance_to(*value);
                }
                return;
            }
            Completion::LaunchFailed => match &self.engine {
                Engine::Model(_) => {
                    let mut failures = lock(&self.launch_failures);
                    let found = failures.iter().position(|(s, _)| *s == entry.sequence);
                    found.map(|index| failures.swap_remove(index).1)
                }
                Engine::Device(scheduler) => scheduler.launch_failure(entry.sequence),
            },
            Completion::WaitFailed => entry.waits.iter().find_map(Semaphore::failure),
            Completion::Shutdown => {
                self.counters
                    .failed_at_shutdown
                    .fetch_add(1, Ordering::Relaxed);
                Some(Failure::new(Error::ShutdownBeforeReady {
                    sequence: entry.sequence,
                }))
            }
            Completion::Lost => self.lost.get().cloned(),
        };
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        let failure = failure.unwrap_or_else(|| {
            Failure::new(Error::WaitFailed {
                sequence: entry.sequence,
            })
        });
        for (semaphore, _) in &entry.signals {
            semaphore.fail(failure.clone());
        }
    }

    /// Marks the queue lost (the first failure wins): every slot fails, every bound semaphore
    /// fails (waking each waiter with the failure), and submitters waiting for room wake.
    /// Submissions still in the ring are finished as lost by the consumer.
    pub(crate) fn lose(&self, failure: Failure) {
        if self.lost.set(failure.clone()).is_err() {
            return;
        }
        for slot in self.memory.slots() {
            SlotTable::fail(slot);
        }
        let semaphores: Vec<Semaphore<E>> = lock(&self.bound).semaphores.clone();
        for semaphore in semaphores {
            semaphore.fail(failure.clone());
        }
        self.notify_room();
    }

    /// Pushes `semaphore`'s host value into `slot` for a wait on `value`; when the value is not
    /// reached yet, makes sure a listener will push it.
    pub(crate) fn push_wait(
        self: &Arc<Self>,
        semaphore: &Semaphore<E>,
        slot: u32,
        value: u64,
        listener: &Arc<dyn Listener<E>>,
    ) {
        self.gates[slot as usize].push(
            self.slot(slot),
            semaphore,
            value,
            listener,
            u64::from(slot),
        );
    }

    /// The listener fired for `slot`: push the value, listen again if a wait wants more.
    fn on_slot_notice(self: &Arc<Self>, slot: u32, listener: &Arc<dyn Listener<E>>) {
        let Some(semaphore) = lock(&self.bound).semaphores.get(slot as usize).cloned() else {
            return;
        };
        self.gates[slot as usize].notice(self.slot(slot), &semaphore, listener, u64::from(slot));
        // A failed model start leaves the doorbell free: the next submission or notice retries.
        // A failed device ring loses the queue, which fails every waiter.
        let _ = self.wake();
    }
}

/// The listener that pushes host values into slots (key: the slot).
pub(crate) struct SlotListener<E: DeviceEvent> {
    pub(crate) shared: Weak<Shared<E>>,
    pub(crate) this: Weak<SlotListener<E>>,
}

impl<E: DeviceEvent> Listener<E> for SlotListener<E> {
    fn notify(&self, _semaphore: SemaphoreId, key: u64) {
        let (Some(shared), Some(this)) = (self.shared.upgrade(), self.this.upgrade()) else {
            return;
        };
        let listener: Arc<dyn Listener<E>> = this;
        if let Ok(slot) = u32::try_from(key) {
            shared.on_slot_notice(slot, &listener);
        }
    }
}
