//! A fake `libcuda`: a simple, correct, synchronous GPU made of host memory, so cuhal's crates
//! run end to end on a CPU (in CI) exactly as they run on a GPU.
//!
//! Built as a `cdylib`, it is loaded exactly as the real driver is: `cuhal-sys` opens it,
//! finds `cuGetProcAddress_v2` (or `cuGetProcAddress`) with `dlsym`, and resolves its whole
//! table through it. The fake exports *only* those two resolvers and its control functions;
//! the driver functions it implements are reachable only through `cuGetProcAddress`, so a
//! load that succeeds proves the resolution path rather than a `dlsym` shortcut.
//!
//! What it implements, one module per concept:
//! - [`driver`]: `cuInit`, the version, devices and their attributes (compute capability 9.0,
//!   memory pools supported); [`errors`]: `cuGetErrorName`/`String`;
//! - [`context`]: primary contexts (retain/release) and each thread's current context;
//! - [`memory`]: device memory that is host memory (`std::alloc`, 256-byte aligned, every
//!   allocation registered so bad frees and leaks show), pinned host memory, memory pools and
//!   stream-ordered allocation;
//! - [`stream`]: streams and events of a synchronous GPU: work runs when enqueued, events are
//!   complete when recorded and carry the time of their record;
//! - [`transfer`]: fills and copies that really move bytes, range-checked;
//! - [`graph`]: graphs whose memset, memcpy and event nodes run in dependency order at launch;
//! - [`module`]: "PTX" whose `.entry` names become kernels; launches are checked and counted;
//! - [`resident`]: the resident queue's scheduler kernel, emulated by its rules when its graph
//!   is launched (device graph launch of executables instantiated for it).
//!
//! Every other name resolves to a stub that returns `CUDA_ERROR_NOT_SUPPORTED`, so a loader
//! that needs a full table still loads. Every implemented function goes through one door
//! (`entry`) that counts the call, applies injected faults ([`faults`]) and catches panics,
//! so none crosses the C ABI. Handles are ids looked up on every use, so a stale handle is
//! `CUDA_ERROR_INVALID_HANDLE`, never a crash. Everything is behind locks: any thread may call.
//!
//! How tests steer it ([`control`], [`config`], [`faults`], and [`harness`] for the Rust side):
//! - make the Nth call of a function (and optionally every later one) fail with a chosen
//!   `CUresult`, e.g. `cuEventQuery` with `CUDA_ERROR_ILLEGAL_ADDRESS` to simulate a fault;
//! - read back calls per function, kernel launches per name, and live objects ([`control::Counts`]);
//! - hide a symbol, set the driver version and the number of devices;
//! - read back which names were requested, with which CUDA version and flags, through which
//!   resolver (v1 or v2).
//!
//! Settings start from environment variables (see [`config`] and [`faults::FAIL_ENV`]), which
//! suits a child process such as the `cuhal` binary, and can be changed through the exported
//! `cuhal_fake_*` functions, which suits a test that loads the library itself. Each copy of
//! the `.so` on disk is a separate instance with its own state, so parallel tests copy it
//! first ([`harness::FakeDriver::private`]).

pub mod config;
pub mod context;
pub mod control;
pub mod driver;
mod entry;
pub mod errors;
pub mod faults;
pub mod graph;
pub mod harness;
pub mod memory;
pub mod module;
pub mod nccl;
pub mod resident;
pub mod resolve;
pub mod stream;
pub mod transfer;
mod world;

/// `CUresult` values the fake returns (from `cuda.h`).
pub mod status {
    /// `CUDA_SUCCESS`.
    pub const SUCCESS: i32 = 0;
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub const INVALID_VALUE: i32 = 1;
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    pub const OUT_OF_MEMORY: i32 = 2;
    /// `CUDA_ERROR_NOT_INITIALIZED`.
    pub const NOT_INITIALIZED: i32 = 3;
    /// `CUDA_ERROR_STUB_LIBRARY`: what the toolkit's stub `libcuda.so` returns.
    pub const STUB_LIBRARY: i32 = 34;
    /// `CUDA_ERROR_NO_DEVICE`.
    pub const NO_DEVICE: i32 = 100;
    /// `CUDA_ERROR_INVALID_DEVICE`.
    pub const INVALID_DEVICE: i32 = 101;
    /// `CUDA_ERROR_INVALID_IMAGE`.
    pub const INVALID_IMAGE: i32 = 200;
    /// `CUDA_ERROR_INVALID_CONTEXT`: no current context, or it is not active.
    pub const INVALID_CONTEXT: i32 = 201;
    /// `CUDA_ERROR_INVALID_PTX`.
    pub const INVALID_PTX: i32 = 218;
    /// `CUDA_ERROR_INVALID_HANDLE`.
    pub const INVALID_HANDLE: i32 = 400;
    /// `CUDA_ERROR_NOT_FOUND`.
    pub const NOT_FOUND: i32 = 500;
    /// `CUDA_ERROR_NOT_READY`.
    pub const NOT_READY: i32 = 600;
    /// `CUDA_ERROR_ILLEGAL_ADDRESS`: sticky, loses the context.
    pub const ILLEGAL_ADDRESS: i32 = 700;
    /// `CUDA_ERROR_LAUNCH_FAILED`: sticky, loses the context.
    pub const LAUNCH_FAILED: i32 = 719;
    /// `CUDA_ERROR_NOT_SUPPORTED`.
    pub const NOT_SUPPORTED: i32 = 801;
    /// `CUDA_ERROR_UNKNOWN`.
    pub const UNKNOWN: i32 = 999;
}
