//! Regression tests for holes where safe code, bad input or a driver fault could corrupt memory,
//! lose the wrong thing or leak: each drives the case through the public API on the fake driver.

mod fake_support;

use cuhal_sys::cu_name;
use std::sync::Arc;

use cuhal::{
    BufferRange, CommandBuffer, DeviceOptions, Error, FillPattern, MemorySink, Queue, Verbosity,
};
use cuhal_command::testing::ElfImage;
use cuhal_fake_driver::control::Counts;
use cuhal_fake_driver::status;
use fake_support::*;

/// A sticky error first seen by a tracing call (the submission zone's `cuEventRecord`) loses the
/// device, not only the queue, and the driver's code can be read back from the failure.
#[test]
fn a_sticky_error_in_a_tracing_call_loses_the_device() {
    let sink = Arc::new(MemorySink::new());
    let (fake, _driver, device) = open(
        "sticky-trace",
        DeviceOptions {
            queues: 2,
            tracing: Verbosity::Coarse,
            trace_sink: Some(sink),
            ..DeviceOptions::default()
        },
    );
    let queue = device.queue(0);
    let buffer = device.create_buffer(256).unwrap();
    let mut cb = queue.create_command_buffer().unwrap();
    cb.fill(&buffer.whole(), FillPattern::U8(1)).unwrap();
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    // Work pending on the other queue must fail too.
    let (gate, other) = (device.create_semaphore(0), device.create_semaphore(0));
    device
        .queue(1)
        .barrier(&[(&gate, 1)], &[(&other, 1)])
        .unwrap();

    // The first driver call of the submission is the submission zone's begin record.
    fake.fail_calls(cu_name!(cuEventRecord), 1, 1, status::ILLEGAL_ADDRESS);
    let done = device.create_semaphore(0);
    let _ = queue.execute(&[], &[(&done, 1)], &[&cb]);
    let failure = failure_of(&done, 1);
    let cuda = cuhal::cuda_of_failure(&failure).expect("the driver's error");
    assert!(
        matches!(
            cuda,
            cuhal_sys::Error::Cuda { call, .. } if *call == cu_name!(cuEventRecord)
        ),
        "{cuda}"
    );
    assert_eq!(
        cuda.result(),
        Some(cuhal_sys::CUresult::ERROR_ILLEGAL_ADDRESS)
    );
    assert!(
        failure.downcast_ref::<cuhal::DeviceLost>().is_some(),
        "typed: {failure}"
    );
    let text = failure.to_string();
    assert!(!text.contains("tracing: tracing"), "{text}");
    assert!(
        device.lost().is_some_and(|f| f.ptr_eq(&failure)),
        "the device is lost with the tracing call's error"
    );
    assert!(failure_of(&other, 1).ptr_eq(&failure));
    let error = queue.barrier(&[], &[]).unwrap_err();
    assert!(error.device_lost().is_some(), "{error}");
    drop((cb, buffer, device));
    assert_eq!(live(&fake), Counts::default());
}

/// A pool whose release threshold cannot be set is destroyed, not leaked, when opening fails.
#[test]
fn a_failed_memory_pool_setup_leaks_nothing() {
    let (fake, driver) = load("pool-attribute");
    fake.fail(cu_name!(cuMemPoolSetAttribute), status::INVALID_VALUE);
    let error = driver.open(0, queues(1)).unwrap_err();
    assert!(
        error.to_string().contains(cu_name!(cuMemPoolSetAttribute)),
        "{error}"
    );
    assert_eq!(live(&fake), Counts::default());
}

/// Checks that `queue` refuses to fill or to write 256 bytes into `target`, handing each error
/// and the role the buffer had to `check`.
fn fill_and_write_refused(queue: &Queue, target: &BufferRange, check: impl Fn(Error, &str)) {
    let fill = queue.fill(&[], &[], target, FillPattern::U8(1));
    check(fill.unwrap_err(), "fill target");
    let write = queue.write(&[], &[], target, &[1; 256]);
    check(write.unwrap_err(), "write target");
}

/// Queue operations refuse buffers of another device: one device's queue must never write
/// another's memory.
#[test]
fn queue_operations_refuse_buffers_of_another_device() {
    let (fake, driver) = load("two-devices");
    fake.set_device_count(2);
    let d0 = driver.open(0, queues(1)).unwrap();
    let d1 = driver.open(1, queues(1)).unwrap();
    let q0 = d0.queue(0);
    let mine = d0.create_buffer(256).unwrap();
    let theirs = d1.create_buffer(256).unwrap();
    poison(&d1, d1.queue(0), &theirs.whole());
    let wrong = |e: Error, what: &str| match e {
        Error::WrongDevice { what: got } => assert_eq!(got, what),
        other => panic!("{what}: expected WrongDevice, got {other:?}"),
    };
    fill_and_write_refused(q0, &theirs.whole(), wrong);
    wrong(
        q0.copy(&[], &[], &mine.whole(), &theirs.whole())
            .unwrap_err(),
        "copy target",
    );
    wrong(
        q0.copy(&[], &[], &theirs.whole(), &mine.whole())
            .unwrap_err(),
        "copy source",
    );
    let host = d0.create_host_buffer(256).unwrap();
    wrong(
        q0.read(&[], &[], &theirs.whole(), &host, 0).unwrap_err(),
        "read source",
    );
    let their_host = d1.create_host_buffer(256).unwrap();
    wrong(
        q0.read(&[], &[], &mine.whole(), &their_host, 0)
            .unwrap_err(),
        "read target (host buffer)",
    );
    // A command buffer of the other device is named as one.
    let mut cb = d1.queue(0).create_command_buffer().unwrap();
    cb.fill(&theirs.whole(), FillPattern::U8(1)).unwrap();
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    let error = q0.execute(&[], &[], &[&cb]).unwrap_err();
    assert!(error.to_string().contains("command buffer"), "{error}");
    wrong(error, "command buffer");
    // Nothing reached the other device's memory, and the queue still works.
    assert_eq!(read(&d1, d1.queue(0), &theirs.whole()), vec![POISON; 256]);
    assert!(q0.lost().is_none());
}

/// A completion event that never completes fails its work with an error that says so (not "an
/// invalid argument"), and nothing hangs.
#[test]
fn a_completion_event_that_never_completes_is_named() {
    let (fake, _driver, device) = open("never-complete", queues(1));
    let queue = device.queue(0);
    let buffer = device.create_buffer(64).unwrap();
    fake.fail(cu_name!(cuEventQuery), status::NOT_READY);
    let done = device.create_semaphore(0);
    queue
        .fill(&[], &[(&done, 1)], &buffer.whole(), FillPattern::U8(1))
        .unwrap();
    let failure = failure_of(&done, 1);
    match failure.downcast_ref::<Error>() {
        Some(Error::EventNotComplete { after }) => assert_eq!(*after, cu_name!(cuEventSynchronize)),
        other => panic!("expected EventNotComplete, got {other:?} ({failure})"),
    }
    assert!(
        !failure.to_string().contains("invalid argument"),
        "{failure}"
    );
    fake.clear_faults();
}

/// A host buffer that a queued read will write cannot be read on the host until the read is
/// done: no data race between the device's writes and a host read is reachable.
#[test]
fn a_host_buffer_is_not_readable_while_a_queued_read_writes_it() {
    let (_fake, _driver, device) = open("host-busy", queues(1));
    let queue = device.queue(0);
    let buffer = device.create_buffer(64).unwrap();
    queue.write(&[], &[], &buffer.whole(), &[5; 64]).unwrap();
    let host = device.create_host_buffer(64).unwrap();
    let (gate, done) = (device.create_semaphore(0), device.create_semaphore(0));
    queue
        .read(&[(&gate, 1)], &[(&done, 1)], &buffer.whole(), &host, 0)
        .unwrap();
    let mut out = [0u8; 64];
    assert_eq!(
        host.read(0, &mut out),
        Err(cuhal_command::Error::HostBufferBusy),
        "the read is queued: the device may write the buffer at any moment"
    );
    gate.signal(1).unwrap();
    wait(&done, 1);
    // Readable as soon as the signal is seen, before the action retires.
    host.read(0, &mut out).unwrap();
    assert_eq!(out, [5; 64]);
}

/// `dealloca` never frees memory that queued work still uses, and a use submitted after it is a
/// typed error at submission that does not lose the queue.
#[test]
fn dealloca_frees_only_after_every_queued_use() {
    let (fake, _driver, device) = open("dealloca", queues(2));
    let (q0, q1) = (device.queue(0), device.queue(1));
    let ready = device.create_semaphore(0);
    let buffer = q0.alloca(&[], &[(&ready, 1)], 256).unwrap();
    wait(&ready, 1);
    let allocated = live(&fake).device_allocations;
    let mut cb = q0.create_command_buffer().unwrap();
    cb.fill(&buffer.whole(), FillPattern::U8(3)).unwrap();
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();

    // Another queue's fill, queued behind a gate, uses the buffer; the dealloca issues at once.
    let [gate, filled, freed] = std::array::from_fn(|_| device.create_semaphore(0));
    q1.fill(
        &[(&gate, 1)],
        &[(&filled, 1)],
        &buffer.whole(),
        FillPattern::U8(9),
    )
    .unwrap();
    q0.dealloca(&[], &[(&freed, 1)], &buffer).unwrap();
    wait(&freed, 1);
    assert_eq!(
        live(&fake).device_allocations,
        allocated,
        "the memory outlives the fill queued before the dealloca"
    );

    // New uses are refused at submission, and nothing is lost.
    let deallocated = |e: Error, what: &str| match e {
        Error::Deallocated { what: got } => assert_eq!(got, what),
        other => panic!("{what}: expected Deallocated, got {other:?}"),
    };
    fill_and_write_refused(q0, &buffer.whole(), deallocated);
    deallocated(
        q0.execute(&[], &[], &[&cb]).unwrap_err(),
        "command buffer's buffer",
    );
    deallocated(
        q0.dealloca(&[], &[], &buffer).unwrap_err(),
        "dealloca buffer",
    );
    assert!(q0.lost().is_none() && q1.lost().is_none());

    // The fill runs on live memory; the memory goes when it is done.
    gate.signal(1).unwrap();
    wait(&filled, 1);
    settle(q1);
    assert_eq!(live(&fake).device_allocations, allocated - 1);
    drop((cb, buffer, device));
    assert_eq!(live(&fake), Counts::default());
}

/// An execute whose command buffer uses more stream-ordered allocations than a submission keeps
/// inline holds every one of them until it completes: deallocas queued meanwhile free nothing
/// early, each time the queue's slots are reused.
#[test]
fn an_execute_holds_every_one_of_many_allocations_it_uses() {
    let (fake, _driver, device) = open("dealloca-many", queues(2));
    let (q0, q1) = (device.queue(0), device.queue(1));
    for round in 1..=3u64 {
        let ready = device.create_semaphore(0);
        let buffers: Vec<_> = (1..=6)
            .map(|n| q0.alloca(&[], &[(&ready, n)], 256).unwrap())
            .collect();
        wait(&ready, 6);
        let allocated = live(&fake).device_allocations;
        let mut cb = q1.create_command_buffer().unwrap();
        for buffer in &buffers {
            cb.fill(&buffer.whole(), FillPattern::U8(7)).unwrap();
        }
        let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
        let [gate, done, freed] = std::array::from_fn(|_| device.create_semaphore(0));
        q1.execute(&[(&gate, 1)], &[(&done, 1)], &[&cb]).unwrap();
        for (value, buffer) in (1..).zip(&buffers) {
            q0.dealloca(&[], &[(&freed, value)], buffer).unwrap();
        }
        wait(&freed, 6);
        assert_eq!(
            live(&fake).device_allocations,
            allocated,
            "round {round}: every allocation outlives the execute queued before its dealloca"
        );
        gate.signal(1).unwrap();
        wait(&done, 1);
        settle(q1);
        assert_eq!(
            live(&fake).device_allocations,
            allocated - 6,
            "round {round}: the allocations go once the execute is done"
        );
    }
    assert!(q0.lost().is_none() && q1.lost().is_none());
}

/// A driver without `cuGraphAddEventRecordNode` (needed only to trace inside graphs) still
/// opens; asking for graph tracing is a typed error naming the symbol.
#[test]
fn a_driver_without_graph_event_nodes_opens_and_refuses_graph_tracing_by_name() {
    let (_fake, driver) = load_with("no-event-node", |fake| {
        fake.hide(cu_name!(cuGraphAddEventRecordNode))
    });
    assert!(driver.api().cuGraphAddEventRecordNode.is_none());
    let device = driver.open(0, queues(1)).expect("an untraced device opens");
    let buffer = device.create_buffer(64).unwrap();
    let mut cb = device.queue(0).create_command_buffer().unwrap();
    cb.fill(&buffer.whole(), FillPattern::U8(1)).unwrap();
    cb.end().unwrap();
    drop((cb, buffer, device));
    let traced = DeviceOptions {
        tracing: Verbosity::Coarse,
        trace_sink: Some(Arc::new(MemorySink::new())),
        ..DeviceOptions::default()
    };
    let error = driver.open(0, traced.clone()).unwrap_err();
    match &error {
        Error::Driver(cuhal_sys::Error::MissingSymbol { symbol, .. }) => {
            assert_eq!(*symbol, cu_name!(cuGraphAddEventRecordNode))
        }
        other => panic!("expected MissingSymbol, got {other:?}"),
    }
    // Deferred command buffers trace with stream records: they need no graph node.
    driver
        .open(
            0,
            DeviceOptions {
                command_buffer_mode: cuhal::CommandBufferMode::Deferred,
                ..traced
            },
        )
        .expect("stream tracing needs no graph event node");
}

/// A cubin or fatbin whose headers declare more bytes than the slice holds never reaches the
/// driver, which would read past the slice's end (it takes the image without a length).
#[test]
fn a_truncated_cubin_is_refused_before_the_driver_reads_it() {
    let (fake, _driver, device) = open("cubin", queues(1));
    // The section headers past the end of the first 64 bytes.
    let cubin = ElfImage::new().build();
    let elf = &cubin[..64];
    // A fatbin whose size fits the slice but whose one entry declares a payload past it.
    let mut fatbin = [0u8; 16 + 64 + 8];
    fatbin[..4].copy_from_slice(&0xba55_ed50u32.to_le_bytes());
    fatbin[4..6].copy_from_slice(&1u16.to_le_bytes());
    fatbin[6..8].copy_from_slice(&16u16.to_le_bytes());
    fatbin[8..16].copy_from_slice(&72u64.to_le_bytes());
    fatbin[16..18].copy_from_slice(&1u16.to_le_bytes()); // PTX
    fatbin[20..24].copy_from_slice(&64u32.to_le_bytes());
    fatbin[24..32].copy_from_slice(&4096u64.to_le_bytes());
    let before = fake.calls(cu_name!(cuModuleLoadDataEx));
    for image in [elf, b".version 8.0 no terminator", &fatbin[..]] {
        match cuhal::Executable::load_cubin(device.context(), image) {
            Err(cuhal_command::Error::BadImage { .. }) => {}
            other => panic!("expected BadImage, got {other:?}"),
        }
    }
    assert_eq!(fake.calls(cu_name!(cuModuleLoadDataEx)), before);
}

/// `scale` of `module`, whose parameters (8, 4 and 4 bytes) the driver reported with one
/// `cuFuncGetParamInfo` call each and no probe past the end.
fn scale_probed_once_per_parameter(
    fake: &cuhal_fake_driver::harness::FakeDriver,
    module: &cuhal::Executable,
) -> cuhal::Function {
    let before = fake.calls(cu_name!(cuFuncGetParamInfo));
    let scale = module.function("scale").unwrap();
    assert_eq!(scale.parameter_sizes(), Some(&[8, 4, 4][..]));
    assert_eq!(
        fake.calls(cu_name!(cuFuncGetParamInfo)) - before,
        3,
        "no probe past the end"
    );
    scale
}

/// Where the driver cannot report a kernel's parameters, a dispatch needs the caller to state
/// them; a wrong argument list is refused either way, so the driver never reads arguments that
/// were not passed. With `cuFuncGetParamCount` the layout is read without a failing call.
#[test]
fn dispatch_arguments_are_checked_with_or_without_the_drivers_help() {
    use cuhal::{Dispatch, KernelArgs};
    use cuhal_command::Error as CommandError;

    // A driver that reports parameters: exactly one call per parameter, none failing.
    let (fake, _driver, device) = open("params", queues(1));
    let module = device.load_ptx(PTX).unwrap();
    let scale = scale_probed_once_per_parameter(&fake, &module);
    let buffer = device.create_buffer(1024).unwrap();
    let mut cb = device.queue(0).create_command_buffer().unwrap();
    let short = KernelArgs::new().with_range(&buffer.whole()).with(2u32);
    assert!(matches!(
        cb.dispatch(&Dispatch::new(&scale, [1, 1, 1], [32, 1, 1], &short)),
        Err(CommandError::ArgumentMismatch { .. })
    ));
    assert!(matches!(
        scale.with_parameter_sizes(&[8, 8, 4]),
        Err(CommandError::ArgumentMismatch { index: Some(1), .. })
    ));
    drop((cb, buffer, device));

    // A driver without `cuFuncGetParamCount` (as compute-sanitizer's interposer can present a
    // 13.0 driver): the count comes from the PTX text, so still one call per parameter and no
    // failing probe past the end.
    let (fake, driver) = load_with("no-count", |fake| fake.hide(cu_name!(cuFuncGetParamCount)));
    let device = driver.open(0, queues(1)).unwrap();
    let module = device.load_ptx(PTX).unwrap();
    assert_eq!(module.parameter_count("scale"), Some(3));
    let scale = scale_probed_once_per_parameter(&fake, &module);
    drop((scale, module, device));

    // A driver that cannot: refused until the caller states the layout, then checked against it.
    let (_fake, driver) = load_with("no-params", |fake| fake.hide(cu_name!(cuFuncGetParamInfo)));
    let device = driver.open(0, queues(1)).unwrap();
    let scale = device.load_ptx(PTX).unwrap().function("scale").unwrap();
    assert_eq!(scale.parameter_sizes(), None);
    let buffer = device.create_buffer(1024).unwrap();
    let args = KernelArgs::new()
        .with_range(&buffer.whole())
        .with(2u32)
        .with(256u32);
    let mut cb = device.queue(0).create_command_buffer().unwrap();
    match cb.dispatch(&Dispatch::new(&scale, [1, 1, 1], [32, 1, 1], &args)) {
        Err(CommandError::UnknownParameters { function }) => assert_eq!(function, "scale"),
        other => panic!("expected UnknownParameters, got {other:?}"),
    }
    let stated = scale.with_parameter_sizes(&[8, 4, 4]).unwrap();
    cb.dispatch(&Dispatch::new(&stated, [1, 1, 1], [32, 1, 1], &args))
        .unwrap();
    assert!(matches!(
        cb.dispatch(&Dispatch::new(
            &stated,
            [1, 1, 1],
            [32, 1, 1],
            &short_of(&buffer)
        )),
        Err(CommandError::ArgumentMismatch { index: None, .. })
    ));
}

/// Two arguments: one fewer than `scale` takes.
fn short_of(buffer: &Arc<cuhal::Buffer>) -> cuhal::KernelArgs {
    cuhal::KernelArgs::new()
        .with_range(&buffer.whole())
        .with(2u32)
}

/// Where the driver cannot report a kernel's parameters (CUDA 12.0 to 12.3), a stated layout is
/// checked against the PTX's own `.param` list: a one-parameter layout for a three-parameter
/// kernel would let a one-argument dispatch reach `cuLaunchKernel`, which would read two
/// arguments that were never passed. The right layout is taken and its dispatch runs.
#[test]
fn a_stated_layout_must_agree_with_the_kernels_ptx() {
    use cuhal::{Dispatch, KernelArgs};
    use cuhal_command::Error as CommandError;

    // A 12.3 driver: neither `cuFuncGetParamInfo` (12.4) nor `cuFuncGetParamCount` (13.0).
    let (fake, driver) = load_with("stated-ptx", |fake| fake.set_driver_version(12030));
    let device = driver.open(0, queues(1)).unwrap();
    let scale = device.load_ptx(PTX).unwrap().function("scale").unwrap();
    assert_eq!(scale.parameter_sizes(), None);
    // Sizes whose sum overflows are refused, not wrapped.
    assert!(matches!(
        scale.with_parameter_sizes(&[usize::MAX, 2, 4]),
        Err(CommandError::BadKernelArgument { .. })
    ));
    match scale.with_parameter_sizes(&[4]) {
        Err(CommandError::ArgumentMismatch {
            function,
            index: None,
            expected: 3,
            found: 1,
        }) => assert_eq!(function, "scale"),
        other => panic!("expected ArgumentMismatch, got {other:?}"),
    }
    // The sizes too: `n` is a `.u32`.
    assert!(matches!(
        scale.with_parameter_sizes(&[8, 4, 8]),
        Err(CommandError::ArgumentMismatch {
            index: Some(2),
            expected: 4,
            found: 8,
            ..
        })
    ));
    // What the image says is checked on the unchecked path as well.
    // SAFETY: refused before anything could use it.
    let unchecked = unsafe { scale.with_parameter_sizes_unchecked(&[4]) };
    assert!(matches!(
        unchecked,
        Err(CommandError::ArgumentMismatch { index: None, .. })
    ));

    let stated = scale.with_parameter_sizes(&[8, 4, 4]).unwrap();
    let buffer = device.create_buffer(1024).unwrap();
    let one = KernelArgs::new().with_range(&buffer.whole());
    let mut cb = device.queue(0).create_command_buffer().unwrap();
    assert!(matches!(
        cb.dispatch(&Dispatch::new(&stated, [1, 1, 1], [32, 1, 1], &one)),
        Err(CommandError::ArgumentMismatch { index: None, .. })
    ));
    let args = one.with(2u32).with(256u32);
    cb.dispatch(&Dispatch::new(&stated, [1, 1, 1], [32, 1, 1], &args))
        .unwrap();
    let cb = cb.end().unwrap();
    let done = device.create_semaphore(0);
    device.queue(0).execute(&[], &[(&done, 1)], &[&cb]).unwrap();
    wait(&done, 1);
    assert_eq!(fake.launches("scale"), 1);
}

/// A cubin with one kernel, `k`, that the fake driver loads: the fake reads every image as text
/// up to its first NUL and takes the names after `.entry` as its kernels, so the ELF
/// identification's padding bytes spell `.entry k` (nothing else reads them). `info`: the
/// records of its `.nv.info.k` section; `None`: no such section, so the image does not say what
/// parameters `k` takes.
fn cubin_for_the_fake(info: Option<&[u8]>) -> Vec<u8> {
    let image = ElfImage::new().ident_text(*b".entry k");
    match info {
        Some(info) => image.section(".nv.info.k", info).build(),
        None => image.build(),
    }
}

/// `EIATTR_KPARAM_INFO` records (format `EIFMT_SVAL`, 12 bytes: index, ordinal, offset, and the
/// size in bits 18..32 of the last word) for parameters of `sizes`, in order.
fn kparam_records(sizes: &[u32]) -> Vec<u8> {
    let mut records = Vec::new();
    let mut offset = 0u16;
    for (ordinal, &size) in sizes.iter().enumerate() {
        records.extend([0x04, 0x17, 12, 0]);
        records.extend(0u32.to_le_bytes());
        records.extend((ordinal as u16).to_le_bytes());
        records.extend(offset.to_le_bytes());
        records.extend((size << 18 | 0x1f << 12).to_le_bytes());
        offset += size as u16;
    }
    records
}

/// A cubin's parameters on a driver that cannot report them: its `.nv.info` records check a
/// stated layout as PTX does; without them nothing can, so the safe path refuses the layout and
/// only the unsafe one takes it (and its dispatch runs).
#[test]
fn a_stated_layout_for_a_cubin_is_checked_where_the_image_says_and_unsafe_where_not() {
    use cuhal::{Dispatch, KernelArgs};
    use cuhal_command::Error as CommandError;

    // A 12.3 driver: neither `cuFuncGetParamInfo` (12.4) nor `cuFuncGetParamCount` (13.0).
    let (fake, driver) = load_with("stated-cubin", |fake| fake.set_driver_version(12030));
    let device = driver.open(0, queues(1)).unwrap();
    let buffer = device.create_buffer(1024).unwrap();
    let run = |k: &cuhal::Function, args: &KernelArgs| {
        let mut cb = device.queue(0).create_command_buffer().unwrap();
        cb.dispatch(&Dispatch::new(k, [1, 1, 1], [32, 1, 1], args))
            .unwrap();
        let cb = cb.end().unwrap();
        let done = device.create_semaphore(0);
        device.queue(0).execute(&[], &[(&done, 1)], &[&cb]).unwrap();
        wait(&done, 1);
    };

    // The image says: (u64, u32).
    let module = device
        .load_cubin(&cubin_for_the_fake(Some(&kparam_records(&[8, 4]))))
        .unwrap();
    assert_eq!(module.parameter_count("k"), Some(2));
    let k = module.function("k").unwrap();
    assert!(matches!(
        k.with_parameter_sizes(&[4]),
        Err(CommandError::ArgumentMismatch {
            index: None,
            expected: 2,
            found: 1,
            ..
        })
    ));
    assert!(matches!(
        k.with_parameter_sizes(&[8, 8]),
        Err(CommandError::ArgumentMismatch { index: Some(1), .. })
    ));
    let stated = k.with_parameter_sizes(&[8, 4]).unwrap();
    run(
        &stated,
        &KernelArgs::new().with_range(&buffer.whole()).with(1u32),
    );
    assert_eq!(fake.launches("k"), 1);
    drop((stated, k, module));

    // The image says nothing of `k`.
    let module = device.load_cubin(&cubin_for_the_fake(None)).unwrap();
    assert_eq!(module.parameter_count("k"), None);
    let k = module.function("k").unwrap();
    let one = KernelArgs::new().with_range(&buffer.whole());
    let mut cb = device.queue(0).create_command_buffer().unwrap();
    assert!(matches!(
        cb.dispatch(&Dispatch::new(&k, [1, 1, 1], [32, 1, 1], &one)),
        Err(CommandError::UnknownParameters { .. })
    ));
    drop(cb);
    match k.with_parameter_sizes(&[8]) {
        Err(e @ CommandError::UnverifiableParameters { .. }) => {
            assert!(
                e.to_string().contains("with_parameter_sizes_unchecked"),
                "{e}"
            );
        }
        other => panic!("expected UnverifiableParameters, got {other:?}"),
    }
    // SAFETY: `k` takes one 8-byte parameter, as the test's own image was built to say (the fake
    // reads no arguments of a kernel it does not run).
    let stated = unsafe { k.with_parameter_sizes_unchecked(&[8]) }.unwrap();
    run(&stated, &one);
    assert_eq!(fake.launches("k"), 2);
}

/// In both command buffer modes.
fn in_both_modes(test: impl Fn(cuhal::CommandBufferMode)) {
    for mode in [
        cuhal::CommandBufferMode::Graph,
        cuhal::CommandBufferMode::Deferred,
    ] {
        test(mode);
    }
}

fn slot_out_of_capacity(error: cuhal::Error) -> bool {
    matches!(
        error,
        cuhal::Error::Command(cuhal_command::Error::Binding(
            cuhal_command::BindingError::SlotOutOfCapacity { .. }
        ))
    )
}

/// A peer copy checks a slot range at either end against the command buffer's slots (it used
/// to check only the end it took for this device's, and then panicked indexing the other).
#[test]
fn a_peer_copy_checks_slot_ranges_at_both_ends() {
    in_both_modes(|mode| {
        let (_fake, _driver, device) = open(
            "peer-slot",
            DeviceOptions {
                command_buffer_mode: mode,
                ..queues(1)
            },
        );
        let buffer = device.create_buffer(64).unwrap();
        let slot = cuhal::BufferRange::slot(7, 0, 64).unwrap();
        let mut cb = device.queue(0).create_command_buffer().unwrap();
        let error = cb.copy_peer(&buffer.whole(), &slot).unwrap_err();
        assert!(slot_out_of_capacity(error.into()), "{mode:?}: target slot");
        let mut cb = device.queue(0).create_command_buffer().unwrap();
        let error = cb.copy_peer(&slot, &buffer.whole()).unwrap_err();
        assert!(slot_out_of_capacity(error.into()), "{mode:?}: source slot");
        // Within the capacity, a slot end is recorded and bound at submission.
        let mut cb = device
            .queue(0)
            .create_command_buffer_with_bindings(8)
            .unwrap();
        cb.copy_peer(&buffer.whole(), &slot).unwrap();
        let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
        let (target, done) = (
            device.create_buffer(64).unwrap(),
            device.create_semaphore(0),
        );
        let mut table = vec![target.whole(); 8];
        table[7] = target.whole();
        device
            .queue(0)
            .execute_with_bindings(&[], &[(&done, 1)], &[(&cb, &table)])
            .unwrap();
        wait(&done, 1);
    });
}

/// An indirect dispatch is set up from raw addresses when it is recorded, so binding slots in
/// its counts or its kernel's arguments are refused (they used to be recorded as the slot's
/// offset, an address the device then read).
#[test]
fn an_indirect_dispatch_refuses_binding_slots() {
    const PTX: &str = "\
.version 8.0
.target sm_90
.address_size 64
.visible .entry work(.param .u64 data) { ret; }
";
    in_both_modes(|mode| {
        fake_support::helpers::install_helpers(
            "soundness-indirect",
            fake_support::helpers::INDIRECT_HELPER_ONLY,
        );
        let (_fake, _driver, device) = open(
            "indirect-slot",
            DeviceOptions {
                command_buffer_mode: mode,
                ..queues(1)
            },
        );
        let work = device.load_ptx(PTX).unwrap().function("work").unwrap();
        let data = device.create_buffer(64).unwrap();
        let counts = device.create_buffer(12).unwrap();
        let mut cb = device
            .queue(0)
            .create_command_buffer_with_bindings(2)
            .unwrap();
        let not_bound = |e: cuhal_command::Error| {
            matches!(
                e,
                cuhal_command::Error::Binding(
                    cuhal_command::BindingError::SlotRangeNotBound { .. }
                )
            )
        };
        let args = cuhal::KernelArgs::new().with_range(&data.whole());
        let dispatch = cuhal::Dispatch::new(&work, [1, 1, 1], [32, 1, 1], &args);
        let slot_counts = cuhal::BufferRange::slot(0, 0, 12).unwrap();
        let error = cb.dispatch_indirect(&dispatch, &slot_counts).unwrap_err();
        assert!(not_bound(error), "{mode:?}: counts in a slot");
        let mut bound = cuhal::KernelArgs::new();
        bound.push_binding(1, 0);
        let dispatch = cuhal::Dispatch::new(&work, [1, 1, 1], [32, 1, 1], &bound);
        let error = cb
            .dispatch_indirect(&dispatch, &counts.whole())
            .unwrap_err();
        assert!(not_bound(error), "{mode:?}: an argument in a slot");
    });
}

/// A buffer made by `alloca` refuses host copies once `dealloca` released it (its memory may
/// serve the next allocation), and a host copy in progress holds the free back like queued work.
#[test]
fn a_deallocated_buffer_refuses_host_copies() {
    let (fake, _driver, device) = open("host-copy-after-dealloca", queues(1));
    let q = device.queue(0);
    let s = device.create_semaphore(0);
    let old = q.alloca(&[], &[(&s, 1)], 256).unwrap();
    wait(&s, 1);
    old.write(0, &[1; 256]).unwrap();
    q.dealloca(&[], &[(&s, 2)], &old).unwrap();
    wait(&s, 2);
    let copies = fake.calls(cu_name!(cuMemcpyHtoD)) + fake.calls(cu_name!(cuMemcpyDtoH));
    let released = |e: cuhal_command::Error| matches!(e, cuhal_command::Error::MemoryReleased);
    assert!(released(old.write(0, &[2; 256]).unwrap_err()));
    let mut out = [0u8; 256];
    assert!(released(old.read(0, &mut out).unwrap_err()));
    assert_eq!(
        fake.calls(cu_name!(cuMemcpyHtoD)) + fake.calls(cu_name!(cuMemcpyDtoH)),
        copies,
        "a copy through the released buffer reached the driver"
    );
}

/// Lending an allocation's memory (`ExportedBuffer`) holds it: a `dealloca` meanwhile leaves the
/// free to the borrower's drop, and a released allocation cannot be lent.
#[test]
fn an_exported_allocation_outlives_its_dealloca() {
    let (fake, _driver, device) = open("export-dealloca", queues(1));
    let q = device.queue(0);
    let s = device.create_semaphore(0);
    let buffer = q.alloca(&[], &[(&s, 1)], 256).unwrap();
    wait(&s, 1);
    let allocated = live(&fake).device_allocations;
    let lent = cuhal::ExportedBuffer::new(&buffer).unwrap();
    let lent_again = lent.clone();
    q.dealloca(&[], &[(&s, 2)], &buffer).unwrap();
    wait(&s, 2);
    settle(q);
    assert_eq!(
        live(&fake).device_allocations,
        allocated,
        "freed while lent"
    );
    drop(lent);
    assert_eq!(
        live(&fake).device_allocations,
        allocated,
        "freed while a clone is lent"
    );
    drop(lent_again);
    assert_eq!(
        live(&fake).device_allocations,
        allocated - 1,
        "not freed once given back"
    );
    assert!(matches!(
        cuhal::ExportedBuffer::new(&buffer).unwrap_err(),
        Error::Deallocated { .. }
    ));
}

/// A use of an allocation taken by an operation's checks holds its free back even on the
/// dealloca's own stream: from another thread, the dealloca may be submitted (and issued)
/// between that operation's checks and its submission, ahead of it. A long binding table widens
/// that window; before, the dealloca freed at once and the execute ran on freed memory.
#[test]
fn a_dealloca_racing_an_execute_on_the_same_queue_waits_for_it() {
    const SLOTS: u32 = 200_000;
    let (_fake, _driver, device) = open("dealloca-race", queues(1));
    let q = device.queue(0);
    // A fresh allocation, and a command buffer that fills it and slot 0.
    let filling_an_allocation = || {
        let s = device.create_semaphore(0);
        let buffer = q.alloca(&[], &[(&s, 1)], 256).unwrap();
        wait(&s, 1);
        let mut cb = q.create_command_buffer_with_bindings(SLOTS).unwrap();
        cb.fill(&buffer.whole(), FillPattern::U8(7)).unwrap();
        let slot = cuhal::BufferRange::slot(0, 0, 64).unwrap();
        cb.fill(&slot, FillPattern::U8(1)).unwrap();
        let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
        (buffer, cb)
    };
    let filler = device.create_buffer(64).unwrap();
    let table: Vec<cuhal::BufferRange> = (0..SLOTS).map(|_| filler.whole()).collect();
    let (_, cb) = filling_an_allocation();
    let s = device.create_semaphore(0);
    let started = std::time::Instant::now();
    q.execute_with_bindings(&[], &[(&s, 1)], &[(&cb, &table)])
        .unwrap();
    let checks = started.elapsed();
    wait(&s, 1);
    for round in 0..3u32 {
        let (done, freed) = (device.create_semaphore(0), device.create_semaphore(0));
        let (buffer, cb) = filling_an_allocation();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                q.execute_with_bindings(&[], &[(&done, 1)], &[(&cb, &table)])
                    .unwrap();
            });
            scope.spawn(|| {
                // Into the execute's checks, after it took its use of the buffer.
                std::thread::sleep(checks / 3);
                q.dealloca(&[], &[(&freed, 1)], &buffer).unwrap();
            });
        });
        done.wait(1, TIMEOUT)
            .unwrap_or_else(|e| panic!("round {round}: the execute failed: {e}"));
        wait(&freed, 1);
        assert!(q.lost().is_none(), "round {round}: the queue was lost");
    }
}

/// The plain loop, alloca, work on the same queue that uses the buffer, dealloca, again, keeps
/// about one block live: each dealloca issues right behind its work on the same stream, and is
/// ordered after it there, so it frees in stream order rather than waiting for that work to
/// retire (with retirement lagging, a loop of big blocks would run the device out of memory).
#[test]
fn an_alloca_loop_on_one_queue_keeps_one_block_live() {
    let alloca_loop = |tag: &str, len: usize, rounds: usize| -> Result<u64, Error> {
        // (A closure, not inlined: the timing is reset whatever the rounds return.)
        let (fake, _driver, device) = open(tag, queues(1));
        let q = device.queue(0);
        let base = fake.counts().device_allocations;
        // Work takes model time, as on a GPU: retirement lags issue.
        fake.set_timing(
            std::time::Duration::from_millis(100),
            std::time::Duration::ZERO,
        );
        let mut peak = 0;
        let result = (|| {
            for _ in 0..rounds {
                let buffer = q.alloca(&[], &[], len)?;
                peak = peak.max(fake.counts().device_allocations - base);
                let mut cb = q.create_command_buffer()?;
                cb.fill(&buffer.range(0, 256).unwrap(), FillPattern::U8(1))?;
                let cb: Arc<dyn CommandBuffer> = cb.end()?;
                q.execute(&[], &[], &[&cb])?;
                q.dealloca(&[], &[], &buffer)?;
            }
            Ok(peak)
        })();
        fake.set_timing(std::time::Duration::ZERO, std::time::Duration::ZERO);
        settle(q);
        result
    };
    let peak = alloca_loop("alloca-loop", 1 << 20, 8).unwrap();
    assert!(peak <= 2, "{peak} allocations live at once over 8 rounds");
}
