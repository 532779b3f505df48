//! Helpers for cuhal's GPU conformance suite.
//!
//! The suite's tests live in `tests/<topic>.rs`, each one a test executable of its own and
//! every GPU test `#[ignore]`d, so `cargo test --workspace` builds them on machines without a
//! GPU and runs none. `cargo xtask gpu-test` builds them in release mode and runs them with
//! `--include-ignored --test-threads=1`, here or, through a bundle, on a GPU machine without
//! cargo (docs/gpu-testing.md). A test that loses its CUDA context on purpose lives in a file
//! of its own, so it cannot take other tests down with it.
//!
//! - [`gpu`]: the [`Gpu`](gpu::Gpu) fixture (driver, primary context made current, released
//!   on drop), device buffers, PTX modules with their JIT log, launches, a per-run random seed.
//! - [`cublas`]: cuBLAS loaded at run time, for the interop tests' library calls (the
//!   `cuhal-blas` crate, which the bench's library case uses too).
//! - [`kernels`]: the test kernels, hand-written PTX that the driver compiles at load time,
//!   so building the suite needs no CUDA toolkit; [`hopper_kernels`]: the `sm_90` kernels of the
//!   launch-attribute and indirect-dispatch tests.
//! - [`skip`]: how a test that cannot run on the machine it finds says so, so that the bundle's
//!   `run` counts it as skipped rather than passed.

pub mod command_support;
pub use cuhal_blas as cublas;
pub mod device_support;
pub mod gpu;
pub mod hopper_kernels;
pub mod kernels;
pub mod skip;
pub mod trace_support;
