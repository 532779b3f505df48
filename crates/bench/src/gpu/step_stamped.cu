// `step_stamped(counter, errors, index, period, zone)`: `kernels.ptx`'s `step`, timed by the
// zone-stamp ABI (crates/trace/include/cuhal_zone_stamp.cuh); a null `zone` stamps nothing.
// Case 6's stamped rows replay case 4's chain of it. The committed PTX is built by CUDA 13's
// nvcc (kept apart from the hand-written `kernels.ptx`, whose PTX ISA is older):
//   nvcc -arch=compute_80 -ptx -I../../../trace/include -o step_stamped.ptx step_stamped.cu
#include "cuhal_zone_stamp.cuh"

extern "C" __global__ void step_stamped(unsigned int* counter, unsigned int* errors,
                                        unsigned int index, unsigned int period,
                                        cuhal_zone_stamp* zone) {
    CUHAL_ZONE_BEGIN(zone);
    volatile unsigned int* c = counter;
    unsigned int value = *c;
    if (value % period != index) atomicAdd(errors, 1u);
    *c = value + 1;
    CUHAL_ZONE_END(zone);
}
