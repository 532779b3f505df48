//! Raw CUDA driver symbols, loaded at run time.
//!
//! `cuhal-sys` is the only crate of cuhal that opens the driver library. It does so when asked
//! ([`DriverApi::load`]), never at link time, so every cuhal binary builds and starts on a machine
//! without a GPU or a CUDA toolkit, and says clearly what is missing instead of failing to start.
//!
//! The story of a load:
//! 1. open `libcuda.so.1` (then `libcuda.so`), or the path in [`LIBRARY_ENV`];
//! 2. find `cuGetProcAddress_v2` (or `cuGetProcAddress` on older drivers) with `dlsym`;
//! 3. resolve every entry of [`DriverApi`] through it under [`TABLE_CUDA_VERSION`], so each
//!    function pointer has exactly the signature this crate declares, whatever newer variants
//!    the driver also exports; a required symbol that is missing is an [`Error::MissingSymbol`]
//!    naming it and the driver's version; optional (newer) entries are `Option`s;
//! 4. `cuInit(0)`.
//!
//! Every failed call becomes an [`Error::Cuda`] carrying the call's name, the [`CUresult`] and
//! the driver's own name and description for it ([`DriverApi::check`], through [`cu!`]).
//!
//! ## Calling the driver
//!
//! Every driver call goes through [`cu!`], which names the function once and checks its result
//! (IREE's `IREE_CUDA_RETURN_IF_ERROR(syms, cuX(...))`):
//!
//! ```no_run
//! use cuhal_sys::{CUdeviceptr, DriverApi, cu};
//!
//! fn zero(api: &DriverApi, dst: CUdeviceptr, bytes: usize) -> Result<(), cuhal_sys::Error> {
//!     // SAFETY: `dst` is a live allocation of at least `bytes` bytes in the current context.
//!     unsafe { cu!(api, cuMemsetD8Async(dst, 0, bytes, std::ptr::null_mut())) }
//! }
//! ```
//!
//! - `cu!(api, cuX(args))` is `Result<(), Error>`; an error names `cuX`, the `CUresult` and the
//!   driver's words for it. The name comes from the identifier, so it cannot drift from the call.
//! - `cu!(ready: api, cuX(args))` is `Result<bool, Error>`, `false` for `CUDA_ERROR_NOT_READY`
//!   (queries).
//! - `cu!(optional: api, cuX(args))` calls an entry newer than the table's base version, and is
//!   an [`Error::MissingSymbol`] where the driver lacks it.
//! - [`cu_name!`]`(cuX)` is the name alone, checked against the table at compile time, for code
//!   that speaks of a call without making it (tests steering a fake driver, messages).
//!
//! A new driver function is one line in the table of `api.rs` (its signature from `cuda.h`);
//! calls to it then need nothing else. NCCL's table ([`NcclApi`]) is called the same way:
//! [`nccl!`]`(api, ncclX(args))` is `Result<(), NcclError>` naming `ncclX`, and [`nccl_name!`] is
//! the name alone. No other crate of cuhal writes a driver or NCCL function's name as a string
//! (a test of xtask reads every crate's string literals to keep it so).
//!
//! ## Owned objects
//!
//! [`Stream`], [`Event`], [`Module`] (with the JIT's logs) and [`MappedHostMemory`] own their
//! driver object: created with the context made current, destroyed on drop on any thread,
//! keeping the [`PrimaryContext`] alive meanwhile. Every crate above uses them rather than wrapping the raw
//! handles again.
//!
//! ```no_run
//! use std::sync::Arc;
//! use cuhal_sys::{CU_EVENT_DISABLE_TIMING, CU_STREAM_NON_BLOCKING, DriverApi, Event, PrimaryContext, Stream};
//!
//! let api = Arc::new(DriverApi::load()?);
//! let context = PrimaryContext::retain(api, 0)?;
//! let stream = Stream::new(&context, CU_STREAM_NON_BLOCKING)?;
//! let done = Event::new(&context, CU_EVENT_DISABLE_TIMING)?;
//! done.record_and_synchronize(&stream)?;
//! # Ok::<(), cuhal_sys::Error>(())
//! ```
//!
//! The C types (`types`) are written by hand from `cuda.h` (no bindgen, no toolkit at build
//! time), with their layouts asserted at compile time.
//!
//! ```no_run
//! let api = cuhal_sys::DriverApi::load()?;
//! println!("CUDA driver {}", cuhal_sys::format_cuda_version(api.driver_version()));
//! for device in cuhal_sys::devices(&api)? {
//!     println!("{}: {}", device.ordinal, device.name);
//! }
//! # Ok::<(), cuhal_sys::Error>(())
//! ```

mod api;
mod call;
mod context;
mod error;
mod info;
pub mod library;
mod mapped;
mod nccl;
mod objects;
mod result;
pub mod types;

pub use api::{DEFAULT_LIBRARIES, DriverApi, LIBRARY_ENV, TABLE_CUDA_VERSION};
pub use context::{ContextGuard, PrimaryContext};
pub use error::{Error, LoadAttempt, format_cuda_version};
pub use info::{
    DeviceInfo, LinkKind, PeerLink, device_count, device_info, devices, peer_link, topology,
};
pub use mapped::MappedHostMemory;
pub use nccl::{
    NCCL_DEFAULT_LIBRARIES, NCCL_IN_PROGRESS, NCCL_LIBRARY_ENV, NCCL_MIN_VERSION, NCCL_SUCCESS,
    NcclApi, NcclComm, NcclDataType, NcclError, NcclRedOp, NcclResult, NcclUniqueId,
    format_nccl_version,
};
pub use objects::{Event, Module, Stream, cubin_for, cubin_from_dir_or, elapsed_ms};
pub use result::CUresult;
pub use types::*;

/// The README's examples, compiled (and run where they need no GPU) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
