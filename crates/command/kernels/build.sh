#!/usr/bin/env bash
# Rebuilds the indirect-dispatch helper cubins (indirect_sm_XY.cubin) from indirect.cu with nvcc,
# one per architecture, linked against the CUDA device runtime (cudadevrt).
#
#   crates/command/kernels/build.sh [OUT_DIR]        # default: this directory
#   ARCHS="90 100" crates/command/kernels/build.sh   # a subset
#
# Needs a CUDA toolkit of 12.4 or later (device-updatable kernel nodes). cuhal embeds the cubins
# it finds here for the architectures listed in crates/command/src/indirect.rs; at run time
# CUHAL_INDIRECT_HELPER_DIR may name a directory with cubins for other architectures.
# check_indirect.cu (see its header) checks a cubin on a GPU without cargo.
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
    obj="$work/indirect_sm_$arch.o"
    cubin="$out/indirect_sm_$arch.cubin"
    # Relocatable device code (the device runtime is a device library), then a device link
    # that resolves it against cudadevrt into one self-contained cubin.
    if ! "$nvcc" -arch="sm_$arch" -rdc=true -O3 -c "$here/indirect.cu" -o "$obj"; then
        echo "sm_$arch: nvcc cannot compile for it, skipped" >&2
        continue
    fi
    if ! "$nvcc" -arch="sm_$arch" -dlink -cubin "$obj" -lcudadevrt -o "$cubin"; then
        # Older toolkits: link a relocatable cubin with nvlink directly.
        rel="$work/indirect_sm_$arch.rel.cubin"
        lib="$(dirname "$(command -v "$nvcc")")/../lib64"
        "$nvcc" -arch="sm_$arch" -rdc=true -O3 -cubin "$here/indirect.cu" -o "$rel"
        if ! nvlink -arch="sm_$arch" -L"$lib" -lcudadevrt "$rel" -o "$cubin"; then
            echo "sm_$arch: device link failed" >&2
            exit 1
        fi
    fi
    echo "sm_$arch: $(stat -c %s "$cubin") bytes -> $cubin"
    built=$((built + 1))
done
[ "$built" -gt 0 ] || { echo "no cubin built" >&2; exit 1; }
