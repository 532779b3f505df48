// What CUPTI leaves behind once its activity kinds are disabled: the replay time of a
// 100-kernel graph (each kernel ~1 us) untraced, while CUPTI's kinds are on, after they are
// turned off again, for an executable instantiated after that, under the driver-API callback
// subscription alone, and sampled (kinds on around the launch of 1 replay in N) with what
// follows the sampled launch varied: nothing, a flush, a forced flush, a wait for the replay
// and a flush, or the next (unsampled) replay launched and waited for, with or without a flush. Each phase is the median of ROUNDS samples of REPLAYS back-to-back replays.
// CUPTI is loaded with dlopen (CUHAL_CUPTI_LIBRARY, else the loader's path, else
// /usr/local/cuda), as the trace crate loads it. On a machine with nvcc and a GPU (CUPTI 13's
// headers on the include path):
//   nvcc -O3 -std=c++17 -arch=sm_90 -I$CUPTI/include -o cupti_residue cupti_residue.cu -ldl
//   ./cupti_residue [REPLAYS ROUNDS]
#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <dlfcn.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#define CK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { printf("CUDA error %s at %d\n", cudaGetErrorString(err_), __LINE__); exit(1); } } while (0)
#define CP(x) do { CUptiResult r_ = (x); if (r_ != CUPTI_SUCCESS) { printf("CUPTI error %d at %d\n", (int)r_, __LINE__); exit(1); } } while (0)

__global__ void spin(unsigned long long ns, int* sink) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
    if (threadIdx.x == 0 && t == 0) *sink = 1;
}

struct Cupti {
    CUptiResult (*registerCallbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
    CUptiResult (*enable)(CUpti_ActivityKind);
    CUptiResult (*disable)(CUpti_ActivityKind);
    CUptiResult (*flushAll)(uint32_t);
    CUptiResult (*subscribe)(CUpti_SubscriberHandle*, CUpti_CallbackFunc, void*);
    CUptiResult (*unsubscribe)(CUpti_SubscriberHandle);
    CUptiResult (*enableCallback)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId);
};
static size_t records = 0;
static void CUPTIAPI requested(uint8_t** buffer, size_t* size, size_t* max) {
    *size = 8 << 20; *buffer = (uint8_t*)aligned_alloc(8, *size); *max = 0;
}
static void CUPTIAPI completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    static CUptiResult (*next)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
    if (!next) next = (CUptiResult(*)(uint8_t*, size_t, CUpti_Activity**))dlsym(RTLD_DEFAULT, "cuptiActivityGetNextRecord");
    CUpti_Activity* r = nullptr;
    while (next && next(buffer, valid, &r) == CUPTI_SUCCESS) records++;
    free(buffer);
}
static void CUPTIAPI on_callback(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*) {}

const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};
// Driver-API callbacks the trace crate subscribes to: cuMemset*Async, cuMemcpy*Async,
// cuLaunchKernel, cuGraphLaunch, cuLaunchKernelEx (ids of cupti_driver_cbid.h, as in ffi.rs).
const CUpti_CallbackId launches[] = {216, 218, 220, 277, 279, 281, 306, 307, 514, 652};

int main(int argc, char** argv) {
    int replays = argc > 1 ? atoi(argv[1]) : 64, rounds = argc > 2 ? atoi(argv[2]) : 9;
    const char* env = getenv("CUHAL_CUPTI_LIBRARY");
    const char* paths[] = {env ? env : "libcupti.so.13", "libcupti.so.13", "libcupti.so", "/usr/local/cuda/lib64/libcupti.so.13", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13"};
    void* lib = nullptr;
    for (auto p : paths) if ((lib = dlopen(p, RTLD_NOW | RTLD_GLOBAL))) { printf("CUPTI: %s\n", p); break; }
    if (!lib) { printf("no CUPTI library\n"); return 2; }
    Cupti c;
#define SYM(field, name) c.field = (decltype(c.field))dlsym(lib, name); if (!c.field) { printf("no %s\n", name); return 2; }
    SYM(registerCallbacks, "cuptiActivityRegisterCallbacks"); SYM(enable, "cuptiActivityEnable"); SYM(disable, "cuptiActivityDisable");
    SYM(flushAll, "cuptiActivityFlushAll"); SYM(subscribe, "cuptiSubscribe");
    SYM(unsubscribe, "cuptiUnsubscribe"); SYM(enableCallback, "cuptiEnableCallback");

    cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    int* sink; CK(cudaMalloc(&sink, 4));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    auto instantiate = [&]() {
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < 100; i++) spin<<<1, 32, 0, st>>>(800, sink);
        cudaGraph_t g; CK(cudaStreamEndCapture(st, &g));
        cudaGraphExec_t e; CK(cudaGraphInstantiate(&e, g, 0)); CK(cudaGraphDestroy(g));
        CK(cudaGraphUpload(e, st)); CK(cudaStreamSynchronize(st));
        return e;
    };
    auto set_kinds = [&](bool on) { for (auto k : kinds) CP(on ? c.enable(k) : c.disable(k)); };
    // How a sampled replay is issued: the kinds on around its launch, then (by `after`)
    // nothing, a flush at once, a forced flush at once, or a wait for the replay and a flush.
    enum After { NOTHING, FLUSH, FORCED, WAIT_FLUSH, TOGGLE_ONLY, NEXT_IDLE, NEXT_IDLE_FLUSH };
    // Median time per replay (us) of `replays` back-to-back replays; with `every` > 0 the kinds
    // are on for the first replay of each `every` (and flushed after the round).
    auto timed = [&](cudaGraphExec_t e, int every, After after) {
        std::vector<float> t;
        for (int r = 0; r < rounds; r++) {
            CK(cudaGraphLaunch(e, st)); CK(cudaStreamSynchronize(st));
            CK(cudaEventRecord(e0, st));
            for (int i = 0; i < replays; i++) {
                bool sampled = every > 0 && i % every == 0;
                if (sampled) set_kinds(true);
                if (sampled && after == TOGGLE_ONLY) set_kinds(false);
                CK(cudaGraphLaunch(e, st));
                if (!sampled || after == TOGGLE_ONLY) continue;
                set_kinds(false);
                if (after == FLUSH) CP(c.flushAll(0));
                if (after == FORCED) CP(c.flushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
                if (after == WAIT_FLUSH) { CK(cudaStreamSynchronize(st)); CP(c.flushAll(0)); }
                if (after == NEXT_IDLE || after == NEXT_IDLE_FLUSH) {
                    // The next replay, unsampled, then the GPU idle once.
                    if (++i < replays) CK(cudaGraphLaunch(e, st));
                    CK(cudaStreamSynchronize(st));
                    if (after == NEXT_IDLE_FLUSH) CP(c.flushAll(0));
                }
            }
            CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1));
            if (every > 0) CP(c.flushAll(0));
            float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); t.push_back(ms * 1000 / replays);
        }
        std::sort(t.begin(), t.end());
        return std::vector<float>{t[rounds / 2], t.front(), t.back()};
    };
    float base = 0;
    auto show = [&](const char* what, std::vector<float> v) {
        if (base == 0) base = v[0];
        printf("  %-58s %7.1f us (%.1f-%.1f) %.2fx\n", what, v[0], v[1], v[2], v[0] / base);
    };
    cudaGraphExec_t a = instantiate();
    show("untraced, CUPTI loaded", timed(a, 0, NOTHING));
    CP(c.registerCallbacks(requested, completed));
    show("buffers registered", timed(a, 0, NOTHING));
    CUpti_SubscriberHandle sub;
    CP(c.subscribe(&sub, (CUpti_CallbackFunc)on_callback, nullptr));
    for (auto id : launches) CP(c.enableCallback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, id));
    show("+ driver-API launch callbacks", timed(a, 0, NOTHING));
    set_kinds(true);
    show("kinds on (every replay traced)", timed(a, 0, NOTHING));
    set_kinds(false); CP(c.flushAll(0));
    show("kinds off again, same executable", timed(a, 0, NOTHING));
    cudaGraphExec_t b = instantiate();
    show("kinds off, executable instantiated after", timed(b, 0, NOTHING));
    // What follows each sampled launch, in the order the variants are timed.
    const struct { After after; const char* what; } variants[] = {
        {NOTHING, "kinds on around the launch"},
        {FLUSH, "... then flush at once"},
        {FORCED, "... then forced flush at once"},
        {WAIT_FLUSH, "... then wait for it, flush"},
        {NEXT_IDLE, "... then the next replay, wait"},
        {NEXT_IDLE_FLUSH, "... then the next replay, wait, flush"},
        {TOGGLE_ONLY, "kinds toggled, no launch inside"},
    };
    for (int every : {16, 64}) {
        for (auto v : variants) {
            char what[96];
            snprintf(what, sizeof what, "1 in %d: %s", every, v.what);
            show(what, timed(a, every, v.after));
        }
    }
    show("after the sampling, same executable", timed(a, 0, NOTHING));
    for (auto id : launches) CP(c.enableCallback(0, sub, CUPTI_CB_DOMAIN_DRIVER_API, id));
    CP(c.unsubscribe(sub));
    show("callbacks off, unsubscribed", timed(a, 0, NOTHING));
    printf("  activity records: %zu\n", records);
    return 0;
}
