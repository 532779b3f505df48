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
];

/// Runs every step, stopping at the first failure.
pub fn run() -> Result<()> {
    let total = STEPS.len();
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
    eprintln!("xtask ci: all {total} steps passed");
    Ok(())
}
