// Kernels for the module-image tests: built by nvcc into the images beside this file (see
// build.sh), so `check_image` and the parameter-layout checks are tried on what real tools emit.
#include <stdint.h>

struct Pair {
    double a;
    uint32_t b;
};

extern "C" __global__ void three_params(uint64_t* out, uint32_t k, double scale) {
    out[threadIdx.x] = (uint64_t)(k * scale) + threadIdx.x;
}

extern "C" __global__ void with_struct(float* out, Pair p, uint8_t flag, int64_t n) {
    if (threadIdx.x < n && flag) {
        out[threadIdx.x] = (float)(p.a + p.b);
    }
}

extern "C" __global__ void no_params() {}
