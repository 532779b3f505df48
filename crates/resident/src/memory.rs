//! [`SharedMemory`]: where the ring, its completion words and the semaphore slots live, and
//! [`HostMemory`], its CPU version (ordinary memory). The device version (host-mapped pinned
//! memory from `cuMemHostAlloc(CU_MEMHOSTALLOC_DEVICEMAP)`, read by the scheduler kernel through
//! its device pointer) is the `cuhal` crate's.

use crate::descriptor::Descriptor;
use crate::error::Error;
use crate::sync::{AtomicU64, RaceCell};

/// One atomic word alone on a 128-byte line (the GPU's L2 line), so that the producer's and the
/// consumer's words never share one.
#[repr(C, align(128))]
pub struct Line(pub(crate) AtomicU64);

impl Line {
    fn new(value: u64) -> Self {
        Line(AtomicU64::new(value))
    }
}

/// The ring's two sequence numbers, each a `u64` at the start of its own 128-byte line:
/// `produced` (written by the host after each descriptor,
/// with release ordering) and `consumed` (written by the consumer once it has copied a
/// descriptor out). Each on its own line: 256 bytes.
#[repr(C)]
pub struct RingHeader {
    /// Descriptors published: the next submission's sequence number.
    pub(crate) produced: Line,
    /// Descriptors the consumer has taken: the next one it reads.
    pub(crate) consumed: Line,
}

#[cfg(not(loom))]
const _: () = {
    assert!(std::mem::size_of::<RingHeader>() == 256);
    assert!(std::mem::size_of::<DescriptorCell>() == 256);
};

impl RingHeader {
    /// Both numbers at 0.
    pub fn new() -> Self {
        RingHeader {
            produced: Line::new(0),
            consumed: Line::new(0),
        }
    }
}

impl Default for RingHeader {
    fn default() -> Self {
        Self::new()
    }
}

/// One descriptor's storage: written by the producer, read by the consumer, never both at once
/// (the ring's sequence numbers order them). In memory it is a [`Descriptor`]
/// (`repr(transparent)`): a device scheduler reads the cells where the host wrote them.
#[cfg_attr(not(loom), repr(transparent))]
pub struct DescriptorCell(pub(crate) RaceCell<Descriptor>);

// SAFETY: the cell is only accessed through `Producer::try_push` and `Consumer::peek`, whose
// sequence numbers (release stores, acquire loads) make every write happen before the reads of
// the same slot and every read happen before the next write of it.
unsafe impl Sync for DescriptorCell {}
// SAFETY: a descriptor is plain data.
unsafe impl Send for DescriptorCell {}

impl DescriptorCell {
    /// An empty (all-zero) descriptor.
    pub fn new() -> Self {
        DescriptorCell(RaceCell::new(Descriptor::default()))
    }
}

impl Default for DescriptorCell {
    fn default() -> Self {
        Self::new()
    }
}

/// Memory shared between the host (producer, mirror) and the consumer (the device scheduler,
/// or its CPU model).
///
/// # Safety
///
/// An implementation hands out storage that no other value hands out: two rings split from two
/// values never touch the same descriptor cell. `descriptors()` and `completions()` have the
/// same length, at least 1, and every call returns the same slices.
pub unsafe trait SharedMemory: Send + Sync + 'static {
    /// The sequence numbers.
    fn header(&self) -> &RingHeader;
    /// The ring's descriptors (its capacity is their count).
    fn descriptors(&self) -> &[DescriptorCell];
    /// One completion word per descriptor, written by the consumer when it is done with the
    /// submission (see [`Completion`](crate::Completion)), read by the host's mirror.
    fn completions(&self) -> &[AtomicU64];
    /// The semaphore slots (see [`SlotTable`](crate::SlotTable)).
    fn slots(&self) -> &[AtomicU64];
}

// SAFETY: forwards to the boxed memory, which upholds the trait's contract.
unsafe impl SharedMemory for Box<dyn SharedMemory> {
    fn header(&self) -> &RingHeader {
        (**self).header()
    }
    fn descriptors(&self) -> &[DescriptorCell] {
        (**self).descriptors()
    }
    fn completions(&self) -> &[AtomicU64] {
        (**self).completions()
    }
    fn slots(&self) -> &[AtomicU64] {
        (**self).slots()
    }
}

/// [`SharedMemory`] in ordinary host memory: what the CPU model runs on.
pub struct HostMemory {
    header: RingHeader,
    descriptors: Box<[DescriptorCell]>,
    completions: Box<[AtomicU64]>,
    slots: Box<[AtomicU64]>,
}

impl HostMemory {
    /// Room for `capacity` descriptors and `slots` semaphore slots. A capacity of 0 is
    /// [`Error::InvalidOptions`].
    pub fn new(capacity: usize, slots: usize) -> Result<Self, Error> {
        if capacity == 0 {
            return Err(Error::InvalidOptions(
                "a ring needs a capacity of at least 1",
            ));
        }
        Ok(HostMemory {
            header: RingHeader::new(),
            descriptors: (0..capacity).map(|_| DescriptorCell::new()).collect(),
            completions: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
            slots: (0..slots).map(|_| AtomicU64::new(0)).collect(),
        })
    }
}

// SAFETY: every `HostMemory` owns its boxes; the slices are fixed at construction, of equal
// length (at least 1, checked by `new`).
unsafe impl SharedMemory for HostMemory {
    fn header(&self) -> &RingHeader {
        &self.header
    }
    fn descriptors(&self) -> &[DescriptorCell] {
        &self.descriptors
    }
    fn completions(&self) -> &[AtomicU64] {
        &self.completions
    }
    fn slots(&self) -> &[AtomicU64] {
        &self.slots
    }
}
