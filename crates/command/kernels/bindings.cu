// The helper kernel of cuhal's device-side binding-table patching in CUDA graphs.
//
// A graph command buffer whose kernel arguments name binding-table slots gets one node of this
// kernel at its head, before every node it patches; those nodes are device-updatable kernel
// nodes. When a submission changes many slot addresses, the host writes the list of changed
// 8-byte argument words into host-mapped memory, points this node at it (count and list are its
// parameters) and launches the graph: the helper writes each word into its node's kernel
// parameters on the device, instead of one host call per node.
//
// Each patch is (device node, byte offset in the node's parameter buffer, 8-byte value). A block
// stages up to blockDim.x patches in shared memory (one coalesced read of the host-mapped list),
// then every thread applies its own with cudaGraphKernelNodeSetParam; the block loops until
// all `count` are applied. Launch with one block (any blockDim.x up to HELPER_MAX_THREADS).
//
// When every patch is applied, thread 0 writes 1 to `*done` (host-mapped): the host may then
// reuse the list's memory for a later launch. A failed update (a programming error: the host
// checks node, offset and size when it builds the list) writes 2 + the error code to `*done` and
// traps, rather than letting the graph run with stale addresses.
//
// The node-update calls live in the CUDA device runtime (cudadevrt); build.sh compiles this file
// with indirect.cu and links both into one cubin per architecture.

#include <cuda_runtime.h>

#define HELPER_MAX_THREADS 256

// One patch, as the host writes it: 24 bytes, 8-byte aligned.
struct CuhalBindingPatch {
    cudaGraphDeviceNode_t node;
    unsigned long long offset;
    unsigned long long value;
};

static_assert(sizeof(CuhalBindingPatch) == 24, "the host writes 24-byte patches");

extern "C" __global__ void __launch_bounds__(HELPER_MAX_THREADS) cuhal_bindings_apply(
    const CuhalBindingPatch* patches,
    unsigned int count,
    unsigned int* done)
{
    __shared__ unsigned long long values[HELPER_MAX_THREADS];
    __shared__ unsigned int failure;
    if (blockIdx.x != 0) {
        return;
    }
    if (threadIdx.x == 0) {
        failure = 0;
    }
    __syncthreads();
    const unsigned int step = blockDim.x < HELPER_MAX_THREADS ? blockDim.x : HELPER_MAX_THREADS;
    for (unsigned int base = 0; base < count; base += step) {
        const unsigned int i = base + threadIdx.x;
        if (threadIdx.x < step && i < count) {
            const CuhalBindingPatch patch = patches[i];
            values[threadIdx.x] = patch.value;
            // cudaGraphKernelNodeUpdate has no usable default constructor (its union holds a
            // dim3), so the single-update form of the device runtime is used.
            const cudaError_t err = cudaGraphKernelNodeSetParam(
                patch.node, patch.offset, &values[threadIdx.x], sizeof(unsigned long long));
            if (err != cudaSuccess) {
                atomicCAS(&failure, 0u, 2u + (unsigned int)err);
            }
        }
        // The shared values are reused by the next round.
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        *(volatile unsigned int*)done = failure != 0 ? failure : 1u;
        __threadfence_system();
        if (failure != 0) {
            __trap();
        }
    }
}
