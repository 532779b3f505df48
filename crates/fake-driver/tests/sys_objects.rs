//! cuhal-sys's call macro and owned objects (streams, events, modules) against the fake: what
//! each creates and destroys, and how a failed call names itself.

use std::sync::Arc;

use cuhal_fake_driver::harness::FakeDriver;
use cuhal_fake_driver::{module, status};
use cuhal_sys::*;

fn open(tag: &str) -> (FakeDriver, Arc<PrimaryContext>) {
    let fake = FakeDriver::private(tag).unwrap();
    let api = Arc::new(DriverApi::load_from(fake.path()).unwrap());
    let context = PrimaryContext::retain(api, 0).unwrap();
    (fake, context)
}

const PTX: &str =
    ".version 8.0\n.target sm_90\n.visible .entry first()\n{ ret; }\n.entry second() {}";

#[test]
fn a_failed_call_names_itself_once() {
    let (fake, context) = open("sys-call-name");
    let stream = Stream::new(&context, CU_STREAM_NON_BLOCKING).unwrap();
    fake.fail(cu_name!(cuStreamSynchronize), status::LAUNCH_FAILED);
    let error = stream.synchronize().unwrap_err();
    match &error {
        Error::Cuda { call, result, .. } => {
            assert_eq!(*call, "cuStreamSynchronize");
            assert_eq!(*result, CUresult::ERROR_LAUNCH_FAILED);
        }
        other => panic!("expected a CUDA error, got {other:?}"),
    }
    assert!(error.is_sticky(), "a launch failure loses the context");
    assert!(
        error
            .to_string()
            .starts_with("cuStreamSynchronize failed: CUDA_ERROR_LAUNCH_FAILED"),
        "{error}"
    );
    fake.clear_faults();
    stream.synchronize().unwrap();
}

#[test]
fn the_macro_calls_required_ready_and_optional_entries() {
    let (fake, context) = open("sys-call-forms");
    let api = context.api();
    let mut count = 0;
    // SAFETY: a valid out-pointer.
    unsafe { cu!(api, cuDeviceGetCount(&mut count)) }.unwrap();
    assert_eq!(count, 1);

    let stream = Stream::new(&context, CU_STREAM_NON_BLOCKING).unwrap();
    // SAFETY: a live stream.
    assert!(unsafe { cu!(ready: api, cuStreamQuery(stream.raw())) }.unwrap());
    fake.fail(cu_name!(cuStreamQuery), status::NOT_READY);
    // SAFETY: as above.
    assert!(!unsafe { cu!(ready: api, cuStreamQuery(stream.raw())) }.unwrap());
    fake.fail(cu_name!(cuStreamQuery), status::INVALID_VALUE);
    // SAFETY: as above.
    let error = unsafe { cu!(ready: api, cuStreamQuery(stream.raw())) }.unwrap_err();
    assert_eq!(error.result(), Some(CUresult::ERROR_INVALID_VALUE));
    fake.clear_faults();

    let mut id = 0u64;
    // SAFETY: a live stream and a valid out-pointer.
    unsafe { cu!(optional: api, cuStreamGetId(stream.raw(), &mut id)) }.unwrap();
}

#[test]
fn an_optional_entry_the_driver_lacks_is_a_missing_symbol() {
    let fake = FakeDriver::private("sys-call-missing").unwrap();
    fake.hide(cu_name!(cuStreamGetId));
    let api = Arc::new(DriverApi::load_from(fake.path()).unwrap());
    assert!(api.cuStreamGetId.is_none());
    let mut id = 0u64;
    // SAFETY: the entry is absent, so nothing is called.
    let error = unsafe { cu!(optional: api, cuStreamGetId(std::ptr::null_mut(), &mut id)) };
    match error {
        Err(Error::MissingSymbol { symbol, .. }) => assert_eq!(symbol, "cuStreamGetId"),
        other => panic!("expected a missing symbol, got {other:?}"),
    }
}

#[test]
fn streams_and_events_are_destroyed_on_drop() {
    let (fake, context) = open("sys-objects-drop");
    let before = fake.counts();
    let stream = Stream::with_priority(&context, CU_STREAM_NON_BLOCKING, -1).unwrap();
    let other = Stream::new(&context, CU_STREAM_NON_BLOCKING).unwrap();
    let start = Event::new(&context, 0).unwrap();
    let end = Event::new(&context, 0).unwrap();
    let sync = Event::new(&context, CU_EVENT_DISABLE_TIMING).unwrap();
    let live = fake.counts();
    assert_eq!(live.streams - before.streams, 2);
    assert_eq!(live.events - before.events, 3);

    start.record(&stream).unwrap();
    other.wait_event(&start).unwrap();
    // SAFETY: `end` is live.
    unsafe { stream.record_raw_event(end.raw()) }.unwrap();
    end.synchronize().unwrap();
    assert!(start.query().unwrap() && end.query().unwrap());
    let ms = start.elapsed_ms(&end).unwrap().expect("both recorded");
    assert!(ms >= 0.0, "{ms}");
    sync.record_and_synchronize(&other).unwrap();
    assert!(other.query().unwrap());
    assert_eq!(fake.calls(cu_name!(cuStreamCreateWithPriority)), 1);

    // Dropped on another thread, with no context current there: the handles bind it.
    std::thread::spawn(move || drop((stream, other, start, end, sync)))
        .join()
        .unwrap();
    let after = fake.counts();
    assert_eq!(after.streams, before.streams);
    assert_eq!(after.events, before.events);
}

#[test]
fn a_failed_create_leaves_nothing_behind() {
    let (fake, context) = open("sys-objects-create");
    let before = fake.counts();
    fake.fail(cu_name!(cuEventCreate), status::OUT_OF_MEMORY);
    let error = Event::new(&context, 0).unwrap_err();
    assert_eq!(error.result(), Some(CUresult::ERROR_OUT_OF_MEMORY));
    fake.fail(cu_name!(cuStreamCreate), status::OUT_OF_MEMORY);
    assert!(Stream::new(&context, CU_STREAM_NON_BLOCKING).is_err());
    fake.clear_faults();
    assert_eq!(fake.counts().events, before.events);
    assert_eq!(fake.counts().streams, before.streams);
}

#[test]
fn modules_load_look_up_and_unload() {
    let (fake, context) = open("sys-module");
    let module = Module::load_ptx(&context, PTX).unwrap();
    assert_eq!(fake.counts().modules, 1);
    assert!(!module.function("first").unwrap().is_null());
    assert!(!module.function("second").unwrap().is_null());
    match module.function("third") {
        Err(Error::Cuda { call, result, .. }) => {
            assert_eq!(call, "cuModuleGetFunction");
            assert_eq!(result, CUresult::ERROR_NOT_FOUND);
        }
        other => panic!("expected NOT_FOUND, got {other:?}"),
    }
    assert!(matches!(
        module.function("nul\0name"),
        Err(Error::BadImage { .. })
    ));
    let cubin = Module::load_cubin(&context, format!("{PTX}\0").as_bytes()).unwrap();
    assert_eq!(fake.counts().modules, 2);
    drop((module, cubin));
    assert_eq!(fake.counts().modules, 0);
}

#[test]
fn a_compile_error_carries_the_jit_log() {
    let (fake, context) = open("sys-module-jit");
    let bad = format!("{PTX}\n{}\n", module::BAD_INSTRUCTION);
    let error = Module::load_ptx(&context, &bad).unwrap_err();
    match &error {
        Error::ModuleLoad { source, log } => {
            assert_eq!(source.result(), Some(CUresult::ERROR_INVALID_PTX));
            assert!(log.contains(module::BAD_INSTRUCTION), "{log}");
        }
        other => panic!("expected a module load error, got {other:?}"),
    }
    assert_eq!(error.result(), Some(CUresult::ERROR_INVALID_PTX));
    assert!(error.to_string().contains("JIT log"), "{error}");
    assert!(matches!(
        Module::load_ptx(&context, "nul\0ptx"),
        Err(Error::BadImage { .. })
    ));
    assert!(matches!(
        Module::load_cubin(&context, b"ab"),
        Err(Error::BadImage { .. })
    ));
    assert_eq!(fake.counts().modules, 0);
}

#[test]
fn mapped_host_memory_is_zeroed_shared_with_the_device_and_freed_on_drop() {
    let (fake, context) = open("sys-mapped");
    let before = fake.counts().host_allocations;
    let mapped = MappedHostMemory::new(&context, 16).unwrap();
    assert_eq!(fake.counts().host_allocations, before + 1);
    assert_eq!(mapped.len(), 16);
    assert!(!mapped.is_empty());
    // The fake's device sees host memory at its host address.
    assert_eq!(mapped.device_ptr(), mapped.host_ptr().addr() as u64);
    assert!(
        (0..4).all(|i| mapped.word(i).load(std::sync::atomic::Ordering::Relaxed) == 0),
        "not zeroed"
    );
    mapped
        .word(3)
        .store(7, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: byte 12 lies inside the allocation; nothing else accesses it meanwhile.
    assert_eq!(unsafe { mapped.host_ptr().add(12).read() }, 7);
    drop(mapped);
    assert_eq!(fake.counts().host_allocations, before);
}

#[test]
fn mapped_host_memory_whose_device_address_fails_is_freed() {
    let (fake, context) = open("sys-mapped-fail");
    let before = fake.counts().host_allocations;
    fake.fail(cu_name!(cuMemHostGetDevicePointer), status::INVALID_VALUE);
    let error = MappedHostMemory::new(&context, 8).unwrap_err();
    assert!(
        matches!(&error, Error::Cuda { call, .. } if *call == cu_name!(cuMemHostGetDevicePointer)),
        "{error:?}"
    );
    fake.clear_faults();
    assert_eq!(fake.counts().host_allocations, before);
}

#[test]
#[should_panic(expected = "word 4 of a mapped allocation of 16 bytes")]
fn a_mapped_word_past_the_end_is_refused() {
    let (_fake, context) = open("sys-mapped-bounds");
    let mapped = MappedHostMemory::new(&context, 16).unwrap();
    let _ = mapped.word(4);
}
