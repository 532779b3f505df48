//! `cargo xtask ci`: what `.ci/run` runs on a clean checkout without a GPU.

use anyhow::{Context, Result, bail};

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
    // Code behind features no other step turns on, kept compiling: the Tracy sink, and the GPU
    // suite's cudarc interop test (cudarc enters only through the optional interop crate).
    &[
        "clippy",
        "-p",
        "cuhal-trace",
        "-p",
        "cuhal-gpu-tests",
        "--features",
        "cuhal-trace/tracy,cuhal-gpu-tests/cudarc",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ],
    // Every library crate packs, and each packed crate builds on its own from its tarball (the
    // unpublished workspace crates it depends on come from cargo's local overlay of the
    // workspace). Test-only and internal packages (`publish = false`) are left out: nobody
    // depends on them, and verifying them would rebuild the GPU suite, the bench, the CLI and the
    // decoder.
    &[
        "package",
        "--workspace",
        "--locked",
        "--exclude",
        "cuhal-bench",
        "--exclude",
        "cuhal-cli",
        "--exclude",
        "cuhal-decoder",
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
/// runs), the scheduler's (listener hand-off, issue, completion, failure, shutdown), and the
/// resident ring's (descriptor hand-over, doorbell).
const LOOM_PACKAGES: &[&str] = &["cuhal-semaphore", "cuhal-scheduler", "cuhal-resident"];

/// The loom step: every model of the concurrency core, each explored up to two preemptions (as
/// tokio and crossbeam bound theirs), in a target directory of its own so that `--cfg loom` does
/// not invalidate the main build. Each model prints its name and how many interleavings it ran.
/// The models run optimized but without the release profile's whole-program optimization, which
/// would link every model binary as one unit for nothing a model measures.
fn loom_step() -> std::process::Command {
    let mut args = vec!["test", "--release", "--locked"];
    for package in LOOM_PACKAGES {
        args.extend(["-p", package]);
    }
    args.extend(["--test", "loom_*", "--", "--nocapture", "--test-threads=1"]);
    let mut cmd = cargo(args);
    cmd.env("RUSTFLAGS", "--cfg loom")
        .env("CARGO_PROFILE_RELEASE_LTO", "false")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16")
        .env("LOOM_MAX_PREEMPTIONS", "2")
        .env(
            "CARGO_TARGET_DIR",
            crate::cargo::workspace_root().join("target/loom"),
        );
    cmd
}

/// Removes this workspace's crates from cargo's unpacked copies of local registries.
///
/// `cargo package` verifies each crate against its siblings through a temporary local registry
/// (`target/package/tmp-registry`), and cargo unpacks registry crates into
/// `$CARGO_HOME/registry/src/<registry hash>/<name>-<version>` once: a directory that is already
/// there is reused as it is. The hash depends only on the registry's path, and the workspace's
/// version does not change from commit to commit, so a CI machine that keeps `$CARGO_HOME` between
/// runs of the same checkout path would verify a crate against its siblings' sources from an
/// earlier run. Only local registries (the directories whose name starts with `-`, having no host)
/// are touched; crates.io's copies stay.
fn clear_unpacked_workspace_crates() -> Result<()> {
    let home = match std::env::var_os("CARGO_HOME") {
        Some(home) => std::path::PathBuf::from(home),
        None => match std::env::var_os("HOME") {
            Some(home) => std::path::PathBuf::from(home).join(".cargo"),
            None => return Ok(()),
        },
    };
    let Ok(registries) = std::fs::read_dir(home.join("registry/src")) else {
        return Ok(());
    };
    for registry in registries.flatten() {
        if !registry.file_name().to_string_lossy().starts_with('-') {
            continue;
        }
        let Ok(crates) = std::fs::read_dir(registry.path()) else {
            continue;
        };
        for unpacked in crates.flatten() {
            if is_workspace_crate(&unpacked.file_name().to_string_lossy()) {
                std::fs::remove_dir_all(unpacked.path()).with_context(|| {
                    format!(
                        "removing stale unpacked crate {}",
                        unpacked.path().display()
                    )
                })?;
            }
        }
    }
    Ok(())
}

/// The package step's own target directory, emptied before each run.
///
/// Cargo fingerprints a registry crate by its name, version and registry, never by its contents,
/// so a kept target directory would also link a crate's verification against siblings compiled
/// from an earlier commit. The libraries' dependencies are few; building them again costs less
/// than a minute.
fn package_target_dir() -> std::path::PathBuf {
    crate::cargo::workspace_root().join("target/ci-package")
}

/// Whether an unpacked registry directory (`<name>-<version>`) is one of this workspace's crates.
fn is_workspace_crate(dir: &str) -> bool {
    let version = concat!("-", env!("CARGO_PKG_VERSION"));
    dir.strip_suffix(version)
        .is_some_and(|name| name == "cuhal" || name.starts_with("cuhal-"))
}

/// Runs every step, stopping at the first failure.
pub fn run() -> Result<()> {
    let total = STEPS.len() + 2;
    for (i, args) in STEPS.iter().enumerate() {
        let mut cmd = cargo(args.iter());
        if args.first() == Some(&"package") {
            // Fresh sources and fresh builds of the packed crates: see the two functions' docs.
            clear_unpacked_workspace_crates()?;
            let target = package_target_dir();
            if target.exists() {
                std::fs::remove_dir_all(&target)
                    .with_context(|| format!("removing {}", target.display()))?;
            }
            cmd.env("CARGO_TARGET_DIR", target);
        }
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
    eprintln!("xtask ci: [{doc}/{total}] {shown}");
    let st = status(&mut cmd)?;
    if !st.success() {
        bail!("step {doc}/{total} `{shown}` failed ({st}); later steps were not run");
    }
    let mut cmd = loom_step();
    let shown = display(&cmd);
    eprintln!("xtask ci: [{total}/{total}] {shown}");
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

#[cfg(test)]
mod tests {
    use super::is_workspace_crate;

    #[test]
    fn only_this_workspaces_crates_at_its_version_are_cleared() {
        let v = env!("CARGO_PKG_VERSION");
        assert!(is_workspace_crate(&format!("cuhal-{v}")));
        assert!(is_workspace_crate(&format!("cuhal-sys-{v}")));
        assert!(!is_workspace_crate(&format!("cuhalx-{v}")));
        assert!(!is_workspace_crate("cuhal-sys-0.0.0-other"));
        assert!(!is_workspace_crate(&format!("libloading-{v}")));
    }
}
