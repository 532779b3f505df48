// The decoder's step at batch 1 as a chain of its own kernels, timed per variant of how the
// GEMVs hand over to each other: every layer's q/k/v GEMV (normalized), attention, the output
// projection, the gate/up GEMV with SwiGLU and the down projection, then the logits; every
// launch a programmatic dependent launch behind the one before, captured into one CUDA graph
// and replayed, as the decoder replays its step (embedding and argmax left out). The variants
// differ in `gemv_stream`'s warps a block W, when a block lets the next kernel launch (after
// its main loop, or at once: EARLY, so the next kernel's blocks take SMs as they free, or sit
// beside it where registers allow, and load their first weights while it streams), its chunk
// and the grid (one block an SM, or two). Weights are distinct per layer (as in
// the model: nothing comes from L2 between replays). Rounds alternate over the variants
// (median of the rounds, their range in brackets), beside the weights-read floor: the step's
// weight bytes at the rate of a 1 GiB device-to-device copy in the same run. Each variant's
// logits after one step are checked against the first variant's. On a machine with nvcc and
// a GPU:
//   nvcc -O3 -std=c++17 -arch=sm_90 -o step_bench step_bench.cu && ./step_bench [ITERS ROUNDS POSITION]
#include "kernels.cu"
#include "bench_util.cuh"
#include <cuda_runtime.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

typedef void (*StreamFn)(const __half*, const float*, float*, const __half*, float, uint32_t, uint32_t, uint32_t, uint32_t);
template <int R, int C, int W, bool P, bool E, int MINB>
__global__ void __launch_bounds__(32 * W, MINB) k_stream(const __half* w, const float* x, float* y, const __half* norm, float eps, uint32_t rows, uint32_t cols, uint32_t mode, uint32_t ksplit) {
    gemv_stream<__half, R, C, W, P, E>(w, x, y, norm, eps, rows, cols, mode, ksplit);
}
struct Variant { const char* name; StreamFn fn; int R, W, grid_per_sm; bool attention; std::vector<float> t; double maxrel; };
#define VAR(name, R, C, W, P, E, MINB, G) Variant{name, k_stream<R, C, W, P, E, MINB>, R, W, G, true, {}, 0}

struct Model { const char* name; uint32_t hidden, layers, heads, kv_heads, head_dim, inter, vocab; };
struct Layer { __half *qkv, *o, *gate_up, *down, *norm1, *norm2, *k, *v; };

int main(int argc, char** argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 20, rounds = argc > 2 ? atoi(argv[2]) : 15;
    // The position every replay attends from (its cache rows before it are random).
    const uint32_t position = argc > 3 ? (uint32_t)atoi(argv[3]) : 48, capacity = position + 1;
    Model models[] = {{"small", 512, 8, 8, 4, 64, 1408, 32000}, {"1b", 2048, 16, 32, 8, 64, 8192, 128256}};
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    double copy_rate = ::copy_rate(st, sms);
    cudaLaunchAttribute pdl[1]; pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; pdl[0].val.programmaticStreamSerializationAllowed = 1;
    for (auto& m : models) {
        std::vector<Variant> vars = {
            VAR("W16 late", 2, 4, 16, true, false, 1, 1),
            VAR("W16 early (the decoder's)", 2, 4, 16, true, true, 1, 1),
            VAR("W8 late", 2, 4, 8, true, false, 2, 1),
            VAR("W8 early", 2, 4, 8, true, true, 2, 1),
            VAR("W8 early, 2 blocks an SM", 2, 4, 8, true, true, 2, 2),
            VAR("W8 C8 unpiped early", 2, 8, 8, false, true, 2, 1),
            VAR("W16 early, no attention", 2, 4, 16, true, true, 1, 1),
        };
        vars.back().attention = false;  // what attention costs the step (its logits differ)
        uint32_t h = m.hidden, q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
        size_t cache = (size_t)m.kv_heads * capacity * m.head_dim;
        std::vector<Layer> layers(m.layers);
        size_t weight_bytes = 0;
        auto alloc_half = [&](size_t n, uint32_t seed, float range, bool weight) {
            __half* p; CK(cudaMalloc(&p, n * 2)); fill_half<<<1024, 256, 0, st>>>(p, n, seed, range);
            if (weight) weight_bytes += n * 2;
            return p;
        };
        uint32_t seed = 1;
        for (auto& l : layers) {
            l.qkv = alloc_half((size_t)(q + 2 * kv) * h, seed++, 0.1f, true);
            l.o = alloc_half((size_t)h * q, seed++, 0.1f, true);
            l.gate_up = alloc_half((size_t)2 * m.inter * h, seed++, 0.1f, true);
            l.down = alloc_half((size_t)h * m.inter, seed++, 0.05f, true);
            l.norm1 = alloc_half(h, seed++, 2.0f, true);
            l.norm2 = alloc_half(h, seed++, 2.0f, true);
            l.k = alloc_half(cache, seed++, 2.0f, false);
            l.v = alloc_half(cache, seed++, 2.0f, false);
        }
        __half* lm = alloc_half((size_t)m.vocab * h, seed++, 0.1f, true);
        __half* fnorm = alloc_half(h, seed++, 2.0f, true);
        float *x, *x0, *qkv, *attn, *act, *logits, *inv_freq; uint32_t* pos;
        CK(cudaMalloc(&x, h * 4)); CK(cudaMalloc(&x0, h * 4)); CK(cudaMalloc(&qkv, (q + 2 * kv) * 4));
        CK(cudaMalloc(&attn, q * 4)); CK(cudaMalloc(&act, m.inter * 4)); CK(cudaMalloc(&logits, m.vocab * 4));
        CK(cudaMalloc(&inv_freq, m.head_dim / 2 * 4)); CK(cudaMalloc(&pos, 4));
        fill_float<<<64, 256, 0, st>>>(x0, h, 3);
        std::vector<float> freq(m.head_dim / 2);
        for (uint32_t i = 0; i < m.head_dim / 2; i++) freq[i] = powf(10000.0f, -2.0f * i / m.head_dim);
        CK(cudaMemcpy(inv_freq, freq.data(), freq.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(pos, &position, 4, cudaMemcpyHostToDevice));
        CK(cudaStreamSynchronize(st));

        auto launch = [&](Variant& v, const __half* w, const float* in, float* out, const __half* norm, uint32_t rows, uint32_t cols, uint32_t mode) {
            // The decoder's rule, for this variant's W and blocks an SM.
            StreamShape r = stream_shape(rows, cols, mode, v.R, v.W, (uint32_t)(sms * v.grid_per_sm));
            cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3(r.grid); cfg.blockDim = dim3(32 * v.W);
            cfg.dynamicSmemBytes = cols * 4; cfg.stream = st; cfg.attrs = pdl; cfg.numAttrs = 1;
            CK(cudaLaunchKernelEx(&cfg, v.fn, w, in, out, norm, 1e-5f, rows, cols, mode, r.split));
        };
        auto attention_launch = [&](Layer& l) {
            cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3(m.heads, 1); cfg.blockDim = dim3(ATTENTION_THREADS);
            cfg.dynamicSmemBytes = capacity * 4; cfg.stream = st; cfg.attrs = pdl; cfg.numAttrs = 1;
            CK(cudaLaunchKernelEx(&cfg, attention_f16, (const float*)qkv, (const float*)inv_freq, l.k, l.v, (const uint32_t*)pos, attn, m.heads, m.kv_heads, m.head_dim, capacity, 1.0f / sqrtf((float)m.head_dim), nullptr));
        };
        std::vector<cudaGraphExec_t> execs;
        for (auto& v : vars) {
            CK(cudaFuncSetAttribute(v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, 48 * 1024));
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            for (auto& l : layers) {
                launch(v, l.qkv, x, qkv, l.norm1, q + 2 * kv, h, GEMV_WRITE);
                if (v.attention) attention_launch(l);
                launch(v, l.o, attn, x, nullptr, h, q, GEMV_ACCUMULATE);
                launch(v, l.gate_up, x, act, l.norm2, 2 * m.inter, h, GEMV_SWIGLU);
                launch(v, l.down, act, x, nullptr, h, m.inter, GEMV_ACCUMULATE);
            }
            launch(v, lm, x, logits, fnorm, m.vocab, h, GEMV_WRITE);
            cudaGraph_t g; CK(cudaStreamEndCapture(st, &g));
            cudaGraphExec_t e; CK(cudaGraphInstantiate(&e, g, 0)); CK(cudaGraphDestroy(g));
            execs.push_back(e);
        }
        // One step from the same input: the logits against the first variant's.
        std::vector<float> ref(m.vocab), got(m.vocab);
        for (size_t i = 0; i < vars.size(); i++) {
            CK(cudaMemcpyAsync(x, x0, h * 4, cudaMemcpyDeviceToDevice, st));
            CK(cudaGraphLaunch(execs[i], st)); CK(cudaStreamSynchronize(st)); CK(cudaGetLastError());
            CK(cudaMemcpy(i == 0 ? ref.data() : got.data(), logits, m.vocab * 4, cudaMemcpyDeviceToHost));
            if (i == 0) continue;
            double scale = 1e-6; for (auto r : ref) scale = std::max(scale, (double)fabsf(r));
            for (uint32_t k = 0; k < m.vocab; k++) vars[i].maxrel = std::max(vars[i].maxrel, (double)fabsf(ref[k] - got[k]) / scale);
        }
        // Replays keep adding into x: bounded by the norms, and the same work every replay.
        for (int round = 0; round < rounds; round++) {
            for (size_t k = 0; k < vars.size(); k++) {
                size_t i = (k + round) % vars.size();
                CK(cudaGraphLaunch(execs[i], st));  // warm
                CK(cudaEventRecord(e0, st));
                for (int it = 0; it < iters; it++) CK(cudaGraphLaunch(execs[i], st));
                CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1)); float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
                vars[i].t.push_back(ms * 1000.0f / iters);
            }
        }
        CK(cudaGetLastError());
        double floor_us = weight_bytes / copy_rate * 1e6;
        printf("== %s: %u layers, position %u, weights %.1f MB, floor %.1f us, %d steps a sample, %d rounds\n", m.name, m.layers, position, weight_bytes / 1e6, floor_us, iters, rounds);
        for (auto& v : vars) {
            std::sort(v.t.begin(), v.t.end());
            float med = v.t[rounds / 2];
            printf("  %-28s %8.1f us (%.1f-%.1f) %.3fx floor, %.3fx the first; logits maxrel %.1e\n", v.name, med, v.t.front(), v.t.back(), med / floor_us, med / vars[0].t[rounds / 2], v.maxrel);
        }
        for (auto e : execs) CK(cudaGraphExecDestroy(e));
        for (auto& l : layers) { for (__half* p : {l.qkv, l.o, l.gate_up, l.down, l.norm1, l.norm2, l.k, l.v}) CK(cudaFree(p)); }
        CK(cudaFree(lm)); CK(cudaFree(fnorm));
        for (void* p : {(void*)x, (void*)x0, (void*)qkv, (void*)attn, (void*)act, (void*)logits, (void*)inv_freq, (void*)pos}) CK(cudaFree(p));
    }
    return 0;
}
