#!/usr/bin/env bash
# Runs `cuhal bench` from this bundle (written by `cargo xtask gpu-test|bench --bundle`);
# every argument goes to it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "$here/bin/cuhal" bench "$@"
