//! [`ResidentQueue`]: the host side of a queue the device scheduler drives, on the CPU model.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use cuhal_semaphore::{DeviceEvent, Failure, Listener, Semaphore};
use smallvec::SmallVec;

use crate::descriptor::{Descriptor, MAX_SIGNALS, MAX_WAITS, SlotValue};
use crate::doorbell::Doorbell;
use crate::engine::{DeviceScheduler, Engine};
use crate::error::Error;
use crate::handoff::{RetireQueue, SlotGate};
use crate::memory::{HostMemory, SharedMemory};
use crate::mirror::SlotListener;
use crate::model::Launcher;
use crate::options::ResidentOptions;
use crate::refusal::{ExecutableKind, Launchable, Refusal};
use crate::ring::split;
use crate::shared::{Bound, Counters, Memory, Retained, Shared, lock};
use crate::slots::{FAILED, SlotTable};

/// What a resident queue has done (for tests and diagnostics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResidentStats {
    /// Submissions published.
    pub submitted: u64,
    /// Submissions launched.
    pub launched: u64,
    /// Submissions whose signals failed (a failed launch or wait, shutdown, loss).
    pub failed: u64,
    /// Of those, submissions still waiting when the queue shut down.
    pub failed_at_shutdown: u64,
    /// Submissions the host has retired (read their completion words).
    pub retired: u64,
    /// Executables and semaphores held for submissions not yet retired.
    pub retained: usize,
    /// Scheduler starts (the first submission, and every one after an idle exit).
    pub starts: u64,
    /// Scheduler exits.
    pub exits: u64,
    /// Relaunches before the fire-and-forget limit.
    pub relaunches: u64,
}

/// A queue whose submissions are one descriptor written into a ring: the scheduler (here its
/// CPU model, see [`Launcher`]) resolves their waits against the slot table, launches them and
/// publishes their signals, which the host mirrors into the semaphores.
///
/// Every semaphore a submission waits on or signals must be bound first
/// ([`bind`](Self::bind)); waits on values a host thread or a normal queue signals are pushed
/// into the slots as they are reached. Dropping the queue shuts it down: submissions whose
/// waits are reached run, the others fail their signals with
/// [`Error::ShutdownBeforeReady`], the scheduler thread is joined, and everything the queue
/// held is released.
pub struct ResidentQueue<E: DeviceEvent> {
    shared: Arc<Shared<E>>,
    listener: Arc<dyn Listener<E>>,
}

impl<E: DeviceEvent> ResidentQueue<E> {
    /// A queue on the CPU model: `launcher` is called for each ready submission.
    pub fn new(options: ResidentOptions, launcher: impl Launcher) -> Result<Self, Error> {
        options.check()?;
        let memory = HostMemory::new(options.capacity, options.slots)?;
        Self::build(options, Box::new(memory), Engine::Model(Arc::new(launcher)))
    }

    /// A queue whose ring `scheduler` consumes on a device, in `memory` (which the device
    /// reads and writes: `options.capacity` descriptors and completion words, `options.slots`
    /// slots). A poller thread reads the completion words and mirrors them into the
    /// semaphores.
    pub fn with_device(
        options: ResidentOptions,
        memory: Box<dyn SharedMemory>,
        scheduler: Arc<dyn DeviceScheduler>,
    ) -> Result<Self, Error> {
        options.check()?;
        if memory.descriptors().len() != options.capacity || memory.slots().len() != options.slots {
            return Err(Error::InvalidOptions(
                "the shared memory's capacity and slots must be the options'",
            ));
        }
        let queue = Self::build(options, memory, Engine::Device(scheduler.clone()))?;
        let shared = queue.shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("{}-poller", queue.shared.options.label))
            .spawn(move || shared.run_poller(scheduler));
        match spawned {
            Ok(handle) => *lock(&queue.shared.thread) = Some(handle),
            Err(error) => return Err(Error::Spawn(error.to_string())),
        }
        Ok(queue)
    }

    fn build(options: ResidentOptions, memory: Memory, engine: Engine) -> Result<Self, Error> {
        let (producer, consumer) = split(memory)?;
        let memory = producer.shared_memory();
        let slots = options.slots;
        let shared = Arc::new(Shared {
            options,
            memory,
            producer: Mutex::new(producer),
            consumer: Mutex::new(consumer),
            doorbell: Doorbell::new(),
            bound: Mutex::new(Bound {
                by_id: HashMap::new(),
                semaphores: Vec::with_capacity(slots),
            }),
            gates: (0..slots).map(|_| SlotGate::new()).collect(),
            retained: RetireQueue::new(),
            retired: AtomicU64::new(0),
            launch_failures: Mutex::new(Vec::new()),
            room: Mutex::new(()),
            room_cv: Condvar::new(),
            room_waiters: AtomicUsize::new(0),
            lost: OnceLock::new(),
            unwritten: OnceLock::new(),
            shutdown: AtomicBool::new(false),
            engine,
            thread: Mutex::new(None),
            poller_parked: AtomicBool::new(false),
            counters: Counters::default(),
        });
        let listener: Arc<dyn Listener<E>> = Arc::new_cyclic(|this| SlotListener {
            shared: Arc::downgrade(&shared),
            this: this.clone(),
        });
        Ok(ResidentQueue { shared, listener })
    }

    /// Gives `semaphore` a slot (its current value, or failure, is written there) and returns
    /// it; a semaphore already bound keeps its slot.
    pub fn bind(&self, semaphore: &Semaphore<E>) -> Result<u32, Error> {
        let mut bound = lock(&self.shared.bound);
        if let Some(&slot) = bound.by_id.get(&semaphore.id()) {
            return Ok(slot);
        }
        if bound.semaphores.len() >= self.shared.options.slots {
            return Err(Error::NoFreeSlot {
                slots: self.shared.options.slots,
            });
        }
        let slot = bound.semaphores.len() as u32;
        let word = self.shared.slot(slot);
        match semaphore.query() {
            Ok(value) => SlotTable::publish(word, value.min(FAILED - 1)),
            Err(_) => SlotTable::fail(word),
        }
        bound.by_id.insert(semaphore.id(), slot);
        bound.semaphores.push(semaphore.clone());
        Ok(slot)
    }

    /// Submits `executable` after `waits`, signalling `signals` when it is done; waits for room
    /// when the ring is full. Returns the submission's sequence number.
    pub fn submit(
        &self,
        waits: &[(&Semaphore<E>, u64)],
        signals: &[(&Semaphore<E>, u64)],
        executable: &Arc<dyn Launchable>,
        bindings: u64,
    ) -> Result<u64, Error> {
        self.submit_inner(waits, signals, executable, bindings, true)
    }

    /// [`submit`](Self::submit), or [`Error::Full`] when the ring has no room.
    pub fn try_submit(
        &self,
        waits: &[(&Semaphore<E>, u64)],
        signals: &[(&Semaphore<E>, u64)],
        executable: &Arc<dyn Launchable>,
        bindings: u64,
    ) -> Result<u64, Error> {
        self.submit_inner(waits, signals, executable, bindings, false)
    }

    fn submit_inner(
        &self,
        waits: &[(&Semaphore<E>, u64)],
        signals: &[(&Semaphore<E>, u64)],
        executable: &Arc<dyn Launchable>,
        bindings: u64,
        wait_for_room: bool,
    ) -> Result<u64, Error> {
        self.check_open()?;
        let mut descriptor = self.describe(waits, signals, &**executable)?;
        descriptor.bindings = bindings;
        for (wait, (semaphore, value)) in descriptor.waits().iter().zip(waits) {
            if semaphore.has_failed() {
                // Every wait on a failed semaphore fails, a value reached before the failure
                // too: the slot says so, and the scheduler fails the submission's signals.
                SlotTable::fail(self.shared.slot(wait.slot));
                continue;
            }
            if SlotTable::state(self.shared.slot(wait.slot), *value)
                == crate::slots::SlotState::Pending
            {
                self.shared
                    .push_wait(semaphore, wait.slot, *value, &self.listener);
            }
        }
        let entry = || Retained {
            sequence: 0,
            _executable: executable.clone(),
            waits: waits.iter().map(|(s, _)| (*s).clone()).collect(),
            signals: signals.iter().map(|(s, v)| ((*s).clone(), *v)).collect(),
        };
        let sequence = loop {
            let mut producer = lock(&self.shared.producer);
            // Under the producer lock, so that shutdown (which sets the flag under it) sees
            // every publish that passed this check.
            self.check_open()?;
            let produced = producer.produced();
            if !self.shared.has_room(produced) {
                drop(producer);
                if !wait_for_room {
                    return Err(Error::Full {
                        capacity: self.shared.options.capacity,
                    });
                }
                self.shared.wait_for_room(produced)?;
                continue;
            }
            let mut retained = entry();
            retained.sequence = produced;
            self.shared.retained.lock().push_back(retained);
            // SeqCst: a device queue's poller, about to park, reads it after saying so.
            self.shared.counters.retained.fetch_add(1, Ordering::SeqCst);
            match producer.try_push(descriptor) {
                Ok(sequence) => break sequence,
                Err(full) => {
                    // The consumer writes a completion word only after `consumed` passed it, so
                    // `retired <= consumed` and the room test above makes this rare; undo (our
                    // entry, unless a loss retired it meanwhile) and wait or report it.
                    let mut retained = self.shared.retained.lock();
                    if retained.back().is_some_and(|e| e.sequence == produced) {
                        retained.pop_back();
                        self.shared.counters.retained.fetch_sub(1, Ordering::SeqCst);
                    }
                    drop(retained);
                    drop(producer);
                    // A loss may have retired the entry: say so rather than `Full`.
                    self.check_open()?;
                    if !wait_for_room {
                        return Err(Error::Full {
                            capacity: full.capacity,
                        });
                    }
                    std::thread::yield_now();
                    continue;
                }
            }
        };
        self.shared
            .counters
            .submitted
            .fetch_add(1, Ordering::Relaxed);
        self.shared.unpark_poller();
        self.shared.wake()?;
        Ok(sequence)
    }

    fn check_open(&self) -> Result<(), Error> {
        if let Some(failure) = self.shared.lost.get() {
            return Err(Error::Lost(failure.clone()));
        }
        if self.shared.is_shutdown() {
            return Err(Error::Shutdown);
        }
        Ok(())
    }

    /// The descriptor of a submission, or why it is refused.
    fn describe(
        &self,
        waits: &[(&Semaphore<E>, u64)],
        signals: &[(&Semaphore<E>, u64)],
        executable: &dyn Launchable,
    ) -> Result<Descriptor, Error> {
        let kind = executable.kind();
        if kind != ExecutableKind::Graph {
            return Err(Refusal::NotAGraph { kind }.into());
        }
        if let Some((index, &kind)) = executable
            .nodes()
            .iter()
            .enumerate()
            .find(|(_, kind)| !kind.device_launchable())
        {
            return Err(Refusal::NodeKind { kind, index }.into());
        }
        if waits.len() > MAX_WAITS {
            return Err(Refusal::TooManyWaits {
                count: waits.len(),
                max: MAX_WAITS,
            }
            .into());
        }
        if signals.len() > MAX_SIGNALS {
            return Err(Refusal::TooManySignals {
                count: signals.len(),
                max: MAX_SIGNALS,
            }
            .into());
        }
        let bound = lock(&self.shared.bound);
        let slot_value = |(semaphore, value): &(&Semaphore<E>, u64), role| {
            if value & FAILED != 0 {
                return Err(Refusal::ValueOutOfRange { value: *value });
            }
            match bound.by_id.get(&semaphore.id()) {
                Some(&slot) => Ok(SlotValue {
                    value: *value,
                    slot,
                    reserved: 0,
                }),
                None => Err(Refusal::UnboundSemaphore {
                    semaphore: semaphore.id(),
                    role,
                }),
            }
        };
        let mut descriptor = Descriptor {
            executable: executable.handle(),
            wait_count: waits.len() as u32,
            signal_count: signals.len() as u32,
            ..Descriptor::default()
        };
        for (entry, wait) in descriptor.waits.iter_mut().zip(waits) {
            *entry = slot_value(wait, "wait")?;
        }
        for (entry, signal) in descriptor.signals.iter_mut().zip(signals) {
            *entry = slot_value(signal, "signal")?;
            let (semaphore, value) = signal;
            let current = semaphore.value_hint();
            if *value <= current {
                return Err(Refusal::SignalNotAbove {
                    value: *value,
                    current,
                }
                .into());
            }
        }
        Ok(descriptor)
    }

    /// Marks the queue lost with `failure` (the device was lost): every bound semaphore fails,
    /// waking every waiter; submissions in the ring fail; later calls return
    /// [`Error::Lost`].
    pub fn lose(&self, failure: Failure) {
        self.shared.lose(failure);
        match &self.shared.engine {
            // The model's consumer finishes what is in the ring as lost.
            Engine::Model(_) => {
                let _ = self.shared.wake();
            }
            // The poller stops the device's scheduler (which finishes pending heads as lost),
            // then retires what it never will.
            Engine::Device(_) => self.shared.wake_poller(),
        }
    }

    /// The queue's label ([`ResidentOptions::label`]).
    pub fn label(&self) -> &str {
        &self.shared.options.label
    }

    /// The failure that lost the queue, if it is lost.
    pub fn lost(&self) -> Option<Failure> {
        self.shared.lost.get().cloned()
    }

    /// What the queue has done so far.
    pub fn stats(&self) -> ResidentStats {
        let c = &self.shared.counters;
        ResidentStats {
            submitted: c.submitted.load(Ordering::Relaxed),
            launched: c.launched.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            failed_at_shutdown: c.failed_at_shutdown.load(Ordering::Relaxed),
            retired: self.shared.retired.load(Ordering::Acquire),
            retained: c.retained.load(Ordering::Relaxed),
            starts: c.starts.load(Ordering::Relaxed),
            exits: c.exits.load(Ordering::Relaxed),
            relaunches: c.relaunches.load(Ordering::Relaxed),
        }
    }

    /// The slot words (the device-visible semaphore values), for diagnostics and tests.
    pub fn slot_values(&self) -> SmallVec<[u64; 16]> {
        let bound = lock(&self.shared.bound).semaphores.len();
        self.shared.memory.slots()[..bound]
            .iter()
            .map(|slot| slot.load(Ordering::Acquire))
            .collect()
    }

    /// Shuts the queue down (also done on drop): no submission is accepted from here on;
    /// those already published whose waits are reached run, the others fail their signals;
    /// the scheduler thread is joined. Returns the stats at the end.
    pub fn shutdown(&self) -> ResidentStats {
        {
            let _producer = lock(&self.shared.producer);
            self.shared.shutdown.store(true, Ordering::SeqCst);
        }
        self.shared.notify_room();
        match &self.shared.engine {
            Engine::Model(_) => {
                self.join_consumers();
                // Drain on this thread: the scheduler may have exited idle with pending
                // submissions.
                if self.shared.doorbell.ring() {
                    self.shared.clone().run_consumer();
                }
                self.join_consumers();
                self.shared.retire();
            }
            Engine::Device(scheduler) => {
                // The scheduler finishes pending heads as shut down and exits; then the poller
                // has every completion word to read, and ends.
                scheduler.stop(self.shared.lost.get().is_some());
                if let Err(failure) = scheduler.health() {
                    self.shared.lose(failure);
                }
                // No scheduler runs now: a submission without a completion word never gets one.
                let fallback = if self.shared.lost.get().is_some() {
                    crate::slots::Completion::Lost
                } else {
                    crate::slots::Completion::Shutdown
                };
                self.shared.retire_as(fallback);
                self.shared.wake_poller();
                self.join_consumers();
            }
        }
        self.stats()
    }

    fn join_consumers(&self) {
        loop {
            // Taken in a statement of its own: the lock is let go before the join (a consumer
            // that ends by ringing the doorbell starts the next one under this lock).
            let taken = lock(&self.shared.thread).take();
            let Some(handle) = taken else {
                break;
            };
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }
}

impl<E: DeviceEvent> Drop for ResidentQueue<E> {
    fn drop(&mut self) {
        self.shutdown();
    }
}
