//! [`SemaphoreId`]: a semaphore's identity.

/// A semaphore's identity, unique in the process for its lifetime: a key to index pending work by.
#[derive(Copy, Clone, Eq, PartialEq, Hash, Ord, PartialOrd, Debug)]
pub struct SemaphoreId(u64);

impl SemaphoreId {
    /// A fresh identity, never handed out before.
    pub(crate) fn next() -> Self {
        // std's atomic even under loom: a plain counter outside every model (and loom's
        // atomics cannot be statics).
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        SemaphoreId(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }

    /// The id as a number.
    pub fn get(self) -> u64 {
        self.0
    }
}
