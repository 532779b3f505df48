// The GPU suite's stamped kernel: the zone-stamp ABI (crates/trace/include/cuhal_zone_stamp.cuh)
// around a spin, with the kernel's own readings beside it for the test to check the zone with.
// Build the committed PTX (CUDA 13's nvcc, PTX for compute_75, which every supported driver
// compiles):
//   nvcc -arch=compute_75 -ptx -I../../crates/trace/include -o zone_stamp_spin.ptx zone_stamp_spin.cu
#include "cuhal_zone_stamp.cuh"

// Every block reads `%globaltimer` right before CUHAL_ZONE_BEGIN into own[2 * block] and right
// before CUHAL_ZONE_END into own[2 * block + 1] (its first thread), spinning `ns` in between.
// The zone the tracer shows must span the earliest of the first readings to the latest of the
// second, give or take the few instructions between each reading and the header's own.
extern "C" __global__ void zone_stamp_spin(unsigned long long ns, unsigned long long* own,
                                           cuhal_zone_stamp* zone) {
    bool first = threadIdx.x == 0;
    unsigned long long start = cuhal_globaltimer();
    CUHAL_ZONE_BEGIN(zone);
    unsigned long long t = start;
    while (t - start < ns) t = cuhal_globaltimer();
    __syncthreads();
    if (first) own[2 * blockIdx.x] = start;
    unsigned long long end = cuhal_globaltimer();
    if (first) own[2 * blockIdx.x + 1] = end;
    CUHAL_ZONE_END(zone);
}
