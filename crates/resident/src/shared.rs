//! [`Shared`]: the state a resident queue's host side, its consumer and its slot listener share.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;

use cuhal_semaphore::{DeviceEvent, Failure, Semaphore, SemaphoreId};
use smallvec::SmallVec;

use crate::doorbell::Doorbell;
use crate::engine::Engine;
use crate::handoff::{RetireQueue, SlotGate};
use crate::memory::SharedMemory;
use crate::options::ResidentOptions;
use crate::refusal::Launchable;
use crate::ring::{Consumer, Producer};

/// The ring's memory: ordinary memory for the CPU model, host-mapped memory for a device.
pub(crate) type Memory = Box<dyn SharedMemory>;

/// What the host keeps of a published submission until its completion word is read: the
/// executable (so it outlives the launch) and the semaphores to advance or fail.
pub(crate) struct Retained<E: DeviceEvent> {
    pub(crate) sequence: u64,
    pub(crate) _executable: Arc<dyn Launchable>,
    pub(crate) waits: SmallVec<[Semaphore<E>; 4]>,
    pub(crate) signals: SmallVec<[(Semaphore<E>, u64); 4]>,
}

/// The semaphores bound to slots.
pub(crate) struct Bound<E: DeviceEvent> {
    pub(crate) by_id: HashMap<SemaphoreId, u32>,
    pub(crate) semaphores: Vec<Semaphore<E>>,
}

/// Counters ([`ResidentStats`](crate::ResidentStats) reads them).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) submitted: AtomicU64,
    pub(crate) launched: AtomicU64,
    pub(crate) relaunches: AtomicU64,
    pub(crate) starts: AtomicU64,
    pub(crate) exits: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) failed_at_shutdown: AtomicU64,
    pub(crate) retained: AtomicUsize,
}

pub(crate) struct Shared<E: DeviceEvent> {
    pub(crate) options: ResidentOptions,
    pub(crate) memory: Arc<Memory>,
    pub(crate) producer: Mutex<Producer<Memory>>,
    /// The CPU model's end of the ring (a device queue's is on the device; this one stays idle).
    pub(crate) consumer: Mutex<Consumer<Memory>>,
    pub(crate) doorbell: Doorbell,
    pub(crate) bound: Mutex<Bound<E>>,
    /// Per slot: the listener hand-off for waits the host pushes.
    pub(crate) gates: Box<[SlotGate]>,
    pub(crate) retained: RetireQueue<Retained<E>>,
    /// Submissions whose completion the host has read: the ring has room while
    /// `produced - retired < capacity`.
    pub(crate) retired: AtomicU64,
    /// The CPU model's stand-in for the error word a failed device launch writes: the failure
    /// of each failed launch, by sequence, until the mirror reads it.
    pub(crate) launch_failures: Mutex<Vec<(u64, Failure)>>,
    pub(crate) room: Mutex<()>,
    pub(crate) room_cv: Condvar,
    pub(crate) room_waiters: AtomicUsize,
    pub(crate) lost: OnceLock<Failure>,
    /// Set once no scheduler will write another completion word: how the submissions left
    /// without one finish.
    pub(crate) unwritten: OnceLock<crate::slots::Completion>,
    pub(crate) shutdown: AtomicBool,
    pub(crate) engine: Engine,
    /// The CPU model's consumer thread, or a device queue's poller.
    pub(crate) thread: Mutex<Option<JoinHandle<()>>>,
    /// A device queue's poller parked with nothing outstanding (a submission unparks it).
    pub(crate) poller_parked: AtomicBool,
    pub(crate) counters: Counters,
}

/// Locks `mutex`, taking the data of a poisoned one (no code here panics under these locks;
/// a launcher's panic is caught outside them).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<E: DeviceEvent> Shared<E> {
    /// The slot word of `slot`.
    pub(crate) fn slot(&self, slot: u32) -> &crate::sync::AtomicU64 {
        &self.memory.slots()[slot as usize]
    }

    pub(crate) fn is_shutdown(&self) -> bool {
        self.shutdown.load(Ordering::SeqCst)
    }
}
