// The device half of cuhal's resident queue: the scheduler kernel.
//
// One thread of one block, running as the only kernel node of a graph instantiated for device
// launch. Each execution:
//   1. publishes the batch the previous execution launched (this execution is that one's tail
//      launch, so the batch's work has completed): per descriptor, `consumed` past it, its
//      signals into `device_slots`, then its completion word;
//   2. polls the ring in host-mapped memory; for each published descriptor in order whose waits
//      are reached (a slot's value is the larger of its host word and its device word), launches
//      its executable fire-and-forget, until the ring is empty, a wait is pending, an executable
//      repeats (one execution of a graph at a time), or `max_launches` is reached;
//   3. with a batch launched, tail-launches itself and returns; with nothing to do for
//      `idle_ns`, exits (see "exits" below).
// A head whose wait failed, whose launch failed, or that is pending at shutdown or after loss
// finishes at once, with its signals failed.
//
// Two graphs hold this kernel: the one the host launches to start a chain, and its twin, which
// only the device launches (every tail launch names the twin in `next`): CUDA leaves launching
// one graph from both the host and the device undefined.
//
// Exits: `exits` counts chains that ended; the host counts starts. The host, after publishing
// and bumping `rings`, reads `exits` and starts a chain (cuGraphLaunch on the queue's stream)
// when `exits == starts`. An idle chain announces its exit, fences, and reads `rings` again: if
// it moved, it takes the announcement back and goes on. Both sides store, fence, then load, so
// at least one sees the other: no wake-up is lost. A start the host made meanwhile queues
// behind this chain on the stream (a graph's tail launches complete before the stream moves
// on), so two chains never run at once.
//
// The layout of `Descriptor` is crates/resident/src/descriptor.rs's, field for field.

#include <cuda_runtime.h>

typedef unsigned long long u64;

#define FAILED (1ull << 63)
#define MAX_WAITS 6
#define MAX_SIGNALS 6
#define BATCH_MAX 120

enum Completion { DONE = 1, LAUNCH_FAILED = 2, WAIT_FAILED = 3, SHUTDOWN = 4, LOST = 5 };
enum Control { RUNNING = 0, SHUTTING_DOWN = 1, IS_LOST = 2 };

struct SlotValue {
    u64 value;
    unsigned int slot;
    unsigned int reserved;
};

struct Descriptor {
    u64 sequence;
    u64 executable;
    u64 bindings;
    unsigned int wait_count;
    unsigned int signal_count;
    u64 flags;
    SlotValue waits[MAX_WAITS];
    SlotValue signals[MAX_SIGNALS];
    u64 reserved[3];
};

// Every pointer but `state` is host-mapped memory; `state` is device memory.
struct SchedulerParams {
    const u64* produced;    // host: descriptors published
    u64* consumed;          // device: descriptors finished
    const u64* rings;       // host: doorbell rings (publishes, pushed waits, shutdown)
    u64* exits;             // device: chains ended
    const u64* control;     // host: RUNNING, SHUTTING_DOWN or IS_LOST
    u64* tail_failures;     // device: tail launches that failed (each ended its chain), and at
                            // tail_failures[16] the last one's cudaError_t
    const Descriptor* descriptors;
    u64* completions;
    u64* launch_errors;     // device: per cell, (sequence << 16 | cudaError_t) of a failed launch
    const u64* host_slots;  // host: values pushed, failures
    u64* device_slots;      // device: values signalled, failures
    u64* state;             // [0] end of the launched batch, [1] executions, [2] chains running,
                            // [3] 1 once two ran at once
    u64 capacity;
    u64 idle_ns;
    u64 next;               // the graph to tail-launch, 0 for this one: the host's graph names its
                            // twin, the twin itself (the host never launches a graph the device
                            // does)
    unsigned int slots;
    unsigned int max_launches;
};

__device__ __forceinline__ u64 load_sys(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_sys(u64* p, u64 v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ u64 now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void fence_sc_sys() { asm volatile("fence.sc.sys;" ::: "memory"); }

// The descriptor of `sequence`, read field by field past the L1 (the host rewrites the cell on
// every lap of the ring).
__device__ void read_descriptor(const SchedulerParams& p, u64 sequence, Descriptor& d) {
    const volatile u64* src = (const volatile u64*)&p.descriptors[sequence % p.capacity];
    u64* dst = (u64*)&d;
    for (int i = 0; i < (int)(sizeof(Descriptor) / 8); ++i) {
        dst[i] = src[i];
    }
}

__device__ u64 slot_word(const SchedulerParams& p, unsigned int slot) {
    if (slot >= p.slots) {
        return FAILED;
    }
    const u64 host = load_sys(&p.host_slots[slot]);
    const u64 device = *(volatile u64*)&p.device_slots[slot];
    return (host | device) & FAILED ? FAILED : (host > device ? host : device);
}

// 0 reached, 1 pending, 2 failed.
__device__ int waits_state(const SchedulerParams& p, const Descriptor& d) {
    int state = 0;
    const unsigned int n = d.wait_count < MAX_WAITS ? d.wait_count : MAX_WAITS;
    for (unsigned int i = 0; i < n; ++i) {
        const u64 word = slot_word(p, d.waits[i].slot);
        if (word & FAILED) {
            return 2;
        }
        if (word < d.waits[i].value) {
            state = 1;
        }
    }
    return state;
}

// Publishes `d`'s signals (or fails them) and its completion word. Only this chain writes the
// device slots, so a read, a compare and a store raise a slot without an atomic. `consumed` has
// passed `sequence` already: the host counts room by completion words read, which must not run
// ahead of `consumed` (the cell is not rewritten until the host has read this word either).
__device__ void finish(const SchedulerParams& p, const Descriptor& d, u64 sequence, int completion) {
    const unsigned int n = d.signal_count < MAX_SIGNALS ? d.signal_count : MAX_SIGNALS;
    for (unsigned int i = 0; i < n; ++i) {
        const unsigned int slot = d.signals[i].slot;
        if (slot >= p.slots) {
            continue;
        }
        volatile u64* word = (volatile u64*)&p.device_slots[slot];
        const u64 old = *word;
        const u64 next = completion == DONE ? d.signals[i].value : FAILED;
        if (!(old & FAILED) && next > old) {
            *word = next;
        }
    }
    __threadfence_system();
    store_sys(&p.completions[sequence % p.capacity], (sequence << 3) | (u64)completion);
}

extern "C" __global__ void cuhal_resident_schedule(SchedulerParams p) {
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    // A second chain running beside this one would break every rule above: count and flag it.
    if (atomicAdd(&p.state[2], 1ull) != 0) {
        atomicMax(&p.state[3], 1ull);
    }
    u64 head = *(volatile u64*)p.consumed;
    const u64 batch_end = p.state[0];
    p.state[1] += 1;
    // 1. The last execution's batch has completed: publish it.
    for (u64 s = head; s < batch_end; ++s) {
        Descriptor d;
        read_descriptor(p, s, d);
        store_sys(p.consumed, s + 1);
        finish(p, d, s, DONE);
    }
    if (batch_end > head) {
        head = batch_end;
    }
    // 2. Launch what is ready.
    u64 batch[BATCH_MAX];
    unsigned int launched = 0;
    const unsigned int limit =
        p.max_launches == 0 ? 1 : p.max_launches < BATCH_MAX ? p.max_launches : BATCH_MAX;
    u64 idle_since = now_ns();
    for (;;) {
        const u64 rings = load_sys(p.rings);
        const u64 control = load_sys(p.control);
        const u64 produced = load_sys(p.produced);
        const u64 next = head + launched;
        int state = -1;  // -1: nothing published
        Descriptor d;
        if (next < produced) {
            read_descriptor(p, next, d);
            if (d.sequence != next) {
                __nanosleep(100);  // not visible yet (the release store of `produced` orders it)
                continue;
            }
            state = control == IS_LOST ? 3 : waits_state(p, d);
        }
        if (state == 0) {
            bool repeated = false;
            for (unsigned int i = 0; i < launched; ++i) {
                repeated |= batch[i] == d.executable;
            }
            if (repeated) {
                break;
            }
            const cudaError_t error =
                cudaGraphLaunch((cudaGraphExec_t)d.executable, cudaStreamGraphFireAndForget);
            if (error == cudaSuccess) {
                batch[launched++] = d.executable;
                if (launched >= limit) {
                    break;
                }
                continue;
            }
            if (launched > 0) {
                break;  // finished alone, as the head of the next execution
            }
            store_sys(&p.launch_errors[next % p.capacity], (next << 16) | ((u64)error & 0xffff));
            store_sys(p.consumed, ++head);
            finish(p, d, next, LAUNCH_FAILED);
            idle_since = now_ns();
            continue;
        }
        if (launched > 0) {
            break;
        }
        if (state == 2 || state == 3 || (state == 1 && control != RUNNING)) {
            store_sys(p.consumed, ++head);
            finish(p, d, next, state == 2 ? WAIT_FAILED : state == 3 ? LOST : SHUTDOWN);
            idle_since = now_ns();
            continue;
        }
        // Idle: the ring is empty, or its head waits.
        if ((control != RUNNING && state == -1) || now_ns() - idle_since >= p.idle_ns) {
            const u64 exits = *(volatile u64*)p.exits;
            store_sys(p.exits, exits + 1);
            fence_sc_sys();
            if (load_sys(p.rings) == rings) {
                atomicAdd(&p.state[2], ~0ull);
                return;
            }
            store_sys(p.exits, exits);  // rung meanwhile: go on
            idle_since = now_ns();
            continue;
        }
        __nanosleep(100);
    }
    p.state[0] = head + launched;
    atomicAdd(&p.state[2], ~0ull);
    const cudaGraphExec_t next = p.next ? (cudaGraphExec_t)p.next : cudaGetCurrentGraphExec();
    const cudaError_t error = cudaGraphLaunch(next, cudaStreamGraphTailLaunch);
    if (error != cudaSuccess) {
        // The chain cannot go on: say so, and end it. The host's poller rings again when its
        // work stops moving, and the next chain publishes this batch first.
        store_sys(p.tail_failures + 16, (u64)error);
        store_sys(p.tail_failures, *(volatile u64*)p.tail_failures + 1);
        store_sys(p.exits, *(volatile u64*)p.exits + 1);
    }
}
