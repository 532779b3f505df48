//! Command buffers on the fake driver, in both modes: fills, updates and copies land where they
//! should, dispatches are launched (counted by the fake, which cannot run kernels), and a
//! finished command buffer runs again on every submission.

mod fake_support;

use cuhal_sys::cu_name;
use std::sync::Arc;

use cuhal::{
    CommandBuffer, CommandBufferMode, DeviceOptions, Dispatch, Error, FillPattern, KernelArgs,
};
use fake_support::*;

fn graph_and_deferred(test: fn(CommandBufferMode)) {
    test(CommandBufferMode::Graph);
    test(CommandBufferMode::Deferred);
}

#[test]
fn command_buffers_fill_update_copy_and_dispatch() {
    graph_and_deferred(execute_runs_every_command);
}

fn execute_runs_every_command(mode: CommandBufferMode) {
    let options = DeviceOptions {
        command_buffer_mode: mode,
        ..queues(1)
    };
    let (fake, _driver, device) = open("execute", options);
    let q = device.queue(0);
    let mut rng = Rng::new();
    const LEN: usize = 1024;
    let (a, b) = (
        device.create_buffer(LEN).unwrap(),
        device.create_buffer(LEN).unwrap(),
    );
    let module = device.load_ptx(PTX).unwrap();
    let (scale, add_one) = (
        module.function("scale").unwrap(),
        module.function("add_one").unwrap(),
    );
    assert_eq!(scale.attributes().max_threads_per_block, 1024);

    let update = rng.bytes(200);
    let fill32 = rng.next_u64() as u32;
    let fill16 = rng.next_u64() as u16;
    let fill8 = rng.next_u64() as u8;
    let mut cb = q.create_command_buffer().unwrap();
    cb.fill(&a.range(0, 512).unwrap(), FillPattern::U32(fill32))
        .unwrap();
    cb.fill(&a.range(512, 256).unwrap(), FillPattern::U16(fill16))
        .unwrap();
    cb.update(&a.range(768, 200).unwrap(), &update).unwrap();
    cb.fill(&a.range(968, 56).unwrap(), FillPattern::U8(fill8))
        .unwrap();
    let args = KernelArgs::new()
        .with_range(&a.whole())
        .with(2u32)
        .with(256u32);
    cb.dispatch(&Dispatch::new(&scale, [4, 1, 1], [64, 1, 1], &args))
        .unwrap();
    cb.dispatch(&Dispatch::new(&scale, [1, 1, 1], [256, 1, 1], &args))
        .unwrap();
    let add_args = KernelArgs::new().with_range(&a.whole()).with(256u32);
    cb.dispatch(&Dispatch::new(&add_one, [2, 2, 1], [32, 4, 1], &add_args))
        .unwrap();
    // After the barrier the copy sees every earlier write.
    cb.barrier().unwrap();
    cb.copy(&a.whole(), &b.whole()).unwrap();
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();

    let mut expected = vec![0u8; LEN];
    for (i, byte) in expected[..512].iter_mut().enumerate() {
        *byte = fill32.to_ne_bytes()[i % 4];
    }
    for (i, byte) in expected[512..768].iter_mut().enumerate() {
        *byte = fill16.to_ne_bytes()[i % 2];
    }
    expected[768..968].copy_from_slice(&update);
    expected[968..].fill(fill8);

    for round in 1..=3u64 {
        poison(&device, q, &a.whole());
        poison(&device, q, &b.whole());
        let done = device.create_semaphore(0);
        q.execute(&[], &[(&done, 1)], &[&cb]).unwrap();
        wait(&done, 1);
        assert_eq!(
            read(&device, q, &a.whole()),
            expected,
            "{mode:?} round {round}: A"
        );
        assert_eq!(
            read(&device, q, &b.whole()),
            expected,
            "{mode:?} round {round}: B"
        );
        assert_eq!(fake.launches("scale"), 2 * round, "{mode:?}");
        assert_eq!(fake.launches("add_one"), round, "{mode:?}");
    }
    let (graph_launches, kernel_launches) = (
        fake.calls(cu_name!(cuGraphLaunch)),
        fake.calls(cu_name!(cuLaunchKernel)),
    );
    match mode {
        CommandBufferMode::Graph => assert!(graph_launches == 3 && kernel_launches == 0),
        CommandBufferMode::Deferred => assert!(graph_launches == 0 && kernel_launches == 9),
    }
}

#[test]
fn several_command_buffers_run_in_submission_order() {
    graph_and_deferred(|mode| {
        let options = DeviceOptions {
            command_buffer_mode: mode,
            ..queues(1)
        };
        let (_fake, _driver, device) = open("order", options);
        let q = device.queue(0);
        let a = device.create_buffer(64).unwrap();
        let record = |value: u32| {
            let mut cb = q.create_command_buffer().unwrap();
            cb.fill(&a.whole(), FillPattern::U32(value)).unwrap();
            cb.end().unwrap()
        };
        let (first, second, third) = (record(1), record(2), record(3));
        let done = device.create_semaphore(0);
        q.execute(&[], &[(&done, 1)], &[&first, &second, &third, &second])
            .unwrap();
        wait(&done, 1);
        let words: Vec<u8> = 2u32.to_ne_bytes().repeat(16);
        assert_eq!(
            read(&device, q, &a.whole()),
            words,
            "{mode:?}: the last one wins"
        );
    });
}

#[test]
fn a_bad_module_reports_the_jit_log_and_unknown_kernels_are_errors() {
    let (_fake, _driver, device) = open("module", queues(1));
    let bad = format!("{PTX}\n    cuhal_not_an_instruction %r1;\n");
    match device.load_ptx(&bad) {
        Err(Error::Command(cuhal_command::Error::ModuleLoad { source, log })) => {
            assert!(log.contains("cuhal_not_an_instruction"), "{log}");
            assert_eq!(
                source.result(),
                Some(cuhal_sys::CUresult::ERROR_INVALID_PTX)
            );
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    let module = device.load_ptx(PTX).unwrap();
    assert!(module.info_log().contains("scale"), "{}", module.info_log());
    match module.function("missing") {
        Err(cuhal_command::Error::UnknownFunction { name, source }) => {
            assert_eq!(name, "missing");
            assert_eq!(source.result(), Some(cuhal_sys::CUresult::ERROR_NOT_FOUND));
        }
        other => panic!("expected an unknown function, got {other:?}"),
    }
    // A block above the kernel's 1024 threads is refused when recorded.
    let scale = module.function("scale").unwrap();
    let args = KernelArgs::new();
    let mut cb = device.queue(0).create_command_buffer().unwrap();
    assert!(
        cb.dispatch(&Dispatch::new(&scale, [1, 1, 1], [1024, 2, 1], &args))
            .is_err()
    );
}
