// A standalone check of the indirect-dispatch helper on a GPU, for machines with nvcc but no
// cargo: it builds, through the driver API, the same graph fragment cuhal builds (helper node,
// then the dispatch as a device-updatable kernel node) and checks that counts run the dispatch
// with that grid, a zero count runs nothing, an out-of-range count runs nothing and is recorded,
// and that a count written by an earlier kernel of the same launch is the one applied.
//
//   nvcc -o /tmp/check_indirect crates/command/kernels/check_indirect.cu -lcuda
//   /tmp/check_indirect crates/command/kernels/indirect_sm_90.cubin
//
// Prints one line per check and "N passed, N failed"; exits non-zero on any failure.

#include <cuda.h>
#include <cstdio>
#include <cstring>
#include <vector>

static int failed = 0;
static int passed = 0;

#define CK(x)                                                                                 \
    do {                                                                                      \
        CUresult r_ = (x);                                                                    \
        if (r_ != CUDA_SUCCESS) {                                                             \
            const char* s_ = "?";                                                             \
            cuGetErrorName(r_, &s_);                                                          \
            printf("FAIL %s: %s (line %d)\n", #x, s_, __LINE__);                              \
            return 1;                                                                         \
        }                                                                                     \
    } while (0)

static const char* PTX = R"(
.version 7.8
.target sm_90
.address_size 64
.visible .entry count_blocks(.param .u64 hits)
{
    .reg .pred %p<2>; .reg .b32 %r<10>; .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [hits];
    cvta.to.global.u64 %rd2, %rd1;
    atom.global.add.u32 %r1, [%rd2], 1;
    mov.u32 %r2, %tid.x; mov.u32 %r3, %ctaid.x; mov.u32 %r4, %ctaid.y; mov.u32 %r5, %ctaid.z;
    or.b32 %r6, %r2, %r3; or.b32 %r6, %r6, %r4; or.b32 %r6, %r6, %r5;
    setp.ne.u32 %p1, %r6, 0;
    @%p1 bra DONE;
    mov.u32 %r7, %nctaid.x; mov.u32 %r8, %nctaid.y; mov.u32 %r9, %nctaid.z;
    st.global.u32 [%rd2+4], %r7; st.global.u32 [%rd2+8], %r8; st.global.u32 [%rd2+12], %r9;
DONE:
    ret;
}
.visible .entry set_counts(.param .u64 c, .param .u32 x, .param .u32 y, .param .u32 z)
{
    .reg .b32 %r<4>; .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [c]; cvta.to.global.u64 %rd2, %rd1;
    ld.param.u32 %r1, [x]; ld.param.u32 %r2, [y]; ld.param.u32 %r3, [z];
    st.global.u32 [%rd2], %r1; st.global.u32 [%rd2+4], %r2; st.global.u32 [%rd2+8], %r3;
    ret;
}
)";

static void expect(const char* what, const unsigned* got, const unsigned* want, int n) {
    bool ok = memcmp(got, want, n * sizeof(unsigned)) == 0;
    printf("%s %s: got", ok ? "ok  " : "FAIL", what);
    for (int i = 0; i < n; i++) printf(" %u", got[i]);
    if (!ok) {
        printf(", want");
        for (int i = 0; i < n; i++) printf(" %u", want[i]);
    }
    printf("\n");
    ok ? passed++ : failed++;
}

struct Fragment {
    CUgraphNode helper, target;
};

// Adds the helper and the device-updatable `count_blocks` node after `deps`.
static CUresult add_fragment(CUgraph graph, CUfunction helper, CUfunction target,
                             const CUgraphNode* deps, size_t ndeps, CUdeviceptr counts,
                             CUdeviceptr hits, CUdeviceptr status, Fragment* out) {
    void* targs[] = {&hits};
    CUDA_KERNEL_NODE_PARAMS p = {};
    p.func = target; p.gridDimX = p.gridDimY = p.gridDimZ = 1;
    p.blockDimX = 64; p.blockDimY = p.blockDimZ = 1; p.kernelParams = targs;
    CUresult r = cuGraphAddKernelNode(&out->target, graph, nullptr, 0, &p);
    if (r) return r;
    CUlaunchAttributeValue v = {};
    v.deviceUpdatableKernelNode.deviceUpdatable = 1;
    r = cuGraphKernelNodeSetAttribute(out->target, CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE, &v);
    if (r) return r;
    CUlaunchAttributeValue got = {};
    r = cuGraphKernelNodeGetAttribute(out->target, CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE, &got);
    if (r) return r;
    unsigned long long node = (unsigned long long)got.deviceUpdatableKernelNode.devNode;
    unsigned mx = 2147483647u, my = 65535u, mz = 65535u, cx = 1, cy = 1, cz = 1, index = 0;
    void* hargs[] = {&counts, &node, &mx, &my, &mz, &cx, &cy, &cz, &status, &index};
    CUDA_KERNEL_NODE_PARAMS h = {};
    h.func = helper; h.gridDimX = h.gridDimY = h.gridDimZ = 1;
    h.blockDimX = h.blockDimY = h.blockDimZ = 1; h.kernelParams = hargs;
    r = cuGraphAddKernelNode(&out->helper, graph, deps, ndeps, &h);
    if (r) return r;
#if CUDA_VERSION >= 13000
    // CUDA 13's cuGraphAddDependencies is the 12.3 form with edge data (null: full edges).
    return cuGraphAddDependencies(graph, &out->helper, &out->target, nullptr, 1);
#else
    return cuGraphAddDependencies(graph, &out->helper, &out->target, 1);
#endif
}

int main(int argc, char** argv) {
    if (argc != 2) {
        printf("usage: %s indirect_sm_XY.cubin\n", argv[0]);
        return 2;
    }
    FILE* f = fopen(argv[1], "rb");
    if (!f) { printf("FAIL cannot open %s\n", argv[1]); return 1; }
    std::vector<char> image;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) image.insert(image.end(), buf, buf + n);
    fclose(f);
    int version = 0;
    CK(cuInit(0));
    CK(cuDriverGetVersion(&version));
    CUdevice dev;
    CUcontext ctx;
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    printf("driver %d\n", version);
    CUmodule helper_module, kernels;
    CK(cuModuleLoadData(&helper_module, image.data()));
    CK(cuModuleLoadData(&kernels, PTX));
    CUfunction helper, count_blocks, set_counts;
    CK(cuModuleGetFunction(&helper, helper_module, "cuhal_indirect_apply"));
    CK(cuModuleGetFunction(&count_blocks, kernels, "count_blocks"));
    CK(cuModuleGetFunction(&set_counts, kernels, "set_counts"));
    CUstream stream;
    CK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUdeviceptr counts, hits;
    CK(cuMemAlloc(&counts, 16));
    CK(cuMemAlloc(&hits, 16));
    unsigned* status_host;
    CUdeviceptr status;
    CK(cuMemHostAlloc((void**)&status_host, 16, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    CK(cuMemHostGetDevicePointer(&status, status_host, 0));
    memset(status_host, 0, 16);

    // 1. Counts written by the host before each launch of one executable graph.
    CUgraph graph;
    CUgraphExec exec;
    Fragment frag;
    CK(cuGraphCreate(&graph, 0));
    CK(add_fragment(graph, helper, count_blocks, nullptr, 0, counts, hits, status, &frag));
    CK(cuGraphInstantiate(&exec, graph, 0));
    CK(cuGraphUpload(exec, stream));
    CK(cuStreamSynchronize(stream));
    unsigned cases[][3] = {{3, 2, 1}, {0, 4, 1}, {5, 1, 2}, {1, 70000, 1}, {2, 2, 2}, {1, 1, 0}, {7, 1, 1}};
    for (auto& c : cases) {
        CK(cuMemcpyHtoD(counts, c, 12));
        CK(cuMemsetD32(hits, 0, 4));
        memset(status_host, 0, 16);
        CK(cuGraphLaunch(exec, stream));
        CK(cuStreamSynchronize(stream));
        unsigned got[4], st[4];
        CK(cuMemcpyDtoH(got, hits, 16));
        memcpy(st, (const void*)status_host, 16);
        unsigned blocks = c[0] * c[1] * c[2];
        bool over = c[1] > 65535;
        char what[96];
        snprintf(what, sizeof what, "host-written count %u,%u,%u: hits", c[0], c[1], c[2]);
        unsigned want[4] = {0, 0, 0, 0};
        if (blocks && !over) { want[0] = blocks * 64; want[1] = c[0]; want[2] = c[1]; want[3] = c[2]; }
        expect(what, got, want, 4);
        snprintf(what, sizeof what, "host-written count %u,%u,%u: status", c[0], c[1], c[2]);
        unsigned want_status[4] = {0, 0, 0, 0};
        if (over) { want_status[0] = 1; want_status[1] = c[0]; want_status[2] = c[1]; want_status[3] = c[2]; }
        expect(what, st, want_status, 4);
    }
    CK(cuGraphExecDestroy(exec));
    CK(cuGraphDestroy(graph));

    // 2. Counts written by an earlier kernel of the same launch: no host between them.
    unsigned device_cases[][3] = {{4, 1, 1}, {0, 1, 1}, {2, 3, 1}};
    for (auto& c : device_cases) {
        CK(cuGraphCreate(&graph, 0));
        CUgraphNode setter;
        void* sargs[] = {&counts, &c[0], &c[1], &c[2]};
        CUDA_KERNEL_NODE_PARAMS p = {};
        p.func = set_counts; p.gridDimX = p.gridDimY = p.gridDimZ = 1;
        p.blockDimX = p.blockDimY = p.blockDimZ = 1; p.kernelParams = sargs;
        CK(cuGraphAddKernelNode(&setter, graph, nullptr, 0, &p));
        CK(add_fragment(graph, helper, count_blocks, &setter, 1, counts, hits, status, &frag));
        CK(cuGraphInstantiate(&exec, graph, 0));
        CK(cuGraphUpload(exec, stream));
        unsigned poison[3] = {9, 9, 9};
        CK(cuMemcpyHtoD(counts, poison, 12));
        CK(cuMemsetD32(hits, 0, 4));
        CK(cuStreamSynchronize(stream));
        CK(cuGraphLaunch(exec, stream));
        CK(cuStreamSynchronize(stream));
        unsigned got[4];
        CK(cuMemcpyDtoH(got, hits, 16));
        unsigned blocks = c[0] * c[1] * c[2];
        unsigned want[4] = {0, 0, 0, 0};
        if (blocks) { want[0] = blocks * 64; want[1] = c[0]; want[2] = c[1]; want[3] = c[2]; }
        char what[96];
        snprintf(what, sizeof what, "device-written count %u,%u,%u in the same launch: hits", c[0], c[1], c[2]);
        expect(what, got, want, 4);
        CK(cuGraphExecDestroy(exec));
        CK(cuGraphDestroy(graph));
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
