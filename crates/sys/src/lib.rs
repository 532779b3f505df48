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
//! the driver's own name and description for it ([`DriverApi::check`]).
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
mod context;
mod error;
mod info;
mod nccl;
mod result;
pub mod types;

pub use api::{DEFAULT_LIBRARIES, DriverApi, LIBRARY_ENV, TABLE_CUDA_VERSION};
pub use context::{ContextGuard, PrimaryContext};
pub use error::{Error, LoadAttempt, format_cuda_version};
pub use info::{
    DeviceInfo, LinkKind, PeerLink, device_count, device_info, devices, peer_link, topology,
};
pub use nccl::{
    NCCL_DEFAULT_LIBRARIES, NCCL_IN_PROGRESS, NCCL_LIBRARY_ENV, NCCL_MIN_VERSION, NCCL_SUCCESS,
    NcclApi, NcclComm, NcclDataType, NcclError, NcclRedOp, NcclResult, NcclUniqueId,
    format_nccl_version,
};
pub use result::CUresult;
pub use types::*;
