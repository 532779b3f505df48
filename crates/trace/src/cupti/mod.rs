//! FINE zones from CUPTI activity records: exact kernel, copy and fill times, also for graph
//! nodes, with no extra GPU work.
//!
//! - [`CuptiLibrary`] loads libcupti at run time (an explicit path, then [`LIBRARY_ENV`], then
//!   the loader's path); it is never linked.
//! - [`CuptiSession`] is the process's one subscription: concurrent-kernel, memcpy and memset
//!   activity into recycled buffers; a driver-API callback that captures the correlation id of
//!   every launch a thread makes while a [`CaptureGuard`] is open; a resource callback that maps
//!   the graph nodes CUPTI reports (the executable graph's clones) to the nodes cuhal added.
//! - [`records`] reads the versioned record structs by their stable prefixes ([`ffi`]).
//! - [`ClockMap`] puts CUPTI times on the trace clock.
//! - [`fake`] is a CUPTI in host memory for CI.
//! - [`cupti!`](crate::cupti!) calls an entry point and checks it, naming it once, as
//!   `cuhal_sys::cu!` does the driver's; [`cupti_name!`](crate::cupti_name!) is the name alone.
//!
//! When CUPTI cannot be had, [`CuptiError`] says why: the library is missing, or another
//! profiler holds CUPTI's one subscriber.

mod call;
mod error;
pub mod fake;
pub mod ffi;
mod load;
pub mod records;
mod session;

pub use error::CuptiError;
pub use ffi::CuptiApi;
pub use load::{CuptiLibrary, DEFAULT_LIBRARIES, LIBRARY_ENV};
pub use records::{Activity, ActivityKind};
pub use session::{
    ActivityWindow, BUFFER_BYTES, CaptureGuard, ClockMap, CuptiSession, MAX_BUFFERS, MAX_UNCLAIMED,
    REBASE_AFTER_NS, UNCLAIMED_AGE_NS,
};

#[cfg(test)]
mod sampling_tests;
#[cfg(test)]
mod tests;
