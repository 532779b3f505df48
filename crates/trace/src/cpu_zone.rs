//! CPU zones: a guard that reports the time between its creation and its drop.

use crate::clock;
use crate::sink::Sink;

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
