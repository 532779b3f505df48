// What the decoder's kernel benches (gemv_bench.cu, step_bench.cu) share: error checks,
// deterministic fills, the memory rate the weights-read floor is taken at, and the decoder's
// `gemv_stream` launch rule. Included after kernels.cu.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#define CK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { printf("CUDA error %s at %d\n", cudaGetErrorString(err_), __LINE__); exit(1); } } while (0)

// p[i] uniform in [-range / 2, range / 2), from a hash of i and seed.
__global__ void fill_half(__half* p, size_t n, uint32_t seed, float range) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
        p[i] = __float2half(((h & 0xffff) / 65535.0f - 0.5f) * range);
    }
}
// p[i] uniform in [-1, 1), from a hash of i and seed.
__global__ void fill_float(float* p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2246822519u ^ seed; h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
        p[i] = ((h & 0xffff) / 65535.0f - 0.5f) * 2.0f;
    }
}

// The rate of the best of five 1 GiB device-to-device copies on `st`, bytes read plus written
// per second (the weights-read floor's rate); prints it beside the SM count.
inline double copy_rate(cudaStream_t st, int sms) {
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    size_t bytes = 1ull << 30; void *a, *b; CK(cudaMalloc(&a, bytes)); CK(cudaMalloc(&b, bytes));
    float best = 1e9;
    for (int i = 0; i < 5; i++) {
        CK(cudaEventRecord(e0, st)); CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1)); float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
        best = std::min(best, ms);
    }
    CK(cudaFree(a)); CK(cudaFree(b)); CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
    double rate = 2.0 * bytes / (best * 1e-3);
    printf("SMs %d, copy rate (read+write) %.0f GB/s\n", sms, rate / 1e9);
    return rate;
}

// The decoder's `stream_shape` (src/gpu/step.rs) for blocks of W warps, R rows a warp, at most
// `most` blocks: the widest column split (up to 4, each slice at least 32 words) whose blocks
// fit in `most`, and the grid.
struct StreamShape { uint32_t split, grid; };
inline StreamShape stream_shape(uint32_t rows, uint32_t cols, uint32_t mode, int R, int W, uint32_t most) {
    bool swiglu = mode == GEMV_SWIGLU;
    uint32_t outputs = swiglu ? rows / 2 : rows, per_group = swiglu ? R / 2 : R;
    uint32_t groups = std::max(1u, (outputs + per_group - 1) / per_group);
    auto blocks = [&](uint32_t s) { return (groups + W / s - 1) / (W / s); };
    uint32_t s = 1;
    while (s < 4 && cols / 8 / (2 * s) >= 32 && blocks(2 * s) <= most) s *= 2;
    return {s, std::min(blocks(s), most)};
}
