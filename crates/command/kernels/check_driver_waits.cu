// Which driver calls of an indirect dispatch's set-up and tear-down wait for work already on the
// device: a kernel spins on a host flag on stream S, a watchdog thread sets the flag after 1 s,
// and each call is timed while the spinner runs (>= ~1000 ms: the call waited for the device).
//
//   nvcc -o /tmp/check_driver_waits crates/command/kernels/check_driver_waits.cu -lcuda
//   /tmp/check_driver_waits crates/command/kernels/indirect_sm_90.cubin [blocking]
//
// With a second argument the spinning stream is a blocking one. Reuses check_indirect.cu's
// graph fragment.
#define main check_main
#include "check_indirect.cu"
#undef main
#include <atomic>
#include <chrono>
#include <thread>
static const char* SPIN = R"(
.version 7.8
.target sm_90
.address_size 64
.visible .entry spin(.param .u64 f)
{
    .reg .pred %p<2>; .reg .b32 %r<2>; .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [f];
L:  ld.volatile.u32 %r1, [%rd1];
    setp.eq.u32 %p1, %r1, 0;
    @%p1 bra L;
    ret;
}
)";
int main(int argc, char** argv) {
    FILE* f = fopen(argv[1], "rb");
    std::vector<char> image; char buf[4096]; size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) image.insert(image.end(), buf, buf + n);
    CUdevice dev; CUcontext ctx;
    CK(cuInit(0)); CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
    CUmodule sm, km, hm, hm2; CUfunction spin, helper, helper2, count_blocks;
    CK(cuModuleLoadData(&sm, SPIN)); CK(cuModuleGetFunction(&spin, sm, "spin"));
    volatile unsigned* flag; CUdeviceptr dflag;
    CK(cuMemHostAlloc((void**)&flag, 4, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    CK(cuMemHostGetDevicePointer(&dflag, (void*)flag, 0));
    CUstream s; CK(cuStreamCreate(&s, argc > 2 ? 0 : CU_STREAM_NON_BLOCKING));
    CUdeviceptr counts, hits; CK(cuMemAlloc(&counts, 16)); CK(cuMemAlloc(&hits, 16));
    unsigned* st_host = nullptr; CUdeviceptr status = 0;
    CUgraph graph; CUgraphExec exec; Fragment frag; CUstream up;
    auto step = [&](const char* what, auto&& body) -> int {
        *flag = 0;
        void* a[] = {&dflag};
        CK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s, a, nullptr));
        std::atomic<bool> done{false};
        std::thread w([&] { std::this_thread::sleep_for(std::chrono::milliseconds(1000)); *flag = 1; done = true; });
        auto t0 = std::chrono::steady_clock::now();
        CUresult r = body();
        double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        const char* name = "?"; cuGetErrorName(r, &name);
        printf("%-44s %8.1f ms %s %s\n", what, ms, ms >= 900 ? "WAITED" : "no wait", r ? name : "");
        w.join();
        CK(cuStreamSynchronize(s));
        return 0;
    };
    step("load plain PTX module + get function", [&] { CUresult r = cuModuleLoadData(&km, PTX); return r ? r : cuModuleGetFunction(&count_blocks, km, "count_blocks"); });
    step("load helper cubin (first) + get function", [&] { CUresult r = cuModuleLoadData(&hm, image.data()); return r ? r : cuModuleGetFunction(&helper, hm, "cuhal_indirect_apply"); });
    step("load helper cubin (second) + get function", [&] { CUresult r = cuModuleLoadData(&hm2, image.data()); return r ? r : cuModuleGetFunction(&helper2, hm2, "cuhal_indirect_apply"); });
    step("cuMemHostAlloc (mapped status)", [&] { CUresult r = cuMemHostAlloc((void**)&st_host, 16, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE); return r ? r : cuMemHostGetDevicePointer(&status, st_host, 0); });
    step("graph create + helper/updatable nodes", [&] { CUresult r = cuGraphCreate(&graph, 0); return r ? r : add_fragment(graph, helper, count_blocks, nullptr, 0, counts, hits, status, &frag); });
    step("cuGraphInstantiate", [&] { return cuGraphInstantiate(&exec, graph, 0); });
    step("cuStreamCreate (non-blocking)", [&] { return cuStreamCreate(&up, CU_STREAM_NON_BLOCKING); });
    step("cuGraphUpload + sync upload stream", [&] { CUresult r = cuGraphUpload(exec, up); return r ? r : cuStreamSynchronize(up); });
    step("cuGraphLaunch on the spinning stream", [&] { return cuGraphLaunch(exec, s); });
    step("cuStreamDestroy (upload stream)", [&] { return cuStreamDestroy(up); });
    step("cuGraphExecDestroy", [&] { return cuGraphExecDestroy(exec); });
    step("cuModuleUnload (second helper)", [&] { return cuModuleUnload(hm2); });
    step("cuMemFreeHost (status)", [&] { return cuMemFreeHost(st_host); });
    return 0;
}
