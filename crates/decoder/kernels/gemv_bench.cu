// The decoder's two GEMVs at batch 1, timed per shape of the `small` and `1b` configurations:
// `gemv_f16` (split as the decoder launches it) against `gemv_staged_f16`, each over copies of
// its weights larger than L2 (so every launch reads memory, not cache), in 10 alternating
// rounds of 200 launches, beside a 1 GiB device-to-device copy (the weights floor's rate).
// It also checks that both write the same outputs. On a machine with nvcc and a GPU:
//   nvcc -O3 -std=c++17 -arch=sm_90 -o gemv_bench gemv_bench.cu && ./gemv_bench
#include "kernels.cu"
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA error %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)

__global__ void fill_half(__half* p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
        p[i] = __float2half(((h & 0xffff) / 65535.0f - 0.5f) * 0.1f);
    }
}
__global__ void fill_float(float* p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2246822519u ^ seed; h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
        p[i] = ((h & 0xffff) / 65535.0f - 0.5f) * 2.0f;
    }
}

struct Shape { const char* name; uint32_t rows, cols; bool norm; uint32_t mode; };

int main(int argc, char** argv) {
    int iters = 200;
    Shape shapes[] = {
        {"1b qkv", 3072, 2048, true, GEMV_WRITE}, {"1b o", 2048, 2048, false, GEMV_ACCUMULATE},
        {"1b gate_up", 16384, 2048, true, GEMV_SWIGLU}, {"1b down", 2048, 8192, false, GEMV_ACCUMULATE},
        {"1b lm_head", 128256, 2048, true, GEMV_WRITE},
        {"small qkv", 1024, 512, true, GEMV_WRITE}, {"small o", 512, 512, false, GEMV_ACCUMULATE},
        {"small gate_up", 2816, 512, true, GEMV_SWIGLU}, {"small down", 512, 1408, false, GEMV_ACCUMULATE},
        {"small lm_head", 32000, 512, true, GEMV_WRITE},
    };
    cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    // Copy rate: 1 GiB D2D.
    size_t cbytes = 1ull << 30; void *ca, *cb; CK(cudaMalloc(&ca, cbytes)); CK(cudaMalloc(&cb, cbytes));
    float best_copy = 1e9;
    for (int i = 0; i < 5; i++) {
        CK(cudaEventRecord(e0, st)); CK(cudaMemcpyAsync(cb, ca, cbytes, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1)); float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
        best_copy = std::min(best_copy, ms);
    }
    double copy_rate = 2.0 * cbytes / (best_copy * 1e-3);  // read + write bytes per second
    printf("copy rate (read+write) %.0f GB/s\n", copy_rate / 1e9);
    CK(cudaFree(ca)); CK(cudaFree(cb));
    printf("%-14s %9s %9s %9s %8s %8s %8s %10s\n", "shape", "floor_us", "old_us", "new_us", "old_eff", "new_eff", "new/old", "max_rel");
    for (auto& sh : shapes) {
        size_t wn = (size_t)sh.rows * sh.cols, wbytes = wn * 2;
        int copies = (int)std::max<size_t>(2, (400ull << 20) / wbytes + 1);
        std::vector<__half*> ws(copies);
        for (auto& w : ws) { CK(cudaMalloc(&w, wbytes)); fill_half<<<1024, 256, 0, st>>>(w, wn, 7); }
        float *x, *y, *y2; __half* nrm;
        uint32_t outputs = sh.mode == GEMV_SWIGLU ? sh.rows / 2 : sh.rows;
        CK(cudaMalloc(&x, sh.cols * 4)); CK(cudaMalloc(&y, outputs * 4)); CK(cudaMalloc(&y2, outputs * 4));
        CK(cudaMalloc(&nrm, sh.cols * 2));
        fill_float<<<64, 256, 0, st>>>(x, sh.cols, 3); fill_half<<<64, 256, 0, st>>>(nrm, sh.cols, 5);
        const __half* norm = sh.norm ? nrm : nullptr;
        uint32_t split = sh.rows < 4096 ? GEMV_WARPS : 1;
        dim3 og((sh.rows + GEMV_WARP_ROWS * GEMV_WARPS / split - 1) / (GEMV_WARP_ROWS * GEMV_WARPS / split), 1);
        uint32_t per_warp = sh.mode == GEMV_SWIGLU ? GEMV_STAGED_ROWS / 2 : GEMV_STAGED_ROWS;
        dim3 ng((outputs + per_warp * GEMV_WARPS - 1) / (per_warp * GEMV_WARPS));
        size_t smem = sh.cols * 4;
        CK(cudaFuncSetAttribute(gemv_staged_f16, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024));
        // Correctness (write into zeroed outputs; accumulate of zero = write).
        CK(cudaMemsetAsync(y, 0, outputs * 4, st)); CK(cudaMemsetAsync(y2, 0, outputs * 4, st));
        gemv_f16<<<og, 32 * GEMV_WARPS, 0, st>>>(ws[0], x, y, norm, 1e-5f, sh.rows, sh.cols, 1, sh.mode, split);
        gemv_staged_f16<<<ng, 32 * GEMV_WARPS, smem, st>>>(ws[0], x, y2, norm, 1e-5f, sh.rows, sh.cols, sh.mode);
        CK(cudaStreamSynchronize(st)); CK(cudaGetLastError());
        std::vector<float> a(outputs), b(outputs);
        CK(cudaMemcpy(a.data(), y, outputs * 4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(b.data(), y2, outputs * 4, cudaMemcpyDeviceToHost));
        double maxrel = 0, scale = 1e-6; for (auto v : a) scale = std::max(scale, (double)fabsf(v));
        for (uint32_t i = 0; i < outputs; i++) maxrel = std::max(maxrel, (double)fabsf(a[i] - b[i]) / scale);
        // Timing: alternating rounds of `iters` launches, weights rotated.
        std::vector<float> to, tn;
        for (int round = 0; round < 10; round++) {
            for (int side = 0; side < 2; side++) {
                CK(cudaEventRecord(e0, st));
                for (int i = 0; i < iters; i++) {
                    const __half* w = ws[i % copies];
                    if (side == 0) gemv_f16<<<og, 32 * GEMV_WARPS, 0, st>>>(w, x, y, norm, 1e-5f, sh.rows, sh.cols, 1, sh.mode, split);
                    else gemv_staged_f16<<<ng, 32 * GEMV_WARPS, smem, st>>>(w, x, y2, norm, 1e-5f, sh.rows, sh.cols, sh.mode);
                }
                CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1)); float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
                (side == 0 ? to : tn).push_back(ms * 1000.0f / iters);
            }
        }
        CK(cudaGetLastError());
        std::sort(to.begin(), to.end()); std::sort(tn.begin(), tn.end());
        double o = to[to.size() / 2], n = tn[tn.size() / 2];
        double floor_us = wbytes / copy_rate * 1e6;
        printf("%-14s %9.2f %9.2f %9.2f %7.0f%% %7.0f%% %8.3f %10.2e  (new spread %.2f-%.2f)\n", sh.name, floor_us, o, n, 100 * floor_us / o, 100 * floor_us / n, n / o, maxrel, tn.front(), tn.back());
        for (auto& w : ws) CK(cudaFree(w));
        CK(cudaFree(x)); CK(cudaFree(y)); CK(cudaFree(y2)); CK(cudaFree(nrm));
    }
    return 0;
}
