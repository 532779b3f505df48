//! Helpers for the device conformance suite (`tests/conformance.rs`, `tests/conformance_trap.rs`,
//! `tests/device_alloc.rs`): a [`cuhal::Device`] per test on a primary context kept warm for
//! the whole process, the PTX kernels those tests dispatch, and small recording, waiting and
//! reading helpers.
//!
//! Every test opens its own device, so one test's lost queue, leaked event or pending action
//! cannot leak into the next; the process keeps one extra retain of the primary context, so
//! opening a device costs a few streams and threads, not a context creation.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cuhal::{
    Buffer, BufferRange, CommandBuffer, CommandBufferMode, CommandRecorder, Device, DeviceOptions,
    Dispatch, Driver, Executable, Function, KernelArgs, Queue, Semaphore,
};
use cuhal_sys::PrimaryContext;

use crate::gpu::DEVICE_ENV;

/// How long a test waits for anything before it calls the wait a hang.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Threads per block of the suite's element-wise kernels.
pub const BLOCK: u32 = 256;

/// The loaded driver, shared by the process; panics with the reason when there is none, which
/// is what a GPU test should do on a machine without a usable GPU.
pub fn driver() -> &'static Driver {
    static DRIVER: OnceLock<(Driver, Arc<PrimaryContext>)> = OnceLock::new();
    let (driver, _warm) = DRIVER.get_or_init(|| {
        let driver = Driver::load().unwrap_or_else(|e| panic!("no usable CUDA driver: {e}"));
        // Held for the life of the process: devices opened and dropped by successive tests
        // then share one primary context instead of creating and destroying it each time.
        let warm = PrimaryContext::retain(driver.api().clone(), ordinal())
            .unwrap_or_else(|e| panic!("cannot retain the primary context: {e}"));
        (driver, warm)
    });
    driver
}

/// `CUHAL_TEST_DEVICE`, or 0.
pub fn ordinal() -> i32 {
    match std::env::var(DEVICE_ENV) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{DEVICE_ENV}={text:?} is not a device ordinal")),
        Err(_) => 0,
    }
}

/// Opens the test device with `queues` queues whose command buffers are built in `mode`.
pub fn open(mode: CommandBufferMode, queues: usize) -> Device {
    open_with(DeviceOptions {
        queues,
        command_buffer_mode: mode,
        ..DeviceOptions::default()
    })
}

/// Opens the test device with `options`.
pub fn open_with(options: DeviceOptions) -> Device {
    driver()
        .open(ordinal(), options)
        .unwrap_or_else(|e| panic!("cannot open CUDA device {}: {e}", ordinal()))
}

/// Waits for `semaphore` to reach `value`, panicking with what it saw on a failure or a hang.
pub fn wait(semaphore: &Semaphore, value: u64) {
    if let Err(e) = semaphore.wait(value, TIMEOUT) {
        panic!("waiting for {semaphore:?} to reach {value}: {e}");
    }
}

/// The suite's kernels, loaded on one device.
pub struct Kernels {
    /// The module (kept for its lifetime; the functions also keep it alive).
    pub module: Executable,
    /// `add_u32(dst, src, k, n)`: `dst[i] = src[i] + k` (wrapping).
    pub add: Function,
    /// `spin_fill_u32(ns, ptr, value, n)`: spin `ns` nanoseconds, then `ptr[i] = value`.
    pub spin_fill: Function,
    /// `increment_u32(ptr)`: `ptr[0] += 1`; launch one thread.
    pub increment: Function,
    /// `spin_trap(ns)`: spin `ns` nanoseconds, then execute `trap`.
    pub spin_trap: Function,
}

impl Kernels {
    /// Loads [`DEVICE_KERNELS`] on `device`.
    pub fn load(device: &Device) -> Kernels {
        let module = device
            .load_ptx(DEVICE_KERNELS)
            .unwrap_or_else(|e| panic!("loading the suite's PTX: {e}"));
        let get = |name: &str| {
            module
                .function(name)
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        Kernels {
            add: get("add_u32"),
            spin_fill: get("spin_fill_u32"),
            increment: get("increment_u32"),
            spin_trap: get("spin_trap"),
            module,
        }
    }
}

/// Elements of a buffer of `u32`s.
pub fn words(buffer: &Buffer) -> u32 {
    u32::try_from(buffer.len() / 4).expect("test buffers hold fewer than 2^32 words")
}

fn grid(n: u32) -> [u32; 3] {
    [n.div_ceil(BLOCK).max(1), 1, 1]
}

/// Records `ptr[i] = value` for every `u32` of `target` after a `spin_ns` spin.
pub fn record_spin_fill(
    cb: &mut dyn CommandRecorder,
    kernels: &Kernels,
    spin_ns: u64,
    target: &BufferRange,
    value: u32,
) {
    let n = u32::try_from(target.len() / 4).expect("small range");
    let args = KernelArgs::new()
        .with(spin_ns)
        .with_range(target)
        .with(value)
        .with(n);
    cb.dispatch(&Dispatch::new(
        &kernels.spin_fill,
        grid(n),
        [BLOCK, 1, 1],
        &args,
    ))
    .unwrap_or_else(|e| panic!("recording spin_fill_u32: {e}"));
}

/// Records `dst[i] = src[i] + k` over equal-length ranges of `u32`s.
pub fn record_add(
    cb: &mut dyn CommandRecorder,
    kernels: &Kernels,
    dst: &BufferRange,
    src: &BufferRange,
    k: u32,
) {
    assert_eq!(dst.len(), src.len());
    let n = u32::try_from(dst.len() / 4).expect("small range");
    let args = KernelArgs::new()
        .with_range(dst)
        .with_range(src)
        .with(k)
        .with(n);
    cb.dispatch(&Dispatch::new(&kernels.add, grid(n), [BLOCK, 1, 1], &args))
        .unwrap_or_else(|e| panic!("recording add_u32: {e}"));
}

/// Records `counter[0] += 1` (one thread).
pub fn record_increment(cb: &mut dyn CommandRecorder, kernels: &Kernels, counter: &BufferRange) {
    let args = KernelArgs::new().with_range(counter);
    cb.dispatch(&Dispatch::new(
        &kernels.increment,
        [1, 1, 1],
        [1, 1, 1],
        &args,
    ))
    .unwrap_or_else(|e| panic!("recording increment_u32: {e}"));
}

/// Records with `record` into a new command buffer of `queue`'s mode, ends it, and shares it.
pub fn command_buffer(
    queue: &Queue,
    record: impl FnOnce(&mut dyn CommandRecorder),
) -> Arc<dyn CommandBuffer> {
    let mut cb = queue
        .create_command_buffer()
        .unwrap_or_else(|e| panic!("create_command_buffer: {e}"));
    record(&mut *cb);
    cb.end().unwrap_or_else(|e| panic!("end: {e}"))
}

/// Writes `value` to every `u32` of `buffer` (synchronously, on the legacy stream: only for
/// buffers no queued work touches at the time).
pub fn poison(buffer: &Buffer, value: u32) {
    let bytes: Vec<u8> = std::iter::repeat_n(value.to_ne_bytes(), buffer.len() / 4)
        .flatten()
        .collect();
    buffer
        .write(0, &bytes)
        .unwrap_or_else(|e| panic!("poisoning: {e}"));
}

/// Reads a whole buffer back as `u32`s (synchronously: wait for the work that wrote it first).
pub fn read_u32(buffer: &Buffer) -> Vec<u32> {
    let mut bytes = vec![0u8; buffer.len()];
    buffer
        .read(0, &mut bytes)
        .unwrap_or_else(|e| panic!("reading back: {e}"));
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Asserts every word of `buffer` is `expected`, naming the first that is not.
pub fn assert_all(buffer: &Buffer, expected: u32, what: &str) {
    let words = read_u32(buffer);
    if let Some((i, w)) = words.iter().enumerate().find(|(_, w)| **w != expected) {
        panic!("{what}: word {i} is {w:#010x}, expected {expected:#010x}");
    }
}

/// The suite's kernels: hand-written PTX (sm_75, ISA 7.0) that the driver compiles at load
/// time. Element-wise kernels use one thread per element in a 1-D grid and check their bounds.
/// The spins read `%globaltimer` (nanoseconds), so their length does not depend on the clock.
pub const DEVICE_KERNELS: &str = r#"
.version 7.0
.target sm_75
.address_size 64

.visible .entry add_u32(
    .param .u64 add_u32_dst,
    .param .u64 add_u32_src,
    .param .u32 add_u32_k,
    .param .u32 add_u32_n
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<9>;
    .reg .b64   %rd<8>;

    ld.param.u64        %rd1, [add_u32_dst];
    ld.param.u64        %rd2, [add_u32_src];
    ld.param.u32        %r1, [add_u32_k];
    ld.param.u32        %r2, [add_u32_n];
    mov.u32             %r3, %ctaid.x;
    mov.u32             %r4, %ntid.x;
    mov.u32             %r5, %tid.x;
    mad.lo.u32          %r6, %r3, %r4, %r5;
    setp.ge.u32         %p1, %r6, %r2;
    @%p1 bra            ADD_U32_DONE;
    cvta.to.global.u64  %rd3, %rd1;
    cvta.to.global.u64  %rd4, %rd2;
    mul.wide.u32        %rd5, %r6, 4;
    add.s64             %rd6, %rd4, %rd5;
    ld.global.u32       %r7, [%rd6];
    add.u32             %r8, %r7, %r1;
    add.s64             %rd7, %rd3, %rd5;
    st.global.u32       [%rd7], %r8;
ADD_U32_DONE:
    ret;
}

.visible .entry spin_fill_u32(
    .param .u64 spin_fill_ns,
    .param .u64 spin_fill_ptr,
    .param .u32 spin_fill_value,
    .param .u32 spin_fill_n
)
{
    .reg .pred  %p<3>;
    .reg .b32   %r<7>;
    .reg .b64   %rd<9>;

    ld.param.u64        %rd1, [spin_fill_ns];
    ld.param.u64        %rd2, [spin_fill_ptr];
    ld.param.u32        %r1, [spin_fill_value];
    ld.param.u32        %r2, [spin_fill_n];
    mov.u64             %rd3, %globaltimer;
SPIN_FILL_WAIT:
    mov.u64             %rd4, %globaltimer;
    sub.u64             %rd5, %rd4, %rd3;
    setp.lt.u64         %p1, %rd5, %rd1;
    @%p1 bra            SPIN_FILL_WAIT;
    mov.u32             %r3, %ctaid.x;
    mov.u32             %r4, %ntid.x;
    mov.u32             %r5, %tid.x;
    mad.lo.u32          %r6, %r3, %r4, %r5;
    setp.ge.u32         %p2, %r6, %r2;
    @%p2 bra            SPIN_FILL_DONE;
    cvta.to.global.u64  %rd6, %rd2;
    mul.wide.u32        %rd7, %r6, 4;
    add.s64             %rd8, %rd6, %rd7;
    st.global.u32       [%rd8], %r1;
SPIN_FILL_DONE:
    ret;
}

.visible .entry increment_u32(
    .param .u64 increment_ptr
)
{
    .reg .b32   %r<3>;
    .reg .b64   %rd<3>;

    ld.param.u64        %rd1, [increment_ptr];
    cvta.to.global.u64  %rd2, %rd1;
    ld.global.u32       %r1, [%rd2];
    add.u32             %r2, %r1, 1;
    st.global.u32       [%rd2], %r2;
    ret;
}

.visible .entry spin_trap(
    .param .u64 spin_trap_ns
)
{
    .reg .pred  %p<2>;
    .reg .b64   %rd<5>;

    ld.param.u64        %rd1, [spin_trap_ns];
    mov.u64             %rd2, %globaltimer;
SPIN_TRAP_WAIT:
    mov.u64             %rd3, %globaltimer;
    sub.u64             %rd4, %rd3, %rd2;
    setp.lt.u64         %p1, %rd4, %rd1;
    @%p1 bra            SPIN_TRAP_WAIT;
    trap;
    ret;
}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_are_well_formed_ptx_text() {
        let ptx = DEVICE_KERNELS;
        assert!(ptx.contains(".version 7.0\n.target sm_75\n.address_size 64\n"));
        assert_eq!(ptx.matches('{').count(), ptx.matches('}').count());
        assert_eq!(ptx.matches('(').count(), ptx.matches(')').count());
        assert!(!ptx.contains('\0'));
        for name in ["add_u32", "spin_fill_u32", "increment_u32", "spin_trap"] {
            assert_eq!(
                ptx.matches(&format!(".visible .entry {name}(")).count(),
                1,
                "{name}"
            );
        }
        for label in [
            "ADD_U32_DONE",
            "SPIN_FILL_WAIT",
            "SPIN_FILL_DONE",
            "SPIN_TRAP_WAIT",
        ] {
            assert_eq!(ptx.matches(&format!("{label}:")).count(), 1, "{label}");
            assert_eq!(ptx.matches(&format!("bra            {label};")).count(), 1);
        }
        assert_eq!(ptx.matches("trap;").count(), 1);
    }
}
