// The decoder's kernels: one decode step of a Llama model for a batch of sequences, each
// sequence one new token at its own position. Built by nvcc into the images beside this file
// (see build.sh); the runtime (src/gpu/) records them into one graph replayed per token.
//
// Conventions:
// - weights and the key/value cache are in the model's dtype T (`__half` for the `_f16`
//   kernels, `__nv_bfloat16` for the `_bf16` ones); activations, logits and every sum are f32;
// - the batch is a kernel dimension: `batch` sequences, each with its position in `pos[b]`
//   (device memory) and its tokens in `history[position * batch + b]` (device memory), so a
//   replayed step reads what the previous one wrote, with no host round trip;
// - rows are row-major, projections `[out, in]` as Hugging Face stores them;
// - every kernel times itself through cuhal's zone-stamp ABI (cuhal_zone_stamp.cuh): its last
//   parameter is a `cuhal_zone_stamp*` (null unless the queue traces at FINE), the kernel opens
//   with CUHAL_ZONE_BEGIN and closes with CUHAL_ZONE_END, which every thread reaches (the
//   bodies' early returns leave the device function, not the kernel). The begin stamp is read
//   before the kernel's `step_wait`: with programmatic dependent launch a zone runs from its
//   first block's start, which may be before its predecessor ended.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "../../trace/include/cuhal_zone_stamp.cuh"

// Sequences one GEMV block computes at once: each warp keeps this many sums, and reads each
// weight once for all of them.
#define GEMV_BATCH 8
// Rows one GEMV warp computes at once (one load of x serves them all).
#define GEMV_WARP_ROWS 4
// Warps of a GEMV block.
#define GEMV_WARPS 4
// The widest head `attention` takes (its query lives in shared memory).
#define MAX_HEAD_DIM 256
// Threads of an attention block (at least MAX_HEAD_DIM).
#define ATTENTION_THREADS 256
// Threads of an argmax block, and the logits each thread reads.
#define ARGMAX_THREADS 256
#define ARGMAX_PER_THREAD 8

__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __half from_float<__half>(float x) {
    return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// Eight elements of T in one 128-bit word, widened to f32.
__device__ __forceinline__ void unpack8(uint4 word, __half* /*tag*/, float out[8]) {
    const __half2* h = reinterpret_cast<const __half2*>(&word);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __half22float2(h[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}
__device__ __forceinline__ void unpack8(uint4 word, __nv_bfloat16* /*tag*/, float out[8]) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&word);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(h[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}

// Four elements of T in one 64-bit word, widened to f32.
__device__ __forceinline__ float4 unpack4(uint2 word, __half* /*tag*/) {
    const __half2* h = reinterpret_cast<const __half2*>(&word);
    float2 a = __half22float2(h[0]), b = __half22float2(h[1]);
    return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float4 unpack4(uint2 word, __nv_bfloat16* /*tag*/) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&word);
    float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
    return make_float4(a.x, a.y, b.x, b.y);
}

// Programmatic dependent launch (sm_90 and later; nothing before). `step_release` lets the
// next kernel of the step launch now: its blocks run up to their own `step_wait`, which waits
// until this kernel has ended and its writes are visible. Both are no-ops for a launch without
// a programmatic dependency. Every block waits before any early return, so a kernel ends only
// after the one before it ended: the order is transitive along the step. Every kernel of the
// step releases at once (the batched `gemv` after its main loop), and a GEMV loads its first
// weights before it waits (they need nothing from the kernels before it). Releasing the
// streaming GEMV at once rather than after its main loop took the `1b` step from 1,058 to
// 1,040 us and `small`'s from 140 to 137 us on an H100 (`step_bench.cu`).
__device__ __forceinline__ void step_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void step_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Both, for the short kernels.
__device__ __forceinline__ void step_begin() {
    step_release();
    step_wait();
}

__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
}

// The sum of `x` over the block (blockDim.x a multiple of 32, at most 1024); every thread gets
// it. `scratch` holds 32 floats; the block must not use it until the next __syncthreads().
__device__ float block_sum(float x, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    x = warp_sum(x);
    __syncthreads();
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    x = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(x);
}

// As block_sum, for the maximum.
__device__ float block_max(float x, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    x = lane < warps ? scratch[lane] : -INFINITY;
    return warp_max(x);
}

// ---------------------------------------------------------------------------------------------
// Embedding gather: x[b] = embed[history[pos[b] * batch + b]] widened to f32.
// Grid (batch), any block size.
template <typename T>
__device__ void embed(const T* __restrict__ table, const uint32_t* __restrict__ history,
                      const uint32_t* __restrict__ pos, float* __restrict__ x, uint32_t hidden,
                      uint32_t vocab, uint32_t batch, uint32_t capacity) {
    step_begin();
    uint32_t b = blockIdx.x;
    uint32_t p = min(pos[b], capacity - 1);
    uint32_t token = history[(size_t)p * batch + b];
    // A token outside the vocabulary (never written by argmax; the host checks prompts) reads
    // row 0 rather than past the table.
    if (token >= vocab) token = 0;
    const T* row = table + (size_t)token * hidden;
    for (uint32_t i = threadIdx.x; i < hidden; i += blockDim.x)
        x[(size_t)b * hidden + i] = to_float(row[i]);
}

extern "C" __global__ void embed_f16(const __half* table, const uint32_t* history,
                                     const uint32_t* pos, float* x, uint32_t hidden,
                                     uint32_t vocab, uint32_t batch, uint32_t capacity,
                                     cuhal_zone_stamp* zone) {
    CUHAL_ZONE_BEGIN(zone);
    embed(table, history, pos, x, hidden, vocab, batch, capacity);
    CUHAL_ZONE_END(zone);
}
extern "C" __global__ void embed_bf16(const __nv_bfloat16* table, const uint32_t* history,
                                      const uint32_t* pos, float* x, uint32_t hidden,
                                      uint32_t vocab, uint32_t batch, uint32_t capacity,
                                      cuhal_zone_stamp* zone) {
    CUHAL_ZONE_BEGIN(zone);
    embed(table, history, pos, x, hidden, vocab, batch, capacity);
    CUHAL_ZONE_END(zone);
}

// ---------------------------------------------------------------------------------------------
// Batch-small GEMV with the step's element-wise work folded in:
//   y[b][r] = (mode == ACCUMULATE ? y[b][r] : 0) + sum_k w[r][k] * xin[b][k]
// where xin is x, or with `norm` given RMSNorm of x: x[b][k] * rsqrt(mean(x[b]^2) + eps) *
// norm[k] (each block computes its sequences' scales), and with mode SWIGLU the rows are the
// fused gate and up projection (gate rows first, rows / 2 each) and y[b][i] = silu(gate_i) *
// up_i, rows / 2 outputs per sequence.
// Each warp computes GEMV_WARP_ROWS rows (in SWIGLU two gate rows and their two up rows), so
// one load of x serves four rows of weights; GEMV_BATCH sequences per block along y: every
// lane loads 8 weights of each row in one 128-bit load (cols must be a multiple of 8, rows
// 16-byte aligned) and widens them to f32. A block is GEMV_WARPS warps: with `ksplit` 1 each
// has rows of its own; with `ksplit` GEMV_WARPS they share the block's rows, each a quarter of
// the columns, and add their sums in shared memory (more warps in flight for a matrix of few
// rows).
// Grid (ceil(rows / (GEMV_WARP_ROWS * GEMV_WARPS / ksplit)), ceil(batch / GEMV_BATCH)),
// block 32 * GEMV_WARPS.
#define GEMV_WRITE 0
#define GEMV_ACCUMULATE 1
#define GEMV_SWIGLU 2

template <typename T>
__device__ void gemv(const T* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                     const T* __restrict__ norm, float eps, uint32_t rows, uint32_t cols,
                     uint32_t batch, uint32_t mode, uint32_t ksplit) {
    __shared__ float scratch[32];
    __shared__ float scale[GEMV_BATCH];
    __shared__ float partial[GEMV_WARPS][GEMV_WARP_ROWS][GEMV_BATCH];
    uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    bool split = ksplit > 1;
    // The warp's group of rows, and its slice of the columns.
    uint32_t quad = split ? blockIdx.x : blockIdx.x * GEMV_WARPS + warp;
    uint32_t slice = split ? warp : 0, slices = split ? GEMV_WARPS : 1;
    // The warp's rows, and the outputs it writes (SWIGLU: two, else four).
    uint32_t row[GEMV_WARP_ROWS];
    bool valid[GEMV_WARP_ROWS];
    uint32_t outputs = mode == GEMV_SWIGLU ? rows / 2 : rows;
    uint32_t first = mode == GEMV_SWIGLU ? 2 * quad : GEMV_WARP_ROWS * quad;
#pragma unroll
    for (int j = 0; j < GEMV_WARP_ROWS; j++) {
        uint32_t out = mode == GEMV_SWIGLU ? first + (j & 1) : first + j;
        valid[j] = out < outputs;
        // An invalid row reads row 0 (in bounds) and is never written.
        row[j] = valid[j] ? (mode == GEMV_SWIGLU && j >= 2 ? outputs + out : out) : 0;
    }
    const uint4* wrow[GEMV_WARP_ROWS];
#pragma unroll
    for (int j = 0; j < GEMV_WARP_ROWS; j++)
        wrow[j] = reinterpret_cast<const uint4*>(w + (size_t)row[j] * cols);
    uint32_t words = cols / 8;
    // The weights do not depend on the kernel before: their first two strides are on their way
    // to L2 while it ends.
    if (valid[0]) {
        for (uint32_t i = slice * 32 + lane, n = 0; i < words && n < 2; i += 32 * slices, n++)
#pragma unroll
            for (int j = 0; j < GEMV_WARP_ROWS; j++) prefetch_l2(wrow[j] + i);
    }
    step_wait();
    uint32_t b0 = blockIdx.y * GEMV_BATCH;
    if (b0 >= batch) return;  // the whole block leaves
    uint32_t nb = min(batch - b0, (uint32_t)GEMV_BATCH);
    const float* xb = x + (size_t)b0 * cols;
    if (norm != nullptr) {
        // Every thread of the block takes part (before any warp may leave).
        for (uint32_t b = 0; b < nb; b++) {
            const float* row = xb + (size_t)b * cols;
            float sum = 0.0f;
            for (uint32_t i = threadIdx.x; i < cols; i += blockDim.x) sum += row[i] * row[i];
            sum = block_sum(sum, scratch);
            if (threadIdx.x == 0) scale[b] = rsqrtf(sum / (float)cols + eps);
        }
        __syncthreads();
    }
    if (!valid[0]) return;  // with `split`, the whole block (its warps share the rows)
    const uint4* nrow = reinterpret_cast<const uint4*>(norm);
    float acc[GEMV_WARP_ROWS][GEMV_BATCH];
#pragma unroll
    for (int j = 0; j < GEMV_WARP_ROWS; j++)
#pragma unroll
        for (int b = 0; b < GEMV_BATCH; b++) acc[j][b] = 0.0f;
#pragma unroll 2
    for (uint32_t i = slice * 32 + lane; i < words; i += 32 * slices) {
        float wf[GEMV_WARP_ROWS][8];
#pragma unroll
        for (int j = 0; j < GEMV_WARP_ROWS; j++) unpack8(__ldg(wrow[j] + i), (T*)nullptr, wf[j]);
        float nf[8];
        if (norm != nullptr) unpack8(__ldg(nrow + i), (T*)nullptr, nf);
#pragma unroll
        for (int b = 0; b < GEMV_BATCH; b++) {
            if (b < nb) {
                const float4* xv = reinterpret_cast<const float4*>(xb + (size_t)b * cols) + 2 * i;
                float4 lo = xv[0], hi = xv[1];
                float xf[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
                if (norm != nullptr) {
                    float s = scale[b];
#pragma unroll
                    for (int k = 0; k < 8; k++) xf[k] = xf[k] * s * nf[k];
                }
#pragma unroll
                for (int j = 0; j < GEMV_WARP_ROWS; j++)
                    acc[j][b] += wf[j][0] * xf[0] + wf[j][1] * xf[1] + wf[j][2] * xf[2] +
                                 wf[j][3] * xf[3] + wf[j][4] * xf[4] + wf[j][5] * xf[5] +
                                 wf[j][6] * xf[6] + wf[j][7] * xf[7];
            }
        }
    }
    step_release();
#pragma unroll
    for (int b = 0; b < GEMV_BATCH; b++)
#pragma unroll
        for (int j = 0; j < GEMV_WARP_ROWS; j++)
            if (b < nb) acc[j][b] = warp_sum(acc[j][b]);
    if (split) {
        // The warps' sums, added in a fixed order by the first warp.
        if (lane == 0) {
#pragma unroll
            for (int b = 0; b < GEMV_BATCH; b++)
#pragma unroll
                for (int j = 0; j < GEMV_WARP_ROWS; j++)
                    if (b < nb) partial[warp][j][b] = acc[j][b];
        }
        __syncthreads();
        if (warp != 0) return;
#pragma unroll
        for (int b = 0; b < GEMV_BATCH; b++)
#pragma unroll
            for (int j = 0; j < GEMV_WARP_ROWS; j++) {
                if (b < nb) {
                    float sum = 0.0f;
                    for (int w = 0; w < GEMV_WARPS; w++) sum += partial[w][j][b];
                    acc[j][b] = sum;
                }
            }
    }
#pragma unroll
    for (int b = 0; b < GEMV_BATCH; b++) {
        if (b < nb) {
            float s[GEMV_WARP_ROWS];
#pragma unroll
            for (int j = 0; j < GEMV_WARP_ROWS; j++) s[j] = acc[j][b];
            if (lane == 0) {
                float* out = y + (size_t)(b0 + b) * outputs;
                if (mode == GEMV_SWIGLU) {
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        float g = s[j];
                        if (valid[j]) out[first + j] = g / (1.0f + __expf(-g)) * s[j + 2];
                    }
                } else {
#pragma unroll
                    for (int j = 0; j < GEMV_WARP_ROWS; j++) {
                        if (valid[j]) {
                            float* o = out + first + j;
                            *o = mode == GEMV_ACCUMULATE ? *o + s[j] : s[j];
                        }
                    }
                }
            }
        }
    }
}

// One sequence (batch 1), streaming: the block stages x once in shared memory (normalized
// where `norm` is given), then its warps walk groups of R rows (SWIGLU: R/2 gate rows and
// their R/2 up rows), the block's groups strided by the grid, so a grid smaller than the
// matrix (one block per SM) stages its input once and keeps streaming. `ksplit` warps share a
// group, each a slice of the columns, their sums added in shared memory. Each lane holds C
// 128-bit words of each of the R rows; with PIPE the next chunk (of this group or the next) is
// loaded before the current one is used. The first chunk is loaded before `step_wait`
// (weights do not depend on the kernel before). With EARLY the block releases the next kernel
// before that (the decoder's), else after its main loop. Grid any size; block 32 * W; dynamic
// shared memory cols * 4 bytes (cols a multiple of 8); ksplit divides W.
// `gemv_bench.cu` sweeps R, C, W, PIPE, ksplit and the grid per shape, `step_bench.cu` the
// hand-over along a whole step; the decoder's instantiation (GEMV_STREAM_*, EARLY) is the one
// that won there (docs/benchmarks.md; the per-shape tables: `git show bd2a39e:docs/benchmarks.md`).
#define GEMV_STREAM_ROWS 2
#define GEMV_STREAM_CHUNK 4
#define GEMV_STREAM_WARPS 16
template <typename T, int R, int C, int W, bool PIPE, bool EARLY>
__device__ void gemv_stream(const T* __restrict__ w, const float* __restrict__ x,
                            float* __restrict__ y, const T* __restrict__ norm, float eps,
                            uint32_t rows, uint32_t cols, uint32_t mode, uint32_t ksplit) {
    extern __shared__ float4 staged[];
    __shared__ float scratch[32];
    __shared__ float partial[W][R];
    uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    bool swiglu = mode == GEMV_SWIGLU;
    uint32_t outputs = swiglu ? rows / 2 : rows;
    uint32_t per_group = swiglu ? R / 2 : R;
    uint32_t groups = (outputs + per_group - 1) / per_group;
    uint32_t per_block = W / ksplit;  // groups a block walks at once
    uint32_t slice = warp % ksplit, team = warp / ksplit;
    uint32_t words = cols / 8;
    uint32_t span = (words + ksplit - 1) / ksplit;
    uint32_t lo = min(words, slice * span), hi = min(words, lo + span);
    uint32_t chunks = (span + 32 * C - 1) / (32 * C);
    // Block-uniform trip count: the block's passes over its groups, times the chunks of each.
    uint32_t stride = gridDim.x * per_block;
    uint32_t first_group = blockIdx.x * per_block;
    uint32_t passes = first_group < groups ? (groups - first_group + stride - 1) / stride : 0;
    uint32_t steps = passes * chunks;
    // The rows of group g (invalid ones read row 0, in bounds, and are never written).
    auto load = [&](uint32_t step, uint4 (&buf)[R][C]) {
        uint32_t g = first_group + (step / chunks) * stride + team;
        uint32_t base = lo + (step % chunks) * 32 * C;
#pragma unroll
        for (int j = 0; j < R; j++) {
            uint32_t out = g * per_group + (swiglu ? j % (R / 2) : j);
            bool ok = g < groups && out < outputs;
            uint32_t row = ok ? (swiglu && j >= R / 2 ? outputs + out : out) : 0;
            const uint4* p = reinterpret_cast<const uint4*>(w + (size_t)row * cols);
#pragma unroll
            for (int c = 0; c < C; c++) {
                uint32_t i = base + c * 32 + lane;
                buf[j][c] = ok && i < hi ? __ldg(p + i) : make_uint4(0, 0, 0, 0);
            }
        }
    };
    uint4 cur[R][C];
    if (EARLY) step_release();
    if (steps > 0) load(0, cur);
    step_wait();
    // Stage x, normalized where asked (every thread of the block takes part).
    const float4* x4 = reinterpret_cast<const float4*>(x);
    uint32_t quads = cols / 4;
    float sum = 0.0f;
    for (uint32_t i = threadIdx.x; i < quads; i += blockDim.x) {
        float4 v = x4[i];
        staged[i] = v;
        sum += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    if (norm != nullptr) {
        float s = rsqrtf(block_sum(sum, scratch) / (float)cols + eps);
        const uint2* n4 = reinterpret_cast<const uint2*>(norm);
        for (uint32_t i = threadIdx.x; i < quads; i += blockDim.x) {
            float4 v = staged[i];
            float4 n = unpack4(__ldg(n4 + i), (T*)nullptr);
            staged[i] = make_float4(v.x * s * n.x, v.y * s * n.y, v.z * s * n.z, v.w * s * n.w);
        }
    }
    __syncthreads();
    if (steps == 0) return;
    float acc[R] = {};
    for (uint32_t step = 0; step < steps; step++) {
        uint4 next[R][C];
        bool more = step + 1 < steps;
        if (PIPE && more) load(step + 1, next);
        uint32_t base = lo + (step % chunks) * 32 * C;
#pragma unroll
        for (int c = 0; c < C; c++) {
            uint32_t i = base + c * 32 + lane;
            if (i < hi) {
                float4 a = staged[2 * i], b = staged[2 * i + 1];
#pragma unroll
                for (int j = 0; j < R; j++) {
                    float wf[8];
                    unpack8(cur[j][c], (T*)nullptr, wf);
                    acc[j] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w +
                              wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
                }
            }
        }
        if (!EARLY && !more) step_release();
        if (step % chunks == chunks - 1) {
            // The group is done: add the lanes' (and the slices') sums and write.
            uint32_t g = first_group + (step / chunks) * stride + team;
#pragma unroll
            for (int j = 0; j < R; j++) acc[j] = warp_sum(acc[j]);
            if (ksplit > 1) {
                if (lane == 0) {
#pragma unroll
                    for (int j = 0; j < R; j++) partial[warp][j] = acc[j];
                }
                __syncthreads();
                if (slice == 0) {
#pragma unroll
                    for (int j = 0; j < R; j++) {
                        float s = 0.0f;
                        for (uint32_t k = 0; k < ksplit; k++) s += partial[warp + k][j];
                        acc[j] = s;
                    }
                }
                __syncthreads();
            }
            if (lane == 0 && slice == 0 && g < groups) {
#pragma unroll
                for (int j = 0; j < R; j++) {
                    uint32_t out = g * per_group + (swiglu ? j % (R / 2) : j);
                    if (out >= outputs) continue;
                    if (swiglu) {
                        if (j < R / 2) {
                            float gt = acc[j];
                            y[out] = gt / (1.0f + __expf(-gt)) * acc[j + R / 2];
                        }
                    } else {
                        y[out] = mode == GEMV_ACCUMULATE ? y[out] + acc[j] : acc[j];
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < R; j++) acc[j] = 0.0f;
        }
        if (more) {
            if (PIPE) {
#pragma unroll
                for (int j = 0; j < R; j++)
#pragma unroll
                    for (int c = 0; c < C; c++) cur[j][c] = next[j][c];
            } else {
                load(step + 1, cur);
            }
        }
    }
}

extern "C" __global__ void gemv_f16(const __half* w, const float* x, float* y, const __half* norm,
                                    float eps, uint32_t rows, uint32_t cols, uint32_t batch,
                                    uint32_t mode, uint32_t ksplit, cuhal_zone_stamp* zone) {
    CUHAL_ZONE_BEGIN(zone);
    gemv(w, x, y, norm, eps, rows, cols, batch, mode, ksplit);
    CUHAL_ZONE_END(zone);
}
extern "C" __global__ void gemv_bf16(const __nv_bfloat16* w, const float* x, float* y,
                                     const __nv_bfloat16* norm, float eps, uint32_t rows,
                                     uint32_t cols, uint32_t batch, uint32_t mode,
                                     uint32_t ksplit, cuhal_zone_stamp* zone) {
    CUHAL_ZONE_BEGIN(zone);
    gemv(w, x, y, norm, eps, rows, cols, batch, mode, ksplit);
    CUHAL_ZONE_END(zone);
}
extern "C" __global__ void __launch_bounds__(32 * GEMV_STREAM_WARPS)
    gemv_stream_f16(const __half* w, const float* x, float* y, const __half* norm, float eps,
                    uint32_t rows, uint32_t cols, uint32_t mode, uint32_t ksplit,
                    cuhal_zone_stamp* zone) {
    CUHAL_ZONE_BEGIN(zone);
    gemv_stream<__half, GEMV_STREAM_ROWS, GEMV_STREAM_CHUNK, GEMV_STREAM_WARPS, true, true>(
        w, x, y, norm, eps, rows, cols, mode, ksplit);
    CUHAL_ZONE_END(zone);
}
extern "C" __global__ void __launch_bounds__(32 * GEMV_STREAM_WARPS)
    gemv_stream_bf16(const __nv_bfloat16* w, const float* x, float* y,
                     const __nv_bfloat16* norm, float eps, uint32_t rows, uint32_t cols,
                     uint32_t mode, uint32_t ksplit, cuhal_zone_stamp* zone) {
    CUHAL_ZONE_BEGIN(zone);
    gemv_stream<__nv_bfloat16, GEMV_STREAM_ROWS, GEMV_STREAM_CHUNK, GEMV_STREAM_WARPS, true,
                true>(w, x, y, norm, eps, rows, cols, mode, ksplit);
    CUHAL_ZONE_END(zone);
}

// ---------------------------------------------------------------------------------------------
// Rotary embeddings, the cache append and attention of one new token per sequence over its
// cache (positions 0..=pos[b]), grouped-query: query head h reads key/value head
// kv = h / (heads / kv_heads). `qkv[b]` holds q (heads * head_dim), k and v (kv_heads *
// head_dim each) as the fused projection wrote them.
// Rotation is Hugging Face's rotate_half convention: element i of a head's first half turns
// with element i of its second half, by the angle pos * inv_freq[i], computed in f32. Every
// block rotates its query head and its key head; the new key and value, rounded to T as the
// cache holds them, stand in for position pos[b] (so no block reads a cache entry written in
// this launch), and the first query head of each key/value head writes them into the cache,
// laid out [batch][kv_heads][capacity][head_dim], for the steps after this one.
// out[b][h * head_dim + d]. Grid (heads, batch), block ATTENTION_THREADS, dynamic shared
// memory capacity * 4 bytes (the scores).
template <typename T>
__device__ void attention(const float* __restrict__ qkv, const float* __restrict__ inv_freq,
                          T* __restrict__ k_cache, T* __restrict__ v_cache,
                          const uint32_t* __restrict__ pos, float* __restrict__ out,
                          uint32_t heads, uint32_t kv_heads, uint32_t head_dim,
                          uint32_t capacity, float scale) {
    extern __shared__ float scores[];
    __shared__ float q[MAX_HEAD_DIM];
    __shared__ float k_new[MAX_HEAD_DIM];
    __shared__ float v_new[MAX_HEAD_DIM];
    __shared__ float scratch[32];
    step_begin();
    uint32_t h = blockIdx.x, b = blockIdx.y;
    uint32_t p = pos[b];
    if (p >= capacity) return;  // the whole block leaves: no barrier is skipped by some
    uint32_t group = heads / kv_heads;
    uint32_t kh = h / group;
    uint32_t q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
    const float* row = qkv + (size_t)b * (q_dim + 2 * kv_dim);
    const float* q_in = row + h * head_dim;
    const float* k_in = row + q_dim + kh * head_dim;
    const float* v_in = row + q_dim + kv_dim + kh * head_dim;
    size_t base = ((size_t)b * kv_heads + kh) * capacity * head_dim;
    T* keys = k_cache + base;
    T* values = v_cache + base;
    bool writes = h % group == 0;
    uint32_t half_dim = head_dim / 2;
    for (uint32_t j = threadIdx.x; j < half_dim; j += blockDim.x) {
        float s, c;
        sincosf((float)p * inv_freq[j], &s, &c);
        float u = q_in[j], v = q_in[j + half_dim];
        q[j] = u * c - v * s;
        q[j + half_dim] = v * c + u * s;
        u = k_in[j];
        v = k_in[j + half_dim];
        T ka = from_float<T>(u * c - v * s), kb = from_float<T>(v * c + u * s);
        k_new[j] = to_float(ka);
        k_new[j + half_dim] = to_float(kb);
        if (writes) {
            keys[(size_t)p * head_dim + j] = ka;
            keys[(size_t)p * head_dim + j + half_dim] = kb;
        }
    }
    for (uint32_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
        T vv = from_float<T>(v_in[d]);
        v_new[d] = to_float(vv);
        if (writes) values[(size_t)p * head_dim + d] = vv;
    }
    __syncthreads();
    // Scores: a thread per position, its key read 8 elements (16 bytes) at a time, so every
    // key of the block is in flight at once; the new position's key from shared memory.
    uint32_t words = head_dim / 8;
    float local_max = -INFINITY;
    for (uint32_t t = threadIdx.x; t <= p; t += blockDim.x) {
        float dot = 0.0f;
        if (t == p) {
            for (uint32_t d = 0; d < head_dim; d++) dot += q[d] * k_new[d];
        } else {
            const uint4* key = reinterpret_cast<const uint4*>(keys + (size_t)t * head_dim);
#pragma unroll 4
            for (uint32_t w = 0; w < words; w++) {
                float kf[8];
                unpack8(key[w], (T*)nullptr, kf);
#pragma unroll
                for (int k = 0; k < 8; k++) dot += q[8 * w + k] * kf[k];
            }
        }
        dot *= scale;
        scores[t] = dot;
        local_max = fmaxf(local_max, dot);
    }
    float m = block_max(local_max, scratch);
    __syncthreads();  // every score is written
    float local_sum = 0.0f;
    for (uint32_t t = threadIdx.x; t <= p; t += blockDim.x) {
        float e = __expf(scores[t] - m);
        scores[t] = e;
        local_sum += e;
    }
    float total = block_sum(local_sum, scratch);
    __syncthreads();  // every weight is written
    // Values: `words` threads cover a row 8 elements each; the block's threads form `groups`
    // such row teams, each a stride of positions; the groups' sums are added in shared memory.
    float inv = 1.0f / total;
    uint32_t groups = blockDim.x / words, g = threadIdx.x / words, w = threadIdx.x % words;
    float acc[8];
#pragma unroll
    for (int k = 0; k < 8; k++) acc[k] = 0.0f;
    if (g < groups) {
#pragma unroll 4
        for (uint32_t t = g; t <= p; t += groups) {
            float e = scores[t];
            float vf[8];
            if (t == p) {
#pragma unroll
                for (int k = 0; k < 8; k++) vf[k] = v_new[8 * w + k];
            } else {
                unpack8(reinterpret_cast<const uint4*>(values + (size_t)t * head_dim)[w],
                        (T*)nullptr, vf);
            }
#pragma unroll
            for (int k = 0; k < 8; k++) acc[k] += e * vf[k];
        }
    }
    __shared__ float partial[ATTENTION_THREADS * 8];
    if (g < groups) {
#pragma unroll
        for (int k = 0; k < 8; k++) partial[g * head_dim + 8 * w + k] = acc[k];
    }
    __syncthreads();
    for (uint32_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float sum = 0.0f;
        for (uint32_t i = 0; i < groups; i++) sum += partial[i * head_dim + d];
        out[(size_t)b * q_dim + h * head_dim + d] = sum * inv;
    }
}

extern "C" __global__ void attention_f16(const float* qkv, const float* inv_freq,
                                         __half* k_cache, __half* v_cache, const uint32_t* pos,
                                         float* out, uint32_t heads, uint32_t kv_heads,
                                         uint32_t head_dim, uint32_t capacity, float scale,
                                         cuhal_zone_stamp* zone) {
    CUHAL_ZONE_BEGIN(zone);
    attention(qkv, inv_freq, k_cache, v_cache, pos, out, heads, kv_heads, head_dim, capacity,
              scale);
    CUHAL_ZONE_END(zone);
}
extern "C" __global__ void attention_bf16(const float* qkv, const float* inv_freq,
                                          __nv_bfloat16* k_cache, __nv_bfloat16* v_cache,
                                          const uint32_t* pos, float* out, uint32_t heads,
                                          uint32_t kv_heads, uint32_t head_dim,
                                          uint32_t capacity, float scale,
                                          cuhal_zone_stamp* zone) {
    CUHAL_ZONE_BEGIN(zone);
    attention(qkv, inv_freq, k_cache, v_cache, pos, out, heads, kv_heads, head_dim, capacity,
              scale);
    CUHAL_ZONE_END(zone);
}

// ---------------------------------------------------------------------------------------------
// Greedy sampling: the first index of the largest logit of each sequence becomes its next
// token. The token is written at history[(pos + 1) * batch + b] unless that position still
// holds the prompt (pos + 1 < prompt_len[b]: the step was a prefill step), and pos advances,
// so the next replay of the step reads both from device memory.
// Blocks split the row: each folds its best (value, index) into best[b] with one 64-bit
// atomicMax on a key that orders by value, then by the lower index (NaN never wins), and the
// last block of the row to arrive (arrived[b]) writes the token, advances pos and resets
// best[b] and arrived[b] to 0 for the next step (both start at 0). Deterministic: the maximum
// of the keys does not depend on the order the blocks arrive in.
// Grid (ceil(vocab / (ARGMAX_THREADS * ARGMAX_PER_THREAD)), batch), block ARGMAX_THREADS.

// A key whose unsigned order is the order of (value, then lower index); 0 for NaN.
__device__ __forceinline__ unsigned long long argmax_key(float v, uint32_t i) {
    if (v != v) return 0ull;
    uint32_t u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (unsigned long long)(0xffffffffu - i);
}

extern "C" __global__ void argmax_advance(const float* __restrict__ logits, uint32_t* history,
                                          uint32_t* pos, const uint32_t* __restrict__ prompt_len,
                                          unsigned long long* best, uint32_t* arrived,
                                          uint32_t vocab, uint32_t batch, uint32_t capacity,
                                          cuhal_zone_stamp* zone) {
    CUHAL_ZONE_BEGIN(zone);
    __shared__ unsigned long long keys[32];
    step_begin();
    uint32_t b = blockIdx.y;
    const float* row = logits + (size_t)b * vocab;
    uint32_t chunk = (vocab + gridDim.x - 1) / gridDim.x;
    uint32_t from = blockIdx.x * chunk, to = min(vocab, from + chunk);
    unsigned long long key = 0ull;
    for (uint32_t i = from + threadIdx.x; i < to; i += blockDim.x) {
        unsigned long long k = argmax_key(row[i], i);
        key = k > key ? k : key;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        unsigned long long other = __shfl_xor_sync(0xffffffffu, key, offset);
        key = other > key ? other : key;
    }
    uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) keys[warp] = key;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (uint32_t w = 1; w < warps; w++) key = keys[w] > key ? keys[w] : key;
        atomicMax(&best[b], key);
        __threadfence();
        if (atomicAdd(&arrived[b], 1u) == gridDim.x - 1) {
            unsigned long long top = atomicExch(&best[b], 0ull);
            arrived[b] = 0;
            // Every logit NaN (no key above 0): token 0.
            uint32_t index = top == 0ull ? 0u : 0xffffffffu - (uint32_t)(top & 0xffffffffull);
            if (index >= vocab) index = 0;
            uint32_t next = pos[b] + 1;
            if (next < capacity && next >= prompt_len[b]) history[(size_t)next * batch + b] = index;
            pos[b] = next;
        }
    }
    CUHAL_ZONE_END(zone);
}
