//! `cuhal bench`: the arguments and the printing; the harness is the `cuhal-bench` crate.

use cuhal_bench::{Outcome, options};

use crate::exit;

/// Runs `cuhal bench` with the arguments after `bench`; returns the exit code (see
/// [`crate::exit`]: 2 without a driver, 3 without a device, 1 when a case failed).
pub fn run(args: &[String]) -> u8 {
    let opts = match options::parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cuhal bench: {e}\n\n{}", options::usage());
            return exit::USAGE;
        }
    };
    if opts.help {
        println!("{}", options::usage());
        return exit::OK;
    }
    match cuhal_bench::run(&opts) {
        Ok(Outcome::Finished { markdown, failures }) => {
            println!("{markdown}");
            if failures > 0 {
                eprintln!("cuhal bench: {failures} case(s) failed; see the notes");
                return exit::FAILURE;
            }
            exit::OK
        }
        Ok(Outcome::NoDriver(message)) => {
            eprintln!("cuhal bench: {message}");
            exit::NO_DRIVER
        }
        Ok(Outcome::NoDevice(message)) => {
            eprintln!("cuhal bench: {message}");
            exit::NO_DEVICE
        }
        Err(e) => {
            eprintln!("cuhal bench: {e:#}");
            exit::FAILURE
        }
    }
}
