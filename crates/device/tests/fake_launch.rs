//! Launch attributes on the fake driver, in both command buffer modes: each attribute reaches
//! the driver the way its kind passes it (`cuLaunchKernelEx` at a deferred replay, kernel node
//! attributes and a programmatic edge in a graph), every attribute the device or driver cannot
//! honour is a typed error at recording, and the queue stays healthy after one.

mod fake_support;

use cuhal_sys::cu_name;
use std::sync::Arc;

use cuhal::{
    CommandBuffer, CommandBufferMode, CommandEncoder, DeviceOptions, Dispatch, FillPattern,
    KernelArgs, LaunchAttributes,
};
use cuhal_command::Error as CommandError;
use cuhal_fake_driver::harness::FakeDriver;
use fake_support::*;

/// `clustered` is compiled for clusters of two blocks; the others take any launch.
const LAUNCH_PTX: &str = "\
.version 8.0
.target sm_90
.address_size 64
.visible .entry plain(.param .u64 data) { ret; }
.visible .entry clustered(.param .u64 data) .reqnctapercluster 2, 1, 1 { ret; }
.visible .entry waits(.param .u64 data) { griddepcontrol.wait; ret; }
";

fn modes(test: fn(CommandBufferMode)) {
    test(CommandBufferMode::Graph);
    test(CommandBufferMode::Deferred);
}

fn tag(name: &str, mode: CommandBufferMode) -> String {
    format!("{name}-{mode:?}").to_lowercase()
}

struct Setup {
    fake: FakeDriver,
    _driver: cuhal::Driver,
    device: cuhal::Device,
    module: cuhal::Executable,
    args: KernelArgs,
    _data: Arc<cuhal::Buffer>,
}

fn setup(name: &str, mode: CommandBufferMode, prepare: impl FnOnce(&FakeDriver)) -> Setup {
    let (fake, driver) = load_with(&tag(name, mode), prepare);
    let options = DeviceOptions {
        command_buffer_mode: mode,
        ..queues(1)
    };
    let device = driver.open(0, options).unwrap();
    let module = device.load_ptx(LAUNCH_PTX).unwrap();
    let data = device.create_buffer(256).unwrap();
    let args = KernelArgs::new().with_range(&data.whole());
    Setup {
        fake,
        _driver: driver,
        device,
        module,
        args,
        _data: data,
    }
}

impl Setup {
    /// Ends `cb`, submits it and waits: the queue works.
    fn run(&self, mut cb: Box<dyn CommandEncoder>) {
        let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
        let done = self.device.create_semaphore(0);
        self.device
            .queue(0)
            .execute(&[], &[(&done, 1)], &[&cb])
            .unwrap();
        done.wait(1, TIMEOUT).unwrap();
    }

    fn cb(&self) -> Box<dyn CommandEncoder> {
        self.device.queue(0).create_command_buffer().unwrap()
    }
}

#[test]
fn clusters_reach_the_driver_and_bad_shapes_are_refused_at_recording() {
    modes(clusters);
}

fn clusters(mode: CommandBufferMode) {
    let s = setup("clusters", mode, |_| {});
    let plain = s.module.function("plain").unwrap();
    let clustered = s.module.function("clustered").unwrap();
    let mut cb = s.cb();
    cb.dispatch(&Dispatch::new(&plain, [8, 2, 1], [64, 1, 1], &s.args).with_cluster([4, 2, 1]))
        .unwrap();
    // A compiled-in cluster needs no attribute; repeating it exactly is allowed.
    cb.dispatch(&Dispatch::new(&clustered, [6, 1, 1], [32, 1, 1], &s.args))
        .unwrap();
    cb.dispatch(&Dispatch::new(&clustered, [2, 1, 1], [32, 1, 1], &s.args).with_cluster([2, 1, 1]))
        .unwrap();

    let refused = |cb: &mut Box<dyn CommandEncoder>, d: Dispatch<'_>| cb.dispatch(&d).unwrap_err();
    let e = refused(
        &mut cb,
        Dispatch::new(&plain, [6, 1, 1], [32, 1, 1], &s.args).with_cluster([4, 1, 1]),
    );
    assert!(
        matches!(
            &e,
            CommandError::BadCluster {
                cluster: [4, 1, 1],
                grid: [6, 1, 1],
                ..
            }
        ),
        "{e}"
    );
    let e = refused(
        &mut cb,
        Dispatch::new(&plain, [16, 1, 1], [32, 1, 1], &s.args).with_cluster([16, 1, 1]),
    );
    assert_eq!(
        e,
        CommandError::ClusterTooLarge {
            function: "plain".into(),
            cluster: [16, 1, 1],
            blocks: 16,
            max: 8
        }
    );
    let e = refused(
        &mut cb,
        Dispatch::new(&clustered, [4, 1, 1], [32, 1, 1], &s.args).with_cluster([4, 1, 1]),
    );
    assert!(e.to_string().contains(".reqnctapercluster"), "{e}");
    let e = refused(
        &mut cb,
        Dispatch::new(&clustered, [3, 1, 1], [32, 1, 1], &s.args),
    );
    assert!(
        matches!(
            &e,
            CommandError::BadCluster {
                cluster: [2, 1, 1],
                grid: [3, 1, 1],
                ..
            }
        ),
        "the compiled-in cluster must tile the grid too: {e}"
    );
    let before = s.fake.launches("plain") + s.fake.launches("clustered");
    s.run(cb);
    assert_eq!(
        s.fake.launches("plain") + s.fake.launches("clustered") - before,
        3
    );
    match mode {
        // Only the explicit cluster is an attribute.
        CommandBufferMode::Graph => {
            assert_eq!(s.fake.calls(cu_name!(cuGraphKernelNodeSetAttribute)), 2)
        }
        CommandBufferMode::Deferred => {
            assert_eq!(s.fake.calls(cu_name!(cuLaunchKernelEx)), 2);
            assert_eq!(s.fake.calls(cu_name!(cuLaunchKernel)), 1);
        }
    }
}

#[test]
fn cooperative_grids_are_checked_against_occupancy() {
    modes(cooperative);
}

fn cooperative(mode: CommandBufferMode) {
    let s = setup("cooperative", mode, |_| {});
    let plain = s.module.function("plain").unwrap();
    let mut cb = s.cb();
    // The fake holds 2048 threads per multiprocessor and has 132: 8 blocks of 256 each.
    let max = 8 * 132;
    cb.dispatch(&Dispatch::new(&plain, [max, 1, 1], [256, 1, 1], &s.args).cooperative())
        .unwrap();
    let e = cb
        .dispatch(&Dispatch::new(&plain, [max + 1, 1, 1], [256, 1, 1], &s.args).cooperative())
        .unwrap_err();
    assert_eq!(
        e,
        CommandError::CooperativeGridTooLarge {
            function: "plain".into(),
            blocks: u64::from(max) + 1,
            max: u64::from(max)
        }
    );
    // Without the attribute the same grid is fine.
    cb.dispatch(&Dispatch::new(
        &plain,
        [max + 1, 1, 1],
        [256, 1, 1],
        &s.args,
    ))
    .unwrap();
    s.run(cb);
    assert_eq!(s.fake.launches("plain"), 2);
}

#[test]
fn programmatic_dispatches_need_one_dispatch_before_a_barrier() {
    modes(programmatic);
}

fn programmatic(mode: CommandBufferMode) {
    let s = setup("programmatic", mode, |_| {});
    let waits = s.module.function("waits").unwrap();
    let d = Dispatch::new(&waits, [4, 1, 1], [32, 1, 1], &s.args);
    let mut cb = s.cb();
    let first = cb.dispatch(&d.programmatic()).unwrap_err();
    assert!(
        matches!(first, CommandError::NoProgrammaticPredecessor { .. }),
        "{first}"
    );
    cb.dispatch(&d).unwrap();
    let e = cb.dispatch(&d.programmatic()).unwrap_err();
    assert!(
        e.to_string().contains("first command after a barrier"),
        "{e}"
    );
    cb.barrier().unwrap();
    // A chain: each depends programmatically on the one before.
    for _ in 0..3 {
        cb.dispatch(&d.programmatic()).unwrap();
        cb.barrier().unwrap();
    }
    // Two dispatches before the barrier: no single predecessor.
    cb.dispatch(&d).unwrap();
    cb.barrier().unwrap();
    cb.fill(&s._data.range(0, 4).unwrap(), FillPattern::U32(0))
        .unwrap();
    cb.barrier().unwrap();
    let e = cb.dispatch(&d.programmatic()).unwrap_err();
    assert!(e.to_string().contains("exactly one dispatch"), "{e}");
    s.run(cb);
    assert_eq!(s.fake.launches("waits"), 5);
    match mode {
        CommandBufferMode::Graph => {
            assert_eq!(s.fake.counts().programmatic_edges, 3);
            assert_eq!(s.fake.calls(cu_name!(cuGraphKernelNodeSetAttribute)), 0);
        }
        CommandBufferMode::Deferred => assert_eq!(s.fake.calls(cu_name!(cuLaunchKernelEx)), 3),
    }
}

#[test]
fn priorities_outside_the_range_are_refused() {
    modes(priority);
}

fn priority(mode: CommandBufferMode) {
    let s = setup("priority", mode, |_| {});
    let plain = s.module.function("plain").unwrap();
    let d = Dispatch::new(&plain, [1, 1, 1], [32, 1, 1], &s.args);
    let mut cb = s.cb();
    cb.dispatch(&d.with_priority(-5)).unwrap();
    cb.dispatch(&d.with_priority(0)).unwrap();
    for bad in [1, -6] {
        assert_eq!(
            cb.dispatch(&d.with_priority(bad)).unwrap_err(),
            CommandError::BadPriority {
                priority: bad,
                least: 0,
                greatest: -5
            }
        );
    }
    let all = LaunchAttributes {
        cluster: Some([1, 1, 1]),
        cooperative: true,
        programmatic: false,
        priority: Some(-1),
    };
    cb.dispatch(&d.with_attributes(all)).unwrap();
    s.run(cb);
    assert_eq!(s.fake.launches("plain"), 3);
}

#[test]
fn attributes_on_a_driver_without_the_entry_points_are_refused_at_recording() {
    let s = setup("old-driver-deferred", CommandBufferMode::Deferred, |fake| {
        fake.hide(cu_name!(cuLaunchKernelEx))
    });
    let plain = s.module.function("plain").unwrap();
    let d = Dispatch::new(&plain, [2, 1, 1], [32, 1, 1], &s.args);
    let mut cb = s.cb();
    let e = cb.dispatch(&d.with_cluster([2, 1, 1])).unwrap_err();
    assert!(
        matches!(
            e,
            CommandError::UnsupportedAttribute {
                attribute: "launch attributes",
                ..
            }
        ),
        "{e}"
    );
    cb.dispatch(&d).unwrap();
    s.run(cb);
    assert_eq!(s.fake.launches("plain"), 1, "the queue still runs");

    let s = setup("old-driver-graph", CommandBufferMode::Graph, |fake| {
        fake.set_driver_version(12020)
    });
    // A 12.2 driver cannot report parameters (cuFuncGetParamInfo is 12.4): state them.
    let plain = s
        .module
        .function("plain")
        .unwrap()
        .with_parameter_sizes(&[8])
        .unwrap();
    let d = Dispatch::new(&plain, [2, 1, 1], [32, 1, 1], &s.args);
    let mut cb = s.cb();
    cb.dispatch(&d).unwrap();
    cb.barrier().unwrap();
    let e = cb.dispatch(&d.programmatic()).unwrap_err();
    assert!(
        matches!(
            e,
            CommandError::UnsupportedAttribute {
                attribute: "programmatic",
                ..
            }
        ),
        "{e}"
    );
    s.run(cb);
}

#[test]
fn large_dynamic_shared_memory_raises_the_limit_up_to_the_device_maximum() {
    modes(shared_memory);
}

fn shared_memory(mode: CommandBufferMode) {
    let s = setup("shared", mode, |_| {});
    let plain = s.module.function("plain").unwrap();
    assert_eq!(plain.max_dynamic_shared_memory(), 48 * 1024);
    assert_eq!(plain.max_dynamic_shared_memory_optin(), 227 * 1024);
    let d = Dispatch::new(&plain, [1, 1, 1], [32, 1, 1], &s.args);
    let mut cb = s.cb();
    cb.dispatch(&d.with_shared_memory(100 * 1024)).unwrap();
    assert_eq!(plain.max_dynamic_shared_memory(), 100 * 1024);
    cb.dispatch(&d.with_shared_memory(64 * 1024)).unwrap();
    assert_eq!(
        plain.max_dynamic_shared_memory(),
        100 * 1024,
        "never lowered"
    );
    assert_eq!(s.fake.calls(cu_name!(cuFuncSetAttribute)), 1);
    assert_eq!(
        cb.dispatch(&d.with_shared_memory(227 * 1024 + 1))
            .unwrap_err(),
        CommandError::SharedMemoryTooLarge {
            function: "plain".into(),
            requested: 227 * 1024 + 1,
            max: 227 * 1024
        }
    );
    cb.dispatch(&d.with_shared_memory(227 * 1024)).unwrap();
    s.run(cb);
    assert_eq!(s.fake.launches("plain"), 3);
}
