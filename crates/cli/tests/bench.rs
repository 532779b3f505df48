//! `cuhal bench` as a user runs it: the built binary, without a driver, with a driver that
//! cannot run kernels, and on the CPU-only case.

use cuhal_sys::cu_name;
use std::path::PathBuf;
use std::process::{Command, Output};

/// The fake driver library cargo built for this test (a dev-dependency).
fn fake_driver() -> PathBuf {
    cuhal_fake_driver::harness::FakeDriver::built_library().unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `cuhal bench <args>` with the driver library `library` and the fake's settings `env`.
fn bench_with(args: &[&str], library: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cuhal"));
    cmd.arg("bench")
        .args(args)
        .env("CUHAL_CUDA_LIBRARY", library);
    for var in [
        "CUHAL_FAKE_HIDE",
        "CUHAL_FAKE_FAIL",
        "CUHAL_FAKE_DRIVER_VERSION",
        "CUHAL_FAKE_DEVICES",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    cmd.output().expect("run cuhal")
}

/// Runs `cuhal bench <args>` with the driver library `library`.
fn bench(args: &[&str], library: &str) -> Output {
    bench_with(args, library, &[])
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "cuhal-bench-test-{}-{name}.json",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    path
}

#[test]
fn without_a_driver_one_line_and_exit_2() {
    let json = scratch("nodriver");
    let out = bench(
        &["--json", json.to_str().unwrap()],
        "/nonexistent/libcuda.so.1",
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("no CUDA driver found"), "{stderr}");
    assert!(stderr.contains("CUHAL_CUDA_LIBRARY"), "{stderr}");
    assert!(out.stdout.is_empty());
    assert!(!json.exists(), "no results without a run");
}

#[test]
fn usage_errors_are_exit_64() {
    let out = bench(&["--case", "warp"], "/nonexistent/libcuda.so.1");
    assert_eq!(out.status.code(), Some(64));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("unknown case \"warp\""), "{stderr}");
    assert!(stderr.contains("usage: cuhal bench"), "{stderr}");
}

#[test]
fn a_driver_that_cannot_run_kernels_fails_naming_the_call() {
    // The fake driver cannot run kernels; here its primary context cannot even be retained.
    let json = scratch("fake");
    let out = bench_with(
        &[
            "--quick",
            "--case",
            "round-trip",
            "--json",
            json.to_str().unwrap(),
        ],
        fake_driver().to_str().unwrap(),
        &[(
            "CUHAL_FAKE_FAIL",
            &format!("{}=801", cu_name!(cuDevicePrimaryCtxRetain)),
        )],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains(cu_name!(cuDevicePrimaryCtxRetain)),
        "{stderr}"
    );
    assert!(stderr.contains("CUDA_ERROR_NOT_SUPPORTED"), "{stderr}");
}

#[test]
fn the_cpu_case_runs_without_a_driver_and_writes_json() {
    let json = scratch("scheduler");
    let out = bench(
        &[
            "--quick",
            "--case",
            "scheduler",
            "--json",
            json.to_str().unwrap(),
        ],
        "/nonexistent/libcuda.so.1",
    );
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {stderr}\nstdout: {stdout}"
    );
    assert!(
        stdout.contains(
            "| case | cuhal median | cuhal p99 | floor median | floor p99 | ratio | goal | met? |"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("| 7. scheduler: per action"), "{stdout}");
    assert!(stdout.contains("100000 pending"), "{stdout}");
    assert!(
        stderr.contains("case 7 (scheduler)"),
        "progress goes to stderr: {stderr}"
    );
    let written = std::fs::read_to_string(&json).expect("the JSON file");
    assert!(written.starts_with('{') && written.trim_end().ends_with('}'));
    assert!(written.contains("\"case\": \"7\""), "{written}");
    assert!(written.contains("\"median\": "), "{written}");
    let _ = std::fs::remove_file(&json);
}
