#!/usr/bin/env bash
# Builds the module images of kernels.cu with nvcc (on a machine with the CUDA toolkit) into
# OUT (default: this folder). The images are committed; rebuild them only when kernels.cu
# changes.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here}"
nvcc="${NVCC:-nvcc}"
mkdir -p "$out"
cd "$here"
"$nvcc" --version | tail -n 2
# A cubin for sm_90.
"$nvcc" -cubin -arch=sm_90 -o "$out/kernels.sm_90.cubin" kernels.cu
# PTX for compute_80.
"$nvcc" -ptx -arch=compute_80 -o "$out/kernels.compute_80.ptx" kernels.cu
# A fatbin with cubins for sm_80 and sm_90 and PTX for compute_90.
"$nvcc" -fatbin -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
    -gencode arch=compute_90,code=compute_90 -o "$out/kernels.fatbin" kernels.cu
# The same, every entry compressed.
"$nvcc" -fatbin -Xfatbin -compress-all -gencode arch=compute_80,code=sm_80 \
    -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
    -o "$out/kernels.compressed.fatbin" kernels.cu ||
    echo "this nvcc cannot compress every entry (-Xfatbin -compress-all): no compressed fatbin"
ls -l "$out"
