//! The GPU bundle: built binaries plus the scripts that run them on a machine
//! that has a GPU but no cargo.
//!
//! ```text
//! DIR/run          runs bin/cuhal info, bin/cuhal demo, then each test binary; ends
//!                  "N passed, N failed, N skipped"
//!                  (`run --sanitize memcheck|racecheck|synccheck|initcheck` runs them under
//!                  compute-sanitizer and reports each binary's error count)
//! DIR/bench        runs bin/cuhal bench "$@"
//! DIR/bin/cuhal
//! DIR/bin/<test>   one per test target of cuhal-gpu-tests (e.g. bin/driver)
//! DIR/bin/cuhal-decoder      the decoder binary (crates/decoder)
//! DIR/decoder/compare.py     its comparison with transformers (crates/decoder/scripts)
//! ```

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The bundle must fit through the transfer to the GPU machine.
pub const MAX_BYTES: u64 = 64 * 1024 * 1024;

const RUN_TEMPLATE: &str = include_str!("bundle/run.sh");
const BENCH_SCRIPT: &str = include_str!("bundle/bench.sh");

/// A test binary to put in the bundle, under the name the run script uses.
#[derive(Debug, Clone)]
pub struct TestBinary {
    pub name: String,
    pub path: PathBuf,
}

/// Names go into a shell script unquoted, so only plain target names are allowed.
fn check_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name == "cuhal"
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        bail!("test target name {name:?} cannot be used as a bundle file name");
    }
    Ok(())
}

/// Name prefixes by which a GPU test declares itself unfit for `run --sanitize`, which skips it
/// (the last `::` segment of its name is matched, in each binary's own `--list`):
/// - `timing_`: it asserts timings (a sanitizer's instrumented kernels run many times slower, so
///   only its timings would fail);
/// - `trap_`: it makes a kernel trap on purpose (the sanitizer reports the trap as an error);
/// - `cupti_`: it needs CUPTI's activity records, and compute-sanitizer holds CUPTI's one
///   subscriber (the test would only report itself skipped), besides asserting timings.
pub const SANITIZE_SKIP_PREFIXES: &[&str] = &["timing_", "trap_", "cupti_"];

/// The `run` script for these test names, in this order.
pub fn run_script(tests: &[&str]) -> Result<String> {
    for t in tests.iter().chain(SANITIZE_SKIP_PREFIXES) {
        check_name(t)?;
    }
    Ok(RUN_TEMPLATE.replace("@TESTS@", &tests.join(" ")).replace(
        "@SANITIZE_SKIP_PREFIXES@",
        &SANITIZE_SKIP_PREFIXES.join(" "),
    ))
}

/// Writes (or refreshes) a bundle in `dir`: removes its old `bin/`, copies and
/// strips the binaries, writes the scripts. Returns the bundle's size in bytes.
pub fn write(dir: &Path, cuhal: &Path, tests: &[TestBinary]) -> Result<u64> {
    let bin = dir.join("bin");
    if bin.exists() {
        fs::remove_dir_all(&bin).with_context(|| format!("removing the old {}", bin.display()))?;
    }
    fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;

    let mut names = Vec::with_capacity(tests.len());
    for t in tests {
        check_name(&t.name)?;
        if names.contains(&t.name.as_str()) {
            bail!("two test targets are both named {:?}", t.name);
        }
        names.push(t.name.as_str());
        copy_binary(&t.path, &bin.join(&t.name))?;
    }
    copy_binary(cuhal, &bin.join("cuhal"))?;

    write_script(&dir.join("run"), &run_script(&names)?)?;
    write_script(&dir.join("bench"), BENCH_SCRIPT)?;
    size_of(dir)
}

/// Adds the decoder to a bundle `write` made: its binary as `bin/cuhal-decoder` and its
/// comparison script as `decoder/compare.py`. Returns the bundle's size in bytes.
pub fn write_decoder(dir: &Path, decoder: &Path, compare: &Path) -> Result<u64> {
    copy_binary(decoder, &dir.join("bin").join("cuhal-decoder"))?;
    let scripts = dir.join("decoder");
    fs::create_dir_all(&scripts).with_context(|| format!("creating {}", scripts.display()))?;
    let script =
        fs::read_to_string(compare).with_context(|| format!("reading {}", compare.display()))?;
    write_script(&scripts.join("compare.py"), &script)?;
    size_of(dir)
}

/// Writes only the bench part of a bundle: `bin/cuhal` and `bench`.
pub fn write_bench(dir: &Path, cuhal: &Path) -> Result<u64> {
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    copy_binary(cuhal, &bin.join("cuhal"))?;
    write_script(&dir.join("bench"), BENCH_SCRIPT)?;
    size_of(dir)
}

/// Copies an executable and strips it when `strip` is available (release
/// builds are already stripped by the profile, so a missing `strip` is fine).
fn copy_binary(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    if let Ok(out) = Command::new("strip").arg(to).output()
        && !out.status.success()
    {
        eprintln!(
            "xtask: warning: `strip {}` failed ({}); keeping it as built: {}",
            to.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn write_script(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    make_executable(path)
}

#[cfg(unix)]
fn make_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("making {} executable", path.display()))
}

#[cfg(not(unix))]
fn make_executable(_path: &Path) -> Result<()> {
    Ok(())
}

/// Total size of the regular files under `dir`.
pub fn size_of(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_dir() {
            total += size_of(&entry.path())?;
        } else {
            total += meta.len();
        }
    }
    Ok(total)
}

/// `12.3 MiB`.
pub fn human(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::process::Output;

    /// A scratch directory of this test process with a `bin/`, removed when dropped.
    struct Scratch(PathBuf);

    impl std::ops::Deref for Scratch {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn scratch(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("cuhal-xtask-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("bin")).unwrap();
        Scratch(dir)
    }

    /// A stand-in for a test binary: prints `body` and exits with `code`.
    fn fake(dir: &Path, name: &str, body: &str, code: i32) {
        let path = dir.join("bin").join(name);
        write_script(
            &path,
            &format!("#!/usr/bin/env bash\ncat <<'OUT'\n{body}\nOUT\nexit {code}\n"),
        )
        .unwrap();
    }

    fn run_bundle(dir: &Path, tests: &[&str]) -> Output {
        write_script(&dir.join("run"), &run_script(tests).unwrap()).unwrap();
        Command::new("bash")
            .arg(dir.join("run"))
            .env("CUHAL_TEST_TIMEOUT", "20")
            .output()
            .unwrap()
    }

    fn last_line(out: &Output) -> String {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .to_owned()
    }

    const OK_3: &str = "running 3 tests\ntest a ... ok\ntest b ... ok\ntest c ... ok\n\n\
        test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s";
    const FAIL_1_OF_2: &str = "running 2 tests\ntest a ... ok\ntest b ... FAILED\n\n\
        failures:\n---- b stdout ----\ntest result: ok. 99 passed; 0 failed; (printed by the test)\n\n\
        test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s";

    #[test]
    fn all_passing_binaries_sum_and_exit_zero() {
        let dir = scratch("bundle-pass");
        fake(&dir, "cuhal", "driver 13.0", 0);
        fake(&dir, "one", OK_3, 0);
        fake(&dir, "two", OK_3, 0);
        let out = run_bundle(&dir, &["one", "two"]);
        assert_eq!(
            last_line(&out),
            "7 passed, 0 failed, 0 skipped",
            "info, demo (1) and 6 tests"
        );
        assert!(out.status.success());
    }

    #[test]
    fn failures_are_counted_from_the_last_summary() {
        let dir = scratch("bundle-fail");
        fake(&dir, "cuhal", "driver 13.0", 0);
        fake(&dir, "one", OK_3, 0);
        fake(&dir, "two", FAIL_1_OF_2, 101);
        let out = run_bundle(&dir, &["one", "two"]);
        assert_eq!(last_line(&out), "5 passed, 1 failed, 0 skipped");
        assert!(!out.status.success());
    }

    #[test]
    fn tests_that_note_a_skip_count_as_skipped_not_passed() {
        let dir = scratch("bundle-skip");
        fake(&dir, "cuhal", "driver 13.0", 0);
        // Two of "one"'s three tests note a skip (one of them twice) in the log `run` names,
        // as `cuhal_gpu_tests::skip` does; libtest still reports all three as passed.
        write_script(
            &dir.join("bin/one"),
            &format!(
                "#!/usr/bin/env bash
printf 'multi::a\tneeds 2 GPUs (1 found)\n' >>\"$CUHAL_SKIP_LOG\"
printf 'multi::b\tneeds 2 GPUs\nmulti::b\tagain\n' >>\"$CUHAL_SKIP_LOG\"
cat <<'OUT'
{OK_3}
OUT
"
            ),
        )
        .unwrap();
        fake(&dir, "two", OK_3, 0);
        let out = run_bundle(&dir, &["one", "two"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(last_line(&out), "5 passed, 0 failed, 2 skipped", "{text}");
        assert!(text.contains("one: 2 skipped on this machine"), "{text}");
        assert!(out.status.success(), "a skip is no failure");
    }

    #[test]
    fn a_crashing_binary_counts_as_one_failure() {
        let dir = scratch("bundle-crash");
        fake(&dir, "cuhal", "driver 13.0", 0);
        fake(&dir, "one", "running 1 test\ntest a ... ", 139);
        fake(&dir, "two", OK_3, 0);
        let out = run_bundle(&dir, &["one", "two"]);
        assert_eq!(last_line(&out), "4 passed, 1 failed, 0 skipped");
        assert!(!out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("one exited with status 139"), "{text}");
    }

    #[test]
    fn a_failing_info_counts_as_a_failure() {
        let dir = scratch("bundle-noinfo");
        fake(&dir, "cuhal", "no CUDA driver", 2);
        fake(&dir, "one", OK_3, 0);
        let out = run_bundle(&dir, &["one"]);
        assert_eq!(
            last_line(&out),
            "3 passed, 2 failed, 0 skipped",
            "info and demo both fail"
        );
        assert!(!out.status.success());
    }

    #[test]
    fn a_demo_that_falls_back_to_the_host_is_a_failure() {
        let dir = scratch("bundle-hostdemo");
        fake(
            &dir,
            "cuhal",
            "no GPU used (no CUDA driver found): running on the host",
            0,
        );
        fake(&dir, "one", OK_3, 0);
        let out = run_bundle(&dir, &["one"]);
        assert_eq!(last_line(&out), "3 passed, 1 failed, 0 skipped");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("cuhal demo did not use the GPU"), "{text}");
    }

    #[test]
    fn a_binary_without_a_summary_is_a_failure() {
        let dir = scratch("bundle-silent");
        fake(&dir, "cuhal", "driver 13.0", 0);
        fake(&dir, "one", "hello", 0);
        let out = run_bundle(&dir, &["one"]);
        assert_eq!(last_line(&out), "1 passed, 1 failed, 0 skipped");
        assert!(!out.status.success());
    }

    #[test]
    fn arguments_reach_every_test_binary() {
        let dir = scratch("bundle-args");
        fake(&dir, "cuhal", "driver 13.0", 0);
        // Echo the arguments back as part of a summary so the count shows them.
        write_script(
            &dir.join("bin/one"),
            "#!/usr/bin/env bash\necho \"args: $*\"\n\
             echo 'test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out'\n",
        )
        .unwrap();
        write_script(&dir.join("run"), &run_script(&["one"]).unwrap()).unwrap();
        let out = Command::new("bash")
            .arg(dir.join("run"))
            .arg("fill")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("args: --include-ignored --test-threads=1 fill"),
            "{text}"
        );
        assert_eq!(last_line(&out), "2 passed, 0 failed, 0 skipped");
    }

    #[test]
    fn write_copies_binaries_and_scripts() {
        let dir = scratch("bundle-write");
        let src = scratch("bundle-write-src");
        fake(&src, "cuhal", "driver 13.0", 0);
        fake(&src, "driver", OK_3, 0);
        fs::write(dir.join("bin/stale"), "old").unwrap();
        let tests = [TestBinary {
            name: "driver".into(),
            path: src.join("bin/driver"),
        }];
        let size = write(&dir, &src.join("bin/cuhal"), &tests).unwrap();
        assert!(!dir.join("bin/stale").exists(), "old binaries are removed");
        assert!(dir.join("bin/driver").exists() && dir.join("bin/cuhal").exists());
        assert!(
            fs::read_to_string(dir.join("bench"))
                .unwrap()
                .contains("bin/cuhal\" bench")
        );
        assert_eq!(size, size_of(&dir).unwrap());
        let out = Command::new(dir.join("run")).output().unwrap();
        assert_eq!(last_line(&out), "4 passed, 0 failed, 0 skipped");
    }

    #[test]
    fn sanitize_runs_every_binary_under_the_tool_and_counts_its_errors() {
        let dir = scratch("bundle-sanitize");
        fake(&dir, "cuhal", "driver 13.0", 0);
        // "one" lists tests that declare themselves timing-only or trapping (at any module
        // depth), and others whose names only contain the prefixes; it shows its arguments.
        write_script(
            &dir.join("bin/one"),
            &format!(
                "#!/usr/bin/env bash
if [ \"$1\" = --list ]; then
    printf '%s: test\\n' graph::timing_backlog timing_zone trap_fault plain not_timing_x \\
        deferred::a_trap_b cupti_zones a_cupti_b
    echo '8 tests, 0 benchmarks'
    exit 0
fi
echo \"one args: $*\"
cat <<'OUT'
{OK_3}
OUT
"
            ),
        )
        .unwrap();
        fake(&dir, "two", OK_3, 0);
        fake(&dir, "three", OK_3, 0);
        // A stand-in sanitizer: shows its arguments, runs the program, and reports one error
        // for binary "two" only; for "three" it says what compute-sanitizer says of a program
        // that never called CUDA (no summary, status 255).
        let sanitizer = dir.join("compute-sanitizer");
        write_script(
            &sanitizer,
            "#!/usr/bin/env bash
echo \"sanitizer: $*\"
prog=\"$5\"
shift 4
\"$@\"
             status=$?
if [ \"$(basename \"$prog\")\" = three ]; then
    echo '========= Error: Target application terminated before first instrumented API call'
    exit 255
fi
if [ \"$(basename \"$prog\")\" = two ]; then n=1; else n=0; fi
             echo \"========= ERROR SUMMARY: $n errors\"
exit $status
",
        )
        .unwrap();
        write_script(
            &dir.join("run"),
            &run_script(&["one", "two", "three"]).unwrap(),
        )
        .unwrap();
        let out = Command::new("bash")
            .arg(dir.join("run"))
            .args(["--sanitize", "memcheck", "fill"])
            .env("CUHAL_SANITIZER", &sanitizer)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("sanitizer: --tool memcheck --target-processes all"),
            "{text}"
        );
        assert!(
            text.contains(
                "one args: --include-ignored --test-threads=1 --skip graph::timing_backlog \
                 --skip timing_zone --skip trap_fault --skip cupti_zones fill"
            ),
            "only the tests named timing_*, trap_* or cupti_* are skipped: {text}"
        );
        assert!(!text.contains("--skip plain"), "{text}");
        assert!(text.contains("memcheck one: 0 errors"), "{text}");
        assert!(text.contains("memcheck two: 1 errors"), "{text}");
        assert!(text.contains("memcheck three: 0 errors"), "{text}");
        assert!(!text.contains("three exited"), "{text}");
        assert!(text.contains("memcheck cuhal-demo: 0 errors"), "{text}");
        assert!(text.contains("memcheck: 1 errors in total"), "{text}");
        // The 4 tests of "one" left out under the tool count as skipped (libtest's own count,
        // which the stand-in prints as it is, leaves them out).
        assert_eq!(last_line(&out), "10 passed, 1 failed, 4 skipped", "{text}");
        assert!(!out.status.success());

        let out = Command::new("bash")
            .arg(dir.join("run"))
            .args(["--sanitize", "nonsense"])
            .env("CUHAL_SANITIZER", &sanitizer)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
    }

    #[test]
    fn unsafe_names_are_refused() {
        assert!(run_script(&["ok_name-1"]).is_ok());
        for bad in ["", "a b", "$(rm)", "x;y", "cuhal"] {
            assert!(run_script(&[bad]).is_err(), "{bad:?}");
        }
    }
}
