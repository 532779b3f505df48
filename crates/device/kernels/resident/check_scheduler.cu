// A standalone check and timing of the resident queue's scheduler kernel (scheduler.cu) through
// the driver API, for a machine with nvcc and no cargo. It lays out the ring as cuhal does
// (crates/device/src/resident/memory.rs), instantiates work graphs and the scheduler graph for
// device launch, and checks: a submission's signal, a wait on a value the host pushes later
// (the chain exits idle and the push starts it again), a chain of dependent submissions, many
// submissions from one thread, a failed wait, shutdown, and that two chains never ran at once.
// Then it times, against the raw driver in the same process and in alternating turns: host time
// per submission, submissions per second, the round trip, the cold start, and the slowdown a
// polling scheduler causes a compute-bound kernel beside it.
//
//   nvcc -O2 -o /tmp/check_scheduler crates/device/kernels/resident/check_scheduler.cu -lcuda
//   /tmp/check_scheduler crates/device/kernels/resident/scheduler_sm_90.cubin
//
// Prints one line per check and figure, then "N passed, N failed"; exits non-zero on a failure.

#include <cuda.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

typedef unsigned long long u64;

static int failed = 0;
static int passed = 0;

#define CK(x)                                                                                 \
    do {                                                                                      \
        CUresult r_ = (x);                                                                    \
        if (r_ != CUDA_SUCCESS) {                                                             \
            const char* s_ = "?";                                                             \
            cuGetErrorName(r_, &s_);                                                          \
            printf("FAIL %s: %s (line %d)\n", #x, s_, __LINE__);                              \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static void check(bool ok, const char* what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    (ok ? passed : failed)++;
}

static const char* PTX = R"(
.version 7.8
.target sm_90
.address_size 64
.visible .entry work(.param .u64 counter)
{
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [counter];
    cvta.to.global.u64 %rd2, %rd1;
    atom.global.add.u64 %rd3, [%rd2], 1;
    ret;
}
.visible .entry spin(.param .u64 out, .param .u32 n)
{
    .reg .pred %p<2>; .reg .b32 %r<4>; .reg .f32 %f<3>; .reg .b64 %rd<3>;
    ld.param.u32 %r1, [n];
    mov.f32 %f1, 0f3F800000;
    mov.u32 %r2, 0;
LOOP:
    fma.rn.f32 %f1, %f1, 0f3F7FFFFF, 0f3A83126F;
    add.u32 %r2, %r2, 1;
    setp.lt.u32 %p1, %r2, %r1;
    @%p1 bra LOOP;
    setp.ne.f32 %p1, %f1, 0f00000000;
    @%p1 bra DONE;
    ld.param.u64 %rd1, [out];
    cvta.to.global.u64 %rd2, %rd1;
    st.global.f32 [%rd2], %f1;
DONE:
    ret;
}
)";

struct SlotValue { u64 value; unsigned slot, reserved; };
struct Descriptor {
    u64 sequence, executable, bindings;
    unsigned wait_count, signal_count;
    u64 flags;
    SlotValue waits[6], signals[6];
    u64 reserved[3];
};
static_assert(sizeof(Descriptor) == 256, "layout");

struct SchedulerParams {
    const u64* produced; u64* consumed; const u64* rings; u64* exits; const u64* control;
    u64* tail_failures; const Descriptor* descriptors; u64* completions; u64* launch_errors;
    const u64* host_slots; u64* device_slots; u64* state; u64 capacity; u64 idle_ns; u64 next;
    unsigned slots; unsigned max_launches;
};
static_assert(sizeof(SchedulerParams) == 128, "layout");

// Header lines (128 bytes each) of the mapped block.
enum { PRODUCED, CONSUMED, RINGS, EXITS, CONTROL, TAIL_FAILURES, TAIL_ERROR, HEADER_LINES = 8 };

static CUfunction g_schedule, g_work, g_spin;
static CUstream g_side;

static double now_us() {
    return std::chrono::duration<double, std::micro>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
}

static CUgraphExec device_exec(CUgraph graph) {
    CUDA_GRAPH_INSTANTIATE_PARAMS ip = {};
    ip.flags = CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH;
    CUgraphExec exec;
    CK(cuGraphInstantiateWithParams(&exec, graph, &ip));
    if (ip.result_out != CUDA_GRAPH_INSTANTIATE_SUCCESS) {
        printf("FAIL instantiate for device launch: result %d\n", (int)ip.result_out);
        exit(1);
    }
    CK(cuGraphUpload(exec, g_side));
    CK(cuStreamSynchronize(g_side));
    return exec;
}

static CUgraph kernel_graph(CUfunction f, void** params, unsigned grid = 1, unsigned block = 1) {
    CUgraph graph;
    CK(cuGraphCreate(&graph, 0));
    CUDA_KERNEL_NODE_PARAMS kp = {};
    kp.func = f; kp.gridDimX = grid; kp.gridDimY = 1; kp.gridDimZ = 1;
    kp.blockDimX = block; kp.blockDimY = 1; kp.blockDimZ = 1; kp.kernelParams = params;
    CUgraphNode node;
    CK(cuGraphAddKernelNode(&node, graph, nullptr, 0, &kp));
    return graph;
}

struct Queue {
    u64 capacity, slots;
    char* host = nullptr;
    CUdeviceptr dev = 0, state = 0;
    CUstream stream;
    CUgraphExec exec;  // the host's graph; it tail-launches `twin`, which only the device launches
    CUgraphExec twin;
    u64 starts = 0;
    u64 produced_local = 0;

    std::atomic<u64>& line(int i) { return *reinterpret_cast<std::atomic<u64>*>(host + 128 * i); }
    Descriptor* descriptors() { return reinterpret_cast<Descriptor*>(host + 128 * HEADER_LINES); }
    std::atomic<u64>* completions() {
        return reinterpret_cast<std::atomic<u64>*>(host + 128 * HEADER_LINES + 256 * capacity);
    }
    std::atomic<u64>* host_slots() { return completions() + 2 * capacity; }
    std::atomic<u64>* device_slots() { return host_slots() + slots; }

    Queue(u64 cap, u64 nslots, u64 idle_ns) : capacity(cap), slots(nslots) {
        size_t bytes = 128 * HEADER_LINES + 256 * cap + 16 * cap + 16 * nslots;
        CK(cuMemHostAlloc((void**)&host, bytes, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
        memset(host, 0, bytes);
        CK(cuMemHostGetDevicePointer(&dev, host, 0));
        CK(cuMemAlloc(&state, 64));
        CK(cuMemsetD8(state, 0, 64));
        CK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
        auto at = [&](size_t off) { return (u64*)(dev + off); };
        SchedulerParams p;
        p.produced = at(128 * PRODUCED); p.consumed = at(128 * CONSUMED); p.rings = at(128 * RINGS);
        p.exits = at(128 * EXITS); p.control = at(128 * CONTROL); p.tail_failures = at(128 * TAIL_FAILURES);
        p.descriptors = (const Descriptor*)at(128 * HEADER_LINES);
        p.completions = at(128 * HEADER_LINES + 256 * cap);
        p.launch_errors = p.completions + cap;
        p.host_slots = p.launch_errors + cap; p.device_slots = (u64*)p.host_slots + nslots;
        p.state = (u64*)state; p.capacity = cap; p.idle_ns = idle_ns; p.slots = (unsigned)nslots;
        p.max_launches = 120;
        p.next = 0;
        void* params[] = {&p};
        twin = device_exec(kernel_graph(g_schedule, params));
        p.next = (u64)twin;
        exec = device_exec(kernel_graph(g_schedule, params));
    }
    u64 state_word(int i) {
        u64 v[8];
        CK(cuMemcpyDtoH(v, state, 64));
        return v[i];
    }
    // Rings the doorbell; starts a chain when none runs.
    void ring() {
        line(RINGS).fetch_add(1, std::memory_order_seq_cst);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (line(EXITS).load(std::memory_order_seq_cst) == starts) {
            starts++;
            CK(cuGraphLaunch(exec, stream));
        }
    }
    bool has_room() { return produced_local - line(CONSUMED).load(std::memory_order_acquire) < capacity; }
    u64 submit(CUgraphExec work, std::initializer_list<SlotValue> waits,
               std::initializer_list<SlotValue> signals) {
        while (!has_room()) {}
        u64 seq = produced_local++;
        Descriptor& d = descriptors()[seq % capacity];
        d.executable = (u64)work; d.bindings = 0;
        d.wait_count = (unsigned)waits.size(); d.signal_count = (unsigned)signals.size();
        std::copy(waits.begin(), waits.end(), d.waits);
        std::copy(signals.begin(), signals.end(), d.signals);
        d.sequence = seq;
        line(PRODUCED).store(seq + 1, std::memory_order_release);
        ring();
        return seq;
    }
    int completion(u64 seq) {
        u64 w = completions()[seq % capacity].load(std::memory_order_acquire);
        return (w >> 3) == seq ? (int)(w & 7) : 0;
    }
    int wait(u64 seq, double timeout_us = 2e6) {
        double t0 = now_us();
        int c;
        while ((c = completion(seq)) == 0) {
            if (now_us() - t0 > timeout_us) return -1;
        }
        return c;
    }
    void push(unsigned slot, u64 value) {
        host_slots()[slot].store(value, std::memory_order_release);
        ring();
    }
    void shut_down() {
        line(CONTROL).store(1, std::memory_order_release);
        ring();
        CK(cuStreamSynchronize(stream));
    }
};

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}
static double pct(std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[(size_t)(q * (v.size() - 1))];
}

int main(int argc, char** argv) {
    if (argc < 2) { printf("usage: %s scheduler_sm_XY.cubin\n", argv[0]); return 2; }
    CK(cuInit(0));
    CUdevice device; CK(cuDeviceGet(&device, 0));
    CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, device)); CK(cuCtxSetCurrent(ctx));
    char name[128]; cuDeviceGetName(name, sizeof name, device);
    int driver = 0; cuDriverGetVersion(&driver);
    int sms = 0; cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
    printf("%s, driver %d, %d SMs\n", name, driver, sms);
    CUmodule sched_module, kernels;
    CK(cuModuleLoad(&sched_module, argv[1]));
    CK(cuModuleGetFunction(&g_schedule, sched_module, "cuhal_resident_schedule"));
    CK(cuModuleLoadData(&kernels, PTX));
    CK(cuModuleGetFunction(&g_work, kernels, "work"));
    CK(cuModuleGetFunction(&g_spin, kernels, "spin"));
    CK(cuStreamCreate(&g_side, CU_STREAM_NON_BLOCKING));

    CUdeviceptr counter; CK(cuMemAlloc(&counter, 8)); CK(cuMemsetD8(counter, 0, 8));
    void* wparams[] = {&counter};
    const int K = 128;
    std::vector<CUgraphExec> works(K);
    CUgraph work_graph = kernel_graph(g_work, wparams);
    for (auto& w : works) w = device_exec(work_graph);
    auto count = [&] { u64 v; CK(cuCtxSynchronize()); CK(cuMemcpyDtoH(&v, counter, 8)); return v; };

    // --- checks ---
    {
        Queue q(256, 8, 200000);  // idle exit after 200 us
        u64 s = q.submit(works[0], {}, {{1, 0, 0}});
        check(q.wait(s) == 1 && q.device_slots()[0].load() == 1, "one submission: signalled 1");
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        check(q.line(EXITS).load() == q.starts, "idle for 2 ms: the chain exited");
        u64 w = q.submit(works[1], {{5, 1, 0}}, {{2, 0, 0}});
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        bool pending = q.completion(w) == 0;
        u64 starts_before = q.starts;
        q.push(1, 5);
        check(pending && q.wait(w) == 1 && q.device_slots()[0].load() == 2,
              "a wait on a value the host pushes 2 ms later: pending, then run");
        check(q.starts > starts_before, "the push started a new chain");
        // 100 dependent submissions: each waits for the previous one's signal.
        u64 last = 0;
        for (int i = 0; i < 100; ++i) {
            last = q.submit(works[i % K], {{(u64)(3 + i), 0, 0}}, {{(u64)(4 + i), 0, 0}});
        }
        check(q.wait(last) == 1 && q.device_slots()[0].load() == 103, "100 dependent submissions in order");
        // A failed wait fails the signals and nothing runs.
        u64 before = count();
        q.host_slots()[3].store(1ull << 63);
        u64 f = q.submit(works[2], {{1, 3, 0}}, {{1, 4, 0}});
        check(q.wait(f) == 3 && q.device_slots()[4].load() == (1ull << 63) && count() == before,
              "a failed wait: WaitFailed, its signal failed, nothing launched");
        // Shutdown: a submission waiting on a value never pushed finishes as Shutdown.
        u64 sd = q.submit(works[3], {{9, 5, 0}}, {{1, 6, 0}});
        q.shut_down();
        check(q.completion(sd) == 4, "shutdown: the pending submission finished as Shutdown");
        check(q.state_word(3) == 0, "two chains never ran at once");
        printf("     executions %llu, starts %llu, exits %llu\n", q.state_word(1), q.starts,
               q.line(EXITS).load());
    }
    // --- many submissions from one thread ---
    {
        Queue q(1024, 8, 1000000000ull);
        CK(cuMemsetD8(counter, 0, 8));
        q.submit(works[0], {}, {}); q.wait(0);
        const int N = 200000;
        double wait_us = 0;
        double t0 = now_us();
        for (int i = 1; i <= N; ++i) {
            if (!q.has_room()) {
                double w0 = now_us();
                while (!q.has_room()) {}
                wait_us += now_us() - w0;
            }
            q.submit(works[i % K], {}, {{(u64)i, 0, 0}});
        }
        double t1 = now_us();
        int c = q.wait(N);
        double t2 = now_us();
        check(c == 1 && q.device_slots()[0].load() == (u64)N && count() == (u64)N + 1,
              "200,000 submissions from one thread: every one ran, the last value signalled");
        printf("     host time per submission (room waits taken out): %.1f ns\n",
               (t1 - t0 - wait_us) * 1000.0 / N);
        printf("     sustained: %.2f M submissions/s (%.0f%% of the thread's time waiting for room)\n",
               N / (t2 - t0), 100.0 * wait_us / (t1 - t0));
        printf("     executions %llu (%.1f submissions each)\n", q.state_word(1),
               (double)N / q.state_word(1));
        q.shut_down();
        check(q.state_word(3) == 0, "two chains never ran at once (throughput)");
    }
    // --- round trip against the raw driver, alternating ---
    {
        Queue q(256, 8, 1000000000ull);
        CUgraph g = kernel_graph(g_work, wparams);
        CUgraphExec raw; CK(cuGraphInstantiate(&raw, g, 0));
        CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CUevent e; CK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
        CK(cuGraphUpload(raw, s));
        u64 v = 0;
        std::vector<double> rt_res, rt_raw, sub_res, sub_raw;
        for (int round = 0; round < 4000; ++round) {
            bool res_first = round % 2 == 0;
            for (int side = 0; side < 2; ++side) {
                if ((side == 0) == res_first) {
                    double t0 = now_us();
                    u64 seq = q.submit(works[0], {}, {{++v, 0, 0}});
                    double t1 = now_us();
                    q.wait(seq);
                    double t2 = now_us();
                    if (round >= 100) { rt_res.push_back(t2 - t0); sub_res.push_back(t1 - t0); }
                } else {
                    double t0 = now_us();
                    CK(cuGraphLaunch(raw, s));
                    CK(cuEventRecord(e, s));
                    double t1 = now_us();
                    while (cuEventQuery(e) == CUDA_ERROR_NOT_READY) {}
                    double t2 = now_us();
                    if (round >= 100) { rt_raw.push_back(t2 - t0); sub_raw.push_back(t1 - t0); }
                }
            }
        }
        printf("round trip, 3,900 rounds in turns: resident %.2f us (p10 %.2f, p90 %.2f), raw graph+event %.2f us (p10 %.2f, p90 %.2f): %.2fx\n",
               median(rt_res), pct(rt_res, .1), pct(rt_res, .9), median(rt_raw), pct(rt_raw, .1),
               pct(rt_raw, .9), median(rt_res) / median(rt_raw));
        printf("submit call in the round trip: resident %.3f us, raw cuGraphLaunch+cuEventRecord %.3f us\n",
               median(sub_res), median(sub_raw));
        // The dependent chain: the time per link (A's end to B's start, plus B's run).
        for (int rep = 0; rep < 3; ++rep) {
            double t0 = now_us();
            u64 last = 0;
            for (int i = 0; i < 1000; ++i) {
                u64 base = v;
                last = q.submit(works[i % K], {{base + (u64)i, 0, 0}}, {{base + (u64)i + 1, 0, 0}});
            }
            // (v is advanced after the loop: the values are base.. base+1000)
            q.wait(last);
            double t1 = now_us();
            v += 1000;
            std::vector<double> raw_gap;
            double r0 = now_us();
            for (int i = 0; i < 1000; ++i) CK(cuGraphLaunch(raw, s));
            CK(cuStreamSynchronize(s));
            double r1 = now_us();
            printf("1,000 dependent submissions: resident %.2f us per link; raw graph launches in one stream %.2f us each\n",
                   (t1 - t0) / 1000, (r1 - r0) / 1000);
        }
        q.shut_down();
    }
    // --- cold start: the first submission to an idle queue ---
    {
        Queue q(256, 8, 50000);  // idle exit after 50 us
        std::vector<double> cold, warm_rt;
        u64 v = 0;
        for (int i = 0; i < 200; ++i) {
            std::this_thread::sleep_for(std::chrono::microseconds(500));
            double t0 = now_us();
            u64 seq = q.submit(works[0], {}, {{++v, 0, 0}});
            q.wait(seq);
            cold.push_back(now_us() - t0);
        }
        printf("cold start (submit to an idle queue, round trip): median %.2f us (p10 %.2f, p90 %.2f); starts %llu of 200\n",
               median(cold), pct(cold, .1), pct(cold, .9), q.starts);
        q.shut_down();
    }
    // --- the cost of a polling scheduler to a compute-bound neighbour ---
    {
        CUdeviceptr out; CK(cuMemAlloc(&out, 4));
        unsigned n = 200000;
        void* sp[] = {&out, &n};
        CUevent a, b; CK(cuEventCreate(&a, 0)); CK(cuEventCreate(&b, 0));
        auto spin_ms = [&] {
            CK(cuEventRecord(a, g_side));
            CK(cuLaunchKernel(g_spin, sms * 8, 1, 1, 256, 1, 1, 0, g_side, sp, nullptr));
            CK(cuEventRecord(b, g_side));
            CK(cuEventSynchronize(b));
            float ms; CK(cuEventElapsedTime(&ms, a, b));
            return (double)ms;
        };
        spin_ms();
        std::vector<double> alone, beside;
        Queue q(256, 8, 1000000000ull);
        for (int i = 0; i < 10; ++i) {
            alone.push_back(spin_ms());
            u64 seq = q.submit(works[0], {}, {});
            q.wait(seq);  // the chain now polls, idle
            beside.push_back(spin_ms());
            q.line(CONTROL).store(1); q.ring(); CK(cuStreamSynchronize(q.stream));
            q.line(CONTROL).store(0);
        }
        printf("compute-bound neighbour (%d blocks): alone %.3f ms, beside an idle polling scheduler %.3f ms: %.3fx\n",
               sms * 8, median(alone), median(beside), median(beside) / median(alone));
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
