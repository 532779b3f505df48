//! Back-pressure: a submitter that finds the ring full spins for a bounded time, then parks
//! until the host's mirror retires a submission, as the scheduler crate's queues wait for room.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cuhal_semaphore::DeviceEvent;

use crate::error::Error;
use crate::shared::{Shared, lock};

impl<E: DeviceEvent> Shared<E> {
    /// Whether a submission fits: published minus retired below the capacity.
    pub(crate) fn has_room(&self, produced: u64) -> bool {
        produced.saturating_sub(self.retired.load(Ordering::Acquire)) < self.options.capacity as u64
    }

    /// Waits outside every lock until the ring may have room, the queue is lost, or it shuts
    /// down (the caller checks again under the producer lock).
    #[cold]
    pub(crate) fn wait_for_room(&self, produced: u64) -> Result<(), Error> {
        self.room_waiters.fetch_add(1, Ordering::SeqCst);
        let result = self.wait_for_room_counted(produced);
        self.room_waiters.fetch_sub(1, Ordering::SeqCst);
        result
    }

    fn wait_for_room_counted(&self, produced: u64) -> Result<(), Error> {
        let spin_until = Instant::now() + self.options.room_spin;
        loop {
            if let Some(failure) = self.lost.get() {
                return Err(Error::Lost(failure.clone()));
            }
            if self.is_shutdown() {
                return Err(Error::Shutdown);
            }
            if self.has_room(produced) {
                return Ok(());
            }
            if Instant::now() < spin_until {
                std::hint::spin_loop();
                continue;
            }
            let room = lock(&self.room);
            if self.has_room(produced) || self.lost.get().is_some() || self.is_shutdown() {
                continue;
            }
            // The mirror notifies after every retire while someone waits; the timeout only
            // bounds the cost of a notification that raced with the check above (and, on the
            // device, is the polling period: nothing on the GPU can notify).
            drop(
                self.room_cv
                    .wait_timeout(room, Duration::from_millis(1))
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
        }
    }

    /// Wakes submitters waiting for room.
    pub(crate) fn notify_room(&self) {
        if self.room_waiters.load(Ordering::SeqCst) > 0 {
            drop(lock(&self.room));
            self.room_cv.notify_all();
        }
    }
}
