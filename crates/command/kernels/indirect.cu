// The helper kernel of cuhal's indirect dispatch in CUDA graphs.
//
// It runs as a graph kernel node just before a device-updatable kernel node (the dispatch) and
// applies the workgroup count read from device memory to that node, on the device: no host round
// trip. A count with a zero axis disables the node (it runs nothing); a count over the device's
// grid limits, or not a multiple of the dispatch's cluster shape, disables it and records the
// failure in `status` (host-mapped memory the host reads when the submission completes):
// status[0] = index + 1 of the first failing dispatch, status[1..4] = its count.
//
// The node-update calls live in the CUDA device runtime (cudadevrt); build.sh compiles and links
// one cubin per architecture. Launch with one thread.

#include <cuda_runtime.h>

extern "C" __global__ void cuhal_indirect_apply(
    const unsigned int* counts,
    cudaGraphDeviceNode_t node,
    unsigned int max_x,
    unsigned int max_y,
    unsigned int max_z,
    unsigned int cluster_x,
    unsigned int cluster_y,
    unsigned int cluster_z,
    unsigned int* status,
    unsigned int index)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    const unsigned int x = counts[0];
    const unsigned int y = counts[1];
    const unsigned int z = counts[2];
    if (x == 0 || y == 0 || z == 0) {
        cudaGraphKernelNodeSetEnabled(node, false);
        return;
    }
    const bool over = x > max_x || y > max_y || z > max_z;
    const bool untiled = x % cluster_x != 0 || y % cluster_y != 0 || z % cluster_z != 0;
    if (over || untiled) {
        cudaGraphKernelNodeSetEnabled(node, false);
        if (atomicCAS(&status[0], 0u, index + 1u) == 0u) {
            status[1] = x;
            status[2] = y;
            status[3] = z;
            __threadfence_system();
        }
        return;
    }
    cudaGraphKernelNodeSetGridDim(node, dim3(x, y, z));
    cudaGraphKernelNodeSetEnabled(node, true);
}
