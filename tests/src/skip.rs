//! Tests that cannot run on the machine they find (fewer than two GPUs, CUPTI held by another
//! profiler) say so through [`skip`], and the bundle's `run` script counts them as skipped,
//! never as passed.
//!
//! libtest has no skipped outcome: such a test returns early and libtest reports it `ok`. So
//! [`skip`] also appends the test's name and the reason to the file named by
//! [`SKIP_LOG_ENV`], which `run` sets for each test binary; `run` subtracts those lines from the
//! binary's passed count and reports them in its last line (`N passed, N failed, N skipped`).

use std::io::Write;

/// The file [`skip`] appends to (one line per skipped test), when set.
pub const SKIP_LOG_ENV: &str = "CUHAL_SKIP_LOG";

/// Says that the calling test is skipped, and why; the test then returns without asserting.
///
/// Prints `skipped: <reason>` and, when [`SKIP_LOG_ENV`] names a file, appends
/// `<test name>\t<reason>` to it (libtest names each test's thread after the test). A log that
/// cannot be written fails the test: a skip that `run` would not count must not pass silently.
pub fn skip(reason: &str) {
    println!("skipped: {reason}");
    let Some(path) = std::env::var_os(SKIP_LOG_ENV) else {
        return;
    };
    let name = std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_owned();
    let line = format!("{name}\t{}\n", reason.replace(['\n', '\t'], " "));
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    if let Err(e) = written {
        panic!(
            "cannot note the skip of {name} in {}: {e}",
            std::path::Path::new(&path).display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_is_logged_with_the_test_name_and_reason() {
        let path = std::env::temp_dir().join(format!("cuhal-skip-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let log = path.clone();
        std::thread::Builder::new()
            .name("suite::needs_two".into())
            .spawn(move || {
                // SAFETY: this unit test is the only one of this binary that touches the
                // environment, and the variable is read only by `skip` on this thread.
                unsafe { std::env::set_var(SKIP_LOG_ENV, &log) };
                skip("needs 2 GPUs\t(1 found)");
                skip("second");
                // SAFETY: as above.
                unsafe { std::env::remove_var(SKIP_LOG_ENV) };
            })
            .unwrap()
            .join()
            .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            text,
            "suite::needs_two\tneeds 2 GPUs (1 found)\nsuite::needs_two\tsecond\n"
        );
    }
}
