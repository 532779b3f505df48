//! The device-visible semaphore values ([`SlotTable`]) and the completion words
//! ([`Completion`]), both words in [`SharedMemory`](crate::SharedMemory).
//!
//! A slot holds a semaphore's value, or [`FAILED`] (the top bit) once it failed. Writers only
//! raise a slot (`fetch_max`, a device `atomicMax`): values never go back, and a failure, above
//! every value, stays.

use crate::sync::{AtomicU64, Ordering};

/// The slot word of a failed semaphore; values must stay below it.
pub const FAILED: u64 = 1 << 63;

/// What a slot says about a wait for a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// The value is reached.
    Reached,
    /// Not yet.
    Pending,
    /// The semaphore failed.
    Failed,
}

/// Operations on a table of slot words.
pub struct SlotTable;

impl SlotTable {
    /// Whether `slot` reached `value`.
    pub fn state(slot: &AtomicU64, value: u64) -> SlotState {
        let word = slot.load(Ordering::Acquire);
        if word & FAILED != 0 {
            SlotState::Failed
        } else if word >= value {
            SlotState::Reached
        } else {
            SlotState::Pending
        }
    }

    /// Raises `slot` to `value` (release): a signal.
    pub fn publish(slot: &AtomicU64, value: u64) {
        slot.fetch_max(value, Ordering::AcqRel);
    }

    /// Marks `slot` failed.
    pub fn fail(slot: &AtomicU64) {
        slot.fetch_max(FAILED, Ordering::AcqRel);
    }
}

/// How the consumer finished a submission: the completion word it writes is
/// `sequence << 3 | state`, so a stale word (an earlier lap of the ring) never reads as this
/// submission's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// Launched; its signals are published.
    Done,
    /// Its launch failed; its signal slots are failed.
    LaunchFailed,
    /// A wait failed; its signal slots are failed.
    WaitFailed,
    /// The queue shut down before its waits were reached; its signal slots are failed.
    Shutdown,
    /// The queue was lost before it launched; its signal slots are failed.
    Lost,
}

impl Completion {
    /// The word for `sequence`.
    pub fn encode(self, sequence: u64) -> u64 {
        let state = match self {
            Completion::Done => 1,
            Completion::LaunchFailed => 2,
            Completion::WaitFailed => 3,
            Completion::Shutdown => 4,
            Completion::Lost => 5,
        };
        (sequence << 3) | state
    }

    /// The completion of `sequence`, if `word` is its.
    pub fn decode(word: u64, sequence: u64) -> Option<Completion> {
        if word >> 3 != sequence & (u64::MAX >> 3) {
            return None;
        }
        match word & 7 {
            1 => Some(Completion::Done),
            2 => Some(Completion::LaunchFailed),
            3 => Some(Completion::WaitFailed),
            4 => Some(Completion::Shutdown),
            5 => Some(Completion::Lost),
            _ => None,
        }
    }
}
