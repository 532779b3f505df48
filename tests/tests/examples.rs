//! GPU suite: the runnable examples, run as tests so every GPU run checks what the
//! documentation shows (CI builds them; only a GPU runs them).

use cuhal_gpu_tests::device_support::driver;

/// `crates/bench/examples/interop.rs`, the worked examples of docs/interop.md: a foreign buffer
/// and event in, a timepoint out to a foreign stream, a cuBLAS GEMM in a graph command buffer.
#[path = "../../crates/bench/examples/interop.rs"]
// Its `main` is the example's entry point, not the test's.
#[allow(dead_code)]
mod interop_example;

#[test]
#[ignore = "needs a CUDA GPU (cargo xtask gpu-test)"]
fn the_interop_example_runs_every_step() {
    interop_example::run(driver(), true).unwrap_or_else(|e| panic!("the interop example: {e}"));
}
