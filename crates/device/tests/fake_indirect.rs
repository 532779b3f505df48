//! Indirect dispatch on the fake driver, in both command buffer modes. The fake runs cuhal's
//! helper kernel as the GPU would (reads the counts, updates the device-updatable dispatch node
//! of the executable graph), so these check the recorded structure and the outcomes: a count
//! runs the dispatch, a zero count runs nothing, an out-of-range count runs nothing and fails
//! its submission (the queue stays healthy), and a resubmission reads the counts again.

mod fake_support;

use cuhal_sys::cu_name;
use std::sync::Arc;

use cuhal::{
    Buffer, CommandBuffer, CommandBufferMode, Device, DeviceOptions, Dispatch, Driver, Function,
    KernelArgs,
};
use cuhal_command::Error as CommandError;
use cuhal_fake_driver::harness::FakeDriver;
use fake_support::helpers::{INDIRECT_HELPER_ONLY, install_helpers};
use fake_support::*;

const PTX: &str = "\
.version 8.0
.target sm_90
.address_size 64
.visible .entry work(.param .u64 data) { ret; }
";

fn modes(test: fn(CommandBufferMode)) {
    test(CommandBufferMode::Graph);
    test(CommandBufferMode::Deferred);
}

fn words(counts: [u32; 3]) -> Vec<u8> {
    counts.iter().flat_map(|c| c.to_ne_bytes()).collect()
}

/// A fake device in `mode` with the indirect helper, the `work` kernel, a 64-byte buffer it
/// writes and a buffer of `count_bytes` for its counts (after the fake and the driver).
fn scene(
    tag: &str,
    mode: CommandBufferMode,
    count_bytes: usize,
) -> (
    FakeDriver,
    Driver,
    Device,
    Function,
    Arc<Buffer>,
    Arc<Buffer>,
) {
    install_helpers("indirect", INDIRECT_HELPER_ONLY);
    let (fake, driver, device) = open(
        &format!("{tag}-{mode:?}").to_lowercase(),
        DeviceOptions {
            command_buffer_mode: mode,
            ..queues(1)
        },
    );
    let work = device.load_ptx(PTX).unwrap().function("work").unwrap();
    let data = device.create_buffer(64).unwrap();
    let counts = device.create_buffer(count_bytes).unwrap();
    (fake, driver, device, work, data, counts)
}

#[test]
fn counts_run_the_dispatch_zero_runs_nothing_and_out_of_range_fails_the_submission() {
    modes(outcomes);
}

fn outcomes(mode: CommandBufferMode) {
    let (fake, _driver, device, work, data, counts) = scene("indirect", mode, 12);
    let args = KernelArgs::new().with_range(&data.whole());
    let mut cb = device.queue(0).create_command_buffer().unwrap();
    cb.dispatch_indirect(
        &Dispatch::new(&work, [1, 1, 1], [32, 1, 1], &args),
        &counts.whole(),
    )
    .unwrap();
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    let done = device.create_semaphore(0);
    let mut value = 0;
    let mut submit = |counts_now: [u32; 3]| {
        counts.write(0, &words(counts_now)).unwrap();
        value += 1;
        device
            .queue(0)
            .execute(&[], &[(&done, value)], &[&cb])
            .unwrap();
        done.wait(value, TIMEOUT).map_err(|e| e.to_string())
    };

    submit([3, 2, 1]).unwrap();
    assert_eq!(fake.launches("work"), 1);
    assert_eq!(fake.launches("cuhal_indirect_apply"), 1);
    submit([0, 5, 1]).unwrap();
    assert_eq!(fake.launches("work"), 1, "a zero count runs nothing");
    assert_eq!(fake.launches("cuhal_indirect_apply"), 2);
    let failed = submit([1, 70_000, 1]).unwrap_err();
    assert!(
        failed.contains("indirect dispatch 0") && failed.contains("[1, 70000, 1]"),
        "{failed}"
    );
    assert_eq!(
        fake.launches("work"),
        1,
        "an out-of-range count runs nothing"
    );

    // The queue is healthy and the counts are read again at every submission.
    let done = device.create_semaphore(0);
    counts.write(0, &words([7, 1, 1])).unwrap();
    device.queue(0).execute(&[], &[(&done, 1)], &[&cb]).unwrap();
    done.wait(1, TIMEOUT).unwrap();
    assert_eq!(fake.launches("work"), 2);
    if mode == CommandBufferMode::Graph {
        assert!(
            fake.calls(cu_name!(cuGraphUpload)) >= 1,
            "uploaded before its first launch"
        );
    }
}

#[test]
fn clusters_must_tile_the_count_and_bad_recordings_are_refused() {
    modes(refusals);
}

fn refusals(mode: CommandBufferMode) {
    let (fake, _driver, device, work, data, counts) = scene("indirect-refusals", mode, 16);
    let args = KernelArgs::new().with_range(&data.whole());
    let d = Dispatch::new(&work, [1, 1, 1], [32, 1, 1], &args);
    let mut cb = device.queue(0).create_command_buffer().unwrap();
    assert!(matches!(
        cb.dispatch_indirect(&d, &counts.range(0, 8).unwrap()),
        Err(CommandError::IndirectCounts { .. })
    ));
    assert!(matches!(
        cb.dispatch_indirect(&d, &counts.range(2, 12).unwrap()),
        Err(CommandError::Misaligned { .. })
    ));
    assert!(matches!(
        cb.dispatch_indirect(&d.cooperative(), &counts.range(0, 12).unwrap()),
        Err(CommandError::UnsupportedAttribute {
            attribute: "cooperative",
            ..
        })
    ));
    cb.dispatch_indirect(&d.with_cluster([4, 1, 1]), &counts.range(0, 12).unwrap())
        .unwrap();
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    counts.write(0, &words([6, 1, 1])).unwrap();
    let done = device.create_semaphore(0);
    device.queue(0).execute(&[], &[(&done, 1)], &[&cb]).unwrap();
    let e = done.wait(1, TIMEOUT).unwrap_err().to_string();
    assert!(e.contains("[6, 1, 1]") && e.contains("[4, 1, 1]"), "{e}");
    counts.write(0, &words([8, 1, 1])).unwrap();
    let done = device.create_semaphore(0);
    device.queue(0).execute(&[], &[(&done, 1)], &[&cb]).unwrap();
    done.wait(1, TIMEOUT).unwrap();
    assert_eq!(fake.launches("work"), 1);
}

#[test]
fn the_helper_module_is_loaded_once_per_context_and_command_buffers_do_not_unload_it() {
    modes(helper_once);
}

fn helper_once(mode: CommandBufferMode) {
    let (fake, _driver, device, work, data, counts) = scene("indirect-once", mode, 12);
    counts.write(0, &words([1, 1, 1])).unwrap();
    let args = KernelArgs::new().with_range(&data.whole());
    let loads = || fake.calls(cu_name!(cuModuleLoadDataEx));
    let unloads = || fake.calls(cu_name!(cuModuleUnload));
    let record = || {
        let mut cb = device.queue(0).create_command_buffer().unwrap();
        cb.dispatch_indirect(
            &Dispatch::new(&work, [1, 1, 1], [32, 1, 1], &args),
            &counts.whole(),
        )
        .unwrap();
        cb.end().unwrap()
    };
    let before = (loads(), unloads());
    let first = record();
    assert_eq!(
        loads(),
        before.0 + 1,
        "the first indirect dispatch loads the helper"
    );
    let second = record();
    let third = record();
    assert_eq!(loads(), before.0 + 1, "later command buffers reuse it");
    let done = device.create_semaphore(0);
    let batch: Vec<Arc<dyn CommandBuffer>> = vec![second, third];
    let refs: Vec<&Arc<dyn CommandBuffer>> = batch.iter().collect();
    device.queue(0).execute(&[], &[(&done, 1)], &refs).unwrap();
    done.wait(1, TIMEOUT).unwrap();
    settle(device.queue(0));
    drop(refs);
    drop((first, batch));
    assert_eq!(
        unloads(),
        before.1,
        "dropping command buffers unloads nothing"
    );
}

#[test]
fn a_resident_module_lives_as_long_as_its_context() {
    use cuhal_command::Executable;
    use cuhal_sys::PrimaryContext;
    let (fake, driver) = load("indirect-resident");
    let image = b".entry cuhal_indirect_apply(.param .u64 counts) { ret; }\0";
    let context = PrimaryContext::retain(driver.api().clone(), 0).unwrap();
    let loads = || fake.calls(cu_name!(cuModuleLoadDataEx));
    let unloads = || fake.calls(cu_name!(cuModuleUnload));
    let first = Executable::load_cubin_resident(&context, "test.helpers", image).unwrap();
    let second = Executable::load_cubin_resident(&context, "test.helpers", image).unwrap();
    assert_eq!(loads(), 1, "loaded once per context and key");
    assert_eq!(first.raw(), second.raw());
    let function = second.function("cuhal_indirect_apply").unwrap();
    drop((first, second));
    assert_eq!(unloads(), 0, "views leave the module loaded");
    let other = Executable::load_cubin_resident(&context, "test.other", image).unwrap();
    assert_eq!(loads(), 2, "another key is another module");
    drop((other, function));
    assert_eq!(fake.calls(cu_name!(cuDevicePrimaryCtxRelease)), 0);
    drop(context);
    assert_eq!(unloads(), 2, "both unloaded when the context is released");
    assert_eq!(fake.calls(cu_name!(cuDevicePrimaryCtxRelease)), 1);
}
