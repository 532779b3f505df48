//! Running cargo from xtask: the workspace root, plain steps, and builds whose
//! artifacts we need to locate.

use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use anyhow::{Context, Result, bail};

use serde_json::Value;

/// The workspace root: xtask lives one level below it.
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// Resolves a user-given path against the workspace root (absolute paths stay).
pub fn from_root(path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        workspace_root().join(path)
    }
}

/// The target directory cargo builds into for users: `CARGO_TARGET_DIR` when
/// set, else `<root>/target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => from_root(Path::new(&dir)),
        _ => workspace_root().join("target"),
    }
}

/// A `cargo` command run from the workspace root, using the same cargo that
/// started xtask (`$CARGO`) so the pinned toolchain is kept.
pub fn cargo<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(args).current_dir(workspace_root());
    cmd
}

/// A command line as the user would type it, for messages: the environment it sets first.
pub fn display(cmd: &Command) -> String {
    let mut s = String::new();
    for (key, value) in cmd.get_envs() {
        let Some(value) = value else { continue };
        let value = value.to_string_lossy();
        if value.contains(char::is_whitespace) {
            s.push_str(&format!("{}=\"{value}\" ", key.to_string_lossy()));
        } else {
            s.push_str(&format!("{}={value} ", key.to_string_lossy()));
        }
    }
    s.push_str(
        &Path::new(cmd.get_program())
            .file_name()
            .unwrap_or(cmd.get_program())
            .to_string_lossy(),
    );
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

/// Runs a command with inherited output and returns its status.
pub fn status(cmd: &mut Command) -> Result<ExitStatus> {
    cmd.status()
        .with_context(|| format!("could not start `{}`", display(cmd)))
}

/// One compiled target that has an executable (a binary or a test harness).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Executable {
    /// The target's name, e.g. `driver` for `tests/driver.rs` or `cuhal`.
    pub name: String,
    /// The target's first kind: `test`, `lib`, `bin`, ...
    pub kind: String,
    /// Whether it was built as a test harness.
    pub test: bool,
    pub path: PathBuf,
}

/// Reads the executables out of cargo's JSON messages, and the rendered
/// compiler diagnostics (which JSON mode keeps off the terminal) so they can
/// be shown.
pub fn parse_messages(line: &str) -> Result<Message> {
    let v: Value = serde_json::from_str(line)
        .with_context(|| format!("cargo printed a line that is not JSON: {line}"))?;
    match v.get("reason").and_then(Value::as_str) {
        Some("compiler-artifact") => {
            let Some(path) = v.get("executable").and_then(Value::as_str) else {
                return Ok(Message::Other);
            };
            let name = v
                .pointer("/target/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let kind = v
                .pointer("/target/kind")
                .and_then(Value::as_array)
                .and_then(|k| k.first())
                .and_then(Value::as_str)
                .unwrap_or_default();
            let test = v
                .pointer("/profile/test")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            Ok(Message::Executable(Executable {
                name: name.to_owned(),
                kind: kind.to_owned(),
                test,
                path: PathBuf::from(path),
            }))
        }
        Some("compiler-message") => Ok(v
            .pointer("/message/rendered")
            .and_then(Value::as_str)
            .map_or(Message::Other, |r| Message::Diagnostic(r.to_owned()))),
        _ => Ok(Message::Other),
    }
}

/// What one line of cargo's JSON output tells xtask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Executable(Executable),
    Diagnostic(String),
    Other,
}

/// Runs a cargo build command with `--message-format=json`
/// and returns the executables it produced. Diagnostics are printed as cargo
/// would print them; a failed build is an error.
pub fn build_executables(mut cmd: Command) -> Result<Vec<Executable>> {
    // Colour the re-printed diagnostics only when a person is reading them.
    let format = if std::io::stderr().is_terminal() {
        "--message-format=json-diagnostic-rendered-ansi"
    } else {
        "--message-format=json"
    };
    cmd.arg(format).stdout(Stdio::piped());
    let shown = display(&cmd);
    eprintln!("xtask: {shown}");
    let mut child = cmd
        .spawn()
        .with_context(|| format!("could not start `{shown}`"))?;
    let stdout = child
        .stdout
        .take()
        .context("cargo's stdout was not captured")?;
    let mut executables = Vec::new();
    let mut stderr = std::io::stderr().lock();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo's output")?;
        if line.trim().is_empty() {
            continue;
        }
        match parse_messages(&line)? {
            Message::Executable(e) => executables.push(e),
            Message::Diagnostic(text) => {
                let _ = stderr.write_all(text.as_bytes());
            }
            Message::Other => {}
        }
    }
    drop(stderr);
    let status = child
        .wait()
        .with_context(|| format!("waiting for `{shown}`"))?;
    if !status.success() {
        bail!("`{shown}` failed ({status})");
    }
    Ok(executables)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_shows_the_environment_it_sets() {
        let mut cmd = Command::new("/usr/bin/cargo");
        cmd.args(["doc", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings")
            .env("LOOM_MAX_PREEMPTIONS", "2");
        assert_eq!(
            display(&cmd),
            "LOOM_MAX_PREEMPTIONS=2 RUSTDOCFLAGS=\"-D warnings\" cargo doc --no-deps"
        );
    }

    #[test]
    fn test_artifact_line_yields_its_executable() {
        let line = r#"{"reason":"compiler-artifact","package_id":"x","target":{"kind":["test"],"name":"driver"},"profile":{"test":true},"filenames":["/t/deps/driver-1"],"executable":"/t/deps/driver-1","fresh":true}"#;
        assert_eq!(
            parse_messages(line).unwrap(),
            Message::Executable(Executable {
                name: "driver".into(),
                kind: "test".into(),
                test: true,
                path: "/t/deps/driver-1".into(),
            })
        );
    }

    #[test]
    fn library_artifact_without_executable_is_ignored() {
        let line = r#"{"reason":"compiler-artifact","target":{"kind":["lib"],"name":"slab"},"profile":{"test":false},"executable":null}"#;
        assert_eq!(parse_messages(line).unwrap(), Message::Other);
    }

    #[test]
    fn diagnostics_are_passed_through() {
        let line = r#"{"reason":"compiler-message","message":{"rendered":"warning: x\n"}}"#;
        assert_eq!(
            parse_messages(line).unwrap(),
            Message::Diagnostic("warning: x\n".into())
        );
        let done = r#"{"reason":"build-finished","success":true}"#;
        assert_eq!(parse_messages(done).unwrap(), Message::Other);
    }

    #[test]
    fn non_json_output_is_an_error() {
        assert!(parse_messages("Compiling foo").is_err());
        assert!(parse_messages(r#"{"reason":"compiler-artifact""#).is_err());
    }

    #[test]
    fn escaped_paths_and_names_are_decoded() {
        let line = r#"{"reason":"compiler-artifact","target":{"kind":["bin"],"name":"a\"b\u00e9"},"profile":{"test":false},"executable":"/t/with space/\\x\ny"}"#;
        assert_eq!(
            parse_messages(line).unwrap(),
            Message::Executable(Executable {
                name: "a\"bé".into(),
                kind: "bin".into(),
                test: false,
                path: "/t/with space/\\x\ny".into(),
            })
        );
    }
}
