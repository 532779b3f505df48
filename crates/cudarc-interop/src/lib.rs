//! cudarc interop for cuhal: programs that already hold cudarc memory and streams use them
//! with cuhal queues, each runtime's stream ordering honoured in both directions through CUDA
//! events, with no host round trip.
//!
//! - a cudarc stream joined to a queue's timeline: [`QueueExt::wait_cudarc_stream`] (cuhal
//!   waits for everything enqueued on the stream so far: one `cuEventRecord` on it, then the
//!   queue's wait) and [`DeviceExt::cudarc_stream_wait`] (the stream waits for a semaphore
//!   value: one `cuStreamWaitEvent`);
//! - a cuhal timepoint as a `CUevent` for cudarc: [`cuhal::Device::export_timepoint`], typed
//!   for cudarc's raw calls by [`cudarc_event`];
//! - a cudarc slice (anything implementing cudarc's `DevicePtr` / `DevicePtrMut`) lent to cuhal
//!   as a buffer, a range and a binding-table entry: [`SliceLoan`], which waits for the
//!   slice's last cudarc uses (cudarc's read and write events) before cuhal's, and orders
//!   cudarc's later uses after cuhal's.
//!
//! cuhal's devices use the primary context, as cudarc's `CudaContext::new` does: a cudarc object
//! of another context is [`Error::OtherContext`]. cuhal itself never calls cudarc; this crate
//! makes its driver calls through cuhal (typed errors), and only the slice's own event tracking
//! goes through cudarc. cudarc loads the driver when first used and panics if it cannot: open
//! the cuhal device (which returns an error instead) before creating cudarc objects.
//!
//! ```no_run
//! use std::time::Duration;
//! use cudarc::driver::CudaContext;
//! use cuhal::{DeviceOptions, Driver, FillPattern};
//! use cuhal_cudarc::SliceLoan;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let device = Driver::load()?.open(0, DeviceOptions::default())?; // an error, not a panic
//! let stream = CudaContext::new(0)?.default_stream();
//! let mut slice = stream.alloc_zeros::<u32>(1024)?;
//! let (queue, done) = (device.queue(0), device.create_semaphore(0));
//! // SAFETY: the slice outlives cuhal's use: the loan is given back and the fill holds no handle.
//! let mut loan = unsafe { SliceLoan::lend_mut(&device, queue, &mut slice, &stream, &[(&done, 1)]) }?;
//! queue.fill(&[(&done, 1)], &[(&done, 2)], &loan.range(), FillPattern::U32(7))?;
//! loan.give_back(&done, 2, Duration::from_secs(5))?;
//! drop(loan);
//! assert!(stream.clone_dtoh(&slice)?.iter().all(|&x| x == 7)); // ordered after the fill
//! # Ok(()) }
//! ```

mod error;
mod slice;
mod stream;

/// The cudarc this crate is built against: a program that has no cudarc of its own uses this one.
pub use cudarc;
pub use error::{Error, Result};
pub use slice::SliceLoan;
pub use stream::{DeviceExt, QueueExt, cudarc_event};

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
