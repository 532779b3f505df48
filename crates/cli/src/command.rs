//! The command line: which subcommand, with which options.

/// Printed for `--help` and after a usage error.
pub const USAGE: &str = "\
usage: cuhal <command>

commands:
  info      the CUDA driver and each device (name, compute capability, memory, UUID, PCI bus id)
  demo      a traced two-queue pipeline on the GPU (on the CPU host backend without one)
            [--iterations N] [--trace PATH] [--host]
  bench     cuhal against the raw driver in one process [--quick] [--json PATH] [--case NAME...]

environment:
  CUHAL_CUDA_LIBRARY   path of the driver library to load instead of libcuda.so.1";

/// A parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `cuhal info`.
    Info,
    /// `cuhal help`, `-h`, `--help`.
    Help,
}

/// Parses the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Command, String> {
    let Some((command, rest)) = args.split_first() else {
        return Err("no command given".into());
    };
    let command = match command.as_str() {
        "info" => Command::Info,
        "help" | "-h" | "--help" => return Ok(Command::Help),
        other => return Err(format!("unknown command {other:?}")),
    };
    if rest.iter().any(|a| a == "-h" || a == "--help") {
        return Ok(Command::Help);
    }
    match rest.first() {
        Some(extra) => Err(format!("unexpected argument {extra:?}")),
        None => Ok(command),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_commands_and_help() {
        assert_eq!(parse(&args("info")), Ok(Command::Info));
        assert_eq!(parse(&args("--help")), Ok(Command::Help));
        assert_eq!(parse(&args("info -h")), Ok(Command::Help));
    }

    #[test]
    fn rejects_what_it_does_not_know() {
        assert!(parse(&[]).is_err());
        assert_eq!(parse(&args("frob")), Err("unknown command \"frob\"".into()));
        assert_eq!(
            parse(&args("info now")),
            Err("unexpected argument \"now\"".into())
        );
    }
}
