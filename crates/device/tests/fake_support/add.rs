//! The fake driver's `add` kernel ([`ADD_KERNEL`]: `dst[i] = src[i] + k` for `i < n`, run on the
//! host), as the binding-slot tests load and chain it.

use cuhal::{BufferRange, CommandRecorder, Device, Dispatch, FillPattern, Function, KernelArgs};
use cuhal_fake_driver::module::ADD_KERNEL;

/// The `add` kernel, loaded from a module that declares it with its parameters
/// `(u64 dst, u64 src, u32 k, u32 n)`.
pub fn add_kernel(device: &Device) -> Function {
    let ptx = format!(
        ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry {ADD_KERNEL}(.param .u64 dst, .param .u64 src, .param .u32 k, .param .u32 n) {{ ret; }}\n"
    );
    device.load_ptx(&ptx).unwrap().function(ADD_KERNEL).unwrap()
}

/// Records, over binding slots, a fill of slot 4's first 64 bytes with `fill`, then a chain of
/// `count` one-block `add`s of 1 over `n` words with a barrier after each: slot 2 = slot 0 + 1,
/// then 3 = 2 + 1 and 2 = 3 + 1 in turn, then slot 1 = the last + 1, so slot 1 = slot 0 +
/// `count`. Slot 0 is read from byte `input_offset` of its binding.
pub fn record_add_chain(
    cb: &mut dyn CommandRecorder,
    add: &Function,
    fill: u32,
    count: u32,
    n: usize,
    input_offset: u64,
) {
    cb.fill(
        &BufferRange::slot(4, 0, 64).unwrap(),
        FillPattern::U32(fill),
    )
    .unwrap();
    let mut from = 0;
    for i in 0..count {
        let to = if i + 1 == count { 1 } else { 2 + i % 2 };
        let args = KernelArgs::new()
            .with_binding(to, 0)
            .with_binding(from, if from == 0 { input_offset } else { 0 })
            .with(1u32)
            .with(n as u32);
        cb.dispatch(&Dispatch::new(add, [1, 1, 1], [n as u32, 1, 1], &args))
            .unwrap();
        cb.barrier().unwrap();
        from = to;
    }
}
