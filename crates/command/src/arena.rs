//! Byte storage with 16-byte alignment, and a block arena whose allocations never move.

/// One 16-byte-aligned chunk; `AlignedBytes` is built from these so any value up to 16-byte
/// alignment can be stored in place.
#[derive(Copy, Clone, Default)]
#[repr(C, align(16))]
struct Chunk([u8; 16]);

/// The largest alignment [`AlignedBytes`] honours.
pub(crate) const MAX_ALIGN: usize = 16;

/// A growable byte vector whose start is 16-byte aligned.
#[derive(Clone, Default)]
pub(crate) struct AlignedBytes {
    chunks: Vec<Chunk>,
    len: usize,
}

impl AlignedBytes {
    /// Appends `bytes` at the next offset that is a multiple of `align` (a power of two up to
    /// [`MAX_ALIGN`]), and returns that offset. The gap holds whatever was there (zeros on
    /// first use; earlier bytes after a `clear`): nothing reads it.
    pub(crate) fn push(&mut self, bytes: &[u8], align: usize) -> usize {
        debug_assert!(align.is_power_of_two() && align <= MAX_ALIGN);
        let offset = self.len.next_multiple_of(align);
        self.grow_to(offset + bytes.len());
        self.write_at(offset, bytes)
    }

    /// As [`Self::push`] for bytes whose size the caller gave: `None`, with nothing appended,
    /// when the host has no memory for them (or the size overflows).
    pub(crate) fn try_push(&mut self, bytes: &[u8], align: usize) -> Option<usize> {
        debug_assert!(align.is_power_of_two() && align <= MAX_ALIGN);
        let offset = self.len.next_multiple_of(align);
        let end = offset.checked_add(bytes.len())?;
        let more = end.div_ceil(16).saturating_sub(self.chunks.len());
        self.chunks.try_reserve(more).ok()?;
        self.grow_to(end);
        Some(self.write_at(offset, bytes))
    }

    fn grow_to(&mut self, end: usize) {
        let chunks = end.div_ceil(16);
        if chunks > self.chunks.len() {
            self.chunks.resize(chunks, Chunk::default());
        }
    }

    fn write_at(&mut self, offset: usize, bytes: &[u8]) -> usize {
        let end = offset + bytes.len();
        self.as_mut_slice_to(end)[offset..end].copy_from_slice(bytes);
        self.len = end;
        offset
    }

    fn as_mut_slice_to(&mut self, end: usize) -> &mut [u8] {
        debug_assert!(end <= self.chunks.len() * 16);
        // SAFETY: `chunks` holds `chunks.len() * 16` initialized bytes (Chunk is plain bytes)
        // and `end` does not exceed that; the borrow of `self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.chunks.as_mut_ptr().cast::<u8>(), end) }
    }

    /// The bytes written so far.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `len <= chunks.len() * 16` bytes are initialized (see `push`).
        unsafe { std::slice::from_raw_parts(self.chunks.as_ptr().cast::<u8>(), self.len) }
    }

    /// The address of byte 0 (16-byte aligned). Stable while nothing is pushed.
    pub(crate) fn base(&self) -> *const u8 {
        self.chunks.as_ptr().cast()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }
}

/// Bytes copied at record time whose addresses must stay fixed for as long as the owner lives
/// (graph memcpy nodes keep the raw host pointer). Blocks are boxed slices that are never
/// resized, so earlier allocations never move.
#[derive(Default)]
pub(crate) struct StableArena {
    blocks: Vec<Box<[u8]>>,
    used: usize,
}

impl StableArena {
    const BLOCK: usize = 64 * 1024;

    /// Copies `bytes` into the arena and returns the copy's stable address, or `None` when the
    /// host has no memory for a new block (the caller gives the size, so this is fallible).
    pub(crate) fn copy(&mut self, bytes: &[u8]) -> Option<*const u8> {
        let fits = self
            .blocks
            .last()
            .is_some_and(|b| b.len() - self.used >= bytes.len());
        if !fits {
            let size = bytes.len().max(Self::BLOCK);
            let mut block = Vec::new();
            block.try_reserve_exact(size).ok()?;
            self.blocks.try_reserve(1).ok()?;
            block.resize(size, 0u8);
            self.blocks.push(block.into_boxed_slice());
            self.used = 0;
        }
        let block = self.blocks.last_mut().expect("a block was just ensured");
        let dst = &mut block[self.used..self.used + bytes.len()];
        dst.copy_from_slice(bytes);
        self.used += bytes.len();
        Some(dst.as_ptr())
    }

    /// Total bytes reserved.
    #[cfg(test)]
    pub(crate) fn reserved(&self) -> usize {
        self.blocks.iter().map(|b| b.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushes_are_aligned_and_zero_padded() {
        let mut a = AlignedBytes::default();
        assert_eq!(a.push(&[1], 1), 0);
        assert_eq!(a.push(&[2, 2, 2, 2, 2, 2, 2, 2], 8), 8);
        assert_eq!(a.push(&[3, 3], 2), 16);
        assert_eq!(a.push(&[4; 16], 16), 32);
        assert_eq!(a.len(), 48);
        assert_eq!(a.base() as usize % 16, 0);
        let s = a.as_slice();
        assert_eq!(s[0], 1);
        assert_eq!(&s[1..8], &[0; 7]);
        assert_eq!(&s[8..16], &[2; 8]);
        assert_eq!(&s[16..18], &[3, 3]);
        assert_eq!(&s[18..32], &[0; 14]);
        assert_eq!(&s[32..48], &[4; 16]);
    }

    #[test]
    fn stable_arena_addresses_never_move() {
        let mut arena = StableArena::default();
        let first = arena.copy(&[7; 100]).unwrap();
        let mut later = Vec::new();
        for i in 0..50u8 {
            later.push((arena.copy(&[i; 5000]).unwrap(), i));
        }
        let big = arena.copy(&[9; 200_000]).unwrap();
        // SAFETY: every pointer came from `copy` and the arena is alive and not mutated.
        unsafe {
            assert_eq!(std::slice::from_raw_parts(first, 100), &[7; 100][..]);
            for (p, i) in later {
                assert!(std::slice::from_raw_parts(p, 5000).iter().all(|&b| b == i));
            }
            assert!(
                std::slice::from_raw_parts(big, 200_000)
                    .iter()
                    .all(|&b| b == 9)
            );
        }
        assert!(arena.reserved() >= 100 + 50 * 5000 + 200_000);
    }
}
