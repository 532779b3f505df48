//! The fake as a GPU, through cuhal-sys's table: memory that is registered and range-checked,
//! contexts per thread, events with times, graphs that run in dependency order, modules,
//! counted launches, and faults by call number.

use std::ffi::{CString, c_void};
use std::ptr::null_mut;

use cuhal_fake_driver::harness::FakeDriver;
use cuhal_fake_driver::{memory, status};
use cuhal_sys::*;

/// A private instance with the driver loaded and device 0's primary context current.
struct Gpu {
    fake: FakeDriver,
    context: std::sync::Arc<PrimaryContext>,
}

impl Gpu {
    fn new(tag: &str) -> Gpu {
        let fake = FakeDriver::private(tag).unwrap();
        let api = std::sync::Arc::new(DriverApi::load_from(fake.path()).unwrap());
        let context = PrimaryContext::retain(api, 0).unwrap();
        Gpu { fake, context }
    }

    fn api(&self) -> &DriverApi {
        self.context.api()
    }

    fn alloc(&self, bytes: usize) -> CUdeviceptr {
        let mut ptr = 0;
        // SAFETY: valid out-pointer; the context is current.
        let r = unsafe { (self.api().cuMemAlloc)(&mut ptr, bytes) };
        assert_eq!(r, CUresult::SUCCESS);
        ptr
    }

    fn download(&self, ptr: CUdeviceptr, bytes: usize) -> Vec<u8> {
        let mut out = vec![0u8; bytes];
        // SAFETY: `out` holds `bytes` bytes.
        let r = unsafe { (self.api().cuMemcpyDtoH)(out.as_mut_ptr().cast(), ptr, bytes) };
        assert_eq!(r, CUresult::SUCCESS);
        out
    }
}

#[test]
fn memory_is_registered_aligned_and_range_checked() {
    let gpu = Gpu::new("memory");
    let api = gpu.api();
    let a = gpu.alloc(100);
    assert_eq!(a % memory::ALIGNMENT as u64, 0);
    assert_eq!(
        gpu.download(a, 100),
        vec![memory::FRESH_BYTE; 100],
        "fresh memory is not zeroed"
    );
    let counts = gpu.fake.counts();
    assert_eq!((counts.device_allocations, counts.device_bytes), (1, 100));

    let data: Vec<u8> = (0..100).collect();
    // SAFETY: `data` holds 100 bytes; the other calls pass integers only.
    unsafe {
        assert_eq!(
            (api.cuMemcpyHtoD)(a, data.as_ptr().cast(), 100),
            CUresult::SUCCESS
        );
        // One byte past the end, and memory that is not an allocation, are refused.
        assert_eq!(
            (api.cuMemcpyHtoD)(a + 1, data.as_ptr().cast(), 100),
            CUresult::ERROR_INVALID_VALUE
        );
        assert_eq!(
            (api.cuMemsetD8Async)(a + 4096, 0, 1, null_mut()),
            CUresult::ERROR_INVALID_VALUE
        );
        assert_eq!(
            (api.cuMemsetD32Async)(a + 2, 0, 1, null_mut()),
            CUresult::ERROR_INVALID_VALUE,
            "misaligned"
        );
        assert_eq!(
            (api.cuMemsetD16Async)(a + 10, 0xbeef, 3, null_mut()),
            CUresult::SUCCESS
        );
    }
    let mut expected = data.clone();
    expected[10..16].copy_from_slice(&0xbeefu16.to_ne_bytes().repeat(3));
    assert_eq!(gpu.download(a, 100), expected);

    // SAFETY: integers only.
    unsafe {
        assert_eq!(
            (api.cuMemFree)(a + 8),
            CUresult::ERROR_INVALID_VALUE,
            "not an allocation's start"
        );
        assert_eq!((api.cuMemFree)(a), CUresult::SUCCESS);
        assert_eq!(
            (api.cuMemFree)(a),
            CUresult::ERROR_INVALID_VALUE,
            "double free"
        );
    }
    assert_eq!(gpu.fake.counts().device_allocations, 0);
}

#[test]
fn calls_need_a_current_context_on_every_thread() {
    let gpu = Gpu::new("context");
    let api = std::sync::Arc::clone(gpu.context.api());
    let context = gpu.context.clone();
    std::thread::spawn(move || {
        let mut stream: CUstream = null_mut();
        // SAFETY: valid out-pointer.
        let r = unsafe { (api.cuStreamCreate)(&mut stream, 0) };
        assert_eq!(
            r,
            CUresult::ERROR_INVALID_CONTEXT,
            "a fresh thread has no context"
        );
        context.bind().unwrap();
        // SAFETY: valid out-pointer.
        let r = unsafe { (api.cuStreamCreate)(&mut stream, 0) };
        assert_eq!(r, CUresult::SUCCESS);
        // SAFETY: the stream was just created.
        assert_eq!(unsafe { (api.cuStreamDestroy)(stream) }, CUresult::SUCCESS);
        // SAFETY: destroyed handles are refused, not dereferenced.
        let r = unsafe { (api.cuStreamDestroy)(stream) };
        assert_eq!(r, CUresult::ERROR_INVALID_HANDLE);
    })
    .join()
    .unwrap();
    assert_eq!(gpu.fake.counts().context_retains, 1);
}

#[test]
fn events_complete_when_recorded_and_time_the_gap() {
    let gpu = Gpu::new("events");
    let api = gpu.api();
    let (mut start, mut end, mut untimed): (CUevent, CUevent, CUevent) =
        (null_mut(), null_mut(), null_mut());
    let mut ms = -1.0f32;
    // SAFETY: valid out-pointers and live handles throughout.
    unsafe {
        assert_eq!((api.cuEventCreate)(&mut start, 0), CUresult::SUCCESS);
        assert_eq!((api.cuEventCreate)(&mut end, 0), CUresult::SUCCESS);
        assert_eq!(
            (api.cuEventCreate)(&mut untimed, CU_EVENT_DISABLE_TIMING),
            CUresult::SUCCESS
        );
        assert_eq!(
            (api.cuEventElapsedTime)(&mut ms, start, end),
            CUresult::ERROR_INVALID_HANDLE,
            "never recorded"
        );
        assert_eq!((api.cuEventRecord)(start, null_mut()), CUresult::SUCCESS);
        std::thread::sleep(std::time::Duration::from_millis(3));
        assert_eq!((api.cuEventRecord)(end, null_mut()), CUresult::SUCCESS);
        assert_eq!((api.cuEventQuery)(end), CUresult::SUCCESS);
        assert_eq!(
            (api.cuEventElapsedTime)(&mut ms, start, end),
            CUresult::SUCCESS
        );
        assert_eq!((api.cuEventRecord)(untimed, null_mut()), CUresult::SUCCESS);
        assert_eq!(
            (api.cuEventElapsedTime)(&mut ms, start, untimed),
            CUresult::ERROR_INVALID_HANDLE
        );
        for event in [start, end, untimed] {
            assert_eq!((api.cuEventDestroy)(event), CUresult::SUCCESS);
        }
        assert_eq!((api.cuEventQuery)(end), CUresult::ERROR_INVALID_HANDLE);
    }
    assert!((3.0..1000.0).contains(&ms), "{ms} ms");
    assert_eq!(gpu.fake.counts().events, 0);
}

#[test]
fn graphs_run_their_nodes_in_dependency_order() {
    let gpu = Gpu::new("graph");
    let api = gpu.api();
    let ctx = gpu.context.raw();
    let (a, b) = (gpu.alloc(64), gpu.alloc(64));
    let source: Vec<u8> = (100..164).collect();
    let mut graph: CUgraph = null_mut();
    let (mut memset, mut update, mut copy) = (null_mut(), null_mut(), null_mut());
    let set = CUDA_MEMSET_NODE_PARAMS {
        dst: a,
        pitch: 0,
        value: 0x0102_0304,
        elementSize: 4,
        width: 16,
        height: 1,
    };
    let mut host_to_a = CUDA_MEMCPY3D::linear_device_to_device(a + 8, 0, 8);
    host_to_a.srcMemoryType = CU_MEMORYTYPE_HOST;
    host_to_a.srcHost = source.as_ptr().cast();
    let a_to_b = CUDA_MEMCPY3D::linear_device_to_device(b, a, 64);
    // SAFETY: valid out-pointers; dependency arrays hold the given counts; the host source
    // outlives the graph's launches.
    unsafe {
        assert_eq!((api.cuGraphCreate)(&mut graph, 0), CUresult::SUCCESS);
        // Added in reverse: the copy first, then what it depends on, linked afterwards.
        assert_eq!(
            (api.cuGraphAddMemcpyNode)(&mut copy, graph, null_mut(), 0, &a_to_b, ctx),
            CUresult::SUCCESS
        );
        assert_eq!(
            (api.cuGraphAddMemcpyNode)(&mut update, graph, null_mut(), 0, &host_to_a, ctx),
            CUresult::SUCCESS
        );
        assert_eq!(
            (api.cuGraphAddMemsetNode)(&mut memset, graph, null_mut(), 0, &set, ctx),
            CUresult::SUCCESS
        );
        assert_eq!(
            (api.cuGraphAddDependencies)(graph, &memset, &update, 1),
            CUresult::SUCCESS
        );
        assert_eq!(
            (api.cuGraphAddDependencies)(graph, &update, &copy, 1),
            CUresult::SUCCESS
        );
        let mut exec: CUgraphExec = null_mut();
        assert_eq!(
            (api.cuGraphInstantiateWithFlags)(&mut exec, graph, 0),
            CUresult::SUCCESS
        );
        // A cycle cannot be instantiated.
        assert_eq!(
            (api.cuGraphAddDependencies)(graph, &copy, &memset, 1),
            CUresult::SUCCESS
        );
        let mut cyclic: CUgraphExec = null_mut();
        assert_eq!(
            (api.cuGraphInstantiateWithFlags)(&mut cyclic, graph, 0),
            CUresult::ERROR_INVALID_VALUE
        );
        assert_eq!((api.cuGraphLaunch)(exec, null_mut()), CUresult::SUCCESS);
        assert_eq!((api.cuGraphExecDestroy)(exec), CUresult::SUCCESS);
        assert_eq!((api.cuGraphDestroy)(graph), CUresult::SUCCESS);
    }
    let mut expected = 0x0102_0304u32.to_ne_bytes().repeat(16);
    expected[8..16].copy_from_slice(&source[..8]);
    assert_eq!(gpu.download(b, 64), expected);
    let counts = gpu.fake.counts();
    assert_eq!((counts.graphs, counts.graph_execs), (0, 0));
}

#[test]
fn modules_expose_their_entries_and_fail_with_a_log() {
    let gpu = Gpu::new("module");
    let api = gpu.api();
    let load = |text: &str| -> (CUresult, CUmodule, String) {
        let text = CString::new(text).unwrap();
        let mut log = vec![0u8; 256];
        let mut options = [CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
        let mut values: [*mut c_void; 2] = [
            log.as_mut_ptr().cast(),
            std::ptr::without_provenance_mut(log.len()),
        ];
        let mut module: CUmodule = null_mut();
        // SAFETY: two options with their values; the log buffer holds what its size says.
        let r = unsafe {
            (api.cuModuleLoadDataEx)(
                &mut module,
                text.as_ptr().cast(),
                2,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        };
        let written = values[1].addr().min(log.len());
        let end = log[..written]
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(written);
        (r, module, String::from_utf8_lossy(&log[..end]).into_owned())
    };
    let (r, _, log) = load(".entry ok() {}\n  cuhal_not_an_instruction;\n");
    assert_eq!(r, CUresult::ERROR_INVALID_PTX);
    assert!(
        log.contains("line 2") && log.contains("cuhal_not_an_instruction"),
        "{log}"
    );

    let (r, module, _) = load(".visible .entry first(.param .u64 p) {}\n.entry second() {}");
    assert_eq!(r, CUresult::SUCCESS);
    let function = |name: &str| {
        let name = CString::new(name).unwrap();
        let mut f: CUfunction = null_mut();
        // SAFETY: valid out-pointer, live module, NUL-terminated name.
        (
            unsafe { (api.cuModuleGetFunction)(&mut f, module, name.as_ptr()) },
            f,
        )
    };
    assert_eq!(function("third").0, CUresult::ERROR_NOT_FOUND);
    let (r, first) = function("first");
    assert_eq!(r, CUresult::SUCCESS);
    let mut threads = 0;
    // SAFETY: valid out-pointer and function; the launch passes no parameters.
    unsafe {
        assert_eq!(
            (api.cuFuncGetAttribute)(&mut threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, first),
            CUresult::SUCCESS
        );
        for _ in 0..3 {
            let r = (api.cuLaunchKernel)(
                first,
                8,
                1,
                1,
                256,
                1,
                1,
                0,
                null_mut(),
                null_mut(),
                null_mut(),
            );
            assert_eq!(r, CUresult::SUCCESS);
        }
        let too_big = (api.cuLaunchKernel)(
            first,
            1,
            1,
            1,
            1024,
            2,
            1,
            0,
            null_mut(),
            null_mut(),
            null_mut(),
        );
        assert_eq!(too_big, CUresult::ERROR_INVALID_VALUE);
        assert_eq!((api.cuModuleUnload)(module), CUresult::SUCCESS);
        assert_eq!(
            (api.cuFuncGetAttribute)(&mut threads, 0, first),
            CUresult::ERROR_INVALID_HANDLE
        );
    }
    assert_eq!(threads, 1024);
    assert_eq!(gpu.fake.launches("first"), 3);
    assert_eq!(gpu.fake.launches("second"), 0);
    assert_eq!(gpu.fake.counts().modules, 0);
}

#[test]
fn faults_hit_exactly_the_calls_they_name() {
    let gpu = Gpu::new("faults");
    let api = gpu.api();
    let mut event: CUevent = null_mut();
    // SAFETY: valid out-pointer.
    let r = unsafe { (api.cuEventCreate)(&mut event, 0) };
    assert_eq!(r, CUresult::SUCCESS);
    gpu.fake
        .fail_calls("cuEventQuery", 2, 2, status::ILLEGAL_ADDRESS);
    let results: Vec<CUresult> = (0..5)
        // SAFETY: the event is live.
        .map(|_| unsafe { (api.cuEventQuery)(event) })
        .collect();
    let ok = CUresult::SUCCESS;
    let bad = CUresult::ERROR_ILLEGAL_ADDRESS;
    assert_eq!(results, [ok, bad, bad, ok, ok]);
    assert_eq!(gpu.fake.calls("cuEventQuery"), 5, "failed calls count too");
    gpu.fake.fail("cuEventQuery", status::LAUNCH_FAILED);
    // SAFETY: the event is live.
    let r = unsafe { (api.cuEventQuery)(event) };
    assert_eq!(r, CUresult::ERROR_LAUNCH_FAILED);
    gpu.fake.clear_faults();
    // SAFETY: the event is live.
    assert_eq!(unsafe { (api.cuEventQuery)(event) }, CUresult::SUCCESS);
    assert_eq!(
        api.error_name(CUresult::ERROR_ILLEGAL_ADDRESS),
        "CUDA_ERROR_ILLEGAL_ADDRESS"
    );
}

#[test]
fn timed_work_completes_later_on_the_model_clock() {
    let gpu = Gpu::new("timing");
    let api = gpu.api();
    let text = CString::new(".visible .entry k() {}").unwrap();
    let (mut module, mut k): (CUmodule, CUfunction) = (null_mut(), null_mut());
    let (mut s1, mut s2): (CUstream, CUstream) = (null_mut(), null_mut());
    let (mut e1, mut e2, mut e0): (CUevent, CUevent, CUevent) =
        (null_mut(), null_mut(), null_mut());
    let launch = |k: CUfunction, stream: CUstream| {
        // SAFETY: a live function and stream; no parameters.
        let r =
            unsafe { (api.cuLaunchKernel)(k, 1, 1, 1, 1, 1, 1, 0, stream, null_mut(), null_mut()) };
        assert_eq!(r, CUresult::SUCCESS);
    };
    // SAFETY: valid out-pointers and live handles throughout.
    unsafe {
        assert_eq!(
            (api.cuModuleLoadData)(&mut module, text.as_ptr().cast()),
            CUresult::SUCCESS
        );
        let name = CString::new("k").unwrap();
        assert_eq!(
            (api.cuModuleGetFunction)(&mut k, module, name.as_ptr()),
            CUresult::SUCCESS
        );
        for stream in [&mut s1, &mut s2] {
            assert_eq!((api.cuStreamCreate)(stream, 1), CUresult::SUCCESS);
        }
        for event in [&mut e1, &mut e2, &mut e0] {
            assert_eq!(
                (api.cuEventCreate)(event, CU_EVENT_DISABLE_TIMING),
                CUresult::SUCCESS
            );
        }
        // An hour per launch: nothing completes until `finish_work`.
        gpu.fake.set_timing(
            std::time::Duration::from_secs(3600),
            std::time::Duration::ZERO,
        );
        launch(k, s1);
        assert_eq!((api.cuEventRecord)(e1, s1), CUresult::SUCCESS);
        assert_eq!((api.cuEventQuery)(e1), CUresult::ERROR_NOT_READY);
        // s2 waits for e1 on the device: its own later work is not done either.
        assert_eq!((api.cuStreamWaitEvent)(s2, e1, 0), CUresult::SUCCESS);
        assert_eq!((api.cuEventRecord)(e2, s2), CUresult::SUCCESS);
        assert_eq!((api.cuEventQuery)(e2), CUresult::ERROR_NOT_READY);
        // The null stream has nothing of the model's in it.
        assert_eq!((api.cuEventRecord)(e0, null_mut()), CUresult::SUCCESS);
        assert_eq!((api.cuEventQuery)(e0), CUresult::SUCCESS);
        // Timing events: the time between a complete one and one behind the running launch
        // is not known yet, and each such question is counted.
        let (mut t0, mut t1): (CUevent, CUevent) = (null_mut(), null_mut());
        for event in [&mut t0, &mut t1] {
            assert_eq!((api.cuEventCreate)(event, 0), CUresult::SUCCESS);
        }
        assert_eq!((api.cuEventRecord)(t0, null_mut()), CUresult::SUCCESS);
        assert_eq!((api.cuEventRecord)(t1, s1), CUresult::SUCCESS);
        let mut ms = -1.0f32;
        assert_eq!(gpu.fake.elapsed_not_ready(), 0);
        assert_eq!(
            (api.cuEventElapsedTime)(&mut ms, t0, t1),
            CUresult::ERROR_NOT_READY
        );
        assert_eq!(
            (api.cuEventElapsedTime)(&mut ms, t1, t0),
            CUresult::ERROR_NOT_READY
        );
        assert_eq!(gpu.fake.elapsed_not_ready(), 2);
        gpu.fake.finish_work();
        assert_eq!((api.cuEventQuery)(e1), CUresult::SUCCESS);
        assert_eq!((api.cuEventQuery)(e2), CUresult::SUCCESS);
        assert_eq!((api.cuEventElapsedTime)(&mut ms, t0, t1), CUresult::SUCCESS);
        assert!(ms >= 0.0, "{ms}");
        assert_eq!(gpu.fake.elapsed_not_ready(), 2, "complete: not counted");
        for event in [t0, t1] {
            assert_eq!((api.cuEventDestroy)(event), CUresult::SUCCESS);
        }

        // Two launches of 20 ms: a synchronize returns once both are done.
        gpu.fake.set_timing(
            std::time::Duration::from_millis(20),
            std::time::Duration::ZERO,
        );
        let start = std::time::Instant::now();
        launch(k, s1);
        launch(k, s1);
        assert_eq!((api.cuEventRecord)(e1, s1), CUresult::SUCCESS);
        assert_eq!((api.cuEventQuery)(e1), CUresult::ERROR_NOT_READY);
        assert_eq!((api.cuEventSynchronize)(e1), CUresult::SUCCESS);
        assert!(start.elapsed() >= std::time::Duration::from_millis(40));
        assert_eq!((api.cuEventQuery)(e1), CUresult::SUCCESS);
        launch(k, s2);
        assert_eq!((api.cuStreamSynchronize)(s2), CUresult::SUCCESS);
        assert!(start.elapsed() >= std::time::Duration::from_millis(60));
        gpu.fake
            .set_timing(std::time::Duration::ZERO, std::time::Duration::ZERO);
        for event in [e1, e2, e0] {
            assert_eq!((api.cuEventDestroy)(event), CUresult::SUCCESS);
        }
        for stream in [s1, s2] {
            assert_eq!((api.cuStreamDestroy)(stream), CUresult::SUCCESS);
        }
        assert_eq!((api.cuModuleUnload)(module), CUresult::SUCCESS);
    }
}
