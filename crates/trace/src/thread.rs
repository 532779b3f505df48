//! [`thread_id`]: the small number that names a thread in traces. CPU zones and sinks (the
//! records' thread, the CPU track) both use it; it depends on nothing else of the crate.

use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD_ID: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

/// A small number naming the calling thread for the life of the process (1, 2, ...), used as
/// the CPU track of a thread's zones.
pub fn thread_id() -> u64 {
    THREAD_ID.with(|id| *id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_get_distinct_stable_ids() {
        let here = thread_id();
        assert_eq!(here, thread_id());
        let there = std::thread::spawn(thread_id).join().unwrap();
        assert_ne!(here, there);
    }
}
