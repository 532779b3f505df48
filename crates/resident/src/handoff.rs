//! The host mirror's two lock-free hand-offs, apart from the rest of the mirror so that the loom
//! models (`tests/loom_ring.rs`) check the code the queue runs:
//!
//! - [`SlotGate`]: a slot's listener hand-off. Waits for values a host thread or a normal queue
//!   signals share one listener per slot; a wait that finds one registered leaves its value for
//!   the listener's notice to push.
//! - [`RetireQueue`]: the submissions the host keeps until their completion words are read, and
//!   the retiring of them. Several threads may retire at once (an exiting consumer and its
//!   successor, shutdown); one of them at a time finishes entries, in sequence order.

use std::collections::VecDeque;
#[cfg(not(loom))]
use std::sync::{Mutex, MutexGuard};

use cuhal_semaphore::{DeviceEvent, Listener, Semaphore};
#[cfg(loom)]
use loom::sync::{Mutex, MutexGuard};
use smallvec::SmallVec;

use crate::slots::SlotTable;
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// One slot's listener hand-off: the highest value a wait asked the host to push, and whether a
/// listener is registered.
#[derive(Default)]
pub struct SlotGate {
    wanted: AtomicU64,
    listening: AtomicBool,
}

impl SlotGate {
    /// A gate with nothing wanted.
    pub fn new() -> Self {
        Self::default()
    }

    /// Pushes `semaphore`'s value into `word` for a wait on `value`; when the value is not
    /// reached yet, makes sure `listener` (called with `key`) will push it: registers it, or
    /// leaves `value` for the registered one's notice.
    pub fn push<E: DeviceEvent>(
        &self,
        word: &AtomicU64,
        semaphore: &Semaphore<E>,
        value: u64,
        listener: &std::sync::Arc<dyn Listener<E>>,
        key: u64,
    ) {
        let mut value = value;
        loop {
            let current = match semaphore.query() {
                Ok(current) => current,
                Err(_) => {
                    SlotTable::fail(word);
                    return;
                }
            };
            SlotTable::publish(word, current);
            if current >= value {
                return;
            }
            self.wanted.fetch_max(value, Ordering::SeqCst);
            if self.listening.swap(true, Ordering::SeqCst) {
                // The registered listener's notice pushes it.
                return;
            }
            // The next value, not the highest wanted: a wait for a lower value that finds this
            // listener registered relies on it (the device reads the ring in order, and two
            // submitters may publish in the other order than they pushed their waits). Every
            // wait that leaves its value here wants more than `current`, so this fires no later
            // than its value; each notice pushes the value and listens again while one wants
            // more. Only a reached value (or a failure) fires it, never a recorded device
            // signal: that would fire it again at once, without end.
            if semaphore
                .listen_reached(current + 1, listener, key)
                .is_some()
            {
                return;
            }
            // Reached (or failed) since the query: nothing registered; look again.
            self.listening.swap(false, Ordering::SeqCst);
            value = self.wanted.load(Ordering::SeqCst);
        }
    }

    /// The listener fired: pushes the value, and listens again if a wait wants more.
    pub fn notice<E: DeviceEvent>(
        &self,
        word: &AtomicU64,
        semaphore: &Semaphore<E>,
        listener: &std::sync::Arc<dyn Listener<E>>,
        key: u64,
    ) {
        // A swap, not a store: a wait that found the listener registered raised `wanted` before
        // its swap read `true`, and this read-modify-write reads that swap's write, so the load
        // below sees the raised value (a plain store would rely on `SeqCst` alone, which loom
        // does not model).
        self.listening.swap(false, Ordering::SeqCst);
        let wanted = self.wanted.load(Ordering::SeqCst);
        self.push(word, semaphore, wanted, listener, key);
    }
}

/// The entries kept until retired, in sequence order, and who is retiring them.
pub struct RetireQueue<T> {
    entries: Mutex<VecDeque<T>>,
    /// Retire calls since the retiring thread last found nothing to do: the first caller
    /// retires, later ones leave it to that one, which looks again until no call came in.
    calls: AtomicUsize,
}

impl<T> Default for RetireQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> RetireQueue<T> {
    /// An empty queue.
    pub fn new() -> Self {
        RetireQueue {
            entries: Mutex::new(VecDeque::new()),
            calls: AtomicUsize::new(0),
        }
    }

    /// The entries (a submitter pushes at the back under it).
    pub fn lock(&self) -> MutexGuard<'_, VecDeque<T>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Retires every front entry whose completion `ready` reads, in order: `finish` gets them
    /// in batches, on one thread at a time. Call it after writing a completion word: when
    /// another thread is retiring, this returns at once and that thread retires the entry.
    ///
    /// One retiring thread, not a lock around popping and finishing: two threads that each
    /// popped a batch would finish them in either order (a semaphore advanced by the later
    /// submission before the earlier one fails it, or advanced back), and a thread waiting for
    /// a lock around `finish` (whose listeners may start and join consumer threads) could
    /// deadlock with the one holding it.
    pub fn retire<C>(
        &self,
        ready: impl Fn(&T) -> Option<C>,
        mut finish: impl FnMut(&mut SmallVec<[(T, C); 8]>),
    ) {
        if self.calls.fetch_add(1, Ordering::AcqRel) != 0 {
            return;
        }
        let mut seen = 1;
        loop {
            self.retire_ready(&ready, &mut finish);
            match self
                .calls
                .compare_exchange(seen, 0, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(now) => seen = now,
            }
        }
    }

    fn retire_ready<C>(
        &self,
        ready: &impl Fn(&T) -> Option<C>,
        finish: &mut impl FnMut(&mut SmallVec<[(T, C); 8]>),
    ) {
        loop {
            let mut batch: SmallVec<[(T, C); 8]> = SmallVec::new();
            {
                let mut entries = self.lock();
                while batch.len() < batch.inline_size() {
                    let Some(front) = entries.front() else { break };
                    let Some(completion) = ready(front) else {
                        break;
                    };
                    if let Some(entry) = entries.pop_front() {
                        batch.push((entry, completion));
                    }
                }
            }
            if batch.is_empty() {
                return;
            }
            finish(&mut batch);
        }
    }
}
