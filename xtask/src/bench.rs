//! `cargo xtask bench`: build `cuhal` in release mode and run `cuhal bench`,
//! or bundle it for the GPU machine.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{Result, bail};

use crate::bundle;
use crate::cargo::{from_root, status};
use crate::gpu_test::build_cli;

/// Options of `cargo xtask bench`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Write `bin/cuhal` and `bench` to this directory instead of running.
    pub bundle: Option<PathBuf>,
    /// Arguments for `cuhal bench`.
    pub args: Vec<String>,
}

pub fn run(opts: &Options) -> Result<ExitCode> {
    let cuhal = build_cli()?;
    if let Some(dir) = &opts.bundle {
        let dir = from_root(dir);
        let size = bundle::write_bench(&dir, &cuhal)?;
        println!("bundle {}: {}", dir.display(), bundle::human(size));
        if size >= bundle::MAX_BYTES {
            bail!(
                "the bundle is {}, over the 64 MiB limit",
                bundle::human(size)
            );
        }
        println!("run {}/bench on the GPU machine", dir.display());
        return Ok(ExitCode::SUCCESS);
    }
    let st = status(Command::new(&cuhal).arg("bench").args(&opts.args))?;
    Ok(if st.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
