// The GPU suite's stamped kernel: the zone-stamp ABI (crates/trace/include/cuhal_zone_stamp.cuh)
// around a spin, with the kernel's own readings beside it for the test to check the zone with.
// Build the committed PTX (CUDA 13's nvcc, PTX for compute_75, which every supported driver
// compiles):
//   nvcc -arch=compute_75 -ptx -I../../crates/trace/include -o zone_stamp_spin.ptx zone_stamp_spin.cu
#include "cuhal_zone_stamp.cuh"

// Every block's first thread stores the start the header read (CUHAL_ZONE_BEGIN's local) to
// own[2 * block], spins `ns`, and stores a reading taken right before CUHAL_ZONE_END to
// own[2 * block + 1]. The zone the tracer shows must begin at the earliest of the first
// exactly, and end at or after the latest of the second, by the few instructions (and the
// `__syncthreads`) between that reading and the header's own.
extern "C" __global__ void zone_stamp_spin(unsigned long long ns, unsigned long long* own,
                                           cuhal_zone_stamp* zone) {
    bool first = threadIdx.x == 0;
    CUHAL_ZONE_BEGIN(zone);
    unsigned long long start = cuhal_globaltimer();
    unsigned long long t = start;
    while (t - start < ns) t = cuhal_globaltimer();
    __syncthreads();
    if (first) own[2 * blockIdx.x] = cuhal_zone_start_;
    unsigned long long end = cuhal_globaltimer();
    if (first) own[2 * blockIdx.x + 1] = end;
    CUHAL_ZONE_END(zone);
}
