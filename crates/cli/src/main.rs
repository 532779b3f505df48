//! `cuhal`: the command-line face of cuhal.
//!
//! - `cuhal info`: the CUDA driver and every device it sees.
//! - `cuhal demo`: a traced two-queue pipeline on the GPU (or on the CPU host backend without
//!   one).
//! - `cuhal bench`: cuhal against the raw driver, in one process (the `cuhal-bench` crate).
//!
//! Arguments are parsed by hand (the workspace keeps its dependencies few). Exit codes are
//! part of the interface, because scripts (`cargo xtask gpu-test`, the GPU bundle) act on them:
//! see [`exit`].

mod bench;
mod command;
mod demo;
mod info;

use std::process::ExitCode;

use command::Command;

/// Counts the process's heap allocations for `cuhal bench` case 1 (allocations per submission);
/// otherwise the system allocator.
#[global_allocator]
static GLOBAL: cuhal_bench::alloc_count::Counting = cuhal_bench::alloc_count::Counting;

/// Exit codes of `cuhal`.
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// Any other failure (the message says what).
    pub const FAILURE: u8 = 1;
    /// No CUDA driver library could be loaded.
    pub const NO_DRIVER: u8 = 2;
    /// A driver was loaded but reports no usable device.
    pub const NO_DEVICE: u8 = 3;
    /// The command line was not understood (`EX_USAGE`).
    pub const USAGE: u8 = 64;
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "demo") {
        return ExitCode::from(demo::run(&args[1..]));
    }
    if args.first().is_some_and(|a| a == "bench") {
        return ExitCode::from(bench::run(&args[1..]));
    }
    let code = match command::parse(&args) {
        Ok(Command::Help) => {
            println!("{}", command::USAGE);
            exit::OK
        }
        Ok(Command::Info) => info::run(),
        Err(message) => {
            eprintln!("cuhal: {message}\n\n{}", command::USAGE);
            exit::USAGE
        }
    };
    ExitCode::from(code)
}
