//! `cuhal info` as a user runs it: the built binary, with and without a driver.

use cuhal_sys::cu_name;
use std::path::PathBuf;
use std::process::{Command, Output};

use cuhal_fake_driver::driver;

/// The fake driver library cargo built for this test (a dev-dependency).
fn fake_driver() -> PathBuf {
    cuhal_fake_driver::harness::FakeDriver::built_library().unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `cuhal <args>` with the driver library `library` and the fake's settings `env`.
fn cuhal(args: &[&str], library: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cuhal"));
    cmd.args(args).env("CUHAL_CUDA_LIBRARY", library);
    for var in [
        "CUHAL_FAKE_HIDE",
        "CUHAL_FAKE_FAIL",
        "CUHAL_FAKE_DRIVER_VERSION",
        "CUHAL_FAKE_DEVICES",
        "CUHAL_FAKE_NO_PEER_ACCESS",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    cmd.output().expect("run cuhal")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn without_a_driver_one_line_and_exit_2() {
    let out = cuhal(&["info"], "/nonexistent/libcuda.so.1", &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(out.stdout.is_empty());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("no CUDA driver found"), "{stderr}");
    assert!(
        stderr.contains("/nonexistent/libcuda.so.1"),
        "says what was looked for: {stderr}"
    );
    assert!(
        stderr.contains("CUHAL_CUDA_LIBRARY"),
        "says how to point at a driver: {stderr}"
    );
    assert!(!stderr.contains("panicked"));
}

#[test]
fn lists_the_driver_and_every_device() {
    let lib = fake_driver();
    let out = cuhal(
        &["info"],
        lib.to_str().unwrap(),
        &[
            ("CUHAL_FAKE_DEVICES", "2"),
            ("CUHAL_FAKE_DRIVER_VERSION", "12080"),
        ],
    );
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {stdout}\nstderr: {}",
        text(&out.stderr)
    );
    assert!(
        stdout.starts_with(&format!("CUDA driver 12.8 ({})\n", lib.display())),
        "{stdout}"
    );
    for i in 0..2 {
        assert!(
            stdout.contains(&format!("device {i}: {}\n", driver::device_name(i))),
            "{stdout}"
        );
        assert!(
            stdout.contains(&format!("  pci bus id {}\n", driver::pci_bus_id(i))),
            "{stdout}"
        );
        assert!(
            stdout.contains(&format!("({} bytes)", driver::total_memory(i))),
            "{stdout}"
        );
    }
    assert!(
        stdout.contains("  compute capability 9.0, 132 multiprocessors\n"),
        "{stdout}"
    );
    assert!(stdout.contains("  memory 32.0 GiB"), "{stdout}");
    assert!(
        stdout.contains("  uuid GPU-face0000-0000-0000-0000-000000000001\n"),
        "{stdout}"
    );
    for pair in ["0 -> 1", "1 -> 0"] {
        assert!(
            stdout.contains(&format!(
                "  {pair}: peer access yes, link nvlink, native atomics yes, performance rank 0\n"
            )),
            "{stdout}"
        );
    }
}

#[test]
fn the_topology_says_when_devices_cannot_peer() {
    let lib = fake_driver();
    let out = cuhal(
        &["info"],
        lib.to_str().unwrap(),
        &[
            ("CUHAL_FAKE_DEVICES", "2"),
            ("CUHAL_FAKE_NO_PEER_ACCESS", "1"),
        ],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("  0 -> 1: peer access no, link none"),
        "{stdout}"
    );
}

#[test]
fn a_driver_without_devices_is_exit_3() {
    let lib = fake_driver();
    let lib = lib.to_str().unwrap();
    // The driver may fail cuInit with NO_DEVICE, or succeed and count none.
    let out = cuhal(
        &["info"],
        lib,
        &[("CUHAL_FAKE_FAIL", &format!("{}=100", cu_name!(cuInit)))],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("CUDA_ERROR_NO_DEVICE"), "{stderr}");

    let out = cuhal(&["info"], lib, &[("CUHAL_FAKE_DEVICES", "0")]);
    assert_eq!(out.status.code(), Some(3));
    assert!(text(&out.stdout).contains("no CUDA devices"));
}

#[test]
fn an_unusable_driver_is_exit_1_naming_the_problem() {
    let lib = fake_driver();
    let out = cuhal(
        &["info"],
        lib.to_str().unwrap(),
        &[("CUHAL_FAKE_HIDE", cu_name!(cuEventRecord))],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(cu_name!(cuEventRecord)), "{stderr}");
    assert!(!stderr.contains("panicked"));

    let out = cuhal(
        &["info"],
        lib.to_str().unwrap(),
        &[(
            "CUHAL_FAKE_FAIL",
            &format!("{}=999", cu_name!(cuDeviceGetName)),
        )],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{} failed: CUDA_ERROR_UNKNOWN",
            cu_name!(cuDeviceGetName)
        )),
        "{stderr}"
    );
}

#[test]
fn usage_errors_are_exit_64() {
    let out = cuhal(&["frobnicate"], "/nonexistent", &[]);
    assert_eq!(out.status.code(), Some(64));
    assert!(text(&out.stderr).contains("usage: cuhal"));
    let out = cuhal(&[], "/nonexistent", &[]);
    assert_eq!(out.status.code(), Some(64));
    let out = cuhal(&["--help"], "/nonexistent", &[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("info"));
}
