//! [`ChainStarter`]: how the host starts a device scheduler chain without losing a wake-up or
//! running two at once, and [`chain_try_exit`], the device's side of it (the scheduler kernel
//! runs the same steps in CUDA; this is the Rust statement of them that the loom model
//! `tests/loom_ring.rs` checks against the host's).
//!
//! Two words in memory both sides reach: `rings` (bumped by the host after every publish, pushed
//! wait value and stop) and `exits` (chains that ended, written by the device). The host counts
//! chains it started. A ring bumps `rings`, fences, and starts a chain only when
//! `exits == starts`; an idle chain announces its exit (`exits + 1`), fences, reads `rings`
//! again, and if it moved since the chain last looked for work, takes the exit back and looks
//! again. Both sides store, fence, then load, so one of them sees the other. A start made while
//! a chain is taking its exit back queues behind it (the device runs a queue's chains one after
//! another, in the order started), so chains never overlap.

use crate::sync::{AtomicU64, Ordering, fence};

#[cfg(loom)]
use loom::sync::Mutex;
#[cfg(not(loom))]
use std::sync::Mutex;

/// The host's count of chains started, and the lock that makes starting one a single step.
pub struct ChainStarter {
    starts: Mutex<u64>,
    /// `starts`, for the lock-free check of the common case (a chain runs).
    started: AtomicU64,
}

impl Default for ChainStarter {
    fn default() -> Self {
        Self::new()
    }
}

impl ChainStarter {
    /// No chain started.
    pub fn new() -> Self {
        ChainStarter {
            starts: Mutex::new(0),
            started: AtomicU64::new(0),
        }
    }

    /// Rings: bumps `rings`, and when no chain runs (`exits` has reached the starts), calls
    /// `start` to start one. Returns whether it started one. In the steady state (a chain runs)
    /// this is an atomic add, a fence and two loads. A failed `start` counts nothing: the next
    /// ring tries again.
    pub fn ring<E>(
        &self,
        rings: &AtomicU64,
        exits: &AtomicU64,
        start: impl FnOnce() -> Result<(), E>,
    ) -> Result<bool, E> {
        rings.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if exits.load(Ordering::SeqCst) < self.started.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let mut starts = self
            .starts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if exits.load(Ordering::SeqCst) < *starts {
            return Ok(false);
        }
        start()?;
        *starts += 1;
        self.started.store(*starts, Ordering::SeqCst);
        Ok(true)
    }

    /// Chains started so far.
    pub fn starts(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }
}

/// The device's side: a chain that found nothing to do since it read `rings` as `seen` asks to
/// exit. True: it must end. False: a ring came meanwhile; it took the exit back and must look
/// again. Only the running chain writes `exits`.
pub fn chain_try_exit(rings: &AtomicU64, exits: &AtomicU64, seen: u64) -> bool {
    let ended = exits.load(Ordering::SeqCst);
    exits.store(ended + 1, Ordering::SeqCst);
    fence(Ordering::SeqCst);
    if rings.load(Ordering::SeqCst) == seen {
        return true;
    }
    exits.store(ended, Ordering::SeqCst);
    false
}
