//! A tiny fake `libcuda` for testing cuhal's driver loading without a GPU.
//!
//! Built as a `cdylib`, it is loaded exactly as the real driver is: `cuhal-sys` opens it,
//! finds `cuGetProcAddress_v2` (or `cuGetProcAddress`) with `dlsym`, and resolves its whole
//! table through it. The fake exports *only* those two resolvers and its control functions;
//! the driver functions it implements are reachable only through `cuGetProcAddress`, so a
//! load that succeeds proves the resolution path rather than a `dlsym` shortcut.
//!
//! What it implements ([`driver`], [`errors`]): `cuInit`, `cuDriverGetVersion`, device
//! enumeration and the facts `cuhal info` prints (name, compute capability, memory, UUID, PCI
//! bus id), `cuGetErrorName` and `cuGetErrorString`. Every other name resolves to a stub that
//! returns `CUDA_ERROR_NOT_SUPPORTED`, so a loader that needs a full table still loads.
//!
//! How tests steer it ([`control`], [`config`]):
//! - hide a symbol, so `cuGetProcAddress` reports it missing;
//! - make a function fail with a chosen `CUresult`;
//! - set the driver version and the number of devices;
//! - read back which names were requested, with which CUDA version and flags, through which
//!   resolver (v1 or v2).
//!
//! Settings start from environment variables (see [`config`]), which suits a child process
//! such as the `cuhal` binary, and can be changed through the exported `cuhal_fake_*`
//! functions, which suits a test that loads the library itself. Each copy of the `.so` on
//! disk is a separate instance with its own settings, so parallel tests copy it first.
//!
//! To test a driver without `cuGetProcAddress_v2` (CUDA 11.3 to 12.4), tests rename that
//! export in a copy of the file; see `tests/common/mod.rs`.

pub mod config;
pub mod control;
pub mod driver;
pub mod errors;
pub mod resolve;

/// `CUresult` values the fake returns (from `cuda.h`).
pub mod status {
    /// `CUDA_SUCCESS`.
    pub const SUCCESS: i32 = 0;
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub const INVALID_VALUE: i32 = 1;
    /// `CUDA_ERROR_NOT_INITIALIZED`.
    pub const NOT_INITIALIZED: i32 = 3;
    /// `CUDA_ERROR_STUB_LIBRARY`: what the toolkit's stub `libcuda.so` returns.
    pub const STUB_LIBRARY: i32 = 34;
    /// `CUDA_ERROR_NO_DEVICE`.
    pub const NO_DEVICE: i32 = 100;
    /// `CUDA_ERROR_INVALID_DEVICE`.
    pub const INVALID_DEVICE: i32 = 101;
    /// `CUDA_ERROR_NOT_FOUND`.
    pub const NOT_FOUND: i32 = 500;
    /// `CUDA_ERROR_NOT_SUPPORTED`.
    pub const NOT_SUPPORTED: i32 = 801;
    /// `CUDA_ERROR_UNKNOWN`.
    pub const UNKNOWN: i32 = 999;
}
