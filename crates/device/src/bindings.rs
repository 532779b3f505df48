//! The binding tables of a submission, held until it completes without allocating per
//! submission.
//!
//! `Queue::execute_with_bindings` copies each command buffer's table (cheap `BufferRange`
//! clones: an `Arc` each) into one vector per submission, which keeps the bound buffers
//! alive until the action completes or fails, whatever the caller does with theirs. The
//! vectors come from, and go back to, a small per-queue pool, so a warm queue allocates
//! nothing for tables of any size.

use std::sync::{Arc, Mutex, PoisonError};

use crate::DeviceOptions;
use cuhal_command::BufferRange;
use smallvec::SmallVec;

/// Vectors a queue keeps for reuse: as many as submissions with tables were ever in flight at
/// once, up to this; past it they are freed when they complete.
const POOLED_TABLES: usize = 1024;

/// The fewest vectors made at once when the pool has none to give: a gather batch (the device
/// queues' default). A queue retires lazily, so in steady state up to a gather batch of
/// submissions that nobody waited for hold their tables at once, even when each was waited for
/// on the host (bench case 11's pool grew from 4 to 8 and from 8 to 16 inside its measured
/// window); a pool that starts at a gather batch is past that at its first growth.
const MIN_NEW_TABLES: usize = DeviceOptions::DEFAULT_COMPLETION_GATHER_BATCH;

/// Spare table storage of one queue.
#[derive(Default)]
pub(crate) struct TablePool {
    spare: Mutex<Spare>,
}

#[derive(Default)]
struct Spare {
    tables: Vec<Vec<BufferRange>>,
    /// Vectors made, ever (up to `POOLED_TABLES` are kept).
    made: usize,
}

impl TablePool {
    /// A vector with room for `len` ranges, if the one handed out has it (tables of a queue
    /// mostly keep their size). When none is spare, as many are made at once as were made
    /// before (at least `MIN_NEW_TABLES`): the number of submissions with tables in flight
    /// follows how far the completion side lags, and growing one vector at each new high-water
    /// mark would make every new mark an allocation.
    fn take(&self, len: usize) -> Vec<BufferRange> {
        let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(table) = spare.tables.pop() {
            return table;
        }
        let more = spare
            .made
            .max(MIN_NEW_TABLES)
            .min(POOLED_TABLES.saturating_sub(spare.made))
            .max(1);
        spare.made += more;
        let kept = spare.made.min(POOLED_TABLES);
        spare.tables.reserve(kept);
        for _ in 1..more {
            spare.tables.push(Vec::with_capacity(len));
        }
        Vec::with_capacity(len)
    }

    fn give(&self, mut ranges: Vec<BufferRange>) {
        ranges.clear();
        let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
        if spare.tables.len() < POOLED_TABLES {
            spare.tables.push(ranges);
        }
    }
}

/// Every binding table of one submission: the ranges back to back, and where each command
/// buffer's table starts and ends. Holds the ranges' buffers until dropped (when the action
/// completes or fails), then returns its storage to the queue's pool.
pub(crate) struct BindingTables {
    ranges: Vec<BufferRange>,
    /// `(start, end)` in `ranges` per command buffer, in submission order.
    spans: SmallVec<[(u32, u32); 4]>,
    pool: Option<Arc<TablePool>>,
}

impl BindingTables {
    /// No tables: every command buffer of the submission gets an empty one.
    pub(crate) fn none() -> Self {
        Self {
            ranges: Vec::new(),
            spans: SmallVec::new(),
            pool: None,
        }
    }

    /// Copies `tables` (one per command buffer) into storage from `pool`.
    pub(crate) fn copy<'a>(
        pool: &Arc<TablePool>,
        tables: impl Iterator<Item = &'a [BufferRange]> + Clone,
    ) -> Self {
        let len = tables.clone().map(<[BufferRange]>::len).sum();
        let mut ranges = pool.take(len);
        let mut spans = SmallVec::new();
        for table in tables {
            let start = ranges.len() as u32;
            ranges.extend_from_slice(table);
            spans.push((start, ranges.len() as u32));
        }
        Self {
            ranges,
            spans,
            pool: Some(Arc::clone(pool)),
        }
    }

    /// The table of the `index`th command buffer (empty when none was given).
    pub(crate) fn table(&self, index: usize) -> &[BufferRange] {
        match self.spans.get(index) {
            Some(&(start, end)) => &self.ranges[start as usize..end as usize],
            None => &[],
        }
    }
}

impl Drop for BindingTables {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give(std::mem::take(&mut self.ranges));
        }
    }
}

impl std::fmt::Debug for BindingTables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BindingTables")
            .field("tables", &self.spans.len())
            .field("ranges", &self.ranges.len())
            .finish()
    }
}
