//! `cargo xtask gpu-test`: build the GPU suite in release mode, then run it
//! here when a driver is present, or bundle it for a GPU machine without cargo.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

use crate::bundle::{self, TestBinary};
use crate::cargo::{build_executables, cargo, from_root, status, target_dir};

/// Options of `cargo xtask gpu-test`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Fail when no driver or device is found, instead of skipping.
    pub require_gpu: bool,
    /// Write a bundle to this directory (relative to the workspace root) instead of running.
    pub bundle: Option<PathBuf>,
    /// Extra arguments for every test binary (e.g. a name filter).
    pub test_args: Vec<String>,
}

/// The package holding the GPU suite.
const SUITE: &str = "cuhal-gpu-tests";

pub fn run(opts: &Options) -> Result<ExitCode> {
    let tests = build_suite()?;
    let cuhal = build_cli()?;

    if let Some(dir) = &opts.bundle {
        let dir = from_root(dir);
        write_bundle(&dir, &cuhal, &tests)?;
        let decoder = build_decoder()?;
        let size = bundle::write_decoder(
            &dir,
            &decoder,
            &from_root(std::path::Path::new("crates/decoder/scripts/compare.py")),
        )?;
        println!(
            "bundle {}: {} with the decoder (bin/cuhal-decoder, decoder/compare.py)",
            dir.display(),
            bundle::human(size)
        );
        if size >= bundle::MAX_BYTES {
            bail!(
                "the bundle is {}, over the {} limit",
                bundle::human(size),
                bundle::human(bundle::MAX_BYTES)
            );
        }
        println!(
            "bundle ready: copy {} to the GPU machine and run its `run` ({} test binaries)",
            dir.display(),
            tests.len()
        );
        return Ok(ExitCode::SUCCESS);
    }

    match probe_driver(&cuhal)? {
        Probe::Ready => {}
        Probe::Missing { what, detail } => {
            println!("no CUDA {what} found: GPU suite built but not run");
            if !detail.is_empty() {
                println!("  (`cuhal info`: {detail})");
            }
            return Ok(if opts.require_gpu {
                eprintln!("xtask: --require-gpu was given, so this is a failure");
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            });
        }
    }

    // Run through the same script a bundle uses, so the counting that the GPU
    // machine relies on is the one exercised here too.
    let dir = target_dir().join("gpu-test");
    write_bundle(&dir, &cuhal, &tests)?;
    let st = status(
        Command::new("bash")
            .arg(dir.join("run"))
            .args(&opts.test_args),
    )?;
    Ok(if st.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Builds every test target of the suite in release mode.
fn build_suite() -> Result<Vec<TestBinary>> {
    let built = build_executables(cargo([
        "test",
        "--release",
        "-p",
        SUITE,
        "--features",
        "cudarc",
        "--no-run",
    ]))?;
    let tests: Vec<TestBinary> = built
        .into_iter()
        .filter(|e| e.test)
        .map(|e| TestBinary {
            name: e.name,
            path: e.path,
        })
        .collect();
    if tests.is_empty() {
        bail!("`cargo test -p {SUITE} --no-run` reported no test executables");
    }
    Ok(tests)
}

/// Builds the `cuhal` binary in release mode and returns its path.
pub fn build_cli() -> Result<PathBuf> {
    build_executables(cargo([
        "build",
        "--release",
        "-p",
        "cuhal-cli",
        "--bin",
        "cuhal",
    ]))?
    .into_iter()
    .find(|e| e.name == "cuhal" && !e.test)
    .map(|e| e.path)
    .context("`cargo build -p cuhal-cli` reported no `cuhal` executable")
}

/// Builds the `cuhal-decoder` binary in release mode and returns its path.
fn build_decoder() -> Result<PathBuf> {
    build_executables(cargo([
        "build",
        "--release",
        "-p",
        "cuhal-decoder",
        "--bin",
        "cuhal-decoder",
    ]))?
    .into_iter()
    .find(|e| e.name == "cuhal-decoder" && !e.test)
    .map(|e| e.path)
    .context("`cargo build -p cuhal-decoder` reported no `cuhal-decoder` executable")
}

fn write_bundle(
    dir: &std::path::Path,
    cuhal: &std::path::Path,
    tests: &[TestBinary],
) -> Result<()> {
    let size = bundle::write(dir, cuhal, tests)?;
    println!("bundle {}: {}", dir.display(), bundle::human(size));
    if size >= bundle::MAX_BYTES {
        bail!(
            "the bundle is {}, over the {} limit",
            bundle::human(size),
            bundle::human(bundle::MAX_BYTES)
        );
    }
    Ok(())
}

/// What `cuhal info` says about this machine.
enum Probe {
    Ready,
    /// `what` is "driver" or "device"; `detail` is cuhal's own explanation.
    Missing {
        what: &'static str,
        detail: String,
    },
}

/// Exit codes of `cuhal info` (see crates/cli): 2 = no driver library, 3 = a
/// driver but no usable device.
fn probe_driver(cuhal: &std::path::Path) -> Result<Probe> {
    let out = Command::new(cuhal)
        .arg("info")
        .output()
        .with_context(|| format!("could not run {} info", cuhal.display()))?;
    let detail = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    match out.status.code() {
        Some(0) => Ok(Probe::Ready),
        Some(2) => Ok(Probe::Missing {
            what: "driver",
            detail,
        }),
        Some(3) => Ok(Probe::Missing {
            what: "device",
            detail,
        }),
        _ => bail!(
            "`cuhal info` failed ({}), so the GPU suite was not run:\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            detail
        ),
    }
}
