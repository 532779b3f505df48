//! Project automation for cuhal, run as `cargo xtask <command>`.
//!
//! - `ci`: what `.ci/run` runs: formatting, clippy with warnings denied, every test.
//! - `gpu-test`: builds the GPU suite (the `cuhal-gpu-tests` package) in release
//!   mode; runs it when this machine has a CUDA driver, or writes a bundle that a
//!   GPU machine without cargo runs (see docs/gpu-testing.md).
//! - `bench`: builds `cuhal` in release mode and runs `cuhal bench`, or bundles it.
//!
//! Arguments are parsed by hand: the workspace keeps its dependencies few.

mod bench;
mod bundle;
mod cargo;
mod ci;
#[cfg(test)]
mod ffi_names;
mod gpu_test;

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  ci                                    fmt --check, clippy -D warnings, test (what .ci/run runs)
  gpu-test [--require-gpu] [--bundle DIR] [-- TEST-ARGS...]
                                        build the GPU suite in release mode and run it if a
                                        CUDA driver is present; with --bundle, write it and a
                                        `run` script to DIR (relative to the repository root)
  bench [--bundle DIR] [-- BENCH-ARGS...]
                                        build cuhal in release mode and run `cuhal bench`";

/// A parsed command line.
#[derive(Debug, PartialEq, Eq)]
enum Task {
    Ci,
    GpuTest(gpu_test::Options),
    Bench(bench::Options),
    Help,
}

fn parse(args: &[String]) -> Result<Task, String> {
    let Some((command, rest)) = args.split_first() else {
        return Err("no command given".into());
    };
    // Everything after `--` is passed on untouched.
    let (flags, passthrough) = match rest.iter().position(|a| a == "--") {
        Some(i) => (&rest[..i], rest[i + 1..].to_vec()),
        None => (rest, Vec::new()),
    };
    let mut require_gpu = false;
    let mut bundle = None;
    let mut flags = flags.iter();
    while let Some(flag) = flags.next() {
        match (command.as_str(), flag.as_str()) {
            ("gpu-test", "--require-gpu") => require_gpu = true,
            ("gpu-test" | "bench", "--bundle") => {
                let dir = flags.next().ok_or("--bundle needs a directory")?;
                bundle = Some(PathBuf::from(dir));
            }
            (_, "-h" | "--help") => return Ok(Task::Help),
            _ => return Err(format!("unexpected argument {flag:?} for `{command}`")),
        }
    }
    match command.as_str() {
        "ci" if passthrough.is_empty() => Ok(Task::Ci),
        "ci" => Err("`ci` takes no arguments".into()),
        "gpu-test" => Ok(Task::GpuTest(gpu_test::Options {
            require_gpu,
            bundle,
            test_args: passthrough,
        })),
        "bench" => Ok(Task::Bench(bench::Options {
            bundle,
            args: passthrough,
        })),
        "help" | "-h" | "--help" => Ok(Task::Help),
        other => Err(format!("unknown command {other:?}")),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = match parse(&args) {
        Ok(task) => task,
        Err(msg) => {
            eprintln!("xtask: {msg}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match task {
        Task::Help => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Task::Ci => ci::run().map(|()| ExitCode::SUCCESS),
        Task::GpuTest(opts) => gpu_test::run(&opts),
        Task::Bench(opts) => bench::run(&opts),
    };
    result.unwrap_or_else(|err| {
        eprintln!("xtask: error: {err:#}");
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_each_command() {
        assert_eq!(parse(&args("ci")), Ok(Task::Ci));
        assert_eq!(
            parse(&args(
                "gpu-test --require-gpu --bundle target/b -- fill --exact"
            )),
            Ok(Task::GpuTest(gpu_test::Options {
                require_gpu: true,
                bundle: Some("target/b".into()),
                test_args: args("fill --exact"),
            }))
        );
        assert_eq!(
            parse(&args("gpu-test")),
            Ok(Task::GpuTest(gpu_test::Options::default()))
        );
        assert_eq!(
            parse(&args("bench -- --iters 10")),
            Ok(Task::Bench(bench::Options {
                bundle: None,
                args: args("--iters 10")
            }))
        );
        assert_eq!(parse(&args("help")), Ok(Task::Help));
    }

    #[test]
    fn rejects_bad_command_lines() {
        for bad in [
            "",
            "frobnicate",
            "ci --bundle x",
            "ci -- x",
            "gpu-test --bundle",
            "bench --require-gpu",
            "gpu-test extra",
        ] {
            assert!(parse(&args(bad)).is_err(), "accepted {bad:?}");
        }
    }
}
