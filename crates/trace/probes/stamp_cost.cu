// What a kernel's own zone stamps cost: the replay time of a graph of 100 dependent tiny
// kernels (1 block, and a block on every SM) with each kernel folding its blocks' first start
// and last end into a slot of its own, against the same graph unstamped. Variants (MODE):
//   0 unstamped
//   1 ~start folded in as the block starts, the end as it ends (`red.max`, device memory)
//   2 the ABI of `../include/cuhal_zone_stamp.cuh`: both reductions as the block ends
//   3 as 2, but a one-block kernel stores both words with one 16-byte plain store
// Before the timing, each variant's slots are checked after one replay against stamps the
// blocks store beside them (the earliest start exactly; the end against a reading taken just
// before the variant's own).
// Measured on an H100 (2026-12-07), with variants since taken out: `red` on a slot in
// host-mapped memory 2.16x (1 block) and 248x (132 blocks); the last block publishing the slot
// to mapped memory through a counter 2.04x / 2.05x; plain stores to mapped memory (block 0's
// start, every block's end, the last store wins) 1.07x / 1.18x and up to 32 ns off; the ends
// spread over 4 words by block +93 / +155 ns a kernel (the header's +55 / +154 ns).
// Each phase is the median of ROUNDS samples of REPLAYS back-to-back replays, variants in turns.
//   nvcc -O3 -std=c++17 -arch=sm_90 -I../include -o stamp_cost stamp_cost.cu
//   ./stamp_cost [REPLAYS ROUNDS]
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "cuhal_zone_stamp.cuh"
#define CK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { printf("CUDA error %s at %d\n", cudaGetErrorString(err_), __LINE__); exit(1); } } while (0)

constexpr int KERNELS = 100, THREADS = 128, SLOT_WORDS = 2;

__device__ __forceinline__ void red_max(unsigned long long* at, unsigned long long v) {
    asm volatile("red.global.max.u64 [%0], %1;" ::"l"(at), "l"(v) : "memory");
}

// A tiny dependent kernel: each thread updates its element (what case 4's chain does), with
// optional per-block check stamps (`check`: 2 words per block).
template <int MODE>
__global__ void work(float* data, unsigned long long* slot, unsigned long long* check) {
    auto* zone = reinterpret_cast<cuhal_zone_stamp*>(slot);
    unsigned long long start = 0;
    if (MODE != 0 && threadIdx.x == 0) start = cuhal_globaltimer();
    if (MODE == 1 && threadIdx.x == 0) red_max(&slot[0], ~start);
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    data[i] = data[i] * 0.5f + 1.0f;
    if (MODE == 0) return;
    if (check && threadIdx.x == 0) {
        check[2 * blockIdx.x] = start;
        check[2 * blockIdx.x + 1] = cuhal_globaltimer();
    }
    if (MODE == 2) {
        cuhal_zone_end(zone, start);
        return;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    if (MODE == 1) {
        red_max(&slot[1], cuhal_globaltimer());
    } else if (gridDim.x == 1) {
        unsigned long long end = cuhal_globaltimer();
        asm volatile("st.global.v2.u64 [%0], {%1, %2};" ::"l"(slot), "l"(~start), "l"(end) : "memory");
    } else {
        red_max(&slot[0], ~start);
        red_max(&slot[1], cuhal_globaltimer());
    }
}

int main(int argc, char** argv) {
    int replays = argc > 1 ? atoi(argv[1]) : 64, rounds = argc > 2 ? atoi(argv[2]) : 15;
    cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    float* data; CK(cudaMalloc(&data, sms * THREADS * sizeof(float)));
    CK(cudaMemset(data, 0, sms * THREADS * sizeof(float)));
    unsigned long long* slots; CK(cudaMalloc(&slots, KERNELS * SLOT_WORDS * 8));
    unsigned long long* check; CK(cudaMalloc(&check, KERNELS * sms * 2 * 8));
    auto build = [&](int mode, int grid, bool checked) {
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int k = 0; k < KERNELS; k++) {
            unsigned long long* s = slots + SLOT_WORDS * k;
            unsigned long long* c = checked ? check + 2 * sms * k : nullptr;
            switch (mode) {
            case 0: work<0><<<grid, THREADS, 0, st>>>(data, s, c); break;
            case 1: work<1><<<grid, THREADS, 0, st>>>(data, s, c); break;
            case 2: work<2><<<grid, THREADS, 0, st>>>(data, s, c); break;
            default: work<3><<<grid, THREADS, 0, st>>>(data, s, c); break;
            }
        }
        cudaGraph_t g; CK(cudaStreamEndCapture(st, &g));
        cudaGraphExec_t e; CK(cudaGraphInstantiate(&e, g, 0)); CK(cudaGraphDestroy(g));
        CK(cudaGraphUpload(e, st)); CK(cudaStreamSynchronize(st));
        return e;
    };
    const char* names[] = {"unstamped", "start folded in as a block starts", "the header (both at the end)",
                           "the header, one block: one plain store"};
    constexpr int MODES = 4;
    for (int grid : {1, sms}) {
        printf("grid %d x %d threads, %d kernels a replay:\n", grid, THREADS, KERNELS);
        for (int mode = 1; mode < MODES; mode++) {
            CK(cudaMemset(slots, 0, KERNELS * SLOT_WORDS * 8));
            CK(cudaMemset(check, 0, KERNELS * sms * 2 * 8));
            cudaGraphExec_t e = build(mode, grid, true);
            CK(cudaGraphLaunch(e, st)); CK(cudaStreamSynchronize(st));
            std::vector<unsigned long long> s(KERNELS * SLOT_WORDS), c(KERNELS * sms * 2);
            CK(cudaMemcpy(s.data(), slots, s.size() * 8, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(c.data(), check, c.size() * 8, cudaMemcpyDeviceToHost));
            long long worst_b = 0, worst_e = 0, lag_e = 0;
            for (int k = 0; k < KERNELS; k++) {
                const unsigned long long* slot = &s[SLOT_WORDS * k];
                unsigned long long b = ~0ull, en = 0;
                for (int x = 0; x < grid; x++) {
                    b = std::min(b, c[2 * sms * k + 2 * x]);
                    en = std::max(en, c[2 * sms * k + 2 * x + 1]);
                }
                unsigned long long gb = ~slot[0], ge = slot[1];
                worst_b = std::max(worst_b, std::llabs((long long)(gb - b)));
                if (gb > ge || ge == 0) worst_b = -1;  // an empty or inverted slot
                lag_e = std::max(lag_e, (long long)(ge - en));
                worst_e = std::min(worst_e, (long long)(ge - en));
            }
            printf("  check %-38s begin error %lld ns (-1: a slot empty or inverted); end after the"
                   " blocks' last reading by at most %lld ns, never before: %s\n",
                   names[mode], worst_b, lag_e, worst_e >= 0 ? "yes" : "NO");
            CK(cudaGraphExecDestroy(e));
        }
        CK(cudaMemset(slots, 0, KERNELS * SLOT_WORDS * 8));
        std::vector<cudaGraphExec_t> ex;
        for (int mode = 0; mode < MODES; mode++) ex.push_back(build(mode, grid, false));
        std::vector<std::vector<float>> t(MODES);
        for (int r = 0; r < rounds; r++) {
            for (int mode = 0; mode < MODES; mode++) {
                CK(cudaGraphLaunch(ex[mode], st)); CK(cudaStreamSynchronize(st));
                CK(cudaEventRecord(e0, st));
                for (int i = 0; i < replays; i++) CK(cudaGraphLaunch(ex[mode], st));
                CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1));
                float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); t[mode].push_back(ms * 1000 / replays);
            }
        }
        auto b = t[0]; std::sort(b.begin(), b.end());
        for (int mode = 0; mode < MODES; mode++) {
            auto v = t[mode]; std::sort(v.begin(), v.end());
            printf("  %-40s %7.1f us (%.1f-%.1f) %.3fx, %+.0f ns a kernel\n", names[mode], v[rounds / 2], v.front(),
                   v.back(), v[rounds / 2] / b[rounds / 2], (v[rounds / 2] - b[rounds / 2]) * 1000 / KERNELS);
        }
        for (auto e : ex) CK(cudaGraphExecDestroy(e));
    }
    printf("done\n");
    return 0;
}
