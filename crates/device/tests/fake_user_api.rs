//! What a user reaches for through `cuhal` alone, on the fake driver: a compiled image loaded
//! with `Device::load_cubin`, command buffers of either kind created per buffer on one queue,
//! and typed (and null) pointer arguments.

mod fake_support;

use std::sync::Arc;

use cuhal::{
    CommandBuffer, CommandBufferKind, CommandBufferMode, DevicePtr, Dispatch, Error, FillPattern,
    KernelArgs,
};
use cuhal_sys::cu_name;
use fake_support::*;

#[test]
fn load_cubin_takes_an_image_and_refuses_a_truncated_one() {
    let (_fake, _driver, device) = open("user-cubin", queues(1));
    // The driver takes NUL-terminated PTX through the same entry as a cubin.
    let image = format!("{PTX}\0");
    let module = device.load_cubin(image.as_bytes()).unwrap();
    assert!(module.function("add_one").is_ok());
    // A cubin's ELF magic with nothing behind it: the headers say more than the slice holds.
    let err = device.load_cubin(b"\x7fELF\x02\x01").unwrap_err();
    assert!(
        matches!(&err, Error::Command(cuhal_command::Error::BadImage { .. })),
        "{err:?}"
    );
    // PTX without its terminating NUL would be read past its end: refused too.
    assert!(device.load_cubin(PTX.as_bytes()).is_err());
    // The device is still healthy.
    assert!(device.create_buffer(64).is_ok());
}

/// On a device whose default is graphs, each kind is chosen per command buffer, both run, and
/// each reaches the driver its own way (a graph launch, or the kernel launched at replay).
#[test]
fn command_buffer_kind_is_chosen_per_buffer() {
    let (fake, _driver, device) = open("user-kinds", queues(1));
    let q = device.queue(0);
    let module = device.load_ptx(PTX).unwrap();
    let add_one = module.function("add_one").unwrap();
    let data = device.create_buffer(256).unwrap();
    let mut buffers = Vec::new();
    for (i, mode) in [CommandBufferMode::Graph, CommandBufferMode::Deferred]
        .into_iter()
        .enumerate()
    {
        let mut cb = q.create_command_buffer_as(mode, 0).unwrap();
        let expected_kind = match mode {
            CommandBufferMode::Graph => CommandBufferKind::Graph,
            CommandBufferMode::Deferred => CommandBufferKind::Deferred,
        };
        assert_eq!(cb.kind(), expected_kind);
        cb.fill(&data.whole(), FillPattern::U8(i as u8 + 1))
            .unwrap();
        let args = KernelArgs::new().with_range(&data.whole()).with(64u32);
        cb.dispatch(&Dispatch::new(&add_one, [1, 1, 1], [64, 1, 1], &args))
            .unwrap();
        buffers.push(cb.end().unwrap());
    }
    let (graphs, kernels) = (
        fake.calls(cu_name!(cuGraphLaunch)),
        fake.calls(cu_name!(cuLaunchKernel)),
    );
    for (i, cb) in buffers.iter().enumerate() {
        poison(&device, q, &data.whole());
        let done = device.create_semaphore(0);
        q.execute(&[], &[(&done, 1)], &[cb]).unwrap();
        wait(&done, 1);
        assert_eq!(read(&device, q, &data.whole()), vec![i as u8 + 1; 256]);
    }
    assert_eq!(fake.launches("add_one"), 2);
    assert_eq!(
        fake.calls(cu_name!(cuGraphLaunch)) - graphs,
        1,
        "the graph buffer"
    );
    assert_eq!(
        fake.calls(cu_name!(cuLaunchKernel)) - kernels,
        1,
        "the deferred buffer's replay"
    );
    // The queue's default is unchanged.
    assert_eq!(
        q.create_command_buffer().unwrap().kind(),
        CommandBufferKind::Graph
    );
}

#[test]
fn typed_and_null_pointer_arguments() {
    let (fake, _driver, device) = open("user-pointers", queues(1));
    let q = device.queue(0);
    let module = device.load_ptx(PTX).unwrap();
    let add_one = module.function("add_one").unwrap();
    let data = device.create_buffer(256).unwrap();

    let whole = data.whole();
    let ptr: DevicePtr<u32> = whole.ptr().expect("an allocation is aligned for u32");
    assert_eq!(ptr.address(), whole.device_ptr());
    assert!(!ptr.is_null());
    // Misaligned for a u32, or not a whole number of them: no typed pointer.
    assert_eq!(data.range(2, 8).unwrap().ptr::<u32>(), None);
    assert_eq!(data.range(0, 6).unwrap().ptr::<u32>(), None);
    assert!(data.range(2, 6).unwrap().ptr::<u16>().is_some());

    // Both are 8-byte pointer parameters: the launch check accepts them for `.param .u64`.
    let mut cb = q.create_command_buffer().unwrap();
    let typed = KernelArgs::new().with(ptr).with(64u32);
    cb.dispatch(&Dispatch::new(&add_one, [1, 1, 1], [64, 1, 1], &typed))
        .unwrap();
    let mut null = KernelArgs::new();
    null.push_null::<u32>().push(64u32);
    assert_eq!(&null.bytes()[..8], &[0u8; 8]);
    assert_eq!(null.bytes().len(), typed.bytes().len());
    cb.dispatch(&Dispatch::new(&add_one, [1, 1, 1], [64, 1, 1], &null))
        .unwrap();
    // A pointer where the kernel takes a 4-byte value is refused at recording.
    let wrong = KernelArgs::new().with(ptr).with(ptr);
    assert!(
        cb.dispatch(&Dispatch::new(&add_one, [1, 1, 1], [64, 1, 1], &wrong))
            .is_err()
    );
    let cb: Arc<dyn CommandBuffer> = cb.end().unwrap();
    let done = device.create_semaphore(0);
    q.execute(&[], &[(&done, 1)], &[&cb]).unwrap();
    wait(&done, 1);
    assert_eq!(fake.launches("add_one"), 2);
}
