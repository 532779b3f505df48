//! Byte ranges of device memory and the checks every recorded command runs on them.
//!
//! The checks are pure functions of addresses and lengths, so they are tested without a GPU;
//! [`BufferRange`] pairs a checked range with the allocation that keeps it alive.

use std::fmt;
use std::sync::Arc;

use cuhal_sys::CUdeviceptr;

use crate::bounds::check_range;
use crate::{Buffer, Error};

/// Checks that a command's range is not empty.
pub(crate) fn check_non_empty(what: &'static str, length: usize) -> Result<(), Error> {
    if length == 0 {
        Err(Error::ZeroSize { what })
    } else {
        Ok(())
    }
}

/// Checks the rules of `cuMemsetD16`/`cuMemsetD32` (and their graph nodes): the address and
/// the length are multiples of the element size. One-byte fills have no such rule.
pub(crate) fn check_fill_alignment(
    address: CUdeviceptr,
    offset: usize,
    length: usize,
    element: usize,
) -> Result<(), Error> {
    if element > 1 {
        if !offset.is_multiple_of(element) {
            return Err(Error::Misaligned {
                what: "fill offset",
                value: offset as u64,
                alignment: element,
            });
        }
        // The offset is aligned: the buffer's own address is not (memory imported or made from
        // a raw pointer can start anywhere).
        if !address.is_multiple_of(element as u64) {
            return Err(Error::Misaligned {
                what: "fill address",
                value: address,
                alignment: element,
            });
        }
        if !length.is_multiple_of(element) {
            return Err(Error::Misaligned {
                what: "fill length",
                value: length as u64,
                alignment: element,
            });
        }
    }
    Ok(())
}

/// Rejects a copy whose source and target byte intervals intersect.
pub(crate) fn check_no_overlap(
    source: CUdeviceptr,
    target: CUdeviceptr,
    length: usize,
) -> Result<(), Error> {
    let length64 = length as u64;
    // Half-open intervals [s, s+len) and [t, t+len) intersect when each starts before the other
    // ends. Saturating: a range that would wrap the address space cannot come from a checked
    // allocation, and saturating keeps the comparison conservative.
    let overlaps =
        source < target.saturating_add(length64) && target < source.saturating_add(length64);
    if overlaps && length > 0 {
        Err(Error::OverlappingCopy {
            source,
            target,
            length,
        })
    } else {
        Ok(())
    }
}

/// A checked byte range of device memory: a whole buffer, or a sub-range of one; or, in a
/// command buffer recorded with binding slots, a range of whatever a slot is bound to at each
/// submission ([`BufferRange::slot`]).
///
/// A range made from a [`Buffer`] holds an `Arc` of it, and command buffers keep every range's
/// buffer alive for as long as they exist, so memory is never freed under recorded work.
/// Ranges of memory cuhal did not allocate (for example a tensor of another runtime) are made
/// with the `unsafe` [`BufferRange::from_raw`].
#[derive(Clone)]
pub struct BufferRange {
    owner: Option<Arc<Buffer>>,
    /// `Some(slot)`: a range of the binding of that slot; `base` is 0 and `capacity` unbounded.
    slot: Option<u32>,
    /// Start of the allocation the range is inside.
    base: CUdeviceptr,
    /// Length of that allocation.
    capacity: usize,
    offset: usize,
    length: usize,
}

impl BufferRange {
    /// A range of a cuhal buffer; checked against its length.
    pub(crate) fn of_buffer(
        buffer: &Arc<Buffer>,
        offset: usize,
        length: usize,
    ) -> Result<Self, Error> {
        check_range(offset, length, buffer.len())?;
        Ok(Self {
            base: buffer.device_ptr(),
            capacity: buffer.len(),
            owner: Some(Arc::clone(buffer)),
            slot: None,
            offset,
            length,
        })
    }

    /// `length` bytes at `offset` of whatever binding slot `slot` names at submission: what a
    /// command buffer created with a binding capacity records instead of a buffer. Checked
    /// only for overflow now; the command buffer records the largest extent used per slot, and
    /// each submission's binding table is checked against it.
    pub fn slot(slot: u32, offset: usize, length: usize) -> Result<Self, Error> {
        offset
            .checked_add(length)
            .filter(|&end| end <= isize::MAX as usize)
            .ok_or(Error::RangeOverflow { offset, length })?;
        Ok(Self {
            owner: None,
            slot: Some(slot),
            base: 0,
            capacity: isize::MAX as usize,
            offset,
            length,
        })
    }

    /// A range covering `capacity` bytes of device memory at `base` that cuhal did not allocate.
    ///
    /// # Safety
    /// `[base, base + capacity)` must be device memory of the context of every command buffer
    /// the range (or a sub-range) is recorded into, and must stay allocated until all work
    /// recorded with it has completed and those command buffers are dropped or never issued
    /// again. (Ranges that never reach the device, as in the CPU tests of a deferred buffer,
    /// may use any address.)
    pub unsafe fn from_raw(base: CUdeviceptr, capacity: usize) -> Self {
        Self {
            owner: None,
            slot: None,
            base,
            capacity,
            offset: 0,
            length: capacity,
        }
    }

    /// The binding slot the range is relative to, for a range made by [`BufferRange::slot`]
    /// (or a sub-range of one).
    pub fn binding_slot(&self) -> Option<u32> {
        self.slot
    }

    /// `Ok` for a range of memory, a typed error for a slot range, which only a command buffer
    /// with binding slots can record.
    pub fn check_not_slot(&self, what: &'static str) -> Result<(), Error> {
        match self.slot {
            Some(slot) => Err(crate::BindingError::SlotRangeNotBound { what, slot }.into()),
            None => Ok(()),
        }
    }

    /// Checks that `pattern` may fill this range: not empty, and for 2 and 4 byte patterns an
    /// address and length that are multiples of the pattern size (the driver's memset rule).
    pub fn check_fill(&self, pattern: crate::FillPattern) -> Result<(), Error> {
        check_non_empty("fill", self.length)?;
        check_fill_alignment(self.device_ptr(), self.offset, self.length, pattern.size())
    }

    /// Checks that this range may be copied to `target`: not empty, the same length, no overlap.
    /// Ranges of two different slots, or of a slot and a buffer, are checked for overlap when a
    /// binding table gives the slot its memory.
    pub fn check_copy_to(&self, target: &BufferRange) -> Result<(), Error> {
        check_non_empty("copy", self.length)?;
        if self.length != target.length {
            return Err(Error::LengthMismatch {
                what: "copy",
                target: target.length,
                source: self.length,
            });
        }
        if self.slot != target.slot {
            return Ok(());
        }
        check_no_overlap(self.device_ptr(), target.device_ptr(), self.length)
    }

    /// A sub-range: `offset` is relative to this range's start; checked against its length.
    pub fn sub(&self, offset: usize, length: usize) -> Result<Self, Error> {
        check_range(offset, length, self.length)?;
        Ok(Self {
            owner: self.owner.clone(),
            slot: self.slot,
            base: self.base,
            capacity: self.capacity,
            offset: self.offset + offset,
            length,
        })
    }

    /// Device address of the range's first byte. For a slot range, the address is only known
    /// at submission: this is its offset in the slot's binding.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.base + self.offset as u64
    }

    /// The range's first byte as a typed pointer ([`device_ptr`](Self::device_ptr)), or `None`
    /// when the range's address or length does not suit a `T` array: the address not aligned
    /// to `T`, or a length not a whole number of `T`s. The pointer does not keep the buffer
    /// alive; [`KernelArgs::push_range`](crate::KernelArgs::push_range) does.
    pub fn ptr<T>(&self) -> Option<crate::DevicePtr<T>> {
        let address = self.device_ptr();
        let size = size_of::<T>();
        let aligned = address.is_multiple_of(align_of::<T>() as u64);
        let whole = size == 0 || self.len().is_multiple_of(size);
        (aligned && whole).then(|| crate::DevicePtr::from_address(address))
    }

    /// Offset of the range from the start of its allocation.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.length
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// Length of the whole allocation the range is inside.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The cuhal buffer behind the range, if it is one.
    pub fn buffer(&self) -> Option<&Arc<Buffer>> {
        self.owner.as_ref()
    }
}

impl fmt::Debug for BufferRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferRange")
            .field("base", &format_args!("{:#x}", self.base))
            .field("offset", &self.offset)
            .field("length", &self.length)
            .field("capacity", &self.capacity)
            .field("owned", &self.owner.is_some())
            .field("slot", &self.slot)
            .finish()
    }
}

impl Buffer {
    /// The whole buffer as a range.
    pub fn whole(self: &Arc<Self>) -> BufferRange {
        BufferRange::of_buffer(self, 0, self.len()).expect("the whole buffer is in bounds")
    }

    /// `length` bytes at `offset`; checked against the buffer's length.
    pub fn range(self: &Arc<Self>, offset: usize, length: usize) -> Result<BufferRange, Error> {
        BufferRange::of_buffer(self, offset, length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(base: u64, capacity: usize) -> BufferRange {
        // SAFETY: these ranges never reach a device.
        unsafe { BufferRange::from_raw(base, capacity) }
    }

    #[test]
    fn ranges_inside_the_buffer_pass() {
        assert_eq!(check_range(0, 16, 16), Ok(()));
        assert_eq!(check_range(15, 1, 16), Ok(()));
        assert_eq!(check_range(16, 0, 16), Ok(()));
    }

    #[test]
    fn out_of_bounds_reports_the_numbers() {
        let e = check_range(10, 7, 16).unwrap_err();
        assert_eq!(
            e,
            Error::OutOfBounds {
                offset: 10,
                length: 7,
                capacity: 16
            }
        );
        assert!(e.to_string().contains("[10, 10+7)"), "{e}");
        assert!(e.to_string().contains("16-byte"), "{e}");
        assert!(matches!(
            check_range(17, 0, 16),
            Err(Error::OutOfBounds { offset: 17, .. })
        ));
    }

    #[test]
    fn overflow_is_its_own_error() {
        assert_eq!(
            check_range(usize::MAX, 2, 16),
            Err(Error::RangeOverflow {
                offset: usize::MAX,
                length: 2
            })
        );
    }

    #[test]
    fn sub_ranges_are_relative_and_checked() {
        let whole = raw(0x1000, 64);
        let a = whole.sub(8, 32).unwrap();
        assert_eq!(a.device_ptr(), 0x1008);
        assert_eq!((a.offset(), a.len(), a.capacity()), (8, 32, 64));
        let b = a.sub(4, 28).unwrap();
        assert_eq!(b.device_ptr(), 0x100c);
        assert_eq!(b.offset(), 12);
        // Fits the buffer but not the parent range.
        assert_eq!(
            a.sub(4, 29).unwrap_err(),
            Error::OutOfBounds {
                offset: 4,
                length: 29,
                capacity: 32
            }
        );
        assert!(matches!(
            a.sub(usize::MAX, 1),
            Err(Error::RangeOverflow { .. })
        ));
    }

    #[test]
    fn fill_alignment_follows_the_memset_rules() {
        // One-byte patterns: anything goes.
        assert_eq!(check_fill_alignment(0x1003, 3, 5, 1), Ok(()));
        // Two and four bytes: offset and length multiples of the element.
        assert_eq!(check_fill_alignment(0x1002, 2, 6, 2), Ok(()));
        assert_eq!(check_fill_alignment(0x1004, 4, 8, 4), Ok(()));
        assert_eq!(
            check_fill_alignment(0x1001, 1, 4, 2),
            Err(Error::Misaligned {
                what: "fill offset",
                value: 1,
                alignment: 2
            })
        );
        assert_eq!(
            check_fill_alignment(0x1004, 4, 6, 4),
            Err(Error::Misaligned {
                what: "fill length",
                value: 6,
                alignment: 4
            })
        );
        // An external allocation whose base is misaligned is caught by the address, and said so.
        assert_eq!(
            check_fill_alignment(0x1002, 0, 4, 4),
            Err(Error::Misaligned {
                what: "fill address",
                value: 0x1002,
                alignment: 4
            })
        );
    }

    #[test]
    fn overlap_detection_is_exact() {
        assert_eq!(check_no_overlap(0, 16, 16), Ok(()));
        assert_eq!(check_no_overlap(16, 0, 16), Ok(()));
        assert!(check_no_overlap(0, 15, 16).is_err());
        assert!(check_no_overlap(15, 0, 16).is_err());
        assert!(check_no_overlap(8, 8, 1).is_err());
        assert_eq!(check_no_overlap(8, 9, 1), Ok(()));
    }

    #[test]
    fn zero_sized_commands_are_rejected() {
        assert_eq!(
            check_non_empty("fill", 0),
            Err(Error::ZeroSize { what: "fill" })
        );
        assert_eq!(check_non_empty("fill", 1), Ok(()));
    }

    proptest::proptest! {
        #[test]
        fn check_range_agrees_with_wide_arithmetic(
            offset in 0usize..1 << 20, length in 0usize..1 << 20, capacity in 0usize..1 << 21
        ) {
            let fits = (offset as u128 + length as u128) <= capacity as u128;
            proptest::prop_assert_eq!(check_range(offset, length, capacity).is_ok(), fits);
        }

        #[test]
        fn overlap_agrees_with_a_byte_scan(s in 0u64..64, t in 0u64..64, len in 1usize..32) {
            let scan = (s..s + len as u64).any(|b| (t..t + len as u64).contains(&b));
            proptest::prop_assert_eq!(check_no_overlap(s, t, len).is_err(), scan);
        }
    }
}
