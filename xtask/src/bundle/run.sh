#!/usr/bin/env bash
# Runs cuhal's GPU suite from this bundle (written by `cargo xtask gpu-test --bundle`):
# `bin/cuhal info`, `bin/cuhal demo` (which must run on the GPU), then every test binary with --include-ignored --test-threads=1.
#
#   ./run [ARGS...]       extra arguments go to every test binary (e.g. a name filter)
#
# Each binary runs in its own process, so a test that loses its CUDA context
# cannot take the others down. A binary that crashes, times out or exits non-zero
# without reporting a failure counts as one failure. The last line is always
# "N passed, N failed"; the exit status is non-zero if anything failed.
#
# CUHAL_TEST_TIMEOUT (seconds, default 600) bounds each binary when `timeout` exists.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tests=(@TESTS@)
limit="${CUHAL_TEST_TIMEOUT:-600}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"

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
bounded "$here/bin/cuhal" demo --trace "$demo_trace" 2>&1 | tee "$logs/demo.log"
status=${PIPESTATUS[0]}
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
    bounded "$here/bin/$t" --include-ignored --test-threads=1 "$@" 2>&1 | tee "$logs/$t.log"
    status=${PIPESTATUS[0]}
    # libtest's summary: "test result: ok. 3 passed; 0 failed; 0 ignored; ...".
    # The last one is the binary's own (earlier ones could come from test output).
    counts="$(sed -n 's/^test result: [A-Za-z]*\. \([0-9][0-9]*\) passed; \([0-9][0-9]*\) failed;.*/\1 \2/p' "$logs/$t.log" | tail -n 1)"
    p=0
    f=0
    if [ -n "$counts" ]; then
        read -r p f <<<"$counts"
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
    passed=$((passed + p))
    failed=$((failed + f))
done

echo
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
