//! The submission ring: one [`Producer`] and one [`Consumer`] over a [`SharedMemory`].
//!
//! The producer writes descriptor `n` into cell `n % capacity`, then publishes `produced = n + 1`
//! with release ordering: on the device that store is the whole submission. The consumer loads
//! `produced` with acquire ordering, copies the descriptor out, and publishes `consumed` with
//! release ordering once it no longer reads the cell. The producer writes cell `n % capacity`
//! only when `n - consumed < capacity` (acquire load), so it never overwrites a cell the
//! consumer may still read. Full is [`Full`]; the queue above decides whether to wait.

use std::sync::Arc;

use crate::descriptor::Descriptor;
use crate::error::Error;
use crate::memory::SharedMemory;
use crate::sync::Ordering;

/// The ring holds `capacity` descriptors the consumer has not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full {
    /// The ring's capacity.
    pub capacity: usize,
}

/// Splits `memory` into the ring's two ends. The header's numbers must be equal (an empty
/// ring); the first descriptor gets that number as its sequence.
pub fn split<M: SharedMemory>(memory: M) -> Result<(Producer<M>, Consumer<M>), Error> {
    let capacity = memory.descriptors().len();
    if capacity == 0 || memory.completions().len() != capacity {
        return Err(Error::InvalidOptions(
            "shared memory needs one completion word per descriptor, and at least one",
        ));
    }
    let header = memory.header();
    let produced = header.produced.0.load(Ordering::Acquire);
    let consumed = header.consumed.0.load(Ordering::Acquire);
    if produced != consumed {
        return Err(Error::InvalidOptions(
            "a ring must be empty when it is split",
        ));
    }
    let memory = Arc::new(memory);
    Ok((
        Producer {
            memory: memory.clone(),
            produced,
            capacity: capacity as u64,
        },
        Consumer {
            memory,
            consumed,
            capacity: capacity as u64,
        },
    ))
}

/// The host's end: writes descriptors and publishes them.
pub struct Producer<M: SharedMemory> {
    memory: Arc<M>,
    produced: u64,
    capacity: u64,
}

impl<M: SharedMemory> Producer<M> {
    /// Writes `descriptor` (its `sequence` set to the next number) and publishes it; returns
    /// its sequence. [`Full`] when `capacity` descriptors are not yet consumed.
    pub fn try_push(&mut self, mut descriptor: Descriptor) -> Result<u64, Full> {
        let header = self.memory.header();
        let consumed = header.consumed.0.load(Ordering::Acquire);
        if self.produced.wrapping_sub(consumed) >= self.capacity {
            return Err(Full {
                capacity: self.capacity as usize,
            });
        }
        let sequence = self.produced;
        descriptor.sequence = sequence;
        let cell = &self.memory.descriptors()[(sequence % self.capacity) as usize];
        // SAFETY: this is the ring's only producer (`split` made one, `&mut self`); the consumer
        // reads cells of sequences in [consumed, produced) only, and this cell's previous
        // sequence (`sequence - capacity`) is below `consumed`, whose acquire load above orders
        // the consumer's last read of it before this write.
        unsafe { cell.0.write(descriptor) };
        self.produced = sequence + 1;
        header.produced.0.store(self.produced, Ordering::Release);
        Ok(sequence)
    }

    /// The next sequence number (descriptors published so far, plus the start).
    pub fn produced(&self) -> u64 {
        self.produced
    }

    /// The ring's capacity.
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// The shared memory.
    pub fn memory(&self) -> &M {
        &self.memory
    }

    /// Another handle to the shared memory (for its slots and completion words; it cannot make
    /// a second ring, since [`split`] takes the memory by value).
    pub fn shared_memory(&self) -> Arc<M> {
        self.memory.clone()
    }
}

/// The consumer's end: the device scheduler's reads, or the CPU model's.
pub struct Consumer<M: SharedMemory> {
    memory: Arc<M>,
    consumed: u64,
    capacity: u64,
}

impl<M: SharedMemory> Consumer<M> {
    /// A copy of the next descriptor, if one is published. A descriptor whose `sequence` is
    /// not the expected one is [`Error::TornDescriptor`] (a producer bug or a stale read).
    pub fn peek(&self) -> Result<Option<Descriptor>, Error> {
        let produced = self.memory.header().produced.0.load(Ordering::Acquire);
        if produced == self.consumed {
            return Ok(None);
        }
        let cell = &self.memory.descriptors()[(self.consumed % self.capacity) as usize];
        // SAFETY: `consumed < produced` (acquire): the producer's write of this cell happened
        // before its release store of `produced`; it writes the cell again only after this end
        // publishes `consumed` past it (`advance`), which happens after this read.
        let descriptor = unsafe { cell.0.read() };
        if descriptor.sequence != self.consumed {
            return Err(Error::TornDescriptor {
                expected: self.consumed,
                found: descriptor.sequence,
            });
        }
        Ok(Some(descriptor))
    }

    /// Releases the descriptor `peek` returned (its cell may be written again). Returns false,
    /// and does nothing, when none is published.
    pub fn advance(&mut self) -> bool {
        let header = self.memory.header();
        if header.produced.0.load(Ordering::Acquire) == self.consumed {
            return false;
        }
        self.consumed += 1;
        header.consumed.0.store(self.consumed, Ordering::Release);
        true
    }

    /// Whether a descriptor is published and not taken.
    pub fn has_work(&self) -> bool {
        self.memory.header().produced.0.load(Ordering::Acquire) != self.consumed
    }

    /// The next sequence number this end reads.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// Writes the completion word of `sequence` (release): the host's mirror reads it.
    pub fn complete(&self, sequence: u64, word: u64) {
        self.memory.completions()[(sequence % self.capacity) as usize]
            .store(word, Ordering::Release);
    }

    /// The shared memory.
    pub fn memory(&self) -> &M {
        &self.memory
    }
}
