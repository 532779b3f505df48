//! Storage kept for reuse, for cuhal's submission path: one policy for every list that a
//! submission fills and its completion empties.
//!
//! A submission in cuhal writes the same kinds of lists every time: its waits and signals, the
//! resources it holds, its completion event from a pool, its binding tables, its timepoints on a
//! semaphore, its tracing slot. Allocating them anew per submission would cost more than the
//! driver calls they describe, so each is kept once emptied and reused, and the policy for that is
//! [`Recycled`]:
//!
//! - grow by doubling from a named start (`START`, a const parameter), so a list or pool whose
//!   high-water mark creeps up allocates a handful of times, not at every new mark;
//! - keep the room reached, and keep spilled storage: a `SmallVec` that once went past its inline
//!   room keeps its heap storage, so the next submission of that size allocates nothing;
//! - warm the slot written next ([`prefetch`]): the thread that empties a list runs on another
//!   core than the one that fills it next, and the hint hides that transfer behind the driver
//!   calls in between.
//!
//! A pool of reusable objects is a `Recycled` list of spare ones: [`Recycled::refill`] makes as
//! many as [`Recycled::next_capacity`] allows when it runs dry, so the objects made double too.
//!
//! ```
//! use cuhal_recycle::Recycled;
//! use smallvec::SmallVec;
//!
//! // Four inline, then 16, 32... on the heap, kept once spilled.
//! let mut waits = Recycled::<SmallVec<[u64; 4]>, 16>::new();
//! waits.extend(0..5);
//! assert!(waits.spilled());
//! assert_eq!(waits.capacity(), 16);
//! waits.clear();
//! assert!(waits.spilled());
//! ```
//!
//! The crate's one `unsafe` block is the prefetch instruction ([`prefetch`]).

#![deny(unsafe_code)]

pub mod prefetch;
mod recycled;
mod storage;

pub use recycled::Recycled;
pub use storage::Storage;
