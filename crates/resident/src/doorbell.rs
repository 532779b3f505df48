//! [`Doorbell`]: who starts the consumer. The device scheduler exits when idle for a bounded
//! time; the next submission (or a host-pushed semaphore value it may be waiting for) starts it
//! again. A start is never lost and never doubled: every ring bumps a count, then starts the
//! consumer if it is not running; an exiting consumer clears `running`, then looks at the count
//! once more, and stays if it moved. Both sides use sequentially consistent operations, so at
//! least one of them sees the other (the loom model `tests/loom_ring.rs` checks it).

use crate::sync::{AtomicBool, AtomicU64, Ordering};

/// The running flag and the ring count.
pub struct Doorbell {
    rings: AtomicU64,
    running: AtomicBool,
}

impl Doorbell {
    /// No consumer running.
    pub fn new() -> Self {
        Doorbell {
            rings: AtomicU64::new(0),
            running: AtomicBool::new(false),
        }
    }

    /// Called after publishing work: true when the caller must start a consumer (it holds the
    /// right to, and nobody else does).
    pub fn ring(&self) -> bool {
        self.rings.fetch_add(1, Ordering::SeqCst);
        !self.running.load(Ordering::SeqCst)
            && self
                .running
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
    }

    /// The ring count, for a consumer about to look for work: pass it to
    /// [`try_exit`](Self::try_exit).
    pub fn seen(&self) -> u64 {
        self.rings.load(Ordering::SeqCst)
    }

    /// A consumer that found nothing to do since `seen`: true when it must exit (nobody rang,
    /// or a ringer already started its successor); false when it must look again (it rang and
    /// this consumer took the running flag back).
    pub fn try_exit(&self, seen: u64) -> bool {
        self.running.store(false, Ordering::SeqCst);
        if self.rings.load(Ordering::SeqCst) == seen {
            return true;
        }
        self.running
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
    }

    /// A ringer that won the doorbell but could not start a consumer: frees it, so that the
    /// next ring starts one. (Not [`try_exit`](Self::try_exit): a ring that came while the flag
    /// was held would make it take the flag back, for a consumer that does not exist.) Work a
    /// ringer published meanwhile waits for the next ring.
    pub fn give_back(&self) {
        self.running.store(false, Ordering::SeqCst);
    }

    /// Whether a consumer is running.
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::SeqCst)
    }
}

impl Default for Doorbell {
    fn default() -> Self {
        Self::new()
    }
}
