#!/usr/bin/env bash
# Rebuilds the resident queue's scheduler cubins (scheduler_sm_XY.cubin) with nvcc, one per
# architecture, linked against the CUDA device runtime (cudadevrt: device graph launch).
#
#   crates/device/kernels/resident/build.sh [OUT_DIR]        # default: this directory
#   ARCHS="90 100" crates/device/kernels/resident/build.sh   # a subset
#
# Needs a CUDA toolkit of 12.4 or later. cuhal embeds the cubins it finds here (see
# crates/device/src/resident/scheduler.rs). check_scheduler.cu (see its header) checks and times a
# cubin on a GPU without cargo.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here}"
mkdir -p "$out"
nvcc="${NVCC:-nvcc}"
archs="${ARCHS:-80 86 89 90 100 120}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$nvcc" --version | tail -n 2
built=0
for arch in $archs; do
    cubin="$out/scheduler_sm_$arch.cubin"
    obj="$work/scheduler_sm_$arch.o"
    if ! "$nvcc" -arch="sm_$arch" -rdc=true -O3 -c "$here/scheduler.cu" -o "$obj"; then
        echo "sm_$arch: nvcc cannot compile scheduler.cu for it, skipped" >&2
        continue
    fi
    "$nvcc" -arch="sm_$arch" -dlink -cubin "$obj" -lcudadevrt -o "$cubin"
    echo "sm_$arch: $(stat -c %s "$cubin") bytes -> $cubin"
    built=$((built + 1))
done
[ "$built" -gt 0 ] || { echo "no cubin built" >&2; exit 1; }
