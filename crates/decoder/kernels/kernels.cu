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
// - rows are row-major, projections `[out, in]` as Hugging Face stores them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// Sequences one GEMV block computes at once: each warp keeps this many sums, and reads each
// weight once for all of them.
#define GEMV_BATCH 8
// Rows (one per warp) of a GEMV block.
#define GEMV_ROWS 8
// The widest head `attention` takes (its query lives in shared memory).
#define MAX_HEAD_DIM 256
// Threads of an attention block (at least MAX_HEAD_DIM).
#define ATTENTION_THREADS 256

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
                                     uint32_t vocab, uint32_t batch, uint32_t capacity) {
    embed(table, history, pos, x, hidden, vocab, batch, capacity);
}
extern "C" __global__ void embed_bf16(const __nv_bfloat16* table, const uint32_t* history,
                                      const uint32_t* pos, float* x, uint32_t hidden,
                                      uint32_t vocab, uint32_t batch, uint32_t capacity) {
    embed(table, history, pos, x, hidden, vocab, batch, capacity);
}

// ---------------------------------------------------------------------------------------------
// RMSNorm: out[b] = x[b] / sqrt(mean(x[b]^2) + eps) * weight. Grid (batch), block 256.
template <typename T>
__device__ void rms_norm(const float* __restrict__ x, const T* __restrict__ weight,
                         float* __restrict__ out, uint32_t hidden, float eps) {
    __shared__ float scratch[32];
    const float* row = x + (size_t)blockIdx.x * hidden;
    float sum = 0.0f;
    for (uint32_t i = threadIdx.x; i < hidden; i += blockDim.x) sum += row[i] * row[i];
    sum = block_sum(sum, scratch);
    float scale = rsqrtf(sum / (float)hidden + eps);
    float* o = out + (size_t)blockIdx.x * hidden;
    for (uint32_t i = threadIdx.x; i < hidden; i += blockDim.x)
        o[i] = row[i] * scale * to_float(weight[i]);
}

extern "C" __global__ void rms_norm_f16(const float* x, const __half* weight, float* out,
                                        uint32_t hidden, float eps) {
    rms_norm(x, weight, out, hidden, eps);
}
extern "C" __global__ void rms_norm_bf16(const float* x, const __nv_bfloat16* weight, float* out,
                                         uint32_t hidden, float eps) {
    rms_norm(x, weight, out, hidden, eps);
}

// ---------------------------------------------------------------------------------------------
// Batch-small GEMV: y[b][r] = (accumulate ? y[b][r] : 0) + sum_k w[r][k] * x[b][k].
// One warp per row, GEMV_ROWS rows per block, GEMV_BATCH sequences per block along y: every
// lane loads 8 weights in one 128-bit load (cols must be a multiple of 8, rows 16-byte
// aligned), widens them to f32 and multiplies them into each sequence's sum.
// Grid (ceil(rows / GEMV_ROWS), ceil(batch / GEMV_BATCH)), block 32 * GEMV_ROWS.
template <typename T>
__device__ void gemv(const T* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                     uint32_t rows, uint32_t cols, uint32_t batch, uint32_t accumulate) {
    uint32_t lane = threadIdx.x & 31;
    uint32_t row = blockIdx.x * GEMV_ROWS + (threadIdx.x >> 5);
    uint32_t b0 = blockIdx.y * GEMV_BATCH;
    if (row >= rows || b0 >= batch) return;
    uint32_t nb = min(batch - b0, (uint32_t)GEMV_BATCH);
    const uint4* wrow = reinterpret_cast<const uint4*>(w + (size_t)row * cols);
    const float* xb = x + (size_t)b0 * cols;
    float acc[GEMV_BATCH];
#pragma unroll
    for (int b = 0; b < GEMV_BATCH; b++) acc[b] = 0.0f;
    uint32_t words = cols / 8;
#pragma unroll 4
    for (uint32_t i = lane; i < words; i += 32) {
        float wf[8];
        unpack8(__ldg(wrow + i), (T*)nullptr, wf);
#pragma unroll
        for (int b = 0; b < GEMV_BATCH; b++) {
            if (b < nb) {
                const float4* xv = reinterpret_cast<const float4*>(xb + (size_t)b * cols) + 2 * i;
                float4 lo = xv[0], hi = xv[1];
                acc[b] += wf[0] * lo.x + wf[1] * lo.y + wf[2] * lo.z + wf[3] * lo.w +
                          wf[4] * hi.x + wf[5] * hi.y + wf[6] * hi.z + wf[7] * hi.w;
            }
        }
    }
#pragma unroll
    for (int b = 0; b < GEMV_BATCH; b++) {
        if (b < nb) {
            float s = warp_sum(acc[b]);
            if (lane == 0) {
                float* out = y + (size_t)(b0 + b) * rows + row;
                *out = accumulate ? *out + s : s;
            }
        }
    }
}

extern "C" __global__ void gemv_f16(const __half* w, const float* x, float* y, uint32_t rows,
                                    uint32_t cols, uint32_t batch, uint32_t accumulate) {
    gemv(w, x, y, rows, cols, batch, accumulate);
}
extern "C" __global__ void gemv_bf16(const __nv_bfloat16* w, const float* x, float* y,
                                     uint32_t rows, uint32_t cols, uint32_t batch,
                                     uint32_t accumulate) {
    gemv(w, x, y, rows, cols, batch, accumulate);
}

// ---------------------------------------------------------------------------------------------
// Rotary embeddings and the cache append. `qkv[b]` holds q (heads * head_dim), k and v
// (kv_heads * head_dim each) as the fused projection wrote them. Rotates q in place (Hugging
// Face's rotate_half convention: element i of a head's first half turns with element i of its
// second half, by the angle pos * inv_freq[i], computed in f32), rotates k, and writes k and v
// at position pos[b] of the layer's cache, laid out [batch][kv_heads][capacity][head_dim].
// Grid (batch), block 256.
template <typename T>
__device__ void rope_append(float* __restrict__ qkv, const float* __restrict__ inv_freq,
                            const uint32_t* __restrict__ pos, T* __restrict__ k_cache,
                            T* __restrict__ v_cache, uint32_t heads, uint32_t kv_heads,
                            uint32_t head_dim, uint32_t capacity) {
    uint32_t b = blockIdx.x;
    uint32_t p = pos[b];
    if (p >= capacity) return;
    uint32_t half_dim = head_dim / 2;
    uint32_t q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
    float* row = qkv + (size_t)b * (q_dim + 2 * kv_dim);
    for (uint32_t i = threadIdx.x; i < (heads + kv_heads) * half_dim; i += blockDim.x) {
        uint32_t head = i / half_dim, j = i % half_dim;
        float angle = (float)p * inv_freq[j];
        float s, c;
        sincosf(angle, &s, &c);
        float* h = row + head * head_dim;  // q heads, then k heads right after them
        float u = h[j], v = h[j + half_dim];
        float a = u * c - v * s, bb = v * c + u * s;
        if (head < heads) {
            h[j] = a;
            h[j + half_dim] = bb;
        } else {
            uint32_t kh = head - heads;
            T* dst = k_cache + (((size_t)b * kv_heads + kh) * capacity + p) * head_dim;
            dst[j] = from_float<T>(a);
            dst[j + half_dim] = from_float<T>(bb);
        }
    }
    const float* v = row + q_dim + kv_dim;
    for (uint32_t i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        uint32_t kh = i / head_dim, d = i % head_dim;
        v_cache[(((size_t)b * kv_heads + kh) * capacity + p) * head_dim + d] = from_float<T>(v[i]);
    }
}

extern "C" __global__ void rope_append_f16(float* qkv, const float* inv_freq, const uint32_t* pos,
                                           __half* k_cache, __half* v_cache, uint32_t heads,
                                           uint32_t kv_heads, uint32_t head_dim,
                                           uint32_t capacity) {
    rope_append(qkv, inv_freq, pos, k_cache, v_cache, heads, kv_heads, head_dim, capacity);
}
extern "C" __global__ void rope_append_bf16(float* qkv, const float* inv_freq,
                                            const uint32_t* pos, __nv_bfloat16* k_cache,
                                            __nv_bfloat16* v_cache, uint32_t heads,
                                            uint32_t kv_heads, uint32_t head_dim,
                                            uint32_t capacity) {
    rope_append(qkv, inv_freq, pos, k_cache, v_cache, heads, kv_heads, head_dim, capacity);
}

// ---------------------------------------------------------------------------------------------
// Attention of one new token per sequence over its cache (positions 0..=pos[b]), grouped-query:
// query head h reads key/value head h / (heads / kv_heads). out[b][h * head_dim + d].
// Grid (heads, batch), block ATTENTION_THREADS, dynamic shared memory capacity * 4 bytes (the
// scores).
template <typename T>
__device__ void attention(const float* __restrict__ qkv, const T* __restrict__ k_cache,
                          const T* __restrict__ v_cache, const uint32_t* __restrict__ pos,
                          float* __restrict__ out, uint32_t heads, uint32_t kv_heads,
                          uint32_t head_dim, uint32_t capacity, float scale) {
    extern __shared__ float scores[];
    __shared__ float q[MAX_HEAD_DIM];
    __shared__ float scratch[32];
    uint32_t h = blockIdx.x, b = blockIdx.y;
    uint32_t p = pos[b];
    if (p >= capacity) return;  // the whole block leaves: no barrier is skipped by some
    uint32_t kh = h / (heads / kv_heads);
    uint32_t q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
    const float* qrow = qkv + (size_t)b * (q_dim + 2 * kv_dim) + h * head_dim;
    for (uint32_t d = threadIdx.x; d < head_dim; d += blockDim.x) q[d] = qrow[d];
    __syncthreads();
    size_t base = ((size_t)b * kv_heads + kh) * capacity * head_dim;
    const T* keys = k_cache + base;
    const T* values = v_cache + base;
    uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    // Scores: a warp per position.
    float local_max = -INFINITY;
    for (uint32_t t = warp; t <= p; t += warps) {
        const T* key = keys + (size_t)t * head_dim;
        float dot = 0.0f;
        for (uint32_t d = lane; d < head_dim; d += 32) dot += q[d] * to_float(key[d]);
        dot = warp_sum(dot) * scale;
        if (lane == 0) scores[t] = dot;
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
    // Values: the block's threads split into `groups` of head_dim threads, each group a
    // stride of positions; thread d of a group sums dimension d; the groups' sums are added.
    float inv = 1.0f / total;
    uint32_t groups = blockDim.x / head_dim, g = threadIdx.x / head_dim, d = threadIdx.x % head_dim;
    float acc = 0.0f;
    if (g < groups) {
        for (uint32_t t = g; t <= p; t += groups)
            acc += scores[t] * to_float(values[(size_t)t * head_dim + d]);
    }
    __shared__ float partial[ATTENTION_THREADS];
    partial[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x < head_dim) {
        float sum = 0.0f;
        for (uint32_t i = 0; i < groups; i++) sum += partial[i * head_dim + threadIdx.x];
        out[(size_t)b * q_dim + h * head_dim + threadIdx.x] = sum * inv;
    }
}

extern "C" __global__ void attention_f16(const float* qkv, const __half* k_cache,
                                         const __half* v_cache, const uint32_t* pos, float* out,
                                         uint32_t heads, uint32_t kv_heads, uint32_t head_dim,
                                         uint32_t capacity, float scale) {
    attention(qkv, k_cache, v_cache, pos, out, heads, kv_heads, head_dim, capacity, scale);
}
extern "C" __global__ void attention_bf16(const float* qkv, const __nv_bfloat16* k_cache,
                                          const __nv_bfloat16* v_cache, const uint32_t* pos,
                                          float* out, uint32_t heads, uint32_t kv_heads,
                                          uint32_t head_dim, uint32_t capacity, float scale) {
    attention(qkv, k_cache, v_cache, pos, out, heads, kv_heads, head_dim, capacity, scale);
}

// ---------------------------------------------------------------------------------------------
// SwiGLU: act[b][i] = silu(gu[b][i]) * gu[b][inter + i], where gu[b] is the fused gate and up
// projection (gate rows first). Grid (ceil(inter / 256), batch), block 256.
extern "C" __global__ void swiglu(const float* __restrict__ gu, float* __restrict__ act,
                                  uint32_t inter) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
    if (i >= inter) return;
    const float* row = gu + (size_t)b * 2 * inter;
    float g = row[i];
    act[(size_t)b * inter + i] = g / (1.0f + __expf(-g)) * row[inter + i];
}

// ---------------------------------------------------------------------------------------------
// Residual add: x[i] += y[i] for i < n (the GEMV fuses it where it writes; this is the
// stand-alone form for other producers). Grid (ceil(n / 256)), block 256.
extern "C" __global__ void residual_add(float* __restrict__ x, const float* __restrict__ y,
                                        uint32_t n) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// ---------------------------------------------------------------------------------------------
// Greedy sampling: the first index of the largest logit of each sequence becomes its next
// token. The token is written at history[(pos + 1) * batch + b] unless that position still
// holds the prompt (pos + 1 < prompt_len[b]: the step was a prefill step), and pos advances,
// so the next replay of the step reads both from device memory.
// Grid (batch), block 1024.
extern "C" __global__ void argmax_advance(const float* __restrict__ logits, uint32_t* history,
                                          uint32_t* pos, const uint32_t* __restrict__ prompt_len,
                                          uint32_t vocab, uint32_t batch, uint32_t capacity) {
    __shared__ float best_value[32];
    __shared__ uint32_t best_index[32];
    uint32_t b = blockIdx.x;
    const float* row = logits + (size_t)b * vocab;
    float value = -INFINITY;
    uint32_t index = 0xffffffffu;
    for (uint32_t i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = row[i];
        if (v > value) {  // strictly larger: the lowest index wins a tie (NaN never wins)
            value = v;
            index = i;
        }
    }
    // Warp, then block: the larger value, or the lower index of equal values.
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, value, offset);
        uint32_t oi = __shfl_xor_sync(0xffffffffu, index, offset);
        if (ov > value || (ov == value && oi < index)) {
            value = ov;
            index = oi;
        }
    }
    uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) {
        best_value[warp] = value;
        best_index[warp] = index;
    }
    __syncthreads();
    if (warp == 0) {
        value = lane < warps ? best_value[lane] : -INFINITY;
        index = lane < warps ? best_index[lane] : 0xffffffffu;
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, value, offset);
            uint32_t oi = __shfl_xor_sync(0xffffffffu, index, offset);
            if (ov > value || (ov == value && oi < index)) {
                value = ov;
                index = oi;
            }
        }
        if (lane == 0) {
            if (index >= vocab) index = 0;  // every logit NaN: token 0
            uint32_t next = pos[b] + 1;
            if (next < capacity && next >= prompt_len[b]) history[(size_t)next * batch + b] = index;
            pos[b] = next;
        }
    }
}
