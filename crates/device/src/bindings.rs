//! The binding tables of a submission, held until it completes without allocating per
//! submission.
//!
//! `Queue::execute_with_bindings` copies each command buffer's table (cheap `BufferRange`
//! clones: an `Arc` each) into one boxed vector per submission, which keeps the bound buffers
//! alive until the action completes or fails, whatever the caller does with theirs. The
//! boxes come from, and go back to, a small per-queue pool, so a warm queue allocates
//! nothing for tables of any size, and a payload carries its tables in one word.

use std::sync::{Arc, Mutex, PoisonError};

use crate::DeviceOptions;
use cuhal_command::BufferRange;
use cuhal_recycle::Recycled;
use smallvec::SmallVec;

/// Table storages a queue keeps for reuse: as many as submissions with tables were ever in
/// flight at once, up to this; past it they are freed when they complete.
const POOLED_TABLES: usize = 1024;

/// The fewest table storages made at once when the pool has none to give: a gather batch (the
/// device queues' default); the storages made double from there ([`Recycled::grown`]). A queue
/// retires lazily, so in steady state up to a gather batch of submissions that nobody waited for
/// hold their tables at once, even when each was waited for on the host (bench case 11's pool
/// grew from 4 to 8 and from 8 to 16 inside its measured window); a pool that starts at a
/// gather batch is past that at its first growth.
const MIN_NEW_TABLES: usize = DeviceOptions::DEFAULT_COMPLETION_GATHER_BATCH;

/// Spare table storage of one queue.
#[derive(Default)]
pub(crate) struct TablePool {
    spare: Mutex<Spare>,
}

#[derive(Default)]
struct Spare {
    /// Boxes, not values: a payload holds the box, so the recycled allocation is the box.
    tables: SpareTables,
    /// Storage made, ever (up to `POOLED_TABLES` are kept).
    made: usize,
}

/// A list of spare table storages.
#[allow(clippy::vec_box)]
type SpareTables = Recycled<Vec<Box<Tables>>, MIN_NEW_TABLES>;

/// The room a storage's list of ranges takes when it first grows (then doubled, and kept).
const MIN_RANGES: usize = 16;

/// The storage of one submission's tables, boxed so that a payload carries one word for them
/// (a payload is moved a few times between `Queue::execute` and its slot, and past 128 bytes
/// each move is a `memcpy` call).
struct Tables {
    ranges: Recycled<Vec<BufferRange>, MIN_RANGES>,
    /// `(start, end)` in `ranges` per command buffer, in submission order.
    spans: Recycled<SmallVec<[(u32, u32); 4]>, MIN_RANGES>,
    /// Where the storage goes back to; `None` while it is spare (a spare holding its pool
    /// would keep the pool alive through the pool itself).
    pool: Option<Arc<TablePool>>,
}

impl TablePool {
    /// Storage with room for `len` ranges, if the one handed out has it (tables of a queue
    /// mostly keep their size). When none is spare, as many are made at once as were made
    /// before (at least `MIN_NEW_TABLES`): the number of submissions with tables in flight
    /// follows how far the completion side lags, and growing by one at each new high-water
    /// mark would make every new mark an allocation.
    fn take(&self, len: usize) -> Box<Tables> {
        let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(tables) = spare.tables.pop() {
            return tables;
        }
        let made = spare.made;
        let more = (SpareTables::grown(made) - made)
            .min(POOLED_TABLES.saturating_sub(made))
            .max(1);
        spare.made += more;
        let kept = spare.made.min(POOLED_TABLES);
        spare.tables.reserve_total(kept);
        spare
            .tables
            .refill(more - 1, || Some(Tables::with_capacity(len)));
        Tables::with_capacity(len)
    }

    fn give(&self, mut tables: Box<Tables>) {
        tables.ranges.clear();
        tables.spans.clear();
        let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
        if spare.tables.len() < POOLED_TABLES {
            spare.tables.push(tables);
        }
    }
}

impl Tables {
    fn with_capacity(len: usize) -> Box<Self> {
        Box::new(Tables {
            ranges: Recycled::with_capacity(len),
            spans: Recycled::new(),
            pool: None,
        })
    }
}

/// Every binding table of one submission: the ranges back to back, and where each command
/// buffer's table starts and ends. Holds the ranges' buffers until dropped (when the action
/// completes or fails), then returns its storage to the queue's pool.
pub(crate) struct BindingTables(Option<Box<Tables>>);

impl BindingTables {
    /// No tables: every command buffer of the submission gets an empty one.
    pub(crate) fn none() -> Self {
        Self(None)
    }

    /// Copies `tables` (one per command buffer) into storage from `pool`.
    pub(crate) fn copy<'a>(
        pool: &Arc<TablePool>,
        tables: impl Iterator<Item = &'a [BufferRange]> + Clone,
    ) -> Self {
        let len = tables.clone().map(<[BufferRange]>::len).sum();
        let mut storage = pool.take(len);
        for table in tables {
            let start = storage.ranges.len() as u32;
            storage.ranges.extend(table.iter().cloned());
            let end = storage.ranges.len() as u32;
            storage.spans.push((start, end));
        }
        storage.pool = Some(Arc::clone(pool));
        Self(Some(storage))
    }

    /// The table of the `index`th command buffer (empty when none was given).
    pub(crate) fn table(&self, index: usize) -> &[BufferRange] {
        let Some(storage) = &self.0 else {
            return &[];
        };
        match storage.spans.get(index) {
            Some(&(start, end)) => &storage.ranges[start as usize..end as usize],
            None => &[],
        }
    }
}

impl Drop for BindingTables {
    fn drop(&mut self) {
        if let Some(mut storage) = self.0.take()
            && let Some(pool) = storage.pool.take()
        {
            pool.give(storage);
        }
    }
}

impl std::fmt::Debug for BindingTables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (tables, ranges) = self
            .0
            .as_ref()
            .map_or((0, 0), |s| (s.spans.len(), s.ranges.len()));
        f.debug_struct("BindingTables")
            .field("tables", &tables)
            .field("ranges", &ranges)
            .finish()
    }
}
