//! [`Descriptor`]: one submission as the device scheduler reads it, laid out field by field.
//!
//! The layout is the contract between the host and the scheduler kernel, so it is `#[repr(C)]`
//! with every size and offset asserted at compile time. 256 bytes: two 128-byte lines of the
//! GPU's L2, read by one warp in one pass.
//!
//! | offset | size | field | meaning |
//! |---:|---:|---|---|
//! | 0 | 8 | `sequence` | the submission's number in its ring (0, 1, 2, ...); the consumer checks it against its own count, so a torn or stale slot is caught |
//! | 8 | 8 | `executable` | the executable's handle (on the device, a `CUgraphExec` instantiated for device launch) |
//! | 16 | 8 | `bindings` | the binding table's device address, 0 when the command buffer has no slots |
//! | 24 | 4 | `wait_count` | how many entries of `waits` are used (at most [`MAX_WAITS`]) |
//! | 28 | 4 | `signal_count` | how many entries of `signals` are used (at most [`MAX_SIGNALS`]) |
//! | 32 | 8 | `flags` | reserved, 0 |
//! | 40 | 96 | `waits` | [`SlotValue`]s: semaphore slot index and the value to wait for |
//! | 136 | 96 | `signals` | [`SlotValue`]s: semaphore slot index and the value to publish |
//! | 232 | 24 | `reserved` | 0; room for a tracing slot and a completion address |

use std::mem::{offset_of, size_of};

/// The most waits one resident submission carries (more is [`Refusal::TooManyWaits`](crate::Refusal::TooManyWaits)).
pub const MAX_WAITS: usize = 6;
/// The most signals one resident submission carries (more is [`Refusal::TooManySignals`](crate::Refusal::TooManySignals)).
pub const MAX_SIGNALS: usize = 6;

/// A semaphore slot and a value: a wait (`slot` reaches `value`) or a signal (`slot` is set to
/// `value`). 16 bytes: `value` at 0, `slot` at 8, 4 reserved bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotValue {
    /// The value waited for or published.
    pub value: u64,
    /// The index in the queue's [`SlotTable`](crate::SlotTable).
    pub slot: u32,
    /// 0.
    pub reserved: u32,
}

/// One submission in the ring (see the module's table for the layout).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// The submission's number in its ring.
    pub sequence: u64,
    /// The executable's handle.
    pub executable: u64,
    /// The binding table's device address, or 0.
    pub bindings: u64,
    /// Used entries of `waits`.
    pub wait_count: u32,
    /// Used entries of `signals`.
    pub signal_count: u32,
    /// Reserved, 0.
    pub flags: u64,
    /// The waits.
    pub waits: [SlotValue; MAX_WAITS],
    /// The signals.
    pub signals: [SlotValue; MAX_SIGNALS],
    /// Reserved, 0.
    pub reserved: [u64; 3],
}

impl Descriptor {
    /// The used waits.
    pub fn waits(&self) -> &[SlotValue] {
        &self.waits[..(self.wait_count as usize).min(MAX_WAITS)]
    }

    /// The used signals.
    pub fn signals(&self) -> &[SlotValue] {
        &self.signals[..(self.signal_count as usize).min(MAX_SIGNALS)]
    }
}

const _: () = {
    assert!(size_of::<SlotValue>() == 16);
    assert!(offset_of!(SlotValue, value) == 0);
    assert!(offset_of!(SlotValue, slot) == 8);
    assert!(size_of::<Descriptor>() == 256);
    assert!(offset_of!(Descriptor, sequence) == 0);
    assert!(offset_of!(Descriptor, executable) == 8);
    assert!(offset_of!(Descriptor, bindings) == 16);
    assert!(offset_of!(Descriptor, wait_count) == 24);
    assert!(offset_of!(Descriptor, signal_count) == 28);
    assert!(offset_of!(Descriptor, flags) == 32);
    assert!(offset_of!(Descriptor, waits) == 40);
    assert!(offset_of!(Descriptor, signals) == 136);
    assert!(offset_of!(Descriptor, reserved) == 232);
};
