// The decoder's GEMVs at batch 1, timed per shape of the `small` and `1b` configurations:
// `gemv_f16` (split as the decoder launches it for batches), `gemv_stream_f16` with the
// decoder's column split and grid (`stream_shape` in src/gpu/step.rs, repeated here as
// `rule`), and a sweep of `gemv_stream`'s variants (rows a warp R, chunk C, warps a block W,
// pipelined loads, column split S, grid: the whole matrix, one block per SM times the
// occupancy, or half that), each releasing the next launch at once as the decoder's does. Every launch is a programmatic dependent launch behind the one
// before, as in the decoder; each weights copy rotates over more than L2 (so every launch
// reads memory, not cache); rounds alternate over the variants (median of the rounds, their
// range in brackets), beside a 1 GiB device-to-device copy (the weights floor's rate). Each
// variant's outputs are checked against `gemv_f16`'s. On a machine with nvcc and a GPU:
//   nvcc -O3 -std=c++17 -arch=sm_90 -o gemv_bench gemv_bench.cu && ./gemv_bench [ITERS ROUNDS [SHAPE]]
#include "kernels.cu"
#include "bench_util.cuh"
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <string>
#include <algorithm>
#include <cuda_runtime.h>

typedef void (*StreamFn)(const __half*, const float*, float*, const __half*, float, uint32_t, uint32_t, uint32_t, uint32_t);
template <int R, int C, int W, bool P>
__global__ void __launch_bounds__(32 * W) k_stream(const __half* w, const float* x, float* y, const __half* norm, float eps, uint32_t rows, uint32_t cols, uint32_t mode, uint32_t ksplit) {
    gemv_stream<__half, R, C, W, P, true>(w, x, y, norm, eps, rows, cols, mode, ksplit);
}
struct Cfg { StreamFn fn; int R, C, W; bool P; };
#define CFG(R, C, W, P) Cfg{k_stream<R, C, W, P>, R, C, W, P}
struct Shape { const char* name; uint32_t rows, cols; bool norm; uint32_t mode; };
struct Var { std::string name; int kind; Cfg cfg; uint32_t S; dim3 grid; int block; size_t smem; std::vector<float> t; double maxrel; };

int main(int argc, char** argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 100, rounds = argc > 2 ? atoi(argv[2]) : 7;
    const char* only = argc > 3 ? argv[3] : nullptr;
    Shape shapes[] = {
        {"1b qkv", 3072, 2048, true, GEMV_WRITE}, {"1b o", 2048, 2048, false, GEMV_ACCUMULATE},
        {"1b gate_up", 16384, 2048, true, GEMV_SWIGLU}, {"1b down", 2048, 8192, false, GEMV_ACCUMULATE},
        {"1b lm_head", 128256, 2048, true, GEMV_WRITE},
        {"small qkv", 1024, 512, true, GEMV_WRITE}, {"small o", 512, 512, false, GEMV_ACCUMULATE},
        {"small gate_up", 2816, 512, true, GEMV_SWIGLU}, {"small down", 512, 1408, false, GEMV_ACCUMULATE},
        {"small lm_head", 32000, 512, true, GEMV_WRITE},
    };
    Cfg cfgs[] = {
        CFG(2, 8, 4, false), CFG(2, 8, 4, true), CFG(2, 4, 4, true), CFG(2, 8, 8, false), CFG(2, 8, 8, true),
        CFG(2, 4, 8, true), CFG(4, 4, 4, true), CFG(4, 4, 8, false), CFG(4, 4, 8, true), CFG(4, 8, 4, false),
        CFG(2, 16, 4, false), CFG(4, 2, 8, true), CFG(2, 2, 8, true), CFG(2, 4, 16, true), CFG(2, 8, 16, false),
    };
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    double copy_rate = ::copy_rate(st, sms);
    cudaLaunchAttribute pdl[1]; pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; pdl[0].val.programmaticStreamSerializationAllowed = 1;
    for (auto& sh : shapes) {
        if (only && !strstr(sh.name, only)) continue;
        size_t wn = (size_t)sh.rows * sh.cols, wbytes = wn * 2;
        int copies = (int)std::max<size_t>(2, (400ull << 20) / wbytes + 1);
        std::vector<__half*> ws(copies);
        for (auto& w : ws) { CK(cudaMalloc(&w, wbytes)); fill_half<<<1024, 256, 0, st>>>(w, wn, 7, 0.1f); }
        float *x, *y, *yref; __half* nrm;
        uint32_t outputs = sh.mode == GEMV_SWIGLU ? sh.rows / 2 : sh.rows;
        CK(cudaMalloc(&x, sh.cols * 4)); CK(cudaMalloc(&y, outputs * 4)); CK(cudaMalloc(&yref, outputs * 4));
        CK(cudaMalloc(&nrm, sh.cols * 2));
        fill_float<<<64, 256, 0, st>>>(x, sh.cols, 3); fill_half<<<64, 256, 0, st>>>(nrm, sh.cols, 5, 0.1f);
        const __half* norm = sh.norm ? nrm : nullptr;
        uint32_t split = sh.rows < 4096 ? GEMV_WARPS : 1;
        size_t smem = sh.cols * 4;
        std::vector<Var> vars;
        // Baselines: kind 0 split gemv, kind 1 the decoder's gemv_stream_f16 and its rule.
        vars.push_back({"gemv split", 0, cfgs[0], split, dim3((sh.rows + GEMV_WARP_ROWS * GEMV_WARPS / split - 1) / (GEMV_WARP_ROWS * GEMV_WARPS / split)), 32 * GEMV_WARPS, 0, {}, 0});
        {
            StreamShape r = stream_shape(sh.rows, sh.cols, sh.mode, GEMV_STREAM_ROWS, GEMV_STREAM_WARPS, sms);
            char nm[96]; snprintf(nm, sizeof nm, "rule: gemv_stream S%u grid %u", r.split, r.grid);
            vars.push_back({nm, 1, cfgs[0], r.split, dim3(r.grid), 32 * GEMV_STREAM_WARPS, smem, {}, 0});
        }
        for (auto& c : cfgs) {
            uint32_t per_group = sh.mode == GEMV_SWIGLU ? c.R / 2 : c.R;
            uint32_t groups = (outputs + per_group - 1) / per_group;
            int occ = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, c.fn, 32 * c.W, smem));
            if (occ == 0) continue;
            for (uint32_t S = 1; S <= (uint32_t)c.W && S <= 8; S *= 2) {
                if ((sh.cols / 8 + S - 1) / S < 32) continue;
                uint32_t per_block = c.W / S;
                uint32_t full = (groups + per_block - 1) / per_block;
                uint32_t gridsz[3] = {full, std::min<uint32_t>(full, occ * sms), std::min<uint32_t>(full, std::max(1, occ / 2) * sms)};
                for (int gi = 0; gi < 3; gi++) {
                    if (gi > 0 && gridsz[gi] == full) continue;
                    if (gi == 2 && gridsz[2] == gridsz[1]) continue;
                    char nm[96]; snprintf(nm, sizeof nm, "R%d C%d W%d %s S%u grid %u%s", c.R, c.C, c.W, c.P ? "pipe" : "    ", S, gridsz[gi], gi == 0 ? "" : gi == 1 ? " (occ)" : " (occ/2)");
                    vars.push_back({nm, 2, c, S, dim3(gridsz[gi]), 32 * c.W, smem, {}, 0});
                }
            }
        }
        auto launch = [&](Var& v, const __half* w, float* out) {
            cudaLaunchConfig_t cfg = {}; cfg.gridDim = v.grid; cfg.blockDim = dim3(v.block); cfg.dynamicSmemBytes = v.smem; cfg.stream = st; cfg.attrs = pdl; cfg.numAttrs = 1;
            if (v.kind == 0) CK(cudaLaunchKernelEx(&cfg, gemv_f16, w, (const float*)x, out, norm, 1e-5f, sh.rows, sh.cols, 1u, sh.mode, v.S, nullptr));
            else if (v.kind == 1) CK(cudaLaunchKernelEx(&cfg, gemv_stream_f16, w, (const float*)x, out, norm, 1e-5f, sh.rows, sh.cols, sh.mode, v.S, nullptr));
            else CK(cudaLaunchKernelEx(&cfg, v.cfg.fn, w, (const float*)x, out, norm, 1e-5f, sh.rows, sh.cols, sh.mode, v.S));
        };
        // Correctness against the split gemv.
        std::vector<float> ref(outputs), got(outputs);
        CK(cudaMemsetAsync(yref, 0, outputs * 4, st)); launch(vars[0], ws[0], yref);
        CK(cudaStreamSynchronize(st)); CK(cudaMemcpy(ref.data(), yref, outputs * 4, cudaMemcpyDeviceToHost));
        double scale = 1e-6; for (auto v : ref) scale = std::max(scale, (double)fabsf(v));
        for (auto& v : vars) {
            CK(cudaMemsetAsync(y, 0, outputs * 4, st)); launch(v, ws[0], y);
            CK(cudaStreamSynchronize(st)); CK(cudaGetLastError());
            CK(cudaMemcpy(got.data(), y, outputs * 4, cudaMemcpyDeviceToHost));
            for (uint32_t i = 0; i < outputs; i++) v.maxrel = std::max(v.maxrel, (double)fabsf(ref[i] - got[i]) / scale);
        }
        for (int round = 0; round < rounds; round++) {
            for (auto& v : vars) {
                CK(cudaEventRecord(e0, st));
                for (int i = 0; i < iters; i++) launch(v, ws[i % copies], y);
                CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1)); float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
                v.t.push_back(ms * 1000.0f / iters);
            }
        }
        CK(cudaGetLastError());
        double floor_us = wbytes / copy_rate * 1e6;
        for (auto& v : vars) std::sort(v.t.begin(), v.t.end());
        std::vector<int> order(vars.size()); for (size_t i = 0; i < vars.size(); i++) order[i] = i;
        std::sort(order.begin(), order.end(), [&](int a, int b) { return vars[a].t[rounds / 2] < vars[b].t[rounds / 2]; });
        printf("== %s (%u x %u) floor %.2f us, %d variants\n", sh.name, sh.rows, sh.cols, floor_us, (int)vars.size());
        int shown = 0;
        for (size_t k = 0; k < order.size(); k++) {
            auto& v = vars[order[k]];
            if (shown < 12 || v.kind < 2) {
                printf("  %2zu %-40s %8.2f us (%.2f-%.2f) eff %3.0f%% maxrel %.1e\n", k, v.name.c_str(), v.t[rounds / 2], v.t.front(), v.t.back(), 100 * floor_us / v.t[rounds / 2], v.maxrel);
                shown++;
            }
        }
        for (auto& w : ws) CK(cudaFree(w));
        CK(cudaFree(x)); CK(cudaFree(y)); CK(cudaFree(yref)); CK(cudaFree(nrm));
    }
    return 0;
}
