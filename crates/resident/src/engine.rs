//! [`Engine`]: what consumes a resident queue's ring. The CPU model's thread (a [`Launcher`]
//! runs each ready submission), or a [`DeviceScheduler`]: the scheduler kernel on a GPU, which
//! the host only wakes, stops and watches, while a host poller thread reads its completion
//! words ([`Shared::run_poller`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cuhal_semaphore::{DeviceEvent, Failure};

use crate::error::Error;
use crate::model::Launcher;
use crate::shared::Shared;
use crate::slots::Completion;

/// A scheduler running on a device, as the host half drives it.
pub trait DeviceScheduler: Send + Sync + 'static {
    /// Work was published or a waited-for value pushed: makes sure a scheduler will look at
    /// the ring (starts one when none runs). Called on the submitting thread: in the steady
    /// state it must make no driver call. An error loses the queue.
    fn ring(&self) -> Result<(), Failure>;
    /// The queue shuts down (`lost`: it was lost): the scheduler finishes every pending head
    /// as shut down (or lost) and exits. Returns once no scheduler runs, or the device failed;
    /// like a normal queue's drop, it waits for work already launched.
    fn stop(&self, lost: bool);
    /// `Ok` while the device is healthy; the failure once it is lost (a sticky error on the
    /// scheduler's stream). The poller asks while submissions are outstanding.
    fn health(&self) -> Result<(), Failure>;
    /// Why the launch of `sequence` failed on the device, once its completion word says so.
    fn launch_failure(&self, sequence: u64) -> Option<Failure>;
    /// Outstanding work has not moved for a while: restart a scheduler that ended without
    /// finishing it (a failed relaunch), and nothing else (an idle chain waiting on a value the
    /// host has not pushed is no reason to start one). An error loses the queue.
    fn restart_stalled(&self) -> Result<(), Failure>;
}

/// The consumer of one queue's ring.
pub(crate) enum Engine {
    /// The CPU model: a thread that calls the launcher.
    Model(Arc<dyn Launcher>),
    /// A scheduler on a device.
    Device(Arc<dyn DeviceScheduler>),
}

/// How long the poller spins without progress, with work outstanding, before it sleeps
/// between looks.
const POLL_SPIN: Duration = Duration::from_micros(200);
/// The poller's sleep between looks once it stopped spinning.
const POLL_SLEEP: Duration = Duration::from_micros(20);
/// How often the poller asks the device whether it is healthy while work is outstanding.
const HEALTH_EVERY: Duration = Duration::from_millis(2);
/// How long the poller parks with nothing outstanding (a submission unparks it).
const IDLE_PARK: Duration = Duration::from_millis(10);

impl<E: DeviceEvent> Shared<E> {
    /// Makes sure a consumer looks at the ring: the doorbell and a model thread, or the device
    /// scheduler's ring (whose failure loses the queue).
    pub(crate) fn wake(self: &Arc<Self>) -> Result<(), Error> {
        match &self.engine {
            Engine::Model(_) => {
                if self.doorbell.ring() {
                    self.start_consumer()?;
                }
                Ok(())
            }
            Engine::Device(scheduler) => {
                if let Err(failure) = scheduler.ring() {
                    self.lose(failure.clone());
                    return Err(Error::Lost(failure));
                }
                Ok(())
            }
        }
    }

    /// The host's completion side of a device queue: reads completion words in order and
    /// mirrors them (see [`Shared::retire`]), asks the device for its health while work is
    /// outstanding, and on loss finishes what the device never will. Ends once the queue is shut
    /// down (or lost) with nothing outstanding.
    pub(crate) fn run_poller(self: Arc<Self>, scheduler: Arc<dyn DeviceScheduler>) {
        let mut since_progress = Instant::now();
        let mut last_health = Instant::now();
        loop {
            let before = self.retired.load(Ordering::Acquire);
            self.retire();
            let now = Instant::now();
            if self.retired.load(Ordering::Acquire) != before {
                since_progress = now;
            }
            if self.lost.get().is_some() {
                // The scheduler finishes what it can as lost and ends first: the executables
                // the unretired submissions hold must outlive every launch of them.
                scheduler.stop(true);
                self.retire_as(Completion::Lost);
                break;
            }
            let outstanding = self.counters.retained.load(Ordering::Acquire) > 0;
            if !outstanding {
                if self.is_shutdown() {
                    break;
                }
                self.poller_parked.store(true, Ordering::SeqCst);
                if self.counters.retained.load(Ordering::SeqCst) == 0 && !self.is_shutdown() {
                    std::thread::park_timeout(IDLE_PARK);
                }
                self.poller_parked.store(false, Ordering::SeqCst);
                since_progress = Instant::now();
                continue;
            }
            if now.duration_since(last_health) >= HEALTH_EVERY {
                last_health = now;
                if let Err(failure) = scheduler.health() {
                    self.lose(failure);
                    continue;
                }
                // Work outstanding and nothing moving: a chain that ended on a failed relaunch
                // left its batch for the next one to publish.
                if now.duration_since(since_progress) >= HEALTH_EVERY
                    && let Err(failure) = scheduler.restart_stalled()
                {
                    self.lose(failure);
                    continue;
                }
            }
            if now.duration_since(since_progress) < POLL_SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(POLL_SLEEP);
            }
        }
    }

    /// Unparks a device queue's poller that parked with nothing outstanding (after a
    /// submission's entry is kept): a syscall only when it is parked.
    pub(crate) fn unpark_poller(&self) {
        if self.poller_parked.load(Ordering::SeqCst) {
            self.wake_poller();
        }
    }

    /// Unparks the poller (or the model's consumer thread), parked or about to park: for a
    /// loss or a shutdown, which it must see at once.
    pub(crate) fn wake_poller(&self) {
        if let Some(handle) = crate::shared::lock(&self.thread).as_ref() {
            handle.thread().unpark();
        }
    }
}
