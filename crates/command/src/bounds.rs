//! [`check_range`]: whether `offset + length` bytes fit in a capacity, the check a buffer's
//! host copies and every [`BufferRange`](crate::BufferRange) make. It depends only on the
//! crate's error, so both `buffer` and `range` can use it.

use crate::Error;

/// Checks that `[offset, offset + length)` lies inside `capacity` bytes.
pub(crate) fn check_range(offset: usize, length: usize, capacity: usize) -> Result<(), Error> {
    let end = offset
        .checked_add(length)
        .ok_or(Error::RangeOverflow { offset, length })?;
    if end > capacity {
        return Err(Error::OutOfBounds {
            offset,
            length,
            capacity,
        });
    }
    Ok(())
}
