//! [`BindingError`]: why a slot range or a binding table was refused. `binding`, `range` and
//! the recorder report it; `error` wraps it (`Error::Binding`), so it depends on nothing else
//! of the crate.

use std::fmt;

use cuhal_sys::CUdeviceptr;

/// Why a slot range or a binding table was refused. Every one is found before anything
/// reaches the driver: at recording for slot ranges, at submission for tables.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BindingError {
    /// A command buffer created with more binding slots than a table may have
    /// ([`MAX_BINDING_CAPACITY`](crate::MAX_BINDING_CAPACITY)).
    CapacityTooLarge {
        /// The capacity asked for.
        capacity: u32,
        /// The largest capacity allowed.
        max: u32,
    },
    /// A slot at or past the command buffer's binding capacity (0 for a command buffer
    /// created without one).
    SlotOutOfCapacity {
        /// The slot named.
        slot: u32,
        /// The command buffer's binding capacity.
        capacity: u32,
    },
    /// A slot range where memory is needed: a queue operation, a stream command buffer, or an
    /// entry of a binding table.
    SlotRangeNotBound {
        /// What needed memory.
        what: &'static str,
        /// The slot the range names.
        slot: u32,
    },
    /// A binding table given to a command buffer recorded without slots.
    TableNotExpected {
        /// Entries in the table.
        given: usize,
    },
    /// No binding table for a command buffer that recorded slots.
    TableMissing {
        /// One past the highest slot the command buffer recorded.
        needed: usize,
    },
    /// A binding table with fewer entries than the highest slot recorded needs.
    TableTooShort {
        /// Entries in the table.
        given: usize,
        /// One past the highest slot the command buffer recorded.
        needed: usize,
    },
    /// A binding table with more entries than the command buffer's binding capacity.
    TableTooLong {
        /// Entries in the table.
        given: usize,
        /// The command buffer's binding capacity.
        capacity: u32,
    },
    /// A binding shorter than the largest extent (offset + length) recorded for its slot.
    BindingTooSmall {
        /// The slot.
        slot: u32,
        /// Length of the bound range.
        length: usize,
        /// The largest offset + length the command buffer uses in the slot.
        extent: usize,
    },
    /// A binding of memory of another device (context) than the command buffer's.
    BindingContext {
        /// The slot.
        slot: u32,
    },
    /// A binding whose address does not meet the alignment a recorded fill of the slot needs.
    BindingMisaligned {
        /// The slot.
        slot: u32,
        /// The bound range's address.
        address: CUdeviceptr,
        /// The alignment the slot's fills need (their pattern size).
        alignment: usize,
    },
    /// A copy whose source and target overlap once the table's addresses are substituted.
    OverlappingCopy {
        /// The copy's source address.
        source: CUdeviceptr,
        /// The copy's target address.
        target: CUdeviceptr,
        /// Bytes copied.
        length: usize,
    },
}

impl fmt::Display for BindingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BindingError::CapacityTooLarge { capacity, max } => write!(
                f,
                "a binding capacity of {capacity} slots is more than a binding table may have \
                 ({max})"
            ),
            BindingError::SlotOutOfCapacity { slot, capacity } => write!(
                f,
                "binding slot {slot} is outside the command buffer's binding capacity of \
                 {capacity}"
            ),
            BindingError::SlotRangeNotBound { what, slot } => write!(
                f,
                "{what} needs memory, not a range of binding slot {slot} (only a command \
                 buffer with a binding capacity records slots)"
            ),
            BindingError::TableNotExpected { given } => write!(
                f,
                "a binding table of {given} entries for a command buffer recorded without slots"
            ),
            BindingError::TableMissing { needed } => write!(
                f,
                "no binding table for a command buffer that uses {needed} slots"
            ),
            BindingError::TableTooShort { given, needed } => write!(
                f,
                "a binding table of {given} entries for a command buffer that uses {needed} slots"
            ),
            BindingError::TableTooLong { given, capacity } => write!(
                f,
                "a binding table of {given} entries for a binding capacity of {capacity}"
            ),
            BindingError::BindingTooSmall {
                slot,
                length,
                extent,
            } => write!(
                f,
                "binding slot {slot} is bound to {length} bytes; the command buffer uses \
                 {extent}"
            ),
            BindingError::BindingContext { slot } => write!(
                f,
                "binding slot {slot} is bound to memory of another device than the command \
                 buffer's"
            ),
            BindingError::BindingMisaligned {
                slot,
                address,
                alignment,
            } => write!(
                f,
                "binding slot {slot} is bound at {address:#x}, not a multiple of {alignment} \
                 as its fills need"
            ),
            BindingError::OverlappingCopy {
                source,
                target,
                length,
            } => write!(
                f,
                "with this binding table a copy of {length} bytes from {source:#x} to \
                 {target:#x} overlaps itself"
            ),
        }
    }
}
