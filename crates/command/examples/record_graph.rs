//! Records a small graph command buffer (fill, barrier, kernel, barrier, copy), launches it
//! three times, and prints what came back.
//!
//! Run with `cargo run -p cuhal-command --example record_graph`. Without a CUDA driver or
//! device it says so and exits successfully.

use std::sync::Arc;

use cuhal_command::{
    Buffer, CommandBuffer, CommandRecorder, Dispatch, Executable, FillPattern, GraphCommandBuffer,
    KernelArgs,
};
use cuhal_sys::{CU_STREAM_NON_BLOCKING, DriverApi, PrimaryContext, Stream};

/// `iota(u32 *out, u32 base, u32 n)`: `out[i] += base + i`.
const IOTA_PTX: &str = r#"
.version 7.0
.target sm_75
.address_size 64

.visible .entry iota(
    .param .u64 iota_out,
    .param .u32 iota_base,
    .param .u32 iota_n
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<10>;
    .reg .b64   %rd<5>;

    ld.param.u64        %rd1, [iota_out];
    ld.param.u32        %r1, [iota_base];
    ld.param.u32        %r2, [iota_n];
    mov.u32             %r3, %ctaid.x;
    mov.u32             %r4, %ntid.x;
    mov.u32             %r5, %tid.x;
    mad.lo.u32          %r6, %r3, %r4, %r5;
    setp.ge.u32         %p1, %r6, %r2;
    @%p1 bra            IOTA_DONE;
    cvta.to.global.u64  %rd2, %rd1;
    mul.wide.u32        %rd3, %r6, 4;
    add.s64             %rd4, %rd2, %rd3;
    ld.global.u32       %r7, [%rd4];
    add.u32             %r8, %r1, %r6;
    add.u32             %r9, %r7, %r8;
    st.global.u32       [%rd4], %r9;
IOTA_DONE:
    ret;
}
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let api = match DriverApi::load() {
        Ok(api) => Arc::new(api),
        Err(e) => {
            println!("no CUDA driver found, nothing to record: {e}");
            return Ok(());
        }
    };
    if cuhal_sys::device_count(&api).unwrap_or(0) == 0 {
        println!("the CUDA driver sees no device, nothing to record");
        return Ok(());
    }
    let context = PrimaryContext::retain(api, 0)?;
    let module = Executable::load_ptx(&context, IOTA_PTX)?;
    let iota = module.function("iota")?;
    println!("iota: {:?}", iota.attributes());

    const N: usize = 1000;
    let data = Buffer::new(&context, N * 4)?;
    let copy = Buffer::new(&context, N * 4)?;
    let args = KernelArgs::new()
        .with_range(&data.whole())
        .with(100u32)
        .with(N as u32);

    let mut cb = GraphCommandBuffer::new(&context, None)?;
    cb.begin_debug_group("example")?;
    cb.fill(&data.whole(), FillPattern::U32(1))?;
    cb.barrier()?;
    cb.dispatch(&Dispatch::new(
        &iota,
        [(N as u32).div_ceil(128), 1, 1],
        [128, 1, 1],
        &args,
    ))?;
    cb.barrier()?;
    cb.copy(&data.whole(), &copy.whole())?;
    cb.end_debug_group()?;
    // `end()` instantiates the graph and returns what can be launched or submitted.
    let exec = cb.end()?;
    println!("recorded a graph of {} nodes", exec.node_count());
    let cb: Arc<dyn CommandBuffer> = Arc::new(exec);

    let stream = Stream::new(&context, CU_STREAM_NON_BLOCKING)?;
    let _current = context.enter()?;
    for _ in 0..3 {
        // SAFETY: `stream` is a live stream of `context`, which is current on this thread.
        unsafe { cb.issue(stream.raw()) }?;
    }
    stream.synchronize()?;

    let mut out = vec![0u8; N * 4];
    copy.read(0, &mut out)?;
    let words: Vec<u32> = out
        .chunks_exact(4)
        .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    println!("first values: {:?}", &words[..5]);
    let ok = words
        .iter()
        .enumerate()
        .all(|(i, &w)| w == 1 + 100 + i as u32);
    println!(
        "each launch refilled and recomputed: {}",
        if ok { "yes" } else { "NO" }
    );
    Ok(())
}
