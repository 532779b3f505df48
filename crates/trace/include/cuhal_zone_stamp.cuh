// cuhal's zone-stamp ABI: a kernel that times itself.
//
// A kernel that takes a `cuhal_zone_stamp*` parameter, recorded with
// `KernelArgs::push_zone_stamp`, gets its FINE zone from its own clock: the earliest
// `%globaltimer` any of its blocks read as it started, and the latest any read as it finished.
// The tracer binds the parameter, per submission, to a slot of a ring it reads once the
// submission has completed, so the executable is neither re-recorded nor given extra nodes.
// Untraced, or traced without FINE, the parameter is null and the kernel stamps nothing.
//
//     #include "cuhal_zone_stamp.cuh"
//
//     __global__ void scale(float* x, float a, int n, cuhal_zone_stamp* zone) {
//         CUHAL_ZONE_BEGIN(zone);
//         int i = blockIdx.x * blockDim.x + threadIdx.x;
//         if (i < n) x[i] *= a;      // no early return past CUHAL_ZONE_END
//         CUHAL_ZONE_END(zone);
//     }
//
// Rules:
// - CUHAL_ZONE_BEGIN opens the kernel (it declares a local); CUHAL_ZONE_END closes it and must
//   be reached by every thread of every block: it holds a __syncthreads(), so that the block's
//   end is read after all of its threads' work.
// - The slot starts zeroed (the tracer hands out zeroed slots: it zeroes each after reading it). As a block ends, its first
//   thread does two fire-and-forget reductions, no fence, no value read back: into
//   `begin_complement` the complement of the block's start (`red.max` of `~t`: the slot keeps
//   the complement of the earliest start, and a zeroed slot is empty), into `end` its end.
//   A slot whose `end` is 0 after completion: the kernel did not run.
// - Both readings are `%globaltimer`: nanoseconds, the clock cuhal's trace calibrates against
//   the host's.
#ifndef CUHAL_ZONE_STAMP_CUH
#define CUHAL_ZONE_STAMP_CUH

// One kernel's zone: 16 bytes, 8-aligned.
typedef struct cuhal_zone_stamp {
    unsigned long long begin_complement;  // ~(earliest start), by red.max
    unsigned long long end;               // latest end, by red.max
} cuhal_zone_stamp;

// Bytes of one slot, as the tracer lays its ring out.
#define CUHAL_ZONE_STAMP_BYTES 16

__device__ __forceinline__ unsigned long long cuhal_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ bool cuhal_zone_first_thread() {
    return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
}

// The block's first thread's start (0 for the others, and where nothing is stamped).
__device__ __forceinline__ unsigned long long cuhal_zone_begin(const cuhal_zone_stamp* zone) {
    return zone != nullptr && cuhal_zone_first_thread() ? cuhal_globaltimer() : 0ull;
}

// Every thread of the block: waits for the block's threads, then its first thread folds the
// block's start and end into the slot. Both reductions are issued here, at the end: measured
// on an H100 (probes/stamp_cost.cu), 55 ns a kernel for one-block kernels against 99 ns with
// the start's folded in as the block starts (132-block kernels: 154 against 132 ns).
__device__ __forceinline__ void cuhal_zone_end(cuhal_zone_stamp* zone, unsigned long long start) {
    if (zone == nullptr) return;
    __syncthreads();
    if (!cuhal_zone_first_thread()) return;
    unsigned long long end = cuhal_globaltimer();
    asm volatile("red.global.max.u64 [%0], %1;" ::"l"(&zone->begin_complement), "l"(~start)
                 : "memory");
    asm volatile("red.global.max.u64 [%0], %1;" ::"l"(&zone->end), "l"(end) : "memory");
}

// CUHAL_ZONE_BEGIN declares the block's start as a local: open and close the zone in the same
// scope (the kernel's outermost).
#define CUHAL_ZONE_BEGIN(zone) const unsigned long long cuhal_zone_start_ = cuhal_zone_begin(zone)
#define CUHAL_ZONE_END(zone) cuhal_zone_end((zone), cuhal_zone_start_)

#endif  // CUHAL_ZONE_STAMP_CUH
