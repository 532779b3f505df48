//! How much work each queue of a device has issued: what a host wait on one of the device's
//! events reads to tell whether its queries would contend with submissions
//! ([`cuhal_semaphore::DeviceEvent::submissions`]).
//!
//! A `cuEventQuery` takes the driver's lock that a thread launching work on the same device needs:
//! on the H200 another thread's query every 2 us made each launch + record 0.55 us slower, and
//! back-to-back queries (what a spinning wait does) 0.9 to 1.6 us. A wait that sees these counts
//! move holds its queries back (`completion_policy::BUSY_QUERY_PACE`), and so does a completion
//! thread polling for a parked waiter (`CudaBackend::wait_event`); both judge the counts with
//! [`cuhal_semaphore::Traffic`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

/// One count per queue, each on a cache line of its own that only that queue's issuing thread
/// writes (under the queue's issue lock), so counting costs a submission no locked instruction
/// and no line another submitter writes.
pub(crate) struct Submissions(Box<[CachePadded<AtomicU64>]>);

impl Submissions {
    /// Counts for `queues` queues, all at zero.
    pub(crate) fn new(queues: usize) -> Self {
        Submissions(
            (0..queues)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
        )
    }

    /// Counts one issue on `queue`; called under that queue's issue lock (one writer at a time,
    /// so a load and a store count right). An index past the queues counts nothing.
    pub(crate) fn count(&self, queue: usize) {
        if let Some(count) = self.0.get(queue) {
            count.store(count.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
    }

    /// Every queue's issues so far (each count read once; they may move meanwhile).
    pub(crate) fn total(&self) -> u64 {
        self.0
            .iter()
            .map(|count| count.load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }
}

/// One queue's count among its device's [`Submissions`]: what its backend bumps at every issue.
pub(crate) struct IssueCount {
    /// The device's counts.
    pub(crate) submissions: Arc<Submissions>,
    /// The queue's index among them.
    pub(crate) queue: usize,
}

impl IssueCount {
    /// Counts one issue (under the queue's issue lock).
    pub(crate) fn count(&self) {
        self.submissions.count(self.queue);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_count_apart_and_add_up() {
        let s = Submissions::new(3);
        s.count(0);
        s.count(2);
        s.count(2);
        s.count(7);
        assert_eq!(s.total(), 3);
    }
}
