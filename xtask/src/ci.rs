//! `cargo xtask ci`: what `.ci/run` runs on a clean checkout without a GPU.

use anyhow::{Result, bail};

use crate::cargo::{cargo, display, status};

/// The CI steps, in order: cheap checks first so a formatting slip fails in
/// seconds rather than after a full build.
const STEPS: &[&[&str]] = &[
    &["fmt", "--all", "--check"],
    &[
        "clippy",
        "--workspace",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ],
    &["test", "--workspace", "--locked"],
    // The fault sweep already ran above; again with its output shown, so CI's log carries its
    // size and results (runs, survived, panics, hangs, leaks). Nothing is rebuilt.
    &[
        "test",
        "-p",
        "cuhal",
        "--locked",
        "--test",
        "fault_sweep",
        "--",
        "--nocapture",
    ],
    // The Tracy sink is behind a feature that no other step turns on; keep it compiling.
    &[
        "clippy",
        "-p",
        "cuhal-trace",
        "--features",
        "tracy",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ],
    // Every library crate packs, and each packed crate builds on its own from its tarball (the
    // unpublished workspace crates it depends on come from cargo's local overlay of the
    // workspace). Test-only and internal packages (`publish = false`) are left out: nobody
    // depends on them, and verifying them would rebuild the GPU suite, the bench and the CLI.
    &[
        "package",
        "--workspace",
        "--locked",
        "--exclude",
        "cuhal-bench",
        "--exclude",
        "cuhal-cli",
        "--exclude",
        "cuhal-fake-driver",
        "--exclude",
        "cuhal-gpu-tests",
        "--exclude",
        "xtask",
    ],
];

/// The documentation step: every crate's docs, with rustdoc's warnings (broken links, the
/// binary and library `cuhal` colliding in target/doc) as errors.
fn doc_step() -> std::process::Command {
    let mut cmd = cargo(["doc", "--workspace", "--no-deps", "--locked"]);
    cmd.env("RUSTDOCFLAGS", "-D warnings");
    cmd
}

/// The packages with loom models (`tests/loom_*.rs`, compiled only under `--cfg loom`): the
/// semaphore's own models and its slot pool's (the bookkeeping the device crate's event pool
/// runs), and the scheduler's (listener hand-off, issue, completion, failure, shutdown).
const LOOM_PACKAGES: &[&str] = &["cuhal-semaphore", "cuhal-scheduler"];

/// The loom step: every model of the concurrency core, each explored up to two preemptions (as
/// tokio and crossbeam bound theirs), in a target directory of its own so that `--cfg loom` does
/// not invalidate the main build. Each model prints its name and how many interleavings it ran.
fn loom_step() -> std::process::Command {
    let mut args = vec!["test", "--release", "--locked"];
    for package in LOOM_PACKAGES {
        args.extend(["-p", package]);
    }
    args.extend(["--test", "loom_*", "--", "--nocapture", "--test-threads=1"]);
    let mut cmd = cargo(args);
    cmd.env("RUSTFLAGS", "--cfg loom")
        .env("LOOM_MAX_PREEMPTIONS", "2")
        .env(
            "CARGO_TARGET_DIR",
            crate::cargo::workspace_root().join("target/loom"),
        );
    cmd
}

/// Runs every step, stopping at the first failure.
pub fn run() -> Result<()> {
    let total = STEPS.len() + 2;
    for (i, args) in STEPS.iter().enumerate() {
        let mut cmd = cargo(args.iter());
        let shown = display(&cmd);
        eprintln!("xtask ci: [{}/{total}] {shown}", i + 1);
        let st = status(&mut cmd)?;
        if !st.success() {
            bail!(
                "step {}/{total} `{shown}` failed ({st}); later steps were not run",
                i + 1
            );
        }
    }
    let doc = STEPS.len() + 1;
    let mut cmd = doc_step();
    let shown = display(&cmd);
    eprintln!("xtask ci: [{doc}/{total}] RUSTDOCFLAGS=\"-D warnings\" {shown}");
    let st = status(&mut cmd)?;
    if !st.success() {
        bail!("step {doc}/{total} `{shown}` failed ({st}); later steps were not run");
    }
    let mut cmd = loom_step();
    let shown = display(&cmd);
    eprintln!(
        "xtask ci: [{total}/{total}] RUSTFLAGS=\"--cfg loom\" LOOM_MAX_PREEMPTIONS=2 \
         CARGO_TARGET_DIR=target/loom {shown}"
    );
    let started = std::time::Instant::now();
    let st = status(&mut cmd)?;
    if !st.success() {
        bail!("step {total}/{total} (loom models) failed ({st})");
    }
    eprintln!(
        "xtask ci: loom models passed in {:.1} s (build included)",
        started.elapsed().as_secs_f64()
    );
    eprintln!("xtask ci: all {total} steps passed");
    Ok(())
}
