//! [`RingMemory`]: a resident queue's ring, completion words and semaphore slots in host-mapped
//! pinned memory, with the words only the device scheduler uses. The layout (byte offsets; every
//! header word alone on a 128-byte line) is what `kernels/resident/scheduler.cu` reads:
//!
//! | where | what | written by |
//! |---|---|---|
//! | line 0 | `produced`: descriptors published | host |
//! | line 1 | `consumed`: descriptors finished | device |
//! | line 2 | `rings`: doorbell rings (publishes, pushed waits, stops) | host |
//! | line 3 | `exits`: scheduler chains ended | device |
//! | line 4 | `control`: 0 running, 1 shutting down, 2 lost | host |
//! | line 5 | `tail_failures`: tail launches that failed (each ended its chain) | device |
//! | line 6 | `tail_error`: the last one's `cudaError_t` | device |
//! | 1024 | `capacity` descriptors of 256 bytes | host |
//! | then | `capacity` completion words | device |
//! | then | `capacity` launch error words: `sequence << 16 \| cudaError_t` | device |
//! | then | `slots` host slot words (values pushed, failures) | host |
//! | then | `slots` device slot words (values signalled, failures) | device |

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use cuhal_resident::{DescriptorCell, RingHeader, SharedMemory};
use cuhal_sys::{CUdeviceptr, MappedHostMemory, PrimaryContext};

use crate::error::Result;

const LINE: usize = 128;
/// The header's lines, by index.
pub(crate) const PRODUCED: usize = 0;
pub(crate) const CONSUMED: usize = 1;
pub(crate) const RINGS: usize = 2;
pub(crate) const EXITS: usize = 3;
pub(crate) const CONTROL: usize = 4;
pub(crate) const TAIL_FAILURES: usize = 5;
const HEADER: usize = 8 * LINE;
const DESCRIPTOR: usize = 256;

/// The `control` word's values (0 is running).
pub(crate) const SHUTTING_DOWN: u64 = 1;
pub(crate) const LOST: u64 = 2;

/// Where each part lies in the mapped block.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub(crate) capacity: usize,
    pub(crate) slots: usize,
}

impl Layout {
    pub(crate) fn descriptors(&self) -> usize {
        HEADER
    }
    pub(crate) fn completions(&self) -> usize {
        HEADER + DESCRIPTOR * self.capacity
    }
    pub(crate) fn launch_errors(&self) -> usize {
        self.completions() + 8 * self.capacity
    }
    pub(crate) fn host_slots(&self) -> usize {
        self.launch_errors() + 8 * self.capacity
    }
    pub(crate) fn device_slots(&self) -> usize {
        self.host_slots() + 8 * self.slots
    }
    fn len(&self) -> usize {
        self.device_slots() + 8 * self.slots
    }
}

/// The mapped block, shared by the queue's ring ([`RingMemory`]) and its scheduler.
pub(crate) struct Block {
    mapped: MappedHostMemory,
    pub(crate) layout: Layout,
}

impl Block {
    /// Allocates the block for `capacity` descriptors and `slots` slots, zeroed.
    pub(crate) fn new(context: &Arc<PrimaryContext>, layout: Layout) -> Result<Arc<Self>> {
        let mapped = MappedHostMemory::new(context, layout.len())?;
        Ok(Arc::new(Block { mapped, layout }))
    }

    /// The header word of line `line`.
    pub(crate) fn line(&self, line: usize) -> &AtomicU64 {
        debug_assert!(line < HEADER / LINE);
        // SAFETY: the block is at least HEADER bytes, page-aligned (so every line is 8-byte
        // aligned), zeroed when made, and lives as long as `self`; its words are only ever
        // reached atomically (host) or by the scheduler's own loads and stores (device).
        unsafe { &*self.mapped.host_ptr().add(line * LINE).cast::<AtomicU64>() }
    }

    /// `count` words from byte `offset`.
    fn words(&self, offset: usize, count: usize) -> &[AtomicU64] {
        debug_assert!(offset + 8 * count <= self.layout.len());
        // SAFETY: in bounds of the block (layout), 8-byte aligned (every offset is a multiple of
        // 8 from a page-aligned base), zeroed (a valid `AtomicU64`), alive as long as `self`.
        unsafe { std::slice::from_raw_parts(self.mapped.host_ptr().add(offset).cast(), count) }
    }

    /// The launch error words, one per cell.
    pub(crate) fn launch_errors(&self) -> &[AtomicU64] {
        self.words(self.layout.launch_errors(), self.layout.capacity)
    }

    /// The device slot words (the host reads them for diagnostics).
    pub(crate) fn device_slots(&self) -> &[AtomicU64] {
        self.words(self.layout.device_slots(), self.layout.slots)
    }

    /// The device address of byte `offset`.
    pub(crate) fn device(&self, offset: usize) -> CUdeviceptr {
        self.mapped.device_ptr() + offset as CUdeviceptr
    }
}

/// The ring's part of the block, as `cuhal-resident` sees it.
pub(crate) struct RingMemory(pub(crate) Arc<Block>);

// SAFETY: the block is owned by this value and the scheduler only (one ring per block); the
// slices are fixed by the layout, `descriptors` and `completions` both `capacity` long (at least
// 1: the options are checked before the block is made).
unsafe impl SharedMemory for RingMemory {
    fn header(&self) -> &RingHeader {
        // SAFETY: lines 0 and 1 are `produced` and `consumed`, each a u64 at the start of a
        // 128-byte line: `RingHeader`'s layout; zeroed is two zero words.
        unsafe { &*self.0.mapped.host_ptr().cast::<RingHeader>() }
    }
    fn descriptors(&self) -> &[DescriptorCell] {
        let layout = self.0.layout;
        // SAFETY: `capacity` cells of 256 bytes from HEADER, in bounds; a `DescriptorCell` is a
        // `Descriptor` in memory (repr(transparent)), and all-zero is a valid descriptor.
        unsafe {
            std::slice::from_raw_parts(
                self.0.mapped.host_ptr().add(layout.descriptors()).cast(),
                layout.capacity,
            )
        }
    }
    fn completions(&self) -> &[AtomicU64] {
        self.0
            .words(self.0.layout.completions(), self.0.layout.capacity)
    }
    fn slots(&self) -> &[AtomicU64] {
        self.0
            .words(self.0.layout.host_slots(), self.0.layout.slots)
    }
}
