//! CPU zones: a guard that reports the time between its creation and its drop.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock;
use crate::sink::Sink;

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD_ID: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

/// A small number naming the calling thread for the life of the process (1, 2, ...), used as
/// the CPU track of a thread's zones.
pub fn thread_id() -> u64 {
    THREAD_ID.with(|id| *id)
}

/// A CPU zone: begins when created, ends (and goes to the sink) when dropped.
///
/// ```
/// use cuhal_trace::{CpuZone, MemorySink};
/// let sink = MemorySink::new();
/// {
///     let _zone = CpuZone::new(&sink, "prepare");
///     // ... work ...
/// }
/// assert_eq!(sink.records().len(), 1);
/// ```
#[must_use = "a CPU zone ends when dropped"]
pub struct CpuZone<'a> {
    sink: &'a dyn Sink,
    name: &'static str,
    begin_ns: u64,
}

impl<'a> CpuZone<'a> {
    /// Begins a zone named `name` on the calling thread.
    pub fn new(sink: &'a dyn Sink, name: &'static str) -> Self {
        Self {
            sink,
            name,
            begin_ns: clock::now_ns(),
        }
    }
}

impl Drop for CpuZone<'_> {
    fn drop(&mut self) {
        self.sink
            .cpu_zone(self.name, self.begin_ns, clock::now_ns());
    }
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
