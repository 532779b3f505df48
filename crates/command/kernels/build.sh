#!/usr/bin/env bash
# Rebuilds the helper cubins (indirect_sm_XY.cubin) with nvcc, one per architecture: the
# indirect-dispatch helper (indirect.cu) and the binding-table patch helper (bindings.cu) in one
# module, linked against the CUDA device runtime (cudadevrt).
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
    cubin="$out/indirect_sm_$arch.cubin"
    # Relocatable device code (the device runtime is a device library), then a device link
    # that resolves both objects against cudadevrt into one self-contained cubin.
    objs=()
    for src in indirect bindings; do
        obj="$work/${src}_sm_$arch.o"
        if ! "$nvcc" -arch="sm_$arch" -rdc=true -O3 -c "$here/$src.cu" -o "$obj"; then
            echo "sm_$arch: nvcc cannot compile $src.cu for it, skipped" >&2
            continue 2
        fi
        objs+=("$obj")
    done
    if ! "$nvcc" -arch="sm_$arch" -dlink -cubin "${objs[@]}" -lcudadevrt -o "$cubin"; then
        # Older toolkits: link relocatable cubins with nvlink directly.
        rels=()
        for src in indirect bindings; do
            rel="$work/${src}_sm_$arch.rel.cubin"
            "$nvcc" -arch="sm_$arch" -rdc=true -O3 -cubin "$here/$src.cu" -o "$rel"
            rels+=("$rel")
        done
        lib="$(dirname "$(command -v "$nvcc")")/../lib64"
        if ! nvlink -arch="sm_$arch" -L"$lib" -lcudadevrt "${rels[@]}" -o "$cubin"; then
            echo "sm_$arch: device link failed" >&2
            exit 1
        fi
    fi
    # Both helpers must be in the module cuhal loads.
    # (The listing is read whole first: `grep -q` stops reading early, and under pipefail the
    # writer's broken pipe would count as a missing kernel.)
    elf=""
    if command -v cuobjdump >/dev/null; then elf="$(cuobjdump -elf "$cubin")"; fi
    for kernel in cuhal_indirect_apply cuhal_bindings_apply; do
        if [ -n "$elf" ] && ! grep -q "$kernel" <<<"$elf"; then
            echo "sm_$arch: $kernel missing from $cubin" >&2
            exit 1
        fi
    done
    echo "sm_$arch: $(stat -c %s "$cubin") bytes -> $cubin"
    built=$((built + 1))
done
[ "$built" -gt 0 ] || { echo "no cubin built" >&2; exit 1; }
