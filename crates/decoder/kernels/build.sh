#!/usr/bin/env bash
# Builds the module images of kernels.cu with nvcc into OUT (default: this folder). The images
# are committed (the crate embeds kernels.fatbin and kernels.compute_80.ptx); rebuild them only
# when kernels.cu changes. The committed ones were built with nvcc 13.0.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here}"
nvcc="${NVCC:-nvcc}"
mkdir -p "$out"
cd "$here"
"$nvcc" --version | tail -n 2
flags=(-O3 -std=c++17 -Xptxas -warn-spills)
# Cubins for sm_80 (A100) and sm_90 (H100, H200), to read register use and spills from.
"$nvcc" "${flags[@]}" -cubin -arch=sm_80 -o "$out/kernels.sm_80.cubin" kernels.cu
"$nvcc" "${flags[@]}" -cubin -arch=sm_90 -o "$out/kernels.sm_90.cubin" kernels.cu
# PTX for compute_80: what the fake driver reads, and what any later GPU's driver can compile.
"$nvcc" "${flags[@]}" -ptx -arch=compute_80 -o "$out/kernels.compute_80.ptx" kernels.cu
# The image the runtime loads: cubins for sm_80 and sm_90, PTX for compute_90 (newer GPUs).
"$nvcc" "${flags[@]}" -fatbin -gencode arch=compute_80,code=sm_80 \
    -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
    -o "$out/kernels.fatbin" kernels.cu
ls -l "$out"
