//! [`ResidentOptions`]: the ring's capacity, the slot table's size, the launch budget of one
//! scheduler execution, how long an idle scheduler stays, and how long a submitter spins for room.

use std::time::Duration;

/// At most this many fire-and-forget launches per execution of the launching graph (the
/// driver's limit): the scheduler relaunches itself (a tail launch) before it would exceed it.
pub const FIRE_AND_FORGET_LIMIT: u32 = 120;

/// How a [`ResidentQueue`](crate::ResidentQueue) is set up.
#[derive(Clone, Debug)]
pub struct ResidentOptions {
    /// A name for errors and threads.
    pub label: String,
    /// Descriptors in the ring: submissions in flight before a submitter waits (or gets
    /// [`Error::Full`](crate::Error::Full)). Default 256, at most [`MAX_CAPACITY`].
    pub capacity: usize,
    /// Semaphore slots (semaphores the queue can see). Default 64, at most [`MAX_SLOTS`].
    pub slots: usize,
    /// Fire-and-forget launches per scheduler execution before it relaunches itself: at most
    /// [`FIRE_AND_FORGET_LIMIT`]. Default that.
    pub launches_per_execution: u32,
    /// How long the scheduler stays with nothing to do before it exits (the next submission
    /// starts it again). Default 100 us.
    pub idle_exit: Duration,
    /// How long a submitter that finds the ring full spins before it parks. Default 20 us.
    pub room_spin: Duration,
}

/// The most submissions a ring holds ([`ResidentOptions::capacity`]): 256 MiB of descriptors.
pub const MAX_CAPACITY: usize = 1 << 20;

/// The most semaphore slots a queue binds ([`ResidentOptions::slots`]).
pub const MAX_SLOTS: usize = 1 << 16;

impl ResidentOptions {
    /// The defaults, with `label`.
    pub fn new(label: impl Into<String>) -> Self {
        ResidentOptions {
            label: label.into(),
            capacity: 256,
            slots: 64,
            launches_per_execution: FIRE_AND_FORGET_LIMIT,
            idle_exit: Duration::from_micros(100),
            room_spin: Duration::from_micros(20),
        }
    }

    /// Checks the options: [`Error::InvalidOptions`](crate::Error::InvalidOptions) names what is
    /// out of range.
    pub fn check(&self) -> Result<(), crate::Error> {
        if self.launches_per_execution == 0 || self.launches_per_execution > FIRE_AND_FORGET_LIMIT {
            return Err(crate::Error::InvalidOptions(
                "launches_per_execution must be between 1 and 120 (the fire-and-forget limit)",
            ));
        }
        if self.slots > MAX_SLOTS {
            return Err(crate::Error::InvalidOptions(
                "too many slots (at most 65,536)",
            ));
        }
        if self.capacity == 0 || self.capacity > MAX_CAPACITY {
            return Err(crate::Error::InvalidOptions(
                "the capacity must be between 1 and 1,048,576 submissions",
            ));
        }
        Ok(())
    }
}

impl Default for ResidentOptions {
    fn default() -> Self {
        Self::new("resident")
    }
}
