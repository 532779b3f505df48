#!/usr/bin/env bash
# Runs cuhal's GPU suite from this bundle (written by `cargo xtask gpu-test --bundle`):
# `bin/cuhal info`, `bin/cuhal demo` (which must run on the GPU), then every test binary with --include-ignored --test-threads=1.
#
#   ./run [ARGS...]       extra arguments go to every test binary (e.g. a name filter)
#   ./run --sanitize TOOL [ARGS...]
#                         runs `cuhal demo` and every test binary under compute-sanitizer with
#                         --tool TOOL (memcheck, racecheck, synccheck or initcheck), skipping the
#                         tests that declare themselves unfit for it by their name (below), and
#                         prints each binary's sanitizer error count; any error fails the run.
#
# Each binary runs in its own process, so a test that loses its CUDA context
# cannot take the others down. A binary that crashes, times out or exits non-zero
# without reporting a failure counts as one failure. A test that cannot run on this
# machine (two GPUs, CUPTI held by another profiler) notes itself in the file named by
# CUHAL_SKIP_LOG (cuhal_gpu_tests::skip), and one left out under --sanitize is skipped
# too: neither counts as passed. The last line is always "N passed, N failed, N skipped";
# the exit status is non-zero if anything failed.
#
# CUHAL_TEST_TIMEOUT (seconds, default 600) bounds each binary when `timeout` exists.
# CUHAL_SANITIZER names compute-sanitizer (default /usr/local/cuda/bin/compute-sanitizer, else
# the one on PATH).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tests=(@TESTS@)
limit="${CUHAL_TEST_TIMEOUT:-600}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"

# Under --sanitize, a test is skipped when its name (the last `::` segment) starts with one of
# these prefixes: `timing_` (it asserts timings, which instrumented kernels, many times slower,
# do not keep), `trap_` (it makes the GPU fault on purpose, which the sanitizer reports as an
# error) and `cupti_` (it needs CUPTI's one subscriber, which the sanitizer holds). Each binary's
# own test list says which tests these are; the script names none.
sanitize_skip_prefixes=(@SANITIZE_SKIP_PREFIXES@)

tool=""
if [ "${1:-}" = "--sanitize" ]; then
    tool="${2:-}"
    case "$tool" in
    memcheck | racecheck | synccheck | initcheck) ;;
    *)
        echo "!! --sanitize needs a tool: memcheck, racecheck, synccheck or initcheck (got '$tool')"
        exit 2
        ;;
    esac
    shift 2
    sanitizer="${CUHAL_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}"
    if [ ! -x "$sanitizer" ]; then
        sanitizer="$(command -v compute-sanitizer || true)"
    fi
    if [ -z "$sanitizer" ]; then
        echo "!! compute-sanitizer not found (set CUHAL_SANITIZER)"
        exit 2
    fi
fi

logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT

bounded() {
    if command -v timeout >/dev/null 2>&1; then
        timeout --kill-after=10 "$limit" "$@"
    else
        "$@"
    fi
}

passed=0
failed=0
skipped=0
sanitizer_errors=0
sanitizer_report=()

# Runs "$@" under the sanitizer when one was asked for; otherwise as it is.
sanitized() {
    if [ -n "$tool" ]; then
        bounded "$sanitizer" --tool "$tool" --target-processes all "$@"
    else
        bounded "$@"
    fi
}

# What compute-sanitizer prints, exiting with status 255 and no error summary, for a program that
# never called CUDA.
no_cuda_call='^========= Error: Target application terminated before first instrumented API call'

# Adds up the sanitizer's "ERROR SUMMARY: N errors" lines of a log (one per process) and notes
# the count under the binary's name.
count_sanitizer_errors() {
    local name="$1" log="$2" n
    [ -n "$tool" ] || return 0
    # racecheck prints "RACECHECK SUMMARY: H hazards displayed (E errors, W warnings)" instead.
    n="$(sed -n -e 's/^========= ERROR SUMMARY: \([0-9][0-9]*\) error.*/\1/p' \
        -e 's/^========= RACECHECK SUMMARY: .*(\([0-9][0-9]*\) error.*/\1/p' "$log" |
        awk '{ s += $1 } END { print s + 0 }')"
    if ! grep -q '^========= \(ERROR\|RACECHECK\) SUMMARY:' "$log"; then
        if grep -q "$no_cuda_call" "$log"; then
            # A binary that made no CUDA call (unit tests, or every GPU test skipped): nothing
            # was instrumented, so nothing can be in error.
            echo "== $name made no CUDA call: nothing for $tool to check"
        else
            echo "!! $name: compute-sanitizer printed no error summary"
            n=1
        fi
    fi
    sanitizer_errors=$((sanitizer_errors + n))
    sanitizer_report+=("$tool $name: $n errors")
}

echo "== cuhal info"
bounded "$here/bin/cuhal" info
status=$?
if [ "$status" -ne 0 ]; then
    echo "!! cuhal info exited with status $status"
    failed=$((failed + 1))
fi

echo
echo "== cuhal demo"
demo_trace="${CUHAL_DEMO_TRACE:-$logs/cuhal-trace.json}"
sanitized "$here/bin/cuhal" demo --trace "$demo_trace" 2>&1 | tee "$logs/demo.log"
status=${PIPESTATUS[0]}
count_sanitizer_errors "cuhal-demo" "$logs/demo.log"
if [ "$status" -ne 0 ]; then
    echo "!! cuhal demo exited with status $status"
    failed=$((failed + 1))
elif grep -q "^no GPU used" "$logs/demo.log"; then
    echo "!! cuhal demo did not use the GPU"
    failed=$((failed + 1))
else
    passed=$((passed + 1))
fi

for t in "${tests[@]}"; do
    echo
    echo "== $t"
    skips=()
    if [ -n "$tool" ]; then
        # libtest's list: "path::name: test" per test.
        while IFS= read -r name; do
            leaf="${name##*::}"
            for prefix in "${sanitize_skip_prefixes[@]}"; do
                if [ "${leaf#"$prefix"}" != "$leaf" ]; then
                    skips+=(--skip "$name")
                    echo "== $t: $name skipped under $tool (${prefix}*)"
                    break
                fi
            done
        done < <(bounded "$here/bin/$t" --list --include-ignored 2>/dev/null | sed -n 's/: test$//p')
    fi
    skip_log="$logs/$t.skips"
    : >"$skip_log"
    export CUHAL_SKIP_LOG="$skip_log"
    sanitized "$here/bin/$t" --include-ignored --test-threads=1 "${skips[@]}" "$@" 2>&1 | tee "$logs/$t.log"
    status=${PIPESTATUS[0]}
    count_sanitizer_errors "$t" "$logs/$t.log"
    # libtest's summary: "test result: ok. 3 passed; 0 failed; 0 ignored; ...".
    # The last one is the binary's own (earlier ones could come from test output).
    counts="$(sed -n 's/^test result: [A-Za-z]*\. \([0-9][0-9]*\) passed; \([0-9][0-9]*\) failed;.*/\1 \2/p' "$logs/$t.log" | tail -n 1)"
    p=0
    f=0
    if [ -n "$counts" ]; then
        read -r p f <<<"$counts"
    fi
    if [ -n "$tool" ] && [ "$status" -eq 255 ] && [ -n "$counts" ] && [ "$f" -eq 0 ] \
        && grep -q "$no_cuda_call" "$logs/$t.log"; then
        # The sanitizer's own status for a binary that made no CUDA call; its tests passed.
        status=0
    fi
    if [ "$status" -ne 0 ] && [ "$f" -eq 0 ]; then
        if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
            echo "!! $t did not finish within ${limit}s"
        else
            echo "!! $t exited with status $status without reporting a failed test (crashed?)"
        fi
        f=1
    elif [ -z "$counts" ]; then
        echo "!! $t printed no test result"
        f=1
    fi
    # Tests that noted a skip returned early, and libtest counted them as passed; tests left
    # out under --sanitize (a `--skip NAME` pair each) did not run at all.
    noted="$(cut -f 1 "$skip_log" | sort -u | grep -c . || true)"
    if [ "$noted" -gt "$p" ]; then
        noted=$p
    fi
    if [ "$noted" -gt 0 ]; then
        echo "== $t: $noted skipped on this machine:"
        sed 's/^/   /' "$skip_log"
    fi
    left_out=$((${#skips[@]} / 2))
    passed=$((passed + p - noted))
    failed=$((failed + f))
    skipped=$((skipped + noted + left_out))
done

if [ -n "$tool" ]; then
    echo
    echo "== compute-sanitizer --tool $tool, errors per binary"
    for line in "${sanitizer_report[@]}"; do
        echo "$line"
    done
    echo "$tool: $sanitizer_errors errors in total"
    if [ "$sanitizer_errors" -ne 0 ]; then
        failed=$((failed + 1))
    fi
fi

echo
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
