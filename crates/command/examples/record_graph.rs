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
const IOTA_PTX: &str = include_str!("record_graph.ptx");

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
