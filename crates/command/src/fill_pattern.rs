//! [`FillPattern`]: the 1, 2 or 4 byte value a fill command repeats over its target. Ranges
//! check their alignment against it (`BufferRange::check_fill`); the recorder and every
//! encoder pass it on to the driver's memset.

use crate::Error;

/// A fill pattern: 1, 2 or 4 bytes, repeated over the target range.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum FillPattern {
    /// One byte.
    U8(u8),
    /// Two bytes (native byte order); offset and length must be multiples of 2.
    U16(u16),
    /// Four bytes (native byte order); offset and length must be multiples of 4.
    U32(u32),
}

impl FillPattern {
    /// A pattern from its bytes (in memory order); 1, 2 or 4 of them.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, Error> {
        match *bytes {
            [a] => Ok(FillPattern::U8(a)),
            [a, b] => Ok(FillPattern::U16(u16::from_ne_bytes([a, b]))),
            [a, b, c, d] => Ok(FillPattern::U32(u32::from_ne_bytes([a, b, c, d]))),
            _ => Err(Error::BadPattern {
                length: bytes.len(),
            }),
        }
    }

    /// The pattern's size in bytes.
    pub fn size(self) -> usize {
        match self {
            FillPattern::U8(_) => 1,
            FillPattern::U16(_) => 2,
            FillPattern::U32(_) => 4,
        }
    }

    /// The value widened to 32 bits, as memset nodes take it.
    pub fn value(self) -> u32 {
        match self {
            FillPattern::U8(v) => v.into(),
            FillPattern::U16(v) => v.into(),
            FillPattern::U32(v) => v,
        }
    }
}
